package pytorch

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gpualloc/allocsim/trace"
)

// A snapshot keeps the last max_entries trace entries (a ring buffer), so
// the history of a long job starts mid-run: it frees blocks it never
// allocated and holds segments it never saw allocated. Replayed as it is,
// such a trace starts from an empty allocator and says nothing true.
//
// Import rebuilds the allocator's state at the first entry the way
// PyTorch's memory viewer does (torch/utils/viz/MemoryViz.js: the final
// segments and their blocks, with the trace undone from its end): a
// segment existed before the history began if the trace frees it without
// allocating it, or if it is in the final segments and the trace never
// allocated it; a block was allocated before the history began if the
// trace frees it without allocating it (pending, its free requested, if
// the first entry for it is free_completed), or if it is allocated in the
// final segments and the trace never allocated it. Walking the trace
// forward once and comparing with the final state gives the same sets as
// walking it backwards.
//
// That state is then written as events before the first entry, so that
// any policy replays from it, and the pytorch policy lays it out as it
// was: for each segment, in address order,
//
//	segment_alloc  the segment (observed only: its address and size, for a
//	               device that places segments where they were recorded)
//	malloc, free   of the whole segment, for a large-pool segment, so that
//	               the policy makes a segment of exactly that size
//	malloc         of each block and each free range between blocks, in
//	               address order, each taking the start of the rest of the
//	               segment (the free ranges of a small-pool segment in
//	               pieces of at most 1 MiB, so that they stay in its pool)
//
// then a free of every free range (which merge back into the free blocks
// they were), the blocks found in no known segment as plain mallocs, and a
// free_requested of each block whose free was pending, the one whose free
// the trace completes first last (right before it, as it was: not a late
// free). A marker "reconstructed N" comes first, N the number of these
// events, marker included. The
// mallocs of blocks have the block's size (the requested size rounded, and
// the remainder the allocator did not split off), which is what places
// them, so their requested bytes count a little high; a free range's
// malloc has the address of its first byte, which no live block has.
//
// A block the trace frees is known by its requested size only. Rounded
// up, with a remainder the allocator does not split off (under 512 bytes
// in the small pool, up to 1 MiB in the large) when the next block
// follows closely, it is its block size. When a free range follows, the
// block may have taken up to 1 MiB of it when it was allocated (the range
// was freed later): blocks are split from their start, so the first malloc
// into the range while the block was live took the range's start, and the
// lowest address the trace touches there before it frees the block is
// where the block ended. With no such malloc the block is taken to have
// no remainder, which the snapshot cannot contradict.
// Segments of expandable_segments are not laid out: their blocks are
// plain mallocs.

// history follows a device trace in order and keeps what must have existed
// before its first entry.
type history struct {
	// blocks holds the state of every block address the trace touches
	// (allocated, free requested or freed) and the event that touched it
	// first: blockAt[addr] indexes blocks, so that an event looks its
	// address up once, and blocks is in chunks, never copied as it grows.
	blockAt  map[uint64]uint32
	blocks   [][]addrSeen
	pre      map[uint64]preBlock
	segs     map[uint64]bool     // every segment address the trace touches: true while live
	segSizes map[uint64]addrSeen // the size of each segment the trace allocates
	preSegs  map[uint64]preSegment
	mapped   bool // the trace maps pages of expandable segments
	t0       int64
	started  bool
	first    trace.Event // the first event
	n        uint32      // events so far
	sorted   []uint64    // the addresses in blocks, sorted, once needed
}

type blockSeen uint8

type addrSeen struct {
	state  blockSeen
	first  uint32 // index of the event that touched the address first
	size   uint64 // the requested bytes of its latest malloc in the trace, 0 if none
	stream uint64 // that malloc's stream
	at     uint32 // the index of that malloc
}

const (
	seenFreed blockSeen = iota
	seenAllocated
	seenFreeRequested
)

// preBlock is a block allocated before the history began: requested bytes
// on a stream, pending if its free was requested before the history began.
type preBlock struct {
	size, stream uint64
	pending      bool
	first        uint32 // the event that frees it (its first)
}

type preSegment struct{ size, stream uint64 }

func newHistory() *history {
	return &history{
		blockAt:  map[uint64]uint32{},
		pre:      map[uint64]preBlock{},
		segs:     map[uint64]bool{},
		segSizes: map[uint64]addrSeen{},
		preSegs:  map[uint64]preSegment{},
	}
}

// observe takes the next event of the trace.
//
// A snapshot holds each block's and segment's size twice, at its malloc and
// at its free: observe returns an error when the two differ (a damaged
// file, not a history that starts mid-run).
func (h *history) observe(ev *trace.Event) error {
	if !h.started {
		h.started, h.t0, h.first = true, ev.Time, *ev
	}
	a := ev.Addr
	i := h.n
	h.n++
	switch ev.Op {
	case trace.OpMalloc:
		j, ok := h.blockAt[a]
		if !ok {
			j = h.newBlock(a, addrSeen{first: i})
		}
		s := h.blockRef(j)
		s.state, s.size, s.stream, s.at = seenAllocated, ev.Size, ev.Stream, i
	case trace.OpFreeRequested:
		if j, ok := h.blockAt[a]; ok {
			s := h.blockRef(j)
			if s.state == seenAllocated {
				if err := sameSize("block", a, ev.Size, *s); err != nil {
					return err
				}
				if err := sameStream(a, ev.Stream, *s); err != nil {
					return err
				}
				s.state = seenFreeRequested
			}
			return nil
		}
		h.pre[a] = preBlock{size: ev.Size, stream: ev.Stream, first: i}
		h.newBlock(a, addrSeen{state: seenFreeRequested, first: i})
	case trace.OpFree:
		if j, ok := h.blockAt[a]; ok {
			s := h.blockRef(j)
			if s.state != seenFreed {
				if err := sameSize("block", a, ev.Size, *s); err != nil {
					return err
				}
				if err := sameStream(a, ev.Stream, *s); err != nil {
					return err
				}
			}
			s.state = seenFreed
			return nil
		}
		h.pre[a] = preBlock{size: ev.Size, stream: ev.Stream, pending: true, first: i}
		h.newBlock(a, addrSeen{state: seenFreed, first: i})
	case trace.OpSegmentAlloc:
		h.segs[a] = true
		h.segSizes[a] = addrSeen{size: ev.Size, at: i}
	case trace.OpSegmentFree:
		if _, ok := h.segs[a]; ok {
			if s, ok := h.segSizes[a]; ok {
				if err := sameSize("segment", a, ev.Size, s); err != nil {
					return err
				}
			}
			h.segs[a] = false
			return nil
		}
		if _, ok := h.preSegs[a]; !ok {
			h.preSegs[a] = preSegment{size: ev.Size, stream: ev.Stream}
		}
	case trace.OpSegmentMap, trace.OpSegmentUnmap:
		h.mapped = true
	}
	return nil
}

// newBlock adds the block address a, not seen before, with s, and returns
// its index in h.blocks.
func (h *history) newBlock(a uint64, s addrSeen) uint32 {
	j := uint32(len(h.blockAt))
	h.blockAt[a] = j
	if j%blockChunk == 0 {
		h.blocks = append(h.blocks, make([]addrSeen, 0, blockChunk))
	}
	c := &h.blocks[len(h.blocks)-1]
	*c = append(*c, s)
	return j
}

// blockChunk is the length of a chunk of history.blocks.
const blockChunk = 4096

// blockRef returns the state of block j.
func (h *history) blockRef(j uint32) *addrSeen { return &h.blocks[j/blockChunk][j%blockChunk] }

// block returns the state of block address a, if the trace touches it.
func (h *history) block(a uint64) (addrSeen, bool) {
	if j, ok := h.blockAt[a]; ok {
		return *h.blockRef(j), true
	}
	return addrSeen{}, false
}

// sameSize returns an error when a free of the block or segment at addr
// gives another size than its malloc, s; a free of size 0 says none.
func sameSize(what string, addr, size uint64, s addrSeen) error {
	if size == 0 || s.size == 0 || size == s.size {
		return nil
	}
	return fmt.Errorf("frees the %s at %#x as %d bytes, which entry %d allocated as %d bytes", what, addr, size, s.at, s.size)
}

// sameStream returns an error when a free of the block at addr names
// another stream than its malloc, s: PyTorch records both on the block's
// stream.
func sameStream(addr, stream uint64, s addrSeen) error {
	if s.size == 0 || stream == s.stream {
		return nil
	}
	return fmt.Errorf("frees the block at %#x on stream %#x, which entry %d allocated on stream %#x", addr, stream, s.at, s.stream)
}

// startBlock is a block allocated when the history began.
type startBlock struct {
	addr      uint64
	size      uint64 // block size, 0 if unknown
	requested uint64
	stream    uint64
	pending   bool
	freedAt   uint32 // for a block known from the trace only: the event that frees it
	stack     uint32 // for a block of the final segments: its frames' stack, 0 if none
}

// startSegment is a segment that existed when the history began.
type startSegment struct {
	addr, size, stream uint64
	small, expandable  bool
	blocks             []startBlock
}

// PyTorch caching allocator sizes that the layout depends on (see
// policies/pytorch.go, which follows CUDACachingAllocator.cpp).
const (
	minBlockSize = 512     // kMinBlockSize: requests are rounded up to this
	smallSize    = 1 << 20 // kSmallSize: largest small-pool request; a large-pool remainder up to this is not split off
	smallBuffer  = 2 << 20 // kSmallBuffer: the small pool's segment size
)

// reconstruct returns the events that rebuild the state before the
// history h began, given the snapshot's final segments; none if the
// history is complete.
func reconstruct(h *history, final []snapSegment, device int) []trace.Event {
	var segs []startSegment
	var blocks []startBlock
	for addr, s := range h.preSegs {
		segs = append(segs, startSegment{addr: addr, size: s.size, stream: s.stream, small: s.size <= smallBuffer})
	}
	for addr, b := range h.pre {
		blocks = append(blocks, startBlock{addr: addr, requested: b.size, stream: b.stream, pending: b.pending, freedAt: b.first})
	}
	for _, s := range final {
		if s.bad != "" || (s.device >= 0 && s.device != int64(device)) {
			continue
		}
		_, inTrace := h.segs[s.addr]
		_, freed := h.preSegs[s.addr]
		if !inTrace && !freed && !s.expandable {
			segs = append(segs, startSegment{addr: s.addr, size: s.size, stream: s.stream, small: s.small, expandable: s.expandable})
		}
		addr := s.addr
		for _, b := range s.blocks {
			if b.haveAddr {
				addr = b.addr
			}
			if b.state == blockAllocated || b.state == blockPendingFree {
				if _, seen := h.blockAt[addr]; !seen {
					blocks = append(blocks, startBlock{addr: addr, size: b.size, requested: b.requested, stream: s.stream, pending: b.state == blockPendingFree, stack: b.stack})
				}
			}
			addr += b.size
		}
	}
	if len(segs) == 0 && len(blocks) == 0 {
		return nil
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].addr < segs[j].addr })
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].addr < blocks[j].addr })

	// Each block into the segment that holds its address.
	var orphans []startBlock
	for _, b := range blocks {
		i := sort.Search(len(segs), func(i int) bool { return segs[i].addr+segs[i].size > b.addr })
		if i == len(segs) || segs[i].addr > b.addr || segs[i].expandable || h.mapped {
			orphans = append(orphans, b)
			continue
		}
		segs[i].blocks = append(segs[i].blocks, b)
	}

	l := layout{t: h.t0, h: h}
	l.add(trace.Event{Op: trace.OpMarker}) // its label once the count is known
	for k := range segs {
		orphans = l.segment(&segs[k], orphans)
	}
	for _, f := range l.fillers {
		l.add(trace.Event{Op: trace.OpFree, Addr: f.addr, Stream: f.stream})
	}
	for _, b := range orphans {
		l.add(trace.Event{Op: trace.OpMalloc, Addr: b.addr, Size: max(b.requested, 1), Stream: b.stream, Stack: b.stack})
		if b.pending {
			l.pending = append(l.pending, b)
		}
	}
	// The free requests last, and last of all the one whose free the
	// trace completes first: a free that completes right after its
	// request is not a late one.
	sort.SliceStable(l.pending, func(i, j int) bool {
		return !h.freedFirst(l.pending[i].addr) && h.freedFirst(l.pending[j].addr)
	})
	for _, b := range l.pending {
		l.add(trace.Event{Op: trace.OpFreeRequested, Addr: b.addr, Size: b.requested, Stream: b.stream})
	}
	l.evs[0].Label = fmt.Sprintf("reconstructed %d", len(l.evs))
	return l.evs
}

// freedFirst reports whether the first event of the trace is the free of
// the block at addr.
func (h *history) freedFirst(addr uint64) bool {
	return h.first.Op == trace.OpFree && h.first.Addr == addr
}

// touchedBefore returns the lowest block address in [lo, hi] that the
// trace touched before event i.
func (h *history) touchedBefore(lo, hi uint64, i uint32) (uint64, bool) {
	sorted := h.addrs()
	for k := sort.Search(len(sorted), func(k int) bool { return sorted[k] >= lo }); k < len(sorted) && sorted[k] <= hi; k++ {
		if s, _ := h.block(sorted[k]); s.first < i {
			return sorted[k], true
		}
	}
	return 0, false
}

// addrs returns the block addresses the trace touches, sorted; to be
// called once the trace has been observed to its end.
func (h *history) addrs() []uint64 {
	if h.sorted == nil {
		h.sorted = make([]uint64, 0, len(h.blockAt))
		for a := range h.blockAt {
			h.sorted = append(h.sorted, a)
		}
		slices.Sort(h.sorted)
	}
	return h.sorted
}

// layout writes the events that lay segments out.
type layout struct {
	h       *history
	t       int64
	evs     []trace.Event
	fillers []startBlock // mallocs of free ranges, freed at the end
	pending []startBlock // blocks whose free is pending
}

func (l *layout) add(ev trace.Event) {
	ev.Time = l.t
	l.evs = append(l.evs, ev)
}

// segment lays out s and its blocks; blocks that do not fit (overlapping
// another) are added to orphans, which it returns.
func (l *layout) segment(s *startSegment, orphans []startBlock) []startBlock {
	l.add(trace.Event{Op: trace.OpSegmentAlloc, Addr: s.addr, Size: s.size, Stream: s.stream})
	if s.expandable {
		return append(orphans, s.blocks...)
	}
	if !s.small {
		l.add(trace.Event{Op: trace.OpMalloc, Addr: s.addr, Size: s.size, Stream: s.stream})
		l.add(trace.Event{Op: trace.OpFree, Addr: s.addr, Stream: s.stream})
	}
	end := s.addr + s.size
	at := s.addr
	for k, b := range s.blocks {
		if b.addr < at {
			orphans = append(orphans, b)
			continue
		}
		next := end
		if k+1 < len(s.blocks) {
			next = max(s.blocks[k+1].addr, b.addr)
		}
		size := b.size
		if size == 0 {
			// Known only by its requested size: rounded, plus a
			// remainder too small to have been split off.
			size = max((b.requested+minBlockSize-1)/minBlockSize*minBlockSize, minBlockSize)
			if b.addr+size <= next {
				gap := next - b.addr - size
				switch {
				case (s.small && gap < minBlockSize) || (!s.small && gap <= smallSize):
					size += gap
				case !s.small:
					// A free range follows, which the block may have
					// taken up to 1 MiB of. The first malloc into the
					// range while the block was live took the range's
					// start: the lowest address the trace touched
					// there before it freed the block.
					if a, ok := l.h.touchedBefore(b.addr+size, b.addr+size+smallSize, b.freedAt); ok {
						size = a - b.addr
					}
				}
			}
		}
		if b.addr+size > end {
			orphans = append(orphans, b)
			continue
		}
		l.free(s, at, b.addr)
		l.add(trace.Event{Op: trace.OpMalloc, Addr: b.addr, Size: size, Stream: s.stream, Stack: b.stack})
		if b.pending {
			l.pending = append(l.pending, b)
		}
		at = b.addr + size
	}
	l.free(s, at, end)
	return orphans
}

// free fills the free range [from, to) of s with mallocs freed later.
func (l *layout) free(s *startSegment, from, to uint64) {
	for from < to {
		n := to - from
		if s.small && n > smallSize {
			n = smallSize
		}
		l.add(trace.Event{Op: trace.OpMalloc, Addr: from, Size: n, Stream: s.stream})
		l.fillers = append(l.fillers, startBlock{addr: from, size: n, stream: s.stream})
		from += n
	}
}

// consistent checks the trace against the final segments of device (the
// snapshot holds both): in a final segment that lists its blocks, a block
// the trace leaves allocated must be an active block, and a block the trace
// last freed must not be one. It returns an error naming the trace entry
// that allocated the block.
func (h *history) consistent(final []snapSegment, device int) error {
	type span struct{ lo, hi uint64 }
	var spans []span
	active := map[uint64]bool{}
	for _, s := range final {
		if s.bad != "" || (s.device >= 0 && s.device != int64(device)) || len(s.blocks) == 0 {
			continue
		}
		spans = append(spans, span{s.addr, s.addr + s.size})
		addr := s.addr
		for _, b := range s.blocks {
			if b.haveAddr {
				addr = b.addr
			}
			if b.state == blockAllocated || b.state == blockPendingFree {
				active[addr] = true
			}
			addr += b.size
		}
	}
	if len(spans) == 0 {
		return nil
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	listed := func(addr uint64) bool {
		i := sort.Search(len(spans), func(i int) bool { return spans[i].hi > addr })
		return i < len(spans) && spans[i].lo <= addr
	}
	for _, addr := range h.addrs() {
		s, _ := h.block(addr)
		switch {
		case !listed(addr):
		case s.state == seenAllocated && !active[addr]:
			return fmt.Errorf("entry %d allocates the block at %#x, which the trace never frees and the final segments hold free", s.at, addr)
		case s.state == seenFreed && s.size != 0 && active[addr]:
			return fmt.Errorf("the trace frees the block at %#x (allocated at entry %d) for good, which the final segments hold allocated", addr, s.at)
		}
	}
	return nil
}
