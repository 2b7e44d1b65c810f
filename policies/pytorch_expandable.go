package policies

import (
	"errors"
	"fmt"
	"sort"
)

// Expandable segments (expandable_segments:True), following
// CUDACachingAllocator.cpp's ExpandableSegment, find_expandable_block,
// map_block, try_allocate_expandable_block, unmap_block and
// release_expandable_segment: per stream and pool, one address range as
// large as 9/8 of the device's memory is reserved, and pages of it (2 MiB
// in the small pool, 20 MiB in the large) are mapped when a malloc finds
// no cached block, as many as its rounded size needs, at the lowest
// address with room. Free pages are unmapped by a release (a retry or
// empty_cache); a range left with nothing mapped is given back. Each map
// and each unmap is one device call, however many pages it covers
// (num_device_alloc and num_device_free count them so).

// ptDeviceMemory is the device memory in bytes that sizes the address
// range of an expandable segment: about an NVIDIA H200's, on which the
// shared traces were recorded (139.8 GiB as CUDA reports it), a little
// under, since its ranges were recorded 161024 MiB apart. Only its order
// of magnitude matters: ranges are never filled.
const ptDeviceMemory = 143000 << 20

// ptSegment is an expandable segment: a reserved address range.
type ptSegment struct {
	base, size uint64
	page       uint64
}

// expandableSize is b's size for best fit in an expandable segment: with
// the unmapped space right after it, which it can grow into.
func expandableSize(b *ptBlock) uint64 {
	if b.next != nil && b.next.unmapped {
		return b.size + b.next.size
	}
	return b.size
}

// insertUnmapped and removeUnmapped keep pl.unmapped in (stream, address)
// order.
func (pl *ptPool) insertUnmapped(b *ptBlock) {
	i := pl.unmappedIndex(b.stream, b.addr)
	pl.unmapped = append(pl.unmapped, nil)
	copy(pl.unmapped[i+1:], pl.unmapped[i:])
	pl.unmapped[i] = b
}

func (pl *ptPool) removeUnmapped(b *ptBlock) {
	i := pl.unmappedIndex(b.stream, b.addr)
	if i == len(pl.unmapped) || pl.unmapped[i] != b {
		panic(fmt.Sprintf("policies: pytorch: unmapped block at %#x not in its pool", b.addr))
	}
	pl.unmapped = append(pl.unmapped[:i], pl.unmapped[i+1:]...)
}

func (pl *ptPool) unmappedIndex(stream, addr uint64) int {
	return sort.Search(len(pl.unmapped), func(i int) bool {
		u := pl.unmapped[i]
		return u.stream > stream || u.stream == stream && u.addr >= addr
	})
}

// allocExpandable is try_allocate_expandable_block: the block of at least
// size bytes at the lowest address of an expandable segment of stream in
// pool where free and unmapped space make room, with the pages it lacks
// mapped, out of the free blocks. It returns nil and no error when the
// device refuses a mapping.
func (p *PyTorch) allocExpandable(pool *ptPool, stream, size uint64) (*ptBlock, error) {
	c, err := p.findExpandableBlock(pool, stream, size)
	if err != nil || c == nil {
		return nil, err
	}
	if c.unmapped {
		if ok, err := p.mapBlock(c, min(c.size, size)); !ok || err != nil {
			return nil, err
		}
	}
	for c.size < size {
		next := c.next
		if next == nil {
			return nil, nil // the segment ends before size bytes
		}
		if ok, err := p.mapBlock(next, min(size-c.size, next.size)); !ok || err != nil {
			return nil, err
		}
		c = next // it took c in
	}
	p.removeFree(c)
	return c, nil
}

// findExpandableBlock is find_expandable_block: the first block, by
// address, of an unmapped run (or the free block right before it) from
// which free and unmapped blocks add up to size bytes; else the whole of a
// new segment; nil for a size no segment can hold.
func (p *PyTorch) findExpandableBlock(pool *ptPool, stream, size uint64) (*ptBlock, error) {
	allocatable := func(b *ptBlock) bool { return b != nil && !b.allocated }
	for i := pool.unmappedIndex(stream, 0); i < len(pool.unmapped) && pool.unmapped[i].stream == stream; i++ {
		c := pool.unmapped[i]
		if allocatable(c.prev) {
			c = c.prev
		}
		var room uint64
		for b := c; room < size && allocatable(b); b = b.next {
			room += b.size
		}
		if room >= size {
			return c, nil
		}
	}
	va := (ptDeviceMemory + ptDeviceMemory/8 + pool.page - 1) / pool.page * pool.page
	if size > va {
		// More than a segment's address space: no segment holds it, an
		// OOM (PyTorch's mapping of it fails).
		return nil, nil
	}
	base, err := p.mapper.Reserve(va)
	if err != nil {
		return nil, fmt.Errorf("pytorch: reserving %d bytes of address space: %w", va, err)
	}
	seg := &ptSegment{base: base, size: va, page: pool.page}
	p.segments = append(p.segments, seg)
	c := p.newBlock()
	*c = ptBlock{addr: base, size: va, stream: stream, pool: pool, seg: seg, unmapped: true}
	pool.insertUnmapped(c)
	return c, nil
}

// mapBlock is map_block: it maps the pages of the unmapped block b that
// its first size bytes touch (one device allocation), and the mapped part
// joins the free blocks, merged with free neighbours. It reports false
// when the device refuses.
func (p *PyTorch) mapBlock(b *ptBlock, size uint64) (bool, error) {
	seg, pool := b.seg, b.pool
	begin := (b.addr - seg.base) / seg.page
	end := (b.addr + size - seg.base + seg.page - 1) / seg.page
	addr, msize := seg.base+begin*seg.page, (end-begin)*seg.page
	if err := p.mapper.Map(addr, msize); err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return false, nil
		}
		return false, fmt.Errorf("pytorch: mapping %d bytes at %#x: %w", msize, addr, err)
	}
	pool.removeUnmapped(b)
	b.unmapped = false
	if msize < b.size {
		rest := p.newBlock()
		*rest = ptBlock{addr: b.addr + msize, size: b.size - msize, stream: b.stream, pool: pool, seg: seg,
			unmapped: true, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rest
		}
		b.next = rest
		b.size = msize
		pool.insertUnmapped(rest)
	}
	p.tryMerge(b, b.prev)
	p.tryMerge(b, b.next)
	p.insertFree(b)
	p.reserved += msize
	if pool.owner != nil {
		pool.owner.devAllocs++
	}
	return true, nil
}

// unmapBlock is unmap_block: it unmaps the whole pages inside the free
// block b of an expandable segment (one device free), which become an
// unmapped block merged with unmapped neighbours; the parts of pages
// before and after stay free blocks. A segment left wholly unmapped is
// given back (release_expandable_segment).
func (p *PyTorch) unmapBlock(b *ptBlock) error {
	seg, pool := b.seg, b.pool
	begin := (b.addr - seg.base + seg.page - 1) / seg.page
	end := (b.addr + b.size - seg.base) / seg.page
	if begin >= end {
		return nil
	}
	addr, usize := seg.base+begin*seg.page, (end-begin)*seg.page
	if err := p.mapper.Unmap(addr, usize); err != nil {
		return fmt.Errorf("pytorch: unmapping %d bytes at %#x: %w", usize, addr, err)
	}
	p.removeFree(b)
	if before := addr - b.addr; before > 0 {
		f := p.newBlock()
		*f = ptBlock{addr: b.addr, size: before, stream: b.stream, pool: pool, seg: seg, prev: b.prev, next: b}
		if b.prev != nil {
			b.prev.next = f
		}
		b.prev = f
		p.insertFree(f)
	}
	if after := b.addr + b.size - (addr + usize); after > 0 {
		f := p.newBlock()
		*f = ptBlock{addr: addr + usize, size: after, stream: b.stream, pool: pool, seg: seg, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = f
		}
		b.next = f
		p.insertFree(f)
	}
	b.addr, b.size, b.unmapped = addr, usize, true
	p.tryMerge(b, b.prev)
	p.tryMerge(b, b.next)
	pool.insertUnmapped(b)
	p.reserved -= usize
	if pool.owner != nil {
		pool.owner.devAllocs--
	}
	if b.prev == nil && b.next == nil {
		pool.removeUnmapped(b)
		for i, s := range p.segments {
			if s == seg {
				p.segments = append(p.segments[:i], p.segments[i+1:]...)
				break
			}
		}
		p.recycle(b)
		if err := p.mapper.Release(seg.base); err != nil {
			return fmt.Errorf("pytorch: giving back the address range at %#x: %w", seg.base, err)
		}
	}
	return nil
}
