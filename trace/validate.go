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
// bytes, a wait on or synchronize of a CUDA event never recorded (it
// orders nothing), a negative time and time going backwards. Its memory
// grows with the live
// allocations, not with the trace's length. A replay engine that keeps its
// own table of live allocations makes the same checks with Clock, FreeLog,
// CheckSize and LiveMalloc.
type Validator struct {
	live  AddrMap[int64] // address -> event index of its malloc
	frees FreeLog
	clock Clock
	// recorded holds the CUDA events recorded so far.
	recorded map[uint64]bool
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
	switch ev.Op {
	case OpMalloc:
		if err := CheckSize(i, ev); err != nil {
			return err
		}
		if j, dup := v.live.Insert(ev.Addr, i); dup {
			return LiveMalloc(i, ev, j)
		}
	case OpFreeRequested:
		if _, ok := v.live.Get(ev.Addr); !ok {
			return v.frees.NotLive(i, ev)
		}
	case OpFree:
		if _, ok := v.live.Take(ev.Addr); !ok {
			return v.frees.NotLive(i, ev)
		}
		v.frees.Add(ev.Addr, i)
	case OpEventRecord:
		if v.recorded == nil {
			v.recorded = map[uint64]bool{}
		}
		v.recorded[ev.Addr] = true
	case OpStreamWaitEvent, OpEventSync:
		if !v.recorded[ev.Addr] {
			return &ValidationError{i, 0, fmt.Sprintf("%s of event %#x, never recorded: it orders nothing", ev.Op, ev.Addr)}
		}
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
