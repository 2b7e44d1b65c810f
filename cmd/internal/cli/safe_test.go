package cli

import "testing"

func TestSafe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"run/a.pickle", "run/a.pickle"},
		{"Grüße ÿ 東京.trace", "Grüße ÿ 東京.trace"},
		{`C:\traces\a b.trace`, `C:\traces\a b.trace`},
		{"x\x1b]0;pwned\x07.trace", `x\x1b]0;pwned\a.trace`},
		{"\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"H200\nforged\t1\t2", `H200\nforged\t1\t2`},
		{"cr\rdel\x7f", `cr\rdel\x7f`},
		{"nul\x00", `nul\x00`},
		{"c1 \u0085 \u009b", `c1 \u0085 \u009b`},
		{"bidi \u202egnp.exe", `bidi \u202egnp.exe`},
		{"bad \xff\xfe end", `bad \xff\xfe end`},
		{"cut \xe6\x9d", `cut \xe6\x9d`},
	} {
		if got := Safe(tc.in); got != tc.want {
			t.Errorf("Safe(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
