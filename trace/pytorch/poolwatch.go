package pytorch

import (
	"fmt"
	"sort"

	"github.com/gpualloc/allocsim/trace"
)

// A private pool the snapshot does not name. A MemPool deleted before the
// dump (or a graph pool all of whose segments were freed) leaves no
// segment_pool_id, and its mallocs look like the default pools'. The
// caching allocator gives it away all the same: it makes a new segment
// for a malloc only when no cached block of the malloc's pool fits it, on
// its stream, so a new segment while a segment of that stream and pool
// (small or large) had a free block that fits means the malloc went to
// another pool. poolWatch looks for the first such malloc in the first
// reading: the free blocks are the gaps between the live blocks of the
// trace's cudaMalloc segments, each block taken as its requested size
// rounded up to 512 bytes (the allocator may have kept up to 1 MiB more
// in a large block, and under 512 bytes more in a small one: a gap counts
// only when it fits the malloc with that much to spare). Blocks whose free
// completed since the malloc before are left out (a retry's
// synchronization frees them after the search). Its finding is not used
// for a snapshot whose history was cut, whose final segments name private
// pools (pools.go places those), or whose settings change the search
// (max_split_size_mb, roundup_power2_divisions, expandable_segments);
// else pools.go looks for the pools in the order of release.
type poolWatch struct {
	segs     []*watchSeg          // live cudaMalloc segments, by address
	blockSeg map[uint64]*watchSeg // live block -> its segment
	recent   []uint64             // blocks freed since the last malloc
	newSeg   uint64               // the segment the last event allocated, 0 if none
	index    int64                // the entry index of newSeg's segment_alloc
	found    string               // the first malloc found, "" if none
}

type watchSeg struct {
	addr, size, stream uint64
	blocks             []watchBlock // live blocks by address
}

type watchBlock struct{ addr, end uint64 }

func newPoolWatch() *poolWatch { return &poolWatch{blockSeg: map[uint64]*watchSeg{}} }

// segAt returns the index in w.segs of the segment holding addr, or -1.
func (w *poolWatch) segAt(addr uint64) int {
	i := sort.Search(len(w.segs), func(i int) bool { return w.segs[i].addr > addr }) - 1
	if i >= 0 && addr < w.segs[i].addr+w.segs[i].size {
		return i
	}
	return -1
}

// observe takes entry index's event.
func (w *poolWatch) observe(index int64, ev *trace.Event) {
	newSeg := w.newSeg
	w.newSeg = 0
	switch ev.Op {
	case trace.OpSegmentAlloc:
		i := sort.Search(len(w.segs), func(i int) bool { return w.segs[i].addr > ev.Addr })
		w.segs = append(w.segs, nil)
		copy(w.segs[i+1:], w.segs[i:])
		w.segs[i] = &watchSeg{addr: ev.Addr, size: ev.Size, stream: ev.Stream}
		w.newSeg, w.index = ev.Addr, index
	case trace.OpSegmentFree:
		if i := w.segAt(ev.Addr); i >= 0 && w.segs[i].addr == ev.Addr {
			for _, b := range w.segs[i].blocks {
				delete(w.blockSeg, b.addr)
			}
			w.segs = append(w.segs[:i], w.segs[i+1:]...)
		}
	case trace.OpMalloc:
		if newSeg != 0 && ev.Addr == newSeg && w.found == "" {
			w.check(index, ev)
		}
		w.recent = w.recent[:0]
		i := w.segAt(ev.Addr)
		if i < 0 {
			return
		}
		s := w.segs[i]
		end := ev.Addr + max(roundUp512(ev.Size), 512)
		k := sort.Search(len(s.blocks), func(k int) bool { return s.blocks[k].addr > ev.Addr })
		s.blocks = append(s.blocks, watchBlock{})
		copy(s.blocks[k+1:], s.blocks[k:])
		s.blocks[k] = watchBlock{ev.Addr, end}
		w.blockSeg[ev.Addr] = s
	case trace.OpFree:
		s := w.blockSeg[ev.Addr]
		if s == nil {
			return
		}
		delete(w.blockSeg, ev.Addr)
		k := sort.Search(len(s.blocks), func(k int) bool { return s.blocks[k].addr >= ev.Addr })
		if k < len(s.blocks) && s.blocks[k].addr == ev.Addr {
			s.blocks = append(s.blocks[:k], s.blocks[k+1:]...)
		}
		w.recent = append(w.recent, ev.Addr)
	}
}

func roundUp512(n uint64) uint64 { return (n + 511) &^ 511 }

// check looks, for the malloc ev that took the new segment at its address,
// for a segment of its stream and pool with a free block that fits it.
func (w *poolWatch) check(index int64, ev *trace.Event) {
	r := max(roundUp512(ev.Size), 512)
	small := r <= 1<<20
	slack := uint64(1 << 20)
	if small {
		slack = 512
	}
	for _, s := range w.segs {
		if s.addr == ev.Addr || s.stream != ev.Stream || (s.size == 2<<20) != small || w.recentIn(s) {
			continue
		}
		at := s.addr // the end of the blocks so far
		for _, b := range append(s.blocks, watchBlock{s.addr + s.size, s.addr + s.size}) {
			if b.addr > at && b.addr-at >= r+slack {
				w.report(index, ev, s, at, b.addr-at)
				return
			}
			at = max(at, b.end)
		}
	}
}

// recentIn reports whether a block freed since the malloc before lay in s:
// its extent is not known any more, so s is left alone.
func (w *poolWatch) recentIn(s *watchSeg) bool {
	for _, a := range w.recent {
		if a >= s.addr && a < s.addr+s.size {
			return true
		}
	}
	return false
}

func (w *poolWatch) report(index int64, ev *trace.Event, s *watchSeg, at, free uint64) {
	w.found = fmt.Sprintf("trace entry %d: a malloc of %d bytes on stream %#x got a new segment of its own while the segment at %#x of that stream had %d bytes free at %#x that fit it: the two are of different pools, one a private pool the snapshot does not name (a MemPool deleted, or a graph's pool freed, before the dump), whose mallocs are replayed in the default pools", index, ev.Size, ev.Stream, s.addr, free, at)
}
