package sim_test

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/policytest"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// ptCalls is the pytorch policy as a plain policy (no Pooler, Follower or
// Inferrer: a replay of it makes only the calls that Ahead tells of) that
// holds the engine to the calls told ahead, when it is told (toldPolicy):
// every call must be the next one told (but for the frees of blocks whose
// malloc failed), and no other call may come while told calls are left.
type ptCalls struct {
	pt     *policies.PyTorch
	told   []policies.Call
	blocks []policies.Block // the told mallocs' blocks, once made
	failed []bool
	at     int
	calls  int // calls told in all
	err    error
}

func (p *ptCalls) Name() string { return "told" }

func (p *ptCalls) fail(format string, args ...any) error {
	if p.err == nil {
		p.err = fmt.Errorf(format, args...)
	}
	return p.err
}

func (p *ptCalls) skip() {
	for p.at < len(p.told) && p.told[p.at].Free && p.told[p.at].Of >= 0 && p.failed[p.told[p.at].Of] {
		p.at++
	}
}

// none fails when told calls are left where what is called.
func (p *ptCalls) none(what string) {
	if p.skip(); p.at < len(p.told) {
		p.fail("%s called with %d told calls left, from %+v", what, len(p.told)-p.at, p.told[p.at])
	}
}

// toldPolicy is ptCalls told the calls ahead: a policies.Pipeliner.
type toldPolicy struct{ *ptCalls }

func (p toldPolicy) Ahead(calls []policies.Call) error {
	p.none("Ahead")
	if len(calls) == 0 {
		return p.fail("Ahead told no calls")
	}
	p.told, p.at = append(p.told[:0], calls...), 0
	p.blocks, p.failed = make([]policies.Block, len(calls)), make([]bool, len(calls))
	p.calls += len(calls)
	return p.err
}

// next returns the index of the told call that c must be, -1 for none.
func (p *ptCalls) next(c policies.Call) int {
	if p.skip(); p.at == len(p.told) {
		return -1
	}
	t := p.told[p.at]
	if t.Free && t.Of >= 0 {
		t.Addr = p.blocks[t.Of].Addr
	}
	if t.Free != c.Free || t.Stream != c.Stream || t.Size != c.Size && !c.Free || t.Addr != c.Addr && c.Free {
		p.fail("called %+v where %+v was told", c, t)
	}
	p.at++
	return p.at - 1
}

func (p *ptCalls) Malloc(size, stream uint64) (policies.Block, error) {
	k := p.next(policies.Call{Size: size, Stream: stream})
	b, err := p.pt.Malloc(size, stream)
	if k >= 0 {
		p.blocks[k], p.failed[k] = b, err != nil
	}
	return b, err
}

func (p *ptCalls) Free(addr, stream uint64) error {
	p.next(policies.Call{Free: true, Addr: addr, Stream: stream})
	return p.pt.Free(addr, stream)
}

func (p *ptCalls) StreamSync(stream uint64)           { p.none("StreamSync") }
func (p *ptCalls) DeviceSync()                        { p.none("DeviceSync") }
func (p *ptCalls) EventRecord(ev, stream uint64)      { p.none("EventRecord") }
func (p *ptCalls) StreamWaitEvent(stream, ev uint64)  { p.none("StreamWaitEvent") }
func (p *ptCalls) EventSync(ev uint64)                { p.none("EventSync") }
func (p *ptCalls) FreeSpace() (total, largest uint64) { return p.pt.FreeSpace() }
func (p *ptCalls) Retries() int64                     { return p.pt.Retries() }
func (p *ptCalls) Mark(label string) error            { p.none("Mark"); return p.err }
func (p *ptCalls) EmptyCache() error {
	p.none("EmptyCache")
	return p.pt.EmptyCache()
}

// Close fails when told calls were never made.
func (p *ptCalls) Close() error {
	p.none("the end")
	return p.err
}

var lastTold *ptCalls

func init() {
	for _, name := range []string{"told", "untold"} {
		policies.Register(policies.Info{Name: name, Design: "the pytorch policy, holding the engine to the calls it tells ahead (sim's test)"},
			func(dev policies.Device, s policies.Settings) (policies.Policy, error) {
				pt, err := policies.NewPyTorch(dev, s)
				if err != nil {
					return nil, err
				}
				c := &ptCalls{pt: pt}
				if name == "untold" {
					return c, nil
				}
				lastTold = c
				return toldPolicy{c}, nil
			})
	}
}

// streamed hides a SliceSource's type, so that Run reads it an event at a
// time (runAhead's path).
type streamed struct{ trace.Source }

// TestAheadTellsTheCalls replays random traces, with events that leave
// step's common path mixed in (a malloc at a live address, a free of
// none, time going back, private pools, segment events, mallocs of 0
// bytes), against toldPolicy, from memory and read an event at a time,
// under a capacity or none: every call the engine makes is the one it
// told ahead, and the results are those of the same policy told nothing.
func TestAheadTellsTheCalls(t *testing.T) {
	told := 0
	rapid.Check(t, func(t *rapid.T) {
		evs := policytest.GenTrace(t)
		mixOdd(t, evs, map[int]func(k int, ev *trace.Event){
			4: func(k int, ev *trace.Event) {
				ev.Op, ev.Addr, ev.Size = trace.OpSegmentAlloc, 1<<45+uint64(k)<<21, 2<<20
			},
		})
		var capacity uint64
		if rapid.Bool().Draw(t, "capped") {
			capacity = uint64(rapid.IntRange(8, 160).Draw(t, "capacityMiB")) << 20
		}
		h := trace.Header{Source: "synthetic"}
		want, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Policy: "untold", Capacity: capacity})
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range []trace.Source{trace.NewSliceSource(h, evs), streamed{trace.NewSliceSource(h, evs)}} {
			got, err := sim.Run(src, sim.Config{Policy: "told", Capacity: capacity})
			if err != nil {
				t.Fatalf("%T: %v\ntrace:\n%s", src, err, policytest.TraceText(evs, -1))
			}
			g, w := *got[0], *want[0]
			g.Policy = w.Policy
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("%T: told %+v\nuntold %+v\ntrace:\n%s", src, g, w, policytest.TraceText(evs, -1))
			}
			told += lastTold.calls
		}
	})
	if told == 0 {
		t.Error("no call was told ahead")
	}
}

// mixOdd changes some events of evs, drawn one in 41 each way, into
// events that leave step's common path: a malloc at the address of an
// earlier event (0), a free of an address no malloc made (1), time going
// back (2), a malloc or free in private pool 1 (3), a malloc of 0 bytes
// (5), and the caller's own changes by number (own, from 4 on; no change
// for a number not there).
func mixOdd(t *rapid.T, evs []trace.Event, own map[int]func(k int, ev *trace.Event)) {
	for k := range evs {
		ev := &evs[k]
		switch n := rapid.IntRange(0, 40).Draw(t, "odd"); n {
		case 0:
			if ev.Op == trace.OpMalloc && k > 0 {
				ev.Addr = evs[rapid.IntRange(0, k-1).Draw(t, "dupOf")].Addr
			}
		case 1:
			if ev.Op == trace.OpFree {
				ev.Addr = 1 << 40
			}
		case 2:
			ev.Time -= 15
		case 3:
			if ev.Op == trace.OpMalloc || ev.Op == trace.OpFree || ev.Op == trace.OpFreeRequested {
				ev.Pool = 1
			}
		case 5:
			if ev.Op == trace.OpMalloc {
				ev.Size = 0
			}
		default:
			if f := own[n]; f != nil {
				f(k, ev)
			}
		}
	}
}
