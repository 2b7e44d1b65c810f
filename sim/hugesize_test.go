package sim_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
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

// TestFiveLiveMallocsOf4EiB: five live mallocs of 2^62 bytes (20 EiB
// together) on every policy, under the invariant checker. No sum may wrap
// (greedy-by-lifetime failed with "offset 13835058055282163712 is taken",
// the others with "free of 0x7f0000000000: not a live block" at the fifth
// free, the device's address space having wrapped to its start).
//
// Worked by hand: the device hands out addresses from 0x7f0000000000 (2^47
// less 2^40): three segments of 2^62 end at 0x7f0000000000 + 3*2^62, and a
// fourth would end past 2^64 (and the reserved bytes reach 2^64), so the
// mallocs of events 3 and 4 are OOMs and 3*2^62 bytes are reserved. The
// planners' arena is at most 2^63 bytes: two blocks, and events 2, 3 and 4
// are OOMs with 2^63 reserved. Each such OOM is counted in Overflow. bfc
// (its memory limit 2^64-1 less the 3*2^62 it holds is under 2^62) and
// async-pool (a pool of at most its release threshold) refuse by their own
// checked limits, without the device; rmm-binning also reserves segments
// for its fixed-size bins.
func TestFiveLiveMallocsOf4EiB(t *testing.T) {
	var text strings.Builder
	for id := 1; id <= 5; id++ {
		fmt.Fprintf(&text, "malloc id=%d size=%d\n", id, uint64(1)<<62)
	}
	for id := 1; id <= 5; id++ {
		fmt.Fprintf(&text, "free id=%d\n", id)
	}
	const eib4 = uint64(1) << 62
	for _, p := range policies.Names() {
		t.Run(p, func(t *testing.T) {
			results, err := sim.Run(recordingSource(t, text.String()), sim.Config{Policy: p, Check: true, AsRecorded: false})
			if err != nil {
				t.Fatal(err)
			}
			res := results[0]
			ooms, overflows, firstOOM, reserved := int64(2), int64(2), int64(3), 3*eib4
			switch p {
			case "greedy-by-lifetime", "greedy-by-size", "offline", "optimal":
				ooms, overflows, firstOOM, reserved = 3, 3, 2, 2*eib4
			case "bfc":
				overflows = 0
			case "rmm-binning":
				reserved += 3120562176 // and its fixed-size bins' segments
			case "async-pool":
				ooms, overflows, firstOOM, reserved = 5, 0, 0, 0
			}
			var got int64
			if res.Overflow != nil {
				got = res.Overflow.Mallocs
			}
			if res.OOMs != ooms || got != overflows || res.FirstOOMEvent != firstOOM || res.PeakReserved != reserved {
				t.Errorf("%d OOMs (%d overflows, first at event %d), peak reserved %d; want %d OOMs (%d overflows, first at event %d), %d reserved",
					res.OOMs, got, res.FirstOOMEvent, res.PeakReserved, ooms, overflows, firstOOM, reserved)
			}
			if res.PeakAllocated > res.PeakReserved {
				t.Errorf("peak allocated %d over peak reserved %d", res.PeakAllocated, res.PeakReserved)
			}
			if overflows > 0 && !slices.ContainsFunc(res.Warnings, func(w string) bool {
				return strings.HasPrefix(w, fmt.Sprintf("%d mallocs failed as OOMs where a sum of bytes would have wrapped", overflows)) && strings.Contains(w, fmt.Sprintf("first: event %d: malloc of %d bytes", firstOOM, eib4))
			}) {
				t.Errorf("warnings %q: want the overflows' warning naming event %d", res.Warnings, firstOOM)
			}
		})
	}
}

// TestDeviceAddressSpace: the simulated device refuses, as an OOM and an
// overflow, a segment that would end past 2^64 (the address space) or
// whose size does not round up to 2 MiB in 64 bits, and counts them.
func TestDeviceAddressSpace(t *testing.T) {
	d := sim.NewDevice(0)
	for k := range 3 {
		if _, err := d.Alloc(1 << 62); err != nil {
			t.Fatalf("alloc %d: %v", k, err)
		}
	}
	for _, size := range []uint64{1 << 62, math.MaxUint64, math.MaxUint64 - 1<<20} {
		_, err := d.Alloc(size)
		if !errors.Is(err, policies.ErrOutOfMemory) || !errors.Is(err, policies.ErrOverflow) {
			t.Errorf("alloc of %d bytes with 3*2^62 reserved: %v; want an OOM that is an overflow", size, err)
		}
	}
	if d.Overflows() != 3 || d.Reserved() != 3<<62 || d.Allocs() != 3 {
		t.Errorf("%d overflows, %d reserved, %d allocs; want 3, %d, 3", d.Overflows(), d.Reserved(), d.Allocs(), uint64(3)<<62)
	}
}

// TestLatencyTotalSaturates: the summed time of calls of two size classes
// whose times are each near math.MaxInt64 saturates (it wrapped to a
// negative time).
func TestLatencyTotalSaturates(t *testing.T) {
	var l sim.Latencies
	l.Add("cudaMalloc", 1<<20, math.MaxInt64-5)
	l.Add("cudaMalloc", 1<<40, math.MaxInt64-5)
	if got := l.Total(); got != math.MaxInt64 {
		t.Errorf("Total() = %d, want %d", got, int64(math.MaxInt64))
	}
}
