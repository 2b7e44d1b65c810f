// Package gpu replays traces on a real GPU: the CUDA runtime is loaded at
// run time with dlopen and called through small C trampolines, so that one
// binary builds without CUDA and says at run time when no runtime is there.
// It provides a real Device behind the policies' device interface, direct
// cudaMalloc and cudaMallocAsync replay targets, and a calibration of the
// simulator's cost model.
//
// Every call is timed in C around the runtime call alone, so Go's overhead
// stays out of the latencies.
package gpu

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cudart.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/gpualloc/allocsim/policies"
)

// DefaultLibraries are the CUDA runtime libraries tried in order when no
// path is given.
var DefaultLibraries = []string{
	"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
	"/usr/local/cuda/lib64/libcudart.so",
}

// ErrNoRuntime is wrapped by Open's error when no CUDA runtime could be
// loaded.
var ErrNoRuntime = errors.New("no CUDA runtime found")

// CUDA runtime error codes the package acts on.
const (
	CodeSuccess          = 0
	CodeInvalidValue     = 1   // cudaErrorInvalidValue
	CodeMemoryAllocation = 2   // cudaErrorMemoryAllocation
	CodeNotSupported     = 801 // cudaErrorNotSupported; also given for an entry point the runtime lacks
)

// Error is a failed CUDA runtime call. An Error with Code
// CodeMemoryAllocation matches policies.ErrOutOfMemory under errors.Is.
type Error struct {
	// Call is the runtime function, "cudaMalloc".
	Call string
	// Code is the cudaError_t it returned; Name its name
	// ("cudaErrorMemoryAllocation").
	Code int
	Name string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
}

// Is reports whether e is a device out-of-memory error when target is
// policies.ErrOutOfMemory.
func (e *Error) Is(target error) bool {
	return target == policies.ErrOutOfMemory && e.Code == CodeMemoryAllocation
}

// PoolAttr is a cudaMemPoolAttr.
type PoolAttr int

// Memory pool attributes (cudaMemPoolAttr values).
const (
	PoolReleaseThreshold PoolAttr = 4
	PoolReservedCurrent  PoolAttr = 5
	PoolReservedHigh     PoolAttr = 6
	PoolUsedCurrent      PoolAttr = 7
	PoolUsedHigh         PoolAttr = 8
)

// Runtime is a loaded CUDA runtime library. It is not safe for concurrent
// use; call it from one goroutine locked to its OS thread
// (runtime.LockOSThread), as the runtime keeps per-thread state.
type Runtime struct {
	lib *C.cr_lib
	// Path is the library as loaded (the name or path given to dlopen).
	Path string
	// Version and DriverVersion are cudaRuntimeGetVersion and
	// cudaDriverGetVersion (13000 for 13.0); 0 if unknown.
	Version, DriverVersion int
	// Device is the current device's ordinal and DeviceName its name, ""
	// if unknown.
	Device     int
	DeviceName string
}

// Open loads the CUDA runtime at path, or the first of DefaultLibraries
// that loads when path is "", and initializes the device context (a
// cudaFree(NULL)), so that context creation stays out of later timings. It
// returns an error wrapping ErrNoRuntime that lists every library tried and
// why it failed, or the runtime's error if the context cannot be created.
func Open(path string) (*Runtime, error) {
	paths := DefaultLibraries
	if path != "" {
		paths = []string{path}
	}
	var tried []string
	for _, p := range paths {
		cp := C.CString(p)
		var buf [512]C.char
		lib := C.cr_open(cp, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cp))
		if lib == nil {
			msg := strings.TrimPrefix(C.GoString(&buf[0]), p+": ")
			tried = append(tried, fmt.Sprintf("%s: %s", p, msg))
			continue
		}
		if m := C.cr_missing(lib); m != nil {
			tried = append(tried, fmt.Sprintf("%s: no %s", p, C.GoString(m)))
			C.cr_close(lib)
			continue
		}
		rt := &Runtime{lib: lib, Path: p}
		if err := rt.init(); err != nil {
			C.cr_close(lib)
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return rt, nil
	}
	return nil, fmt.Errorf("%w (tried: %s)", ErrNoRuntime, strings.Join(tried, "; "))
}

func (rt *Runtime) init() error {
	if r := C.cr_free(rt.lib, 0); r.rc != 0 {
		return rt.fail("cudaFree(NULL)", r.rc)
	}
	if r := C.cr_runtime_version(rt.lib); r.rc == 0 {
		rt.Version = int(r.ptr)
	}
	if r := C.cr_driver_version(rt.lib); r.rc == 0 {
		rt.DriverVersion = int(r.ptr)
	}
	if r := C.cr_get_device(rt.lib); r.rc == 0 {
		rt.Device = int(r.ptr)
	}
	var buf [256]C.char
	if C.cr_device_name(rt.lib, C.int(rt.Device), &buf[0], C.size_t(len(buf))) == 0 {
		rt.DeviceName = C.GoString(&buf[0])
	}
	rt.clearError()
	return nil
}

// Close releases the handle; the library itself stays loaded, as the CUDA
// runtime cannot be unloaded and loaded again in one process. Allocations
// are not freed: that is the caller's.
func (rt *Runtime) Close() {
	if rt.lib != nil {
		C.cr_close(rt.lib)
		rt.lib = nil
	}
}

// ErrorName returns the runtime's name for error code.
func (rt *Runtime) ErrorName(code int) string {
	if s := C.cr_error_name(rt.lib, C.int(code)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("cudaError(%d)", code)
}

// fail returns the Error for call's return code rc and clears the runtime's
// last error, so that one failure does not show up at a later call.
func (rt *Runtime) fail(call string, rc C.int) error {
	if rc == -1 {
		return &Error{Call: call, Code: CodeNotSupported, Name: "not exported by " + rt.Path}
	}
	rt.clearError()
	return &Error{Call: call, Code: int(rc), Name: rt.ErrorName(int(rc))}
}

func (rt *Runtime) clearError() { C.cr_get_last_error(rt.lib) }

// errorOf returns the Error for call's return code rc, whose last error the
// C side has already cleared.
func (rt *Runtime) errorOf(call string, rc int) error {
	return &Error{Call: call, Code: rc, Name: rt.ErrorName(rc)}
}

// HasAsync reports whether the runtime has the stream-ordered allocator
// (cudaMallocAsync and memory pools, CUDA 11.2 and later).
func (rt *Runtime) HasAsync() bool {
	l := rt.lib
	return l.cudaMallocAsync != nil && l.cudaFreeAsync != nil && l.cudaMallocFromPoolAsync != nil &&
		l.cudaMemPoolCreate != nil && l.cudaMemPoolDestroy != nil && l.cudaDeviceGetDefaultMemPool != nil &&
		l.cudaMemPoolSetAttribute != nil && l.cudaMemPoolGetAttribute != nil && l.cudaMemPoolTrimTo != nil
}

func (rt *Runtime) res(call string, r C.cr_res) (uint64, int64, error) {
	if r.rc != 0 {
		return 0, int64(r.ns), rt.fail(call, r.rc)
	}
	return uint64(r.ptr), int64(r.ns), nil
}

// Pace waits until ns nanoseconds have passed since the runtime's last
// allocation call (cudaMalloc, cudaFree or an async form) returned; it does
// not wait before the first. It sleeps through most of a long wait and
// spins the rest, in C.
func (rt *Runtime) Pace(ns int64) {
	if ns > 0 {
		C.cr_pace(rt.lib, C.int64_t(ns))
	}
}

// Malloc is cudaMalloc of size bytes. It returns the device pointer and the
// call's duration in nanoseconds.
func (rt *Runtime) Malloc(size uint64) (ptr uint64, ns int64, err error) {
	return rt.res("cudaMalloc", C.cr_malloc(rt.lib, C.uint64_t(size)))
}

// Free is cudaFree of ptr; it returns the call's duration in nanoseconds.
func (rt *Runtime) Free(ptr uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaFree", C.cr_free(rt.lib, C.uint64_t(ptr)))
	return ns, err
}

// MallocAsync is cudaMallocAsync of size bytes on stream (0 is the default
// stream), from the device's current pool.
func (rt *Runtime) MallocAsync(size, stream uint64) (ptr uint64, ns int64, err error) {
	return rt.res("cudaMallocAsync", C.cr_malloc_async(rt.lib, C.uint64_t(size), C.uint64_t(stream)))
}

// MallocFromPoolAsync is cudaMallocFromPoolAsync of size bytes from pool on
// stream.
func (rt *Runtime) MallocFromPoolAsync(size, pool, stream uint64) (ptr uint64, ns int64, err error) {
	return rt.res("cudaMallocFromPoolAsync", C.cr_malloc_from_pool_async(rt.lib, C.uint64_t(size), C.uint64_t(pool), C.uint64_t(stream)))
}

// FreeAsync is cudaFreeAsync of ptr on stream.
func (rt *Runtime) FreeAsync(ptr, stream uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaFreeAsync", C.cr_free_async(rt.lib, C.uint64_t(ptr), C.uint64_t(stream)))
	return ns, err
}

// DefaultMemPool returns the current device's default memory pool
// (cudaDeviceGetDefaultMemPool).
func (rt *Runtime) DefaultMemPool() (uint64, error) {
	p, _, err := rt.res("cudaDeviceGetDefaultMemPool", C.cr_default_pool(rt.lib, C.int(rt.Device)))
	return p, err
}

// MemPoolCreate creates a memory pool of pinned device memory on the
// current device (cudaMemPoolCreate), holding at most maxSize bytes (0: no
// limit; runtimes before CUDA 12.2 ignore the limit).
func (rt *Runtime) MemPoolCreate(maxSize uint64) (uint64, error) {
	p, _, err := rt.res("cudaMemPoolCreate", C.cr_pool_create(rt.lib, C.int(rt.Device), C.uint64_t(maxSize)))
	return p, err
}

// MemPoolDestroy is cudaMemPoolDestroy.
func (rt *Runtime) MemPoolDestroy(pool uint64) error {
	_, _, err := rt.res("cudaMemPoolDestroy", C.cr_pool_destroy(rt.lib, C.uint64_t(pool)))
	return err
}

// SetMemPoolAttr sets a pool attribute (cudaMemPoolSetAttribute); every
// attribute set here takes a 64-bit value.
func (rt *Runtime) SetMemPoolAttr(pool uint64, attr PoolAttr, v uint64) error {
	_, _, err := rt.res("cudaMemPoolSetAttribute", C.cr_pool_set(rt.lib, C.uint64_t(pool), C.int(attr), C.uint64_t(v)))
	return err
}

// MemPoolAttr reads a 64-bit pool attribute (cudaMemPoolGetAttribute).
func (rt *Runtime) MemPoolAttr(pool uint64, attr PoolAttr) (uint64, error) {
	v, _, err := rt.res("cudaMemPoolGetAttribute", C.cr_pool_get(rt.lib, C.uint64_t(pool), C.int(attr)))
	return v, err
}

// MemPoolTrimTo is cudaMemPoolTrimTo: the pool releases unused memory down
// to keep bytes.
func (rt *Runtime) MemPoolTrimTo(pool, keep uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaMemPoolTrimTo", C.cr_pool_trim(rt.lib, C.uint64_t(pool), C.uint64_t(keep)))
	return ns, err
}

// StreamCreate creates a non-blocking stream (cudaStreamCreateWithFlags
// with cudaStreamNonBlocking).
func (rt *Runtime) StreamCreate() (uint64, error) {
	s, _, err := rt.res("cudaStreamCreateWithFlags", C.cr_stream_create(rt.lib, 1))
	return s, err
}

// StreamDestroy is cudaStreamDestroy.
func (rt *Runtime) StreamDestroy(s uint64) error {
	_, _, err := rt.res("cudaStreamDestroy", C.cr_stream_destroy(rt.lib, C.uint64_t(s)))
	return err
}

// StreamSync is cudaStreamSynchronize.
func (rt *Runtime) StreamSync(s uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaStreamSynchronize", C.cr_stream_sync(rt.lib, C.uint64_t(s)))
	return ns, err
}

// EventCreate creates an event without timing (cudaEventCreateWithFlags
// with cudaEventDisableTiming).
func (rt *Runtime) EventCreate() (uint64, error) {
	e, _, err := rt.res("cudaEventCreateWithFlags", C.cr_event_create(rt.lib, 2))
	return e, err
}

// EventDestroy is cudaEventDestroy.
func (rt *Runtime) EventDestroy(ev uint64) error {
	_, _, err := rt.res("cudaEventDestroy", C.cr_event_destroy(rt.lib, C.uint64_t(ev)))
	return err
}

// EventRecord is cudaEventRecord of ev on stream s.
func (rt *Runtime) EventRecord(ev, s uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaEventRecord", C.cr_event_record(rt.lib, C.uint64_t(ev), C.uint64_t(s)))
	return ns, err
}

// StreamWaitEvent is cudaStreamWaitEvent of stream s on ev.
func (rt *Runtime) StreamWaitEvent(s, ev uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaStreamWaitEvent", C.cr_stream_wait_event(rt.lib, C.uint64_t(s), C.uint64_t(ev)))
	return ns, err
}

// EventSync is cudaEventSynchronize.
func (rt *Runtime) EventSync(ev uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaEventSynchronize", C.cr_event_sync(rt.lib, C.uint64_t(ev)))
	return ns, err
}

// DeviceSync is cudaDeviceSynchronize.
func (rt *Runtime) DeviceSync() (ns int64, err error) {
	_, ns, err = rt.res("cudaDeviceSynchronize", C.cr_device_sync(rt.lib))
	return ns, err
}

// MemGetInfo is cudaMemGetInfo: the device's free and total bytes.
func (rt *Runtime) MemGetInfo() (free, total uint64, err error) {
	var t C.uint64_t
	f, _, err := rt.res("cudaMemGetInfo", C.cr_mem_get_info(rt.lib, &t))
	return f, uint64(t), err
}

// MallocHost is cudaMallocHost (page-locked host memory) of size bytes.
func (rt *Runtime) MallocHost(size uint64) (ptr uint64, ns int64, err error) {
	return rt.res("cudaMallocHost", C.cr_malloc_host(rt.lib, C.uint64_t(size)))
}

// FreeHost is cudaFreeHost.
func (rt *Runtime) FreeHost(ptr uint64) (ns int64, err error) {
	_, ns, err = rt.res("cudaFreeHost", C.cr_free_host(rt.lib, C.uint64_t(ptr)))
	return ns, err
}

// MallocManaged is cudaMallocManaged of size bytes (cudaMemAttachGlobal);
// it is freed with Free.
func (rt *Runtime) MallocManaged(size uint64) (ptr uint64, ns int64, err error) {
	return rt.res("cudaMallocManaged", C.cr_malloc_managed(rt.lib, C.uint64_t(size)))
}

// optionalInt calls the exported function name, an int (*)(void), and
// reports whether the runtime has it. Tests use it to query the fake
// runtime.
func (rt *Runtime) optionalInt(name string) (int, bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	fn := C.cr_sym(rt.lib, cs)
	if fn == nil {
		return 0, false
	}
	return int(C.cr_call_int(fn)), true
}

// SeqResult is the outcome of running a call sequence in a plain C loop.
type SeqResult struct {
	// WallNS is the loop's wall time; CallsNS the sum of the calls' own
	// times (timed runs only).
	WallNS, CallsNS int64
	// Calls is the number of calls made.
	Calls int64
}

// RunSeq runs a sequence of cudaMalloc and cudaFree calls in a plain C
// loop, with no Go code between the calls: call i is a cudaMalloc of
// size[i] bytes into slot[i] when size[i] > 0, else a cudaFree of the
// pointer in slot[i]. With timed, each call is also timed (as the harness
// times them). Every pointer still live when the loop ends, or stops at a
// failing call, is freed before RunSeq returns the failing call's error.
func (rt *Runtime) RunSeq(size []uint64, slot []int32, timed bool) (SeqResult, error) {
	if len(size) != len(slot) {
		return SeqResult{}, fmt.Errorf("RunSeq: %d sizes and %d slots", len(size), len(slot))
	}
	if len(size) == 0 {
		return SeqResult{}, nil
	}
	nslots := int32(0)
	for _, s := range slot {
		if s < 0 {
			return SeqResult{}, fmt.Errorf("RunSeq: negative slot %d", s)
		}
		nslots = max(nslots, s+1)
	}
	ptrs := make([]uint64, nslots)
	var callsNS, failed C.int64_t
	var rc C.int
	t := C.int(0)
	if timed {
		t = 1
	}
	wall := C.cr_seq_run(rt.lib, (*C.uint64_t)(unsafe.Pointer(&size[0])), (*C.int32_t)(unsafe.Pointer(&slot[0])),
		C.int64_t(len(size)), t, (*C.uint64_t)(unsafe.Pointer(&ptrs[0])), &callsNS, &failed, &rc)
	res := SeqResult{WallNS: int64(wall), CallsNS: int64(callsNS), Calls: int64(len(size))}
	var err error
	if failed >= 0 {
		res.Calls = int64(failed) + 1
		call := "cudaFree"
		if size[failed] > 0 {
			call = "cudaMalloc"
		}
		err = fmt.Errorf("call %d of the sequence: %w", int64(failed), rt.fail(call, rc))
	}
	for _, p := range ptrs {
		if p != 0 {
			rt.Free(p)
		}
	}
	return res, err
}
