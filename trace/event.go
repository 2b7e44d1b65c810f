// Package trace defines the allocation event model of a GPU job and its
// native file format: a versioned, block-framed msgpack stream with a
// checksummed trailer, read with Reader and written with Writer, plus a
// small text form for tests.
//
// Sizes are in bytes, times in nanoseconds. Addresses are the source's own
// (a pointer value or an id): they identify an allocation until it is freed
// and carry no placement meaning for a replay.
package trace

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Op is the kind of an event. The zero value is invalid.
type Op uint8

const (
	OpInvalid Op = iota
	// OpMalloc is a successful allocation of Size requested bytes at Addr on
	// Stream, of memory kind Kind.
	OpMalloc
	// OpFree releases the allocation at Addr: the block is reusable from
	// here (PyTorch's free_completed).
	OpFree
	// OpFreeRequested is the program's request to free Addr (PyTorch's
	// free_requested); the block becomes reusable only at the matching
	// OpFree. Observed only: a replay does not act on it.
	OpFreeRequested
	// OpStreamSync is a cudaStreamSynchronize of Stream.
	OpStreamSync
	// OpDeviceSync is a cudaDeviceSynchronize.
	OpDeviceSync
	// OpEventRecord records CUDA event Addr on Stream.
	OpEventRecord
	// OpStreamWaitEvent makes Stream wait for CUDA event Addr.
	OpStreamWaitEvent
	// OpEventSync is a cudaEventSynchronize of CUDA event Addr.
	OpEventSync
	// OpEmptyCache is an explicit release of cached memory by the program
	// (torch.cuda.empty_cache()); with a Pool, of that private pool's only
	// (PyTorch's emptyCache of a MemPool, which its deletion makes).
	OpEmptyCache
	// OpMallocFailed is an allocation of Size bytes on Stream that failed in
	// the source (an OOM). A replay attempts it; it never becomes live.
	OpMallocFailed
	// OpSegmentAlloc is a device allocation observed in the source
	// (cudaMalloc of Size bytes returning Addr). Observed only.
	OpSegmentAlloc
	// OpSegmentFree is an observed device free of the segment at Addr.
	OpSegmentFree
	// OpSegmentMap is an observed mapping of Size bytes at Addr into an
	// expandable segment. Observed only.
	OpSegmentMap
	// OpSegmentUnmap is an observed unmapping of Size bytes at Addr.
	OpSegmentUnmap
	// OpMarker is an annotation (an iteration boundary, a phase name) whose
	// text is in Label.
	OpMarker
	// OpPoolRelease says that private pool Pool is no longer used by any
	// CUDA graph (the last graph captured into it was destroyed) or that
	// its MemPool was deleted: from here its cached segments may be freed
	// (at an empty_cache or an OOM's release) once all its blocks are
	// free. PyTorch's releasePool. Since format version 2.
	OpPoolRelease
	numOps
)

var opNames = [numOps]string{
	OpInvalid:         "invalid",
	OpMalloc:          "malloc",
	OpFree:            "free",
	OpFreeRequested:   "free_requested",
	OpStreamSync:      "stream_sync",
	OpDeviceSync:      "device_sync",
	OpEventRecord:     "event_record",
	OpStreamWaitEvent: "stream_wait_event",
	OpEventSync:       "event_sync",
	OpEmptyCache:      "empty_cache",
	OpMallocFailed:    "malloc_failed",
	OpSegmentAlloc:    "segment_alloc",
	OpSegmentFree:     "segment_free",
	OpSegmentMap:      "segment_map",
	OpSegmentUnmap:    "segment_unmap",
	OpMarker:          "marker",
	OpPoolRelease:     "pool_release",
}

// String returns the op's name as used in the text form.
func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Valid reports whether o is a defined, non-zero op.
func (o Op) Valid() bool { return o > OpInvalid && o < numOps }

// ParseOp returns the op named s (as printed by Op.String).
func ParseOp(s string) (Op, bool) {
	for i := OpInvalid + 1; i < numOps; i++ {
		if opNames[i] == s {
			return i, true
		}
	}
	return OpInvalid, false
}

// Kind is the memory kind of an allocation. The zero value means device
// memory, the common case.
type Kind uint8

const (
	// KindDevice is device memory from cudaMalloc (or a caching allocator
	// on top of it).
	KindDevice Kind = iota
	// KindAsync is device memory from the stream-ordered allocator
	// (cudaMallocAsync / cudaMallocFromPoolAsync).
	KindAsync
	// KindPinned is page-locked host memory (cudaMallocHost, cudaHostAlloc).
	KindPinned
	// KindManaged is unified memory (cudaMallocManaged).
	KindManaged
	numKinds
)

var kindNames = [numKinds]string{"device", "async", "pinned", "managed"}

// String returns the kind's name as used in the text form.
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// OnDevice reports whether memory of kind k is placed in device memory and
// so goes through an allocator policy.
func (k Kind) OnDevice() bool { return k == KindDevice || k == KindAsync }

// ParseKind returns the kind named s.
func ParseKind(s string) (Kind, bool) {
	for i := Kind(0); i < numKinds; i++ {
		if kindNames[i] == s {
			return i, true
		}
	}
	return 0, false
}

// Event is one entry of a trace. Which fields are meaningful depends on Op;
// unused fields are zero.
type Event struct {
	Op   Op
	Kind Kind
	// Restore marks a malloc that sets a block of its private pool back in
	// place, in a restore of the pool's checkpointed state (PyTorch's
	// setCheckpointPoolState, which torch.compile's cudagraph trees call
	// before recording a new graph): Size is the block's whole size, and
	// the block is the one after the block restored before it, or the
	// first of a segment of the pool all of whose memory is free. Since
	// format version 2.
	Restore bool
	// Pool is the private pool a malloc (or failed malloc) went to, or the
	// pool a pool_release releases or an empty_cache empties: 0 for the
	// default pools, else a number the trace gives each private pool (a
	// CUDA graph's, a MemPool's), whose source id the header's Metadata
	// "pools" names ("1=(1,0)"). Since format version 2.
	Pool uint32
	// Time is the event's time in nanoseconds since an arbitrary origin.
	Time int64
	// Addr is the allocation's address or id (malloc, free, segment ops) or
	// the CUDA event id (event ops).
	Addr uint64
	// Size is the requested size in bytes (malloc, failed malloc) or the
	// segment size in bytes (segment ops). Frees may carry the size too.
	Size uint64
	// Stream is the stream the op was issued on (0 is the default stream).
	Stream uint64
	// Thread is the id of the host thread that issued the op, 0 if unknown.
	Thread uint64
	// Label is the text of a marker, or the call site of a malloc where
	// the source recorded one (e.g. "cudaMalloc@libc10_cuda.so+0x2f4cb"),
	// or, on a segment free or unmap, ReleaseByEmptyCache where the
	// source's stack shows what made it.
	Label string
	// Stack is the call stack of a malloc (or failed malloc), an id in
	// the source's Stacks (StackSource), 0 where none was recorded: a
	// PyTorch snapshot's frames of the entry. Since format version 3.
	Stack uint32
}

// Header describes a trace. It is written once, before the events.
type Header struct {
	// Version is the format version the file was written with.
	Version int `msgpack:"version"`
	// Source names where the events came from: "pytorch", "rmm",
	// "minimalloc", "record", "synth" or "text".
	Source string `msgpack:"source"`
	// Device is the GPU's name; DeviceMemory its total memory in bytes
	// (0 if unknown).
	Device       string `msgpack:"device,omitempty"`
	DeviceMemory uint64 `msgpack:"device_memory,omitempty"`
	// Settings holds the allocator settings in force when the trace was
	// recorded, by key (for PyTorch: "PYTORCH_CUDA_ALLOC_CONF" and the
	// snapshot's allocator_settings entries).
	Settings map[string]string `msgpack:"settings,omitempty"`
	// Metadata is free-form key/value information about the recording.
	Metadata map[string]string `msgpack:"metadata,omitempty"`
}

// JobEnded reports whether the trace runs to the end of its job, so that
// an allocation still live at its last event was never freed (a leak): a
// `record run` trace (Source "record") is written after the program
// exited, unless a signal killed it (Metadata "signal") or it still ran
// when the trace was written (Metadata "running" = "true": a process it
// started), and Metadata "job_ended" = "true" says so for any other. A
// snapshot or log taken while the job runs (a PyTorch snapshot, an RMM
// log), or a program killed mid-run, ends with the allocations the job
// still held: live at the end, not leaked.
func (h Header) JobEnded() bool {
	if h.Metadata["job_ended"] == "true" {
		return true
	}
	return h.Source == "record" && h.Metadata["signal"] == "" && h.Metadata["running"] != "true"
}

// What a source may not record, as the words of the header's Metadata
// "unrecorded" (comma-separated) name it: its events then carry stream 0,
// time 0, or no segment_free for want of a record, not because the job
// had no other stream, took no time or freed no segment; with
// UnrecordedSegments, none of its allocator's device calls (no segment
// event at all, so no segment's address: an XSpace's BFC events).
const (
	UnrecordedStreams      = "streams"
	UnrecordedTimes        = "times"
	UnrecordedSegmentFrees = "device frees"
	UnrecordedSegments     = "device calls"
)

// Unrecorded reports whether the trace's source does not record what
// (UnrecordedStreams, UnrecordedTimes, UnrecordedSegmentFrees,
// UnrecordedSegments), as its Metadata "unrecorded" says.
func (h Header) Unrecorded(what string) bool {
	for _, w := range strings.Split(h.Metadata["unrecorded"], ",") {
		if strings.TrimSpace(w) == what {
			return true
		}
	}
	return false
}

// PoolNames returns the names of a trace's private pools by number, from
// h's Metadata "pools": space-separated NUMBER=NAME pairs ("1=(1,0)
// 2=deleted@142"), as an importer writes them. A malformed pair is left
// out.
func PoolNames(h Header) map[uint32]string {
	out := map[uint32]string{}
	for _, f := range strings.Fields(h.Metadata["pools"]) {
		id, name, ok := strings.Cut(f, "=")
		n, err := strconv.ParseUint(id, 10, 32)
		if ok && err == nil && n > 0 && name != "" {
			out[uint32(n)] = name
		}
	}
	return out
}

// ReleaseByEmptyCache is the Label of a segment free or unmap that the
// recording's stack shows an explicit torch.cuda.empty_cache() made (its
// C++ frames hold the caching allocator's emptyCache), not the retry of a
// malloc whose device allocation was refused (a malloc in its frames): a
// replay as recorded releases the cache there rather than at a retry.
const ReleaseByEmptyCache = "empty_cache"

// PoolLabel returns the name of pool id in names (PoolNames), or "pool
// ID" where names has none.
func PoolLabel(names map[uint32]string, id uint32) string {
	if n := names[id]; n != "" {
		return n
	}
	return "pool " + strconv.FormatUint(uint64(id), 10)
}

// FormatPoolNames returns the "pools" metadata for pools 1, 2, ... named
// names[0], names[1], ...: "1=(1,0) 2=(0,1)". Names hold no space.
func FormatPoolNames(names []string) string {
	out := make([]string, len(names))
	for k, n := range names {
		out[k] = strconv.Itoa(k+1) + "=" + n
	}
	return strings.Join(out, " ")
}

// Source is a stream of events with a header: a Reader over a native trace,
// or an importer over another format.
type Source interface {
	// Header returns the trace's header.
	Header() Header
	// Next returns the next event, or io.EOF after the last one. Any other
	// error is final.
	Next() (Event, error)
}

// ReadAll reads the rest of src's events into memory, in order, and
// returns them; it returns src's first error other than io.EOF.
func ReadAll(src Source) ([]Event, error) {
	var evs []Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return nil, err
		}
		evs = AppendEvent(evs, ev)
	}
}

// AppendEvent is append(evs, ev) for a list of a whole trace's events,
// which grows it to twice its capacity when it is full. append grows a
// long slice by a quarter: collecting kv_decode's 723037 events copied
// them about four times over and took 0.35 to 0.8 s on a 2-core machine,
// the doubling 0.03 to 0.4 s (the fresh pages the copies touch are most
// of it).
func AppendEvent(evs []Event, ev Event) []Event {
	if len(evs) == cap(evs) {
		grown := make([]Event, len(evs), max(256, 2*cap(evs)))
		copy(grown, evs)
		evs = grown
	}
	return append(evs, ev)
}

// Version is the native format version this package writes. Version 2
// added Event.Pool and OpPoolRelease, version 3 Event.Stack and the stack
// table; version 1 and 2 files still read.
const Version = 3

// directLibraries are the CUDA libraries that take device memory from the
// driver themselves (handles, work areas, communicators), whatever
// allocator the program runs: cuDNN, cuBLAS and cuBLASLt, cuFFT, cuSPARSE,
// cuSOLVER, cuRAND, NCCL, CUPTI.
var directLibraries = []string{"libcudnn", "libcublas", "libcufft", "libcusparse", "libcusolver", "libcurand", "libnccl", "libcupti"}

// DirectSite reports whether label, the call site of a device malloc as
// `record run` writes it ("cuMemAlloc@libcublas.so.13+0x5b45ee": the call,
// then the library that made it), names one of the CUDA libraries that
// allocate from the driver directly. Such a malloc went around the
// framework's allocator in the recorded job (in a JAX job, cuDNN's and
// cuBLAS's cuMemAlloc beside XLA's buffers) and so does in a replay.
func DirectSite(label string) bool {
	_, lib, ok := strings.Cut(label, "@")
	if !ok {
		return false
	}
	for _, d := range directLibraries {
		if strings.HasPrefix(lib, d) {
			return true
		}
	}
	return false
}
