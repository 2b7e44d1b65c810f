package planpolicy_test

import (
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/internal/doccmd"
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
	ran := doccmd.Run(t, filepath.Join("..", ".."), "docs/plan-policy.md")
	if ran == 0 {
		t.Fatal("docs/plan-policy.md shows no replay command")
	}
}
