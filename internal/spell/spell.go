// Package spell finds the known name nearest to a mistyped one, for the
// "did you mean" of commands, flags, policies and settings.
package spell

import "strings"

// Suggest returns the word of known nearest to word in spelling, or "" if
// none is near enough: at an edit distance (Damerau-Levenshtein, adjacent
// transpositions counted once) of at most a third of word's length, at
// least 1, and less than its length; a word of 3 letters or more that
// begins a known one counts as at distance 1 ("fid" for "fidelity").
// Among equally near words the first in sorted order is returned.
func Suggest(word string, known []string) string {
	best, bestD := "", -1
	w := strings.ToLower(word)
	limit := max(1, (len(w)+1)/3)
	for _, k := range known {
		kl := strings.ToLower(k)
		d := distance(w, kl)
		if len(w) >= 3 && strings.HasPrefix(kl, w) {
			d = min(d, 1)
		}
		if d <= limit && d < len(w) && (bestD < 0 || d < bestD || d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the optimal string alignment distance of a and b: the least
// insertions, deletions, substitutions and transpositions of adjacent
// bytes that make one the other.
func distance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
