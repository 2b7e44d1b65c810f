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
	wait []int64
	// Per operation, from the event: its index in the chunk, and the
	// requested bytes of the allocation it makes or frees.
	ev    []int32
	bytes []uint64

	slotPtr, slotSize []uint64 // by slot, kept by cr_batch
	spare             []int32  // free slots
	freed             []int32  // slots freed in this batch, spare after it
}

func (b *batch) reset() {
	b.size, b.slot, b.ev, b.bytes, b.wait = b.size[:0], b.slot[:0], b.ev[:0], b.bytes[:0], b.wait[:0]
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
// memory of at least one byte at an address not live, or the free of one
// such allocation. Anything else (synchronizations, host memory, zero
// sizes, anomalies) is replayed by step, between batches.
func (r *replayer) batchable(ev trace.Event) bool {
	switch ev.Op {
	case trace.OpMalloc:
		if ev.Size == 0 || ev.Kind == trace.KindPinned || ev.Kind == trace.KindManaged {
			return false
		}
		_, live := r.live.Get(ev.Addr)
		return !live
	case trace.OpFree:
		a, live := r.live.Get(ev.Addr)
		return live && a.batchSlot > 0
	}
	return false
}

// replayBatched replays buf, whose first event is event *i of the trace,
// on the cuda target in batches, and adds the replay's wall time (samples
// left out) to the result. It returns ctx's error, with the result marked
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
		room := int(min(batchOps, every-*i%every))
		before := *i
		for ; k < len(buf) && len(b.size) < room && r.batchable(buf[k]); k++ {
			ev := buf[k]
			b.ev = append(b.ev, int32(k))
			b.wait = append(b.wait, r.dev.paceWait(ev.Time))
			if ev.Op == trace.OpMalloc {
				s := b.newSlot()
				b.size, b.slot, b.bytes = append(b.size, ev.Size), append(b.slot, s), append(b.bytes, ev.Size)
				r.live.Put(ev.Addr, liveAlloc{requested: ev.Size, kind: ev.Kind, batchSlot: s + 1})
				continue
			}
			a, _ := r.live.Take(ev.Addr)
			b.size, b.slot, b.bytes = append(b.size, 0), append(b.slot, a.batchSlot-1), append(b.bytes, a.requested)
			b.freed = append(b.freed, a.batchSlot-1)
		}
		full := len(b.size) == room
		if len(b.size) > 0 {
			if err := r.runBatch(buf, i); err != nil {
				return err
			}
		}
		if !full && k < len(buf) {
			// An event no batch takes.
			r.dev.SetTime(buf[k].Time)
			if err := r.step(*i, buf[k]); err != nil {
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

// runBatch makes the batch's calls and then does, operation by operation
// in event order, what Device.Alloc and Device.Free and the replayer's
// malloc and free do for one event.
func (r *replayer) runBatch(buf []trace.Event, i *int64) error {
	b, d := r.batch, r.dev
	n := len(b.size)
	reserved := d.reserved
	done := b.call(d.rt, d.limit, &reserved, d.pace)
	b.spare = append(b.spare, b.freed...)
	b.freed = b.freed[:0]
	// The calls up to done were made; a batch stops early only at a call
	// failing for a reason other than memory, which ends the replay with
	// its error below.
	for j := 0; j <= done && j < n; j++ {
		ev := buf[b.ev[j]]
		r.res.Events++
		var err error
		if ev.Op == trace.OpMalloc {
			err = r.batchMalloc(*i, j, ev)
		} else {
			err = r.batchFree(j, ev)
		}
		if err != nil {
			return fmt.Errorf("event %d (%s): %w", *i, ev.Op, err)
		}
		r.observe(*i, ev.Time)
		*i++
	}
	return nil
}

// batchMalloc accounts for operation j, a malloc.
func (r *replayer) batchMalloc(i int64, j int, ev trace.Event) error {
	b, d := r.batch, r.dev
	size, rc := b.size[j], int(b.rc[j])
	r.res.Mallocs++
	r.requested += ev.Size
	r.res.PeakRequested = max(r.res.PeakRequested, r.requested)
	if rc != C.CR_REFUSED {
		d.record("cudaMalloc", classAlloc, size, b.ptr[j], b.ns[j])
	}
	// The allocation's entry, unless a free later in the batch took it (or
	// a malloc later in the batch took the address again).
	a := r.live.Ptr(ev.Addr)
	ok := a != nil && a.batchSlot == b.slot[j]+1
	switch rc {
	case 0:
	case C.CR_REFUSED, CodeMemoryAllocation:
		r.oom(i, ev.Size)
		if ok {
			a.failed = true
		}
		return nil
	default:
		return fmt.Errorf("malloc of %d bytes: device alloc of %d bytes: %w", ev.Size, size, d.rt.errorOf("cudaMalloc", rc))
	}
	ptr := b.ptr[j]
	d.allocated(ptr, size)
	if ok {
		a.block = policies.Block{Addr: ptr, Size: size}
	}
	r.allocated += size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	return nil
}

// batchFree accounts for operation j, a free.
func (r *replayer) batchFree(j int, ev trace.Event) error {
	b, d := r.batch, r.dev
	r.res.Frees++
	r.requested -= b.bytes[j]
	ptr := b.ptr[j]
	if ptr == 0 {
		return nil // the malloc failed
	}
	seg, _ := d.live.Get(ptr)
	d.record("cudaFree", classAlloc, seg.size, ptr, b.ns[j])
	if rc := int(b.rc[j]); rc != 0 {
		return fmt.Errorf("free of %#x: device free of %#x: %w", ev.Addr, ptr, d.rt.errorOf("cudaFree", rc))
	}
	d.freed(ptr, seg)
	r.allocated -= seg.size
	return nil
}

// grow returns s resized to n elements, reusing its array when it can.
func grow[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}
