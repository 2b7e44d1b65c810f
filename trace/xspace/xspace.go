// Package xspace imports the allocator events of an XSpace, the profile
// that the XLA profiler writes (jax.profiler.trace, the TensorFlow
// profiler: plugins/profile/RUN/HOST.xplane.pb), as trace events.
//
// An XSpace (tsl/profiler/protobuf/xplane.proto) is a protobuf message of
// planes (XPlane: a host's threads, a device's streams), each of lines
// (XLine: a thread or stream, with a timestamp_ns) of events (XEvent: a
// metadata id, an offset_ps from its line's timestamp, stats). XLA's and
// TensorFlow's BFC allocator (xla/tsl/framework/bfc_allocator.cc,
// AddTraceMe) logs each malloc and free as an instant event named
// "MemoryAllocation" or "MemoryDeallocation" on the thread that made it,
// with stats that give the allocator's name (allocator_name: "GPU_0_bfc"
// for device 0, "xla_gpu_host_bfc" for pinned host memory), the chunk
// (addr; requested_bytes, what the program asked for; allocation_bytes,
// the chunk BFC gave) and the allocator's figures after the event
// (bytes_allocated, the chunks' bytes in use; peak_bytes_in_use;
// bytes_reserved; bytes_available, the memory limit less the other two).
//
//	MemoryAllocation   -> trace.OpMalloc (Addr = addr, Size = requested_bytes)
//	MemoryDeallocation -> trace.OpFree (Addr = addr, Size = requested_bytes)
//
// Only the allocator of the GPU Options.Device is read (allocator_name
// GPU_<N>_... for device N, as XLA and TensorFlow name it); host
// allocators and other devices are skipped, and counted in the header.
// An event's time is its line's timestamp_ns plus its offset_ps (in
// nanoseconds, from the origin the profile uses: its start for JAX); the
// events of all lines are sorted by time (to the picosecond, file order
// among equal times), since the threads' lines interleave. Thread is the
// line's id (the host thread's), Label the tf_op stat where there is one.
// Memory kind is device, stream 0 (BFC logs neither).
//
// The header has Source "xspace"; Device and DeviceMemory are the
// gpu_device_name and memory_size stats of the plane /device:GPU:<N>
// where the XSpace has it; Settings has "memory_limit", BFC's limit in
// bytes (bytes_available + bytes_reserved + bytes_allocated, the same at
// every event), when the events give one. Metadata has:
//
//   - "allocator": the allocator read ("GPU_0_bfc"), "device": N;
//   - "unrecorded": "streams,device calls" (trace.Header.Unrecorded):
//     BFC logs no stream, and none of the regions it takes from the
//     device, so no segment's address;
//   - "recorded_peak_allocated_bytes": the largest peak_bytes_in_use the
//     events record (BFC's peak of its chunks' bytes in use, which a
//     replay of the bfc policy calls peak allocated), and
//     "recorded_mallocs": the number of MemoryAllocation events (BFC's
//     num_allocs over the profile), which `replay fidelity` compares with
//     the simulation (sim.RecordedMeasured);
//   - "largest_alloc_size": the largest allocation_bytes (BFC's
//     largest_alloc_size, a chunk's size);
//   - "allocated_at_start": the bytes in use before the first event,
//     from its bytes_allocated (not 0 for a profile that began mid-run);
//   - "allocated_mismatch_event": where present, the index of the first
//     event after which the sum of the chunks malloced and freed so far
//     differs from the bytes_allocated BFC records (an event the profiler
//     dropped, or an order the times do not settle);
//   - "skipped_allocators": the mallocs of the allocators not read, as
//     NAME=COUNT pairs ("xla_gpu_host_bfc=30").
//
// Import reads the file in two passes and never holds it: the first reads
// each plane's event_metadata and stat_metadata and skips its lines, since
// an XPlane serializes its lines (field 3) before the metadata (4, 5) that
// name their events and stats; the second goes back to the planes with
// allocator events and reads their lines, skipping every event but those.
// Holding a plane's bytes instead would hold most of the file (the host
// plane of a profile with the python tracer on is nearly all of it). A
// plain file is skipped through by seeking (the device planes' kernels,
// the other events' bytes); a gzip-compressed one (.xplane.pb.gz) is
// decompressed once per pass. Memory holds the allocator events of the
// device read, and the names of the metadata of the planes that have them.
//
// Errors are *trace.FormatError values naming the file and the byte offset
// of the field at fault (in the decompressed bytes, for gzip), wrapping
// trace.ErrTruncated for a length past the end of its message or the
// file, trace.ErrCorrupt otherwise. A length is checked against its
// message before anything is read, and no string longer than the few
// names this package compares is kept, so a damaged file costs no more
// memory than a sound one. Two files in one are refused: bytes after the
// gzip stream, and a second plane of the same name with allocator events
// (the profiler names each plane once), whose events would count twice.
package xspace

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpualloc/allocsim/trace"
)

// Options say what Import reads of an XSpace.
type Options struct {
	// Device is the index of the GPU whose allocator is read: the
	// allocator named GPU_<Device>_bfc (replay's --device).
	Device int
}

// The schema's field numbers that this package reads.
const (
	spacePlanes = 1 // XSpace.planes

	planeName          = 2 // XPlane.name
	planeLines         = 3 // XPlane.lines
	planeEventMetadata = 4 // XPlane.event_metadata, map<int64, XEventMetadata>
	planeStatMetadata  = 5 // XPlane.stat_metadata, map<int64, XStatMetadata>
	planeStats         = 6 // XPlane.stats

	mapKey   = 1 // a map entry's key
	mapValue = 2 // and value

	metadataID   = 1 // XEventMetadata.id, XStatMetadata.id
	metadataName = 2 // XEventMetadata.name, XStatMetadata.name

	lineID        = 1 // XLine.id
	lineTimestamp = 3 // XLine.timestamp_ns
	lineEvents    = 4 // XLine.events

	eventMetadataID = 1 // XEvent.metadata_id
	eventOffset     = 2 // XEvent.offset_ps
	eventStats      = 4 // XEvent.stats

	statMetadataID = 1 // XStat.metadata_id
	statDouble     = 2 // XStat.double_value
	statUint64     = 3 // XStat.uint64_value
	statInt64      = 4 // XStat.int64_value
	statStr        = 5 // XStat.str_value
	statBytes      = 6 // XStat.bytes_value
	statRef        = 7 // XStat.ref_value: the name of the XStatMetadata with that id
)

// The names of the allocator events, and the longest name kept of a
// plane's or a metadata entry: longer ones are skipped unread.
const (
	allocName   = "MemoryAllocation"
	deallocName = "MemoryDeallocation"
	maxName     = 256
)

// stat is a stat this package reads from an allocator event.
type stat uint8

const (
	statNone stat = iota
	statAllocator
	statAddr
	statRequested
	statChunk
	statAllocated
	statPeak
	statReserved
	statAvailable
	statOp
	numStats
)

// statNames are the stats' names in the XSpace (BFC's TraceMe keys).
var statNames = [numStats]string{
	statAllocator: "allocator_name",
	statAddr:      "addr",
	statRequested: "requested_bytes",
	statChunk:     "allocation_bytes",
	statAllocated: "bytes_allocated",
	statPeak:      "peak_bytes_in_use",
	statReserved:  "bytes_reserved",
	statAvailable: "bytes_available",
	statOp:        "tf_op",
}

func statByName(name string) stat {
	for s := statAllocator; s < numStats; s++ {
		if statNames[s] == name {
			return s
		}
	}
	return statNone
}

// Detect reports whether head, the first bytes of a file, start an
// XSpace, gzip-compressed or not. A protobuf message has no magic: head
// must start with a plane (field 1, length-delimited) whose first fields
// are an optional id and a name that starts with "/host:" or "/device:",
// as the profiler names its planes ("/host:CPU", "/host:metadata",
// "/device:GPU:0"). An XSpace whose first plane is unnamed is not
// detected (--from xspace reads it).
func Detect(head []byte) bool {
	head = trace.GunzipHead(head)
	num, typ, n := protowire.ConsumeTag(head)
	if n < 0 || num != spacePlanes || typ != protowire.BytesType {
		return false
	}
	head = head[n:]
	size, n := protowire.ConsumeVarint(head)
	if n < 0 {
		return false
	}
	head = head[n:]
	if uint64(len(head)) > size {
		head = head[:size]
	}
	num, typ, n = protowire.ConsumeTag(head)
	if n > 0 && num == 1 && typ == protowire.VarintType { // XPlane.id
		head = head[n:]
		if n = protowire.ConsumeFieldValue(num, typ, head); n < 0 {
			return false
		}
		head = head[n:]
		num, typ, n = protowire.ConsumeTag(head)
	}
	if n < 0 || num != planeName || typ != protowire.BytesType {
		return false
	}
	name, n := protowire.ConsumeBytes(head[n:])
	if n < 0 {
		return false
	}
	return bytes.HasPrefix(name, []byte("/host:")) || bytes.HasPrefix(name, []byte("/device:"))
}

// input is the file Import reads, once per pass.
type input struct {
	r     io.ReadSeeker
	name  string
	start int64 // where the file starts in r
	size  int64 // its length in bytes; -1 for a gzip stream
	gz    bool
	zsrc  *bufio.Reader // what the gzip reader of the last pass reads
}

// open returns a wire at the start of the XSpace.
func (in *input) open() (*wire, error) {
	if _, err := in.r.Seek(in.start, io.SeekStart); err != nil {
		return nil, fmt.Errorf("%s: %w", in.name, err)
	}
	if in.gz {
		// One gzip stream: a second one (the file twice) or other bytes
		// after it are refused (see trailing).
		in.zsrc = bufio.NewReader(in.r)
		zr, err := gzip.NewReader(in.zsrc)
		if err != nil {
			return nil, fmt.Errorf("%s: gzip: %w", in.name, err)
		}
		zr.Multistream(false)
		return newWire(zr, nil, in.name, true), nil
	}
	return newWire(in.r, in.r, in.name, false), nil
}

// trailing returns an error if bytes follow the gzip stream that the last
// pass read to its end.
func (in *input) trailing() error {
	if !in.gz {
		return nil
	}
	if _, err := in.zsrc.Peek(1); err != nil {
		return nil
	}
	pos, err := in.r.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	return &trace.FormatError{File: in.name, Offset: pos - int64(in.zsrc.Buffered()) - in.start, Event: -1,
		Err: fmt.Errorf("%w: bytes follow the XSpace's gzip stream (a second stream, or appended data): refused", trace.ErrCorrupt)}
}

// plane is what the first pass keeps of a plane with allocator events.
type plane struct {
	start, end int64               // its message's bytes
	ops        map[uint64]trace.Op // its allocator events' metadata ids
	stats      map[uint64]string   // its stat metadata's names by id (those up to maxName bytes)
}

// planeStat is a stat of a plane (a device's name, its memory), kept until
// its name is known.
type planeStat struct {
	id  uint64
	u   uint64
	s   string
	ref bool // u is a ref_value
}

// event is an allocator event of the second pass.
type event struct {
	ev        trace.Event
	ps        int64 // the picoseconds below ev.Time, for ordering
	at        int64 // offset of the XEvent, for errors
	allocator string
	has       [numStats]bool
	val       [numStats]uint64
}

// Import reads the XSpace in r, from where r stands, gzip-compressed or
// not (told by its content), and returns the malloc and free events of
// the allocator of GPU opts.Device, in time order. name is the file name
// used in errors. Import reads r twice (see the package doc) and is done
// with it when it returns.
//
// It returns an error (naming the file) when the XSpace is damaged, when
// an allocator event of the device lacks allocator_name, addr or (a
// malloc) requested_bytes, and when the XSpace has no allocator events of
// the device: the error then names the allocators it has.
func Import(r io.ReadSeeker, name string, opts Options) (*trace.SliceSource, error) {
	in := &input{r: r, name: name, size: -1}
	var err error
	if in.start, err = r.Seek(0, io.SeekCurrent); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var magic [2]byte
	if n, _ := io.ReadFull(r, magic[:]); n == 2 && magic == [2]byte{0x1f, 0x8b} {
		in.gz = true
	} else {
		end, err := r.Seek(0, io.SeekEnd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		in.size = end - in.start
	}
	devPlane := "/device:GPU:" + strconv.Itoa(opts.Device)
	h := trace.Header{Source: "xspace", Metadata: map[string]string{
		"format":    "XSpace (XLA profiler)",
		"allocator": "GPU_" + strconv.Itoa(opts.Device) + "_bfc",
		"device":    strconv.Itoa(opts.Device),
		// BFC logs no stream, and none of its regions.
		"unrecorded": trace.UnrecordedStreams + "," + trace.UnrecordedSegments,
	}}

	// Pass 1: the planes' metadata.
	w, err := in.open()
	if err != nil {
		return nil, err
	}
	var planes []*plane
	names := map[string]int64{} // the planes with allocator events, by name
	err = eachPlane(w, in.size, func(start, end int64) error {
		p, name, pstats, err := scanPlane(w, start, end)
		if err != nil {
			return err
		}
		if len(p.ops) > 0 {
			// The profiler names each plane once; a name twice is an
			// XSpace with planes repeated (two files in one), whose
			// events would count twice.
			if at, ok := names[name]; ok {
				return w.errorAt(start, trace.ErrCorrupt, "a second plane %q with allocator events (the first at byte %d)", name, at)
			}
			names[name] = start
			planes = append(planes, p)
		}
		if name == devPlane {
			for _, s := range pstats {
				sname := p.stats[s.id]
				if s.ref {
					s.s, s.ref = p.stats[s.u], false
				}
				switch sname {
				case "gpu_device_name":
					h.Device = s.s
				case "memory_size":
					h.DeviceMemory = s.u
				}
			}
		}
		if len(p.ops) == 0 {
			p.stats = nil
		}
		return nil
	})
	if err == nil {
		err = in.trailing()
	}
	if err != nil {
		return nil, err
	}
	if len(planes) == 0 {
		return nil, fmt.Errorf("%s: no %s or %s events in the XSpace (was it profiled with memory tracing on?)", name, allocName, deallocName)
	}

	// Pass 2: the allocator events of those planes.
	if w, err = in.open(); err != nil {
		return nil, err
	}
	var evs []event
	skipped := map[string]int{}
	for _, p := range planes {
		f := field{at: w.off}
		if err := w.skipTo(p.start, -1, f); err != nil {
			return nil, err
		}
		if evs, err = readPlane(w, p, opts.Device, evs, skipped); err != nil {
			return nil, err
		}
	}
	if len(evs) == 0 {
		names := make([]string, 0, len(skipped))
		for a := range skipped {
			names = append(names, a)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%s: no allocator events of device %d (allocator %s); the XSpace has those of %s (--device picks another GPU)",
			name, opts.Device, h.Metadata["allocator"], strings.Join(names, ", "))
	}
	slices.SortStableFunc(evs, func(a, b event) int {
		if a.ev.Time != b.ev.Time {
			return cmp.Compare(a.ev.Time, b.ev.Time)
		}
		return cmp.Compare(a.ps, b.ps)
	})
	out := make([]trace.Event, len(evs))
	summarize(&h, evs, skipped)
	for i := range evs {
		out[i] = evs[i].ev
	}
	return trace.NewSliceSource(h, out), nil
}

// summarize fills h with what the events, in time order, record of the
// allocator (see the package doc).
func summarize(h *trace.Header, evs []event, skipped map[string]int) {
	var peak, largest uint64
	mallocs, hasPeak := 0, false
	for i := range evs {
		e := &evs[i]
		peak = max(peak, e.val[statPeak])
		hasPeak = hasPeak || e.has[statPeak]
		if e.ev.Op == trace.OpMalloc {
			mallocs++
			largest = max(largest, e.val[statChunk])
		}
	}
	md := h.Metadata
	md["recorded_mallocs"] = strconv.Itoa(mallocs)
	if hasPeak {
		md["recorded_peak_allocated_bytes"] = strconv.FormatUint(peak, 10)
	}
	md["largest_alloc_size"] = strconv.FormatUint(largest, 10)

	// The bytes in use as the chunks malloced and freed add up, against
	// BFC's own count after each event.
	first := &evs[0]
	if first.has[statAllocated] && first.has[statChunk] {
		inUse := first.val[statAllocated]
		if first.ev.Op == trace.OpFree {
			inUse += first.val[statChunk]
		} else if inUse >= first.val[statChunk] {
			inUse -= first.val[statChunk]
		}
		md["allocated_at_start"] = strconv.FormatUint(inUse, 10)
		for i := range evs {
			e := &evs[i]
			if e.ev.Op == trace.OpMalloc {
				inUse += e.val[statChunk]
			} else {
				inUse -= e.val[statChunk]
			}
			if !e.has[statAllocated] || !e.has[statChunk] || e.val[statAllocated] != inUse {
				md["allocated_mismatch_event"] = strconv.Itoa(i)
				break
			}
		}
	}

	// BFC's memory limit, where every event gives the same.
	limit, same := uint64(0), true
	for i := range evs {
		e := &evs[i]
		if !e.has[statAvailable] || !e.has[statAllocated] {
			same = false
			break
		}
		l := e.val[statAvailable] + e.val[statReserved] + e.val[statAllocated]
		if i > 0 && l != limit {
			same = false
			break
		}
		limit = l
	}
	if same {
		h.Settings = map[string]string{"memory_limit": strconv.FormatUint(limit, 10)}
	}

	if len(skipped) > 0 {
		names := make([]string, 0, len(skipped))
		for a, n := range skipped {
			names = append(names, a+"="+strconv.Itoa(n))
		}
		slices.Sort(names)
		md["skipped_allocators"] = strings.Join(names, " ")
	}
}

// eachPlane calls f with the bytes of each plane of the XSpace that w
// reads, whose length is size (-1 if unknown); f reads or skips them all.
func eachPlane(w *wire, size int64, f func(start, end int64) error) error {
	for {
		fl, ok, err := w.next(size)
		if err != nil || !ok {
			return err
		}
		if fl.num != spacePlanes {
			// errors, warnings, hostnames
			if err := w.skip(fl, size); err != nil {
				return err
			}
			continue
		}
		end, err := w.enterIn(fl, size, "the file")
		if err != nil {
			return err
		}
		if err := f(w.off, end); err != nil {
			return err
		}
		if w.off != end {
			return w.errorAt(fl.at, trace.ErrCorrupt, "plane read to byte %d, not to its end at %d", w.off, end)
		}
	}
}

// scanPlane reads the plane from start to end in the first pass: its name,
// the ids of its allocator events, its stat metadata and its stats. Its
// lines are skipped.
func scanPlane(w *wire, start, end int64) (*plane, string, []planeStat, error) {
	p := &plane{start: start, end: end, ops: map[uint64]trace.Op{}, stats: map[uint64]string{}}
	var name string
	var pstats []planeStat
	for {
		f, ok, err := w.next(end)
		if err != nil {
			return nil, "", nil, err
		}
		if !ok {
			return p, name, pstats, nil
		}
		switch f.num {
		case planeName:
			b, _, err := w.bytes(f, end, maxName)
			if err != nil {
				return nil, "", nil, err
			}
			name = string(b)
		case planeEventMetadata, planeStatMetadata:
			id, mname, err := metadataEntry(w, f, end)
			if err != nil {
				return nil, "", nil, err
			}
			if f.num == planeStatMetadata {
				if mname != "" {
					p.stats[id] = mname
				}
				break
			}
			switch mname {
			case allocName:
				p.ops[id] = trace.OpMalloc
			case deallocName:
				p.ops[id] = trace.OpFree
			}
		case planeStats:
			s, err := readPlaneStat(w, f, end)
			if err != nil {
				return nil, "", nil, err
			}
			if len(pstats) < 1024 {
				pstats = append(pstats, s)
			}
		default: // id, lines
			if err := w.skip(f, end); err != nil {
				return nil, "", nil, err
			}
		}
	}
}

// metadataEntry reads an entry of an event_metadata or stat_metadata map,
// field f of a plane that ends at end: its id (the key, else the value's
// id) and name ("" when longer than maxName).
func metadataEntry(w *wire, f field, end int64) (uint64, string, error) {
	stop, err := w.enter(f, end)
	if err != nil {
		return 0, "", err
	}
	var key, id uint64
	var hasKey bool
	var name string
	for {
		g, ok, err := w.next(stop)
		if err != nil {
			return 0, "", err
		}
		if !ok {
			break
		}
		switch g.num {
		case mapKey:
			if key, err = w.uint(g, stop); err != nil {
				return 0, "", err
			}
			hasKey = true
		case mapValue:
			vstop, err := w.enter(g, stop)
			if err != nil {
				return 0, "", err
			}
			for {
				h, ok, err := w.next(vstop)
				if err != nil {
					return 0, "", err
				}
				if !ok {
					break
				}
				switch h.num {
				case metadataID:
					if id, err = w.uint(h, vstop); err != nil {
						return 0, "", err
					}
				case metadataName:
					b, _, err := w.bytes(h, vstop, maxName)
					if err != nil {
						return 0, "", err
					}
					name = string(b)
				default:
					if err := w.skip(h, vstop); err != nil {
						return 0, "", err
					}
				}
			}
		default:
			if err := w.skip(g, stop); err != nil {
				return 0, "", err
			}
		}
	}
	if hasKey {
		id = key
	}
	return id, name, nil
}

// readPlaneStat reads a plane's stat, field f of a plane that ends at end.
func readPlaneStat(w *wire, f field, end int64) (planeStat, error) {
	var s planeStat
	stop, err := w.enter(f, end)
	if err != nil {
		return s, err
	}
	for {
		g, ok, err := w.next(stop)
		if err != nil || !ok {
			return s, err
		}
		switch g.num {
		case statMetadataID:
			s.id, err = w.uint(g, stop)
		case statUint64, statInt64:
			s.u, err = w.uint(g, stop)
		case statRef:
			s.u, err = w.uint(g, stop)
			s.ref = true
		case statStr, statBytes:
			var b []byte
			b, _, err = w.bytes(g, stop, maxName)
			s.s = string(b)
		default:
			err = w.skip(g, stop)
		}
		if err != nil {
			return s, err
		}
	}
}

// readPlane reads the lines of plane p in the second pass, w at its start,
// and appends its allocator events of device dev to evs; the mallocs of
// other allocators are counted in skipped.
func readPlane(w *wire, p *plane, dev int, evs []event, skipped map[string]int) ([]event, error) {
	kinds := map[uint64]stat{}
	for id, n := range p.stats {
		if s := statByName(n); s != statNone {
			kinds[id] = s
		}
	}
	devices := map[string]int{} // allocator names seen, and their device (-1: none)
	for {
		f, ok, err := w.next(p.end)
		if err != nil {
			return nil, err
		}
		if !ok {
			return evs, nil
		}
		if f.num != planeLines {
			if err := w.skip(f, p.end); err != nil {
				return nil, err
			}
			continue
		}
		stop, err := w.enter(f, p.end)
		if err != nil {
			return nil, err
		}
		first := len(evs)
		var ts int64
		var thread uint64
		for {
			g, ok, err := w.next(stop)
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
			switch g.num {
			case lineID:
				thread, err = w.uint(g, stop)
			case lineTimestamp:
				var v uint64
				v, err = w.uint(g, stop)
				ts = int64(v)
			case lineEvents:
				var e event
				var keep bool
				e, keep, err = readEvent(w, g, stop, p, kinds)
				if err == nil && keep {
					e, keep, err = check(w, e, dev, devices, skipped)
				}
				if err == nil && keep {
					evs = append(evs, e)
				}
			default:
				err = w.skip(g, stop)
			}
			if err != nil {
				return nil, err
			}
		}
		// The line's timestamp may follow its events in the encoding.
		for i := first; i < len(evs); i++ {
			e := &evs[i]
			off := e.ps
			e.ev.Time = ts + off/1000
			e.ps = off % 1000
			e.ev.Thread = thread
		}
	}
}

// readEvent reads the XEvent f of a line that ends at end; it reports
// false, having skipped it, for an event other than an allocator's. The
// returned event's ps holds its offset_ps until its line is read.
func readEvent(w *wire, f field, end int64, p *plane, kinds map[uint64]stat) (event, bool, error) {
	var e event
	e.at = f.at
	stop, err := w.enter(f, end)
	if err != nil {
		return e, false, err
	}
	known := false // metadata_id read
	for {
		g, ok, err := w.next(stop)
		if err != nil {
			return e, false, err
		}
		if !ok {
			break
		}
		switch g.num {
		case eventMetadataID:
			id, err := w.uint(g, stop)
			if err != nil {
				return e, false, err
			}
			op, ok := p.ops[id]
			if !ok {
				return e, false, w.skipTo(stop, end, g)
			}
			e.ev.Op, known = op, true
		case eventOffset:
			v, err := w.uint(g, stop)
			if err != nil {
				return e, false, err
			}
			e.ps = int64(v)
		case eventStats:
			if err := readStat(w, g, stop, p, kinds, &e); err != nil {
				return e, false, err
			}
		default:
			if err := w.skip(g, stop); err != nil {
				return e, false, err
			}
		}
	}
	if !known {
		// No metadata_id: metadata 0, an allocator event's only if the
		// plane says so.
		op, ok := p.ops[0]
		if !ok {
			return e, false, nil
		}
		e.ev.Op = op
	}
	return e, true, nil
}

// readStat reads the XStat f of an event that ends at end into e, where
// it is one of the stats this package reads.
func readStat(w *wire, f field, end int64, p *plane, kinds map[uint64]stat, e *event) error {
	stop, err := w.enter(f, end)
	if err != nil {
		return err
	}
	var id, u uint64
	var s string
	var isInt, isStr bool
	for {
		g, ok, err := w.next(stop)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch g.num {
		case statMetadataID:
			id, err = w.uint(g, stop)
		case statUint64, statInt64:
			u, err = w.uint(g, stop)
			isInt, isStr = true, false
		case statStr, statBytes:
			var b []byte
			b, _, err = w.bytes(g, stop, maxName)
			s, isInt, isStr = string(b), false, true
		case statRef:
			var ref uint64
			ref, err = w.uint(g, stop)
			s, isInt, isStr = p.stats[ref], false, true
		default: // double_value
			err = w.skip(g, stop)
			isInt, isStr = false, false
		}
		if err != nil {
			return err
		}
	}
	k := kinds[id]
	switch k {
	case statNone:
	case statAllocator, statOp:
		if !isStr {
			return w.errorAt(f.at, trace.ErrCorrupt, "%s stat %s is not a string", opName(e.ev.Op), statNames[k])
		}
		if k == statAllocator {
			e.allocator = s
		} else {
			e.ev.Label = s
		}
		e.has[k] = true
	default:
		if !isInt {
			return w.errorAt(f.at, trace.ErrCorrupt, "%s stat %s is not an integer", opName(e.ev.Op), statNames[k])
		}
		if k != statAddr && int64(u) < 0 {
			return w.errorAt(f.at, trace.ErrCorrupt, "%s stat %s is negative (%d)", opName(e.ev.Op), statNames[k], int64(u))
		}
		e.val[k], e.has[k] = u, true
	}
	return nil
}

func opName(op trace.Op) string {
	switch op {
	case trace.OpMalloc:
		return allocName
	case trace.OpFree:
		return deallocName
	}
	return "allocator event"
}

// check keeps allocator event e, read by w, if it is device dev's,
// counting the mallocs of others in skipped, and fills its trace event; an
// event of the device without the stats it needs is an error. devices
// caches the device of each allocator name.
func check(w *wire, e event, dev int, devices map[string]int, skipped map[string]int) (event, bool, error) {
	if !e.has[statAllocator] {
		return e, false, w.errorAt(e.at, trace.ErrCorrupt, "%s event has no %s stat", opName(e.ev.Op), statNames[statAllocator])
	}
	d, ok := devices[e.allocator]
	if !ok {
		d = allocatorDevice(e.allocator)
		devices[e.allocator] = d
	}
	if d != dev {
		if e.ev.Op == trace.OpMalloc {
			skipped[e.allocator]++
		} else if _, ok := skipped[e.allocator]; !ok {
			skipped[e.allocator] = 0
		}
		return e, false, nil
	}
	for _, k := range []stat{statAddr, statRequested} {
		if !e.has[k] && (k == statAddr || e.ev.Op == trace.OpMalloc) {
			return e, false, w.errorAt(e.at, trace.ErrCorrupt, "%s event of %s has no %s stat", opName(e.ev.Op), e.allocator, statNames[k])
		}
	}
	e.ev.Addr = e.val[statAddr]
	e.ev.Size = e.val[statRequested]
	e.ev.Kind = trace.KindDevice
	return e, true, nil
}

// allocatorDevice returns the GPU whose allocator is called name
// ("GPU_0_bfc": 0), or -1 for a host allocator or any other.
func allocatorDevice(name string) int {
	rest, ok := cutPrefixFold(name, "GPU_")
	if !ok {
		return -1
	}
	num, _, ok := strings.Cut(rest, "_")
	if !ok || num == "" {
		return -1
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > math.MaxInt32 {
		return -1
	}
	return n
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}
