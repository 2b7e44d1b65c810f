package sim

import "github.com/gpualloc/allocsim/trace"

// Batches: a resolved plain replay with a Handler policy (Run on events in
// memory, on more than one core) steps its mallocs, frees and free
// requests in runs, each in two passes. The first makes the policy's calls
// and keeps the live allocations; the second does the engine's counting
// for the whole run: the counts, the allocated and requested bytes and
// their peaks, and the series' open point. The second pass reads nothing
// the policy changes, so it may come after the first, as long as each
// event of the run leaves the figures as observeQuick would after it (no
// device call, no fragmentation, the open point still open): a run ends
// before an event it cannot take, before the open point fills (whose
// close asks the policy, closeAt), and at a call that changes the device
// (Device.changes, overflows included) or fails: that event then takes
// mallocHandled's or freeHandled's own path from the policy's answer on,
// after the events before it are counted. A free request (which step
// observes in full) changes no figure that observeQuick leaves out: it
// takes allocated bytes away.

// maxBatch is the most events in a batch: it bounds the memory a replay
// keeps for its batches (Replay.batched, 16 bytes an event), and changes
// no result.
const maxBatch = 512

// batchEvent is what a batch's first pass keeps of an event for its
// second: the allocated bytes it adds (a malloc) or takes away (a free,
// a free request), and the requested bytes it adds or takes away, with
// the kind of event in the top bits (a plain event requests at most
// trace.MaxSize bytes).
type batchEvent struct{ alloc, req uint64 }

const (
	batchFree    = 1 << 63 // a free: req, less this bit, taken away
	batchRequest = 1 << 62 // a free request: no requested bytes taken away
)

// stepBatch steps events from, up to to at most (resolved, to at most
// len(evs)), of a resolved plain replay with a Handler policy
// (Replay.rv, Replay.handler): a batch, else the event from alone through
// stepResolved. It returns the index of the event after the last it
// stepped, or that of the event that failed, with its error.
func (r *Replay) stepBatch(evs []trace.Event, from, to int64) (int64, error) {
	s := &r.series
	room := s.width - 1 - s.n // events that leave the open point open
	if room <= 0 || !r.sameDevice() {
		if err := r.stepResolved(from, &evs[from]); err != nil {
			return from, err
		}
		return from + 1, nil
	}
	end := min(to, from+min(room, maxBatch))
	dev, ids, h := r.dev, r.rv.ids, r.handler
	changes := dev.changes
	reserved, allocs, overflows := dev.reserved, dev.allocs, dev.overflows
	batch := r.batched
	last := r.lastTime // the time of the event before event i
	i := from
	for ; i < end; i++ {
		e, ev := ids[i], &evs[i]
		n := e & resolvedNumber
		if e&resolvedPlain == 0 {
			// A free request of a block the policy placed, in order (as
			// plainEvent asks of a free): the block stays allocated until
			// its free; step's own work, freeRequested, for it.
			if ev.Op != trace.OpFreeRequested || e&resolvedNotLive != 0 ||
				ev.Time < last || ev.Time < 0 || ev.Pool != 0 || ev.Restore {
				break
			}
			p := &r.slots[n]
			if !p.handled() {
				break
			}
			p.setReleased()
			r.rec.requested(i, ev)
			batch[i-from] = batchEvent{p.block.Size, batchRequest}
			last = ev.Time
			continue
		}
		last = ev.Time
		if ev.Op == trace.OpMalloc {
			if int(n) >= len(r.slots) {
				r.slots = append(r.slots, make([]liveAlloc, int(n)+1-len(r.slots))...)
			}
			dev.SetTime(ev.Time)
			b, hd, err := h.MallocHandle(ev.Size, ev.Stream)
			if err != nil || dev.changes != changes {
				r.counted(evs, from, i, reserved)
				r.mallocBegin(i, ev)
				if err := r.mallocAnswered(i, ev, &r.slots[n], b, hd, err, reserved, allocs, overflows); err != nil {
					return i, err
				}
				r.observeEvent(i, ev.Time)
				return i + 1, nil
			}
			r.slots[n] = handledLive(b, hd, ev.Size, ev.Kind, i)
			batch[i-from] = batchEvent{b.Size, ev.Size}
			continue
		}
		// A free of a block the policy placed, requested or not; as
		// freeBlock, a free that completes later than its request (a
		// Follower's) is late.
		a := r.slots[n]
		late := false
		if !a.handled() {
			if !a.releasedHandled() {
				break
			}
			late = r.rec.follower != nil && r.rec.late(i, ev)
		}
		dev.SetTime(ev.Time)
		err := h.FreeHandle(a.block.Addr, ev.Stream, late)
		alloc := a.block.Size // taken out at the request, if any (release)
		if a.released() {
			alloc = 0
		}
		if err != nil || dev.changes != changes {
			r.counted(evs, from, i, reserved)
			r.plainBegin(i, ev)
			r.freeCounted(a, alloc)
			if err != nil {
				return i, freeEnd(i, ev, err)
			}
			r.observeEvent(i, ev.Time)
			return i + 1, nil
		}
		batch[i-from] = batchEvent{alloc, a.requested | batchFree}
	}
	if i == from {
		// Its first event is none that a batch takes.
		if err := r.stepResolved(from, &evs[from]); err != nil {
			return from, err
		}
		return from + 1, nil
	}
	r.counted(evs, from, i, reserved)
	return i, nil
}

// counted is a batch's second pass, over events from to to (the batch's
// first events, whose calls made no device call, with reserved bytes
// reserved: Replay.batched holds them), as plainBegin, mallocHandled (its liveRose included) or
// freeHandled and observeQuick do for each.
func (r *Replay) counted(evs []trace.Event, from, to int64, reserved uint64) {
	if to == from {
		return
	}
	s, res := &r.series, &r.res
	atPeak := reserved == res.PeakReserved // for stillAtPeak
	alloc := r.allocated
	var mallocs, frees int64
	for _, be := range r.batched[:to-from] {
		if be.req >= batchRequest {
			alloc -= be.alloc
			if be.req&batchFree != 0 {
				r.requested.sub(be.req &^ batchFree)
				frees++
			}
			continue
		}
		mallocs++
		r.requested.add(be.req)
		req := r.requested.sat()
		alloc += be.alloc
		res.PeakRequested = max(res.PeakRequested, req)
		res.PeakAllocated = max(res.PeakAllocated, alloc)
		s.foldLive(req, alloc)
		if atPeak {
			s.allocAtPeak = max(s.allocAtPeak, alloc)
		}
	}
	r.allocated = alloc
	n := to - from
	res.Events += n
	res.Mallocs += mallocs
	res.Frees += frees
	last := &evs[to-1]
	r.lastTime, r.lastIdx, r.timed = last.Time, to-1, true
	s.cur.Event, s.cur.Time = to-1, last.Time
	s.n += n
}

// observeEvent is the observe after a malloc or free of stepPlain's own,
// event i at time t (ns): observeQuick, else observeSlow.
func (r *Replay) observeEvent(i, t int64) {
	if !r.observeQuick(i, t) {
		r.observeSlow(i, t)
	}
}
