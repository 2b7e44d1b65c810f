package examples

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWritePolicyDoc runs the commands docs/write-a-policy.md shows ("$
// bin/replay ..." in a code block, its output up to the block's end) from
// the repository's root with a replay built from this tree, and compares
// their standard output with the page's, so that the page cannot rot.
func TestWritePolicyDoc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/replay")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3: the page's exec: and plan: examples are Python")
	}
	page, err := os.ReadFile("../docs/write-a-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "replay")
	if out, err := exec.Command("go", "build", "-o", exe, "../cmd/replay").CombinedOutput(); err != nil {
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
		c.Dir = ".."
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if got := strings.TrimSuffix(string(out), "\n"); got != strings.Join(want, "\n") {
			t.Errorf("%s:\n got:\n%s\nwant:\n%s", cmd, got, strings.Join(want, "\n"))
		}
		ran++
	}
	if ran != 2 {
		t.Fatalf("docs/write-a-policy.md shows %d replay commands, want 2", ran)
	}
}
