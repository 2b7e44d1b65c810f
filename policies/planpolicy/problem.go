package planpolicy

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// Buffer is one buffer of the problem written to the planner: a device
// malloc of the trace with its lifetime [Lower, Upper) in event indices.
type Buffer struct {
	// ID is the buffer's id in the problem: its 0-based number, in the
	// order of the mallocs.
	ID int
	// Lower is the index of its malloc event; Upper that of its free, or
	// the number of events for a buffer never freed, or Lower+1 for a
	// malloc that failed in the source.
	Lower, Upper int64
	// Size is the requested size in bytes.
	Size uint64
}

// Buffers returns the buffers of the trace evs, the events a replay gives
// a Planner (with their indices). It follows the replay's rules for which events reach a
// policy:
//   - a malloc of device memory (KindDevice, KindAsync) whose address is
//     not live is a buffer, from its event to the free of its address, or
//     to the end of the trace (upper = len(evs)) when there is none;
//   - a malloc of an address already live (of any kind) reaches no policy
//     and is no buffer: the replay reports it as an anomaly;
//   - a free of an address not live is ignored, as the replay ignores it;
//     a free_requested ends nothing (the block is the allocator's until its
//     free);
//   - a malloc that failed in the source (malloc_failed) of device memory
//     is tried by the replay as a malloc freed at once: a buffer of one
//     event, [i, i+1);
//   - pinned and managed (host) memory is no buffer, but its address is
//     live until its free;
//   - a malloc of 0 bytes, or of more than trace.MaxSize bytes, is a call
//     with no buffer (the policy answers a null block, or an OOM).
func Buffers(evs []trace.Event) []Buffer {
	bufs, _, _ := buffers(evs)
	return bufs
}

// buffers is Buffers, with the malloc calls the replay will make of the
// policy (each with its buffer) and the plan's Stats but Peak and Elapsed.
func buffers(evs []trace.Event) ([]Buffer, []call, Stats) {
	var (
		bufs  []Buffer
		calls []call
		st    Stats
	)
	live := map[uint64]int{} // address -> buffer, -1 for none
	add := func(size uint64, lower, upper int64) int {
		if size == 0 || size > trace.MaxSize {
			calls = append(calls, call{size: size, buf: -1})
			return -1
		}
		b := len(bufs)
		bufs = append(bufs, Buffer{ID: b, Lower: lower, Upper: upper, Size: size})
		calls = append(calls, call{size: size, buf: b})
		return b
	}
	n := int64(len(evs))
	for i := range evs {
		ev := &evs[i]
		t := int64(i)
		switch ev.Op {
		case trace.OpMalloc:
			if _, dup := live[ev.Addr]; dup {
				continue
			}
			if !ev.Kind.OnDevice() {
				live[ev.Addr] = -1
				continue
			}
			live[ev.Addr] = add(ev.Size, t, n)
		case trace.OpMallocFailed:
			if ev.Kind.OnDevice() {
				if add(ev.Size, t, t+1) >= 0 {
					st.Failed++
				}
			}
		case trace.OpFree:
			b, ok := live[ev.Addr]
			if !ok {
				continue
			}
			delete(live, ev.Addr)
			if b >= 0 {
				bufs[b].Upper = t
			}
		}
	}
	for _, b := range live {
		if b >= 0 {
			st.NeverFreed++
		}
	}
	st.Buffers = len(bufs)
	return bufs, calls, st
}

// WriteProblem writes bufs as a MiniMalloc problem: the header
// id,lower,upper,size and one row per buffer, in order, all decimal, lines
// ending in "\n". Read back with package minimalloc, the problem is a
// trace whose mallocs and frees come in the order of the trace's own.
func WriteProblem(w io.Writer, bufs []Buffer) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("id,lower,upper,size\n")
	var line []byte
	for _, b := range bufs {
		line = strconv.AppendInt(line[:0], int64(b.ID), 10)
		line = append(line, ',')
		line = strconv.AppendInt(line, b.Lower, 10)
		line = append(line, ',')
		line = strconv.AppendInt(line, b.Upper, 10)
		line = append(line, ',')
		line = strconv.AppendUint(line, b.Size, 10)
		line = append(line, '\n')
		bw.Write(line)
	}
	return bw.Flush()
}

// solutionColumns maps the column names a solution may use, as MiniMalloc's
// reader names them, to the column each stands for; other columns are
// ignored.
var solutionColumns = map[string]string{
	"id": "id", "buffer": "id", "buffer_id": "id",
	"lower": "lower", "begin": "lower", "start": "lower",
	"upper": "upper", "end": "end",
	"size": "size", "offset": "offset",
}

// ErrNoSolution is wrapped by the error of ReadSolution for a file that is
// not a solution: empty, or without an id, size or offset column.
var ErrNoSolution = errors.New("not a solution (no id,...,size,offset header)")

// ReadSolution reads the planner's solution from r (name is used in
// errors) and returns the offset of each of bufs, by index: a CSV file
// whose header names an id, a size and an offset column, and may name
// lower and upper (or end, inclusive) columns, as MiniMalloc writes its
// solutions (id,lower,upper,size,offset); other columns are ignored, rows
// may come in any order. It returns an error naming the id for an id not
// in bufs or given twice, a buffer with no row, a size or a lifetime not
// the buffer's, or an offset that is not an unsigned integer.
func ReadSolution(r io.Reader, name string, bufs []Buffer) ([]uint64, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: %w: empty file", name, ErrNoSolution)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %v", name, ErrNoSolution, err)
	}
	cols := map[string]int{}
	for i, f := range head {
		f = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(f, "\xef\xbb\xbf")))
		if c, ok := solutionColumns[f]; ok {
			if _, dup := cols[c]; dup {
				return nil, fmt.Errorf("%s: %w: column %q twice", name, ErrNoSolution, f)
			}
			cols[c] = i
		}
	}
	for _, need := range []string{"id", "size", "offset"} {
		if _, ok := cols[need]; !ok {
			return nil, fmt.Errorf("%s: %w: no %s column in %q", name, ErrNoSolution, need, strings.Join(head, ","))
		}
	}
	offs := make([]uint64, len(bufs))
	got := make([]int, len(bufs)) // line of each buffer's row, 0 for none
	for {
		row, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		line, _ := cr.FieldPos(0)
		if len(row) == 1 && strings.TrimSpace(row[0]) == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return &trace.SyntaxError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
		}
		field := func(c string) (string, bool) {
			i, ok := cols[c]
			if !ok || i >= len(row) {
				return "", false
			}
			return strings.TrimSpace(row[i]), true
		}
		id, _ := field("id")
		k, err := strconv.Atoi(id)
		if err != nil || k < 0 || k >= len(bufs) || strconv.Itoa(k) != id {
			return nil, bad("id %q: no such buffer in the problem (ids 0 to %d)", id, len(bufs)-1)
		}
		if got[k] != 0 {
			return nil, bad("buffer %d: a second offset (the first on line %d)", k, got[k])
		}
		got[k] = line
		b := bufs[k]
		if v, _ := field("size"); v != strconv.FormatUint(b.Size, 10) {
			return nil, bad("buffer %d: size %q, the problem's is %d", k, v, b.Size)
		}
		if v, ok := field("lower"); ok && v != strconv.FormatInt(b.Lower, 10) {
			return nil, bad("buffer %d: lower %q, the problem's is %d", k, v, b.Lower)
		}
		if v, ok := field("upper"); ok && v != strconv.FormatInt(b.Upper, 10) {
			return nil, bad("buffer %d: upper %q, the problem's is %d", k, v, b.Upper)
		}
		if v, ok := field("end"); ok && v != strconv.FormatInt(b.Upper-1, 10) {
			return nil, bad("buffer %d: end %q, the problem's is %d", k, v, b.Upper-1)
		}
		v, ok := field("offset")
		if offs[k], err = strconv.ParseUint(v, 10, 64); !ok || err != nil {
			return nil, bad("buffer %d: offset %q: not an unsigned integer", k, v)
		}
	}
	for k, line := range got {
		if line == 0 {
			return nil, fmt.Errorf("%s: buffer %d (lower %d, upper %d, size %d) has no offset", name, k, bufs[k].Lower, bufs[k].Upper, bufs[k].Size)
		}
	}
	return offs, nil
}

// Check checks that no two of bufs live at the same time overlap at the
// offsets offs (by index): [Lower, Upper) meets the other's and [offset,
// offset+Size) too. It returns the plan's peak, the largest offset+Size
// (0 for no buffers), or an error naming the two buffers and an event at
// which both are live, or a buffer whose end passes 2^64.
func Check(bufs []Buffer, offs []uint64) (uint64, error) {
	type edge struct {
		t    int64
		free bool
		buf  int
	}
	edges := make([]edge, 0, 2*len(bufs))
	var peak uint64
	for k, b := range bufs {
		if offs[k] > math.MaxUint64-b.Size {
			return 0, fmt.Errorf("buffer %d: offset %d + size %d passes 2^64", b.ID, offs[k], b.Size)
		}
		peak = max(peak, offs[k]+b.Size)
		edges = append(edges, edge{b.Lower, false, k}, edge{b.Upper, true, k})
	}
	// In time order, frees before mallocs at equal times (a buffer ending
	// at t and one starting at t may share memory), as package minimalloc
	// reads a problem.
	slices.SortFunc(edges, func(x, y edge) int {
		if c := cmp.Compare(x.t, y.t); c != 0 {
			return c
		}
		if x.free != y.free {
			if x.free {
				return -1
			}
			return 1
		}
		return cmp.Compare(x.buf, y.buf)
	})
	var live []int // buffers live now, by offset; they do not overlap
	at := func(j int) uint64 { return offs[live[j]] }
	overlap := func(k, o int, t int64) error {
		a, b := bufs[k], bufs[o]
		return fmt.Errorf("buffers %d and %d overlap: %d at [%d, %d), %d at [%d, %d), both live at event %d (lifetimes [%d, %d) and [%d, %d))",
			a.ID, b.ID, a.ID, offs[k], offs[k]+a.Size, b.ID, offs[o], offs[o]+b.Size, t, a.Lower, a.Upper, b.Lower, b.Upper)
	}
	for _, e := range edges {
		off := offs[e.buf]
		i, _ := slices.BinarySearchFunc(live, off, func(j int, off uint64) int { return cmp.Compare(offs[j], off) })
		if e.free {
			for i < len(live) && live[i] != e.buf {
				i++ // buffers of 0 bytes would share an offset; none are written
			}
			live = slices.Delete(live, i, i+1)
			continue
		}
		if i > 0 && at(i-1)+bufs[live[i-1]].Size > off {
			return 0, overlap(live[i-1], e.buf, e.t)
		}
		if i < len(live) && at(i) < off+bufs[e.buf].Size {
			return 0, overlap(e.buf, live[i], e.t)
		}
		live = slices.Insert(live, i, e.buf)
	}
	return peak, nil
}
