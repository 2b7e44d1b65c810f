package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestFidelityXSpace: replay fidelity on a JAX run's XSpace compares the
// figures of the bfc replay with the run's memory_stats() in NAME.json
// beside it, and where there is none with the figures BFC's events
// record; an XSpace records no device call, so none is compared. attn's
// grown pool replays as bfc's defaults run it (allow_growth), to the byte;
// the preallocated train run does not.
func TestFidelityXSpace(t *testing.T) {
	attn := filepath.Join("..", "..", "testdata", "jax", "xspace", "attn.growth.xplane.pb.gz")
	out, _, err := runCmd(t, "fidelity", "--policy", "bfc", attn)
	if want := "attn.growth.xplane.pb.gz: figures agree (1963 mallocs, no device call recorded; peaks and counters as measured in attn.growth.json; settings "; err != nil || !strings.HasPrefix(out, want) {
		t.Errorf("fidelity: %v, output %q; want it to start %q", err, out, want)
	}
	train := filepath.Join("..", "..", "trace", "xspace", "testdata", "train.bfc.mem.xplane.pb.gz")
	out, _, err = runCmd(t, "fidelity", "--policy", "bfc", train)
	if want := "train.bfc.mem.xplane.pb.gz: figures differ from the real allocator's (as the trace records them):\n" +
		"train.bfc.mem.xplane.pb.gz:   peak allocated bytes: real allocator 388236544, simulation "; err == nil || !strings.HasPrefix(out, want) {
		t.Errorf("fidelity: %v, output %q; want an error and the output to start %q", err, out, want)
	}
}

func TestMeasuredPathXSpace(t *testing.T) {
	for path, want := range map[string]string{
		"jax/train.bfc.xplane.pb.gz": "jax/train.bfc.json",
		"run/host.xplane.pb":         "run/host.json",
	} {
		if got := measuredPath(path); got != want {
			t.Errorf("measuredPath(%q) = %q, want %q", path, got, want)
		}
	}
}
