package sim

import (
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// TestOptimalReachesResults: the optimal policy's plan reaches its result
// (Result.Plan) and its proven optimum every result of the trace
// (PeakOptimum). Blocks of 100, 300 and 200 bytes live at once, alignment
// 1: the optimum is 600 bytes, the load, proven with no search; the
// optimal replay reserves 600 bytes (its arena), offline reserves the same
// 600 (a greedy placement meets the load), and both results carry
// PeakOptimum 600, so ×optimum is 1.
func TestOptimalReachesResults(t *testing.T) {
	text := "malloc id=1 size=100\nmalloc id=2 size=300\nmalloc id=3 size=200\nfree id=1\nfree id=2\nfree id=3\n"
	h, evs, err := trace.ParseText("opt.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{"alignment": "1"}
	rs, err := Run(trace.NewSliceSource(h, evs), Config{Policy: "optimal", Settings: set, Check: true}, Config{Policy: "offline", Settings: set, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	opt, off := rs[0], rs[1]
	if p := opt.Plan; p == nil || p.Height != 600 || p.LowerBound != 600 || !p.Proven || p.Nodes != 0 || p.Stopped != "" {
		t.Errorf("optimal's plan %+v; want height 600 = lower bound, proven, 0 nodes", p)
	}
	if opt.PeakReserved != 600 || opt.PeakOptimum != 600 || off.PeakReserved != 600 || off.PeakOptimum != 600 || off.Plan != nil {
		t.Errorf("optimal reserved %d, optimum %d; offline reserved %d, optimum %d, plan %v; want 600 each, no plan for offline",
			opt.PeakReserved, opt.PeakOptimum, off.PeakReserved, off.PeakOptimum, off.Plan)
	}
	if r, ok := off.ReservedOverOptimum(); !ok || r != 1 {
		t.Errorf("offline ×optimum %v, %v; want 1", r, ok)
	}
	// Without the optimal policy no result has an optimum.
	rs, err = Run(trace.NewSliceSource(h, evs), Config{Policy: "offline", Settings: set})
	if err != nil || rs[0].PeakOptimum != 0 {
		t.Errorf("offline alone: %v, optimum %d; want 0", err, rs[0].PeakOptimum)
	}
}
