package policies

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// gmFakeDevice is a Device and Mapper that checks every call as the
// driver would: pages mapped only inside reserved ranges and only once,
// unmapped only where mapped, a range given back only with nothing mapped,
// segments freed only where allocated. Its capacity (0 for none) holds
// its allocated and mapped bytes, as a card's memory.
type gmFakeDevice struct {
	capacity uint64
	next     uint64
	segs     map[uint64]uint64 // cudaMalloc'd segments: address -> size
	ranges   map[uint64]uint64 // reserved ranges: start -> size
	mapped   map[uint64]bool   // mapped 2 MiB pages by address
	bytes    uint64            // allocated and mapped
	err      error             // the first misuse
}

func newGMFakeDevice(capacity uint64) *gmFakeDevice {
	return &gmFakeDevice{capacity: capacity, next: 1 << 40, segs: map[uint64]uint64{}, ranges: map[uint64]uint64{}, mapped: map[uint64]bool{}}
}

func (d *gmFakeDevice) fail(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	if d.err == nil {
		d.err = err
	}
	return err
}

func (d *gmFakeDevice) bump(size uint64) uint64 {
	addr := d.next
	d.next += ceilToMultiple(size, gmChunk)
	return addr
}

func (d *gmFakeDevice) Capacity() uint64 { return d.capacity }
func (d *gmFakeDevice) Reserved() uint64 { return d.bytes }

func (d *gmFakeDevice) Alloc(size uint64) (uint64, error) {
	if d.capacity > 0 && d.bytes+size > d.capacity {
		return 0, ErrOutOfMemory
	}
	addr := d.bump(size)
	d.segs[addr] = size
	d.bytes += size
	return addr, nil
}

func (d *gmFakeDevice) Free(addr uint64) error {
	size, ok := d.segs[addr]
	if !ok {
		return d.fail("free of %#x: no segment", addr)
	}
	delete(d.segs, addr)
	d.bytes -= size
	return nil
}

func (d *gmFakeDevice) Reserve(size uint64) (uint64, error) {
	addr := d.bump(size)
	d.ranges[addr] = ceilToMultiple(size, gmChunk)
	return addr, nil
}

func (d *gmFakeDevice) inRange(addr, size uint64) bool {
	for a, n := range d.ranges {
		if a <= addr && addr+size <= a+n {
			return true
		}
	}
	return false
}

func (d *gmFakeDevice) Map(addr, size uint64) error {
	if size == 0 || addr%gmChunk != 0 || size%gmChunk != 0 || !d.inRange(addr, size) {
		return d.fail("map of %d bytes at %#x: not whole pages of a reserved range", size, addr)
	}
	for a := addr; a < addr+size; a += gmChunk {
		if d.mapped[a] {
			return d.fail("map of %d bytes at %#x: the page at %#x is mapped", size, addr, a)
		}
	}
	if d.capacity > 0 && d.bytes+size > d.capacity {
		return fmt.Errorf("map of %d bytes: %w", size, ErrOutOfMemory)
	}
	for a := addr; a < addr+size; a += gmChunk {
		d.mapped[a] = true
	}
	d.bytes += size
	return nil
}

func (d *gmFakeDevice) Unmap(addr, size uint64) error {
	for a := addr; a < addr+size; a += gmChunk {
		if !d.mapped[a] {
			return d.fail("unmap of %d bytes at %#x: the page at %#x is not mapped", size, addr, a)
		}
	}
	for a := addr; a < addr+size; a += gmChunk {
		delete(d.mapped, a)
	}
	d.bytes -= size
	return nil
}

func (d *gmFakeDevice) Release(addr uint64) error {
	n, ok := d.ranges[addr]
	if !ok {
		return d.fail("release of %#x: no range", addr)
	}
	for a := addr; a < addr+n; a += gmChunk {
		if d.mapped[a] {
			return d.fail("release of %#x: the page at %#x is mapped", addr, a)
		}
	}
	delete(d.ranges, addr)
	return nil
}

// check returns an error for the first of GMLake's own invariants that p
// breaks on dev: the stitched blocks' counts of busy pages, their place
// among the reusable ones, the pages' references and places, the held
// blocks, the reserved and free bytes; and every page of a live segment
// mapped once, where p says, and those of a handed-out block where it is
// handed out.
func (p *GMLake) check(dev *gmFakeDevice) error {
	if dev.err != nil {
		return dev.err
	}
	// The segments: from the blocks of the pools, the handed-out blocks
	// and the held ones.
	segs := map[*gmSeg]bool{}
	var smallBytes, free uint64
	seen := map[*gmBlock]bool{}
	visit := func(b *gmBlock) {
		if b.seg != nil {
			segs[b.seg] = true
		}
	}
	for _, b := range p.large.vals {
		visit(b)
	}
	for _, b := range p.active {
		visit(b)
	}
	for _, st := range p.stitches {
		for _, b := range st.held {
			visit(b)
		}
	}
	for _, set := range []*gmSet[*gmBlock]{&p.small, &p.large} {
		for k, b := range set.vals {
			if b.allocated {
				return fmt.Errorf("free block at %#x is allocated", b.addr)
			}
			if set.keys[k] != (gmKey{b.stream, b.size, b.addr}) {
				return fmt.Errorf("free block at %#x under key %+v", b.addr, set.keys[k])
			}
			free += b.size
		}
	}
	if free != p.freeBytes || len(p.bySize.vals) != len(p.small.vals)+len(p.large.vals) {
		return fmt.Errorf("free bytes %d counted %d; %d by size of %d", free, p.freeBytes, len(p.bySize.vals), len(p.small.vals)+len(p.large.vals))
	}
	for _, b := range p.small.vals {
		if b.prev == nil && b.next == nil {
			smallBytes += b.size
		}
	}
	var segBytes uint64
	used := map[gmPageRef]bool{}
	for seg := range segs {
		segBytes += seg.size
		var end uint64 = seg.base
		for b := seg.first; b != nil; b = b.next {
			if b.addr != end || b.seg != seg || b.prev != nil && b.prev.next != b {
				return fmt.Errorf("segment at %#x: block at %#x out of place", seg.base, b.addr)
			}
			if b.prev != nil && !b.prev.allocated && !b.allocated {
				return fmt.Errorf("segment at %#x: free blocks at %#x and %#x not merged", seg.base, b.prev.addr, b.addr)
			}
			seen[b] = true
			if b.allocated {
				for i := p.pageOf(b); i < p.pageOf(b)+int(b.size/gmChunk); i++ {
					used[gmPageRef{seg, i}] = true
				}
			}
			end += b.size
		}
		if end != seg.base+seg.size {
			return fmt.Errorf("segment at %#x: blocks end at %#x", seg.base, end)
		}
		refs, away := 0, 0
		if seg.pages == nil {
			for a := seg.base; a < seg.base+seg.size; a += gmChunk {
				if !dev.mapped[a] {
					return fmt.Errorf("segment at %#x, never stitched: page at %#x not mapped", seg.base, a)
				}
			}
		}
		for i := range seg.pages {
			pg := &seg.pages[i]
			refs += len(pg.refs)
			for _, r := range pg.refs {
				if r.st.pages[r.ix] != (gmPageRef{seg, i}) {
					return fmt.Errorf("page %d of %#x: a reference to page %d of the stitched block at %#x, which is another", i, seg.base, r.ix, r.st.base)
				}
			}
			addr := seg.base + uint64(i)*gmChunk
			switch {
			case pg.at == nil:
			case pg.at == gmNowhere:
				return fmt.Errorf("page %d of live segment %#x mapped nowhere", i, seg.base)
			default:
				away++
				if pg.at.pages[pg.atIx] != (gmPageRef{seg, i}) {
					return fmt.Errorf("page %d of %#x at index %d of the stitched block at %#x, which is another page", i, seg.base, pg.atIx, pg.at.base)
				}
				addr = pg.at.base + uint64(pg.atIx)*gmChunk
			}
			if !dev.mapped[addr] {
				return fmt.Errorf("page %d of %#x not mapped at %#x", i, seg.base, addr)
			}
		}
		if refs != seg.refs || away != seg.away {
			return fmt.Errorf("segment at %#x: %d references counted %d, %d pages away counted %d", seg.base, refs, seg.refs, away, seg.away)
		}
	}
	if uint64(len(dev.mapped))*gmChunk+smallBytes+p.smallLive() != dev.bytes || segBytes+smallBytes+p.smallLive() != p.reserved {
		return fmt.Errorf("device %d bytes, %d mapped; segments %d, reserved %d", dev.bytes, len(dev.mapped)*gmChunk, segBytes, p.reserved)
	}
	for _, b := range p.active {
		if !b.allocated {
			return fmt.Errorf("handed-out block at %#x not allocated", b.addr)
		}
		if b.seg != nil && b.seg.pages != nil {
			for i := p.pageOf(b); i < p.pageOf(b)+int(b.size/gmChunk); i++ {
				if b.seg.pages[i].at != nil {
					return fmt.Errorf("handed-out block at %#x: page %d not at home", b.addr, i)
				}
			}
		}
	}
	reusable := 0
	for _, st := range p.stitches {
		busy := 0
		for ix, r := range st.pages {
			if r.seg == nil {
				if !st.doomed {
					return fmt.Errorf("stitched block at %#x lost a page and is not doomed", st.base)
				}
				continue
			}
			if !segs[r.seg] {
				return fmt.Errorf("stitched block at %#x over a segment given back", st.base)
			}
			if used[r] {
				busy++
			}
			if ix < st.used && r.page().at != st {
				return fmt.Errorf("stitched block at %#x: used page %d not mapped in it", st.base, ix)
			}
		}
		if busy != st.busy {
			return fmt.Errorf("stitched block at %#x: %d pages busy, counted %d", st.base, busy, st.busy)
		}
		if st.allocated != (p.stitched[st.base] == st) || st.allocated != (len(st.held) > 0) {
			return fmt.Errorf("stitched block at %#x: allocated %v, handed out %v, holds %d", st.base, st.allocated, p.stitched[st.base] == st, len(st.held))
		}
		var held uint64
		for _, b := range st.held {
			if !b.allocated || p.active[b.addr] == b {
				return fmt.Errorf("stitched block at %#x holds the block at %#x, not allocated or handed out", st.base, b.addr)
			}
			held += b.size
		}
		if held != uint64(st.used)*gmChunk {
			return fmt.Errorf("stitched block at %#x holds %d bytes for %d pages", st.base, held, st.used)
		}
		if want := !st.allocated && !st.doomed && busy == 0; want != st.inSet {
			return fmt.Errorf("stitched block at %#x: reusable %v, in the set %v", st.base, want, st.inSet)
		}
		if st.inSet {
			reusable++
		}
	}
	if reusable != len(p.reusable.vals) || reusable != len(p.reusableBySize.vals) {
		return fmt.Errorf("%d reusable stitched blocks, %d and %d in the sets", reusable, len(p.reusable.vals), len(p.reusableBySize.vals))
	}
	return nil
}

// smallLive returns the bytes of the small pool's segments that hold an
// allocated block.
func (p *GMLake) smallLive() uint64 {
	heads := map[*gmBlock]bool{}
	for _, b := range p.active {
		if b.seg != nil {
			continue
		}
		for b.prev != nil {
			b = b.prev
		}
		heads[b] = true
	}
	var n uint64
	for b := range heads {
		for c := b; c != nil; c = c.next {
			n += c.size
		}
	}
	return n
}

// TestGMLakeInvariants drives gmlake directly, on a fake device that checks
// every call, with random mallocs (large requests of a few sizes, some
// larger than most free blocks, so stitched; after a stitched block is
// freed, often its size again or less, so reused), frees, empty_caches,
// and episodes that end in a segment given back under a stitched block in
// use: on a stream of their own, three or four segments freed, a request
// stitched from them all, freed, taken again for all but the last
// segment's pages, and empty_cache. It checks GMLake's invariants
// (GMLake.check) after each call, and that the traces did stitch, reuse and
// give back pages under a stitched block in use.
func TestGMLakeInvariants(t *testing.T) {
	var stitched, reused, dropped int
	rapid.Check(t, func(t *rapid.T) {
		capacity := uint64(0)
		if rapid.IntRange(0, 3).Draw(t, "capped") > 0 {
			capacity = uint64(rapid.IntRange(24, 200).Draw(t, "capacityMiB")) << 20
		}
		dev := newGMFakeDevice(capacity)
		s := Settings{
			gmKeyFragLimit:   fmt.Sprint(rapid.IntRange(0, 16).Draw(t, "fragLimitMiB")) + "MiB",
			gmKeyReuseLimit:  []string{"1", "2", "10"}[rapid.IntRange(0, 2).Draw(t, "reuseLimit")],
			gmKeyDefragLevel: []string{"0", "0", "0", "1", "2"}[rapid.IntRange(0, 4).Draw(t, "defragLevel")],
			gmKeyAutoGC:      []string{"0", "1000"}[rapid.IntRange(0, 1).Draw(t, "autoGC")],
		}
		p, err := NewGMLake(dev, s)
		if err != nil {
			t.Fatal(err)
		}
		type live struct{ addr, size, stream uint64 }
		var lives []live
		var freed []live // stitched blocks freed, and a few others
		calls := 0
		check := func(what string) {
			calls++
			if err := p.check(dev); err != nil {
				t.Fatalf("call %d (%s): %v", calls, what, err)
			}
		}
		// malloc returns the block for size bytes on stream, and whether
		// the malloc succeeded.
		malloc := func(size, stream uint64) (*gmStitch, bool) {
			existed := map[*gmStitch]bool{}
			for _, st := range p.stitches {
				existed[st] = true
			}
			b, err := p.Malloc(size, stream)
			if err != nil && !errors.Is(err, ErrOutOfMemory) {
				t.Fatalf("call %d: malloc of %d: %v", calls, size, err)
			}
			check(fmt.Sprintf("malloc of %d bytes on stream %d: %+v, %v", size, stream, b, err))
			if err != nil {
				return nil, false
			}
			lives = append(lives, live{b.Addr, size, stream})
			st := p.stitched[b.Addr]
			if st != nil && existed[st] {
				reused++
			} else if st != nil {
				stitched++
			}
			return st, true
		}
		free := func(i int) {
			st := p.stitched[lives[i].addr]
			if st != nil && st.doomed {
				dropped++
			}
			if err := p.Free(lives[i].addr, lives[i].stream); err != nil {
				t.Fatalf("call %d: %v", calls, err)
			}
			check(fmt.Sprintf("free of %#x", lives[i].addr))
			if st != nil || rapid.IntRange(0, 3).Draw(t, "remember") == 0 {
				freed = append(freed, lives[i])
			}
			lives = append(lives[:i], lives[i+1:]...)
		}
		emptyCache := func() {
			if err := p.EmptyCache(); err != nil {
				t.Fatalf("call %d: empty_cache: %v", calls, err)
			}
			check("empty_cache")
		}
		for range rapid.IntRange(50, 300).Draw(t, "ops") {
			switch a := rapid.IntRange(0, 19).Draw(t, "action"); {
			case a < 9 || len(lives) == 0:
				size := uint64(rapid.IntRange(1, 20).Draw(t, "sizeChunks")) * gmChunk
				stream := uint64(rapid.IntRange(0, 1).Draw(t, "stream"))
				switch rapid.IntRange(0, 7).Draw(t, "kind") {
				case 0:
					size = uint64(rapid.IntRange(1, 1<<20).Draw(t, "small"))
				case 1, 2, 3:
					// A size freed lately, on its stream, less a few
					// pages: a stitched block's, which it may take
					// again.
					if n := len(freed); n > 0 {
						f := freed[n-1-rapid.IntRange(0, min(n-1, 3)).Draw(t, "again")]
						size, stream = f.size, f.stream
						if less := uint64(rapid.IntRange(0, 4).Draw(t, "lessChunks")) * gmChunk; less < size {
							size -= less
						}
					}
				case 4:
					size -= uint64(rapid.IntRange(0, 1<<20).Draw(t, "less"))
				case 5, 6:
					// Larger than most free blocks: stitched.
					size = uint64(rapid.IntRange(20, 60).Draw(t, "bigChunks")) * gmChunk
				}
				malloc(size, stream)
			case a < 18:
				free(rapid.IntRange(0, len(lives)-1).Draw(t, "victim"))
			case a < 19:
				emptyCache()
			default:
				// The episode, on stream 9.
				n := rapid.IntRange(3, 4).Draw(t, "segments")
				var sizes []uint64
				var sum uint64
				from := len(lives)
				for range n {
					c := uint64(rapid.IntRange(5, 15).Draw(t, "segmentChunks")) * gmChunk
					if _, ok := malloc(c, 9); !ok {
						break
					}
					sizes = append(sizes, c)
					sum += c
				}
				for len(lives) > from {
					free(len(lives) - 1)
				}
				if len(sizes) < 3 {
					break
				}
				st, ok := malloc(sum, 9)
				if !ok || st == nil {
					break
				}
				free(len(lives) - 1)
				// All but the last (smallest) block's pages.
				last := sizes[0]
				for _, c := range sizes {
					last = min(last, c)
				}
				if _, ok := malloc(sum-last, 9); ok {
					emptyCache()
				}
			}
		}
	})
	t.Logf("%d stitched, %d reused, %d freed after losing pages", stitched, reused, dropped)
	if stitched == 0 || reused == 0 || dropped == 0 {
		t.Errorf("the traces never stitched, reused or dropped pages: the test tests less than it says")
	}
}
