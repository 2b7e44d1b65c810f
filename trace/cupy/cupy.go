// Package cupy imports the logs of CuPy's memory hook DebugPrintHook
// (cupy/cuda/memory_hooks/debug_print.py in cupy/cupy) as trace events,
// streaming, one line at a time.
//
// DebugPrintHook prints one JSON object a line, after each call of CuPy's
// memory pool (SingleDeviceMemoryPool) that it hooks:
//
//	{"hook":"alloc","device_id":0,"mem_size":3584,"mem_ptr":139650121334784}
//	{"hook":"malloc","device_id":0,"size":3472,"mem_size":3584,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe168710"}
//	{"hook":"free","device_id":0,"mem_size":3584,"mem_ptr":139650121334784,"pmem_id":"0x7f04fe168710"}
//
//	alloc   the pool's device allocation of mem_size bytes at mem_ptr
//	        (cudaMalloc): trace.OpSegmentAlloc, observed only. Its line
//	        comes before the line of the malloc that made it. An alloc of
//	        mem_ptr 0 (the device refused) has no event.
//	malloc  a malloc from the pool of size bytes (mem_size is size rounded
//	        up to 512 B) at mem_ptr: trace.OpMalloc (Addr = mem_ptr, Size =
//	        size). A malloc of mem_ptr 0 and pmem_id 0x0 failed (the pool
//	        raised OutOfMemoryError): trace.OpMallocFailed (Size = size). A
//	        malloc of 0 bytes (mem_ptr 0, a pmem_id) has no event: CuPy
//	        hands out a null pointer from no pool, whose release logs no
//	        free.
//	free    the block at mem_ptr, of mem_size bytes, back to the pool:
//	        trace.OpFree (Addr = mem_ptr, Size = mem_size).
//
// pmem_id (the Python id of the pooled memory object) and any other key
// are ignored. The pool of each device logs its own lines (device_id):
// Options.Device picks one, and the lines of the others are skipped.
//
// What the log does not record: the stream of a malloc (CuPy keeps free
// chunks per stream, an arena for each, but DebugPrintHook prints none),
// times, and the device frees of the pool (free_all_blocks, and the
// release of cached blocks before a retry after an OOM, call cudaFree
// without a hook). So every event is on stream 0 at time 0, and there is
// no trace.OpSegmentFree; the header's Metadata "unrecorded" says so
// (trace.Header.Unrecorded). A log of a job that used several streams
// replays as if it had used one: its mallocs may reuse chunks that the
// real pool kept apart, in the arena of another stream.
package cupy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// Unrecorded is the header's Metadata "unrecorded" of every CuPy log:
// what DebugPrintHook does not print.
var Unrecorded = strings.Join([]string{trace.UnrecordedStreams, trace.UnrecordedTimes, trace.UnrecordedSegmentFrees}, ", ")

// maxLine is the longest line in bytes Source reads; DebugPrintHook's are
// about 130.
const maxLine = 1 << 20

// Options say how to import a log.
type Options struct {
	// Device is the device_id whose lines are imported.
	Device int
}

// Detect reports whether head, the first bytes of a file, start like a
// DebugPrintHook log: a JSON object holding the keys "hook" and
// "device_id" on the first line that is not blank.
func Detect(head []byte) bool {
	head = bytes.TrimPrefix(head, []byte("\xef\xbb\xbf"))
	head = bytes.TrimLeft(head, " \t\r\n")
	line, _, _ := bytes.Cut(head, []byte("\n"))
	return bytes.HasPrefix(line, []byte("{")) && bytes.Contains(line, []byte(`"hook"`)) && bytes.Contains(line, []byte(`"device_id"`))
}

// Source reads a DebugPrintHook log one line at a time.
type Source struct {
	name   string
	device uint64
	br     *bufio.Reader
	buf    []byte // the line being read
	h      trace.Header
	line   int
	events int64
	others []uint64       // the other device ids seen, at most maxOthers
	live   map[uint64]int // the live mallocs of the device: address -> line
	err    error
}

// maxOthers is how many other device ids Source keeps to name in the
// error of a log without lines of the device asked for.
const maxOthers = 8

var _ trace.Source = (*Source)(nil)

// Import returns a Source over the log in r; name is used in errors. It
// returns an error for a negative opts.Device. It reads nothing yet: the
// Source's Next returns a *trace.SyntaxError for a line it cannot read,
// naming the file and the line.
func Import(r io.Reader, name string, opts Options) (*Source, error) {
	if opts.Device < 0 {
		return nil, fmt.Errorf("%s: device %d: a CuPy device_id is not negative", name, opts.Device)
	}
	return &Source{name: name, device: uint64(opts.Device), br: bufio.NewReaderSize(r, 64<<10), h: trace.Header{Source: "cupy", Metadata: map[string]string{
		"format":     "CuPy DebugPrintHook JSON lines",
		"device_id":  strconv.Itoa(opts.Device),
		"unrecorded": Unrecorded,
	}}}, nil
}

// Header returns the trace header: Source "cupy", Metadata "format",
// "device_id" (the device imported) and "unrecorded".
func (s *Source) Header() trace.Header { return s.h }

// Next returns the event of the next line that makes one, io.EOF after
// the last, or a final error: a *trace.SyntaxError for a line that cannot
// be read, and at the end of a log that has lines of other devices but
// none of the one asked for, an error naming the devices it has.
func (s *Source) Next() (trace.Event, error) {
	if s.err != nil {
		return trace.Event{}, s.err
	}
	ev, err := s.next()
	if err != nil {
		s.err = err
	}
	return ev, err
}

func (s *Source) syntax(format string, args ...any) error {
	return &trace.SyntaxError{File: s.name, Line: s.line, Msg: fmt.Sprintf(format, args...)}
}

func (s *Source) next() (trace.Event, error) {
	for {
		b, err := s.readLine()
		if err == io.EOF {
			break
		}
		if err != nil {
			return trace.Event{}, err
		}
		b = bytes.TrimSpace(b)
		if s.line == 1 {
			b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
		}
		if len(b) == 0 {
			continue
		}
		ev, dev, keep, err := s.parse(b)
		if err != nil {
			return trace.Event{}, err
		}
		if dev != s.device {
			if len(s.others) < maxOthers && !slices.Contains(s.others, dev) {
				s.others = append(s.others, dev)
			}
			continue
		}
		if keep {
			switch ev.Op {
			case trace.OpMalloc:
				if at, dup := s.live[ev.Addr]; dup {
					return trace.Event{}, s.syntax("malloc at %#x, live since line %d: a pool never hands out a live chunk (two logs joined?)", ev.Addr, at)
				}
				if s.live == nil {
					s.live = map[uint64]int{}
				}
				s.live[ev.Addr] = s.line
			case trace.OpFree:
				delete(s.live, ev.Addr)
			}
			s.events++
			return ev, nil
		}
	}
	if s.events == 0 && len(s.others) > 0 {
		slices.Sort(s.others)
		ids := make([]string, len(s.others))
		for k, d := range s.others {
			ids[k] = strconv.FormatUint(d, 10)
		}
		return trace.Event{}, fmt.Errorf("%s: no line of device %d; the log has device_id %s (--device)", s.name, s.device, strings.Join(ids, ", "))
	}
	return trace.Event{}, io.EOF
}

// readLine returns the next line without its newline, valid until the
// next call (the last line of a file may have none), and io.EOF after the
// last. An error of the reader (a trace.LineReader's *trace.SyntaxError
// for binary data) is returned as it is, without the part of the line
// read before it.
func (s *Source) readLine() ([]byte, error) {
	s.buf = s.buf[:0]
	for {
		part, err := s.br.ReadSlice('\n')
		if len(s.buf)+len(part) > maxLine+1 {
			s.line++
			return nil, s.syntax("a line longer than %d bytes: not a DebugPrintHook log", maxLine)
		}
		s.buf = append(s.buf, part...)
		switch err {
		case nil:
			s.line++
			return s.buf[:len(s.buf)-1], nil
		case bufio.ErrBufferFull:
			continue
		case io.EOF:
			if len(s.buf) == 0 {
				return nil, io.EOF
			}
			s.line++
			return s.buf, nil
		}
		var se *trace.SyntaxError
		if errors.As(err, &se) {
			return nil, err // names the file already
		}
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
}

// hookLine is a line as JSON: the numbers are read apart, for errors that
// name the key.
type hookLine struct {
	Hook     *string         `json:"hook"`
	DeviceID json.RawMessage `json:"device_id"`
	Size     json.RawMessage `json:"size"`
	MemSize  json.RawMessage `json:"mem_size"`
	MemPtr   json.RawMessage `json:"mem_ptr"`
}

// parse reads line b: its event, its device, and whether it makes an
// event (a failed alloc and a malloc of 0 bytes do not).
func (s *Source) parse(b []byte) (ev trace.Event, dev uint64, keep bool, err error) {
	if b[0] != '{' {
		return ev, 0, false, s.syntax("not a JSON object (a DebugPrintHook line starts with {)")
	}
	var l hookLine
	if err := json.Unmarshal(b, &l); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return ev, 0, false, s.syntax("bad JSON at byte %d: %v", se.Offset, se)
		}
		return ev, 0, false, s.syntax("bad line: %v", err)
	}
	if l.Hook == nil {
		return ev, 0, false, s.syntax(`no "hook"`)
	}
	num := func(key string, raw json.RawMessage) (uint64, error) {
		if raw == nil {
			return 0, s.syntax("%s line without %q", *l.Hook, key)
		}
		v, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return 0, s.syntax("%s %s: want a non-negative integer below 2^64", key, abbreviate(raw))
		}
		return v, nil
	}
	if dev, err = num("device_id", l.DeviceID); err != nil {
		return ev, 0, false, err
	}
	memSize, err := num("mem_size", l.MemSize)
	if err != nil {
		return ev, 0, false, err
	}
	ptr, err := num("mem_ptr", l.MemPtr)
	if err != nil {
		return ev, 0, false, err
	}
	switch *l.Hook {
	case "alloc":
		return trace.Event{Op: trace.OpSegmentAlloc, Addr: ptr, Size: memSize}, dev, ptr != 0, nil
	case "malloc":
		size, err := num("size", l.Size)
		if err != nil {
			return ev, 0, false, err
		}
		switch {
		case ptr != 0:
			return trace.Event{Op: trace.OpMalloc, Addr: ptr, Size: size}, dev, true, nil
		case size == 0:
			return ev, dev, false, nil
		}
		return trace.Event{Op: trace.OpMallocFailed, Size: size}, dev, true, nil
	case "free":
		return trace.Event{Op: trace.OpFree, Addr: ptr, Size: memSize}, dev, true, nil
	}
	return ev, 0, false, s.syntax("unknown hook %s (want alloc, malloc or free)", strconv.Quote(abbreviate([]byte(*l.Hook))))
}

// abbreviate returns b as text, cut to 40 bytes.
func abbreviate(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}
