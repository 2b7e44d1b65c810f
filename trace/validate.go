package trace

import (
	"fmt"
	"io"
)

// ValidationError is a semantic problem with one event of a trace.
type ValidationError struct {
	Event int64  // index of the event at fault
	Addr  uint64 // the allocation concerned, 0 if none
	Msg   string
}

func (e *ValidationError) Error() string { return fmt.Sprintf("event %d: %s", e.Event, e.Msg) }

// Validator checks the meaning of a stream of events: a malloc of an
// address that is live, a free (or free request) of an address that is not
// live, naming the event that freed it when it is a double free (among the
// last RecentFrees frees), a malloc of 0 bytes or of more than MaxSize
// bytes, a pool where no pool belongs (CheckPool), a wait on or
// synchronize of a CUDA event never recorded (it
// orders nothing), a free on one stream of a block allocated on another
// that nothing orders it after (see streamOrder), a negative time and time
// going backwards. Its memory
// grows with the live
// allocations, not with the trace's length. A replay engine that keeps its
// own table of live allocations makes the same checks with Clock, FreeLog,
// CheckSize and LiveMalloc.
type Validator struct {
	live  AddrMap[liveMalloc] // address -> its malloc
	frees FreeLog
	clock Clock
	order streamOrder
}

// liveMalloc is a live allocation's malloc: its event index, its stream,
// and the stream's count of operations then.
type liveMalloc struct {
	event  int64
	stream uint64
	at     uint64
}

// streamOrder follows what each CUDA stream is ordered after, as vector
// clocks of per-stream operation counts: a stream is ordered after what
// an event it waited for was recorded after, and every stream after what
// the host synchronized with (a stream, device or event synchronize: the
// host issues later work after it). Stream 0, the legacy default stream,
// is ordered with every other stream.
type streamOrder struct {
	ops    map[uint64]uint64            // operations issued, by stream
	seen   map[uint64]map[uint64]uint64 // by stream: what it is ordered after
	host   map[uint64]uint64            // what the host has synchronized with
	events map[uint64]map[uint64]uint64 // recorded CUDA events: what they are ordered after
}

// op counts an operation on stream s and returns its count.
func (o *streamOrder) op(s uint64) uint64 {
	if o.ops == nil {
		o.ops, o.seen, o.host, o.events = map[uint64]uint64{}, map[uint64]map[uint64]uint64{}, map[uint64]uint64{}, map[uint64]map[uint64]uint64{}
	}
	o.ops[s]++
	return o.ops[s]
}

// knows returns what stream s is ordered after, its own operations
// included, as a new clock.
func (o *streamOrder) knows(s uint64) map[uint64]uint64 {
	c := map[uint64]uint64{s: o.ops[s]}
	for k, v := range o.seen[s] {
		c[k] = max(c[k], v)
	}
	return c
}

func join(dst, src map[uint64]uint64) {
	for k, v := range src {
		dst[k] = max(dst[k], v)
	}
}

// after reports whether an operation on stream b now is ordered after the
// at-th operation on stream a.
func (o *streamOrder) after(b, a, at uint64) bool {
	return a == b || a == 0 || b == 0 || o.seen[b][a] >= at || o.host[a] >= at
}

// RecentFrees is how many of the latest frees a FreeLog remembers to tell
// a double free from a free of an address never allocated.
const RecentFrees = 1 << 12

// MaxSize is the largest malloc in bytes that is accepted: 1 PiB, far
// beyond any device; a larger size is a corrupt or misread trace.
const MaxSize = 1 << 50

// NewValidator returns a Validator expecting event 0 next.
func NewValidator() *Validator { return &Validator{} }

// Check checks the next event, whose index is i. It returns a
// *ValidationError for a problem, nil otherwise; checking goes on either way.
// Of two problems with one event, the one with its allocation wins over
// time going backwards.
func (v *Validator) Check(i int64, ev Event) error {
	timeErr := v.clock.Check(i, ev)
	if err := v.checkOp(i, ev); err != nil {
		return err
	}
	if timeErr != nil {
		return timeErr
	}
	return nil
}

func (v *Validator) checkOp(i int64, ev Event) error {
	if err := v.applyOp(i, ev); err != nil {
		return err
	}
	if err := CheckPool(i, ev); err != nil {
		return err
	}
	return nil
}

func (v *Validator) applyOp(i int64, ev Event) error {
	switch ev.Op {
	case OpMalloc:
		if err := CheckSize(i, ev); err != nil {
			return err
		}
		m := liveMalloc{i, ev.Stream, v.order.op(ev.Stream)}
		if j, dup := v.live.Insert(ev.Addr, m); dup {
			return LiveMalloc(i, ev, j.event)
		}
	case OpFreeRequested:
		if _, ok := v.live.Get(ev.Addr); !ok {
			return v.frees.NotLive(i, ev)
		}
	case OpFree:
		m, ok := v.live.Take(ev.Addr)
		if !ok {
			return v.frees.NotLive(i, ev)
		}
		v.frees.Add(ev.Addr, i)
		v.order.op(ev.Stream)
		if !v.order.after(ev.Stream, m.stream, m.at) {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("free on stream %#x of %#x, allocated on stream %#x at event %d, which no event wait or synchronize orders it after: stream %#x may still use it", ev.Stream, ev.Addr, m.stream, m.event, m.stream)}
		}
	case OpEventRecord:
		v.order.op(ev.Stream)
		v.order.events[ev.Addr] = v.order.knows(ev.Stream)
	case OpStreamWaitEvent, OpEventSync:
		c, ok := v.order.events[ev.Addr]
		if !ok {
			return &ValidationError{i, 0, fmt.Sprintf("%s of event %#x, never recorded: it orders nothing", ev.Op, ev.Addr)}
		}
		if ev.Op == OpEventSync {
			join(v.order.host, c)
			break
		}
		v.order.op(ev.Stream)
		if v.order.seen[ev.Stream] == nil {
			v.order.seen[ev.Stream] = map[uint64]uint64{}
		}
		join(v.order.seen[ev.Stream], c)
	case OpStreamSync:
		v.order.op(ev.Stream)
		join(v.order.host, v.order.knows(ev.Stream))
	case OpDeviceSync:
		v.order.op(0)
		for s := range v.order.ops {
			join(v.order.host, v.order.knows(s))
		}
	}
	return nil
}

// CheckPool returns a problem with event i's pool: a pool on an op other
// than a malloc, a failed malloc, a pool_release or an empty_cache, a pool_release of the
// default pools (pool 0), which are never released, or a restore that is
// no malloc into a private pool.
func CheckPool(i int64, ev Event) *ValidationError {
	switch {
	case ev.Op == OpPoolRelease && ev.Pool == 0:
		return &ValidationError{i, 0, "pool_release of pool 0, the default pools, which are never released"}
	case ev.Pool != 0 && ev.Op != OpMalloc && ev.Op != OpMallocFailed && ev.Op != OpPoolRelease && ev.Op != OpEmptyCache:
		return &ValidationError{i, ev.Addr, fmt.Sprintf("%s with pool %d: only a malloc, a failed malloc, a pool_release or an empty_cache names a pool", ev.Op, ev.Pool)}
	case ev.Restore && (ev.Op != OpMalloc || ev.Pool == 0):
		return &ValidationError{i, ev.Addr, fmt.Sprintf("%s of pool %d marked restore: only a malloc into a private pool restores a block", ev.Op, ev.Pool)}
	}
	return nil
}

// Clock checks that time never goes backwards. The zero value expects the
// first event.
type Clock struct {
	lastTime, lastIdx int64
	started           bool
}

// Check takes event i's time and returns a problem if it is negative or
// earlier than the previous event's.
func (c *Clock) Check(i int64, ev Event) *ValidationError {
	var err *ValidationError
	switch {
	case ev.Time < 0:
		err = &ValidationError{i, ev.Addr, fmt.Sprintf("negative time: %d ns", ev.Time)}
	case c.started && ev.Time < c.lastTime:
		err = &ValidationError{i, ev.Addr, fmt.Sprintf("time goes backwards: %d ns after %d ns at event %d", ev.Time, c.lastTime, c.lastIdx)}
	}
	c.lastTime, c.lastIdx, c.started = ev.Time, i, true
	return err
}

// CheckSize returns a problem for a malloc of 0 bytes or of more than
// MaxSize bytes.
func CheckSize(i int64, ev Event) *ValidationError {
	switch {
	case ev.Size == 0:
		return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc of 0 bytes at %#x", ev.Addr)}
	case ev.Size > MaxSize:
		return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc of %d bytes at %#x: more than any device holds", ev.Size, ev.Addr)}
	}
	return nil
}

// LiveMalloc is the problem of a malloc at event i of an address that the
// malloc at event since made live.
func LiveMalloc(i int64, ev Event, since int64) *ValidationError {
	return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc at %#x, which is live since the malloc at event %d", ev.Addr, since)}
}

// FreeLog remembers the latest RecentFrees frees, to tell a double free
// from a free of an unknown address. The zero value is empty.
type FreeLog struct {
	ring []recentFree // oldest first from next
	next int
}

type recentFree struct {
	addr  uint64
	event int64
}

// NotLive is the problem of a free (or free request) at event i of an
// address that is not live: a double free when a recent free took it, else
// a free of an unknown address. Its search runs only on this rare path.
func (l *FreeLog) NotLive(i int64, ev Event) *ValidationError {
	n := len(l.ring)
	for k := 1; k <= n; k++ {
		f := l.ring[(l.next-k+n)%n]
		if f.addr == ev.Addr {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("double free of %#x: freed at event %d", ev.Addr, f.event)}
		}
	}
	return &ValidationError{i, ev.Addr, fmt.Sprintf("%s of unknown address %#x", ev.Op, ev.Addr)}
}

// Add records the free of addr at event i, forgetting the oldest free once
// RecentFrees are held.
func (l *FreeLog) Add(addr uint64, i int64) {
	if len(l.ring) < RecentFrees {
		l.ring = append(l.ring, recentFree{addr, i})
		l.next = len(l.ring) % RecentFrees
		return
	}
	l.ring[l.next] = recentFree{addr, i}
	l.next = (l.next + 1) % RecentFrees
}

// Live returns the number of allocations live after the events checked.
func (v *Validator) Live() int { return v.live.Len() }

// Validate reads src to the end and returns its semantic problems in event
// order, at most limit of them (all if limit <= 0). A read error from src is
// returned as the error.
func Validate(src Source, limit int) ([]*ValidationError, error) {
	v := NewValidator()
	var out []*ValidationError
	for i := int64(0); ; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if verr := v.Check(i, ev); verr != nil && (limit <= 0 || len(out) < limit) {
			out = append(out, verr.(*ValidationError))
		}
	}
}
