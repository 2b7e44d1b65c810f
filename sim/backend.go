package sim

import (
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// A Backend is the device a Replay runs on instead of the simulated one:
// package gpu's real GPU. The replay engine is the same whatever the
// device: it interprets every trace op, calls the policy, and keeps the
// figures; the backend gives the policy its memory (cudaMalloc and
// cudaFree, and the driver's virtual memory calls when it is also a
// policies.Mapper) and makes the trace's other effects real.
type Backend interface {
	policies.Device
	// Reserved returns the device bytes the replay holds now.
	Reserved() uint64
	// SetTime is told the trace time in nanoseconds of each event before
	// the event is replayed.
	SetTime(ns int64)
	// Sync makes the synchronization of ev (trace.OpStreamSync,
	// OpDeviceSync, OpEventRecord, OpStreamWaitEvent or OpEventSync) on
	// the device, before the policy is told of it. An error ends the
	// replay.
	Sync(ev *trace.Event) error
	// HostMalloc allocates size bytes of host memory of kind
	// (trace.KindPinned or trace.KindManaged) and returns its address. It
	// returns an error wrapping policies.ErrOutOfMemory when refused: the
	// replay counts an OOM. Any other error ends the replay.
	HostMalloc(kind trace.Kind, size uint64) (addr uint64, err error)
	// HostFree frees the host memory at addr, of size bytes, returned by
	// HostMalloc for kind.
	HostFree(kind trace.Kind, addr, size uint64) error
	// DeviceCalls returns the device allocations and frees made so far (a
	// Mapper's maps and unmaps included).
	DeviceCalls() (allocs, frees int64)
}

// PolicyTimer is implemented by a Backend that times the policy's own
// calls: BeginPolicy comes right before each Malloc and Free of the
// policy, EndPolicy right after.
type PolicyTimer interface {
	BeginPolicy()
	EndPolicy()
}

// The simulated device as a Backend: synchronizations do nothing, host
// memory is only counted.

// Sync does nothing: the simulated device has no streams of its own.
func (d *Device) Sync(*trace.Event) error { return nil }

// HostMalloc counts nothing and returns address 0: the replay keeps the
// host-side bytes itself.
func (d *Device) HostMalloc(trace.Kind, uint64) (uint64, error) { return 0, nil }

// HostFree does nothing.
func (d *Device) HostFree(trace.Kind, uint64, uint64) error { return nil }

// DeviceCalls returns Allocs and Frees.
func (d *Device) DeviceCalls() (allocs, frees int64) { return d.allocs, d.frees }

var _ Backend = (*Device)(nil)
