// Package viz records the history of a simulated allocator as a PyTorch
// memory snapshot, so that the simulated policy's state can be browsed in
// PyTorch's own memory viewer (pytorch.org/memory_viz, or
// `python -m torch.cuda._memory_viz trace_plot FILE`) next to the real
// allocator's.
//
// A Recorder is a sim.Observer: give it to a replay in sim.Config.Observer
// and it streams one trace entry per allocator action (alloc,
// free_requested, free_completed, segment_alloc, segment_free,
// segment_map, segment_unmap, oom) to its writer, keeping only the live
// segments, mapped ranges and blocks in memory; Close adds the final
// segments, each tiled by its live blocks and the free space between them
// (one inactive block per gap), as a snapshot's "segments" list holds
// them. Mapped pages of expandable segments make one segment per run of
// adjacent mapped bytes of one stream, as PyTorch reports them, and runs
// of several streams are one where a block crosses between them (the
// one range of async-pool).
package viz

import (
	"fmt"
	"io"
	"sort"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// smallSegment is the largest segment, in bytes, recorded with segment
// type "small" (PyTorch's small pool uses 2 MiB segments).
const smallSegment = 2 << 20

// Recorder writes a replay's allocator actions as a PyTorch memory
// snapshot for device 0. It is not safe for concurrent use.
type Recorder struct {
	w        *pytorch.SnapshotWriter // nil: the state is kept, nothing written
	settings map[string]string
	segs     map[uint64]segment
	mapped   []span // mapped ranges, by address, adjacent ones of a stream merged
	blocks   map[uint64]block
	err      error
	closed   bool

	// stacks is the trace's stack table (SetStacks), frames the frames
	// of each stack written so far, by id; pools names the trace's
	// private pools by number (SetPools).
	stacks *trace.Stacks
	frames map[site][]trace.Frame
	pools  map[uint32][2]uint64
}

// site is a malloc's call stack (an id of the trace's Stacks) and its
// call site (trace.Event.Label).
type site struct {
	stack uint32
	label string
}

// span is a run of mapped bytes [start, end) of a reserved range, of a
// stream and a private pool (0 for the default pools).
type span struct {
	start, end, stream uint64
	pool               uint32
}

type segment struct {
	size, stream uint64
	pool         uint32
	site         site // of the malloc that allocated it
}

type block struct {
	size, requested, stream uint64
	pending                 bool // free requested, not completed
	site                    site
}

// NewRecorder returns a Recorder writing to w. settings are written as the
// snapshot's allocator_settings (for example the policy's name and
// settings), strings by key.
func NewRecorder(w io.Writer, settings map[string]string) *Recorder {
	r := &Recorder{
		settings: settings,
		segs:     map[uint64]segment{},
		blocks:   map[uint64]block{},
		frames:   map[site][]trace.Frame{},
	}
	if w != nil {
		r.w = pytorch.NewSnapshotWriter(w, 0)
	}
	return r
}

var _ sim.SourceObserver = (*Recorder)(nil)

// ObserveSource takes from the trace what the snapshot keeps of it: its
// stack table, which the actions' Stack ids name (the entries and blocks
// of a malloc with a stack get its frames, as in a real snapshot recorded
// with stacks), the source's ids of its private pools (trace.PoolNames:
// "(1,0)"), written as the segments' segment_pool_id (a pool not named by
// such a pair as (0, number)), and its recorded allocator settings
// (Header.Settings), written among the snapshot's allocator_settings
// under their own keys, where the recorder's settings do not name them.
func (r *Recorder) ObserveSource(h trace.Header, st *trace.Stacks) {
	r.stacks = st
	if len(h.Settings) > 0 {
		settings := make(map[string]string, len(r.settings)+len(h.Settings))
		for k, v := range h.Settings {
			settings[k] = v
		}
		for k, v := range r.settings {
			settings[k] = v
		}
		r.settings = settings
	}
	r.pools = map[uint32][2]uint64{}
	for id, n := range trace.PoolNames(h) {
		var a, b uint64
		if _, err := fmt.Sscanf(n, "(%d,%d)", &a, &b); err == nil && fmt.Sprintf("(%d,%d)", a, b) == n {
			r.pools[id] = [2]uint64{a, b}
		}
	}
}

// framesOf returns the frames of site s: its stack's, or for a call site
// alone (a `record run` malloc's) one frame "??:0:LABEL", as PyTorch
// writes a frame it has no file of; nil for neither.
func (r *Recorder) framesOf(s site) []trace.Frame {
	if s.stack == 0 && s.label == "" {
		return nil
	}
	if f, ok := r.frames[s]; ok {
		return f
	}
	var f []trace.Frame
	if s.stack != 0 {
		f = r.stacks.Frames(s.stack)
	} else {
		f = []trace.Frame{{Name: s.label, File: "??"}}
	}
	r.frames[s] = f
	return f
}

// poolID is the segment_pool_id of private pool number p (0: the default
// pools, (0, 0)).
func (r *Recorder) poolID(p uint32) [2]uint64 {
	if p == 0 {
		return [2]uint64{}
	}
	if id, ok := r.pools[p]; ok {
		return id
	}
	return [2]uint64{0, uint64(p)}
}

// Observe writes one action as a trace entry. Errors (of the writer, or an
// action that contradicts the state so far) are kept and returned by
// Close; after the first, Observe does nothing.
func (r *Recorder) Observe(a sim.Action) {
	if r.err != nil || r.closed {
		return
	}
	e := pytorch.TraceEntry{Action: a.Kind.String(), Addr: a.Addr, Size: a.Requested, Stream: a.Stream, TimeUS: a.Time / 1000}
	cur := site{a.Stack, a.Label}
	switch a.Kind {
	case sim.ActionSegmentAlloc:
		if _, dup := r.segs[a.Addr]; dup {
			r.fail(a, "segment %#x is already live", a.Addr)
			return
		}
		r.segs[a.Addr] = segment{size: a.Size, stream: a.Stream, pool: a.Pool, site: cur}
		e.Size = a.Size
		e.Frames = r.framesOf(cur)
	case sim.ActionSegmentFree:
		s, ok := r.segs[a.Addr]
		if !ok {
			r.fail(a, "segment %#x is not live", a.Addr)
			return
		}
		delete(r.segs, a.Addr)
		e.Size, e.Stream = s.size, s.stream
		e.Frames = r.framesOf(s.site)
	case sim.ActionAlloc:
		if _, dup := r.blocks[a.Addr]; dup {
			r.fail(a, "block %#x is already live", a.Addr)
			return
		}
		r.blocks[a.Addr] = block{size: a.Size, requested: a.Requested, stream: a.Stream, site: cur}
		e.Frames = r.framesOf(cur)
	case sim.ActionFreeRequested:
		b, ok := r.blocks[a.Addr]
		if !ok || b.pending {
			r.fail(a, "block %#x is not allocated", a.Addr)
			return
		}
		b.pending = true
		r.blocks[a.Addr] = b
		e.Size, e.Stream = b.requested, b.stream
		e.Frames = r.framesOf(b.site)
	case sim.ActionFreeCompleted:
		b, ok := r.blocks[a.Addr]
		if !ok || !b.pending {
			r.fail(a, "block %#x is not pending free", a.Addr)
			return
		}
		delete(r.blocks, a.Addr)
		e.Size, e.Stream = b.requested, b.stream
		e.Frames = r.framesOf(b.site)
	case sim.ActionSegmentMap:
		if err := r.mapRange(a.Addr, a.Size, a.Stream, a.Pool); err != nil {
			r.fail(a, "%v", err)
			return
		}
		e.Size = a.Size
		e.Frames = r.framesOf(cur)
	case sim.ActionSegmentUnmap:
		stream, err := r.unmapRange(a.Addr, a.Size)
		if err != nil {
			r.fail(a, "%v", err)
			return
		}
		e.Size, e.Stream = a.Size, stream
	case sim.ActionOOM:
		e.Addr, e.DeviceFree = 0, a.Free
	default:
		r.fail(a, "unknown action")
		return
	}
	if r.w == nil {
		return
	}
	if err := r.w.Add(e); err != nil {
		r.err = err
	}
}

// mapRange adds [addr, addr+size) to the mapped ranges.
func (r *Recorder) mapRange(addr, size, stream uint64, pool uint32) error {
	end := addr + size
	if size == 0 || end < addr {
		return fmt.Errorf("a map of %d bytes at %#x", size, addr)
	}
	i := sort.Search(len(r.mapped), func(i int) bool { return r.mapped[i].end > addr })
	if i < len(r.mapped) && r.mapped[i].start < end {
		return fmt.Errorf("%#x is mapped already", max(addr, r.mapped[i].start))
	}
	r.mapped = append(r.mapped, span{})
	copy(r.mapped[i+1:], r.mapped[i:])
	r.mapped[i] = span{addr, end, stream, pool}
	// Merge with the neighbours of the same stream and pool.
	if i+1 < len(r.mapped) && r.mapped[i+1].start == end && r.mapped[i+1].stream == stream && r.mapped[i+1].pool == pool {
		r.mapped[i].end = r.mapped[i+1].end
		r.mapped = append(r.mapped[:i+1], r.mapped[i+2:]...)
	}
	if i > 0 && r.mapped[i-1].end == addr && r.mapped[i-1].stream == stream && r.mapped[i-1].pool == pool {
		r.mapped[i-1].end = r.mapped[i].end
		r.mapped = append(r.mapped[:i], r.mapped[i+1:]...)
	}
	return nil
}

// unmapRange takes [addr, addr+size), which must be mapped, out of the
// mapped ranges, and returns the stream of the range it starts in.
func (r *Recorder) unmapRange(addr, size uint64) (uint64, error) {
	end := addr + size
	i := sort.Search(len(r.mapped), func(i int) bool { return r.mapped[i].end > addr })
	// The range must be covered without a gap.
	pos := addr
	for j := i; j < len(r.mapped) && pos < end; j++ {
		if r.mapped[j].start > pos {
			break
		}
		pos = r.mapped[j].end
	}
	if size == 0 || pos < end {
		return 0, fmt.Errorf("[%#x, %#x) is not mapped", addr, end)
	}
	stream := r.mapped[i].stream
	var out []span
	out = append(out, r.mapped[:i]...)
	for j := i; j < len(r.mapped); j++ {
		sp := r.mapped[j]
		if sp.start >= end {
			out = append(out, r.mapped[j:]...)
			break
		}
		if sp.start < addr {
			out = append(out, span{sp.start, addr, sp.stream, sp.pool})
		}
		if sp.end > end {
			out = append(out, span{end, sp.end, sp.stream, sp.pool})
		}
	}
	r.mapped = out
	return stream, nil
}

func (r *Recorder) fail(a sim.Action, format string, args ...any) {
	r.err = fmt.Errorf("viz: event %d: %s: %s", a.Event, a.Kind, fmt.Sprintf(format, args...))
}

// Entries returns the number of trace entries written (0 for a recorder
// that writes nothing).
func (r *Recorder) Entries() int64 {
	if r.w == nil {
		return 0
	}
	return r.w.Entries()
}

// Replaced returns the number of strings of the snapshot (frames,
// settings) that were not valid UTF-8 and were written with U+FFFD in
// their place (pytorch.SnapshotWriter.Replaced), so that Python can load
// it.
func (r *Recorder) Replaced() int {
	if r.w == nil {
		return 0
	}
	return r.w.Replaced()
}

// Close writes the final segments and ends the snapshot. It returns the
// first error of Observe, and an error when a live block lies outside
// every live segment or overlaps another; it does not close the
// underlying writer.
func (r *Recorder) Close() error {
	if r.closed {
		return r.err
	}
	r.closed = true
	if r.err != nil {
		return r.err
	}
	segs, err := r.segments()
	if err != nil || r.w == nil {
		return err
	}
	return r.w.Close(segs, r.settings)
}

// Segments returns the live segments by address, each tiled by its live
// blocks and inactive blocks for the gaps, as Close writes them. It
// returns an error when a live block lies outside every live segment or
// overlaps another.
func (r *Recorder) Segments() ([]pytorch.Segment, error) { return r.segments() }

// LiveSegment is a live segment of the replay, or a run of mapped bytes of
// a reserved range (Expandable), as Segments has them, with its live
// blocks by address: Size bytes at Addr, of a private pool (0 for the
// default pools), allocated for the malloc of call stack Stack (an id of
// the trace's Stacks) and call site Label.
type LiveSegment struct {
	Addr, Size, Stream uint64
	Expandable         bool
	Pool               uint32
	Stack              uint32
	Label              string
	Blocks             []LiveBlock
}

// LiveBlock is a block handed out and not yet given back: Size bytes at
// Addr for Requested bytes, freed by the program but waiting on another
// stream when Pending, placed for the malloc of call stack Stack and call
// site Label.
type LiveBlock struct {
	Addr, Size, Requested uint64
	Pending               bool
	Stack                 uint32
	Label                 string
}

// Live returns the live segments by address with their live blocks. It
// returns an error when a live block lies outside every live segment or
// overlaps another.
func (r *Recorder) Live() ([]LiveSegment, error) {
	// Segments and runs of mapped bytes, by address.
	pieces := make([]LiveSegment, 0, len(r.segs)+len(r.mapped))
	for a, s := range r.segs {
		pieces = append(pieces, LiveSegment{Addr: a, Size: s.size, Stream: s.stream, Pool: s.pool, Stack: s.site.stack, Label: s.site.label})
	}
	for _, sp := range r.mapped {
		pieces = append(pieces, LiveSegment{Addr: sp.start, Size: sp.end - sp.start, Stream: sp.stream, Expandable: true, Pool: sp.pool})
	}
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].Addr < pieces[j].Addr })
	baddrs := make([]uint64, 0, len(r.blocks))
	for a := range r.blocks {
		baddrs = append(baddrs, a)
	}
	sort.Slice(baddrs, func(i, j int) bool { return baddrs[i] < baddrs[j] })
	// Adjacent mapped runs of different streams are one when a block
	// crosses from one into the other: a pool's range mapped for several
	// streams (async-pool).
	joined := pieces[:0]
	for _, pc := range pieces {
		if n := len(joined); n > 0 && pc.Expandable && joined[n-1].Expandable && joined[n-1].Addr+joined[n-1].Size == pc.Addr {
			k := sort.Search(len(baddrs), func(i int) bool { return baddrs[i] >= pc.Addr })
			if k > 0 && baddrs[k-1] >= joined[n-1].Addr && baddrs[k-1]+r.blocks[baddrs[k-1]].size > pc.Addr {
				joined[n-1].Size += pc.Size
				continue
			}
		}
		joined = append(joined, pc)
	}
	pieces = joined

	k := 0
	for p := range pieces {
		pc := &pieces[p]
		end := pc.Addr + pc.Size
		if k < len(baddrs) && baddrs[k] < pc.Addr {
			return nil, fmt.Errorf("viz: block %#x lies in no live segment", baddrs[k])
		}
		at := pc.Addr
		for ; k < len(baddrs) && baddrs[k] < end; k++ {
			ba := baddrs[k]
			b := r.blocks[ba]
			if b.size == 0 {
				continue // occupies nothing
			}
			if ba < at {
				return nil, fmt.Errorf("viz: block %#x overlaps the block before it", ba)
			}
			if ba+b.size > end {
				return nil, fmt.Errorf("viz: block %#x of %d bytes runs past the end of segment %#x of %d bytes", ba, b.size, pc.Addr, pc.Size)
			}
			pc.Blocks = append(pc.Blocks, LiveBlock{Addr: ba, Size: b.size, Requested: b.requested, Pending: b.pending, Stack: b.site.stack, Label: b.site.label})
			at = ba + b.size
		}
	}
	if k < len(baddrs) {
		return nil, fmt.Errorf("viz: block %#x lies in no live segment", baddrs[k])
	}
	return pieces, nil
}

func (r *Recorder) segments() ([]pytorch.Segment, error) {
	live, err := r.Live()
	if err != nil {
		return nil, err
	}
	out := make([]pytorch.Segment, 0, len(live))
	for _, pc := range live {
		seg := pytorch.Segment{Address: pc.Addr, TotalSize: pc.Size, Stream: pc.Stream, SegmentType: "large", IsExpandable: pc.Expandable,
			PoolID: r.poolID(pc.Pool), Frames: r.framesOf(site{pc.Stack, pc.Label})}
		if pc.Size <= smallSegment {
			seg.SegmentType = "small"
		}
		at, end := pc.Addr, pc.Addr+pc.Size
		for _, b := range pc.Blocks {
			if b.Addr > at {
				seg.Blocks = append(seg.Blocks, pytorch.Block{Size: b.Addr - at, State: pytorch.StateInactive})
			}
			state := pytorch.StateActiveAllocated
			if b.Pending {
				state = pytorch.StateActivePendingFree
			}
			seg.Blocks = append(seg.Blocks, pytorch.Block{Size: b.Size, RequestedSize: b.Requested, State: state, Frames: r.framesOf(site{b.Stack, b.Label})})
			at = b.Addr + b.Size
		}
		if at < end {
			seg.Blocks = append(seg.Blocks, pytorch.Block{Size: end - at, State: pytorch.StateInactive})
		}
		out = append(out, seg)
	}
	return out, nil
}
