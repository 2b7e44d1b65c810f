package sim_test

import (
	"math"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestHugeSizes replays mallocs of sizes near 2^64 bytes on every policy
// under the invariant checker: each is an OOM (no device holds it), and the
// replay goes on to place the next malloc.
func TestHugeSizes(t *testing.T) {
	const text = `malloc id=1 size=18446744073709551615
free id=1
malloc id=2 size=18446744073709551104
free id=2
malloc id=3 size=18446744073707454464
free id=3
malloc id=4 size=4096
free id=4
`
	for _, p := range policies.Names() {
		t.Run(p, func(t *testing.T) {
			results, err := sim.Run(recordingSource(t, text), sim.Config{Policy: p, Check: true})
			if err != nil {
				t.Fatal(err)
			}
			res := results[0]
			// The 4096-byte malloc is placed in the policy's block for it
			// (up to fixed-block's 8 MiB); none of the others is.
			if res.OOMs != 3 || res.FirstOOMEvent != 0 || res.Mallocs != 4 || res.PeakAllocated < 4096 || res.PeakAllocated > 8<<20 {
				t.Errorf("%d OOMs (first at event %d), %d mallocs, peak allocated %d; want 3 OOMs from event 0, 4 mallocs, 4096 B to 8 MiB allocated",
					res.OOMs, res.FirstOOMEvent, res.Mallocs, res.PeakAllocated)
			}
		})
	}
}

// Requested bytes never wrap: a trace whose failed over-size mallocs
// together ask for more than 2^64 bytes keeps its peak requested at least
// its peak allocated (saturated at 2^64-1), and the count is exact again
// once they are freed.
func TestRequestedNoWrap(t *testing.T) {
	text := `malloc id=1 size=1GiB
malloc_failed size=18446744073709551615
malloc id=2 size=9223372036854775808
malloc id=3 size=9223372036854775808
free id=2
free id=3
malloc id=4 size=2GiB
`
	// The failed malloc and ids 2 and 3 are OOMs in the replay, whose
	// requested bytes stay counted until their frees.
	h, evs, err := trace.ParseText("t", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "cuda", Capacity: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.PeakRequested != math.MaxUint64 || r.PeakAllocated != 3<<30 || r.OOMs != 3 {
		t.Errorf("peak requested %d, allocated %d, %d OOMs; want %d, %d, 3", r.PeakRequested, r.PeakAllocated, r.OOMs, uint64(math.MaxUint64), uint64(3<<30))
	}
}
