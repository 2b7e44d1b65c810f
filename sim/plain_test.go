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
// bytes), under a capacity or none, from memory and read an event at a
// time, where Run steps a plain replay through stepPlain (and a Handler
// policy's mallocs and frees through mallocHandled and freeHandled), and
// with an Observer that does nothing,
// which makes every event take step's general path: the results are the
// same, for pytorch (a Handler), best-fit and cuda. From memory, the live
// allocations resolved ahead of the replay (sim's live.go), in batches of
// a few events, give the same results too, on the plain path and the
// general one. The series holds a few points, so that each covers several
// events, as a long trace's do (observePlain's short way between device
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
		// observePlain's short way within a point.
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
