package gpu

import (
	"fmt"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// backend is the real GPU as the replay engine's device (sim.Backend): the
// policy's segments come from Device (cudaMalloc and cudaFree, each timed),
// the trace's streams and events are CUDA streams and events made at their
// first use, its synchronizations are the runtime's, and its pinned and
// managed mallocs are real cudaMallocHost and cudaMallocManaged calls
// within their bounds. Package sim interprets the trace; this is only the
// device.
type backend struct {
	*Device
	async     *asyncTarget         // the cuda-async target, if replayed
	streams   map[uint64]uint64    // trace stream -> CUDA stream
	events    map[uint64]uint64    // trace event -> CUDA event
	maxPinned uint64               // bound of live pinned host bytes
	pinned    uint64               // live pinned host bytes
	managed   uint64               // live managed bytes
	host      map[uint64]hostAlloc // live host allocations by pointer

	// The policy's own time (PolicyTimer), sampled: one call in
	// policyTimeEvery is timed and its device calls' time taken out.
	direct      bool // the policy is a direct target: its time is the device's
	policyCalls int64
	policyOwnNS int64
	timing      bool
	t0, d0      int64
}

var (
	_ sim.Backend     = (*backend)(nil)
	_ sim.PolicyTimer = (*backend)(nil)
)

// hostAlloc is a live host allocation: its bytes and kind.
type hostAlloc struct {
	size uint64
	kind trace.Kind
}

func newBackend(dev *Device, maxPinned uint64) *backend {
	return &backend{Device: dev, streams: map[uint64]uint64{}, events: map[uint64]uint64{}, maxPinned: maxPinned, host: map[uint64]hostAlloc{}}
}

// Reserved returns the device bytes the replay holds: the policy's
// segments, or the live allocations of the stream-ordered target.
func (b *backend) Reserved() uint64 {
	if b.async != nil {
		return b.async.Reserved()
	}
	return b.Device.Reserved()
}

// DeviceCalls returns the cudaMalloc and cudaFree calls made, or the
// cudaMallocAsync and cudaFreeAsync calls of the stream-ordered target.
func (b *backend) DeviceCalls() (allocs, frees int64) {
	if b.async != nil {
		l := b.Latencies()
		return l.Count("cudaMallocAsync", "cudaMallocFromPoolAsync"), l.Count("cudaFreeAsync")
	}
	return b.Allocs(), b.Frees()
}

// stream returns the CUDA stream for trace stream id, creating it at first
// use; trace stream 0 is the default stream.
func (b *backend) stream(id uint64) (uint64, error) {
	if id == 0 {
		return 0, nil
	}
	if s, ok := b.streams[id]; ok {
		return s, nil
	}
	s, err := b.rt.StreamCreate()
	if err != nil {
		return 0, fmt.Errorf("stream %d: %w", id, err)
	}
	b.streams[id] = s
	return s, nil
}

// event returns the CUDA event for trace event id, creating it at first
// use.
func (b *backend) event(id uint64) (uint64, error) {
	if e, ok := b.events[id]; ok {
		return e, nil
	}
	e, err := b.rt.EventCreate()
	if err != nil {
		return 0, fmt.Errorf("event %d: %w", id, err)
	}
	b.events[id] = e
	return e, nil
}

// Sync makes ev's synchronization with the runtime.
func (b *backend) Sync(ev *trace.Event) error {
	switch ev.Op {
	case trace.OpStreamSync:
		s, err := b.stream(ev.Stream)
		if err != nil {
			return err
		}
		return b.streamSync(s)
	case trace.OpDeviceSync:
		return b.deviceSync()
	case trace.OpEventRecord, trace.OpStreamWaitEvent:
		s, err := b.stream(ev.Stream)
		if err != nil {
			return err
		}
		e, err := b.event(ev.Addr)
		if err != nil {
			return err
		}
		if ev.Op == trace.OpEventRecord {
			return b.eventRecord(e, s)
		}
		return b.streamWaitEvent(s, e)
	case trace.OpEventSync:
		e, err := b.event(ev.Addr)
		if err != nil {
			return err
		}
		return b.eventSync(e)
	}
	return nil
}

// HostMalloc is a cudaMallocHost or cudaMallocManaged of size bytes (at
// least 1), within its bound: pinned memory under the replay's bound,
// managed memory never above what is left of the device limit. A refused
// or failed one is an out-of-memory.
func (b *backend) HostMalloc(kind trace.Kind, size uint64) (uint64, error) {
	size = max(size, 1)
	var ptr uint64
	var err error
	if kind == trace.KindPinned {
		if b.pinned+size > b.maxPinned {
			return 0, fmt.Errorf("pinned malloc of %d bytes with %d live would pass the bound of %d bytes: %w", size, b.pinned, b.maxPinned, policies.ErrOutOfMemory)
		}
		ptr, err = b.mallocHost(size)
	} else {
		limit := b.Capacity() - min(b.Capacity(), b.Reserved())
		if b.managed+size > limit {
			return 0, fmt.Errorf("managed malloc of %d bytes with %d live would pass the %d bytes left under the limit: %w", size, b.managed, limit, policies.ErrOutOfMemory)
		}
		ptr, err = b.mallocManaged(size)
	}
	if err != nil {
		return 0, err
	}
	if kind == trace.KindPinned {
		b.pinned += size
	} else {
		b.managed += size
	}
	b.host[ptr] = hostAlloc{size, kind}
	return ptr, nil
}

// HostFree frees host memory from HostMalloc.
func (b *backend) HostFree(kind trace.Kind, addr, _ uint64) error {
	a, ok := b.host[addr]
	if !ok || a.kind != kind {
		return fmt.Errorf("%s free of %#x: not a live %s allocation", kind, addr, kind)
	}
	delete(b.host, addr)
	if kind == trace.KindPinned {
		b.pinned -= a.size
		return b.freeHost(addr, a.size)
	}
	b.managed -= a.size
	return b.freeManaged(addr, a.size)
}

// BeginPolicy and EndPolicy sample the policy's own time: one call in
// policyTimeEvery is timed, its device calls' time (timed in C) taken out,
// and policyTime scales the sum up, so that the clock reads stay out of the
// gaps between the device calls. A direct target's time is its device
// calls'.
func (b *backend) BeginPolicy() {
	b.timing = !b.direct && b.policyCalls%policyTimeEvery == 0
	b.policyCalls++
	if b.timing {
		b.t0, b.d0 = nanotime(), b.AllocTime()
	}
}

func (b *backend) EndPolicy() {
	if b.timing {
		b.policyOwnNS += nanotime() - b.t0 - (b.AllocTime() - b.d0)
		b.timing = false
	}
}

// policyTime returns the policy's time in nanoseconds, its device calls
// included.
func (b *backend) policyTime() int64 {
	if b.direct {
		return b.AllocTime()
	}
	return b.policyOwnNS*policyTimeEvery + b.AllocTime()
}

// cleanup frees the host memory still live and destroys the streams and
// events, handing each error to keep.
func (b *backend) cleanup(keep func(error)) {
	for ptr, a := range b.host {
		keep(b.HostFree(a.kind, ptr, a.size))
	}
	for id, e := range b.events {
		keep(b.rt.EventDestroy(e))
		delete(b.events, id)
	}
	for id, s := range b.streams {
		keep(b.rt.StreamDestroy(s))
		delete(b.streams, id)
	}
}
