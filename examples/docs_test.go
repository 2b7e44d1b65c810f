package examples

import (
	"os/exec"
	"testing"

	"github.com/gpualloc/allocsim/internal/doccmd"
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
	ran := doccmd.Run(t, "..", "docs/write-a-policy.md")
	if ran != 2 {
		t.Fatalf("docs/write-a-policy.md shows %d replay commands, want 2", ran)
	}
}
