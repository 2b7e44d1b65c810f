// Package minimalloc imports the static allocation problems of
// google/minimalloc (the CSV files of its benchmarks) as traces.
//
// A problem is a CSV file whose first line names the columns, in any order:
//
//	id,lower,upper,size
//	0,995328,1000448,656384
//
// Each row is a buffer: its id (any text), a lifetime over the half-open
// interval [lower, upper) of abstract time, and a size in bytes. As
// MiniMalloc's reader does, the columns may also be named buffer or
// buffer_id (for id), begin or start (for lower), and end, an inclusive
// upper bound read as end+1; an alignment column is accepted and ignored
// (a trace has no per-allocation alignment), an offset column (a solution)
// is ignored, and a gaps column must be empty (a buffer that is not live
// over part of its lifetime but keeps its offset is no trace of mallocs
// and frees). Empty lines are skipped.
//
// As a trace, each buffer is a malloc at time lower and a free at time
// upper (both on stream 0, of device memory); the events are in time
// order, frees before mallocs at equal times (a buffer ending at t and one
// starting at t may share memory), each group in file order. A buffer's
// trace address is its 1-based row number (the first buffer is 1); times
// are the problem's own, taken as nanoseconds. A file name ending in
// .NUMBER.csv (A.1048576.csv) names the capacity the problem was posed
// with, kept in the header's metadata as "capacity".
//
// The planners need a problem's whole list of buffers, so a problem is
// held in memory, not streamed: Import keeps 32 bytes a buffer (its
// bounds, its size and its place in the two time orders; not its id), and
// a problem may have at most MaxBuffers buffers, far more than MiniMalloc's
// own benchmarks (the challenging set A to K has at most 454): a larger
// file is refused, in one line naming the file, the line and the cap,
// before it is read further. A line may be at most trace.MaxLineBytes long
// when read through a trace.LineReader (tracefile.Open).
package minimalloc

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// ErrNotProblem is wrapped by the error of Read and Import for input whose
// first line is not a MiniMalloc header.
var ErrNotProblem = errors.New("not a MiniMalloc problem (no id,lower,upper,size header)")

// Buffer is one row of a problem.
type Buffer struct {
	// ID is the buffer's id as written.
	ID string
	// Lower and Upper bound its lifetime, [Lower, Upper).
	Lower, Upper int64
	// Size is its size in bytes.
	Size uint64
	// Line is the 1-based line of the file it was read from.
	Line int
}

// column aliases, as MiniMalloc's converter reads them.
var aliases = map[string]string{
	"id": "id", "buffer": "id", "buffer_id": "id",
	"lower": "lower", "begin": "lower", "start": "lower",
	"upper": "upper", "end": "end",
	"size": "size", "alignment": "alignment", "gaps": "gaps", "offset": "offset",
}

// Detect reports whether head, the first bytes of a file, start with a
// MiniMalloc header: comma-separated column names among which are an id,
// a lower and an upper bound (or end) and a size.
func Detect(head []byte) bool {
	head = bytes.TrimPrefix(head, []byte("\xef\xbb\xbf"))
	line, _, _ := bytes.Cut(head, []byte("\n"))
	cols, err := columns(strings.Split(string(bytes.TrimSpace(line)), ","))
	return err == nil && cols != nil
}

// columns maps the header fields to their column names; it returns an
// error for a duplicate or missing column.
func columns(fields []string) (map[string]int, error) {
	cols := map[string]int{}
	for i, f := range fields {
		name, ok := aliases[strings.ToLower(strings.TrimSpace(f))]
		if !ok {
			return nil, fmt.Errorf("unknown column %q", strings.TrimSpace(f))
		}
		if _, dup := cols[name]; dup || (name == "end" && hasKey(cols, "upper")) || (name == "upper" && hasKey(cols, "end")) {
			return nil, fmt.Errorf("duplicate column %q", strings.TrimSpace(f))
		}
		cols[name] = i
	}
	for _, need := range []string{"id", "lower", "size"} {
		if !hasKey(cols, need) {
			return nil, fmt.Errorf("no %s column", need)
		}
	}
	if !hasKey(cols, "upper") && !hasKey(cols, "end") {
		return nil, fmt.Errorf("no upper column")
	}
	return cols, nil
}

func hasKey(m map[string]int, k string) bool {
	_, ok := m[k]
	return ok
}

// MaxBuffers is the most buffers a problem may have (rows of its CSV):
// 1,000,000, where MiniMalloc's own benchmarks have at most 454, so that
// a problem is held in 32 MB by Import (and about 100 MB by Read, which
// keeps the ids).
const MaxBuffers = 1_000_000

// Read reads the buffers of the problem in r, in file order; name is used
// in errors. Errors in rows are *trace.SyntaxError values naming the line,
// among which a problem of more than MaxBuffers buffers.
func Read(r io.Reader, name string) ([]Buffer, error) {
	var bufs []Buffer
	err := read(r, name, func(b Buffer) { bufs = append(bufs, b) })
	if err != nil {
		return nil, err
	}
	return bufs, nil
}

// read reads the problem in r and calls add with each buffer, in file
// order.
func read(r io.Reader, name string, add func(Buffer)) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	syntax := func(line int, format string, args ...any) error {
		return &trace.SyntaxError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	head, err := cr.Read()
	if err != nil {
		var se *trace.SyntaxError
		switch {
		case err == io.EOF:
			return fmt.Errorf("%s: %w: empty file", name, ErrNotProblem)
		case errors.As(err, &se):
			return err // a trace.LineReader's, naming the file already
		}
		return fmt.Errorf("%s: %w: %v", name, ErrNotProblem, err)
	}
	if len(head) > 0 {
		head[0] = strings.TrimPrefix(head[0], "\xef\xbb\xbf")
	}
	cols, err := columns(head)
	if err != nil {
		return fmt.Errorf("%s: %w: %v", name, ErrNotProblem, err)
	}
	ncol := len(head)
	n := 0
	for {
		row, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return syntax(pe.Line, "%v", pe.Err)
			}
			var se *trace.SyntaxError
			if errors.As(err, &se) {
				return err // a trace.LineReader's, naming the file already
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		if len(row) == 1 && strings.TrimSpace(row[0]) == "" {
			continue
		}
		if n == MaxBuffers {
			return syntax(line, "the problem has more than %d buffers (the limit; MiniMalloc's own benchmarks have at most 454)", MaxBuffers)
		}
		if len(row) != ncol {
			return syntax(line, "%d fields, want %d as in the header", len(row), ncol)
		}
		field := func(c string) string { return strings.TrimSpace(row[cols[c]]) }
		b := Buffer{ID: field("id"), Line: line}
		if b.Lower, err = strconv.ParseInt(field("lower"), 10, 64); err != nil {
			return syntax(line, "buffer %q: lower %q: not an integer", b.ID, field("lower"))
		}
		if hasKey(cols, "end") {
			end, err := strconv.ParseInt(field("end"), 10, 64)
			if err != nil || end == 1<<63-1 {
				return syntax(line, "buffer %q: end %q: not an integer", b.ID, field("end"))
			}
			b.Upper = end + 1
		} else if b.Upper, err = strconv.ParseInt(field("upper"), 10, 64); err != nil {
			return syntax(line, "buffer %q: upper %q: not an integer", b.ID, field("upper"))
		}
		if b.Size, err = strconv.ParseUint(field("size"), 10, 64); err != nil {
			return syntax(line, "buffer %q: size %q: not a number of bytes", b.ID, field("size"))
		}
		if hasKey(cols, "alignment") {
			if a, err := strconv.ParseUint(field("alignment"), 10, 64); err != nil || a == 0 {
				return syntax(line, "buffer %q: alignment %q: not a positive integer", b.ID, field("alignment"))
			}
		}
		if hasKey(cols, "gaps") && field("gaps") != "" {
			return syntax(line, "buffer %q: gaps %q: buffers with gaps in their lifetime are not supported", b.ID, field("gaps"))
		}
		if b.Upper <= b.Lower {
			return syntax(line, "buffer %q: empty lifetime [%d, %d)", b.ID, b.Lower, b.Upper)
		}
		add(b)
		n++
	}
	return nil
}

// Events returns the trace of bufs: for the buffer at index i, a malloc of
// address i+1 at its lower bound and a free at its upper bound, in time
// order, frees before mallocs at equal times, each group in the order of
// bufs.
func Events(bufs []Buffer) []trace.Event {
	evs := make([]trace.Event, 0, 2*len(bufs))
	for i, b := range bufs {
		addr := uint64(i + 1)
		evs = append(evs,
			trace.Event{Op: trace.OpMalloc, Time: b.Lower, Addr: addr, Size: b.Size},
			trace.Event{Op: trace.OpFree, Time: b.Upper, Addr: addr, Size: b.Size})
	}
	slices.SortStableFunc(evs, func(x, y trace.Event) int {
		if c := cmp.Compare(x.Time, y.Time); c != 0 {
			return c
		}
		// OpFree sorts before OpMalloc; within an op, file order (the
		// sort is stable and the events were appended in file order).
		return cmp.Compare(opRank(x.Op), opRank(y.Op))
	})
	return evs
}

func opRank(o trace.Op) int {
	if o == trace.OpFree {
		return 0
	}
	return 1
}

// Import reads the problem in r (name is the file's path, used in errors
// and for the capacity in its name) and returns it as a trace: Source
// "minimalloc", with the number of buffers and, when the name gives it,
// the capacity in the metadata, and the events of Events. It holds 32
// bytes a buffer; its errors are Read's.
func Import(r io.Reader, name string) (*Source, error) {
	var rows []row
	err := read(r, name, func(b Buffer) { rows = append(rows, row{b.Lower, b.Upper, b.Size}) })
	if err != nil {
		return nil, err
	}
	rows = slices.Clip(rows)
	h := trace.Header{Version: trace.Version, Source: "minimalloc", Metadata: map[string]string{
		"format":  "MiniMalloc problem CSV (id,lower,upper,size)",
		"buffers": strconv.Itoa(len(rows)),
		"addr":    "1-based row number of the buffer",
		"time":    "logical", // lower and upper are steps, not nanoseconds
	}}
	if c, ok := capacityFromName(name); ok {
		h.Metadata["capacity"] = strconv.FormatUint(c, 10)
	}
	// The buffers in the order of their mallocs and of their frees, each
	// stable (file order at equal times).
	mallocs, frees := make([]uint32, len(rows)), make([]uint32, len(rows))
	for i := range rows {
		mallocs[i], frees[i] = uint32(i), uint32(i)
	}
	slices.SortStableFunc(mallocs, func(x, y uint32) int { return cmp.Compare(rows[x].lower, rows[y].lower) })
	slices.SortStableFunc(frees, func(x, y uint32) int { return cmp.Compare(rows[x].upper, rows[y].upper) })
	return &Source{h: h, rows: rows, mallocs: mallocs, frees: frees}, nil
}

// row is a buffer as Import keeps it.
type row struct {
	lower, upper int64
	size         uint64
}

// Source is an imported problem: its events (those of Events) made as
// they are read from the buffers held.
type Source struct {
	h              trace.Header
	rows           []row
	mallocs, frees []uint32 // rows by lower and by upper bound
	m, f           int      // the next of each
}

var _ trace.Source = (*Source)(nil)

// Header returns the trace header: Source "minimalloc", Metadata as Import
// says.
func (s *Source) Header() trace.Header { return s.h }

// Next returns the next event: the earlier of the next free and the next
// malloc, the free at equal times; io.EOF after the last.
func (s *Source) Next() (trace.Event, error) {
	switch {
	case s.f < len(s.frees) && (s.m == len(s.mallocs) || s.rows[s.frees[s.f]].upper <= s.rows[s.mallocs[s.m]].lower):
		i := s.frees[s.f]
		s.f++
		return trace.Event{Op: trace.OpFree, Time: s.rows[i].upper, Addr: uint64(i) + 1, Size: s.rows[i].size}, nil
	case s.m < len(s.mallocs):
		i := s.mallocs[s.m]
		s.m++
		return trace.Event{Op: trace.OpMalloc, Time: s.rows[i].lower, Addr: uint64(i) + 1, Size: s.rows[i].size}, nil
	}
	return trace.Event{}, io.EOF
}

// Reopen returns a Source over the same problem from its first event,
// for a second pass that copies nothing.
func (s *Source) Reopen() (trace.Source, error) {
	return &Source{h: s.h, rows: s.rows, mallocs: s.mallocs, frees: s.frees}, nil
}

// capacityFromName returns the capacity in a file name NAME.CAPACITY.csv.
func capacityFromName(path string) (uint64, bool) {
	base := strings.TrimSuffix(filepath.Base(path), ".csv")
	if base == filepath.Base(path) {
		return 0, false
	}
	dot := strings.LastIndexByte(base, '.')
	if dot < 0 {
		return 0, false
	}
	c, err := strconv.ParseUint(base[dot+1:], 10, 64)
	return c, err == nil && c > 0
}
