package sim

import (
	"fmt"
	"io"

	"github.com/gpualloc/allocsim/trace"
)

// Divergence is where a replay as recorded first parts from the recording
// (see Fidelity): what the real allocator did there and what the
// simulation did.
type Divergence struct {
	// Event is the index of the trace event (from 0) where it shows.
	Event int64
	// Real and Sim say what the recording shows and what the simulation
	// did, in words.
	Real, Sim string
}

func (d *Divergence) String() string {
	return fmt.Sprintf("event %d: real allocator: %s; simulation: %s", d.Event, d.Real, d.Sim)
}

// FidelityReport is the outcome of Fidelity.
type FidelityReport struct {
	// Result is the replay's result, as Run gives it.
	Result *Result
	// Calls is the number of device calls the recording shows; Mallocs the
	// number of mallocs (and failed mallocs) compared.
	Calls, Mallocs int64
	// Divergence is the first divergence, nil if the replay is identical
	// to the recording.
	Divergence *Divergence
}

// recordedCall is a device call of the recording, at its event.
type recordedCall struct {
	call  DeviceCall
	event int64
}

// Fidelity replays src as recorded (cfg with AsRecorded) and compares it
// with the recording, event by event: every device call of the simulation
// (segment allocation, free, map, unmap) must be the recorded one (same
// call, address and size, in the same order), made while replaying the
// first event the simulated allocator acts on (a malloc, a failed malloc,
// a free, an empty_cache) after the recorded call; every malloc must be
// placed at its recorded address, and fail (an OOM) exactly where the
// source's failed. It stops at the first divergence. Errors are those of
// Run.
func Fidelity(src trace.Source, cfg Config) (*FidelityReport, error) {
	cfg.AsRecorded = true
	cfg, err := cfg.withRecorded(src.Header())
	if err != nil {
		return nil, err
	}
	acts := &fidelityObserver{next: cfg.Observer}
	cfg.Observer = acts
	rep, err := NewReplay(cfg)
	if err != nil {
		return nil, err
	}
	rep.res.TraceSource = src.Header().Source
	var made []DeviceCall
	rep.dev.OnCall(func(c DeviceCall) { made = append(made, c) })
	out := &FidelityReport{}
	var queue []recordedCall // recorded calls not yet made
	head := 0
	// match compares the calls made while replaying event i with the
	// recorded ones; acting says whether the allocator acted on it, so that
	// every call recorded before it must have been made.
	match := func(i int64, acting bool) *Divergence {
		for _, c := range made {
			if head == len(queue) {
				return &Divergence{Event: i, Real: "no device call", Sim: c.String()}
			}
			if r := queue[head]; r.call != c {
				return &Divergence{Event: i, Real: fmt.Sprintf("%v (event %d)", r.call, r.event), Sim: c.String()}
			}
			head++
		}
		made = made[:0]
		if acting && head < len(queue) && queue[head].event < i {
			r := queue[head]
			return &Divergence{Event: r.event, Real: r.call.String(), Sim: fmt.Sprintf("no device call by event %d", i)}
		}
		if head > 1024 && 2*head > len(queue) {
			queue = append(queue[:0], queue[head:]...)
			head = 0
		}
		return nil
	}
	for i := int64(0); out.Divergence == nil; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			if err := rep.End(); err != nil {
				return nil, err
			}
			if out.Divergence = match(i, true); out.Divergence == nil && head < len(queue) {
				r := queue[head]
				out.Divergence = &Divergence{Event: r.event, Real: r.call.String(), Sim: "no device call by the end of the trace"}
			}
			break
		}
		if err != nil {
			return nil, err
		}
		acting := false
		switch ev.Op {
		case trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
			queue = append(queue, recordedCall{DeviceCall{ev.Op, ev.Addr, ev.Size}, i})
			out.Calls++
		case trace.OpMalloc, trace.OpMallocFailed, trace.OpFree, trace.OpEmptyCache:
			acting = true
		}
		acts.reset()
		if err := rep.Step(i, ev); err != nil {
			return nil, fmt.Errorf("policy %s: %w", rep.policy.Name(), err)
		}
		if out.Divergence = match(i, acting); out.Divergence != nil {
			break
		}
		if ev.Kind.OnDevice() {
			switch ev.Op {
			case trace.OpMalloc:
				out.Mallocs++
				switch {
				case acts.oom:
					out.Divergence = &Divergence{Event: i, Real: fmt.Sprintf("malloc of %d bytes at %#x", ev.Size, ev.Addr), Sim: "out of memory"}
				case acts.placed && acts.addr != ev.Addr:
					out.Divergence = &Divergence{Event: i, Real: fmt.Sprintf("malloc of %d bytes at %#x", ev.Size, ev.Addr),
						Sim: fmt.Sprintf("placed at %#x", acts.addr)}
				}
			case trace.OpMallocFailed:
				out.Mallocs++
				if !acts.oom {
					out.Divergence = &Divergence{Event: i, Real: fmt.Sprintf("out of memory for %d bytes", ev.Size),
						Sim: fmt.Sprintf("placed it at %#x", acts.addr)}
				}
			}
		}
	}
	out.Result = rep.Finish()
	return out, nil
}

// fidelityObserver notes the placement or the OOM of the event being
// replayed, and passes every action on to next.
type fidelityObserver struct {
	next   Observer
	placed bool
	addr   uint64
	oom    bool
}

func (o *fidelityObserver) reset() { o.placed, o.addr, o.oom = false, 0, false }

func (o *fidelityObserver) Observe(a Action) {
	switch a.Kind {
	case ActionAlloc:
		o.placed, o.addr = true, a.Addr
	case ActionOOM:
		o.oom = true
	}
	if o.next != nil {
		o.next.Observe(a)
	}
}
