package kineto

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gpualloc/allocsim/trace"
)

// The device calls of a torch.profiler trace are not in it; its memory
// events carry the allocator's reserved bytes after each (Total
// Reserved), and Import explains every change of them by the calls that
// PyTorch's caching allocator makes, given the blocks the trace shows
// (Addr and Bytes, the block's size), with one of two models:
//
//   - cudaMalloc segments (the default settings): a malloc outside every
//     known segment made a new one at its address (the block is carved
//     from a segment's start) of the size the allocator asks for such a
//     block (2 MiB up to 1 MiB, 20 MiB below 10 MiB, else the block
//     rounded up to 2 MiB): trace.OpSegmentAlloc;
//   - expandable segments (expandable_segments:True): each pool's blocks
//     lie in one reserved address range (2 MiB pages for blocks up to
//     1 MiB, 20 MiB pages above, the range as large as the device's
//     memory and an eighth), and a malloc maps the pages of its block that
//     are not mapped, each run of them one trace.OpSegmentMap.
//
// A drop of Total Reserved is a release of the cached memory (an explicit
// empty_cache, or the release of a malloc that found no memory before it
// retried or failed): every segment without an allocated block is freed
// (trace.OpSegmentFree), or every whole page of a free block of an
// expandable segment unmapped (trace.OpSegmentUnmap, and a range left
// without pages is given back), the large pool first, each pool's blocks
// in (size, address) order, as PyTorch releases them on one stream. A free
// is counted free there even where the block was still in use on another
// stream: PyTorch synchronizes before such a release.
//
// Import takes the model that explains the trace to its end, or further.
// From the first change that its model cannot explain (a profile that
// started after the job had memory, a garbage_collection_threshold or a
// max_split_size that release part of the cache, CUDA graphs' private
// pools), it gives only the drops of Total Reserved, each as one
// trace.OpSegmentFree of the bytes released at address 0, so that a replay
// as recorded still sees where the program released its cache; Metadata
// "device_calls" names the model, and that event.
//
// On the four H200 recordings of testdata/profiler the calls inferred are
// those of the memory snapshot of the same process (segment_alloc,
// segment_free, segment_map, segment_unmap, address for address), in the
// snapshot's order where the process used one stream, and in (size,
// address) order within a release where it used two (PyTorch orders by
// stream first).

// segmentKind is the kind of segments a trace's reserved bytes follow.
type segmentKind uint8

const (
	segmentsPlain      segmentKind = iota // cudaMalloc segments
	segmentsExpandable                    // expandable segments
)

func (k segmentKind) String() string {
	if k == segmentsExpandable {
		return "expandable segments (a setting the trace does not record: replay with --set pytorch.expandable_segments=True)"
	}
	return "cudaMalloc segments"
}

// PyTorch's sizes (c10/cuda/CUDACachingAllocator.cpp).
const (
	mib           = 1 << 20
	smallSize     = 1 * mib  // the largest block of the small pool
	smallBuffer   = 2 * mib  // a small pool segment; a small expandable page
	largeBuffer   = 20 * mib // a segment for blocks below minLargeAlloc; a large expandable page
	minLargeAlloc = 10 * mib
	roundLarge    = 2 * mib
	// defaultMemory sizes an expandable range when deviceProperties give
	// no memory (the pytorch policy's value).
	defaultMemory = 143000 * mib
)

// segmentSize is the size of the cudaMalloc segment that a malloc of a
// block of size bytes makes.
func segmentSize(size uint64) uint64 {
	switch {
	case size <= smallSize:
		return smallBuffer
	case size < minLargeAlloc:
		return largeBuffer
	}
	return (size + roundLarge - 1) / roundLarge * roundLarge
}

// model is a kind of segments: it explains the change of Total Reserved
// at each memory event.
type model interface {
	// step appends to out the device calls made before r (their Time and
	// Thread left 0) that change Total Reserved by delta bytes, and
	// applies r. It returns false, and out as it was, when no such calls
	// exist; the model is then of no further use.
	step(r *record, delta int64, out []trace.Event) ([]trace.Event, bool)
}

// inferrer adds the device calls to a trace's memory events.
type inferrer struct {
	m       model
	kind    segmentKind
	prev    uint64 // Total Reserved before the next event
	events  int64  // events given so far
	failed  int64  // event index of the first change not explained, -1
	failure string // what it was
}

func newInferrer(kind segmentKind, memory uint64) *inferrer {
	in := &inferrer{kind: kind, failed: -1}
	if kind == segmentsExpandable {
		if memory == 0 {
			memory = defaultMemory
		}
		in.m = &expandableModel{live: map[uint64]uint64{}, memory: memory}
	} else {
		in.m = &plainModel{live: map[uint64]*segment{}}
	}
	return in
}

// calls appends to out the device calls made before r, the i-th memory
// event.
func (in *inferrer) calls(i int64, r *record, out []trace.Event) []trace.Event {
	delta := int64(r.reserved) - int64(in.prev)
	n := len(out)
	if in.failed < 0 {
		var ok bool
		if out, ok = in.m.step(r, delta, out); !ok {
			in.failed = in.events + int64(len(out)-n)
			in.failure = fmt.Sprintf("Total Reserved from %d to %d bytes at event %d (memory event %d, a %s of %d bytes at %#x, after byte %d)",
				in.prev, r.reserved, in.failed, i, opName(r.op), r.size, r.addr, r.offset)
			in.m = nil
		}
	}
	if in.failed >= 0 && delta < 0 {
		out = append(out, trace.Event{Op: trace.OpSegmentFree, Size: uint64(-delta)})
	}
	in.prev = r.reserved
	in.events += int64(len(out)-n) + 1
	return out
}

func opName(op trace.Op) string {
	switch op {
	case trace.OpMalloc:
		return "malloc"
	case trace.OpFree:
		return "free"
	}
	return "failed malloc"
}

// describe is Metadata "device_calls" after the last event.
func (in *inferrer) describe() string {
	if in.failed < 0 {
		return in.kind.String() + ", inferred from Total Reserved at every event"
	}
	return fmt.Sprintf("%s, inferred from Total Reserved up to event %d; from there only its drops, as segment_free of the bytes released at address 0: no device calls explain %s",
		in.kind, in.failed, in.failure)
}

// choose returns the kind of segments that explains recs furthest, with
// its Metadata "device_calls", and the number of frees of an address no
// malloc gave (as text).
func choose(recs []record, memory uint64) (segmentKind, string, string) {
	run := func(kind segmentKind) (*inferrer, int64) {
		in := newInferrer(kind, memory)
		live := map[uint64]bool{}
		unknown := int64(0)
		var out []trace.Event
		for k := range recs {
			r := &recs[k]
			out = in.calls(int64(k), r, out[:0])
			switch r.op {
			case trace.OpMalloc:
				live[r.addr] = true
			case trace.OpFree:
				if !live[r.addr] {
					unknown++
				}
				delete(live, r.addr)
			}
		}
		return in, unknown
	}
	best, unknown := run(segmentsPlain)
	if best.failed >= 0 {
		if x, _ := run(segmentsExpandable); x.failed < 0 || x.failed > best.failed {
			best = x
		}
	}
	return best.kind, best.describe(), strconv.FormatInt(unknown, 10)
}

// segment is a cudaMalloc segment of plainModel.
type segment struct {
	addr, size uint64
	small      bool // of the small pool
	live       int  // allocated blocks
}

// plainModel is the model of cudaMalloc segments.
type plainModel struct {
	segs []*segment          // by address
	live map[uint64]*segment // allocated blocks by address: their segment
}

// find returns the segment that holds addr, or nil, and the index of the
// first segment above addr.
func (m *plainModel) find(addr uint64) (*segment, int) {
	return findRange(m.segs, addr, func(s *segment) (uint64, uint64) { return s.addr, s.size })
}

// findRange returns the range of xs (disjoint, by address; bounds gives a
// range's start and size) that holds addr, or nil, and the index of the
// first range above addr.
func findRange[T any](xs []*T, addr uint64, bounds func(*T) (start, size uint64)) (*T, int) {
	i, _ := slices.BinarySearchFunc(xs, addr, func(x *T, a uint64) int {
		start, size := bounds(x)
		switch {
		case start+size <= a:
			return -1
		case start > a:
			return 1
		}
		return 0
	})
	if i < len(xs) {
		if start, size := bounds(xs[i]); start <= addr && addr < start+size {
			return xs[i], i
		}
	}
	return nil, i
}

// cached returns the bytes of the segments without allocated blocks.
func (m *plainModel) cached() uint64 {
	var n uint64
	for _, s := range m.segs {
		if s.live == 0 {
			n += s.size
		}
	}
	return n
}

// release frees the segments without allocated blocks, in the order
// PyTorch does.
func (m *plainModel) release(out []trace.Event) []trace.Event {
	var free []*segment
	kept := m.segs[:0]
	for _, s := range m.segs {
		if s.live == 0 {
			free = append(free, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(m.segs[len(kept):])
	m.segs = kept
	slices.SortFunc(free, func(a, b *segment) int {
		return compareRelease(a.small, b.small, a.size, b.size, a.addr, b.addr)
	})
	for _, s := range free {
		out = append(out, trace.Event{Op: trace.OpSegmentFree, Addr: s.addr, Size: s.size})
	}
	return out
}

// compareRelease orders the blocks a release goes through: the large
// pool's first, then by size, then by address.
func compareRelease(smallA, smallB bool, sizeA, sizeB, addrA, addrB uint64) int {
	switch {
	case smallA != smallB:
		if smallB {
			return -1
		}
		return 1
	case sizeA != sizeB:
		if sizeA < sizeB {
			return -1
		}
		return 1
	case addrA != addrB:
		if addrA < addrB {
			return -1
		}
		return 1
	}
	return 0
}

func (m *plainModel) step(r *record, delta int64, out []trace.Event) ([]trace.Event, bool) {
	n := len(out)
	fail := func() ([]trace.Event, bool) { return out[:n], false }
	switch r.op {
	case trace.OpMalloc:
		if _, dup := m.live[r.addr]; dup {
			return fail()
		}
		s, _ := m.find(r.addr)
		need := uint64(0)
		if s == nil {
			need = segmentSize(r.size)
		}
		if int64(need) != delta {
			// A release came first: the segment of the malloc is one
			// that keeps an allocated block, or a new one.
			cached := m.cached()
			if cached == 0 {
				return fail()
			}
			if s != nil && s.live == 0 {
				s = nil
			}
			need = 0
			if s == nil {
				need = segmentSize(r.size)
			}
			if int64(need)-int64(cached) != delta {
				return fail()
			}
			out = m.release(out)
		}
		if s == nil {
			_, i := m.find(r.addr)
			if i < len(m.segs) && m.segs[i].addr < r.addr+need || r.addr+need < r.addr {
				return fail() // overlaps the next segment
			}
			s = &segment{addr: r.addr, size: need, small: r.size <= smallSize}
			m.segs = slices.Insert(m.segs, i, s)
			out = append(out, trace.Event{Op: trace.OpSegmentAlloc, Addr: s.addr, Size: s.size})
		} else if r.addr+r.size > s.addr+s.size || r.addr+r.size < r.addr {
			return fail()
		}
		s.live++
		m.live[r.addr] = s
	case trace.OpFree, trace.OpMallocFailed:
		if delta > 0 {
			return fail()
		}
		if delta < 0 {
			if int64(m.cached()) != -delta {
				return fail()
			}
			out = m.release(out)
		}
		if s := m.live[r.addr]; r.op == trace.OpFree && s != nil {
			s.live--
			delete(m.live, r.addr)
		}
	}
	return out, true
}

// xrange is an expandable segment: a reserved address range and the runs
// of its pages that are mapped.
type xrange struct {
	start, size uint64
	page        uint64
	small       bool
	mapped      []span // by address, apart, of whole pages
}

// span is the address range [lo, hi).
type span struct{ lo, hi uint64 }

// expandableModel is the model of expandable segments.
type expandableModel struct {
	ranges []*xrange         // by start
	live   map[uint64]uint64 // allocated blocks by address: their size
	memory uint64            // the device's memory, which sizes a range
}

func (m *expandableModel) find(addr uint64) (*xrange, int) {
	return findRange(m.ranges, addr, func(x *xrange) (uint64, uint64) { return x.start, x.size })
}

// unmapped returns the runs of pages of x that [addr, addr+size) meets
// and that are not mapped.
func (x *xrange) unmapped(addr, size uint64) []span {
	lo := x.start + (addr-x.start)/x.page*x.page
	hi := x.start + (addr+size-x.start+x.page-1)/x.page*x.page
	var out []span
	at := lo
	for _, s := range x.mapped {
		if s.hi <= at {
			continue
		}
		if s.lo >= hi {
			break
		}
		if s.lo > at {
			out = append(out, span{at, s.lo})
		}
		at = max(at, s.hi)
	}
	if at < hi {
		out = append(out, span{at, hi})
	}
	return out
}

// mapRun marks [lo, hi) of x mapped.
func (x *xrange) mapRun(lo, hi uint64) {
	i, _ := slices.BinarySearchFunc(x.mapped, lo, func(s span, a uint64) int {
		if s.lo < a {
			return -1
		}
		if s.lo > a {
			return 1
		}
		return 0
	})
	x.mapped = slices.Insert(x.mapped, i, span{lo, hi})
	// Merge with the neighbours it touches.
	merged := x.mapped[:0]
	for _, s := range x.mapped {
		if k := len(merged); k > 0 && merged[k-1].hi >= s.lo {
			merged[k-1].hi = max(merged[k-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	x.mapped = merged
}

// unmapRun marks [lo, hi) of x, inside a mapped run, not mapped.
func (x *xrange) unmapRun(lo, hi uint64) {
	for k, s := range x.mapped {
		if s.lo <= lo && hi <= s.hi {
			var parts []span
			if s.lo < lo {
				parts = append(parts, span{s.lo, lo})
			}
			if hi < s.hi {
				parts = append(parts, span{hi, s.hi})
			}
			x.mapped = slices.Replace(x.mapped, k, k+1, parts...)
			return
		}
	}
}

// unmap is one unmap of a release: the whole pages of a free block.
type unmap struct {
	x     *xrange
	block span // the free block
	pages span
}

// releasePlan returns the unmaps of a release: the whole pages of every
// free block (a run of mapped pages less the allocated blocks), in the
// order PyTorch makes them.
func (m *expandableModel) releasePlan() []unmap {
	blocks := make([]span, 0, len(m.live))
	for a, n := range m.live {
		blocks = append(blocks, span{a, a + n})
	}
	slices.SortFunc(blocks, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var out []unmap
	for _, x := range m.ranges {
		for _, run := range x.mapped {
			at := run.lo
			i, _ := slices.BinarySearchFunc(blocks, run.lo, func(b span, a uint64) int {
				if b.hi <= a {
					return -1
				}
				return 1
			})
			free := func(lo, hi uint64) {
				plo := x.start + (lo-x.start+x.page-1)/x.page*x.page
				phi := x.start + (hi-x.start)/x.page*x.page
				if phi > plo {
					out = append(out, unmap{x, span{lo, hi}, span{plo, phi}})
				}
			}
			for ; i < len(blocks) && blocks[i].lo < run.hi; i++ {
				if blocks[i].lo > at {
					free(at, blocks[i].lo)
				}
				at = max(at, blocks[i].hi)
			}
			if at < run.hi {
				free(at, run.hi)
			}
		}
	}
	slices.SortFunc(out, func(a, b unmap) int {
		return compareRelease(a.x.small, b.x.small, a.block.hi-a.block.lo, b.block.hi-b.block.lo, a.block.lo, b.block.lo)
	})
	return out
}

// release makes the unmaps of plan, and gives back the ranges left
// without pages.
func (m *expandableModel) release(plan []unmap, out []trace.Event) []trace.Event {
	for _, u := range plan {
		u.x.unmapRun(u.pages.lo, u.pages.hi)
		out = append(out, trace.Event{Op: trace.OpSegmentUnmap, Addr: u.pages.lo, Size: u.pages.hi - u.pages.lo})
	}
	m.ranges = slices.DeleteFunc(m.ranges, func(x *xrange) bool { return len(x.mapped) == 0 })
	return out
}

func sumPages(plan []unmap) uint64 {
	var n uint64
	for _, u := range plan {
		n += u.pages.hi - u.pages.lo
	}
	return n
}

func sumSpans(runs []span) uint64 {
	var n uint64
	for _, s := range runs {
		n += s.hi - s.lo
	}
	return n
}

func (m *expandableModel) step(r *record, delta int64, out []trace.Event) ([]trace.Event, bool) {
	n := len(out)
	fail := func() ([]trace.Event, bool) { return out[:n], false }
	switch r.op {
	case trace.OpMalloc:
		if _, dup := m.live[r.addr]; dup || r.addr+r.size < r.addr {
			return fail()
		}
		x := m.rangeFor(r)
		if x == nil {
			return fail()
		}
		maps := x.unmapped(r.addr, r.size)
		if int64(sumSpans(maps)) != delta {
			plan := m.releasePlan()
			freed := sumPages(plan)
			if freed == 0 {
				return fail()
			}
			out = m.release(plan, out)
			if x = m.rangeFor(r); x == nil {
				return fail()
			}
			maps = x.unmapped(r.addr, r.size)
			if int64(sumSpans(maps))-int64(freed) != delta {
				return fail()
			}
		}
		for _, s := range maps {
			x.mapRun(s.lo, s.hi)
			out = append(out, trace.Event{Op: trace.OpSegmentMap, Addr: s.lo, Size: s.hi - s.lo})
		}
		m.live[r.addr] = r.size
	case trace.OpFree, trace.OpMallocFailed:
		if delta > 0 {
			return fail()
		}
		if delta < 0 {
			plan := m.releasePlan()
			if int64(sumPages(plan)) != -delta {
				return fail()
			}
			out = m.release(plan, out)
		}
		if r.op == trace.OpFree {
			delete(m.live, r.addr)
		}
	}
	return out, true
}

// rangeFor returns the range that holds the block of malloc r, reserving
// one from its address when none does, or nil when the block does not fit
// in one.
func (m *expandableModel) rangeFor(r *record) *xrange {
	x, i := m.find(r.addr)
	if x == nil {
		page := uint64(largeBuffer)
		if r.size <= smallSize {
			page = smallBuffer
		}
		size := (m.memory + m.memory/8 + page - 1) / page * page
		if r.addr+size < r.addr || i < len(m.ranges) && m.ranges[i].start < r.addr+size {
			return nil
		}
		x = &xrange{start: r.addr, size: size, page: page, small: r.size <= smallSize}
		m.ranges = slices.Insert(m.ranges, i, x)
	}
	if r.addr+r.size > x.start+x.size {
		return nil
	}
	return x
}
