package policies

import (
	"errors"
	"fmt"
	"slices"
)

// GMLake's virtual memory stitching (gmlake.go has the malloc and free
// paths): get_fused_fragmented_blocks (stitch), the reuse of a cached
// stitched block in get_free_block (findReusable, reuse), the free of one
// in update_block (freeStitch), garbage_collect_fused_blocks (collect),
// and release_block's handling of the stitched blocks over a segment given
// back (releaseSegment). Where GMLake maps a chunk at a second address,
// the pages move (see GMLake): place and placeHome.

// gmStitch is a stitched block (a fused block): an address range of its own
// over pages of the large pool's segments, in order.
type gmStitch struct {
	base, size uint64
	stream     uint64
	pages      []gmPageRef
	// held are the original blocks whose pages it uses while handed out
	// (its first used pages), allocated on its behalf.
	held      []*gmBlock
	used      int // pages in use while handed out
	busy      int // its pages in use, by it or by original blocks
	allocated bool
	doomed    bool // a segment under it was given back while it was in use
	inSet     bool // in p.reusable
}

// gmPageRef is the page of index i of segment seg; seg is nil for a page
// dropped with its segment.
type gmPageRef struct {
	seg *gmSeg
	i   int
}

func (r gmPageRef) page() *gmPage { return &r.seg.pages[r.i] }

// key returns st's key in p.reusable.
func (st *gmStitch) key() gmKey { return gmKey{st.stream, st.size, st.base} }

// refresh puts st into the reusable stitched blocks or takes it out, as it
// is free with all its pages free or not.
func (p *GMLake) refresh(st *gmStitch) {
	want := !st.allocated && !st.doomed && st.busy == 0
	if want == st.inSet {
		return
	}
	st.inSet = want
	k := st.key()
	if want {
		p.reusable.insert(k, st)
		p.reusableBySize.insert(gmKey{0, k.size, k.addr}, st)
	} else {
		p.reusable.remove(k)
		p.reusableBySize.remove(gmKey{0, k.size, k.addr})
	}
}

// pagesInUse counts the pages of the large block b, which became
// allocated (d = 1) or free (d = -1), in or out of the stitched blocks over
// them.
func (p *GMLake) pagesInUse(b *gmBlock, d int) {
	seg := b.seg
	if seg == nil || seg.refs == 0 {
		return
	}
	first := p.pageOf(b)
	for i := first; i < first+int(b.size/gmChunk); i++ {
		for _, r := range seg.pages[i].refs {
			r.st.busy += d
			p.refresh(r.st)
		}
	}
}

// findReusable returns the cached stitched block of stream that a request
// of rsize bytes takes, nil if none: the smallest of at least rsize bytes
// (the lowest address among equals) whose pages are all free, if it is no
// larger than reuseLimit times rsize.
func (p *GMLake) findReusable(stream, rsize uint64) *gmStitch {
	i := p.reusable.search(gmKey{stream, rsize, 0})
	if i == len(p.reusable.keys) || p.reusable.keys[i].stream != stream {
		return nil
	}
	st := p.reusable.vals[i]
	if float64(st.size) > float64(rsize)*p.reuseLimit {
		return nil
	}
	return st
}

// reuse hands out the cached stitched block st for rsize bytes: its first
// rsize/2 MiB pages are taken out of the free blocks that hold them, which
// are split at page bounds, and mapped in its range.
func (p *GMLake) reuse(st *gmStitch, rsize uint64) (Block, error) {
	n := int(rsize / gmChunk)
	st.allocated = true
	p.refresh(st)
	// Runs of consecutive pages of one segment, each carved out of the
	// free blocks over it.
	for k := 0; k < n; {
		r := st.pages[k]
		end := k + 1
		for end < n && st.pages[end].seg == r.seg && st.pages[end].i == r.i+(end-k) {
			end++
		}
		if err := p.carve(st, r.seg, r.i, r.i+(end-k)); err != nil {
			return Block{}, err
		}
		k = end
	}
	st.used = n
	if err := p.place(st, n); err != nil {
		return Block{}, err
	}
	p.stitched[st.base] = st
	return Block{Addr: st.base, Size: rsize}, nil
}

// carve takes pages [i0, i1) of seg out of the free blocks over them: each
// block is split at the run's bounds, the parts outside it back to the
// pool, the part inside allocated and held by st.
func (p *GMLake) carve(st *gmStitch, seg *gmSeg, i0, i1 int) error {
	a0, a1 := seg.base+uint64(i0)*gmChunk, seg.base+uint64(i1)*gmChunk
	b := seg.first
	for b != nil && b.addr+b.size <= a0 {
		b = b.next
	}
	for b != nil && b.addr < a1 {
		if b.allocated {
			return fmt.Errorf("gmlake: stitched block at %#x reused over the allocated block at %#x", st.base, b.addr)
		}
		p.removeFree(b)
		if b.addr < a0 {
			p.insertFree(p.split(b, a0-b.addr))
		}
		next := b
		if b.addr+b.size > a1 {
			b = p.split(b, a1-b.addr)
			p.insertFree(next)
		}
		next = b.next
		p.allocate(b)
		st.held = append(st.held, b)
		b = next
	}
	return nil
}

// stitch is get_fused_fragmented_blocks for a request of rsize bytes on
// stream: when the stream has two free large blocks or more that add up to
// rsize, the largest (ties: the highest address) are taken until they do,
// the last one split when 2 MiB or more is over (its front taken), and
// their pages are mapped in a new address range, handed out as a stitched
// block. It reports false, changing nothing, when the free blocks are too
// few or too small.
func (p *GMLake) stitch(stream, rsize uint64) (Block, bool, error) {
	lo := p.large.search(gmKey{stream, 0, 0})
	hi := lo
	for hi < len(p.large.keys) && p.large.keys[hi].stream == stream {
		hi++
	}
	if hi-lo < 2 {
		return Block{}, false, nil
	}
	var sum uint64
	j := hi
	for j > lo && sum < rsize {
		j--
		sum += p.large.vals[j].size
	}
	if sum < rsize {
		return Block{}, false, nil
	}
	for _, b := range p.large.vals[j:hi] {
		if b.seg.size > gmMaxStitch {
			return Block{}, false, nil // more pages than to track
		}
	}
	taken := slices.Clone(p.large.vals[j:hi])
	slices.Reverse(taken)
	size := sum
	if over := sum - rsize; over >= gmChunk {
		size = rsize
	}
	base, err := p.mapper.Reserve(size)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return Block{}, false, nil // no address space: nothing stitched
		}
		return Block{}, false, fmt.Errorf("gmlake: reserving %d bytes of address space: %w", size, err)
	}
	st := &gmStitch{base: base, size: size, stream: stream, allocated: true}
	for k, b := range taken {
		p.removeFree(b)
		if k == len(taken)-1 && size < sum {
			rest := b
			b = p.split(rest, rest.size-(sum-size))
			p.insertFree(rest)
		}
		p.allocate(b)
		st.held = append(st.held, b)
		first := p.pageOf(b)
		for i := first; i < first+int(b.size/gmChunk); i++ {
			st.pages = append(st.pages, gmPageRef{b.seg, i})
		}
	}
	for ix, r := range st.pages {
		if r.seg.pages == nil {
			r.seg.pages = make([]gmPage, r.seg.size/gmChunk)
		}
		pg := r.page()
		pg.refs = append(pg.refs, gmRef{st, ix})
		r.seg.refs++
	}
	st.used, st.busy = len(st.pages), len(st.pages)
	if err := p.place(st, len(st.pages)); err != nil {
		return Block{}, false, err
	}
	p.stitches = append(p.stitches, st)
	p.stitched[st.base] = st
	p.fused += size
	if p.fused > p.autoGC {
		if err := p.collect(); err != nil {
			return Block{}, false, err
		}
	}
	return Block{Addr: st.base, Size: rsize}, true, nil
}

// freeStitch takes back the stitched block st: the original blocks it
// holds are freed, and it stays cached, or is collected if doomed.
func (p *GMLake) freeStitch(st *gmStitch) error {
	st.allocated = false
	for k, b := range st.held {
		p.freeBlock(b)
		st.held[k] = nil
	}
	st.held, st.used = st.held[:0], 0
	if st.doomed {
		return p.destroy(st)
	}
	p.refresh(st)
	return nil
}

// collect is garbage_collect_fused_blocks(2): every stitched block not in
// use is collected, in the order they were made, and their bytes leave
// the count that autoGC bounds.
func (p *GMLake) collect() error {
	for _, st := range slices.Clone(p.stitches) {
		if st.allocated {
			continue
		}
		if err := p.destroy(st); err != nil {
			return err
		}
		p.fused -= st.size
	}
	return nil
}

// destroy collects the stitched block st, not in use: it leaves every
// page's references, the pages mapped in its range are unmapped there and
// (but for those of a segment being given back) mapped at home, and its
// range is given back.
func (p *GMLake) destroy(st *gmStitch) error {
	st.doomed = true
	p.refresh(st)
	if i := slices.Index(p.stitches, st); i >= 0 {
		p.stitches = slices.Delete(p.stitches, i, i+1)
	}
	var un gmRuns
	var home []gmPageRef
	for ix, r := range st.pages {
		if r.seg == nil {
			continue
		}
		pg := r.page()
		pg.refs = slices.DeleteFunc(pg.refs, func(f gmRef) bool { return f.st == st })
		r.seg.refs--
		if pg.at != st {
			continue
		}
		un.add(st.base, st.base+uint64(ix)*gmChunk)
		pg.at = gmNowhere
		if !r.seg.dropping {
			home = append(home, r)
		}
	}
	if err := p.unmapAll(un); err != nil {
		return err
	}
	var maps gmRuns
	for _, r := range home {
		maps.add(r.seg.base, r.seg.base+uint64(r.i)*gmChunk)
		r.page().at = nil
		r.seg.away--
	}
	if err := p.mapAll(maps); err != nil {
		return err
	}
	if err := p.mapper.Release(st.base); err != nil {
		return fmt.Errorf("gmlake: giving back the stitched range at %#x: %w", st.base, err)
	}
	return nil
}

// dropPages takes the pages of segments being given back out of the
// stitched block st, in use: those mapped in its range are unmapped, and
// st is collected when freed (active_fused_blocks_to_gc).
func (p *GMLake) dropPages(st *gmStitch) error {
	st.doomed = true
	var un gmRuns
	for ix, r := range st.pages {
		if r.seg == nil || !r.seg.dropping {
			continue
		}
		pg := r.page()
		pg.refs = slices.DeleteFunc(pg.refs, func(f gmRef) bool { return f.st == st })
		r.seg.refs--
		if pg.at == st {
			un.add(st.base, st.base+uint64(ix)*gmChunk)
			pg.at = gmNowhere
		}
		st.pages[ix].seg = nil
	}
	return p.unmapAll(un)
}

// releaseSegment is release_block for the free block b, a whole segment of
// the large pool being given back: the stitched blocks over its pages are
// collected (those in use lose its pages), its pages at home are unmapped,
// and its range is given back.
func (p *GMLake) releaseSegment(b *gmBlock) error {
	seg := b.seg
	p.removeFree(b)
	var un gmRuns
	if seg.pages == nil {
		un = gmRuns{{seg.base, seg.base, seg.size}} // never stitched: all at home
	}
	for i := range seg.pages {
		if seg.pages[i].at == nil {
			un.add(seg.base, seg.base+uint64(i)*gmChunk)
		}
	}
	for i := range seg.pages {
		for len(seg.pages[i].refs) > 0 {
			st := seg.pages[i].refs[0].st
			var err error
			if st.allocated {
				err = p.dropPages(st)
			} else {
				err = p.destroy(st)
			}
			if err != nil {
				return err
			}
		}
	}
	if err := p.unmapAll(un); err != nil {
		return err
	}
	if err := p.mapper.Release(seg.base); err != nil {
		return fmt.Errorf("gmlake: giving back the address range at %#x: %w", seg.base, err)
	}
	p.reserved -= seg.size
	return nil
}

// place maps the first n pages of the stitched block st in its range:
// those mapped elsewhere are unmapped there first.
func (p *GMLake) place(st *gmStitch, n int) error {
	var un, maps gmRuns
	moved := 0
	for ix, r := range st.pages[:n] {
		if r.page().at == st {
			continue
		}
		un.add(p.where(r), p.mappedAt(r))
		maps.add(st.base, st.base+uint64(ix)*gmChunk)
		moved++
	}
	if moved == 0 {
		return nil
	}
	if err := p.unmapAll(un); err != nil {
		return err
	}
	if err := p.mapAll(maps); err != nil {
		return err
	}
	for ix, r := range st.pages[:n] {
		pg := r.page()
		if pg.at == nil {
			r.seg.away++
		}
		pg.at, pg.atIx = st, ix
	}
	return nil
}

// placeHome maps pages [i0, i1) of seg at home: those mapped in a stitched
// block's range are unmapped there first.
func (p *GMLake) placeHome(seg *gmSeg, i0, i1 int) error {
	var un, maps gmRuns
	for i := i0; i < i1; i++ {
		r := gmPageRef{seg, i}
		if seg.pages[i].at == nil {
			continue
		}
		un.add(p.where(r), p.mappedAt(r))
		maps.add(seg.base, seg.base+uint64(i)*gmChunk)
	}
	if len(maps) == 0 {
		return nil
	}
	if err := p.unmapAll(un); err != nil {
		return err
	}
	if err := p.mapAll(maps); err != nil {
		return err
	}
	for i := i0; i < i1; i++ {
		if seg.pages[i].at != nil {
			seg.pages[i].at = nil
			seg.away--
		}
	}
	return nil
}

// where returns the start of the range in which page r is mapped.
func (p *GMLake) where(r gmPageRef) uint64 {
	if at := r.page().at; at != nil {
		return at.base
	}
	return r.seg.base
}

// mappedAt returns the address at which page r is mapped.
func (p *GMLake) mappedAt(r gmPageRef) uint64 {
	pg := r.page()
	if pg.at != nil {
		return pg.at.base + uint64(pg.atIx)*gmChunk
	}
	return r.seg.base + uint64(r.i)*gmChunk
}

// gmRuns are runs of pages to map or unmap, each one call: [addr,
// addr+size) inside the range at base.
type gmRuns []struct{ base, addr, size uint64 }

// add adds the page at addr of the range at base, extending the last run
// when it follows it in the same range.
func (rs *gmRuns) add(base, addr uint64) {
	if n := len(*rs); n > 0 {
		if l := &(*rs)[n-1]; l.base == base && l.addr+l.size == addr {
			l.size += gmChunk
			return
		}
	}
	*rs = append(*rs, struct{ base, addr, size uint64 }{base, addr, gmChunk})
}

func (p *GMLake) unmapAll(rs gmRuns) error {
	for _, r := range rs {
		if err := p.mapper.Unmap(r.addr, r.size); err != nil {
			return fmt.Errorf("gmlake: unmapping %d bytes at %#x: %w", r.size, r.addr, err)
		}
	}
	return nil
}

func (p *GMLake) mapAll(rs gmRuns) error {
	for _, r := range rs {
		if err := p.mapper.Map(r.addr, r.size); err != nil {
			return fmt.Errorf("gmlake: mapping %d bytes at %#x: %w", r.size, r.addr, err)
		}
	}
	return nil
}
