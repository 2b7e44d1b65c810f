package sim

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// A replay as recorded of its own allocator's recording (a PyTorch
// snapshot under pytorch, a CuPy log under cupy) is watched for the first
// event where it parts from the recording: a device call other than the
// recorded one, a malloc placed elsewhere, an OOM where the source placed
// (or the reverse). Fidelity stops there; Run goes on and puts it in the
// Result (Parted) and its warnings, so that no replay of a recording
// reports the simulation's own figures as the real allocator's without
// naming the event where they stop being its.

// partWatch compares a replay with the recording it replays, event by
// event (the rules are Fidelity's).
type partWatch struct {
	noCalls bool // the trace records no device call: mallocs only
	noFrees bool // it records no device free (CuPy's log)

	made  []DeviceCall   // calls the simulation made while replaying the event
	queue []recordedCall // recorded calls not yet made, from head
	head  int
	next  int64 // the index of the event after the last replayed

	// calls counts the recorded device calls, mallocs the mallocs and
	// failed mallocs compared.
	calls, mallocs int64
	// The current event's malloc: placed at addr, or out of memory.
	placed bool
	addr   uint64
	oom    bool

	// parted is the first divergence, nil while the replay agrees.
	parted *Divergence
	// partedOOM says it is at an OOM in one and not in the other.
	partedOOM bool
}

// newPartWatch returns a watch of a replay on dev, which it takes the
// calls of (Device.OnCall), of a trace that records no device call
// (noCalls) or no device free (noFrees).
func newPartWatch(noCalls, noFrees bool, dev *Device) *partWatch {
	w := &partWatch{noCalls: noCalls, noFrees: noFrees}
	dev.OnCall(w.call)
	return w
}

// call notes a device call of the simulation.
func (w *partWatch) call(c DeviceCall) {
	if w.parted == nil && !w.noCalls && (!w.noFrees || c.Op != trace.OpSegmentFree) {
		w.made = append(w.made, c)
	}
}

// begin is called before event i, ev, is replayed.
func (w *partWatch) begin(i int64, ev *trace.Event) {
	w.placed, w.addr, w.oom = false, 0, false
	w.next = i + 1
	switch ev.Op {
	case trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
		if w.parted == nil {
			w.queue = append(w.queue, recordedCall{DeviceCall{ev.Op, ev.Addr, ev.Size}, i})
		}
		w.calls++
	}
}

// end is called after event i, ev, was replayed.
func (w *partWatch) end(i int64, ev *trace.Event) {
	if w.parted != nil {
		return
	}
	acting := false
	switch ev.Op {
	case trace.OpMalloc, trace.OpMallocFailed, trace.OpFree, trace.OpEmptyCache:
		acting = true
	}
	if w.parted = w.match(i, acting); w.parted != nil || !ev.Kind.OnDevice() {
		// Calls of a malloc that failed in the source, or made on the way
		// to a simulated OOM: the capacity's doing.
		w.partedOOM = w.parted != nil && (w.oom || ev.Op == trace.OpMallocFailed)
		return
	}
	real := func() string { return fmt.Sprintf("malloc of %d bytes at %#x", ev.Size, ev.Addr) }
	switch ev.Op {
	case trace.OpMalloc:
		w.mallocs++
		switch {
		case w.oom:
			w.parted, w.partedOOM = &Divergence{Event: i, Real: real(), Sim: "out of memory"}, true
		case w.placed && !w.noCalls && w.addr != ev.Addr:
			w.parted = &Divergence{Event: i, Real: real(), Sim: fmt.Sprintf("placed at %#x", w.addr)}
		}
	case trace.OpMallocFailed:
		w.mallocs++
		if !w.oom {
			w.parted = &Divergence{Event: i, Real: fmt.Sprintf("out of memory for %d bytes", ev.Size),
				Sim: fmt.Sprintf("placed it at %#x", w.addr)}
			w.partedOOM = true
		}
	}
}

// finish is called after the last event and the replay's End: every
// recorded call must have been made.
func (w *partWatch) finish() {
	if w.parted != nil {
		return
	}
	if w.parted = w.match(w.next, true); w.parted == nil && w.head < len(w.queue) {
		r := w.queue[w.head]
		w.parted = &Divergence{Event: r.event, Real: r.call.String(), Sim: "no device call by the end of the trace"}
	}
}

// match compares the calls made while replaying event i with the
// recorded ones; acting says whether the allocator acted on it, so that
// every call recorded before it must have been made.
func (w *partWatch) match(i int64, acting bool) *Divergence {
	if w.noCalls {
		return nil
	}
	for _, c := range w.made {
		if w.head == len(w.queue) {
			return &Divergence{Event: i, Real: "no device call", Sim: c.String()}
		}
		if r := w.queue[w.head]; r.call != c {
			return &Divergence{Event: i, Real: fmt.Sprintf("%v (event %d)", r.call, r.event), Sim: c.String()}
		}
		w.head++
	}
	w.made = w.made[:0]
	if acting && w.head < len(w.queue) && w.queue[w.head].event < i {
		r := w.queue[w.head]
		return &Divergence{Event: r.event, Real: r.call.String(), Sim: fmt.Sprintf("no device call by event %d", i)}
	}
	if w.head > 1024 && 2*w.head > len(w.queue) {
		w.queue = append(w.queue[:0], w.queue[w.head:]...)
		w.head = 0
	}
	return nil
}

// unshownWatch bounds the peak of reserved bytes of a replay of a
// recording that does not show its allocator's releases (Result's
// PeakUnshown): the segments that were wholly free at the peak, less those
// the recording shows were still held after it (a later malloc placed in
// one, with no recorded segment allocation for it since the peak).
type unshownWatch struct {
	policy policies.Releasable
	segs   []policies.Block // wholly free at the peak, not shown held since
	fresh  []policies.Block // segments the recording allocated since the peak
}

// atPeak is called when the reserved bytes reach a new peak.
func (u *unshownWatch) atPeak() {
	u.segs = u.policy.Releasable(u.segs[:0])
	slices.SortFunc(u.segs, func(a, b policies.Block) int { return cmp.Compare(a.Addr, b.Addr) })
	u.fresh = u.fresh[:0]
}

// malloc notes a malloc the recording placed at addr: a binary search of
// the segments (disjoint, by address), and only on a hit a look at the
// segments allocated since the peak.
func (u *unshownWatch) malloc(addr uint64) {
	k, _ := slices.BinarySearchFunc(u.segs, addr, func(s policies.Block, a uint64) int { return cmp.Compare(s.Addr, a) })
	if k < len(u.segs) && u.segs[k].Addr == addr {
		// k is the segment starting at addr
	} else if k > 0 {
		k-- // the segment starting before addr, if it holds it
	}
	if k >= len(u.segs) || addr < u.segs[k].Addr || addr-u.segs[k].Addr >= u.segs[k].Size {
		return
	}
	for _, f := range u.fresh {
		if addr >= f.Addr && addr-f.Addr < f.Size {
			return // in a segment allocated since: no sign of the old one
		}
	}
	u.segs = slices.Delete(u.segs, k, k+1) // held after the peak
}

// bytes returns the bytes of the segments not shown held.
func (u *unshownWatch) bytes() uint64 {
	var n uint64
	for _, s := range u.segs {
		n += s.Size
	}
	return n
}
