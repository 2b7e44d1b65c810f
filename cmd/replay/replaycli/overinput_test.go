package replaycli

import (
	"os"
	"path/filepath"
	"testing"
)

const tinyText = "header source=text\nmalloc id=1 size=1MiB\nfree id=1\n"

// writeFiles writes text to each name in dir and returns their paths.
func writeFiles(t *testing.T, dir, text string, names ...string) []string {
	t.Helper()
	var paths []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// --plots and --viz write into a directory files named after the traces
// and the policies; an input that one of them would replace is refused
// before anything is replayed, and left as it was (issue 36, item 4).
func TestDirOutputOverInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string // in the output directory; the first is the trace t
		flag  string
		want  string
	}{
		{"plots", []string{"t.txt", "t-memory.svg"}, "--plots", "--plots DIR: its file t-memory.svg is also an input: refusing to write over it"},
		{"plots case", []string{"t.txt", "T-Peaks.PNG"}, "--plots", "--plots DIR: its file T-Peaks.PNG is also an input: refusing to write over it"},
		{"viz", []string{"t.txt", "t.pytorch.pickle"}, "--viz", "--viz DIR: its file t.pytorch.pickle is also an input: refusing to write over it"},
		{"dir is an input", []string{"t.txt"}, "--viz", "--viz: DIR is also an input: refusing to write over it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			inputs := writeFiles(t, dir, tinyText, tc.files...)
			out := dir
			if tc.name == "dir is an input" {
				out = inputs[0]
			}
			args := append([]string{"sim", "--from", "text", "--policy", "pytorch", tc.flag, out}, inputs...)
			_, _, err := runCmd(t, args...)
			want := tc.want
			if tc.name == "dir is an input" {
				want = "--viz: " + out + " is also an input: refusing to write over it"
			} else {
				want = replaceDIR(want, dir)
			}
			if err == nil || err.Error() != want {
				t.Errorf("err = %v, want %s", err, want)
			}
			for _, p := range inputs {
				if got, _ := os.ReadFile(p); string(got) != tinyText {
					t.Errorf("%s changed: %q", p, got)
				}
			}
		})
	}
	// A directory that holds other files is taken.
	dir := t.TempDir()
	inputs := writeFiles(t, dir, tinyText, "t.txt", "u.cuda.pickle", "memory.svg")
	if _, _, err := runCmd(t, "sim", "--from", "text", "--policy", "pytorch", "--viz", dir, "--plots", dir, inputs[0], inputs[1], inputs[2]); err != nil {
		t.Errorf("err = %v, want none", err)
	}
}

func replaceDIR(s, dir string) string {
	const key = "DIR"
	for i := 0; i+len(key) <= len(s); i++ {
		if s[i:i+len(key)] == key {
			return s[:i] + dir + s[i+len(key):]
		}
	}
	return s
}

// replay report --plots refuses, before writing the page, a chart file
// that is one of its inputs (issue 36, item 4).
func TestReportPlotsOverInput(t *testing.T) {
	dir := t.TempDir()
	trace := writeFiles(t, dir, tinyText, "t.txt")[0]
	res := filepath.Join(dir, "t-memory.svg") // a results file named as a chart
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--json", res, trace); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(res)
	page := filepath.Join(dir, "r.html")
	_, _, err := runCmd(t, "report", "-o", page, "--plots", dir, res)
	want := "--plots: " + res + " is also an input: refusing to write over it"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	if after, _ := os.ReadFile(res); string(after) != string(before) {
		t.Errorf("the input changed")
	}
	if _, err := os.Stat(page); err == nil {
		t.Errorf("the page was written")
	}
}
