// Package docs holds the reference pages; its test runs the commands every
// page and the README show, so that none of them can rot.
package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/internal/doccmd"
)

// pages are the pages whose commands run here, with how many each shows;
// docs/write-a-policy.md and docs/plan-policy.md run in their own packages'
// tests (they need python3), docs/slice.md in replaycli's.
var pages = map[string]int{
	"README.md":            3,
	"docs/recording.md":    3,
	"docs/results.md":      2,
	"docs/policies.md":     1,
	"docs/tune-and-fit.md": 3,
	"docs/cluster.md":      1,
	"docs/real-gpu.md":     1,
	"docs/formats.md":      3,
}

// TestPages runs each page's "$ bin/replay ..." and "$ bin/record ..."
// commands from the repository's root and compares their standard output
// with the page's (ALLOCSIM_UPDATE_DOCS=1 writes it instead).
func TestPages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands")
	}
	bin := doccmd.Build(t, "..")
	for page, want := range pages {
		t.Run(page, func(t *testing.T) {
			if got := doccmd.RunWith(t, bin, "..", page); got != want {
				t.Errorf("%s shows %d commands, want %d", page, got, want)
			}
		})
	}
}

// TestEveryPageRuns fails for a page under docs/ that TestPages does not
// run and that no other test is known to run.
func TestEveryPageRuns(t *testing.T) {
	elsewhere := map[string]bool{"docs/write-a-policy.md": true, "docs/plan-policy.md": true, "docs/slice.md": true,
		"docs/exec-protocol.md": true, "docs/so-policy.md": true}
	names, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		p := "docs/" + n
		if _, ok := pages[p]; !ok && !elsewhere[p] {
			t.Errorf("%s: no test runs its commands (add it to pages)", p)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 150 {
		t.Errorf("README.md has %d lines, want at most 150: reference goes under docs/", n)
	}
}
