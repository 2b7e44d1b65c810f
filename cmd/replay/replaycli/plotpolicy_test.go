package replaycli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlotPolicy: --plot-policy picks the memory chart's policies, names
// only replayed ones and needs --plots; the grid of every policy is
// written beside it.
func TestPlotPolicy(t *testing.T) {
	trace := writeTrace(t, "malloc id=1 size=1MiB\nmalloc id=2 size=3MiB\nfree id=1\nfree id=2\n")
	dir := filepath.Join(t.TempDir(), "charts")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "cuda,bfc", "--plot-policy", "cuda", trace}, "--plot-policy without --plots"},
		{[]string{"--policy", "cuda,bfc", "--plots", dir, "--plot-policy", "cuda,slab", trace}, `--plot-policy: "slab" is not replayed (--policy cuda,bfc)`},
		{[]string{"--policy", "cuda,bfc", "--plots", dir, "--plot-policy", "cuda,,bfc", trace}, `--plot-policy "cuda,,bfc": an empty name`},
	} {
		_, _, err := runCmd(t, append([]string{"sim"}, tc.args...)...)
		if err == nil || err.Error() != tc.want {
			t.Errorf("sim %s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("charts written after a usage error")
	}
	if _, _, err := runCmd(t, "sim", "--policy", "cuda,bfc,slab", "--plots", dir, "--plot-policy", "bfc", trace); err != nil {
		t.Fatal(err)
	}
	name := strings.TrimSuffix(filepath.Base(trace), filepath.Ext(trace))
	memory, err := os.ReadFile(filepath.Join(dir, name+"-memory.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(memory), ">bfc</text>") || strings.Contains(string(memory), ">cuda") || !strings.Contains(string(memory), ">+2 more: every policy</text>") {
		t.Errorf("memory chart of --plot-policy bfc: want bfc alone and 2 more named")
	}
	grid, err := os.ReadFile(filepath.Join(dir, name+"-memory-all.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"cuda", "bfc", "slab"} {
		if !strings.Contains(string(grid), ">"+p+"</text>") {
			t.Errorf("grid has no panel of %s", p)
		}
	}
}
