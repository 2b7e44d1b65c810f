package sim_test

import (
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestFragmentation works the fragmentation and the idle share out by hand
// on best-fit (2 MiB segments, 512-byte alignment):
//
//	0 malloc a 1 MiB      new segment 0..2 MiB; reserved 2, allocated 1
//	1 malloc b 512 KiB    served from the free MiB at 1 MiB; allocated 1.5
//	2 free a              free: 1 MiB at 0 and 512 KiB at 1.5 MiB
//	3 malloc c 1.25 MiB   1.5 MiB free, no block of 1.25: a new segment;
//	                      1.5 MiB fragmented, 1.5 / 2 = 0.75 of the reserved
//	                      bytes before it; reserved 4 (the peak), allocated
//	                      1.75: idle 1 - 1.75/4 = 0.5625
//	4 free b, 5 free c    at the peak still, idle 0.6875 then 1: the idle
//	                      share at the peak is its least, 0.5625; no malloc
//	                      that free memory failed: fragmentation 0
//
// The run's fragmentation is its most fragmented bytes over its peak
// reserved bytes, 1.5 / 4 = 0.375, that malloc's too, as it set the peak.
// cuda holds no free memory: its fragmentation and idle share are 0.
func TestFragmentation(t *testing.T) {
	text := "malloc id=1 size=1MiB\nmalloc id=2 size=512KiB\nfree id=1\nmalloc id=3 size=1310720\nfree id=2\nfree id=3\n"
	h, evs, err := trace.ParseText("frag.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "best-fit"}, sim.Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	bf, cuda := rs[0], rs[1]
	if bf.PeakReserved != 4<<20 || bf.PeakFragmentedBytes != 1536<<10 || bf.PeakFragmentation != 0.375 || bf.FragmentationAtPeak != 0.375 || bf.IdleAtPeak != 0.5625 {
		t.Errorf("best-fit: peak reserved %d, fragmented bytes %d, peak fragmentation %v, at peak %v, idle at peak %v; want 4194304, 1572864, 0.375, 0.375, 0.5625",
			bf.PeakReserved, bf.PeakFragmentedBytes, bf.PeakFragmentation, bf.FragmentationAtPeak, bf.IdleAtPeak)
	}
	var frag, idle []float64
	for _, pt := range bf.Series {
		frag, idle = append(frag, pt.Fragmentation), append(idle, pt.Idle)
	}
	if want := []float64{0, 0, 0, 0.75, 0, 0}; !equalFloats(frag, want) {
		t.Errorf("best-fit fragmentation series %v, want %v", frag, want)
	}
	if want := []float64{0.5, 0.25, 0.75, 0.5625, 0.6875, 1}; !equalFloats(idle, want) {
		t.Errorf("best-fit idle series %v, want %v", idle, want)
	}
	if cuda.PeakFragmentation != 0 || cuda.FragmentationAtPeak != 0 || cuda.IdleAtPeak != 0 {
		t.Errorf("cuda: fragmentation %v, at peak %v, idle at peak %v; want 0", cuda.PeakFragmentation, cuda.FragmentationAtPeak, cuda.IdleAtPeak)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

// TestFailedMallocInSeries: a malloc that failed in the source and that the
// replay serves holds its block for an instant, which the peaks count and
// the series shows too (it did not: the series stopped 3 MiB short).
// cuda: 1 MiB live, then 3 MiB for an instant: peak 4 MiB in both.
func TestFailedMallocInSeries(t *testing.T) {
	text := "malloc id=1 size=1MiB\nmalloc_failed size=3MiB\nfree id=1\n"
	h, evs, err := trace.ParseText("failed.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	var reserved, requested uint64
	for _, pt := range r.Series {
		reserved, requested = max(reserved, pt.Reserved), max(requested, pt.Requested)
	}
	if r.PeakReserved != 4<<20 || r.PeakRequested != 4<<20 || reserved != 4<<20 || requested != 4<<20 {
		t.Errorf("peak reserved %d, requested %d; series %d, %d; want 4194304 in all", r.PeakReserved, r.PeakRequested, reserved, requested)
	}
}

// TestFragmentationOOM: an OOM counts the free reserved bytes when they and
// the capacity not reserved would have served the malloc. best-fit under
// a 5 MiB cap:
//
//	0 malloc 1 MiB     segment 0..2; 1 malloc 512 KiB at 1 MiB
//	2 malloc 1 MiB     0.5 MiB free, fewer than asked: a segment 2..4, reserved 4
//	                   (fragmentation 0)
//	3 free the first   free: 1 MiB at 0, 512 KiB at 1.5, 1 MiB at 3: 2.5 MiB
//	4 malloc 3 MiB     a 4 MiB segment does not fit the cap, no segment is wholly
//	                   free: OOM; 2.5 free + 1 under the cap >= 3: 2.5 MiB
//	                   fragmented, 2.5 / 4 = 0.625 of the peak reserved bytes
func TestFragmentationOOM(t *testing.T) {
	text := "malloc id=1 size=1MiB\nmalloc id=2 size=512KiB\nmalloc id=3 size=1MiB\nfree id=1\nmalloc id=4 size=3MiB\n"
	h, evs, err := trace.ParseText("oom.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "best-fit", Capacity: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.OOMs != 1 || r.FirstOOMEvent != 4 || r.PeakReserved != 4<<20 || r.PeakFragmentation != 0.625 || r.FragmentationAtPeak != 0 {
		t.Errorf("OOMs %d at %d, peak reserved %d, peak fragmentation %v, at peak %v; want 1 at 4, 4194304, 0.625, 0",
			r.OOMs, r.FirstOOMEvent, r.PeakReserved, r.PeakFragmentation, r.FragmentationAtPeak)
	}
}
