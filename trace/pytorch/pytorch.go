// Package pytorch imports PyTorch CUDA memory snapshots, the pickles that
// torch.cuda.memory._dump_snapshot writes after
// torch.cuda.memory._record_memory_history, as trace events.
//
// A snapshot is a pickle (protocol 2 to 5, optionally gzip-compressed) of
// plain Python values: a dict with "segments" (the allocator's state at
// the dump), "device_traces" (one list of trace entries per device),
// "allocator_settings" and "external_annotations". Import maps the entries
// of one device trace, in recorded order, to trace events:
//
//	alloc          -> trace.OpMalloc (Addr, requested Size, Stream, Kind device)
//	free_requested -> trace.OpFreeRequested (Addr, Size, Stream)
//	free_completed -> trace.OpFree (Addr, Size, Stream): the block is reusable from here
//	oom            -> trace.OpMallocFailed (Size, Stream); Addr is 0 (see below)
//	segment_alloc  -> trace.OpSegmentAlloc (Addr, segment Size, Stream)
//	segment_free   -> trace.OpSegmentFree
//	segment_map    -> trace.OpSegmentMap
//	segment_unmap  -> trace.OpSegmentUnmap
//	snapshot       -> trace.OpMarker with Label "snapshot"
//
// Every event's Time is the entry's time_us times 1000 (nanoseconds since
// the Unix epoch, as PyTorch records them), or 0 in snapshots that predate
// time_us. An oom entry carries the device's free memory in bytes under
// "device_free" (not "addr"); Import drops it, so that Addr of a failed
// malloc is always 0. Python stack frames, compile_context, user_metadata
// and external_annotations are not imported.
//
// Addresses and streams are unsigned 64-bit: PyTorch writes addresses as
// Python ints (a pickle LONG1 of 9 bytes above 2^63) and streams as the
// cudaStream_t value cast to int64, so a negative stream is taken back to
// its two's complement.
//
// A snapshot whose history was cut (torch keeps the last max_entries
// entries, so a long job's trace starts mid-run) begins with events that
// rebuild the allocator's state at its first entry: see reconstruct.go.
//
// Import decodes the pickle as a stream with a decoder of its own
// (stream.go) and reads it whole before it returns: to check it, to
// collect the header (the allocator settings come after the trace in a
// snapshot) and the state before its first entry, and to keep the events
// in a compact log (eventlog.go, about 6 bytes an event), which the
// Source gives. A snapshot with more events than the log's bound (64 MiB,
// about 10 million events) is read a second time as the events are asked
// for instead. Memory stays proportional to the allocator's state (the
// final segments, the addresses the trace touches) and that log, apart
// from 4 bytes for each object the pickle memoizes (any later value may
// refer back to one). A general pickle library, which builds the whole
// object tree (github.com/nlpodyssey/gopickle did here), took 3-4x
// CPython's own pickle.load on kv_decode and 1.7x its memory; the
// streaming decoder takes less than half of CPython's time and a tenth of
// its memory.
package pytorch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
	"github.com/klauspost/compress/gzip"
)

// Options select what to import.
type Options struct {
	// Device is the index into the snapshot's device_traces (the CUDA
	// device ordinal); 0 by default.
	Device int
}

// Errors that Import wraps, for errors.Is. A truncated file wraps
// io.ErrUnexpectedEOF.
var (
	// ErrNotSnapshot: the file is not a PyTorch memory snapshot at all (not
	// a pickle, or a pickle of something else).
	ErrNotSnapshot = errors.New("not a PyTorch snapshot")
	// ErrUnknownAction: a trace entry has an action this package does not
	// know.
	ErrUnknownAction = errors.New("unknown action")
	// ErrLimit: the pickle goes over one of the importer's limits (on
	// nesting, marks, the length of a string or an integer, the memo,
	// the frames of a stack; each far above what real snapshots need),
	// which keep a small hostile or broken file from taking gigabytes
	// or minutes.
	ErrLimit = errors.New("over a limit of the snapshot importer")
)

// Detect reports whether head, the first bytes of a file (two suffice),
// look like a snapshot: the gzip magic 1f 8b, or a pickle PROTO opcode
// (0x80) of protocol 2 to 5. Only Import can tell for sure.
func Detect(head []byte) bool {
	if len(head) < 2 {
		return false
	}
	return isGzip(head) || isPickle(head)
}

func isGzip(head []byte) bool { return head[0] == 0x1f && head[1] == 0x8b }

func isPickle(head []byte) bool { return head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 }

// Import reads a snapshot from r, gzip-compressed or not (told by its
// content, not its name), and returns the events of device trace
// opts.Device as a trace.Source. name is the file name used in error
// messages.
//
// Import reads r to its end and checks the whole snapshot, keeping its
// events; the Source gives them from there, and r may be closed. Only a
// snapshot of more than about 10 million events is read again as its
// events are asked for, from where r stood when Import was called: by
// seeking back when r is an io.Seeker (a file), else from a copy of r's
// bytes that Import keeps (compressed, if the file is); so, for one that
// large, r must stay open, and unchanged, until the Source has returned
// io.EOF, and Next fails if r fails or changes in between. A snapshot with
// private pools is read once more within Import (pools.go).
//
// The header has Source "pytorch"; Settings holds the snapshot's
// allocator_settings flattened to strings (see below), empty for
// snapshots without them; Metadata holds "device" (the index imported),
// "entries" (the number of trace entries) and "segments" (the length of
// the final segments list, when present). For a snapshot whose history
// was cut, Metadata also holds "truncated" ("true") and
// "reconstructed_events" (how many events at the start rebuild the state
// before the first entry; see reconstruct.go); otherwise the events are
// the entries, one for one. When final segments are in private pools (a
// segment_pool_id other than (0, 0): a CUDA graph's, torch.compile's
// cudagraph trees', a MemPool's), Metadata "pools" numbers them by id
// ("1=(0,1) 2=(1,0)"), each malloc's Pool says which one it went to, and
// trace.OpPoolRelease events say where a pool was released: the trace
// entries of PyTorch 2.11 do not say it, so it is inferred (pools.go
// says from what, and what it cannot see).
//
// In Settings the key "PYTORCH_CUDA_ALLOC_CONF" keeps its raw string; other
// values are written as Go formats them: booleans "true"/"false", integers
// in decimal, floats in the shortest form ("0", "0.6"), None as "", and a
// dict (roundup_power2_divisions) as "k:v,k:v" sorted by key, numerically
// when all keys are integers.
//
// Errors are one line that starts with name and, where one applies, gives
// the trace entry index or the byte offset in the (decompressed) pickle:
// a truncated file wraps io.ErrUnexpectedEOF ("NAME: truncated snapshot at
// pickle byte N: unexpected EOF", where N is how many bytes of pickle the
// file holds, after decompression); a file that is not a snapshot wraps
// ErrNotSnapshot; an entry with an unknown action wraps ErrUnknownAction;
// a bad pickle says "NAME: bad pickle at byte N: opcode X: what"; bytes
// after the pickle's STOP are refused, a second pickle there (two
// snapshots concatenated) as such, with the pickle byte where it starts.
// What a snapshot holds twice is cross-checked, and a disagreement is an
// "inconsistent snapshot" error with the pickle byte or the trace entry: a
// block's or segment's size at its malloc and at its free, the blocks the
// trace leaves allocated or frees against the final segments' blocks, a
// trace entry with a key twice (two entries run together). A pickle that
// goes over a limit of the importer wraps ErrLimit: "NAME: pickle byte N:
// a string of 1073741824 bytes is over the limit of 16777216 bytes of this
// importer; ..." (the limits, in stream.go's pickle machine, bound the
// stack, marks, containers held, one string's and all strings' bytes, one
// integer's bytes, the memo and the frames of a stack, each far above a
// real snapshot's needs: they hold Import's memory under 200 MB but for
// the memo, 4 bytes for each object the pickle memoizes, up to 1 GiB).
// Import never panics on bad input, and allocates nothing for a length the
// file claims beyond its end.
func Import(r io.Reader, name string, opts Options) (trace.Source, error) {
	return importLog(r, name, opts, maxLog)
}

// importLog is Import with the events of the first reading kept in a log
// of at most logMax bytes (eventLog); with more, or logMax 0, the Source
// reads the snapshot again.
func importLog(r io.Reader, name string, opts Options, logMax int64) (trace.Source, error) {
	rw := newRewinder(r)
	pr, err := openPickle(rw.first(), name, true)
	if err != nil {
		return nil, err
	}
	defer pr.close()
	check := &checker{hist: newHistory(), watch: newPoolWatch(), log: newEventLog(logMax)}
	d := newDecoder(pr, opts.Device, check)
	d.pickle = pr
	stacks := trace.NewStacks()
	d.readFrames(stacks, false, true) // the entries' as the Source gives them
	if err := d.run(); err != nil {
		return nil, decodeError(name, pr, d, err)
	}
	// Read to the end, so that a gzip stream's checksum is checked and a
	// copy of a reader that cannot seek holds the whole file; nothing may
	// follow the pickle's STOP.
	in := d.in
	stop, after := in.offset(), int64(in.end-in.pos)
	second := after > 0 && in.buf[in.pos] == 0x80
	n, err := io.Copy(io.Discard, pr)
	if err != nil {
		return nil, decodeError(name, pr, d, &inputError{err})
	}
	if after += n; after > 0 {
		if second {
			return nil, fmt.Errorf("%s: a second pickle follows the snapshot at pickle byte %d (%d bytes): concatenated snapshots are refused; split them into one file each", name, stop, after)
		}
		return nil, fmt.Errorf("%s: %d bytes follow the snapshot's end at pickle byte %d: appended data is refused", name, after, stop)
	}
	if pr.gzip {
		// After the gzip member: nothing either.
		head, _ := pr.file.Peek(2)
		if len(head) > 0 {
			rest, _ := io.Copy(io.Discard, pr.file)
			if len(head) == 2 && isGzip(head) {
				return nil, fmt.Errorf("%s: a second gzip stream follows the snapshot's (%d bytes after pickle byte %d): concatenated snapshots are refused; split them into one file each", name, rest, stop)
			}
			return nil, fmt.Errorf("%s: %d bytes follow the snapshot's gzip stream (after pickle byte %d): appended data is refused", name, rest, stop)
		}
	}
	h, entries, err := header(d, name, opts)
	if err != nil {
		return nil, err
	}
	if !d.streamed {
		// A device trace the decoder kept whole (a pickle not written
		// the way Python writes one): check its entries now.
		if err := d.keptEntries(entries); err != nil {
			return nil, err
		}
	}
	if d.entryErr != nil {
		return nil, fmt.Errorf("%s: device_traces[%d] %w", name, opts.Device, d.entryErr)
	}
	h.Metadata["entries"] = strconv.FormatInt(d.entries, 10)
	if err := check.hist.consistent(d.segments, opts.Device); err != nil {
		return nil, fmt.Errorf("%s: inconsistent snapshot: device_traces[%d] %w", name, opts.Device, err)
	}
	prefix := reconstruct(check.hist, d.segments, opts.Device)
	if len(prefix) > 0 {
		h.Metadata["truncated"] = "true"
		h.Metadata["reconstructed_events"] = strconv.Itoa(len(prefix))
	}
	src := &source{name: name, device: opts.Device, h: h, prefix: prefix, want: d.entries, rw: rw, stacks: stacks, final: d.segments}
	if !check.log.over {
		// The events are at hand: no second reading.
		src.log, src.seen, src.toKept = check.log, d.seen, d.toKept
		src.log.rewind()
	} else {
		src.spare = d.memo.chunks
	}
	d.memo.chunks = nil
	ids, final, keyed, err := finalPools(d.segments, opts.Device)
	if err != nil {
		return nil, fmt.Errorf("%s: segments: %w", name, err)
	}
	// A private pool no final segment names: shown by a malloc (under
	// the default search, which poolWatch assumes), or by the stack of a
	// segment free (a MemPool's deletion).
	found := check.memPool
	if found == "" && plainSearch(h.Settings) {
		found = check.watch.found
	}
	unnamed := found != "" && len(ids) == 0 && len(prefix) == 0
	if unnamed && !keyed {
		h.Metadata["pool_warning"] = found + " (its final segments carry no segment_pool_id, as before PyTorch 2.1: the pools are not looked for)"
		unnamed = false
	}
	if len(ids) > 0 || unnamed {
		plan, err := inferPools(rw, name, opts.Device, prefix, ids, final, unnamed)
		if err != nil {
			return nil, err
		}
		switch {
		case plan == nil:
			h.Metadata["pool_warning"] = found
		case unnamed:
			h.Metadata["pools"] = unnamedNames(plan)
			src.labels = newLabeler(plan)
		case plan.mixed:
			h.Metadata["pools"] = mixedNames(plan, len(ids))
			src.labels = newLabeler(plan)
		default:
			h.Metadata["pools"] = poolNames(ids)
			src.labels = newLabeler(plan)
		}
	}
	if src.log != nil {
		src.rw = nil // nor a copy of the file kept
	}
	return src, nil
}

// plainSearch reports whether allocator settings s leave the search of
// cached blocks as it is by default, as poolWatch assumes: no
// max_split_size_mb, no roundup_power2_divisions, no expandable segments.
func plainSearch(s map[string]string) bool {
	if conf := s["PYTORCH_CUDA_ALLOC_CONF"]; strings.Contains(conf, "max_split_size_mb") || strings.Contains(conf, "roundup_power2_divisions") || strings.Contains(conf, "expandable_segments:True") {
		return false
	}
	if v := s["max_split_size"]; v != "" && v != "-1" && v != strconv.FormatUint(math.MaxUint64, 10) {
		return false
	}
	if s["expandable_segments"] == "true" {
		return false
	}
	for _, kv := range strings.Split(s["roundup_power2_divisions"], ",") {
		if _, v, ok := strings.Cut(kv, ":"); ok && v != "0" && v != "1" {
			return false
		}
	}
	return true
}

// inferPools reads the snapshot once more to decide the pool of each
// malloc (see pools.go).
func inferPools(rw *rewinder, name string, device int, prefix []trace.Event, ids [][2]uint64, final []finalRange, unnamed bool) (*poolPlan, error) {
	r, err := rw.again(true)
	if err != nil {
		return nil, fmt.Errorf("%s: reading again: %v", name, err)
	}
	pr, err := openPickle(r, name, true)
	if err != nil {
		return nil, err
	}
	defer pr.close()
	sink := &inferSink{units: newUnitTracker(final), unitFreed: map[int]int64{}, liveAt: map[uint64]int{}, prefix: int64(len(prefix))}
	for k := range prefix {
		ev := prefix[k]
		sink.observe(int64(k), &ev)
	}
	d := newDecoder(pr, device, sink)
	d.stopAtTraces = true
	d.pickle = pr
	d.readFrames(nil, false, false) // the segment frees' stacks (byMemPool)
	if err := d.run(); err != nil {
		return nil, decodeError(name, pr, d, err)
	}
	if !d.streamed {
		entries := d.devList
		if entries.k == 0 {
			if _, entries, err = header(d, name, Options{Device: device}); err != nil {
				return nil, err
			}
		}
		if err := d.keptEntries(entries); err != nil {
			return nil, err
		}
	}
	if d.entryErr != nil {
		return nil, fmt.Errorf("%s: device_traces[%d] %w", name, device, d.entryErr)
	}
	if unnamed {
		plan := sink.decideUnnamed()
		if plan != nil {
			plan.final = final
		}
		return plan, nil
	}
	plan := sink.decide(ids, final)
	plan.mixed = sink.addMemPools(plan) > 0 || plan.mixed
	return plan, nil
}

// checker is the sink of Import's first reading: it converts each entry,
// which reports any error, and follows the trace for reconstruct.
type checker struct {
	hist  *history
	watch *poolWatch
	ev    trace.Event
	// memPool is the first segment free made by a MemPool's deletion
	// (its stack says so), "" if none.
	memPool string
	// log keeps the events, each malloc's Stack the id of its frames in
	// the decoder's seen (the Source keeps them in its table as it gives
	// them, in the order a second reading would).
	log *eventLog
}

func (c *checker) entry(d *decoder, index int64, f *entryFields) error {
	c.ev = trace.Event{}
	if err := convertEntry(d, f, &c.ev); err != nil {
		return err
	}
	if err := c.hist.observe(&c.ev); err != nil {
		return fmt.Errorf("inconsistent snapshot at pickle byte %d: %w", d.in.offset(), err)
	}
	c.watch.observe(index, &c.ev)
	if c.memPool == "" && (c.ev.Op == trace.OpSegmentFree || c.ev.Op == trace.OpSegmentUnmap) && d.byMemPool(d.entryStack) {
		c.memPool = fmt.Sprintf("trace entry %d: a segment freed by the deletion of a MemPool (at::cuda::MemPool::~MemPool in its stack)", index)
	}
	if c.log != nil {
		ev := c.ev
		if ev.Op == trace.OpMalloc || ev.Op == trace.OpMallocFailed {
			ev.Stack = d.entryStack
		}
		c.log.append(&ev)
	}
	return nil
}

// decodeError turns an error of the decoder into Import's message.
func decodeError(name string, pr *pickleStream, d *decoder, err error) error {
	var pe *pickleError
	var ie *inputError
	var le *limitError
	switch {
	case errors.Is(err, errTruncated):
		return truncated(name, d.in.total())
	case errors.As(err, &le):
		return fmt.Errorf("%s: %w", name, le)
	case errors.As(err, &pe):
		return fmt.Errorf("%s: bad pickle at byte %d: %v", name, pe.Offset, pe)
	case errors.As(err, &ie):
		if pr.gzip {
			return gzipError(name, d.in.total(), ie.err)
		}
		return fmt.Errorf("%s: %v", name, ie.err)
	}
	return fmt.Errorf("%s: %v", name, err)
}

// pickleStream is the pickle in a file, decompressed if it is gzip (one
// gzip member: file holds what follows it).
type pickleStream struct {
	io.Reader
	gzip  bool
	file  *bufio.Reader // the compressed file, for a gzip pickle
	ahead *readahead    // decompressing a gzip pickle, if asked
}

// close stops the decompression ahead, if any.
func (p *pickleStream) close() {
	if p.ahead != nil {
		p.ahead.close()
	}
}

// openPickle checks the first bytes of r and returns the pickle in it,
// decompressed, if it is gzip, ahead of its reader (on another core) when
// ahead is set: then the caller must close the stream.
func openPickle(r io.Reader, name string, ahead bool) (*pickleStream, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	head, err := br.Peek(2)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if len(head) == 0 {
		return nil, fmt.Errorf("%s: %w (empty file)", name, ErrNotSnapshot)
	}
	if len(head) < 2 {
		return nil, fmt.Errorf("%s: %w (a file of 1 byte)", name, ErrNotSnapshot)
	}
	switch {
	case isPickle(head):
		return &pickleStream{Reader: br}, nil
	case isGzip(head):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, gzipError(name, 0, err)
		}
		// One member: what follows it is appended data, not more pickle.
		zr.Multistream(false)
		ps := &pickleStream{gzip: true, file: br}
		var content io.Reader = zr
		if ahead {
			ps.ahead = newReadahead(zr)
			content = ps.ahead
		}
		zb := bufio.NewReaderSize(content, 4)
		ps.Reader = zb
		head, err := zb.Peek(4)
		if err != nil && err != io.EOF && !(errors.Is(err, io.ErrUnexpectedEOF) && len(head) >= 2) {
			ps.close()
			return nil, gzipError(name, int64(len(head)), err)
		}
		if len(head) < 2 || !isPickle(head) {
			ps.close()
			return nil, fmt.Errorf("%s: %w (gzip content %s)", name, ErrNotSnapshot, describeHead(head, true))
		}
		return ps, nil
	}
	return nil, fmt.Errorf("%s: %w (file %s)", name, ErrNotSnapshot, describeHead(head, false))
}

// truncated is the error for a pickle that ends, after n bytes, before its
// STOP opcode.
func truncated(name string, n int64) error {
	return fmt.Errorf("%s: truncated snapshot at pickle byte %d: %w", name, n, io.ErrUnexpectedEOF)
}

func gzipError(name string, n int64, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return truncated(name, n)
	}
	return fmt.Errorf("%s: bad gzip at pickle byte %d: %v", name, n, err)
}

// describeHead says why b, the start of a file (gzip is false) or of its
// gzip content, is not a pickle of protocol 2..5.
func describeHead(b []byte, gzip bool) string {
	switch {
	case len(b) == 0:
		return "is empty"
	case len(b) >= 2 && b[0] == 0x80:
		return fmt.Sprintf("is a pickle of protocol %d, want 2..5", b[1])
	}
	if len(b) > 4 {
		b = b[:4]
	}
	if gzip {
		return fmt.Sprintf("starts with % x at byte 0, not a pickle of protocol 2..5", b)
	}
	return fmt.Sprintf("starts with % x at byte 0, neither gzip nor a pickle of protocol 2..5", b)
}

// header checks the decoded snapshot and returns its header and the value
// of the chosen device trace.
func header(d *decoder, name string, opts Options) (trace.Header, value, error) {
	h := trace.Header{Version: trace.Version, Source: "pytorch", Settings: map[string]string{}, Metadata: map[string]string{}}
	top := d.container(d.root)
	if top == nil || top.kind != pyDict {
		return h, value{}, fmt.Errorf("%s: %w (the pickle holds a %s, want a dict)", name, ErrNotSnapshot, d.pyType(d.root))
	}
	var traces, segments, settings value
	for i := 0; i+1 < len(top.items); i += 2 {
		k, v := top.items[i], top.items[i+1]
		if k.k != vStr {
			continue
		}
		switch k.n {
		case sDeviceTraces:
			traces = v
		case sSegments:
			segments = v
		case sAllocatorSettings:
			settings = v
		}
	}
	if traces.k == 0 {
		if segments.k != 0 {
			return h, value{}, fmt.Errorf("%s: snapshot has no device_traces (recorded without _record_memory_history?): no such key in the top-level dict, from pickle byte 0", name)
		}
		return h, value{}, fmt.Errorf("%s: %w (a dict without device_traces or segments, from pickle byte 0)", name, ErrNotSnapshot)
	}
	tk, tc := d.kindOf(traces)
	if tk != pyList || tc == nil {
		return h, value{}, fmt.Errorf("%s: device_traces is a %s, want a list", name, d.pyType(traces))
	}
	if opts.Device < 0 || opts.Device >= tc.n {
		return h, value{}, fmt.Errorf("%s: snapshot has %d device trace(s), --device %d asked for", name, tc.n, opts.Device)
	}
	var entries value
	switch tc.role {
	case roleTraces:
		entries = tc.dev
	case roleKeep:
		entries = tc.items[opts.Device]
	}
	ek, ec := d.kindOf(entries)
	if ek != pyList {
		return h, value{}, fmt.Errorf("%s: device_traces[%d] is a %s, want a list", name, opts.Device, d.pyType(entries))
	}
	if ec == nil || (d.streamed && (entries != d.entriesList || d.entriesLists != 1)) || (!d.streamed && ec.role != roleKeep) {
		return h, value{}, fmt.Errorf("%s: bad pickle: device_traces[%d] is built in a way this importer does not follow", name, opts.Device)
	}
	if settings.k != 0 && settings.k != vNone {
		sk, sc := d.kindOf(settings)
		if sk != pyDict || sc == nil {
			return h, value{}, fmt.Errorf("%s: allocator_settings is a %s, want a dict", name, d.pyType(settings))
		}
		conv := goValues{d: d, seen: map[int64]any{}}
		for i := 0; i+1 < len(sc.items); i += 2 {
			k := formatValue(conv.of(sc.items[i]))
			v := sc.items[i+1]
			if k == "PYTORCH_CUDA_ALLOC_CONF" && v.k == vStr {
				h.Settings[k] = d.strs[v.n]
				continue
			}
			h.Settings[k] = formatValue(conv.of(v))
		}
	}
	h.Metadata["device"] = strconv.Itoa(opts.Device)
	h.Metadata["devices"] = strconv.Itoa(tc.n) // the snapshot's device traces
	if sk, sc := d.kindOf(segments); sk == pyList && sc != nil {
		h.Metadata["segments"] = strconv.Itoa(sc.n)
		if sc.role == roleKeep {
			for _, v := range sc.items {
				d.segments = append(d.segments, d.segment(v))
			}
		}
	}
	return h, entries, nil
}

// keptEntries converts the entries of a device trace that the decoder kept
// whole, as if they had been streamed.
func (d *decoder) keptEntries(list value) error {
	c := d.container(list)
	if c == nil {
		return nil
	}
	items := append([]value(nil), c.items...)
	for _, v := range items {
		if err := d.entry(v); err != nil {
			return err
		}
	}
	return nil
}

// actionNames are the actions of trace entries, and actionOps their ops.
var (
	actionNames = []string{"alloc", "free_requested", "free_completed", "oom",
		"segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot"}
	actionOps = []trace.Op{trace.OpMalloc, trace.OpFreeRequested, trace.OpFree, trace.OpMallocFailed,
		trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap, trace.OpMarker}
)

// convertEntry fills ev from the fields of one trace entry.
func convertEntry(d *decoder, f *entryFields, ev *trace.Event) error {
	if f.action.k != vStr {
		if f.action.k == 0 || f.action.k == vNone {
			return errors.New("no action")
		}
		return fmt.Errorf("action is a %s, want a str", d.pyType(f.action))
	}
	a := f.action.n - sFirstAction
	if a < 0 || a >= int64(len(actionOps)) {
		return fmt.Errorf("%w %q", ErrUnknownAction, d.strs[f.action.n])
	}
	op := actionOps[a]
	ev.Op = op
	var err error
	d.entryStack = 0
	if f.frames.k != 0 {
		// Taken first, so that the list is let go whatever follows.
		stack, err := d.stackOf(f.frames)
		if err != nil {
			return err
		}
		d.entryStack = stack
		if d.entryFrames && (op == trace.OpMalloc || op == trace.OpMallocFailed) {
			ev.Stack = d.kept(stack)
		}
	}
	if f.timeUS.k != 0 && f.timeUS.k != vNone {
		us, err := d.toInt64(f.timeUS, "time_us")
		if err != nil {
			return err
		}
		if us > math.MaxInt64/1000 || us < math.MinInt64/1000 {
			return fmt.Errorf("time_us %d overflows int64 nanoseconds", us)
		}
		ev.Time = us * 1000
	}
	if op == trace.OpMarker {
		ev.Label = actionNames[a]
		return nil
	}
	if f.stream.k != 0 && f.stream.k != vNone {
		if ev.Stream, err = d.toStream(f.stream); err != nil {
			return err
		}
	}
	if f.size.k == 0 {
		return fmt.Errorf("%s without size", actionNames[a])
	}
	if ev.Size, err = d.toUint64(f.size, "size"); err != nil {
		return err
	}
	if op == trace.OpMallocFailed {
		return nil // its device_free is dropped
	}
	if f.addr.k == 0 {
		return fmt.Errorf("%s without addr", actionNames[a])
	}
	if ev.Addr, err = d.toUint64(f.addr, "addr"); err != nil {
		return err
	}
	if (op == trace.OpSegmentFree || op == trace.OpSegmentUnmap) && d.byEmptyCache(d.entryStack) && !d.byMemPool(d.entryStack) {
		// (A MemPool's deletion empties its own pool: pools.go.)
		ev.Label = trace.ReleaseByEmptyCache
	}
	return nil
}

// source is the Source Import returns: the reconstructed events, then the
// entries read from the file a second time.
type source struct {
	name   string
	device int
	h      trace.Header
	prefix []trace.Event
	want   int64 // entries the first reading found
	rw     *rewinder

	d    *decoder
	q    queue
	done bool
	err  error

	// labels puts the private pools on the events (pools.go), nil for a
	// snapshot without them; nextIdx is the index of the next event before
	// any pool_release, release the pool_releases to give first.
	labels  *labeler
	nextIdx int64
	release []trace.Event

	// stacks holds the stacks of the mallocs' frames: the final blocks'
	// from the first reading, the entries' as the events are given.
	stacks *trace.Stacks

	// final is the snapshot's final segments, for Slice.
	final []snapSegment

	// spare is the first reading's memo, for the second to reuse.
	spare []*[memoChunk]uint32

	// log holds the first reading's events, nil if they were too many to
	// keep (then the snapshot is read again). Its mallocs' stacks are ids
	// in seen, which kept maps to stacks; toKept caches that.
	log    *eventLog
	seen   *trace.Stacks
	toKept []uint32
}

var _ trace.StackSource = (*source)(nil)

// Stacks returns the table of the stacks the events name: a malloc's is
// the frames of its entry (or, rebuilding a cut history, of its block in
// the final segments).
func (s *source) Stacks() *trace.Stacks { return s.stacks }

// queue is the sink of the second reading: the converted events of the
// last batch of entries.
type queue struct {
	evs []trace.Event
	i   int
}

func (q *queue) entry(d *decoder, index int64, f *entryFields) error {
	q.evs = append(q.evs, trace.Event{})
	return convertEntry(d, f, &q.evs[len(q.evs)-1])
}

func (s *source) Header() trace.Header { return s.h }

func (s *source) Next() (trace.Event, error) {
	if len(s.release) > 0 {
		ev := s.release[0]
		s.release = s.release[1:]
		return ev, nil
	}
	ev, err := s.next()
	if err != nil || s.labels == nil {
		return ev, err
	}
	if rel := s.labels.label(s.nextIdx, &ev); len(rel) > 0 {
		s.release = append(rel[1:], ev)
		ev = rel[0]
	}
	s.nextIdx++
	return ev, nil
}

// next returns the next event before any labels.
func (s *source) next() (trace.Event, error) {
	if len(s.prefix) > 0 {
		ev := s.prefix[0]
		s.prefix = s.prefix[1:]
		return ev, nil
	}
	if s.log != nil {
		var ev trace.Event
		if err := s.log.next(&ev); err != nil {
			s.log, s.seen, s.toKept = nil, nil, nil
			s.done = true
			if err != errLogEnd {
				s.err = fmt.Errorf("%s: %v", s.name, err)
				return ev, s.err
			}
			return trace.Event{}, io.EOF
		}
		ev.Stack = s.kept(ev.Stack)
		return ev, nil
	}
	for s.q.i >= len(s.q.evs) {
		if s.err != nil {
			return trace.Event{}, s.err
		}
		if s.done {
			return trace.Event{}, io.EOF
		}
		s.q.evs, s.q.i = s.q.evs[:0], 0
		s.err = s.fill()
	}
	ev := s.q.evs[s.q.i]
	s.q.i++
	return ev, nil
}

// kept returns the id in s.stacks of stack id of s.seen, adding it the
// first time, as decoder.kept does on a second reading.
func (s *source) kept(id uint32) uint32 {
	if id == 0 {
		return 0
	}
	if n := int(id) + 1 - len(s.toKept); n > 0 {
		s.toKept = append(s.toKept, make([]uint32, n)...)
	}
	if k := s.toKept[id]; k != 0 {
		return k
	}
	k := s.stacks.AddFrames(s.seen.Frames(id))
	s.toKept[id] = k
	return k
}

// fill reads the next batch of entries into s.q.
func (s *source) fill() error {
	if s.d == nil {
		r, err := s.rw.again(false)
		if err != nil {
			return fmt.Errorf("%s: reading again: %v", s.name, err)
		}
		pr, err := openPickle(r, s.name, false)
		if err != nil {
			return err
		}
		s.d = newDecoder(pr, s.device, &s.q)
		s.d.memo.spare, s.spare = s.spare, nil
		s.d.readFrames(s.stacks, true, false)
		s.d.pauseAfterAppend = true
		s.d.stopAtTraces = true
		s.d.pickle = pr
	}
	d := s.d
	if err := d.run(); err != nil {
		return decodeError(s.name, d.pickle, d, err)
	}
	if d.entryErr != nil {
		return fmt.Errorf("%s: device_traces[%d] %w", s.name, s.device, d.entryErr)
	}
	if !d.stopped {
		return nil
	}
	s.done = true
	if !d.streamed {
		entries := d.devList
		if entries.k == 0 {
			var err error
			if _, entries, err = header(d, s.name, Options{Device: s.device}); err != nil {
				return err
			}
		}
		if err := d.keptEntries(entries); err != nil {
			return err
		}
		if d.entryErr != nil {
			return fmt.Errorf("%s: device_traces[%d] %w", s.name, s.device, d.entryErr)
		}
	}
	if d.entries != s.want {
		return fmt.Errorf("%s: changed while being read: %d trace entries, %d the first time", s.name, d.entries, s.want)
	}
	return nil
}

// rewinder gives a reader's bytes twice: by seeking back, or from a copy.
type rewinder struct {
	r     io.Reader
	seek  io.Seeker
	start int64
	copy  *bytes.Buffer
}

func newRewinder(r io.Reader) *rewinder {
	rw := &rewinder{r: r}
	if s, ok := r.(io.Seeker); ok {
		if at, err := s.Seek(0, io.SeekCurrent); err == nil {
			rw.seek, rw.start = s, at
			return rw
		}
	}
	rw.copy = new(bytes.Buffer)
	return rw
}

// first returns the reader for the first reading.
func (rw *rewinder) first() io.Reader {
	if rw.copy != nil {
		return io.TeeReader(rw.r, rw.copy)
	}
	return rw.r
}

// again returns the reader's bytes from the start once more; after the
// last time (keep false), no more.
func (rw *rewinder) again(keep bool) (io.Reader, error) {
	if rw.copy != nil {
		b := rw.copy.Bytes()
		if !keep {
			rw.copy = nil
		}
		return bytes.NewReader(b), nil
	}
	if rw.seek == nil {
		return nil, errors.New("read twice")
	}
	if _, err := rw.seek.Seek(rw.start, io.SeekStart); err != nil {
		return nil, err
	}
	if !keep {
		rw.seek = nil
	}
	return rw.r, nil
}
