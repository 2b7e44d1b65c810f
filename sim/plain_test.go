package sim_test

import (
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// TestPlainPathsSame replays random traces, with events that leave the
// common paths mixed in (a malloc at a live address, a free of none, a
// double free, time going back, private pools, labels, mallocs of 0
// bytes, a free request marked a restore), under a capacity or none,
// from memory and read an event at a time, where Run steps a plain replay through stepPlain (and a Handler
// policy's mallocs and frees through mallocHandled and freeHandled), and
// with an Observer that does nothing,
// which makes every event take step's general path: the results are the
// same, for pytorch (a Handler), best-fit and cuda. From memory, the live
// allocations resolved ahead of the replay (sim's live.go), in batches of
// a few events, give the same results too, on the plain path (for
// pytorch, in batches of mallocs and frees: sim's batch.go) and the
// general one. The series holds a few points, so that each covers several
// events, as a long trace's do (observeSlow's short way between device
// calls). The checker is off (ALLOCSIM_CHECK=0): a test binary runs it by
// default, and a checked replay is not plain.
func TestPlainPathsSame(t *testing.T) {
	t.Setenv("ALLOCSIM_CHECK", "0")
	rapid.Check(t, func(t *rapid.T) {
		evs := policytest.GenTrace(t)
		mixOdd(t, evs, map[int]func(k int, ev *trace.Event){
			4: func(k int, ev *trace.Event) {
				if ev.Op == trace.OpMalloc {
					ev.Label = "cublas workspace"
				}
			},
			7: func(k int, ev *trace.Event) {
				if ev.Op == trace.OpFreeRequested {
					ev.Restore = true // which only a malloc may be
				}
			},
			6: func(k int, ev *trace.Event) {
				if ev.Op == trace.OpFree && k > 0 {
					// Again the address of an earlier event: a double
					// free, or a free of a live one out of turn.
					ev.Addr = evs[rapid.IntRange(0, k-1).Draw(t, "againOf")].Addr
				}
			},
		})
		var capacity uint64
		if rapid.Bool().Draw(t, "capped") {
			capacity = uint64(rapid.IntRange(8, 160).Draw(t, "capacityMiB")) << 20
		}
		h := trace.Header{Source: "synthetic"}
		// Points of several events each, merged as a long trace's are:
		// observeSlow's short way and observeQuick within a point.
		defer sim.SeriesPoints(rapid.IntRange(2, 12).Draw(t, "seriesPoints"))()
		for _, p := range []string{"pytorch", "best-fit", "cuda"} {
			cfg := sim.Config{Trace: "random", Policy: p, Capacity: capacity}
			general := cfg
			general.Observer = nopObserver{}
			want, errWant := sim.Run(trace.NewSliceSource(h, evs), general)
			batch := int64(rapid.IntRange(1, 16).Draw(t, "resolveBatch"))
			for name, src := range map[string]trace.Source{
				"from memory":                    trace.NewSliceSource(h, evs),
				"from memory, resolved ahead":    trace.NewSliceSource(h, evs),
				"from memory, resolved, general": trace.NewSliceSource(h, evs),
				"streamed":                       streamed{trace.NewSliceSource(h, evs)},
			} {
				c := cfg
				if name == "from memory, resolved, general" {
					c = general
				}
				restore := func() {}
				if strings.HasPrefix(name, "from memory, resolved") {
					restore = sim.ResolveAll(batch)
				}
				got, err := sim.Run(src, c)
				restore()
				if (err == nil) != (errWant == nil) || err != nil && err.Error() != errWant.Error() {
					t.Fatalf("%s %s: %v; on the general path: %v\ntrace:\n%s", p, name, err, errWant, policytest.TraceText(evs, -1))
				}
				if err != nil {
					continue
				}
				if !reflect.DeepEqual(*got[0], *want[0]) {
					t.Fatalf("%s %s: %+v\non the general path: %+v\ntrace:\n%s", p, name, *got[0], *want[0], policytest.TraceText(evs, -1))
				}
			}
		}
	})
}

// nopObserver observes nothing: a replay with an Observer is not plain.
type nopObserver struct{}

func (nopObserver) Observe(sim.Action) {}

// TestPlainFragmentedWithinPoint: an OOM that makes no device call but
// finds fragmentation, inside a series point of several events, must not
// lend its fragmented bytes to the next new peak of the reserved bytes
// (observeQuick skips events like it, and the peak's event
// reads the fragmentation of its own). best-fit (2 MiB segments) under an
// 8 MiB cap, the series at most 2 points (width 4 from event 4 on):
//
//	0 malloc 1 MiB       segment 0..2, reserved 2
//	1 malloc 512 KiB     at 1 MiB
//	2 malloc 1 MiB       0.5 MiB free, fewer than asked: segment 2..4, reserved 4
//	3 free the first     free: 1 MiB at 0, 0.5 at 1.5, 1 at 3
//	4 malloc 256 KiB     at 0: 2.25 MiB free; opens a point of 4 events
//	5 malloc 4.5 MiB     a 6 MiB segment passes the cap, none wholly free: OOM
//	                     with no device call; 2.25 free + 4 under the cap >= 4.5:
//	                     2.25 MiB fragmented
//	6 malloc 3 MiB       more than the 2.25 MiB free: segment 4..8, reserved 8,
//	                     the peak, no fragmentation
//
// Peak fragmentation 2.25 / 8 = 0.28125; at the peak 0.
func TestPlainFragmentedWithinPoint(t *testing.T) {
	text := "malloc id=1 size=1MiB\nmalloc id=2 size=512KiB\nmalloc id=3 size=1MiB\nfree id=1\n" +
		"malloc id=4 size=256KiB\nmalloc id=5 size=4608KiB\nmalloc id=6 size=3MiB\n"
	for path, r := range replayPaths(t, text, sim.Config{Policy: "best-fit", Capacity: 8 << 20}, 1) {
		if r.OOMs != 1 || r.FirstOOMEvent != 5 || r.PeakReserved != 8<<20 || r.PeakReservedEvent != 6 ||
			r.PeakFragmentation != 0.28125 || r.FragmentationAtPeak != 0 {
			t.Errorf("%s: OOMs %d at %d, peak reserved %d at %d, peak fragmentation %v, at peak %v; want 1 at 5, 8388608 at 6, 0.28125, 0",
				path, r.OOMs, r.FirstOOMEvent, r.PeakReserved, r.PeakReservedEvent, r.PeakFragmentation, r.FragmentationAtPeak)
		}
	}
}

// replayPaths replays the text-form trace text with cfg, the series at
// most 2 points, on each path Run may take for events in memory: "plain"
// (stepPlain), "resolved" (the live allocations resolved ahead, in
// batches of resolveBatch events; for a Handler policy, batch.go) and
// "general" (with an Observer that does nothing: step). The checker is
// off: a checked replay is not plain.
func replayPaths(t *testing.T, text string, cfg sim.Config, resolveBatch int64) map[string]*sim.Result {
	t.Helper()
	t.Setenv("ALLOCSIM_CHECK", "0")
	h, evs, err := trace.ParseText("paths.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.SeriesPoints(2)()
	out := map[string]*sim.Result{}
	for _, path := range []string{"plain", "resolved", "general"} {
		c := cfg
		restore := func() {}
		switch path {
		case "resolved":
			restore = sim.ResolveAll(resolveBatch)
		case "general":
			c.Observer = nopObserver{}
		}
		rs, err := sim.Run(trace.NewSliceSource(h, evs), c)
		restore()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[path] = rs[0]
	}
	return out
}

// TestBatchAtPeakBeforeRelease: mallocs served from the cache while the
// reserved bytes are at their peak, in a batch (batch.go) that ends at a
// malloc whose call releases a segment, must count their allocated bytes
// at the peak (the idle share there) as of the reserved bytes they met, not
// those after the release. pytorch under a 16 MiB cap, the series one
// point (width 8), the live allocations resolved ahead:
//
//	0 malloc 12 MiB      a large segment of 12, reserved 12
//	1 free it            cached
//	2 malloc 512 KiB     a small segment of 2: reserved 14, the peak, 0.5 allocated
//	3 malloc 1 MiB       from it: 1.5 allocated
//	4 malloc 512 KiB     from it: 2 allocated, the most at the peak
//	5 malloc 15 MiB      a segment of 16 passes the cap: the cached 12 is
//	                     released, reserved 2, and 18 still passes it: OOM
//
// The idle share at the peak: 1 - 2/14.
func TestBatchAtPeakBeforeRelease(t *testing.T) {
	text := "malloc id=1 size=12MiB\nfree id=1\nmalloc id=2 size=512KiB\nmalloc id=3 size=1MiB\n" +
		"malloc id=4 size=512KiB\nmalloc id=5 size=15MiB\n"
	want := 1 - float64(2<<20)/float64(14<<20)
	// All six events in the resolver's first batch, so that the replay's
	// batch holds events 3 to 5.
	for path, r := range replayPaths(t, text, sim.Config{Policy: "pytorch", Capacity: 16 << 20}, 64) {
		if r.IdleAtPeak != want || r.PeakReserved != 14<<20 || r.PeakReservedEvent != 2 || r.OOMs != 1 ||
			r.FirstOOMEvent != 5 || r.DeviceFrees != 1 || r.PeakAllocated != 12<<20 {
			t.Errorf("%s: idle at peak %v, peak reserved %d at %d, OOMs %d at %d, device frees %d, peak allocated %d; want %v, 14680064 at 2, 1 at 5, 1, 12582912",
				path, r.IdleAtPeak, r.PeakReserved, r.PeakReservedEvent, r.OOMs, r.FirstOOMEvent, r.DeviceFrees, r.PeakAllocated, want)
		}
	}
}

// TestBatchFreeRequested: a free request and the free right after it, as
// PyTorch records every free (free_requested, then free_completed), in a
// batch: the request takes the allocated bytes out, the free the
// requested ones, and the block is free for the next malloc (the free is
// not late: it follows its request at once). pytorch, one point (width 8):
//
//	0 malloc 1 MiB       a small segment of 2 at S: reserved 2, 1 allocated
//	1 malloc 512 KiB     at S+1: 1.5 allocated and requested
//	2 free_requested 0   0.5 allocated, 1.5 requested
//	3 free 0             0.5 requested; the block at S free
//	4 malloc 1 MiB       at S again: no device call, 1.5 allocated and requested
//	5 malloc 512 KiB     at S+1.5: 2 allocated and requested
//
// Peak allocated and requested 2 MiB, all of the reserved: no idle share
// at the peak.
func TestBatchFreeRequested(t *testing.T) {
	text := "malloc id=1 size=1MiB t=0\nmalloc id=2 size=512KiB t=10\nfree_requested id=1 t=20\nfree id=1 t=30\n" +
		"malloc id=3 size=1MiB t=40\nmalloc id=4 size=512KiB t=50\n"
	for path, r := range replayPaths(t, text, sim.Config{Policy: "pytorch"}, 64) {
		if r.Events != 6 || r.Mallocs != 4 || r.Frees != 1 || r.DeviceAllocs != 1 || r.PeakReserved != 2<<20 ||
			r.PeakAllocated != 2<<20 || r.PeakRequested != 2<<20 || r.IdleAtPeak != 0 {
			t.Errorf("%s: %d events, %d mallocs, %d frees, %d device allocs, peak reserved %d, allocated %d, requested %d, idle at peak %v; want 6, 4, 1, 1, 2097152, 2097152, 2097152, 0",
				path, r.Events, r.Mallocs, r.Frees, r.DeviceAllocs, r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.IdleAtPeak)
		}
	}
}
