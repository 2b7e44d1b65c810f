package sim_test

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

var liveAllocs = flag.Int("bench.live", 10_000_000, "allocations live at once in BenchmarkLiveAllocations")

// liveSource is a trace of n mallocs (512 B to 64 KiB, on one stream)
// followed by their n frees, made as it is read: nothing but the replay
// holds memory per allocation. At the peak, before the first free, it
// calls atPeak.
type liveSource struct {
	n, i   int
	rng    *rand.Rand
	atPeak func()
}

func newLiveSource(n int, atPeak func()) *liveSource {
	return &liveSource{n: n, rng: rand.New(rand.NewPCG(1, 2)), atPeak: atPeak}
}

func (s *liveSource) Header() trace.Header {
	return trace.Header{Source: "text", Device: "NVIDIA H200"}
}

func (s *liveSource) Next() (trace.Event, error) {
	k := s.i
	if k == 2*s.n {
		return trace.Event{}, io.EOF
	}
	s.i++
	if k < s.n {
		return trace.Event{Op: trace.OpMalloc, Addr: uint64(k + 1), Size: uint64(1+s.rng.IntN(128)) * 512, Time: int64(k)}, nil
	}
	if k == s.n {
		s.atPeak()
	}
	return trace.Event{Op: trace.OpFree, Addr: uint64(k - s.n + 1), Time: int64(k)}, nil
}

// heapInUse returns the bytes of the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkLiveAllocations measures the memory a replay and `replay check`
// hold per live allocation, with -bench.live allocations live at once: the
// heap in use at the peak less the heap before, per allocation (B/live),
// for the pytorch and best-fit policies and for check's validator and
// statistics.
func BenchmarkLiveAllocations(b *testing.B) {
	n := *liveAllocs
	measure := func(b *testing.B, run func(src trace.Source) error) {
		var perLive float64
		for i := 0; i < b.N; i++ {
			base := heapInUse()
			src := newLiveSource(n, func() {
				perLive = float64(heapInUse()-base) / float64(n)
			})
			if err := run(src); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(perLive, "B/live")
		benchReport("live "+b.Name(), fmt.Sprintf("BENCH stage=live name=%s live=%d bytes_per_live=%.1f seconds=%.4f", b.Name(), n, perLive, b.Elapsed().Seconds()/float64(b.N)))
	}
	for _, p := range []string{"pytorch", "best-fit"} {
		b.Run(p, func(b *testing.B) {
			measure(b, func(src trace.Source) error {
				_, err := sim.Run(src, sim.Config{Trace: "live", Policy: p})
				return err
			})
		})
	}
	b.Run("check", func(b *testing.B) {
		measure(b, func(src trace.Source) error {
			v, s := trace.NewValidator(), trace.NewStats()
			for i := int64(0); ; i++ {
				ev, err := src.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if err := v.Check(i, ev); err != nil {
					return err
				}
				s.Add(ev)
			}
		})
	})
}
