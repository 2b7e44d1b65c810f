package replaycli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/fidelity"
)

// TestFidelityXSpace: replay fidelity on a JAX run's XSpace compares the
// figures of the bfc replay with the run's memory_stats() in NAME.json
// beside it, and where there is none with the figures BFC's events
// record; an XSpace records no device call, so none is compared. The
// settings are the ones memory_stats() implies (XLA's memory limit, and
// preallocation where the pool peaked at the whole limit): attn's grown
// pool and train's preallocated one replay to the byte; without NAME.json
// the limit is the one the XSpace records, and preallocation XLA's default.
func TestFidelityXSpace(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "testdata", "jax", "xspace")
	for name, want := range map[string]string{
		"attn.growth.xplane.pb.gz": "attn.growth.xplane.pb.gz: figures agree (1963 mallocs, no device call recorded; peaks and counters as measured in attn.growth.json; policy bfc, settings allow_growth=true memory_limit=112583507968)\n",
		"train.bfc.xplane.pb.gz":   "train.bfc.xplane.pb.gz: figures agree (1377 mallocs, no device call recorded; peaks and counters as measured in train.bfc.json; policy bfc, settings allow_growth=false memory_limit=112583507968)\n",
	} {
		out, _, err := runCmd(t, "fidelity", "--policy", "bfc", filepath.Join(dir, name))
		if err != nil || out != want {
			t.Errorf("fidelity %s: %v, output %q; want %q", name, err, out, want)
		}
	}
	train := filepath.Join("..", "..", "..", "trace", "xspace", "testdata", "train.bfc.mem.xplane.pb.gz")
	// Without NAME.json: the memory limit the XSpace records, and XLA's
	// default, preallocation; grown instead (--set), the replay differs.
	out, _, err := runCmd(t, "fidelity", train)
	if want := "train.bfc.mem.xplane.pb.gz: figures agree (1377 mallocs, no device call recorded; peak allocated bytes and mallocs as the trace records them; policy bfc, settings allow_growth=false memory_limit=112583507968)\n"; err != nil || out != want {
		t.Errorf("fidelity: %v, output %q; want %q", err, out, want)
	}
	out, _, err = runCmd(t, "fidelity", "--set", "bfc.allow_growth=true", train)
	if want := "train.bfc.mem.xplane.pb.gz: figures differ from the real allocator's (as the trace records them; policy bfc):\n" +
		"train.bfc.mem.xplane.pb.gz:   peak allocated bytes: real allocator 388236544, simulation "; err == nil || !strings.HasPrefix(out, want) {
		t.Errorf("fidelity: %v, output %q; want an error and the output to start %q", err, out, want)
	}
}

func TestMeasuredPathXSpace(t *testing.T) {
	for path, want := range map[string]string{
		"jax/train.bfc.xplane.pb.gz": "jax/train.bfc.json",
		"run/host.xplane.pb":         "run/host.json",
	} {
		if got := fidelity.MeasuredPath(path); got != want {
			t.Errorf("fidelity.MeasuredPath(%q) = %q, want %q", path, got, want)
		}
	}
}
