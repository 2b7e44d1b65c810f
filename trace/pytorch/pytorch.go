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
// The pickle format cannot be decoded incrementally: Import reads the whole
// file, decodes it with github.com/nlpodyssey/gopickle and converts the
// chosen device trace to events held in memory.
package pytorch

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
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

// Import reads a whole snapshot from r, gzip-compressed or not (told by its
// content, not its name), and returns the events of device trace
// opts.Device as a trace.Source, whose Next never fails. name is the file
// name used in error messages.
//
// The header has Source "pytorch"; Settings holds the snapshot's
// allocator_settings flattened to strings (see below), empty for
// snapshots without them; Metadata holds "device" (the index imported),
// "entries" (the number of trace entries, which equals the number of
// events) and "segments" (the length of the final segments list, when
// present).
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
// ErrNotSnapshot; an entry with an unknown action wraps ErrUnknownAction.
// Import never panics on bad input.
func Import(r io.Reader, name string, opts Options) (trace.Source, error) {
	data, err := readPickle(r, name)
	if err != nil {
		return nil, err
	}
	if _, err := scanPickle(data); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, truncated(name, len(data))
		}
		var se *scanError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%s: bad pickle at byte %d: %v", name, se.Offset, err)
		}
		return nil, fmt.Errorf("%s: bad pickle: %v", name, err)
	}
	root, err := unpickle(data, name)
	if err != nil {
		return nil, err
	}
	h, evs, err := convert(root, name, opts)
	if err != nil {
		return nil, err
	}
	return trace.NewSliceSource(h, evs), nil
}

// readPickle returns the whole pickle in r, decompressed if it is gzip.
func readPickle(r io.Reader, name string) ([]byte, error) {
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
	var data []byte
	switch {
	case isPickle(head):
		data, err = io.ReadAll(br)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
	case isGzip(head):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, gzipError(name, 0, err)
		}
		data, err = io.ReadAll(zr)
		if err != nil {
			return nil, gzipError(name, len(data), err)
		}
		if len(data) < 2 || !isPickle(data) {
			return nil, fmt.Errorf("%s: %w (gzip content %s)", name, ErrNotSnapshot, describeHead(data, true))
		}
	default:
		return nil, fmt.Errorf("%s: %w (file %s)", name, ErrNotSnapshot, describeHead(head, false))
	}
	return data, nil
}

// truncated is the error for a pickle that ends, after n bytes, before its
// STOP opcode.
func truncated(name string, n int) error {
	return fmt.Errorf("%s: truncated snapshot at pickle byte %d: %w", name, n, io.ErrUnexpectedEOF)
}

func gzipError(name string, n int, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return truncated(name, n)
	}
	return fmt.Errorf("%s: bad gzip after %d bytes of pickle: %v", name, n, err)
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
		return fmt.Sprintf("starts with % x, not a pickle of protocol 2..5", b)
	}
	return fmt.Sprintf("starts with % x, neither gzip nor a pickle of protocol 2..5", b)
}

// unpickle decodes data, which scanPickle accepted, turning any panic of
// the decoder into an error.
func unpickle(data []byte, name string) (v any, err error) {
	rd := bytes.NewReader(data)
	defer func() {
		if p := recover(); p != nil {
			v = nil
			err = fmt.Errorf("%s: bad pickle near byte %d: decoder panic: %s", name, len(data)-rd.Len(), oneLine(fmt.Sprint(p)))
		}
	}()
	u := pickle.NewUnpickler(rd)
	v, err = u.Load()
	if err != nil {
		at := len(data) - rd.Len()
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, truncated(name, len(data))
		}
		return nil, fmt.Errorf("%s: bad pickle near byte %d: %s", name, at, oneLine(err.Error()))
	}
	return v, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// convert maps the decoded snapshot root to a header and the events of
// device trace opts.Device.
func convert(root any, name string, opts Options) (trace.Header, []trace.Event, error) {
	h := trace.Header{Version: trace.Version, Source: "pytorch", Settings: map[string]string{}, Metadata: map[string]string{}}
	top, ok := root.(*types.Dict)
	if !ok {
		return h, nil, fmt.Errorf("%s: %w (the pickle holds a %s, want a dict)", name, ErrNotSnapshot, pyType(root))
	}
	var traces, segments, settings any
	var haveTraces, haveSegments, haveSettings bool
	for _, e := range *top {
		switch e.Key {
		case "device_traces":
			traces, haveTraces = e.Value, true
		case "segments":
			segments, haveSegments = e.Value, true
		case "allocator_settings":
			settings, haveSettings = e.Value, true
		}
	}
	if !haveTraces {
		if haveSegments {
			return h, nil, fmt.Errorf("%s: snapshot has no device_traces (recorded without _record_memory_history?)", name)
		}
		return h, nil, fmt.Errorf("%s: %w (a dict without device_traces or segments)", name, ErrNotSnapshot)
	}
	devs, ok := traces.(*types.List)
	if !ok {
		return h, nil, fmt.Errorf("%s: device_traces is a %s, want a list", name, pyType(traces))
	}
	if opts.Device < 0 || opts.Device >= len(*devs) {
		return h, nil, fmt.Errorf("%s: snapshot has %d device trace(s), --device %d asked for", name, len(*devs), opts.Device)
	}
	entries, ok := (*devs)[opts.Device].(*types.List)
	if !ok {
		return h, nil, fmt.Errorf("%s: device_traces[%d] is a %s, want a list", name, opts.Device, pyType((*devs)[opts.Device]))
	}
	if haveSettings && settings != nil {
		sd, ok := settings.(*types.Dict)
		if !ok {
			return h, nil, fmt.Errorf("%s: allocator_settings is a %s, want a dict", name, pyType(settings))
		}
		for _, e := range *sd {
			k := formatValue(e.Key)
			if k == "PYTORCH_CUDA_ALLOC_CONF" {
				if s, ok := e.Value.(string); ok {
					h.Settings[k] = s
					continue
				}
			}
			h.Settings[k] = formatValue(e.Value)
		}
	}
	h.Metadata["device"] = strconv.Itoa(opts.Device)
	h.Metadata["entries"] = strconv.Itoa(len(*entries))
	if haveSegments {
		if sl, ok := segments.(*types.List); ok {
			h.Metadata["segments"] = strconv.Itoa(len(*sl))
		}
	}

	evs := make([]trace.Event, len(*entries))
	for i, v := range *entries {
		if err := convertEntry(&evs[i], v); err != nil {
			return h, nil, fmt.Errorf("%s: device_traces[%d] entry %d: %w", name, opts.Device, i, err)
		}
	}
	return h, evs, nil
}

var actionOps = map[string]trace.Op{
	"alloc":          trace.OpMalloc,
	"free_requested": trace.OpFreeRequested,
	"free_completed": trace.OpFree,
	"oom":            trace.OpMallocFailed,
	"segment_alloc":  trace.OpSegmentAlloc,
	"segment_free":   trace.OpSegmentFree,
	"segment_map":    trace.OpSegmentMap,
	"segment_unmap":  trace.OpSegmentUnmap,
	"snapshot":       trace.OpMarker,
}

// convertEntry fills ev from one trace entry.
func convertEntry(ev *trace.Event, v any) error {
	d, ok := v.(*types.Dict)
	if !ok {
		return fmt.Errorf("is a %s, want a dict", pyType(v))
	}
	var action, addr, size, stream, timeUS any
	var haveAddr, haveSize bool
	for _, e := range *d {
		k, _ := e.Key.(string)
		switch k {
		case "action":
			action = e.Value
		case "addr":
			addr, haveAddr = e.Value, true
		case "size":
			size, haveSize = e.Value, true
		case "stream":
			stream = e.Value
		case "time_us":
			timeUS = e.Value
		}
	}
	a, ok := action.(string)
	if !ok {
		if action == nil {
			return errors.New("no action")
		}
		return fmt.Errorf("action is a %s, want a str", pyType(action))
	}
	op, ok := actionOps[a]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownAction, a)
	}
	ev.Op = op
	var err error
	if timeUS != nil {
		us, err := toInt64(timeUS, "time_us")
		if err != nil {
			return err
		}
		if us > math.MaxInt64/1000 || us < math.MinInt64/1000 {
			return fmt.Errorf("time_us %d overflows int64 nanoseconds", us)
		}
		ev.Time = us * 1000
	}
	if op == trace.OpMarker {
		ev.Label = a
		return nil
	}
	if stream != nil {
		if ev.Stream, err = toStream(stream); err != nil {
			return err
		}
	}
	if !haveSize {
		return fmt.Errorf("%s without size", a)
	}
	if ev.Size, err = toUint64(size, "size"); err != nil {
		return err
	}
	if op == trace.OpMallocFailed {
		return nil // its device_free is dropped
	}
	if !haveAddr {
		return fmt.Errorf("%s without addr", a)
	}
	if ev.Addr, err = toUint64(addr, "addr"); err != nil {
		return err
	}
	return nil
}

// toUint64 converts a non-negative Python int to uint64.
func toUint64(v any, field string) (uint64, error) {
	switch x := v.(type) {
	case int:
		if x < 0 {
			return 0, fmt.Errorf("%s %d is negative", field, x)
		}
		return uint64(x), nil
	case *big.Int:
		if !x.IsUint64() {
			return 0, fmt.Errorf("%s %s does not fit in 64 bits unsigned", field, x)
		}
		return x.Uint64(), nil
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, pyType(v))
}

// toInt64 converts a Python int to int64.
func toInt64(v any, field string) (int64, error) {
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case *big.Int:
		if !x.IsInt64() {
			return 0, fmt.Errorf("%s %s does not fit in 64 bits signed", field, x)
		}
		return x.Int64(), nil
	}
	return 0, fmt.Errorf("%s is a %s, want an int", field, pyType(v))
}

// toStream converts a stream, which PyTorch writes as int64(cudaStream_t),
// back to its unsigned value.
func toStream(v any) (uint64, error) {
	if x, ok := v.(*big.Int); ok && x.IsUint64() {
		return x.Uint64(), nil
	}
	n, err := toInt64(v, "stream")
	return uint64(n), err
}

// pyType names the Python type of a decoded value, for error messages.
func pyType(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.List:
		return "list"
	case *types.Tuple:
		return "tuple"
	case *types.Dict, *types.OrderedDict:
		return "dict"
	case *types.Set, *types.FrozenSet:
		return "set"
	}
	return fmt.Sprintf("%T", v)
}
