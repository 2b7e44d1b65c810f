package sim

import (
	"fmt"
	"io"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// A window of calls told ahead to a policies.Pipeliner is at most
// aheadEvents events long and holds at most aheadMallocs mallocs: an exec
// policy's child answers a window's mallocs while the engine is still
// writing it, so that its answers must fit in a pipe's buffer (64 KiB on
// Linux) for neither side to block on the other.
const (
	aheadEvents  = 4096
	aheadMallocs = 256
)

// ahead tells a policies.Pipeliner the calls that the coming events make,
// a window at a time: from an event on, the mallocs and frees that take
// step's common path (stepPlain's own events), past the events that call
// no policy (free requests, segment events), up to the first event of any
// other kind, which the engine replays before the next window.
type ahead struct {
	p     policies.Pipeliner
	until int64 // the last window covers the events before until
	calls []policies.Call
	// Within a window: the recorded addresses malloced in it, with their
	// call, and those freed in it whose malloc came before it.
	mallocs map[uint64]int
	freed   map[uint64]bool
}

// newAhead returns the ahead of a replay whose policy is a Pipeliner and
// whose calls the trace's events decide alone: not a policy following a
// recording, whose calls depend on the recording's device calls (nor one
// told its ties, nor a history rebuilt), nor one called by handle
// (Replay.handler: the live table holds its blocks by their handles), and
// no Observer, which may stop the trace's source at an event of its
// choosing (fit at the first OOM) where windows read the source ahead.
// Nor on a backend that times the policy's calls (replay gpu: a call told
// ahead would be timed without the work its policy did before it).
func newAhead(r *Replay) *ahead {
	p, ok := r.policy.(policies.Pipeliner)
	if !ok || r.handler != nil || r.timer != nil || r.rec.follower != nil || r.rec.ties != nil || r.rec.inferrer != nil ||
		r.cfg.Observer != nil || r.unshown != nil || r.history != 0 {
		return nil
	}
	return &ahead{p: p, mallocs: map[uint64]int{}, freed: map[uint64]bool{}}
}

// tellAhead tells the policy the window of calls from event i on, evs the
// trace's events from it, unless the last window covers event i.
func (r *Replay) tellAhead(i int64, evs []trace.Event) error {
	a := r.ahead
	if i < a.until {
		return nil
	}
	n := r.window(evs)
	a.until = i + int64(max(n, 1))
	if len(a.calls) == 0 {
		return nil
	}
	if err := a.p.Ahead(a.calls); err != nil {
		return fmt.Errorf("event %d: %w", i, err)
	}
	return nil
}

// window sets r.ahead.calls to the calls of the events at the start of
// evs that make only the calls known from the event and the live table
// (see ahead), and returns their number.
func (r *Replay) window(evs []trace.Event) int {
	a := r.ahead
	a.calls = a.calls[:0]
	clear(a.mallocs)
	clear(a.freed)
	// Live at a recorded address: malloced in the window, or live in the
	// table and not freed in the window.
	live := func(addr uint64) bool {
		if _, ok := a.mallocs[addr]; ok {
			return true
		}
		return !a.freed[addr] && r.live.Ptr(addr) != nil
	}
	last := r.lastTime
	mallocs := 0
	evs = evs[:min(len(evs), aheadEvents)]
	for k := range evs {
		ev := &evs[k]
		if ev.Time < last || ev.Time < 0 || ev.Pool != 0 || ev.Restore {
			return k
		}
		last = ev.Time
		switch ev.Op {
		case trace.OpMalloc:
			if ev.Label != "" || !ev.Kind.OnDevice() || ev.Size-1 >= trace.MaxSize || live(ev.Addr) || mallocs == aheadMallocs {
				return k
			}
			a.mallocs[ev.Addr] = len(a.calls)
			a.calls = append(a.calls, policies.Call{Size: ev.Size, Stream: ev.Stream})
			mallocs++
		case trace.OpFree:
			if c, ok := a.mallocs[ev.Addr]; ok {
				delete(a.mallocs, ev.Addr)
				a.calls = append(a.calls, policies.Call{Free: true, Stream: ev.Stream, Of: c})
				continue
			}
			if a.freed[ev.Addr] {
				return k
			}
			p := r.live.Ptr(ev.Addr)
			if p == nil || p.direct() || !p.kind().OnDevice() {
				return k
			}
			a.freed[ev.Addr] = true
			if !p.failed() {
				a.calls = append(a.calls, policies.Call{Free: true, Stream: ev.Stream, Of: -1, Addr: p.block.Addr})
			}
		case trace.OpFreeRequested, trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
			// No call of the policy (segment events reach a Follower only).
		default:
			return k
		}
	}
	return len(evs)
}

// runAhead is Run's loop over src for reps of which some tell a Pipeliner
// their calls ahead: the events read from src a window at a time, each
// stepped through every replay in turn. The events read before a failure
// of src are stepped before it is returned, as Run's own loop would.
func runAhead(src trace.Source, reps []*Replay, stepErr func(*Replay, error) error) error {
	buf := make([]trace.Event, 0, aheadEvents)
	var i int64 // the index of buf[0]
	for {
		buf = buf[:0]
		var srcErr error
		for len(buf) < aheadEvents {
			ev, err := src.Next()
			if err != nil {
				srcErr = err
				break
			}
			buf = append(buf, ev)
		}
		for k := range buf {
			for _, rep := range reps {
				if rep.ahead != nil {
					if err := rep.tellAhead(i+int64(k), buf[k:]); err != nil {
						return stepErr(rep, err)
					}
				}
				if err := rep.step(i+int64(k), &buf[k]); err != nil {
					return stepErr(rep, err)
				}
			}
		}
		i += int64(len(buf))
		if srcErr == io.EOF {
			return nil
		}
		if srcErr != nil {
			return srcErr
		}
	}
}
