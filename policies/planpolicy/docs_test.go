package planpolicy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocs runs the commands that docs/plan-policy.md shows ("$ bin/replay
// ..." in a code block, then its output up to the block's end) from the
// repository's root, with a replay built from this tree, and compares
// their standard output with the page's.
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/replay")
	}
	needPython(t)
	page, err := os.ReadFile("../../docs/plan-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "replay")
	if out, err := exec.Command("go", "build", "-o", exe, "../../cmd/replay").CombinedOutput(); err != nil {
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
		c.Dir = "../.."
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if got := strings.TrimSuffix(string(out), "\n"); got != strings.Join(want, "\n") {
			t.Errorf("%s:\n got:\n%s\nwant:\n%s", cmd, got, strings.Join(want, "\n"))
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("docs/plan-policy.md shows no replay command")
	}
}
