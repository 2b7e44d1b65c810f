package sim_test

import (
	"fmt"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
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

// BenchmarkReplayEngine replays the traces of BenchmarkReplay against
// nullPolicy: the engine's own cost per event, to set against decoding the
// same events (BenchmarkDecode). Its lines say policy=null.
func BenchmarkReplayEngine(b *testing.B) {
	for _, bt := range benchTraces(b) {
		b.Run(bt.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				r, err := sim.NewReplayOn(sim.Config{Trace: bt.name, Policy: "cuda"}, &nullPolicy{})
				if err != nil {
					b.Fatal(err)
				}
				for k := range bt.evs {
					if err := r.StepPtr(int64(k), &bt.evs[k]); err != nil {
						b.Fatal(err)
					}
				}
				r.Finish()
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			benchReport(bt.name+" 3replay null", fmt.Sprintf("BENCH trace=%s stage=replay policy=null seconds=%.4f events=%d", bt.name, sec, len(bt.evs)))
			b.ReportMetric(float64(len(bt.evs))/sec, "events/s")
		})
	}
}
