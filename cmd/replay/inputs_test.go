package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
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
