package segfit_test

import (
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"

	"example.com/segfit"
)

// TestConformance: segfit passes allocsim's conformance kit.
func TestConformance(t *testing.T) {
	policytest.Run(t, segfit.Name, nil)
}

// TestHandWorked replays a four-event trace and checks the figures worked
// out by hand from the rules of the package doc. The mallocs ask for 1000
// bytes and 9 MiB: a peak of 9438232 requested bytes, whose half rounded up
// to 2 MiB is a slab of 6 MiB, the first device allocation, at the
// simulated device's first address; its 1024-byte block is the slab's
// first. The 9 MiB malloc takes a segment of 10 MiB of its own, after the
// slab: 16 MiB reserved at the peak. Without the hint the slab would be
// 2 MiB (12 MiB at the peak): the figure shows the policy got its hint.
func TestHandWorked(t *testing.T) {
	const text = `header source=text
malloc addr=0x1 size=1000
malloc addr=0x2 size=9MiB
free addr=0x2
free addr=0x1
`
	h, evs, err := trace.ParseText("hand", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Trace: "hand", Policy: segfit.Name, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.PeakReserved != 16<<20 || r.PeakAllocated != 1024+10<<20 || r.DeviceAllocs != 2 || r.DeviceFrees != 1 || r.PeakRequested != 1000+9<<20 {
		t.Errorf("peak reserved %d, allocated %d, requested %d, %d device allocs, %d frees; want %d, %d, %d, 2, 1",
			r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.DeviceAllocs, r.DeviceFrees, 16<<20, 1024+10<<20, 1000+9<<20)
	}
}
