package pytorch

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpualloc/allocsim/trace"
)

// This file cuts a run of trace entries out of a snapshot and writes it as
// a snapshot of its own, which PyTorch's memory_viz opens (a long job's
// snapshot can be too large for the browser: pytorch/pytorch#158364).
//
// memory_viz derives what was live before a snapshot's first entry from
// its segments and its trace (torch/utils/viz/MemoryViz.js): the Active
// Memory Timeline takes as allocated from the start every block the trace
// frees without allocating it, and every active_allocated block of the
// segments the trace does not allocate; the Allocator State History starts
// from the segments and their active blocks (allocated and pending free)
// and undoes the trace from its end, so every block the trace leaves
// allocated or pending, and every segment or mapped range it allocates and
// does not free, must be in the segments. So the segments of a slice are
// the allocator's state at the end of the run: the original's events
// (those that Import rebuilds before a cut history's first entry included)
// are followed from the start to the end of the run, and for a cut
// history, what those do not rebuild is taken from the rest of the trace
// and the final segments (cutHistory). testdata/slicecheck.py checks
// slices of the real snapshots against their originals that way.

// BoundUnit says what the number of a Bound counts.
type BoundUnit uint8

const (
	// BoundOpen is no bound: the trace's first entry, or its end.
	BoundOpen BoundUnit = iota
	// BoundEntry is an index into the device trace's entries, from 0;
	// a negative one counts from the end, as Python's list indexes do.
	BoundEntry
	// BoundTime is a time_us of the snapshot: microseconds since the
	// Unix epoch, as PyTorch records them.
	BoundTime
	// BoundElapsed is microseconds after the first entry's time_us.
	BoundElapsed
)

var boundUnitNames = [...]string{BoundOpen: "open", BoundEntry: "entry", BoundTime: "time_us", BoundElapsed: "elapsed"}

func (u BoundUnit) String() string {
	if int(u) < len(boundUnitNames) {
		return boundUnitNames[u]
	}
	return "BoundUnit(" + strconv.Itoa(int(u)) + ")"
}

// Bound is one end of the run of entries that Slice keeps.
type Bound struct {
	Unit BoundUnit
	N    int64
}

// SliceOptions select the run of entries Slice keeps: those from From on
// and before To, of device trace Device. An entry bound keeps the entries
// with From <= index < To (a Python slice: [From:To]); a time bound keeps
// the entries from the first whose time_us is at least From up to, not
// including, the first after it whose time_us is at least To. The run is
// always contiguous in the trace's order.
type SliceOptions struct {
	Device   int
	From, To Bound
}

// SliceResult says what Slice wrote.
type SliceResult struct {
	// Entries is the number of entries of the device trace; the slice
	// holds entries First to End-1 of them.
	Entries, First, End int64
	// FirstUS and LastUS are the time_us of the first and last entry
	// kept.
	FirstUS, LastUS int64
	// Segments is the number of segments written (mapped ranges of
	// expandable segments counted one each), Reserved their bytes and
	// Allocated the bytes of their active blocks, as the allocator held
	// them after the last entry kept.
	Segments            int
	Reserved, Allocated uint64
	// Warnings say where the state written is less than the allocator's
	// was, one line each.
	Warnings []string
}

// ErrEmptySlice is wrapped by the error of Slice when no entry is in the
// range asked for.
var ErrEmptySlice = errors.New("no trace entry in the range")

// Slice reads the snapshot r (gzip-compressed or not; name is used in
// errors) with Import, and writes to w, as a snapshot of device
// opts.Device, the trace entries in the range opts selects, and as its
// segments the allocator's state after the last of them: the segments and
// mapped ranges of expandable segments then live, each tiled by its live
// blocks (active_allocated, or active_pending_free for a block freed but
// waiting on another stream) and inactive blocks for the free space
// between them. Import reads r whole once; then Slice reads the events up
// to the entry that ends the range, and on to the end only for a snapshot
// whose history was cut (Metadata "truncated"), for what Import does not
// rebuild of it: the requested bytes of the blocks live before its first
// entry, and the pages of expandable segments mapped then.
//
// What the slice holds is what Import reads: an entry's action, addr,
// size, stream and time_us, and the frames of allocs and ooms. A free's
// frames, and a segment_free's, are those of the malloc of its block or
// segment, and a segment_alloc's or segment_map's (and the segment's own)
// those of the alloc that follows it inside it; an oom's device_free is
// written as 0, which Import does not keep, and other keys of the entries
// (compile_context, user_metadata) are left out. The allocator settings
// are written as Import flattens them, as strings.
//
// A block's size is not in the trace (an alloc records the requested
// bytes): a live block is given its request rounded as PyTorch's
// round_size does (up to 512 bytes, or to a division of its power of two
// under roundup_power2_divisions), and the free bytes after it when the
// allocator would not have split them off (under 512 bytes in a small-pool
// segment, up to 1 MiB in a large-pool one), as Import rebuilds a cut
// history (reconstruct.go); a block that Import rebuilds before a cut
// history's first entry and that lives to its end has its final block's
// size. So a block's size is the allocator's but where an oversize block
// (max_split_size_mb) took a larger free block whole. A live block in no
// known segment is left out, with a warning.
//
// Errors are one line naming name: Import's, ErrEmptySlice with the
// range, and those of w.
func Slice(w io.Writer, r io.Reader, name string, opts SliceOptions) (SliceResult, error) {
	var res SliceResult
	src, err := Import(r, name, Options{Device: opts.Device})
	if err != nil {
		return res, err
	}
	h := src.Header()
	res.Entries, _ = strconv.ParseInt(h.Metadata["entries"], 10, 64)
	prefix, _ := strconv.ParseInt(h.Metadata["reconstructed_events"], 10, 64)
	from, to := opts.From, opts.To
	for _, b := range []*Bound{&from, &to} {
		if b.Unit == BoundEntry {
			if b.N < 0 {
				b.N += res.Entries
			}
			b.N = min(max(b.N, 0), res.Entries)
		}
	}
	if from.Unit == BoundEntry && to.Unit == BoundEntry && from.N >= to.N {
		return res, fmt.Errorf("%s: %w %s: the trace has %d entries", name, ErrEmptySlice, rangeText(opts), res.Entries)
	}

	s := newSliceState(trace.StacksOf(src), h)
	sw := NewSnapshotWriter(w, opts.Device)
	var (
		held             *TraceEntry // a segment_alloc or segment_map waiting for its frames
		started, stopped bool
		stop             trace.Event // the event that ended the range, if stopped
		t0               int64
		i                int64 // the next entry's index
	)
	kept := func(e *TraceEntry) error {
		if err := sw.Add(*e); err != nil {
			return fmt.Errorf("%s: entry %d: %w", name, i, err)
		}
		return nil
	}
	for k := int64(0); ; k++ {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, err
		}
		if k < prefix {
			s.rebuilding = true
			s.apply(&ev)
			s.rebuilding = false
			continue
		}
		if ev.Op == trace.OpPoolRelease || ev.Op == trace.OpEmptyCache {
			continue // Import's, not entries
		}
		if i == 0 {
			t0 = ev.Time / 1000
			if t0 == 0 && (from.Unit == BoundTime || from.Unit == BoundElapsed || to.Unit == BoundTime || to.Unit == BoundElapsed) {
				return res, fmt.Errorf("%s: the trace entries have no time_us: select them by index", name)
			}
		}
		us := ev.Time / 1000
		if !started && reached(from, i, us, t0) {
			started, res.First, res.End, res.FirstUS = true, i, i, us
		}
		if started && to.Unit != BoundOpen && reached(to, i, us, t0) {
			stopped = true
		}
		// The alloc after a segment_alloc or segment_map gives the
		// segment its frames, also when it ends the range.
		s.nameFresh(&ev)
		if held != nil {
			if s.fresh != nil {
				held.Frames = s.frames(s.fresh.stack)
			}
			if err := kept(held); err != nil {
				return res, err
			}
			held = nil
		}
		if stopped {
			stop = ev
			break
		}
		e := s.entry(&ev)
		s.apply(&ev)
		if started {
			res.End, res.LastUS = i+1, us
			if ev.Op == trace.OpSegmentAlloc || ev.Op == trace.OpSegmentMap {
				held = &e
			} else if err := kept(&e); err != nil {
				return res, err
			}
		}
		i++
	}
	if held != nil {
		if err := kept(held); err != nil {
			return res, err
		}
	}
	if !started {
		return res, fmt.Errorf("%s: %w %s: the trace's %d entries end%s", name, ErrEmptySlice, rangeText(opts), res.Entries, timeText(s.lastUS, t0))
	}
	if res.End == res.First {
		return res, fmt.Errorf("%s: %w %s: the first entry from its start is entry %d%s", name, ErrEmptySlice, rangeText(opts), res.First, timeText(res.FirstUS, t0))
	}
	if prefix > 0 {
		var final []snapSegment
		if ps, ok := src.(*source); ok {
			final = ps.final
		}
		var rest []trace.Event
		if stopped {
			rest = []trace.Event{stop}
		}
		if err := s.cutHistory(rest, src, final, opts.Device); err != nil {
			return res, err
		}
	}
	segs := s.segments(opts.Device)
	for _, seg := range segs {
		res.Reserved += seg.TotalSize
		for _, b := range seg.Blocks {
			if b.State == StateActiveAllocated {
				res.Allocated += b.Size
			}
		}
	}
	res.Segments, res.Warnings = len(segs), s.warnings
	if err := sw.Close(segs, h.Settings); err != nil {
		return res, fmt.Errorf("%s: writing the slice's segments: %w", name, err)
	}
	return res, nil
}

// reached reports whether entry i at time us (t0 the first entry's) is at
// or past bound b.
func reached(b Bound, i, us, t0 int64) bool {
	switch b.Unit {
	case BoundEntry:
		return i >= b.N
	case BoundTime:
		return us >= b.N
	case BoundElapsed:
		return us-t0 >= b.N
	}
	return true
}

// rangeText says which range opts asks for, as the error of an empty one.
func rangeText(opts SliceOptions) string {
	end := func(b Bound, open string) string {
		switch b.Unit {
		case BoundEntry:
			return "entry " + strconv.FormatInt(b.N, 10)
		case BoundTime:
			return "time_us " + strconv.FormatInt(b.N, 10)
		case BoundElapsed:
			return (time.Duration(b.N) * time.Microsecond).String() + " after the first entry"
		}
		return open
	}
	return "from " + end(opts.From, "the start") + " to " + end(opts.To, "the end")
}

// timeText says when an entry at us was, t0 the first entry's time_us;
// "" for a trace without times.
func timeText(us, t0 int64) string {
	if t0 == 0 {
		return ""
	}
	return fmt.Sprintf(" at time_us %d (%v after the first entry)", us, time.Duration(us-t0)*time.Microsecond)
}

// Sizes of PyTorch's caching allocator that a block's size follows (see
// also reconstruct.go).
const largeRemainder = smallSize // a large-pool remainder up to this is not split off

// sliceState is the allocator's state as the events of a snapshot leave
// it: its segments, mapped ranges and live blocks.
type sliceState struct {
	stacks  *trace.Stacks
	frameOf map[uint32][]trace.Frame
	pools   map[uint32][2]uint64 // private pool number -> segment_pool_id
	// divisions is roundup_power2_divisions by power-of-two interval
	// (parseDivisions), 0 where not set.
	divisions [16]uint64

	segs   map[uint64]*sliceSeg // segments (not expandable) by address
	runs   []sliceSeg           // mapped ranges by address, adjacent ones of a stream and pool merged
	blocks map[uint64]*sliceBlock
	// fresh is the segment or mapped range allocated by the last event,
	// which the malloc that follows it names (nameFresh); nil if none.
	fresh    *sliceSeg
	lastUS   int64
	warnings []string

	// rebuilding is set while the events Import rebuilds a cut history
	// with are applied; touched holds the ranges the trace mapped or
	// unmapped so far, for a cut history.
	rebuilding bool
	touched    spans
}

type sliceSeg struct {
	addr, size, stream uint64
	pool               uint32
	stack              uint32
	small, expandable  bool
	named              bool // pool and kind set by a malloc in it
	// id is the segment_pool_id of a range mapped before a cut history
	// began, from the final segments, where hasID.
	id    [2]uint64
	hasID bool
}

func (s *sliceSeg) end() uint64 { return s.addr + s.size }

type sliceBlock struct {
	requested uint64
	stack     uint32
	pending   bool
	// size is the block size where known (a block live since before a
	// cut history began, and to its end: its final block's), else 0
	// (estimated from requested); unknown says the requested bytes of
	// a block Import rebuilt before a cut history's first entry are not
	// known yet.
	size    uint64
	unknown bool
}

func newSliceState(st *trace.Stacks, h trace.Header) *sliceState {
	s := &sliceState{stacks: st, frameOf: map[uint32][]trace.Frame{}, pools: map[uint32][2]uint64{},
		segs: map[uint64]*sliceSeg{}, blocks: map[uint64]*sliceBlock{}}
	parseDivisions(h.Settings["roundup_power2_divisions"], &s.divisions)
	for id, n := range trace.PoolNames(h) {
		var a, b uint64
		if _, err := fmt.Sscanf(n, "(%d,%d)", &a, &b); err == nil && fmt.Sprintf("(%d,%d)", a, b) == n {
			s.pools[id] = [2]uint64{a, b}
		}
	}
	return s
}

// frames returns the frames of stack id, nil for none.
func (s *sliceState) frames(id uint32) []trace.Frame {
	if id == 0 || s.stacks == nil {
		return nil
	}
	f, ok := s.frameOf[id]
	if !ok {
		f = s.stacks.Frames(id)
		s.frameOf[id] = f
	}
	return f
}

// entry returns ev as a trace entry, with the frames of its block or
// segment as the state before ev holds them.
func (s *sliceState) entry(ev *trace.Event) TraceEntry {
	e := TraceEntry{Addr: ev.Addr, Size: ev.Size, Stream: ev.Stream, TimeUS: ev.Time / 1000}
	switch ev.Op {
	case trace.OpMalloc:
		e.Action, e.Frames = "alloc", s.frames(ev.Stack)
	case trace.OpFreeRequested, trace.OpFree:
		e.Action = "free_requested"
		if ev.Op == trace.OpFree {
			e.Action = "free_completed"
		}
		if b := s.blocks[ev.Addr]; b != nil {
			e.Frames = s.frames(b.stack)
		}
	case trace.OpMallocFailed:
		e.Action, e.Addr, e.Frames = "oom", 0, s.frames(ev.Stack)
	case trace.OpSegmentAlloc:
		e.Action = "segment_alloc"
	case trace.OpSegmentFree:
		e.Action = "segment_free"
		if g := s.segs[ev.Addr]; g != nil {
			e.Frames = s.frames(g.stack)
		}
	case trace.OpSegmentMap:
		e.Action = "segment_map"
	case trace.OpSegmentUnmap:
		e.Action = "segment_unmap"
	default: // trace.OpMarker: a snapshot entry
		e.Action, e.Addr, e.Size = "snapshot", 0, 0
	}
	return e
}

// apply follows ev in the state.
func (s *sliceState) apply(ev *trace.Event) {
	if ev.Time != 0 {
		s.lastUS = ev.Time / 1000
	}
	s.nameFresh(ev)
	s.fresh = nil
	switch ev.Op {
	case trace.OpMalloc:
		b := &sliceBlock{requested: ev.Size, stack: ev.Stack}
		if s.rebuilding {
			// Its Size is its block size or its requested bytes
			// (reconstruct.go): which, cutHistory finds out.
			b.unknown = true
		}
		s.blocks[ev.Addr] = b
	case trace.OpFreeRequested:
		if b := s.blocks[ev.Addr]; b != nil {
			b.pending = true
			if b.unknown && ev.Size != 0 {
				b.requested, b.unknown = ev.Size, false
			}
		}
	case trace.OpFree:
		delete(s.blocks, ev.Addr)
	case trace.OpSegmentAlloc:
		g := &sliceSeg{addr: ev.Addr, size: ev.Size, stream: ev.Stream, small: ev.Size <= smallBuffer}
		s.segs[ev.Addr] = g
		s.fresh = g
	case trace.OpSegmentFree:
		delete(s.segs, ev.Addr)
	case trace.OpSegmentMap:
		s.fresh = s.mapRun(sliceSeg{addr: ev.Addr, size: ev.Size, stream: ev.Stream, expandable: true})
		s.touched.add(ev.Addr, ev.Addr+ev.Size)
	case trace.OpSegmentUnmap:
		s.unmapRun(ev.Addr, ev.Size)
		s.touched.add(ev.Addr, ev.Addr+ev.Size)
	}
}

// nameFresh gives the segment or mapped range the last event allocated
// the frames and pool of ev, when ev is the malloc of a block in it.
func (s *sliceState) nameFresh(ev *trace.Event) {
	f := s.fresh
	if f == nil || ev.Op != trace.OpMalloc || ev.Addr >= f.end() || ev.Addr+s.blockSize(ev.Size) <= f.addr {
		return
	}
	f.stack = ev.Stack
	if !f.named {
		f.pool, f.named = ev.Pool, true
		if f.expandable {
			f.small = ev.Size <= smallSize
		}
	}
}

// mapRun adds the mapped range r, unmerged, and returns it (valid until
// the runs change). A range next to one of its stream is of the same
// reserved range: of its pool and pool kind.
func (s *sliceState) mapRun(r sliceSeg) *sliceSeg {
	i := sort.Search(len(s.runs), func(i int) bool { return s.runs[i].addr >= r.addr })
	for _, j := range []int{i - 1, i} {
		if j >= 0 && j < len(s.runs) && s.runs[j].stream == r.stream && (s.runs[j].end() == r.addr || r.end() == s.runs[j].addr) && s.runs[j].named {
			r.pool, r.small, r.named = s.runs[j].pool, s.runs[j].small, true
		}
	}
	s.runs = append(s.runs, sliceSeg{})
	copy(s.runs[i+1:], s.runs[i:])
	s.runs[i] = r
	return &s.runs[i]
}

// mergeRuns merges adjacent mapped ranges of one stream and pool, as
// PyTorch reports a run of mapped memory as one segment.
func (s *sliceState) mergeRuns() {
	out := s.runs[:0]
	for _, r := range s.runs {
		if n := len(out); n > 0 && out[n-1].end() == r.addr && out[n-1].stream == r.stream && out[n-1].pool == r.pool && out[n-1].id == r.id {
			out[n-1].size += r.size
			continue
		}
		out = append(out, r)
	}
	s.runs = out
}

// unmapRun takes [addr, addr+size) out of the mapped ranges.
func (s *sliceState) unmapRun(addr, size uint64) {
	end := addr + size
	var out []sliceSeg
	for _, r := range s.runs {
		if r.end() <= addr || r.addr >= end {
			out = append(out, r)
			continue
		}
		if r.addr < addr {
			left := r
			left.size = addr - r.addr
			out = append(out, left)
		}
		if r.end() > end {
			right := r
			right.addr, right.size = end, r.end()-end
			out = append(out, right)
		}
	}
	s.runs = out
}

// segments returns the segments and mapped ranges of the state by
// address, each tiled by its live blocks and inactive blocks between
// them, for device.
func (s *sliceState) segments(device int) []Segment {
	s.mergeRuns()
	pieces := make([]sliceSeg, 0, len(s.segs)+len(s.runs))
	for _, g := range s.segs {
		pieces = append(pieces, *g)
	}
	pieces = append(pieces, s.runs...)
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].addr < pieces[j].addr })
	addrs := make([]uint64, 0, len(s.blocks))
	for a := range s.blocks {
		addrs = append(addrs, a)
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i] < addrs[j] })

	// A block that runs from a mapped range into the next one (of another
	// stream) makes them one range.
	joined := pieces[:0]
	for _, pc := range pieces {
		if n := len(joined); n > 0 && pc.expandable && joined[n-1].expandable && joined[n-1].end() == pc.addr {
			k := sort.Search(len(addrs), func(k int) bool { return addrs[k] >= pc.addr })
			if k > 0 && addrs[k-1] >= joined[n-1].addr && addrs[k-1]+s.blockSize(s.blocks[addrs[k-1]].requested) > pc.addr {
				joined[n-1].size += pc.size
				continue
			}
		}
		joined = append(joined, pc)
	}
	pieces = joined

	var out []Segment
	lost, lostBytes := 0, uint64(0)
	k := 0
	for _, pc := range pieces {
		for k < len(addrs) && addrs[k] < pc.addr {
			lost++
			lostBytes += s.blocks[addrs[k]].requested
			k++
		}
		seg := Segment{Device: device, Address: pc.addr, TotalSize: pc.size, Stream: pc.stream, IsExpandable: pc.expandable,
			PoolID: s.poolID(pc.pool), Frames: s.frames(pc.stack), SegmentType: "large"}
		if pc.hasID {
			seg.PoolID = pc.id
		}
		if pc.small {
			seg.SegmentType = "small"
		}
		at := pc.addr
		for ; k < len(addrs) && addrs[k] < pc.end(); k++ {
			a := addrs[k]
			b := s.blocks[a]
			next := pc.end()
			if k+1 < len(addrs) && addrs[k+1] < next {
				next = addrs[k+1]
			}
			size := s.blockSize(b.requested)
			if b.size != 0 {
				size = min(b.size, next-a)
			} else if a+size > next {
				size = next - a
			} else if gap := next - a - size; (pc.small && gap < minBlockSize) || (!pc.small && gap <= largeRemainder) {
				size += gap
			}
			if a > at {
				seg.Blocks = append(seg.Blocks, Block{Size: a - at, State: StateInactive})
			}
			state := StateActiveAllocated
			if b.pending {
				state = StateActivePendingFree
			}
			seg.Blocks = append(seg.Blocks, Block{Size: size, RequestedSize: b.requested, State: state, Frames: s.frames(b.stack)})
			at = a + size
		}
		if at < pc.end() {
			seg.Blocks = append(seg.Blocks, Block{Size: pc.end() - at, State: StateInactive})
		}
		out = append(out, seg)
	}
	for ; k < len(addrs); k++ {
		lost++
		lostBytes += s.blocks[addrs[k]].requested
	}
	if lost > 0 {
		s.warnings = append(s.warnings, fmt.Sprintf("%d live block(s) of %d requested bytes lie in no known segment: left out of the segments", lost, lostBytes))
	}
	return out
}

// blockSize is the block size of a malloc of requested bytes before any
// remainder: the request rounded up to 512 bytes, or to the next division
// of its power-of-two interval that roundup_power2_divisions sets (as
// PyTorch's round_size does).
func (s *sliceState) blockSize(requested uint64) uint64 {
	if requested < minBlockSize {
		return minBlockSize
	}
	i := 0
	if l := bits.Len64(requested) - 1; l > 20 {
		i = min(l-20, len(s.divisions)-1)
	}
	if d := s.divisions[i]; d > 1 && requested > minBlockSize*d {
		if requested&(requested-1) == 0 {
			return requested
		}
		floor := uint64(1) << (bits.Len64(requested) - 1)
		step := floor >> (bits.Len64(d) - 1)
		if step == 0 {
			return floor << 1
		}
		if down := requested &^ (step - 1); down != requested {
			return down + step
		}
		return requested
	}
	return (requested + minBlockSize - 1) / minBlockSize * minBlockSize
}

// parseDivisions reads roundup_power2_divisions as Import flattens it
// ("1:4,2:4,...": MiB interval, divisions) into divisions by interval:
// index 0 for sizes under 2 MiB, i for [2^(20+i), 2^(21+i)) bytes.
func parseDivisions(v string, divisions *[16]uint64) {
	for _, kv := range strings.Split(v, ",") {
		k, d, ok := strings.Cut(kv, ":")
		mb, err1 := strconv.ParseUint(k, 10, 64)
		n, err2 := strconv.ParseUint(d, 10, 64)
		if !ok || err1 != nil || err2 != nil || mb == 0 {
			continue
		}
		divisions[min(bits.Len64(mb)-1, len(divisions)-1)] = n
	}
}

// poolID is the segment_pool_id of private pool number p.
func (s *sliceState) poolID(p uint32) [2]uint64 {
	if p == 0 {
		return [2]uint64{}
	}
	if id, ok := s.pools[p]; ok {
		return id
	}
	return [2]uint64{0, uint64(p)}
}

// cutHistory completes the state at the end of the range of a snapshot
// whose history was cut, with what Import's rebuilt events before its
// first entry do not say: the requested bytes of the blocks they rebuild
// (a later free of the block gives them, else its block in the final
// segments), and the pages of expandable segments mapped before the
// history began that are still mapped (Import does not rebuild them). A
// range the trace does not map or unmap up to the range's end was mapped
// then if it is in the final segments and the rest of the trace does not
// touch it either, or if the rest of the trace unmaps it first. The rest
// of the trace is rest (the event that ended the range; none if the trace
// did) and then src, read on to its end when anything is missing.
func (s *sliceState) cutHistory(rest []trace.Event, src trace.Source, final []snapSegment, device int) error {
	unknown := map[uint64]*sliceBlock{}
	for a, b := range s.blocks {
		if b.unknown {
			unknown[a] = b
		}
	}
	expandable := false
	for _, g := range final {
		expandable = expandable || g.expandable
	}
	// The ranges mapped before the history began that the rest of the
	// trace unmaps first.
	var later spans
	var runs []sliceSeg
	for len(rest) > 0 && (len(unknown) > 0 || expandable || len(s.touched) > 0) {
		ev := rest[0]
		if len(rest) == 1 {
			// Read on.
			next, err := src.Next()
			if err != nil && err != io.EOF {
				return err
			}
			if err == nil {
				rest = append(rest, next)
			}
		}
		rest = rest[1:]
		switch ev.Op {
		case trace.OpFreeRequested, trace.OpFree:
			if b := unknown[ev.Addr]; b != nil && ev.Size != 0 {
				b.requested, b.unknown = ev.Size, false
				delete(unknown, ev.Addr)
			}
		case trace.OpSegmentMap, trace.OpSegmentUnmap:
			lo, hi := ev.Addr, ev.Addr+ev.Size
			if ev.Op == trace.OpSegmentUnmap {
				for _, sp := range s.touched.uncovered(lo, hi) {
					for _, p := range later.uncovered(sp.lo, sp.hi) {
						runs = append(runs, sliceSeg{addr: p.lo, size: p.hi - p.lo, stream: ev.Stream, expandable: true})
					}
				}
			}
			later.add(lo, hi)
		}
	}
	for _, g := range final {
		if g.bad != "" || (g.device >= 0 && g.device != int64(device)) {
			continue
		}
		addr := g.addr
		for _, b := range g.blocks {
			if b.haveAddr {
				addr = b.addr
			}
			if blk := unknown[addr]; blk != nil && (b.state == blockAllocated || b.state == blockPendingFree) {
				blk.requested, blk.size, blk.unknown = b.requested, b.size, false
			}
			addr += b.size
		}
		if !g.expandable {
			continue
		}
		for _, sp := range s.touched.uncovered(g.addr, g.addr+g.size) {
			for _, p := range later.uncovered(sp.lo, sp.hi) {
				runs = append(runs, sliceSeg{addr: p.lo, size: p.hi - p.lo, stream: g.stream, expandable: true,
					small: g.small, named: true, id: g.pool, hasID: g.pool != [2]uint64{}})
			}
		}
	}
	for _, r := range runs {
		s.mapRun(r)
	}
	return nil
}

// spans is a set of address ranges, sorted and disjoint.
type spans []span

type span struct{ lo, hi uint64 }

// add adds [lo, hi).
func (sp *spans) add(lo, hi uint64) {
	if lo >= hi {
		return
	}
	out := make(spans, 0, len(*sp)+1)
	for _, x := range *sp {
		switch {
		case x.hi < lo || x.lo > hi:
			out = append(out, x)
		default:
			lo, hi = min(lo, x.lo), max(hi, x.hi)
		}
	}
	out = append(out, span{lo, hi})
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	*sp = out
}

// uncovered returns the parts of [lo, hi) outside the set.
func (sp spans) uncovered(lo, hi uint64) []span {
	var out []span
	for _, x := range sp {
		if x.hi <= lo || x.lo >= hi {
			continue
		}
		if x.lo > lo {
			out = append(out, span{lo, x.lo})
		}
		lo = max(lo, x.hi)
	}
	if lo < hi {
		out = append(out, span{lo, hi})
	}
	return out
}
