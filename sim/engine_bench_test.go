package sim

import (
	"flag"
	"fmt"
	"io"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/synth"
)

// nullPolicy places every malloc at an address of its own and keeps no
// record of it: a replay against it costs the engine's work alone.
type nullPolicy struct{ next uint64 }

func (p *nullPolicy) Name() string { return "null" }

func (p *nullPolicy) Malloc(size, stream uint64) (policies.Block, error) {
	p.next += size
	return policies.Block{Addr: p.next - size, Size: size}, nil
}

func (p *nullPolicy) Free(addr, stream uint64) error { return nil }

// BenchmarkReplayEngine replays the synthetic trace of BenchmarkReplay
// (its size from -bench.synth) against nullPolicy: the engine's own cost
// per event, to compare with decoding the same events (BenchmarkDecode).
func BenchmarkReplayEngine(b *testing.B) {
	n := 10_000_000
	if f := flag.Lookup("bench.synth"); f != nil {
		fmt.Sscan(f.Value.String(), &n)
	}
	src, err := synth.New("random", 1, map[string]string{
		"allocations": fmt.Sprint(n / 2), "max-size": "8MiB", "streams": "2",
	})
	if err != nil {
		b.Fatal(err)
	}
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, ev)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r, err := NewReplay(Config{Policy: "cuda"})
		if err != nil {
			b.Fatal(err)
		}
		r.policy = &nullPolicy{}
		for k := range evs {
			if err := r.step(int64(k), &evs[k]); err != nil {
				b.Fatal(err)
			}
		}
		r.Finish()
	}
	b.ReportMetric(float64(len(evs))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
