package sim_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
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
