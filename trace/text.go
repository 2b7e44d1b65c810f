package trace

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// The text form is one event per line, for tests and hand-written traces:
//
//	# a comment
//	header source=text device="NVIDIA H200" setting.PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
//	malloc id=1 size=4096 stream=0
//	free id=1
//	event_record event=7 stream=1
//	marker label="step 2"
//	stack id=1 frame="train.py:40:forward" frame="train.py:12:main"
//	malloc id=2 size=1MiB stack=1
//
// Each line is an op name (Op.String) followed by key=value fields: addr
// (or id), size, stream, kind (device, async, pinned, managed), t (time in
// nanoseconds; when absent, the previous event's time plus one), thread,
// pool (the private pool of a malloc or pool_release, 0 for the default
// pools), restore (1: a malloc of a pool's checkpoint restore), event (the
// CUDA event id of event ops, stored in Addr) and label. Numbers
// are decimal or 0x-prefixed hex; sizes also take suffixes (4KiB, 2MiB).
// Values holding spaces are double-quoted. An optional header line, before
// any event, sets Header fields; setting.KEY and meta.KEY fill Settings and
// Metadata. A stack line gives a call stack an id (from 1) for the stack
// field of the mallocs after it: its frames FILE:LINE:NAME (Frame.String),
// innermost first; ParseTextStacks returns the table.

// SyntaxError is an error in a text-form trace, at a line.
type SyntaxError struct {
	File string // file name, or "" if unknown
	Line int    // 1-based line number
	Msg  string
}

func (e *SyntaxError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// ParseText reads a whole text-form trace from r into memory; name is used
// in errors. It returns the header (Source "text" unless the header line
// says otherwise) and the events in order, or a *SyntaxError. The events'
// stacks name the table that ParseTextStacks returns. It is for small
// traces and tests; TextReader reads one event at a time.
func ParseText(name string, r io.Reader) (Header, []Event, error) {
	h, evs, _, err := ParseTextStacks(name, r)
	return h, evs, err
}

// ParseTextStacks is ParseText that also returns the stack table of the
// trace's stack lines (nil when it has none), which its events' Stack ids
// name: a stack's id in the table is its order among the distinct stacks
// of the stack lines, which need not be the id the line gives it.
func ParseTextStacks(name string, r io.Reader) (Header, []Event, *Stacks, error) {
	tr, err := NewTextReader(r, name)
	if err != nil {
		return tr.Header(), nil, nil, err
	}
	var evs []Event
	for {
		ev, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return tr.Header(), nil, nil, err
		}
		evs = append(evs, ev)
	}
	st := tr.Stacks()
	if st.Len() == 0 {
		st = nil
	}
	return tr.Header(), evs, st, nil
}

// TextReader reads a text-form trace one line at a time: a Source (and a
// StackSource) whose memory is that of one line (at most MaxLineBytes),
// its stack table and the labels of the events it returns, whatever the
// number of lines.
type TextReader struct {
	name     string
	sc       *bufio.Scanner
	line     int // lines read
	h        Header
	st       *Stacks
	stackIDs map[uint64]uint32 // the text's stack ids to the table's
	lastTime int64
	ahead    *Event // the first event, read by NewTextReader
	err      error  // the final error, once met
}

var _ StackSource = (*TextReader)(nil)

// NewTextReader returns a TextReader over r; name is used in errors. It
// reads the lines up to the first event (the header line, stack lines,
// comments), so that Header is known, and returns their *SyntaxError. A
// NUL byte and a line longer than MaxLineBytes are *SyntaxErrors too.
func NewTextReader(r io.Reader, name string) (*TextReader, error) {
	// A LineReader refuses NUL bytes and overlong lines; one the caller
	// passes (to check the last line afterwards) is not wrapped again.
	lr, ok := r.(*LineReader)
	if !ok {
		lr = NewLineReader(r, name)
	}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 64*1024), MaxLineBytes+1)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		// The line that a NUL byte or the line limit cut is not read:
		// the LineReader's error is reported instead.
		if err := lr.Err(); atEOF && err != nil && bytes.IndexByte(data, '\n') < 0 {
			return 0, nil, err
		}
		return bufio.ScanLines(data, atEOF)
	})
	t := &TextReader{name: name, sc: sc, h: Header{Version: Version, Source: "text"}, st: NewStacks(), stackIDs: map[uint64]uint32{}, lastTime: -1}
	ev, err := t.next(true)
	switch {
	case err == nil:
		t.ahead = &ev
	case err == io.EOF:
		t.err = io.EOF
	default:
		t.err = err
		return t, err
	}
	return t, nil
}

// Header returns the trace's header: Source "text" unless its header line
// says otherwise.
func (t *TextReader) Header() Header { return t.h }

// Stacks returns the stack table of the stack lines read so far, which the
// Stack ids of the events returned name: never nil (empty for a trace
// without stack lines), the same table from the start, filled as the
// lines are read.
func (t *TextReader) Stacks() *Stacks { return t.st }

// Next returns the next event, io.EOF after the last, or a *SyntaxError,
// which is final.
func (t *TextReader) Next() (Event, error) {
	if t.ahead != nil {
		ev := *t.ahead
		t.ahead = nil
		return ev, nil
	}
	if t.err != nil {
		return Event{}, t.err
	}
	ev, err := t.next(false)
	if err != nil {
		t.err = err
	}
	return ev, err
}

// next reads lines up to the next event and returns it; first says no
// event was read yet, so that a header line is allowed.
func (t *TextReader) next(first bool) (Event, error) {
	name := t.name
	for t.sc.Scan() {
		t.line++
		line := t.line
		fields, err := splitFields(t.sc.Text())
		if err != nil {
			return Event{}, &SyntaxError{name, line, err.Error()}
		}
		if len(fields) == 0 {
			continue
		}
		if fields[0].hasValue {
			return Event{}, &SyntaxError{name, line, fmt.Sprintf("line starts with %q, not an op", fields[0])}
		}
		if fields[0].key == "header" {
			if !first {
				return Event{}, &SyntaxError{name, line, "header after the first event"}
			}
			if err := parseHeaderFields(&t.h, fields[1:]); err != nil {
				return Event{}, &SyntaxError{name, line, err.Error()}
			}
			continue
		}
		if fields[0].key == "stack" {
			if err := parseStack(t.st, t.stackIDs, fields[1:]); err != nil {
				return Event{}, &SyntaxError{name, line, err.Error()}
			}
			continue
		}
		op, ok := ParseOp(fields[0].key)
		if !ok {
			return Event{}, &SyntaxError{name, line, fmt.Sprintf("unknown op %q", fields[0].key)}
		}
		ev := Event{Op: op, Time: t.lastTime + 1}
		for _, f := range fields[1:] {
			if !f.hasValue {
				return Event{}, &SyntaxError{name, line, fmt.Sprintf("field %q is not key=value", f.key)}
			}
			if f.key == "stack" {
				n, err := parseNumber(f.value)
				id, ok := t.stackIDs[n]
				if err != nil || !ok {
					return Event{}, &SyntaxError{name, line, fmt.Sprintf("stack=%q: no stack line gives that id before", f.value)}
				}
				ev.Stack = id
				continue
			}
			if err := setEventField(&ev, f.key, f.value); err != nil {
				return Event{}, &SyntaxError{name, line, err.Error()}
			}
		}
		t.lastTime = ev.Time
		return ev, nil
	}
	if err := t.sc.Err(); err != nil {
		if se, ok := err.(*SyntaxError); ok {
			return Event{}, se
		}
		return Event{}, &SyntaxError{name, t.line + 1, err.Error()}
	}
	return Event{}, io.EOF
}

// parseStack reads the fields of a stack line into st and records the
// text's id for it in ids.
func parseStack(st *Stacks, ids map[uint64]uint32, fields []field) error {
	var id uint64
	var frames []Frame
	for _, f := range fields {
		if !f.hasValue {
			return fmt.Errorf("field %q is not key=value", f.key)
		}
		switch f.key {
		case "id":
			n, err := parseNumber(f.value)
			if err != nil || n == 0 {
				return fmt.Errorf("id=%q: want a number above 0", f.value)
			}
			id = n
		case "frame":
			fr, ok := ParseFrame(f.value)
			if !ok {
				return fmt.Errorf("frame=%q: want FILE:LINE:NAME", f.value)
			}
			frames = append(frames, fr)
		default:
			return fmt.Errorf("unknown stack field %q", f.key)
		}
	}
	switch {
	case id == 0:
		return fmt.Errorf("a stack without an id")
	case len(frames) == 0:
		return fmt.Errorf("stack %d has no frame", id)
	}
	if _, dup := ids[id]; dup {
		return fmt.Errorf("stack %d is given twice", id)
	}
	ids[id] = st.AddFrames(frames)
	return nil
}

func parseHeaderFields(h *Header, fields []field) error {
	for _, f := range fields {
		k, v := f.key, f.value
		if !f.hasValue {
			return fmt.Errorf("header field %q is not key=value", k)
		}
		switch {
		case k == "source":
			h.Source = v
		case k == "device":
			h.Device = v
		case k == "device_memory":
			n, err := parseNumber(v)
			if err != nil {
				return fmt.Errorf("device_memory=%q: %v", v, err)
			}
			h.DeviceMemory = n
		case strings.HasPrefix(k, "setting."):
			if h.Settings == nil {
				h.Settings = map[string]string{}
			}
			h.Settings[strings.TrimPrefix(k, "setting.")] = v
		case strings.HasPrefix(k, "meta."):
			if h.Metadata == nil {
				h.Metadata = map[string]string{}
			}
			h.Metadata[strings.TrimPrefix(k, "meta.")] = v
		default:
			return fmt.Errorf("unknown header field %q", k)
		}
	}
	return nil
}

func setEventField(ev *Event, k, v string) error {
	var err error
	switch k {
	case "addr", "id", "event":
		ev.Addr, err = parseNumber(v)
	case "size":
		ev.Size, err = parseNumber(v)
	case "stream":
		ev.Stream, err = parseNumber(v)
	case "thread":
		ev.Thread, err = parseNumber(v)
	case "restore":
		if v != "0" && v != "1" {
			return fmt.Errorf("restore=%q: want 0 or 1", v)
		}
		ev.Restore = v == "1"
	case "pool":
		var n uint64
		if n, err = parseNumber(v); err == nil && n > math.MaxUint32 {
			return fmt.Errorf("pool=%q: above %d", v, uint32(math.MaxUint32))
		}
		ev.Pool = uint32(n)
	case "t":
		var n int64
		n, err = strconv.ParseInt(v, 0, 64)
		ev.Time = n
	case "kind":
		kd, ok := ParseKind(v)
		if !ok {
			return fmt.Errorf("unknown kind %q", v)
		}
		ev.Kind = kd
	case "label":
		ev.Label = v
	default:
		return fmt.Errorf("unknown field %q", k)
	}
	if err != nil {
		return fmt.Errorf("%s=%q: bad number", k, v)
	}
	return nil
}

var textSuffixes = []struct {
	s string
	m uint64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}

func parseNumber(v string) (uint64, error) {
	m := uint64(1)
	for _, sf := range textSuffixes {
		if strings.HasSuffix(v, sf.s) {
			v, m = strings.TrimSuffix(v, sf.s), sf.m
			break
		}
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		return 0, err
	}
	if m > 1 && n > ^uint64(0)/m {
		return 0, fmt.Errorf("overflows 64 bits")
	}
	return n * m, nil
}

// splitFields splits a line into space-separated fields, dropping a #
// comment. A field is a bare word or key=value; either side may hold
// double-quoted parts (Go syntax), which keep spaces, '=' and '#'. Each
// field comes back with its key and value unquoted, the key empty for a
// bare word.
func splitFields(line string) ([]field, error) {
	var out []field
	i := 0
	for i < len(line) {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
			i++
		}
		if i >= len(line) || line[i] == '#' {
			break
		}
		var f field
		var b strings.Builder
		for i < len(line) && line[i] != ' ' && line[i] != '\t' && line[i] != '\r' {
			switch {
			case line[i] == '"':
				q, err := strconv.QuotedPrefix(line[i:])
				if err != nil {
					return nil, fmt.Errorf("bad quoted value at column %d", i+1)
				}
				u, _ := strconv.Unquote(q)
				b.WriteString(u)
				i += len(q)
				continue
			case line[i] == '=' && !f.hasValue:
				f.key, f.hasValue = b.String(), true
				b.Reset()
			default:
				b.WriteByte(line[i])
			}
			i++
		}
		if f.hasValue {
			f.value = b.String()
		} else {
			f.key = b.String()
		}
		out = append(out, f)
	}
	return out, nil
}

// field is one field of a text-form line.
type field struct {
	key, value string
	hasValue   bool
}

func (f field) String() string {
	if f.hasValue {
		return f.key + "=" + f.value
	}
	return f.key
}

// WriteText writes h and evs in the text form that ParseText reads.
// Events with a stack need WriteTextStacks.
func WriteText(w io.Writer, h Header, evs []Event) error {
	return WriteTextStacks(w, h, evs, nil)
}

// WriteTextStacks writes h and evs in the text form, with a stack line
// for each stack of st before the first event that names it.
func WriteTextStacks(w io.Writer, h Header, evs []Event, st *Stacks) error {
	bw := bufio.NewWriter(w)
	writeTextHeader(bw, h)
	written := 0
	for _, ev := range evs {
		writeTextStacks(bw, st, ev, &written)
		bw.WriteString(FormatText(ev))
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// writeTextStacks writes the stack lines of the stacks of st from
// *written+1 up to ev's, if ev names one not written yet.
func writeTextStacks(bw *bufio.Writer, st *Stacks, ev Event, written *int) {
	for int(ev.Stack) > *written && *written < st.Len() {
		*written++
		bw.WriteString(formatStack(st, uint32(*written)))
		bw.WriteByte('\n')
	}
}

// WriteTextSource writes the header and events of src in the text form,
// one event at a time, with the stack lines of its stacks (StackSource),
// and returns the number of events written and the first error of src or
// w.
func WriteTextSource(w io.Writer, src Source) (n int64, err error) {
	bw := bufio.NewWriter(w)
	writeTextHeader(bw, src.Header())
	written := 0
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return n, bw.Flush()
		}
		if err != nil {
			return n, err
		}
		writeTextStacks(bw, StacksOf(src), ev, &written)
		bw.WriteString(FormatText(ev))
		if err := bw.WriteByte('\n'); err != nil {
			return n, err
		}
		n++
	}
}

// writeTextHeader writes h's line of the text form.
func writeTextHeader(bw *bufio.Writer, h Header) {
	fmt.Fprintf(bw, "header source=%s", quoteIfNeeded(h.Source))
	if h.Device != "" {
		fmt.Fprintf(bw, " device=%s", quoteIfNeeded(h.Device))
	}
	if h.DeviceMemory != 0 {
		fmt.Fprintf(bw, " device_memory=%d", h.DeviceMemory)
	}
	for _, k := range sortedKeys(h.Settings) {
		fmt.Fprintf(bw, " setting.%s=%s", quoteIfNeeded(k), quoteIfNeeded(h.Settings[k]))
	}
	for _, k := range sortedKeys(h.Metadata) {
		fmt.Fprintf(bw, " meta.%s=%s", quoteIfNeeded(k), quoteIfNeeded(h.Metadata[k]))
	}
	bw.WriteByte('\n')
}

// FormatText returns ev as one line of the text form, without a newline.
func FormatText(ev Event) string {
	var b strings.Builder
	b.WriteString(ev.Op.String())
	switch ev.Op {
	case OpEventRecord, OpStreamWaitEvent, OpEventSync:
		fmt.Fprintf(&b, " event=%d", ev.Addr)
	default:
		if ev.Addr != 0 {
			fmt.Fprintf(&b, " addr=%#x", ev.Addr)
		}
	}
	if ev.Size != 0 {
		fmt.Fprintf(&b, " size=%d", ev.Size)
	}
	if ev.Stream != 0 {
		fmt.Fprintf(&b, " stream=%#x", ev.Stream)
	}
	if ev.Kind != KindDevice {
		fmt.Fprintf(&b, " kind=%s", ev.Kind)
	}
	fmt.Fprintf(&b, " t=%d", ev.Time)
	if ev.Thread != 0 {
		fmt.Fprintf(&b, " thread=%d", ev.Thread)
	}
	if ev.Pool != 0 {
		fmt.Fprintf(&b, " pool=%d", ev.Pool)
	}
	if ev.Restore {
		b.WriteString(" restore=1")
	}
	if ev.Label != "" {
		fmt.Fprintf(&b, " label=%s", quoteIfNeeded(ev.Label))
	}
	if ev.Stack != 0 {
		fmt.Fprintf(&b, " stack=%d", ev.Stack)
	}
	return b.String()
}

func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\"#=\n\r") || !strconv.CanBackquote(s) {
		return strconv.Quote(s)
	}
	return s
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// SliceSource is a Source over events held in memory.
type SliceSource struct {
	h      Header
	evs    []Event
	i      int
	stacks *Stacks
}

// NewSliceSource returns a Source that yields evs in order after header h.
func NewSliceSource(h Header, evs []Event) *SliceSource { return &SliceSource{h: h, evs: evs} }

// WithStacks sets the stack table that the events' stacks name and
// returns s.
func (s *SliceSource) WithStacks(st *Stacks) *SliceSource {
	s.stacks = st
	return s
}

// Stacks returns the table given to WithStacks, nil if none.
func (s *SliceSource) Stacks() *Stacks { return s.stacks }

// Header returns the header given to NewSliceSource.
func (s *SliceSource) Header() Header { return s.h }

// Reopen returns a SliceSource over the same events from the first, for a
// second pass that copies nothing.
func (s *SliceSource) Reopen() (Source, error) {
	return NewSliceSource(s.h, s.evs).WithStacks(s.stacks), nil
}

// Rest returns the events not yet read, which count as read from now on.
// The slice is the source's own.
func (s *SliceSource) Rest() []Event {
	rest := s.evs[s.i:]
	s.i = len(s.evs)
	return rest
}

// Next returns the next event, or io.EOF after the last.
func (s *SliceSource) Next() (Event, error) {
	if s.i >= len(s.evs) {
		return Event{}, io.EOF
	}
	s.i++
	return s.evs[s.i-1], nil
}
