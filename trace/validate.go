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
// bytes, and time going backwards. Its memory grows with the live
// allocations, not with the trace's length.
type Validator struct {
	live     map[uint64]int64 // address -> event index of its malloc
	freed    map[uint64]int64 // address -> event index of a recent free
	ring     []recentFree     // the frees in freed, oldest first from next
	next     int
	lastTime int64
	lastIdx  int64
}

type recentFree struct {
	addr  uint64
	event int64
}

// RecentFrees is how many of the latest frees a Validator remembers to tell
// a double free from a free of an address never allocated.
const RecentFrees = 1 << 16

// MaxSize is the largest malloc in bytes that a Validator accepts: 1 PiB,
// far beyond any device; a larger size is a corrupt or misread trace.
const MaxSize = 1 << 50

// NewValidator returns a Validator expecting event 0 next.
func NewValidator() *Validator {
	return &Validator{live: map[uint64]int64{}, freed: map[uint64]int64{}, lastIdx: -1}
}

// Check checks the next event, whose index is i. It returns a
// *ValidationError for a problem, nil otherwise; checking goes on either way.
func (v *Validator) Check(i int64, ev Event) error {
	var timeErr error
	if v.lastIdx >= 0 && ev.Time < v.lastTime {
		timeErr = &ValidationError{i, ev.Addr, fmt.Sprintf("time goes backwards: %d ns after %d ns at event %d", ev.Time, v.lastTime, v.lastIdx)}
	}
	v.lastTime, v.lastIdx = ev.Time, i
	if err := v.checkOp(i, ev); err != nil {
		return err
	}
	return timeErr
}

func (v *Validator) checkOp(i int64, ev Event) error {
	switch ev.Op {
	case OpMalloc:
		if ev.Size == 0 {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc of 0 bytes at %#x", ev.Addr)}
		}
		if ev.Size > MaxSize {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc of %d bytes at %#x: more than any device holds", ev.Size, ev.Addr)}
		}
		if j, ok := v.live[ev.Addr]; ok {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("malloc at %#x, which is live since the malloc at event %d", ev.Addr, j)}
		}
		v.live[ev.Addr] = i
		delete(v.freed, ev.Addr)
	case OpFree, OpFreeRequested:
		if _, ok := v.live[ev.Addr]; ok {
			if ev.Op == OpFree {
				delete(v.live, ev.Addr)
				v.remember(ev.Addr, i)
			}
			return nil
		}
		if j, ok := v.freed[ev.Addr]; ok {
			return &ValidationError{i, ev.Addr, fmt.Sprintf("double free of %#x: freed at event %d", ev.Addr, j)}
		}
		return &ValidationError{i, ev.Addr, fmt.Sprintf("%s of unknown address %#x", ev.Op, ev.Addr)}
	}
	return nil
}

// remember records the free of addr at event i, forgetting the oldest
// free once RecentFrees are held.
func (v *Validator) remember(addr uint64, i int64) {
	if len(v.ring) < RecentFrees {
		v.ring = append(v.ring, recentFree{addr, i})
	} else {
		old := v.ring[v.next]
		if j, ok := v.freed[old.addr]; ok && j == old.event {
			delete(v.freed, old.addr)
		}
		v.ring[v.next] = recentFree{addr, i}
		v.next = (v.next + 1) % RecentFrees
	}
	v.freed[addr] = i
}

// Live returns the number of allocations live after the events checked.
func (v *Validator) Live() int { return len(v.live) }

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
