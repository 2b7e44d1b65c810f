package policies

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// This file simulates PyTorch's CUDA caching allocator, following
// pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator:
// malloc, get_free_block, alloc_block, release_cached_blocks, free_block,
// should_split, round_size, get_allocation_size) with its default settings.

// PyTorch caching allocator constants, in bytes.
const (
	ptMinBlockSize  = 512      // every request is rounded up to a multiple of this (kMinBlockSize)
	ptSmallSize     = 1 << 20  // largest request of the small pool (kSmallSize)
	ptSmallBuffer   = 2 << 20  // segment size of the small pool (kSmallBuffer)
	ptMinLargeAlloc = 10 << 20 // requests below this get a ptLargeBuffer segment (kMinLargeAlloc)
	ptLargeBuffer   = 20 << 20 // segment size of mid-size large requests (kLargeBuffer)
	ptRoundLarge    = 2 << 20  // larger segments are rounded up to this (kRoundLarge)

	// ptRoundupIntervals is the number of power-of-two intervals, from
	// 1 MiB up, that roundup_power2_divisions sets divisions for.
	ptRoundupIntervals = 16
)

// pytorchConfig holds the allocator settings of PYTORCH_CUDA_ALLOC_CONF.
// Only the defaults are in use so far; the fields are those the allocator
// reads, so that parsing a setting is all that adding it takes.
type pytorchConfig struct {
	// maxSplitSize is max_split_size_mb in bytes: blocks of at least this
	// size are never split, and requests below it never take them.
	// math.MaxUint64 (the default) means unlimited.
	maxSplitSize uint64
	// maxNonSplitRounding is how much larger than a request of at least
	// maxSplitSize a cached block may be and still be taken (the default
	// is 20 MiB).
	maxNonSplitRounding uint64
	// roundupDivisions are roundup_power2_divisions by power-of-two
	// interval: entry 0 for requests below 2 MiB, entry k for
	// [2^(20+k), 2^(21+k)), the last for everything above. 0 or 1 means
	// plain 512-byte rounding.
	roundupDivisions [ptRoundupIntervals]uint64
	// garbageCollectionThreshold is garbage_collection_threshold (0 = off;
	// it acts only under a capacity).
	garbageCollectionThreshold float64
	// expandableSegments is expandable_segments.
	expandableSegments bool
}

func defaultPytorchConfig() pytorchConfig {
	return pytorchConfig{
		maxSplitSize:        math.MaxUint64,
		maxNonSplitRounding: ptLargeBuffer,
	}
}

// PyTorch is a simulation of PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) with its default settings: requests
// rounded up to 512 bytes; a small pool (requests up to 1 MiB, carved out of
// 2 MiB segments) and a large pool (20 MiB segments for requests under
// 10 MiB, else the request rounded up to 2 MiB); free blocks kept per pool
// in (stream, size, address) order and taken best fit, ties to the lowest
// address, never across streams; a taken block split when the remainder is
// at least 512 bytes (small pool) or more than 1 MiB (large pool); freed
// blocks merged with their free neighbours. When the device refuses a
// segment, every cached segment that is not split is freed and the device
// allocation is tried once more (a retry), then the malloc fails (an OOM).
//
// Blocks freed on another stream than their own return to their own
// stream's free blocks at once (the free is the trace's free_completed).
type PyTorch struct {
	dev Device
	cfg pytorchConfig

	large, small ptPool
	active       ptAddrMap // allocated blocks by address

	reserved  uint64 // bytes in live segments (total_allocated_memory)
	freeBytes uint64 // bytes in cached free blocks
	retries   int64

	spare   *ptBlock   // recycled blocks, linked through next
	scratch []*ptBlock // reused by release
}

var (
	_ Policy     = (*PyTorch)(nil)
	_ Releaser   = (*PyTorch)(nil)
	_ FreeSpacer = (*PyTorch)(nil)
	_ Counter    = (*PyTorch)(nil)
)

func init() {
	register("pytorch", func(dev Device, s Settings) (Policy, error) { return NewPyTorch(dev, s) })
}

// NewPyTorch returns the PyTorch caching allocator on dev. It takes no
// settings yet and returns an error naming any key in s.
func NewPyTorch(dev Device, s Settings) (*PyTorch, error) {
	if err := s.Check("pytorch"); err != nil {
		return nil, err
	}
	return newPyTorch(dev, defaultPytorchConfig()), nil
}

func newPyTorch(dev Device, cfg pytorchConfig) *PyTorch {
	p := &PyTorch{dev: dev, cfg: cfg}
	p.small.small = true
	return p
}

// Name returns "pytorch".
func (p *PyTorch) Name() string { return "pytorch" }

// ptBlock is a block of a segment: allocated, or free and then in its
// pool's tree. The blocks of one segment form an address-ordered list
// through prev and next; a segment that is one block has neither.
type ptBlock struct {
	addr, size uint64
	stream     uint64
	pool       *ptPool
	prev, next *ptBlock
	allocated  bool
}

func (b *ptBlock) isSplit() bool { return b.prev != nil || b.next != nil }

// ptPool is a pool of free blocks (BlockPool): per stream, a tree ordered
// by (size, address); the streams in ascending order.
type ptPool struct {
	small   bool
	streams []*ptStreamBlocks // sorted by stream
	last    *ptStreamBlocks   // the last looked up, or nil
}

type ptStreamBlocks struct {
	stream uint64
	tree   ptTree
}

// blocks returns the free blocks of stream, created if absent when create
// is set, else nil if absent.
func (pl *ptPool) blocks(stream uint64, create bool) *ptStreamBlocks {
	if pl.last != nil && pl.last.stream == stream {
		return pl.last
	}
	i := 0
	for i < len(pl.streams) && pl.streams[i].stream < stream {
		i++
	}
	if i < len(pl.streams) && pl.streams[i].stream == stream {
		pl.last = pl.streams[i]
		return pl.last
	}
	if !create {
		return nil
	}
	sb := &ptStreamBlocks{stream: stream}
	pl.streams = append(pl.streams, nil)
	copy(pl.streams[i+1:], pl.streams[i:])
	pl.streams[i] = sb
	pl.last = sb
	return sb
}

func (p *PyTorch) newBlock() *ptBlock {
	b := p.spare
	if b == nil {
		return &ptBlock{}
	}
	p.spare = b.next
	*b = ptBlock{}
	return b
}

func (p *PyTorch) recycle(b *ptBlock) {
	*b = ptBlock{next: p.spare}
	p.spare = b
}

// insertFree puts the free block b into its pool.
func (p *PyTorch) insertFree(b *ptBlock) {
	b.pool.blocks(b.stream, true).tree.insert(ptItem{b.size, b.addr, b})
	p.freeBytes += b.size
}

// removeFree takes the free block b out of its pool.
func (p *PyTorch) removeFree(b *ptBlock) {
	b.pool.blocks(b.stream, false).tree.delete(b.size, b.addr)
	p.freeBytes -= b.size
}

// roundSize is round_size: the block size for a request of size bytes.
func (p *PyTorch) roundSize(size uint64) uint64 {
	if size < ptMinBlockSize {
		return ptMinBlockSize
	}
	if d := p.roundupDivisions(size); d > 1 && size > ptMinBlockSize*d {
		return roundupPower2Division(size, d)
	}
	return (size + ptMinBlockSize - 1) / ptMinBlockSize * ptMinBlockSize
}

// roundupDivisions returns the roundup_power2_divisions for size's
// power-of-two interval.
func (p *PyTorch) roundupDivisions(size uint64) uint64 {
	const intervalStart = 20 // log2(1 MiB)
	i := 0
	if l := bits.Len64(size) - 1; l > intervalStart {
		i = min(l-intervalStart, ptRoundupIntervals-1)
	}
	return p.cfg.roundupDivisions[i]
}

// roundupPower2Division rounds size up to the next of d equal steps of its
// power-of-two interval; powers of two stay as they are.
func roundupPower2Division(size, d uint64) uint64 {
	if size&(size-1) == 0 {
		return size
	}
	floor := uint64(1) << (bits.Len64(size) - 1)
	step := floor >> (bits.Len64(d) - 1)
	if step == 0 {
		return floor << 1
	}
	down := size &^ (step - 1)
	if down == size {
		return size
	}
	return down + step
}

// allocationSize is get_allocation_size: the segment size for a block of
// size bytes.
func allocationSize(size uint64) uint64 {
	switch {
	case size <= ptSmallSize:
		return ptSmallBuffer
	case size < ptMinLargeAlloc:
		return ptLargeBuffer
	default:
		return (size + ptRoundLarge - 1) / ptRoundLarge * ptRoundLarge
	}
}

// Malloc places a request of size bytes on stream, as
// DeviceCachingAllocator::malloc does: the best-fitting cached block of the
// pool on stream, else a new segment from the device, else after freeing
// the cached segments a new segment (a retry). The Block's Size is the
// block's size as PyTorch counts it in allocated_bytes (the rounded request,
// or more when the remainder was too small to split off). It returns an
// error wrapping ErrOutOfMemory when the device refuses the retry too, and
// any other error of the device as it is.
func (p *PyTorch) Malloc(size, stream uint64) (Block, error) {
	rsize := p.roundSize(size)
	pool := &p.large
	if rsize <= ptSmallSize {
		pool = &p.small
	}
	b := p.getFreeBlock(pool, stream, rsize)
	if b == nil {
		segSize := allocationSize(rsize)
		var err error
		b, err = p.allocBlock(pool, stream, segSize)
		if b == nil && err == nil {
			if p.releaseAvailableCachedBlocks(pool, stream, rsize) {
				b, err = p.allocBlock(pool, stream, segSize)
			}
		}
		if b == nil && err == nil {
			if err = p.releaseCachedBlocks(); err == nil {
				p.retries++
				b, err = p.allocBlock(pool, stream, segSize)
			}
		}
		if err != nil {
			return Block{}, err
		}
		if b == nil {
			return Block{}, fmt.Errorf("pytorch: malloc of %d bytes on stream %#x: segment of %d bytes with %d reserved, %d cached free: %w",
				size, stream, segSize, p.reserved, p.freeBytes, ErrOutOfMemory)
		}
	}
	if p.shouldSplit(b, rsize) {
		rest := b
		b = p.newBlock()
		*b = ptBlock{addr: rest.addr, size: rsize, stream: stream, pool: pool, prev: rest.prev, next: rest}
		if b.prev != nil {
			b.prev.next = b
		}
		rest.prev = b
		rest.addr += rsize
		rest.size -= rsize
		p.insertFree(rest)
	}
	b.allocated = true
	p.active.put(b)
	return Block{Addr: b.addr, Size: b.size}, nil
}

// getFreeBlock is get_free_block: it takes the smallest free block of at
// least size bytes on stream out of pool (the lowest address among equals),
// or returns nil.
func (p *PyTorch) getFreeBlock(pool *ptPool, stream, size uint64) *ptBlock {
	sb := pool.blocks(stream, false)
	if sb == nil {
		return nil
	}
	b := sb.tree.lowerBound(size)
	if b == nil {
		return nil
	}
	maxSplit := p.cfg.maxSplitSize
	if size < maxSplit && b.size >= maxSplit {
		return nil // never hand an oversize block to a smaller request
	}
	if size >= maxSplit && b.size >= size+p.cfg.maxNonSplitRounding {
		return nil
	}
	p.removeFree(b)
	return b
}

// shouldSplit is should_split: whether the rest of b after size bytes
// becomes a free block of its own.
func (p *PyTorch) shouldSplit(b *ptBlock, size uint64) bool {
	rest := b.size - size
	if b.pool.small || p.cfg.expandableSegments {
		return rest >= ptMinBlockSize
	}
	return size < p.cfg.maxSplitSize && rest > ptSmallSize
}

// allocBlock is alloc_block: a new segment of size bytes from the device,
// as one block of pool on stream. It returns nil and no error when the
// device refuses (an error wrapping ErrOutOfMemory), nil and the error for
// any other failure.
func (p *PyTorch) allocBlock(pool *ptPool, stream, size uint64) (*ptBlock, error) {
	addr, err := p.dev.Alloc(size)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("pytorch: device alloc of %d bytes: %w", size, err)
	}
	p.reserved += size
	b := p.newBlock()
	*b = ptBlock{addr: addr, size: size, stream: stream, pool: pool}
	return b, nil
}

// releaseAvailableCachedBlocks is release_available_cached_blocks: with a
// max_split_size, it frees the oversize cached segments on stream that
// make room for size bytes. It reports whether it freed any; without a
// max_split_size it does nothing.
func (p *PyTorch) releaseAvailableCachedBlocks(pool *ptPool, stream, size uint64) bool {
	if p.cfg.maxSplitSize == math.MaxUint64 {
		return false
	}
	sb := pool.blocks(stream, false)
	if sb == nil {
		return false
	}
	key := max(size, p.cfg.maxSplitSize)
	if b := sb.tree.lowerBound(key); b != nil {
		return p.releaseBlock(b) == nil
	}
	// No single block is large enough: free oversize blocks, the largest
	// first, until enough is freed.
	var freed uint64
	for freed < key {
		b := sb.tree.max()
		if b == nil || b.size < p.cfg.maxSplitSize {
			break
		}
		freed += b.size
		if p.releaseBlock(b) != nil {
			return false
		}
	}
	return freed >= key
}

// releaseCachedBlocks is release_cached_blocks: it frees every cached
// segment that is not split, the large pool first, each in (stream, size,
// address) order.
func (p *PyTorch) releaseCachedBlocks() error {
	for _, pool := range [...]*ptPool{&p.large, &p.small} {
		list := p.scratch[:0]
		for _, sb := range pool.streams {
			list = sb.tree.appendUnsplit(list)
		}
		for k, b := range list {
			list[k] = nil
			if err := p.releaseBlock(b); err != nil {
				p.scratch = list[:0]
				return err
			}
		}
		p.scratch = list[:0]
	}
	return nil
}

// releaseBlock is release_block: it frees the cached segment b (a free
// block that is not split) on the device.
func (p *PyTorch) releaseBlock(b *ptBlock) error {
	if err := p.dev.Free(b.addr); err != nil {
		return fmt.Errorf("pytorch: device free of the segment at %#x: %w", b.addr, err)
	}
	p.removeFree(b)
	p.reserved -= b.size
	p.recycle(b)
	return nil
}

// Free takes back the block at addr, as free_block does: it merges with
// its free neighbours and returns to the free blocks of the stream it was
// allocated on (stream, the stream of the free, plays no part). It returns
// an error if addr is not an allocated block.
func (p *PyTorch) Free(addr, stream uint64) error {
	b := p.active.remove(addr)
	if b == nil {
		return fmt.Errorf("pytorch: free of %#x on stream %#x: not an allocated block", addr, stream)
	}
	b.allocated = false
	if prev := b.prev; prev != nil && !prev.allocated {
		p.removeFree(prev)
		b.addr = prev.addr
		b.size += prev.size
		b.prev = prev.prev
		if b.prev != nil {
			b.prev.next = b
		}
		p.recycle(prev)
	}
	if next := b.next; next != nil && !next.allocated {
		p.removeFree(next)
		b.size += next.size
		b.next = next.next
		if b.next != nil {
			b.next.prev = b
		}
		p.recycle(next)
	}
	p.insertFree(b)
	return nil
}

// EmptyCache frees every cached segment that is not split, as
// torch.cuda.empty_cache() does. It returns the device's error for a free
// that fails.
func (p *PyTorch) EmptyCache() error { return p.releaseCachedBlocks() }

// FreeSpace returns the bytes in cached free blocks and the size in bytes
// of the largest.
func (p *PyTorch) FreeSpace() (total, largest uint64) {
	for _, pool := range [...]*ptPool{&p.large, &p.small} {
		for _, sb := range pool.streams {
			if b := sb.tree.max(); b != nil && b.size > largest {
				largest = b.size
			}
		}
	}
	return p.freeBytes, largest
}

// Retries returns the number of device allocations retried after freeing
// the cached segments (num_alloc_retries).
func (p *PyTorch) Retries() int64 { return p.retries }

// ptAddrMap is a hash table of blocks by address: open addressing with
// linear probing, at most half full, deletion by backward shift. It does
// what a map[uint64]*ptBlock does, at a third of the cost.
type ptAddrMap struct {
	slots []*ptBlock // nil = empty; len is a power of two
	n     int
	shift uint // 64 - log2(len(slots))
}

func (m *ptAddrMap) home(addr uint64) int {
	// Fibonacci hashing of the address without its low bits, which
	// are zero in every block address (multiples of 512).
	return int(((addr >> 9) * 0x9e3779b97f4a7c15) >> m.shift)
}

// put adds b, whose address must not be in m.
func (m *ptAddrMap) put(b *ptBlock) {
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	i := m.home(b.addr)
	for m.slots[i] != nil {
		i = (i + 1) & mask
	}
	m.slots[i] = b
	m.n++
}

// remove takes the block at addr out of m and returns it, or nil.
func (m *ptAddrMap) remove(addr uint64) *ptBlock {
	if m.n == 0 {
		return nil
	}
	mask := len(m.slots) - 1
	i := m.home(addr)
	for {
		b := m.slots[i]
		if b == nil {
			return nil
		}
		if b.addr == addr {
			break
		}
		i = (i + 1) & mask
	}
	b := m.slots[i]
	// Shift back the entries after i that would no longer be found.
	for j := (i + 1) & mask; m.slots[j] != nil; j = (j + 1) & mask {
		if h := m.home(m.slots[j].addr); (j-h)&mask >= (j-i)&mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = nil
	m.n--
	return b
}

func (m *ptAddrMap) grow() {
	old := m.slots
	size := max(2*len(old), 1024)
	m.slots = make([]*ptBlock, size)
	m.shift = uint(64 - bits.Len(uint(size-1)))
	m.n = 0
	for _, b := range old {
		if b != nil {
			m.put(b)
		}
	}
}

// ptTree is a B-tree of free blocks ordered by (size, address). Nodes of
// deleted levels are kept for reuse, so that a steady state allocates
// nothing.
type ptTree struct {
	root  *ptNode
	len   int
	spare *ptNode // recycled nodes, linked through kids[0]
}

const (
	ptDegree   = 16 // minimum degree: nodes hold ptDegree-1 .. 2*ptDegree-1 items
	ptMaxItems = 2*ptDegree - 1
)

type ptItem struct {
	size, addr uint64
	b          *ptBlock
}

type ptNode struct {
	n     int
	leaf  bool
	items [ptMaxItems]ptItem
	kids  [ptMaxItems + 1]*ptNode
}

// find returns the index of the first item of x not below (size, addr).
// A linear scan: the trees are small (free blocks per stream and pool
// number tens in real traces), and it beats a binary search there.
func (x *ptNode) find(size, addr uint64) int {
	items := x.items[:x.n]
	for i := range items {
		if it := &items[i]; it.size > size || it.size == size && it.addr >= addr {
			return i
		}
	}
	return len(items)
}

func (t *ptTree) newNode(leaf bool) *ptNode {
	x := t.spare
	if x == nil {
		return &ptNode{leaf: leaf}
	}
	t.spare = x.kids[0]
	x.kids[0] = nil
	x.leaf = leaf
	return x
}

func (t *ptTree) recycle(x *ptNode) {
	*x = ptNode{}
	x.kids[0] = t.spare
	t.spare = x
}

// lowerBound returns the block of the first item not below (size, 0), or
// nil.
func (t *ptTree) lowerBound(size uint64) *ptBlock {
	var b *ptBlock
	for x := t.root; x != nil; {
		i := x.find(size, 0)
		if i < x.n {
			b = x.items[i].b
		}
		if x.leaf {
			break
		}
		x = x.kids[i]
	}
	return b
}

// max returns the block of the last item, or nil.
func (t *ptTree) max() *ptBlock {
	x := t.root
	if x == nil || t.len == 0 {
		return nil
	}
	for !x.leaf {
		x = x.kids[x.n]
	}
	return x.items[x.n-1].b
}

// appendUnsplit appends the blocks that are whole segments, in order.
func (t *ptTree) appendUnsplit(list []*ptBlock) []*ptBlock {
	if t.len == 0 {
		return list
	}
	var walk func(x *ptNode)
	walk = func(x *ptNode) {
		for i := 0; i < x.n; i++ {
			if !x.leaf {
				walk(x.kids[i])
			}
			if b := x.items[i].b; !b.isSplit() {
				list = append(list, b)
			}
		}
		if !x.leaf {
			walk(x.kids[x.n])
		}
	}
	walk(t.root)
	return list
}

// insert adds it, whose key must not be in t.
func (t *ptTree) insert(it ptItem) {
	if t.root == nil {
		t.root = t.newNode(true)
	}
	if t.root.n == ptMaxItems {
		r := t.newNode(false)
		r.kids[0] = t.root
		t.root = r
		t.splitChild(r, 0)
	}
	x := t.root
	for {
		i := x.find(it.size, it.addr)
		if x.leaf {
			copy(x.items[i+1:x.n+1], x.items[i:x.n])
			x.items[i] = it
			x.n++
			break
		}
		if x.kids[i].n == ptMaxItems {
			t.splitChild(x, i)
			if m := &x.items[i]; m.size < it.size || m.size == it.size && m.addr < it.addr {
				i++
			}
		}
		x = x.kids[i]
	}
	t.len++
}

// splitChild splits the full child i of x around its median, which moves
// up into x.
func (t *ptTree) splitChild(x *ptNode, i int) {
	y := x.kids[i]
	z := t.newNode(y.leaf)
	z.n = ptDegree - 1
	copy(z.items[:ptDegree-1], y.items[ptDegree:])
	if !y.leaf {
		copy(z.kids[:ptDegree], y.kids[ptDegree:])
		clear(y.kids[ptDegree:])
	}
	median := y.items[ptDegree-1]
	clear(y.items[ptDegree-1:])
	y.n = ptDegree - 1
	copy(x.kids[i+2:x.n+2], x.kids[i+1:x.n+1])
	x.kids[i+1] = z
	copy(x.items[i+1:x.n+1], x.items[i:x.n])
	x.items[i] = median
	x.n++
}

// delete removes the item with key (size, addr), which must be in t. On
// the way down every node entered has at least ptDegree items, so that the
// removal never leaves a node short.
func (t *ptTree) delete(size, addr uint64) {
	x := t.root
	for {
		i := x.find(size, addr)
		found := i < x.n && x.items[i].size == size && x.items[i].addr == addr
		if x.leaf {
			if !found {
				panic(fmt.Sprintf("policies: pytorch free block tree: no block of %d bytes at %#x", size, addr))
			}
			copy(x.items[i:x.n-1], x.items[i+1:x.n])
			x.n--
			x.items[x.n] = ptItem{}
			break
		}
		if found {
			y, z := x.kids[i], x.kids[i+1]
			switch {
			case y.n >= ptDegree:
				// Replace by the predecessor and delete that from y.
				w := y
				for !w.leaf {
					w = w.kids[w.n]
				}
				x.items[i] = w.items[w.n-1]
				size, addr = x.items[i].size, x.items[i].addr
				x = y
			case z.n >= ptDegree:
				// Replace by the successor and delete that from z.
				w := z
				for !w.leaf {
					w = w.kids[0]
				}
				x.items[i] = w.items[0]
				size, addr = x.items[i].size, x.items[i].addr
				x = z
			default:
				t.merge(x, i)
				x = y
			}
			continue
		}
		c := x.kids[i]
		if c.n == ptDegree-1 {
			switch {
			case i > 0 && x.kids[i-1].n >= ptDegree:
				t.rotateRight(x, i-1)
			case i < x.n && x.kids[i+1].n >= ptDegree:
				t.rotateLeft(x, i)
			case i < x.n:
				t.merge(x, i)
			default:
				c = x.kids[i-1]
				t.merge(x, i-1)
			}
		}
		x = c
	}
	t.len--
	if r := t.root; r.n == 0 && !r.leaf {
		t.root = r.kids[0]
		t.recycle(r)
	}
}

// rotateRight moves the last item of child i of x up into x and x's item
// i down to the front of child i+1.
func (t *ptTree) rotateRight(x *ptNode, i int) {
	l, c := x.kids[i], x.kids[i+1]
	copy(c.items[1:c.n+1], c.items[:c.n])
	c.items[0] = x.items[i]
	if !c.leaf {
		copy(c.kids[1:c.n+2], c.kids[:c.n+1])
		c.kids[0] = l.kids[l.n]
		l.kids[l.n] = nil
	}
	c.n++
	x.items[i] = l.items[l.n-1]
	l.items[l.n-1] = ptItem{}
	l.n--
}

// rotateLeft moves the first item of child i+1 of x up into x and x's item
// i down to the end of child i.
func (t *ptTree) rotateLeft(x *ptNode, i int) {
	c, r := x.kids[i], x.kids[i+1]
	c.items[c.n] = x.items[i]
	if !c.leaf {
		c.kids[c.n+1] = r.kids[0]
	}
	c.n++
	x.items[i] = r.items[0]
	copy(r.items[:r.n-1], r.items[1:r.n])
	r.items[r.n-1] = ptItem{}
	if !r.leaf {
		copy(r.kids[:r.n], r.kids[1:r.n+1])
		r.kids[r.n] = nil
	}
	r.n--
}

// merge joins child i+1 of x and x's item i onto the end of child i.
func (t *ptTree) merge(x *ptNode, i int) {
	y, z := x.kids[i], x.kids[i+1]
	y.items[y.n] = x.items[i]
	copy(y.items[y.n+1:], z.items[:z.n])
	if !y.leaf {
		copy(y.kids[y.n+1:], z.kids[:z.n+1])
	}
	y.n += z.n + 1
	copy(x.items[i:x.n-1], x.items[i+1:x.n])
	x.items[x.n-1] = ptItem{}
	copy(x.kids[i+1:x.n], x.kids[i+2:x.n+1])
	x.kids[x.n] = nil
	x.n--
	t.recycle(z)
}
