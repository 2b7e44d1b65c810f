// Package termsafe escapes text read from files before it reaches a terminal.
package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// String returns s as a terminal may show it: printable text, UTF-8
// included, as is, and each control character (C0, DEL, C1, the line and
// paragraph separators and the bidirectional overrides) and each byte of
// invalid UTF-8 as a Go escape (\n, \x1b, \u0085, \u202e, \xff), so that
// a name read from a file (a trace's file name, a frame, a device name)
// cannot set the terminal's title, clear its screen or start a row of a
// table of its own. A string of printable ASCII is returned unchanged.
func String(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&15, 16))
		case unsafeRune(r):
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\n', '\u0085'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeRune reports whether a terminal could act on r rather than show
// it.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069: // bidirectional embeddings, overrides, isolates
		return true
	}
	return false
}
