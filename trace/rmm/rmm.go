// Package rmm imports the CSV logs of RAPIDS RMM's logging_resource_adaptor
// (rmm/mr/logging_resource_adaptor.hpp) as trace events, streaming.
//
// The log starts with the header line Thread,Time,Action,Pointer,Size,Stream
// (columns are found by name; extra columns are ignored) and then has one
// row per call, in global order:
//
//	140202007955264,23:59:59.999500,allocate,0x7f8418000000,4000,0x0
//
//	allocate          -> trace.OpMalloc (Addr = Pointer, Size, Stream)
//	allocate failure  -> trace.OpMallocFailed (Size, Stream; Pointer is (nil))
//	free              -> trace.OpFree (Addr, Size, Stream)
//
// ("deallocate" is read as free.) Thread is the logging thread's id,
// decimal (hex with 0x). Pointer and Stream are hex, with or without 0x;
// "(nil)" is 0. Time is the time of day, HH:MM:SS.ffffff, with no date:
// Import keeps it as nanoseconds since the midnight that began the log and
// adds a day whenever the time of day goes back by more than 12 hours (the
// log crossed midnight); smaller steps back, from threads logging out of
// order, are kept as they are, for Validate to report. A Time of plain
// seconds (1634567890.123456, as some RMM versions document it) is taken
// as seconds since the Unix epoch.
package rmm

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// Header is the first line of an RMM log.
const Header = "Thread,Time,Action,Pointer,Size,Stream"

// ErrNotLog is wrapped by the error of Import for input that does not start
// with an RMM log header.
var ErrNotLog = errors.New("not an RMM log (no Thread,Time,Action,Pointer,Size,Stream header)")

var columns = []string{"Thread", "Time", "Action", "Pointer", "Size", "Stream"}

const (
	day     = 24 * 3600 * int64(1e9)
	halfDay = day / 2
)

// Detect reports whether head, the first bytes of a file, start with the
// header of an RMM log.
func Detect(head []byte) bool {
	head = bytes.TrimPrefix(head, []byte("\xef\xbb\xbf"))
	head = bytes.TrimLeft(head, " \t\r\n")
	line, _, _ := bytes.Cut(head, []byte("\n"))
	line = bytes.TrimSpace(line)
	return bytes.HasPrefix(line, []byte("Thread,")) && bytes.Contains(line, []byte(",Action"))
}

// Source reads an RMM log one row at a time.
type Source struct {
	name string
	cr   *csv.Reader
	col  [6]int // index of each of columns in a row
	ncol int
	h    trace.Header
	days int64
	prev int64 // time of day of the previous row, -1 before the first
	err  error
	rows int64
}

var _ trace.Source = (*Source)(nil)

// Import reads the header of the RMM log in r; name is used in errors. The
// returned Source's Next returns *trace.SyntaxError values for bad rows.
func Import(r io.Reader, name string) (*Source, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if b, _ := br.Peek(3); bytes.Equal(b, []byte("\xef\xbb\xbf")) {
		br.Discard(3)
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	cr.TrimLeadingSpace = true
	s := &Source{name: name, cr: cr, prev: -1, h: trace.Header{Source: "rmm", Metadata: map[string]string{
		"format": "RMM logging_resource_adaptor CSV",
	}}}
	head, err := cr.Read()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%s: %w: empty file", name, ErrNotLog)
		}
		return nil, fmt.Errorf("%s: %w: %v", name, ErrNotLog, err)
	}
	for i := range s.col {
		s.col[i] = -1
	}
	for i, f := range head {
		for k, c := range columns {
			if strings.EqualFold(strings.TrimSpace(f), c) && s.col[k] < 0 {
				s.col[k] = i
			}
		}
	}
	for k, c := range columns {
		if s.col[k] < 0 {
			return nil, fmt.Errorf("%s: %w: line 1 has no %s column", name, ErrNotLog, c)
		}
		s.ncol = max(s.ncol, s.col[k]+1)
	}
	return s, nil
}

// Header returns the trace header: Source "rmm".
func (s *Source) Header() trace.Header { return s.h }

func (s *Source) syntax(line int, format string, args ...any) error {
	return &trace.SyntaxError{File: s.name, Line: line, Msg: fmt.Sprintf(format, args...)}
}

// Next returns the event of the next row, io.EOF after the last, or a
// *trace.SyntaxError (final) for a row that cannot be read.
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

func (s *Source) next() (trace.Event, error) {
	var row []string
	for {
		var err error
		row, err = s.cr.Read()
		if err == io.EOF {
			return trace.Event{}, io.EOF
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return trace.Event{}, s.syntax(pe.Line, "%v", pe.Err)
			}
			return trace.Event{}, fmt.Errorf("%s: %w", s.name, err)
		}
		if len(row) == 1 && strings.TrimSpace(row[0]) == "" {
			continue
		}
		break
	}
	line, _ := s.cr.FieldPos(0)
	if len(row) < s.ncol {
		return trace.Event{}, s.syntax(line, "%d fields, want %d (%s)", len(row), s.ncol, Header)
	}
	s.rows++
	field := func(k int) string { return strings.TrimSpace(row[s.col[k]]) }
	var ev trace.Event
	switch a := field(2); a {
	case "allocate":
		ev.Op = trace.OpMalloc
	case "allocate failure":
		ev.Op = trace.OpMallocFailed
	case "free", "deallocate":
		ev.Op = trace.OpFree
	default:
		return ev, s.syntax(line, "unknown action %q (want allocate, allocate failure or free)", a)
	}
	var err error
	if ev.Thread, err = parseThread(field(0)); err != nil {
		return ev, s.syntax(line, "Thread %q: %v", field(0), err)
	}
	if ev.Time, err = s.parseTime(field(1)); err != nil {
		return ev, s.syntax(line, "Time %q: %v", field(1), err)
	}
	if ev.Addr, err = parseHex(field(3)); err != nil {
		return ev, s.syntax(line, "Pointer %q: %v", field(3), err)
	}
	if ev.Size, err = strconv.ParseUint(field(4), 10, 64); err != nil {
		return ev, s.syntax(line, "Size %q: not a decimal number of bytes", field(4))
	}
	if ev.Stream, err = parseHex(field(5)); err != nil {
		return ev, s.syntax(line, "Stream %q: %v", field(5), err)
	}
	if ev.Op == trace.OpMallocFailed {
		ev.Addr = 0
	}
	return ev, nil
}

func parseThread(f string) (uint64, error) {
	if strings.HasPrefix(f, "0x") || strings.HasPrefix(f, "0X") {
		return strconv.ParseUint(f[2:], 16, 64)
	}
	v, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return 0, errors.New("not a thread id")
	}
	return v, nil
}

// parseHex reads a pointer or stream as printed by %p or in hex.
func parseHex(f string) (uint64, error) {
	switch f {
	case "(nil)", "nil", "0", "":
		return 0, nil
	}
	f = strings.TrimPrefix(strings.TrimPrefix(f, "0x"), "0X")
	v, err := strconv.ParseUint(f, 16, 64)
	if err != nil {
		return 0, errors.New("not a hex number")
	}
	return v, nil
}

// parseTime returns a row's time in nanoseconds, counting the midnights
// crossed since the first row.
func (s *Source) parseTime(f string) (int64, error) {
	if !strings.Contains(f, ":") {
		return parseSeconds(f)
	}
	hms, frac, _ := strings.Cut(f, ".")
	parts := strings.Split(hms, ":")
	if len(parts) != 3 {
		return 0, errors.New("want HH:MM:SS.ffffff")
	}
	var v [3]int64
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || (i == 0 && n > 23) || (i > 0 && n > 59) || len(p) > 2 {
			return 0, errors.New("want HH:MM:SS.ffffff")
		}
		v[i] = n
	}
	ns, err := fraction(frac)
	if err != nil {
		return 0, err
	}
	t := ((v[0]*60+v[1])*60+v[2])*1e9 + ns
	if s.prev >= 0 && t < s.prev-halfDay {
		s.days++
	}
	s.prev = t
	return t + s.days*day, nil
}

// fraction returns the nanoseconds of the digits after a decimal point.
func fraction(frac string) (int64, error) {
	if len(frac) > 9 {
		frac = frac[:9]
	}
	var ns int64
	for i := 0; i < 9; i++ {
		ns *= 10
		if i < len(frac) {
			c := frac[i]
			if c < '0' || c > '9' {
				return 0, errors.New("bad fraction of a second")
			}
			ns += int64(c - '0')
		}
	}
	return ns, nil
}

func parseSeconds(f string) (int64, error) {
	whole, frac, _ := strings.Cut(f, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec < 0 || sec > (1<<62)/1_000_000_000 {
		return 0, errors.New("want HH:MM:SS.ffffff or seconds")
	}
	ns, err := fraction(frac)
	if err != nil {
		return 0, err
	}
	return sec*1e9 + ns, nil
}
