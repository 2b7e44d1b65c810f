// Package kineto imports the memory events of a torch.profiler trace as
// trace events: the Chrome trace JSON, plain or gzip-compressed, that
// Kineto writes for torch.profiler.profile(profile_memory=True) through
// export_chrome_trace or tensorboard_trace_handler (NAME.pt.trace.json,
// NAME.pt.trace.json.gz).
//
// The trace is an object whose "traceEvents" hold every operator, kernel
// and flow of the profile; the caching allocator's are instant events, one
// per malloc (Bytes > 0) and free (Bytes < 0) and one per failed malloc:
//
//	{"ph": "i", "name": "[memory]", "pid": 540, "tid": 568, "ts": 5300533436245.172,
//	 "args": {"Total Reserved": 224395264, "Total Allocated": 193162752, "Bytes": 5693440,
//	          "Device Id": 0, "Device Type": 1, "Addr": 140175074131968, "Ev Idx": 1096}}
//	{"ph": "i", "name": "[OutOfMemory]", ..., "args": {"Total Reserved": 715128832, "Bytes": 127160832, ...}}
//
// Import maps those of one CUDA device (Device Type 1, Device Id
// Options.Device) to trace events:
//
//	[memory], Bytes > 0  -> trace.OpMalloc (Addr, Size = Bytes, Thread = tid)
//	[memory], Bytes < 0  -> trace.OpFree (Addr, Size = -Bytes)
//	[OutOfMemory]        -> trace.OpMallocFailed (Size = Bytes; Addr 0)
//
// and adds, before each event, the device calls that explain the change of
// its Total Reserved (the allocator's reserved bytes after it) as observed
// trace.OpSegmentAlloc, OpSegmentFree, OpSegmentMap and OpSegmentUnmap
// events (segments.go says how). Host memory (Device Type 0: the CPU
// allocator's blocks, which are neither pinned nor device memory) and other
// device types are skipped and counted in the header.
//
// The file holds the events in no particular order (by thread and by
// operator): Import keeps the memory events of the device, compactly
// (56 bytes each), while it streams through the rest with a JSON reader of
// its own that holds no value whole (of an event, only the fields above,
// up to 4 KiB each), so that a trace of gigabytes is never held whole, and
// sorts them by ts (a tie keeps the file's order). The reader checks the
// JSON as encoding/json would, and refuses, with ErrLimit, a string or a
// number longer than MaxString (16 MiB) and arrays and objects nested
// deeper than MaxDepth (1000), wherever they are: Kineto writes strings of
// a few KB (the longest of the traces of testdata/profiler: 5,050 bytes)
// and 6 levels, and a file of a string of 1 GiB or an array 50 million
// deep, which took 4-5 GB and 1.4 GB, is refused in a few MB. Every Time is
// baseTimeNanoseconds plus ts (microseconds, read exactly from its decimal
// digits) in nanoseconds: nanoseconds since the Unix epoch, as a PyTorch
// snapshot of the same process has them.
//
// What the format does not record, which the header's Metadata
// "unrecorded" repeats for replay stats:
//
//   - streams: every event is on stream 0, so that a replay mixes the
//     blocks of side streams with the default stream's, where PyTorch keeps
//     each stream's cached blocks apart;
//   - requested sizes: Size is the allocator's block size (the request
//     rounded up, or the whole cached block it was given), so the
//     requested bytes of a replay are its allocated bytes;
//   - when a free completes: a free is logged when the program asks for it,
//     and a block used on another stream (record_stream) becomes reusable
//     only once that stream's work is done, where a replay reuses it at
//     once;
//   - device calls: inferred from Total Reserved (segments.go), as is an
//     explicit empty_cache, which the trace does not log either;
//   - the allocator settings (PYTORCH_CUDA_ALLOC_CONF) and the memory cap
//     (set_per_process_memory_fraction): give them to a replay with --set
//     and --capacity. Metadata "device_calls" says which kind of segments
//     the reserved bytes follow ("expandable segments" for
//     expandable_segments:True).
//
// The header has Source "kineto", Device the name of the device in
// deviceProperties, and DeviceMemory 0 (its totalGlobalMem is in Metadata
// "device_memory"), so that a replay is not held to the card by default:
// a job under a memory fraction fails its mallocs well inside it, and a
// replay without --capacity then warns of the failed mallocs it served.
//
// A free of an address that no malloc of the trace made (a profile that
// started while the job held memory) is imported as it is, counted in
// Metadata "unknown_frees", and reported by trace.Validate (replay check).
// Import returns an error, one line naming the file and the byte offset
// (of the decompressed JSON), for JSON it cannot read, a value over the
// reader's limits (naming the limit), a memory event without one of the
// fields above or with a value out of range, and a trace without memory
// events; it never panics.
package kineto

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strconv"

	"github.com/gpualloc/allocsim/trace"
)

// Options select what to import.
type Options struct {
	// Device is the CUDA device whose events are imported (the events'
	// "Device Id"); 0 by default.
	Device int
}

// Errors that Import wraps, for errors.Is. A truncated file wraps
// io.ErrUnexpectedEOF.
var (
	// ErrNotTrace: the file is not a Chrome trace JSON object.
	ErrNotTrace = errors.New("not a torch.profiler trace")
	// ErrNoMemoryEvents: the trace has no memory events of the device
	// (profiled without profile_memory=True, or another device).
	ErrNoMemoryEvents = errors.New("no memory events")
	// ErrLimit: a string or number longer than MaxString, or arrays and
	// objects nested deeper than MaxDepth; the message names the byte
	// offset and the limit.
	ErrLimit = errors.New("over a limit of the reader")
)

// Detect reports whether head, the first bytes of a file, start like a
// Chrome trace JSON object as Kineto writes it: an object whose first
// bytes name one of its keys "schemaVersion", "traceEvents" or
// "deviceProperties", plain or gzip-compressed (then the head is
// decompressed as far as it goes, so that a gzip'd JSON is not taken for a
// gzip'd pickle).
func Detect(head []byte) bool {
	head = trace.GunzipHead(head)
	head = bytes.TrimPrefix(head, []byte("\xef\xbb\xbf"))
	head = bytes.TrimLeft(head, " \t\r\n")
	if len(head) == 0 || head[0] != '{' {
		return false
	}
	for _, key := range []string{`"schemaVersion"`, `"traceEvents"`, `"deviceProperties"`} {
		if bytes.Contains(head, []byte(key)) {
			return true
		}
	}
	return false
}

// record is a memory event of the device, as Import keeps it.
type record struct {
	time     int64  // ts in nanoseconds, without the base
	offset   int64  // byte offset of the event in the JSON
	addr     uint64 // Addr; 0 for a failed malloc
	size     uint64 // |Bytes|
	reserved uint64 // Total Reserved after the event
	thread   uint64 // tid, 0 if it is not a number
	op       trace.Op
}

// Source is an imported trace: its header and the events, with the
// inferred device calls, in order.
type Source struct {
	h       trace.Header
	recs    []record
	base    int64
	kind    segmentKind
	next    int // next record
	inf     *inferrer
	pending []trace.Event
	head    int
}

var _ trace.Source = (*Source)(nil)

// Import reads the trace in r (gzip-compressed or not, told by its content)
// to its end and returns the events of CUDA device opts.Device; name is
// the file name used in errors. The Source holds the device's memory
// events; r is not read again.
func Import(r io.Reader, name string, opts Options) (*Source, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	in := io.Reader(br)
	compressed := false
	if b, _ := br.Peek(2); len(b) == 2 && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, gzipError(name, 0, err)
		}
		in, compressed = zr, true
	}
	d := newDecoder(in, name, opts, compressed)
	if err := d.run(); err != nil {
		return nil, err
	}
	return d.source()
}

// Header returns the trace header: Source "kineto", Device the device's
// name, Metadata as the package doc says.
func (s *Source) Header() trace.Header { return s.h }

// Next returns the next event, io.EOF after the last. It returns no other
// error: Import checked the whole trace.
func (s *Source) Next() (trace.Event, error) {
	for s.head == len(s.pending) {
		if s.next == len(s.recs) {
			return trace.Event{}, io.EOF
		}
		if s.inf == nil {
			s.inf = newInferrer(s.kind, s.deviceMemory())
		}
		r := &s.recs[s.next]
		s.next++
		s.pending, s.head = s.pending[:0], 0
		s.pending = s.inf.calls(int64(s.next-1), r, s.pending)
		for k := range s.pending {
			s.pending[k].Time, s.pending[k].Thread = s.base+r.time, r.thread
		}
		s.pending = append(s.pending, trace.Event{Op: r.op, Addr: r.addr, Size: r.size, Time: s.base + r.time, Thread: r.thread})
	}
	ev := s.pending[s.head]
	s.head++
	return ev, nil
}

// deviceMemory returns the device memory Metadata records, 0 if none.
func (s *Source) deviceMemory() uint64 {
	n, _ := strconv.ParseUint(s.h.Metadata["device_memory"], 10, 64)
	return n
}
