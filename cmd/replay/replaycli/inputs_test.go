package replaycli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// No command writes over one of its inputs, named by the same path or
// another one (a hard link): it refuses before any work with an error
// naming the flag, and the input is left as it was.
func TestNoOutputOverInput(t *testing.T) {
	trace := writeTrace(t, "malloc id=1 size=1MiB\nfree id=1\n")
	link := filepath.Join(t.TempDir(), "link.txt")
	if err := os.Link(trace, link); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "r.json")
	if _, _, err := runCmd(t, "sim", "--policy", "cuda", "--json", results, trace); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		input string
		args  []string
	}{
		{"sim --json", trace, []string{"sim", "--policy", "cuda", "--json", trace, trace}},
		{"sim --json, a link", trace, []string{"sim", "--policy", "cuda", "--json", link, trace}},
		{"sim --csv", trace, []string{"sim", "--policy", "cuda", "--csv", trace, trace}},
		{"fit --json", trace, []string{"fit", "--policy", "cuda", "--json", trace, trace}},
		{"report -o", results, []string{"report", "-o", results, results}},
		{"gpu --sim-only --json", trace, []string{"gpu", "--sim-only", "--policy", "cuda", "--json", trace, trace}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := os.ReadFile(tc.input)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = runCmd(t, tc.args...)
			if !errors.Is(err, atomicfile.ErrInput) {
				t.Errorf("err = %v, want one wrapping atomicfile.ErrInput", err)
			}
			after, _ := os.ReadFile(tc.input)
			if !bytes.Equal(before, after) {
				t.Errorf("the input changed")
			}
		})
	}
}

// TestOutputsAllOrNothing: when one output cannot be written (the charts'
// directory is a file here, a full disk in the field), none is: the JSON
// and CSV staged before are dropped. Before, --json and --csv were written
// and --plots failed after them.
func TestOutputsAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, "malloc id=1 size=1MiB\nfree id=1\n")
	notDir := filepath.Join(dir, "plots")
	if err := os.WriteFile(notDir, []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	js, csv := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.csv")
	_, _, err := runCmd(t, "sim", "--policy", "cuda", "--json", js, "--csv", csv, "--plots", notDir, trace)
	if err == nil || !strings.HasPrefix(err.Error(), "--plots: ") {
		t.Fatalf("err = %v, want the --plots error", err)
	}
	for _, p := range []string{js, csv} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was written", p)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// With a directory for the charts all three are written.
	if _, _, err := runCmd(t, "sim", "--policy", "cuda", "--json", js, "--csv", csv, "--plots", filepath.Join(dir, "charts"), trace); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{js, csv, filepath.Join(dir, "charts", "t-memory.png")} {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
}
