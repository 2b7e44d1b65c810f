package gpu

// #include "cudart.h"
import "C"

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// The cuda target's batched path. Replaying event by event, the harness's
// Go code runs between every two calls, and on an H200 that cost 0.6 to
// 1.2 us per call over a plain C loop of the same calls: besides its own
// time, the driver's calls after it run slower, with the caches the Go code
// left behind. Batched, the calls of up to batchOps consecutive mallocs and
// frees are made back to back in C (cr_batch), each still timed around the
// call, and the Go code does its bookkeeping before and after the batch,
// in event order, exactly as the event-by-event path does it.

// batchOps is the most mallocs and frees in one batch: Ctrl-C is seen
// between batches, as the event-by-event path sees it every 256 events.
const batchOps = 256

// batch holds one batch's operations and the slots of the live
// allocations, which outlive batches.
type batch struct {
	// Per operation: cudaMalloc of size bytes into slot (size > 0) or
	// cudaFree of slot's pointer (size 0), and what came back.
	size []uint64
	slot []int32
	ptr  []uint64
	ns   []int64
	rc   []int32
	// wait is the pacing wait before each operation's call in
	// nanoseconds (Config.Pace), all 0 when not pacing.
	wait              []int64
	slotPtr, slotSize []uint64 // by slot, kept by cr_batch
	spare             []int32  // free slots
	freed             []int32  // slots freed in this batch, spare after it
}

func (b *batch) reset() {
	b.size, b.slot, b.wait = b.size[:0], b.slot[:0], b.wait[:0]
}

// newSlot returns a slot no operation of this batch has used.
func (b *batch) newSlot() int32 {
	if n := len(b.spare); n > 0 {
		s := b.spare[n-1]
		b.spare = b.spare[:n-1]
		return s
	}
	b.slotPtr = append(b.slotPtr, 0)
	b.slotSize = append(b.slotSize, 0)
	return int32(len(b.slotPtr) - 1)
}

// batchable reports whether ev can go into a batch: a malloc of device
// memory of at least one byte at an address not live, the free of an
// allocation made in a batch, or a free request (no call). Anything else
// (synchronizations, host memory, zero sizes, anomalies) ends the batch
// and is replayed alone.
func (r *replayer) batchable(ev *trace.Event) bool {
	switch ev.Op {
	case trace.OpMalloc:
		if ev.Size == 0 || !ev.Kind.OnDevice() || r.rep.Live(ev.Addr) {
			return false
		}
		_, live := r.slots.Get(ev.Addr)
		return !live
	case trace.OpFree:
		_, live := r.slots.Get(ev.Addr)
		return live
	case trace.OpFreeRequested:
		return true
	}
	return false
}

// replayBatched replays buf, whose first event is event *i of the trace,
// on the cuda target in batches, and adds the replay's wall time (samples
// left out) to the result. A batch's calls are made first, back to back in
// C; then the engine replays the batch's events one by one, and the
// device hands the cuda target the outcome of each call made (Device.play)
// instead of calling again. It returns ctx's error, with the result marked
// interrupted, when ctx is cancelled between two batches.
func (r *replayer) replayBatched(ctx context.Context, buf []trace.Event, i *int64) error {
	b := r.batch
	t0 := time.Now()
	defer func() { r.res.ReplayWallNS += time.Since(t0).Nanoseconds() }()
	every := int64(r.cfg.SampleEvery)
	for k := 0; k < len(buf); {
		b.reset()
		// A batch ends at the latest where the event-by-event path samples
		// the driver's free memory, so that both sample after the same
		// events.
		room := every - *i%every
		before, first := *i, k
		for ; k < len(buf) && int64(k-first) < room && len(b.size) < batchOps && r.batchable(&buf[k]); k++ {
			ev := &buf[k]
			switch ev.Op {
			case trace.OpMalloc:
				s := b.newSlot()
				b.wait = append(b.wait, r.dev.paceWait(ev.Time))
				b.size, b.slot = append(b.size, ev.Size), append(b.slot, s)
				r.slots.Put(ev.Addr, s+1)
			case trace.OpFree:
				s, _ := r.slots.Take(ev.Addr)
				b.wait = append(b.wait, r.dev.paceWait(ev.Time))
				b.size, b.slot = append(b.size, 0), append(b.slot, s-1)
				b.freed = append(b.freed, s-1)
			}
		}
		full := int64(k-first) == room || len(b.size) == batchOps
		if err := r.runBatch(buf[first:k], i); err != nil {
			return err
		}
		if !full && k < len(buf) {
			// An event no batch takes.
			if err := r.rep.Step(*i, buf[k]); err != nil {
				return err
			}
			*i++
			k++
		}
		if *i != before && *i%every == 0 {
			r.res.ReplayWallNS += time.Since(t0).Nanoseconds()
			r.sample()
			t0 = time.Now()
		}
		if ctx.Err() != nil {
			r.res.Interrupted = true
			return ctx.Err()
		}
	}
	return nil
}

// call makes the batch's calls back to back in C (cr_batch), with the
// pacing waits in b.wait when pace is set, and returns the number of calls
// made before one failing for a reason other than memory (len(b.size) if
// none): b.ptr, b.ns and b.rc hold each call's pointer, duration and return
// code, and *reserved the bytes held after it, never above limit.
func (b *batch) call(rt *Runtime, limit uint64, reserved *uint64, pace bool) int {
	n := len(b.size)
	b.ptr, b.ns, b.rc = grow(b.ptr, n), grow(b.ns, n), grow(b.rc, n)
	if n == 0 {
		return 0
	}
	res := C.uint64_t(*reserved)
	var wait *C.int64_t
	if pace {
		wait = (*C.int64_t)(unsafe.Pointer(&b.wait[0]))
	}
	done := int(C.cr_batch(rt.lib, (*C.uint64_t)(unsafe.Pointer(&b.size[0])), (*C.int32_t)(unsafe.Pointer(&b.slot[0])),
		C.int64_t(n), (*C.uint64_t)(unsafe.Pointer(&b.slotPtr[0])), (*C.uint64_t)(unsafe.Pointer(&b.slotSize[0])),
		C.uint64_t(limit), &res, (*C.uint64_t)(unsafe.Pointer(&b.ptr[0])), (*C.int64_t)(unsafe.Pointer(&b.ns[0])),
		(*C.int32_t)(unsafe.Pointer(&b.rc[0])), wait))
	*reserved = uint64(res)
	return done
}

// runBatch makes the batch's calls, then replays evs, the batch's events
// (event *i first), through the engine, with the device playing the calls
// back.
func (r *replayer) runBatch(evs []trace.Event, i *int64) error {
	b, d := r.batch, r.dev
	if len(b.size) > 0 {
		reserved := d.reserved
		done := b.call(d.rt, d.limit, &reserved, d.pace)
		b.spare = append(b.spare, b.freed...)
		b.freed = b.freed[:0]
		// The calls up to done were made; a batch stops early only at a
		// call failing for a reason other than memory, whose playback
		// ends the replay with its error.
		d.play = &playback{b: b, n: min(done+1, len(b.size))}
	}
	defer func() { d.play = nil }()
	for k := range evs {
		if err := r.rep.Step(*i, evs[k]); err != nil {
			return err
		}
		*i++
	}
	if p := d.play; p != nil && p.next() < p.n {
		return fmt.Errorf("event %d: the cuda target left %d of the batch's %d calls unused", *i-1, p.n-p.j, p.n)
	}
	return nil
}

// playback hands out the outcomes of a batch's calls, made in C, in order:
// the Device's Alloc and Free take them instead of calling the runtime.
type playback struct {
	b    *batch
	j, n int // the next operation, and the operations made
}

// next skips the frees of allocations whose malloc failed (no call was
// made for them, and the engine makes none) and returns the next
// operation's index.
func (p *playback) next() int {
	for p.j < p.n && p.b.size[p.j] == 0 && p.b.ptr[p.j] == 0 {
		p.j++
	}
	return p.j
}

// playAlloc is Alloc from the batch: the outcome of its next operation, a
// cudaMalloc of size bytes.
func (d *Device) playAlloc(size uint64) (uint64, error) {
	p := d.play
	j := p.next()
	if j >= p.n || p.b.size[j] != size {
		return 0, fmt.Errorf("device alloc of %d bytes: not the batch's next call", size)
	}
	p.j++
	ptr, rc := p.b.ptr[j], int(p.b.rc[j])
	if rc == C.CR_REFUSED {
		return 0, fmt.Errorf("device alloc of %d bytes with %d reserved would pass the limit of %d bytes: %w", size, d.reserved, d.limit, policies.ErrOutOfMemory)
	}
	d.record("cudaMalloc", classAlloc, size, ptr, p.b.ns[j])
	if rc != 0 {
		return 0, fmt.Errorf("device alloc of %d bytes: %w", size, d.rt.errorOf("cudaMalloc", rc))
	}
	d.allocated(ptr, size)
	return ptr, nil
}

// playFree is Free from the batch: the outcome of its next operation, the
// cudaFree of addr.
func (d *Device) playFree(addr uint64) error {
	p := d.play
	j := p.next()
	if j >= p.n || p.b.size[j] != 0 || p.b.ptr[j] != addr {
		return fmt.Errorf("device free of %#x: not the batch's next call", addr)
	}
	p.j++
	seg, ok := d.live.Get(addr)
	if !ok {
		return fmt.Errorf("device free of %#x: not a live segment", addr)
	}
	d.record("cudaFree", classAlloc, seg.size, addr, p.b.ns[j])
	if rc := int(p.b.rc[j]); rc != 0 {
		return fmt.Errorf("device free of %#x: %w", addr, d.rt.errorOf("cudaFree", rc))
	}
	d.freed(addr, seg)
	return nil
}

// grow returns s resized to n elements, reusing its array when it can.
func grow[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
