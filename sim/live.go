package sim

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/gpualloc/allocsim/trace"
)

// The replay's live allocations, by the trace's addresses. Which
// addresses are live at an event depends on the trace alone, never on the
// policy: a malloc makes its address live unless it is live already (a
// duplicate, whatever its size, kind or pool, and whether the policy then
// serves it or not), a free of a live address ends it, and a free request
// leaves it. So where the trace's events are in memory (Run on a
// trace.SliceSource), a resolver finds the allocation of each malloc,
// free and free request once, as a number, on a goroutine of its own
// ahead of the replays, and every replay of that Run keeps its live
// allocations in a slice by that number (Replay.slots) instead of a table
// by address (Replay.live); the results are the same either way. The
// table's lookups are then made on another core than the replay's: on
// one core, or a trace too short to pay for a goroutine, the replay keeps
// the table (resolveLive).

// The resolver's word for an event: the number of the allocation (the
// low 29 bits) and three flags.
const (
	// resolvedDup marks a malloc of an address that is live: the number
	// is that of the live allocation.
	resolvedDup = 1 << 31
	// resolvedNotLive marks a free or a free request of an address that
	// is not live: the number indexes resolver.problems.
	resolvedNotLive = 1 << 30
	// resolvedPlain marks a malloc or a free that takes stepPlain's own
	// path by the trace alone (plainEvent): Run's resolved replays step
	// it through stepResolved, without looking at the event's fields.
	resolvedPlain  = 1 << 29
	resolvedNumber = resolvedPlain - 1
)

// resolveBatch is the number of events the resolver resolves between two
// publications of its progress; a variable so that a test can make
// batches small.
var resolveBatch int64 = 1 << 13

// resolveAhead is the least number of events that Run resolves ahead; a
// variable so that a test can make every replay in memory resolve.
var resolveAhead = 1 << 16

// resolveLive reports whether Run resolves the live allocations of n
// events in memory ahead of its replays: at least resolveAhead of them,
// no more than the numbers hold, and more than one core to run on (on
// one, resolving apart cost a replay of kv_decode's mallocs and frees 14%
// more than the table).
func resolveLive(n int) bool {
	return n >= resolveAhead && n <= resolvedNumber && runtime.GOMAXPROCS(0) > 1
}

// resolver finds the live allocation of each malloc, free and free
// request of a trace's events (the numbering above), and the trace's
// problem at each free or free request of an address not live (a
// trace.FreeLog's, as a replay finds it). Its results up to ready are
// read-only and may be read by any goroutine that waited for them.
type resolver struct {
	evs []trace.Event
	ids []uint32 // by event, the word above; 0 for other events

	live   trace.AddrMap[uint32] // live allocation numbers by address
	unused []uint32              // numbers freed, for reuse, last freed first
	top    uint32                // numbers ever used
	frees  trace.FreeLog

	mu       sync.Mutex
	cond     sync.Cond
	ready    int64                    // events resolved, under mu
	problems []*trace.ValidationError // up to ready, under mu
	stop     atomic.Bool              // the replays stopped: resolve no further
	done     chan struct{}            // closed when run returns
}

// newResolver returns a resolver of evs, at most resolvedNumber+1 of
// them, which resolves nothing yet: run resolves them. Its release gives
// back its memory.
func newResolver(evs []trace.Event) *resolver {
	v := &resolver{evs: evs, done: make(chan struct{})}
	if p, ok := resolvedIDs.Get().(*[]uint32); ok && cap(*p) >= len(evs) {
		v.ids = (*p)[:len(evs)] // every word is written before it is read
	} else {
		v.ids = make([]uint32, len(evs))
	}
	v.cond.L = &v.mu
	return v
}

// resolvedIDs holds the words of resolvers released, for the next: a
// trace replayed again and again (tune's candidates, a benchmark) would
// otherwise take fresh pages of the system for every replay, and the
// faults of 2 MB of them (kv_decode's mallocs and frees) took 7% of a
// replay's time.
var resolvedIDs sync.Pool

// release stops the resolver, waits for it to return and keeps its words
// for another; no replay may read them after.
func (v *resolver) release() {
	v.stop.Store(true)
	<-v.done
	ids := v.ids[:0]
	v.ids = nil
	resolvedIDs.Put(&ids)
}

// start resolves the first batch of events, then the rest on a goroutine
// of its own: the replay that waits for it starts a batch behind, and
// does not catch up with it (a replay of an event takes several times its
// resolution), so that it does not wait for it again.
func (v *resolver) start() {
	var problems []*trace.ValidationError
	end := min(resolveBatch, int64(len(v.evs)))
	v.resolve(0, end, &problems)
	v.ready, v.problems = end, problems
	go v.run(end, problems)
}

// run resolves the events from event at on, in batches of resolveBatch,
// publishing its progress after each; it returns early, having published
// it, once stop is set.
func (v *resolver) run(at int64, problems []*trace.ValidationError) {
	defer close(v.done)
	n := int64(len(v.evs))
	for at < n && !v.stop.Load() {
		end := min(at+resolveBatch, n)
		v.resolve(at, end, &problems)
		v.mu.Lock()
		v.ready, v.problems = end, problems
		v.cond.Broadcast()
		v.mu.Unlock()
		at = end
	}
}

// resolve resolves events [from, to), appending the problems it finds to
// *problems. The numbers stay within resolvedNumber while the events are
// no more (newResolver's caller checks it): there are no more live
// allocations, nor problems, than events.
func (v *resolver) resolve(from, to int64, problems *[]*trace.ValidationError) {
	var last int64 // the time of the event before event from, 0 before the first
	if from > 0 {
		last = v.evs[from-1].Time
	}
	for i := from; i < to; i++ {
		ev := &v.evs[i]
		plain := uint32(0)
		if plainEvent(ev, last) {
			plain = resolvedPlain
		}
		last = ev.Time
		switch ev.Op {
		case trace.OpMalloc:
			p, dup := v.live.Ref(ev.Addr)
			if dup {
				v.ids[i] = resolvedDup | *p
				break
			}
			var id uint32
			if k := len(v.unused); k > 0 {
				id = v.unused[k-1]
				v.unused = v.unused[:k-1]
			} else {
				id = v.top
				v.top++
			}
			*p = id
			v.ids[i] = plain | id
		case trace.OpFree:
			id, ok := v.live.Take(ev.Addr)
			if !ok {
				v.ids[i] = resolvedNotLive | uint32(len(*problems))
				*problems = append(*problems, v.frees.NotLive(i, *ev))
				break
			}
			v.frees.Add(ev.Addr, i)
			v.unused = append(v.unused, id)
			v.ids[i] = plain | id
		case trace.OpFreeRequested:
			p := v.live.Ptr(ev.Addr)
			if p == nil {
				v.ids[i] = resolvedNotLive | uint32(len(*problems))
				*problems = append(*problems, v.frees.NotLive(i, *ev))
				break
			}
			v.ids[i] = *p
		default:
			v.ids[i] = 0
		}
	}
}

// wait blocks until event i is resolved, and notes in rv how many events
// are resolved then and the problems found up to there. The resolver must
// not have been stopped before event i.
func (rv *resolved) wait(i int64) {
	v := rv.v
	v.mu.Lock()
	for v.ready <= i {
		v.cond.Wait()
	}
	rv.ready, rv.problems = v.ready, v.problems
	v.mu.Unlock()
}

// resolved is a replay's view of a resolver: the events resolved so far
// and their problems (as of the last wait), which it reads without a
// lock.
type resolved struct {
	v        *resolver
	ready    int64
	ids      []uint32 // the resolver's
	problems []*trace.ValidationError
}

// view returns a replay's view of v, before its first wait.
func (v *resolver) view() *resolved { return &resolved{v: v, ids: v.ids} }

// liveRef returns the slot of the live allocation of malloc ev, event i,
// and whether it was live already (a duplicate); a new slot is zero. It
// is the live table's Ref.
func (r *Replay) liveRef(i int64, ev *trace.Event) (*liveAlloc, bool) {
	if r.rv == nil {
		return r.live.Ref(ev.Addr)
	}
	e := r.rv.ids[i]
	n := e & resolvedNumber
	if e&resolvedDup != 0 {
		return &r.slots[n], true
	}
	if int(n) >= len(r.slots) {
		r.slots = append(r.slots, make([]liveAlloc, int(n)+1-len(r.slots))...)
	}
	s := &r.slots[n]
	*s = liveAlloc{}
	return s, false
}

// liveTake takes the live allocation of free ev, event i, out of the
// replay's live allocations and returns it, or returns false when ev's
// address is not live.
func (r *Replay) liveTake(i int64, ev *trace.Event) (liveAlloc, bool) {
	if r.rv == nil {
		return r.live.Take(ev.Addr)
	}
	e := r.rv.ids[i]
	if e&resolvedNotLive != 0 {
		return liveAlloc{}, false
	}
	return r.slots[e&resolvedNumber], true
}

// livePtr returns the live allocation of free request ev, event i, nil
// when ev's address is not live.
func (r *Replay) livePtr(i int64, ev *trace.Event) *liveAlloc {
	if r.rv == nil {
		return r.live.Ptr(ev.Addr)
	}
	e := r.rv.ids[i]
	if e&resolvedNotLive != 0 {
		return nil
	}
	return &r.slots[e&resolvedNumber]
}

// freeLogged records the free of a live allocation at ev, event i, for
// telling a double free later; a resolver has recorded it already.
func (r *Replay) freeLogged(i int64, ev *trace.Event) {
	if r.rv == nil {
		r.frees.Add(ev.Addr, i)
	}
}

// notLive returns the trace's problem with free or free request ev, event
// i, of an address not live.
func (r *Replay) notLive(i int64, ev *trace.Event) *trace.ValidationError {
	if r.rv == nil {
		return r.frees.NotLive(i, *ev)
	}
	return r.rv.problems[r.rv.ids[i]&resolvedNumber]
}
