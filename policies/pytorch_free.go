package policies

import (
	"fmt"
	"math/bits"
)

// The pytorch policy's data structures: blocks by address, and free blocks
// ordered by (size, address).

// ptFree is the set of free blocks of one stream and pool, in (size,
// address) order: segregated into bins by size, each bin's blocks a list
// in that order through their binPrev and binNext, and a bitmap of the
// bins that hold any. A bin spans a sixteenth of a power of two (sizes
// below 16 bytes a bin each), so the bins are in size order too and a
// real trace's free blocks (tens per stream and pool) mostly sit alone in
// theirs: the first block not below a size is in that size's bin or is the
// first of the next bin that holds any, found in the bitmap with a bit
// scan; an insert walks its bin's list, a removal unlinks. A bin that
// grows long (an insert or a lower bound that walks past ptWalk of its
// blocks: a replay of millions of small blocks freed while others are
// live, BenchmarkLiveAllocations's) is indexed besides, by a freeTree of
// its blocks, so that its inserts and lower bounds find their place in
// O(log n), not in a walk of the bin; the index goes when the bin is down
// to ptUnindex blocks. The zero value is an empty set.
type ptFree struct {
	// heads are the first block of each bin, by 64 bins: a group
	// allocated at the first block in it, so that a set of few blocks
	// (one per stream, on many streams) takes hundreds of bytes, not
	// eight kilobytes.
	heads   [ptBins / 64]*[64]*ptBlock
	used    [ptBins / 64]uint64 // bit i%64 of word i/64: bin i holds blocks
	summary uint64              // bit w: used[w] is not 0
	// top is the size of the largest block while the set holds any, and
	// at is its place in the policy's ptTops plus one (0: not there), as
	// of the last settle; touched says the set changed since.
	top     uint64
	at      int
	touched bool
	// long indexes the long bins, by bin; nil while none is.
	long map[int]*freeTree[*ptBlock]
}

// A bin is indexed when a walk in it passes ptWalk blocks, and no longer
// once it holds fewer than ptUnindex.
const (
	ptWalk    = 64
	ptUnindex = 16
)

// indexBin indexes bin i, which holds blocks, from its list.
func (t *ptFree) indexBin(i int) *freeTree[*ptBlock] {
	ix := new(freeTree[*ptBlock])
	for c := t.head(i); c != nil; c = c.binNext {
		ix.insert(c.size, c.addr, c)
		c.indexed = true
	}
	if t.long == nil {
		t.long = make(map[int]*freeTree[*ptBlock])
	}
	t.long[i] = ix
	return ix
}

// ptBins is the number of bins: ptBin(math.MaxUint64) is 975.
const ptBins = 1024

// ptBin returns the bin of blocks of size bytes: size itself below 16,
// else 16 bins for each power of two, by the four bits after the leading
// one.
func ptBin(size uint64) int {
	if size < 16 {
		return int(size)
	}
	l := bits.Len64(size)
	return (l-5)*16 + int(size>>(l-5))
}

// keyLess reports whether (size, addr) is below (size2, addr2).
func keyLess(size, addr, size2, addr2 uint64) bool {
	return size < size2 || size == size2 && addr < addr2
}

// next returns the first bin from bin from on that holds blocks, -1 if
// none does.
func (t *ptFree) next(from int) int {
	if from >= ptBins {
		return -1
	}
	w := from >> 6
	if m := t.used[w] & (^uint64(0) << (from & 63)); m != 0 {
		return w<<6 | bits.TrailingZeros64(m)
	}
	s := t.summary & (^uint64(0) << (w + 1))
	if s == 0 {
		return -1
	}
	w = bits.TrailingZeros64(s)
	return w<<6 | bits.TrailingZeros64(t.used[w])
}

// head returns the first block of bin i, nil if it holds none.
func (t *ptFree) head(i int) *ptBlock {
	if g := t.heads[i>>6]; g != nil {
		return g[i&63]
	}
	return nil
}

// lowerBound returns the first block not below (size, 0), or nil.
func (t *ptFree) lowerBound(size uint64) *ptBlock {
	i := ptBin(size)
	c := t.head(i)
	if c != nil && c.indexed {
		return t.lowerIndexed(i, size)
	}
	for n := 0; c != nil; c = c.binNext {
		if c.size >= size {
			return c
		}
		if n++; n > ptWalk {
			t.indexBin(i)
			return t.lowerIndexed(i, size)
		}
	}
	if j := t.next(i + 1); j >= 0 {
		return t.heads[j>>6][j&63]
	}
	return nil
}

// lowerIndexed is lowerBound of size in its bin i, which is indexed.
func (t *ptFree) lowerIndexed(i int, size uint64) *ptBlock {
	if c, ok := t.long[i].best(size); ok {
		return c
	}
	if j := t.next(i + 1); j >= 0 {
		return t.heads[j>>6][j&63]
	}
	return nil
}

// successor returns the block after b, which is in t, or nil.
func (t *ptFree) successor(b *ptBlock) *ptBlock {
	if b.binNext != nil {
		return b.binNext
	}
	if j := t.next(int(b.bin) + 1); j >= 0 {
		return t.heads[j>>6][j&63]
	}
	return nil
}

// max returns the last block, or nil.
func (t *ptFree) max() *ptBlock {
	if t.summary == 0 {
		return nil
	}
	w := 63 - bits.LeadingZeros64(t.summary)
	c := t.heads[w][63-bits.LeadingZeros64(t.used[w])]
	if c.indexed {
		c, _ = t.long[int(c.bin)].last()
		return c
	}
	for c.binNext != nil {
		c = c.binNext
	}
	return c
}

// appendIf appends the blocks for which keep is true, in order.
func (t *ptFree) appendIf(list []*ptBlock, keep func(*ptBlock) bool) []*ptBlock {
	for j := t.next(0); j >= 0; j = t.next(j + 1) {
		for c := t.heads[j>>6][j&63]; c != nil; c = c.binNext {
			if keep(c) {
				list = append(list, c)
			}
		}
	}
	return list
}

// insert adds b, which must not be in t, under its size and address.
func (t *ptFree) insert(b *ptBlock) {
	i := ptBin(b.size)
	b.set, b.bin = t, uint16(i)
	var prev *ptBlock
	g := t.heads[i>>6]
	if g == nil {
		g = new([64]*ptBlock)
		t.heads[i>>6] = g
	}
	c := g[i&63]
	if c != nil && c.indexed {
		t.insertIndexed(g, i, b)
		return
	}
	walked := 0
	for c != nil && keyLess(c.size, c.addr, b.size, b.addr) {
		prev, c = c, c.binNext
		walked++
	}
	t.link(g, i, b, prev, c)
	if walked > ptWalk {
		t.indexBin(i)
	}
}

// insertIndexed is insert of b into its bin i of group g, which is
// indexed.
func (t *ptFree) insertIndexed(g *[64]*ptBlock, i int, b *ptBlock) {
	ix := t.long[i]
	// Before the first block above b, or after the bin's last.
	if c, ok := ix.lower(b.size, b.addr); ok {
		t.link(g, i, b, c.binPrev, c)
	} else {
		last, _ := ix.last()
		t.link(g, i, b, last, nil)
	}
	ix.insert(b.size, b.addr, b)
	b.indexed = true
}

// link puts b between prev and c in its bin i of group g (nil prev: at
// the head; nil c: at the end).
func (t *ptFree) link(g *[64]*ptBlock, i int, b, prev, c *ptBlock) {
	b.binPrev, b.binNext = prev, c
	if c != nil {
		c.binPrev = b
	}
	if prev != nil {
		prev.binNext = b
	} else {
		g[i&63] = b
		t.used[i>>6] |= 1 << (i & 63)
		t.summary |= 1 << (i >> 6)
	}
}

// unindex takes b out of the index of its bin i, and drops the index
// when the bin is down to ptUnindex blocks.
func (t *ptFree) unindex(i int, b *ptBlock) {
	ix := t.long[i]
	ix.delete(b.size, b.addr)
	b.indexed = false
	if ix.len >= ptUnindex {
		return
	}
	for c := t.head(i); c != nil; c = c.binNext {
		c.indexed = false
	}
	if delete(t.long, i); len(t.long) == 0 {
		t.long = nil
	}
}

// delete removes b, which must be in t.
func (t *ptFree) delete(b *ptBlock) {
	if b.set != t {
		panic(fmt.Sprintf("policies: pytorch free blocks: the block of %d bytes at %#x is not in this set", b.size, b.addr))
	}
	i := int(b.bin)
	if b.indexed {
		t.unindex(i, b)
	}
	if next := b.binNext; next != nil {
		next.binPrev = b.binPrev
	}
	if prev := b.binPrev; prev != nil {
		prev.binNext = b.binNext
	} else {
		if t.heads[i>>6][i&63] != b {
			panic(fmt.Sprintf("policies: pytorch free blocks: the block of %d bytes at %#x is not in its bin %d", b.size, b.addr, i))
		}
		t.heads[i>>6][i&63] = b.binNext
		if b.binNext == nil {
			if t.used[i>>6] &^= 1 << (i & 63); t.used[i>>6] == 0 {
				t.summary &^= 1 << (i >> 6)
			}
		}
	}
	b.set, b.binPrev, b.binNext = nil, nil, nil
}

// ptTops is a max-heap of the sets of free blocks that hold any, by the
// size of their largest block: the largest free block of the whole policy
// (FreeSpace) at its root. A set whose blocks change is only noted
// (touched); largest settles the noted sets first, each in O(log sets),
// so that the heap costs nothing per malloc and free between two calls
// of FreeSpace (the replay asks at the end of each point of its series),
// and no pass over every set of every stream and pool (which made N
// streams or pools cost N^2). The zero value is empty.
type ptTops struct {
	heap    []*ptFree
	touched []*ptFree // the sets changed since the last settle, each once
}

// touch notes that t's blocks changed.
func (h *ptTops) touch(t *ptFree) {
	if !t.touched {
		t.touched = true
		h.touched = append(h.touched, t)
	}
}

// largest returns the size of the largest free block, 0 if there is none.
func (h *ptTops) largest() uint64 {
	h.settle()
	if len(h.heap) == 0 {
		return 0
	}
	return h.heap[0].top
}

// settle puts each touched set at its place in the heap by its largest
// block now, or takes it out if it holds none.
func (h *ptTops) settle() {
	for k, t := range h.touched {
		h.touched[k] = nil
		t.touched = false
		switch m := t.max(); {
		case m == nil:
			if t.at != 0 {
				h.remove(t)
			}
		case t.at == 0:
			t.top = m.size
			h.heap = append(h.heap, t)
			t.at = len(h.heap)
			h.up(t.at - 1)
		case m.size > t.top:
			t.top = m.size
			h.up(t.at - 1)
		case m.size < t.top:
			t.top = m.size
			h.down(t.at - 1)
		}
	}
	h.touched = h.touched[:0]
}

// remove takes t, which is in h, out of it.
func (h *ptTops) remove(t *ptFree) {
	s := h.heap
	i, n := t.at-1, len(s)-1
	t.at, t.top = 0, 0
	if i != n {
		s[i] = s[n]
		s[i].at = i + 1
	}
	s[n] = nil
	h.heap = s[:n]
	if i != n {
		h.down(i)
		h.up(i)
	}
}

func (h *ptTops) swap(i, j int) {
	s := h.heap
	s[i], s[j] = s[j], s[i]
	s[i].at, s[j].at = i+1, j+1
}

func (h *ptTops) up(i int) {
	s := h.heap
	for i > 0 {
		parent := (i - 1) / 2
		if s[parent].top >= s[i].top {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *ptTops) down(i int) {
	s := h.heap
	for {
		l := 2*i + 1
		if l >= len(s) {
			return
		}
		c := l
		if r := l + 1; r < len(s) && s[r].top > s[l].top {
			c = r
		}
		if s[i].top >= s[c].top {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// ptActive is the table of allocated blocks by address: open addressing
// with linear probing and backward-shift deletion over (address, block)
// slots, grown at a quarter full, so that probe runs are short (a take
// shifts back what follows it up to the next empty slot). For the pytorch
// policy's per-malloc and per-free lookups it is faster than
// trace.AddrMap, whose records sit apart from its index; it costs four to
// eight slots of 16 bytes per allocated block, beside the block's own 96.
// The zero value is ready to use.
type ptActive struct {
	slots []ptActiveSlot
	n     int
	shift uint // 64 - log2(len(slots))
}

type ptActiveSlot struct {
	addr uint64 // 0 for an empty slot (no block is at address 0)
	b    *ptBlock
}

func (m *ptActive) home(addr uint64) int { return int(addr * 0x9e3779b97f4a7c15 >> m.shift) }

// put sets the block at addr, which must not be in m, and must not be 0.
func (m *ptActive) put(addr uint64, b *ptBlock) {
	if 4*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for m.slots[i].addr != 0 {
		i = (i + 1) & mask
	}
	m.slots[i] = ptActiveSlot{addr, b}
	m.n++
}

// take removes the block at addr and returns it, nil if there is none.
func (m *ptActive) take(addr uint64) *ptBlock {
	if m.n == 0 || addr == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for m.slots[i].addr != addr {
		if m.slots[i].addr == 0 {
			return nil
		}
		i = (i + 1) & mask
	}
	b := m.slots[i].b
	m.n--
	// Shift back the later slots of the probe run whose home is not in
	// the cyclic range (i, j].
	for j := (i + 1) & mask; m.slots[j].addr != 0; j = (j + 1) & mask {
		h := m.home(m.slots[j].addr)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = ptActiveSlot{}
	return b
}

func (m *ptActive) grow() {
	old := m.slots
	size := max(64, 2*len(old))
	m.slots = make([]ptActiveSlot, size)
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
	mask := size - 1
	for _, s := range old {
		if s.addr != 0 {
			i := m.home(s.addr)
			for m.slots[i].addr != 0 {
				i = (i + 1) & mask
			}
			m.slots[i] = s
		}
	}
}

// ptHandles is the table of the blocks that MallocHandle placed, by
// handle: slot h-1 holds the block of handle h, and the slots of the
// handles freed are reused, last freed first. A handle's lookup is an
// index, where ptActive's is a probe. The zero value is ready to use.
type ptHandles struct {
	slots []*ptBlock
	free  []uint32 // the handles of empty slots
}

// put stores b under a handle, which it returns (never 0).
func (t *ptHandles) put(b *ptBlock) uint64 {
	if n := len(t.free); n > 0 {
		h := t.free[n-1]
		t.free = t.free[:n-1]
		t.slots[h-1] = b
		return uint64(h)
	}
	t.slots = append(t.slots, b)
	return uint64(len(t.slots))
}

// take removes the block of handle h and returns it, nil if there is none.
func (t *ptHandles) take(h uint64) *ptBlock {
	if h-1 >= uint64(len(t.slots)) {
		return nil
	}
	b := t.slots[h-1]
	if b == nil {
		return nil
	}
	t.slots[h-1] = nil
	t.free = append(t.free, uint32(h))
	return b
}
