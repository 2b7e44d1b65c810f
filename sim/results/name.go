package results

import (
	"path/filepath"
	"strconv"
	"strings"
)

// traceSuffixes are the file name extensions TraceName removes: compression
// first, then the trace formats.
var traceSuffixes = []string{
	".gz", ".zst", ".zstd", ".xz", ".bz2", ".lz4",
	".pickle", ".pkl", ".msgpack", ".mpk", ".trace", ".json", ".jsonl", ".csv", ".txt", ".log",
}

// TraceName returns the name of a trace in the names of output files (its
// charts, a sweep's cell files, memory_viz snapshots):
// the base name of the trace path without its known extensions
// ("runs/train_gpt.pickle.gz" gives "train_gpt", "A.1048576.csv" gives
// "A.1048576"), with characters other than letters, digits, '.', '-' and
// '_' replaced by '_' and leading dots removed; "trace" if nothing is left.
// Both '/' and '\' separate directories.
func TraceName(trace string) string {
	name := strings.TrimRight(strings.ReplaceAll(trace, `\`, "/"), "/")
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	for changed := true; changed; {
		changed = false
		for _, s := range traceSuffixes {
			if len(name) > len(s) && strings.EqualFold(name[len(name)-len(s):], s) {
				name = name[:len(name)-len(s)]
				changed = true
			}
		}
	}
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, name)
	// No hidden files: a leading dot goes.
	name = strings.TrimLeft(name, ".")
	if strings.Trim(name, "._") == "" {
		return "trace"
	}
	return name
}

// ShortNames returns, for each trace path, the shortest tail of its path (its
// file name, or the folders above it as far as needed) that no other of
// the paths ends with, so that rows of two traces with one file name in
// different folders tell apart (a/x.pickle and b/x.pickle show as such; a
// lone x.pickle as x.pickle).
func ShortNames(paths []string) map[string]string {
	split := func(p string) []string {
		return strings.Split(filepath.ToSlash(filepath.Clean(p)), "/")
	}
	tail := func(parts []string, n int) string {
		return strings.Join(parts[max(0, len(parts)-n):], "/")
	}
	uniq := map[string][]string{}
	for _, p := range paths {
		if _, ok := uniq[p]; !ok {
			uniq[p] = split(p)
		}
	}
	out := make(map[string]string, len(uniq))
	for p, parts := range uniq {
		n := 1
		for ; n < len(parts); n++ {
			clash := false
			for q, other := range uniq {
				if q != p && tail(other, n) == tail(parts, n) {
					clash = true
					break
				}
			}
			if !clash {
				break
			}
		}
		out[p] = tail(parts, n)
	}
	return out
}

// MiBText formats bytes as MiB with one decimal ("1.5"), as the tables of
// the commands and of the report show sizes.
func MiBText(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
