package sim_test

import (
	"flag"
	"fmt"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

var (
	manyStreams = flag.Int("bench.streams", 100_000, "streams in BenchmarkManyStreams")
	manyPools   = flag.Int("bench.pools", 20_000, "private pools in BenchmarkManyPools")
)

// streamsTrace returns n mallocs of 4 KiB, each on a stream of its own
// (streams 1 to n), each freed right after it when !live, else all freed
// after the last malloc (n live at once on n streams).
func streamsTrace(n int, live bool) []trace.Event {
	evs := make([]trace.Event, 0, 2*n)
	t := int64(0)
	add := func(ev trace.Event) {
		t++
		ev.Time = t
		evs = append(evs, ev)
	}
	for i := 1; i <= n; i++ {
		add(trace.Event{Op: trace.OpMalloc, Addr: uint64(i), Size: 4096, Stream: uint64(i)})
		if !live {
			add(trace.Event{Op: trace.OpFree, Addr: uint64(i), Stream: uint64(i)})
		}
	}
	if live {
		for i := 1; i <= n; i++ {
			add(trace.Event{Op: trace.OpFree, Addr: uint64(i), Stream: uint64(i)})
		}
	}
	return evs
}

// poolsTrace returns a malloc of 4 KiB into each of n private pools
// (pools 1 to n, stream 0), each freed and its pool released right after
// it, and an empty_cache at the end.
func poolsTrace(n int) []trace.Event {
	evs := make([]trace.Event, 0, 3*n+1)
	t := int64(0)
	add := func(ev trace.Event) {
		t++
		ev.Time = t
		evs = append(evs, ev)
	}
	for i := 1; i <= n; i++ {
		add(trace.Event{Op: trace.OpMalloc, Addr: uint64(i), Size: 4096, Pool: uint32(i)})
		add(trace.Event{Op: trace.OpFree, Addr: uint64(i)})
		add(trace.Event{Op: trace.OpPoolRelease, Pool: uint32(i)})
	}
	add(trace.Event{Op: trace.OpEmptyCache})
	return evs
}

// benchManyTrace replays evs against every policy, one sub-benchmark each,
// and reports a BENCH line per policy under trace name.
// With live set, the planners are left out: their placement of n blocks
// all live at once searches over the blocks placed (n^2 in blocks, not in
// streams).
func benchManyTrace(b *testing.B, name string, evs []trace.Event, live bool) {
	h := trace.Header{Version: trace.Version, Source: "text"}
	for _, p := range policies.Names() {
		if live && isPlanner(p) {
			continue
		}
		b.Run(p, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Trace: name, Policy: p}); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			benchReport(name+" 3replay "+p, fmt.Sprintf("BENCH trace=%s stage=replay policy=%s seconds=%.4f events=%d", name, p, sec, len(evs)))
			b.ReportMetric(float64(len(evs))/sec, "events/s")
		})
	}
}

// BenchmarkManyStreams replays, against every policy, one malloc and free
// on each of -bench.streams streams (100000), and the same mallocs all
// live at once before their frees: the cost of a stream must not grow with
// the number of streams (issue 36: 100000 streams took over 180 s under
// pytorch). Its lines say trace=streamsN and trace=streamsN-live.
func BenchmarkManyStreams(b *testing.B) {
	n := *manyStreams
	b.Run("each", func(b *testing.B) {
		benchManyTrace(b, fmt.Sprintf("streams%d", n), streamsTrace(n, false), false)
	})
	b.Run("live", func(b *testing.B) {
		benchManyTrace(b, fmt.Sprintf("streams%d-live", n), streamsTrace(n, true), true)
	})
}

// BenchmarkManyPools replays, against every policy, a malloc, free and
// release of each of -bench.pools private pools (20000), then an
// empty_cache: the cost of a pool must not grow with the number of pools
// (issue 36: 20000 pools took 68 s under pytorch). Its lines say
// trace=poolsN.
func BenchmarkManyPools(b *testing.B) {
	n := *manyPools
	benchManyTrace(b, fmt.Sprintf("pools%d", n), poolsTrace(n), false)
}
