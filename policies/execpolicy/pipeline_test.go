package execpolicy_test

import (
	"flag"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestPipelineSameOnRandomTraces replays random traces (policytest's
// generator: mallocs and frees on several streams, free requests, syncs,
// failed mallocs, empty_cache, markers) under a random capacity against
// python/examples/firstfit.py, which pipelines its mallocs, the same
// without the hook pipeline (a round trip per malloc), and the built-in
// first-fit: the three agree on every figure but those of the abilities an
// exec policy lacks (free space, retries).
//
// Each trace starts two Python processes, and those without the hook wait
// a round trip per malloc: 12 traces, unless -rapid.checks says otherwise
// (the engine's side, what it tells ahead, is sim's
// TestAheadTellsTheCalls, on many more).
func TestPipelineSameOnRandomTraces(t *testing.T) {
	needPython(t)
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		f.Value.Set("12")
		defer f.Value.Set(f.DefValue)
	}
	rapid.Check(t, func(t *rapid.T) {
		evs := policytest.GenTrace(t)
		capacity := uint64(rapid.IntRange(4, 96).Draw(t, "capacityMiB")) << 20
		rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "synthetic"}, evs),
			sim.Config{Policy: "exec:" + firstFit, Capacity: capacity},
			sim.Config{Policy: "exec:python3 testdata/nopipeline.py", Capacity: capacity},
			sim.Config{Policy: "first-fit", Capacity: capacity})
		if err != nil {
			t.Fatalf("%v\ntrace:\n%s", err, policytest.TraceText(evs, -1))
		}
		for _, r := range rs[:2] {
			if !sameFigures(t, r, rs[2]) {
				t.Fatalf("trace:\n%s", policytest.TraceText(evs, -1))
			}
		}
	})
}
