// Package doccmd runs the replay commands a docs page shows, for the tests
// that keep the pages from rotting: each line "$ bin/replay ARGS" in a code
// block, its expected standard output the lines after it up to the block's
// end.
package doccmd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Run builds cmd/replay from the repository at root, runs each command of
// the page at path (relative to root) from root with /bin/sh, compares its
// standard output with the page's, and returns how many commands it ran.
// It fails t where a command fails or prints otherwise.
func Run(t *testing.T, root, path string) int {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "replay")
	build := exec.Command("go", "build", "-o", exe, "./cmd/replay")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	lines := strings.Split(string(page), "\n")
	ran := 0
	for i, line := range lines {
		cmd, ok := strings.CutPrefix(line, "$ bin/replay ")
		if !ok {
			continue
		}
		var want []string
		for _, l := range lines[i+1:] {
			if l == "```" {
				break
			}
			want = append(want, l)
		}
		c := exec.Command("/bin/sh", "-c", exe+" "+cmd)
		c.Dir = root
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %s: %v", path, cmd, err)
		}
		if got := strings.TrimSuffix(string(out), "\n"); got != strings.Join(want, "\n") {
			t.Errorf("%s: %s:\n got:\n%s\nwant:\n%s", path, cmd, got, strings.Join(want, "\n"))
		}
		ran++
	}
	return ran
}
