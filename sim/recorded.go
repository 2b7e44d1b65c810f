package sim

import (
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// Replaying as recorded (Config.AsRecorded). A trace that recorded an
// allocator's own actions (a PyTorch snapshot: its settings in the header,
// its segment allocations, frees, maps and unmaps as events) is replayed so
// that a policy simulating that allocator takes the recorded path:
//
//   - settings: the policy's policies.Recorded settings from the header,
//     the user's Settings over them (Run does this; the Result's Settings
//     are those used);
//   - addresses: the device hands out the addresses of the recorded
//     segment allocations and maps, in order, while the simulation agrees
//     with them (Device.FollowRecording);
//   - a policies.TieFollower is told the recorded address of each
//     malloc before it, to choose that block among equal ones;
//   - the recorded device calls of its own allocator (the trace's source
//     is the policy's: policies.SourcePolicy) are shown to a
//     policies.Follower, which
//     tells from them the releases it does not make itself (an explicit
//     empty_cache), and frees that complete late (free_completed after
//     other events than its free_requested: a block used on another
//     stream) reach it through FreeLate.
//
// Without AsRecorded, segment events are ignored as before, and a
// Follower still gets late frees through FreeLate.

// recorded is a Replay's state for replaying as recorded.
type recorded struct {
	follower policies.Follower    // the policy, if it follows recordings
	ties     policies.TieFollower // the policy, if it follows recorded ties and AsRecorded
	inferrer policies.Inferrer    // the policy, if it infers unrecorded calls and AsRecorded
	inferred int64                // the calls it had inferred after the last malloc
	reqEvent int64                // event index of the last free_requested, -1 if none
	reqAddr  uint64               // and its address
	reqTime  int64                // and its time, ns
}

// lateGap is the time from a free_requested to the free_completed right
// after it from which the free counts as late all the same: a block
// without uses on other streams is freed in the call that requested it
// (the two entries microseconds apart: at most 5 ms apart, the host
// descheduled, in the recordings at hand), while a free pending on
// another stream's work that completes inside the next malloc's retry
// (synchronize_and_free_events, before release_cached_blocks) is logged
// when that work ends, with nothing logged in between (pending_retry:
// 271 ms).
const lateGap = 20e6

// startRecorded sets up the replay as recorded when cfg asks for it.
func (r *Replay) startRecorded() {
	r.rec.follower, _ = r.policy.(policies.Follower)
	r.rec.reqEvent = -1
	if r.cfg.AsRecorded && r.dev != nil {
		r.dev.FollowRecording()
	}
	if r.cfg.AsRecorded {
		r.rec.ties, _ = r.policy.(policies.TieFollower)
		if !r.cfg.foreign && !r.cfg.noNotes {
			r.rec.inferrer, _ = r.policy.(policies.Inferrer)
		}
	}
	if r.cfg.watch && r.dev != nil {
		r.watch = newPartWatch(r.cfg.noCalls, r.cfg.noFrees, r.dev)
		if rel, ok := r.policy.(policies.Releasable); ok && r.cfg.noFrees {
			r.unshown = &unshownWatch{policy: rel}
		}
	}
}

// noteInferred puts in the result the calls the policy inferred at the
// malloc of size bytes, event i: their count, and the first with its event.
func (r *Replay) noteInferred(i int64, size uint64) {
	n, last := r.rec.inferrer.Inferred()
	if n == r.rec.inferred {
		return
	}
	r.res.Inferred += n - r.rec.inferred
	r.rec.inferred = n
	if r.res.FirstInferred == "" {
		r.res.FirstInferred = fmt.Sprintf("event %d (malloc of %d bytes): %s", i, size, last)
	}
}

// requested notes the free_requested of addr at event i.
func (s *recorded) requested(i int64, ev *trace.Event) {
	s.reqEvent, s.reqAddr, s.reqTime = i, ev.Addr, ev.Time
}

// late reports whether the free ev at event i completes later than its
// request: other events came between, or lateGap.
func (s *recorded) late(i int64, ev *trace.Event) bool {
	return s.reqEvent != i-1 || s.reqAddr != ev.Addr || ev.Time-s.reqTime >= lateGap
}

// followed shows a recorded device call (event ev) to the device and the
// policy, when replaying as recorded.
func (r *Replay) followed(ev *trace.Event) {
	if !r.cfg.AsRecorded {
		return
	}
	if r.dev != nil {
		r.dev.Observe(*ev)
	}
	if r.rec.follower != nil && !r.cfg.foreign {
		r.rec.follower.Follow(*ev)
	}
}

// freeBlock gives the block of a back to the policy at event i, the free
// (free_completed) ev: through FreeLate when the program asked for the free
// (free_requested) before other events than this one, or long before it
// (lateGap); by its handle (FreeHandle, late or not) when the policy
// placed it with one.
func (r *Replay) freeBlock(i int64, ev *trace.Event, a liveAlloc) error {
	if a.bits&liveHandle != 0 {
		late := r.rec.follower != nil && a.released() && r.rec.late(i, ev)
		return r.handler.FreeHandle(a.block.Addr, ev.Stream, late)
	}
	if f := r.rec.follower; f != nil && a.released() && r.rec.late(i, ev) {
		if r.timer != nil {
			r.timer.BeginPolicy()
			defer r.timer.EndPolicy()
		}
		return f.FreeLate(a.block.Addr, ev.Stream)
	}
	return r.policyFree(a.block.Addr, ev.Stream)
}

// End completes the replay after the last event: a Follower completes what
// the recording implies (a release at the very end). Run calls it; a
// caller of Step calls it before Finish.
func (r *Replay) End() error {
	if r.rec.follower != nil {
		if err := r.rec.follower.Flush(); err != nil {
			return fmt.Errorf("end of trace: %w", err)
		}
	}
	if r.watch != nil {
		r.watch.finish()
	}
	return nil
}

// ContextBytes is the memory in bytes a device's context holds before the
// first allocation (results.ContextBytes).
const ContextBytes = results.ContextBytes

// withCard gives a config with CardCapacity and no capacity the capacity of
// the card the trace was recorded on (h.DeviceMemory, record run's
// cudaMemGetInfo total) less its context (ContextBytes), held to the
// footprint (Card), so that a malloc the card refused fails in the replay
// too.
func (c Config) withCard(h trace.Header) Config {
	if c.CardMemory == 0 {
		c.CardMemory = h.DeviceMemory
	}
	if c.CardCapacity && c.Capacity == 0 && c.Backend == nil && h.DeviceMemory > ContextBytes {
		c.Capacity = h.DeviceMemory - ContextBytes
		c.CardCapacityUsed, c.Card = true, true
	}
	return c
}

// withRecorded returns c with the settings that replay a trace of header h
// as recorded, when c asks for it and its policy follows recordings of h's
// source; else c as is.
func (c Config) withRecorded(h trace.Header) (Config, error) {
	if !c.AsRecorded {
		return c, nil
	}
	// Under settings of the user's, the replay is not the recording's:
	// where they part is no call the recording failed to show.
	c.noNotes = len(c.Settings) > 0
	s, ok, err := policies.Recorded(c.Policy, h, c.Settings)
	if err != nil {
		return c, fmt.Errorf("%s: %w", c.Trace, err)
	}
	if ok {
		c.Settings = s
	}
	// Another allocator's device calls tell the policy nothing of its
	// own path: a Follower follows its own allocator's recordings only.
	src, known := policies.SourcePolicy(h.Source)
	c.foreign = !known || src != c.Policy
	c.watch = !c.foreign && !c.noNotes
	c.noCalls, c.noFrees = h.Unrecorded(trace.UnrecordedSegments), h.Unrecorded(trace.UnrecordedSegmentFrees)
	return c, nil
}
