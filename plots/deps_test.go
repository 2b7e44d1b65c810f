package plots_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoEngineDeps: drawing a chart or a report links neither the replay
// engine nor the policies, only the results model (sim/results) and what
// it needs; neither does reading a results file.
func TestNoEngineDeps(t *testing.T) {
	for _, pkg := range []string{".", "../sim/results"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			switch dep {
			case "github.com/gpualloc/allocsim/sim", "github.com/gpualloc/allocsim/policies":
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}
