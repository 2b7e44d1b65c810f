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
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// smallSegment is the largest segment, in bytes, recorded with segment
// type "small" (PyTorch's small pool uses 2 MiB segments).
const smallSegment = 2 << 20

// Recorder writes a replay's allocator actions as a PyTorch memory
// snapshot for device 0. It is not safe for concurrent use.
type Recorder struct {
	w        *pytorch.SnapshotWriter
	settings map[string]string
	segs     map[uint64]segment
	mapped   []span // mapped ranges, by address, adjacent ones of a stream merged
	blocks   map[uint64]block
	err      error
	closed   bool
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
}

type block struct {
	size, requested, stream uint64
	pending                 bool // free requested, not completed
}

// NewRecorder returns a Recorder writing to w. settings are written as the
// snapshot's allocator_settings (for example the policy's name and
// settings), strings by key.
func NewRecorder(w io.Writer, settings map[string]string) *Recorder {
	return &Recorder{
		w:        pytorch.NewSnapshotWriter(w, 0),
		settings: settings,
		segs:     map[uint64]segment{},
		blocks:   map[uint64]block{},
	}
}

var _ sim.Observer = (*Recorder)(nil)

// Observe writes one action as a trace entry. Errors (of the writer, or an
// action that contradicts the state so far) are kept and returned by
// Close; after the first, Observe does nothing.
func (r *Recorder) Observe(a sim.Action) {
	if r.err != nil || r.closed {
		return
	}
	e := pytorch.TraceEntry{Action: a.Kind.String(), Addr: a.Addr, Size: a.Requested, Stream: a.Stream, TimeUS: a.Time / 1000}
	switch a.Kind {
	case sim.ActionSegmentAlloc:
		if _, dup := r.segs[a.Addr]; dup {
			r.fail(a, "segment %#x is already live", a.Addr)
			return
		}
		r.segs[a.Addr] = segment{size: a.Size, stream: a.Stream, pool: a.Pool}
		e.Size = a.Size
	case sim.ActionSegmentFree:
		s, ok := r.segs[a.Addr]
		if !ok {
			r.fail(a, "segment %#x is not live", a.Addr)
			return
		}
		delete(r.segs, a.Addr)
		e.Size, e.Stream = s.size, s.stream
	case sim.ActionAlloc:
		if _, dup := r.blocks[a.Addr]; dup {
			r.fail(a, "block %#x is already live", a.Addr)
			return
		}
		r.blocks[a.Addr] = block{size: a.Size, requested: a.Requested, stream: a.Stream}
	case sim.ActionFreeRequested:
		b, ok := r.blocks[a.Addr]
		if !ok || b.pending {
			r.fail(a, "block %#x is not allocated", a.Addr)
			return
		}
		b.pending = true
		r.blocks[a.Addr] = b
		e.Size, e.Stream = b.requested, b.stream
	case sim.ActionFreeCompleted:
		b, ok := r.blocks[a.Addr]
		if !ok || !b.pending {
			r.fail(a, "block %#x is not pending free", a.Addr)
			return
		}
		delete(r.blocks, a.Addr)
		e.Size, e.Stream = b.requested, b.stream
	case sim.ActionSegmentMap:
		if err := r.mapRange(a.Addr, a.Size, a.Stream, a.Pool); err != nil {
			r.fail(a, "%v", err)
			return
		}
		e.Size = a.Size
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

// Entries returns the number of trace entries written.
func (r *Recorder) Entries() int64 { return r.w.Entries() }

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
	if err != nil {
		return err
	}
	return r.w.Close(segs, r.settings)
}

// Segments returns the live segments by address, each tiled by its live
// blocks and inactive blocks for the gaps, as Close writes them. It
// returns an error when a live block lies outside every live segment or
// overlaps another.
func (r *Recorder) Segments() ([]pytorch.Segment, error) { return r.segments() }

func (r *Recorder) segments() ([]pytorch.Segment, error) {
	// Segments and runs of mapped bytes, by address.
	type piece struct {
		addr, size, stream uint64
		expandable         bool
		pool               uint32
	}
	pieces := make([]piece, 0, len(r.segs)+len(r.mapped))
	for a, s := range r.segs {
		pieces = append(pieces, piece{a, s.size, s.stream, false, s.pool})
	}
	for _, sp := range r.mapped {
		pieces = append(pieces, piece{sp.start, sp.end - sp.start, sp.stream, true, sp.pool})
	}
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].addr < pieces[j].addr })
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
		if n := len(joined); n > 0 && pc.expandable && joined[n-1].expandable && joined[n-1].addr+joined[n-1].size == pc.addr {
			k := sort.Search(len(baddrs), func(i int) bool { return baddrs[i] >= pc.addr })
			if k > 0 && baddrs[k-1] >= joined[n-1].addr && baddrs[k-1]+r.blocks[baddrs[k-1]].size > pc.addr {
				joined[n-1].size += pc.size
				continue
			}
		}
		joined = append(joined, pc)
	}
	pieces = joined

	out := make([]pytorch.Segment, 0, len(pieces))
	k := 0
	for _, pc := range pieces {
		sa := pc.addr
		end := sa + pc.size
		seg := pytorch.Segment{Address: sa, TotalSize: pc.size, Stream: pc.stream, SegmentType: "large", IsExpandable: pc.expandable}
		if pc.pool != 0 {
			seg.PoolID = [2]uint64{0, uint64(pc.pool)}
		}
		if pc.size <= smallSegment {
			seg.SegmentType = "small"
		}
		if k < len(baddrs) && baddrs[k] < sa {
			return nil, fmt.Errorf("viz: block %#x lies in no live segment", baddrs[k])
		}
		at := sa
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
				return nil, fmt.Errorf("viz: block %#x of %d bytes runs past the end of segment %#x of %d bytes", ba, b.size, sa, pc.size)
			}
			if ba > at {
				seg.Blocks = append(seg.Blocks, pytorch.Block{Size: ba - at, State: pytorch.StateInactive})
			}
			state := pytorch.StateActiveAllocated
			if b.pending {
				state = pytorch.StateActivePendingFree
			}
			seg.Blocks = append(seg.Blocks, pytorch.Block{Size: b.size, RequestedSize: b.requested, State: state})
			at = ba + b.size
		}
		if at < end {
			seg.Blocks = append(seg.Blocks, pytorch.Block{Size: end - at, State: pytorch.StateInactive})
		}
		out = append(out, seg)
	}
	if k < len(baddrs) {
		return nil, fmt.Errorf("viz: block %#x lies in no live segment", baddrs[k])
	}
	return out, nil
}
