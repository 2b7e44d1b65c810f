package policies

import (
	"errors"
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// deviceGranularity is the granularity in bytes of the segments the
// caching policies of this package (first-fit, best-fit, buddy, slab) ask
// the device for: cudaMalloc maps memory in 2 MiB pages, so a segment size
// is rounded up to a multiple of it.
const deviceGranularity = 2 << 20

// maxRequest is the largest request in bytes a policy of this package
// tries to place; anything larger is an OOM at once (and keeps the rounding
// arithmetic clear of overflow).
const maxRequest = 1 << 62

// ceilToMultiple returns n rounded up to a multiple of m (m > 0).
func ceilToMultiple(n, m uint64) uint64 {
	if r := n % m; r != 0 {
		return n + (m - r)
	}
	return n
}

// isPowerOfTwo reports whether n is a power of two (n > 0).
// allocRetry allocates size bytes from dev. When the device refuses, it
// calls release to return the policy's wholly free segments and, if that
// returned any, counts a retry in *retries and tries once more; when
// nothing was released the refusal stands. This is the retry rule of the
// caching policies that copy no particular allocator's.
func allocRetry(dev Device, size uint64, release func() (int, error), retries *int64) (uint64, error) {
	addr, err := dev.Alloc(size)
	if err == nil || !errors.Is(err, ErrOutOfMemory) {
		return addr, err
	}
	released, rerr := release()
	if rerr != nil {
		return 0, rerr
	}
	if released == 0 {
		return 0, err
	}
	*retries++
	return dev.Alloc(size)
}

func isPowerOfTwo(n uint64) bool { return n != 0 && n&(n-1) == 0 }

// invalidSettingf returns the error for a setting that parsed but is out of
// range: it names the policy, the key and the value as given.
func invalidSettingf(policy string, s Settings, key, format string, args ...any) error {
	return fmt.Errorf("policy %s: setting %s=%q: %s", policy, key, s[key], fmt.Sprintf(format, args...))
}

// errRequestTooLarge is the OOM of a request over maxRequest bytes.
func errRequestTooLarge(policy string, size uint64) error {
	return fmt.Errorf("policy %s: malloc of %d bytes: larger than any device: %w", policy, size, ErrOutOfMemory)
}

// flBlock is a block of a coalescing free list: a run of bytes of one
// segment, free or allocated, linked to its address neighbours in the
// segment. A free block is also in the policy's free tree.
type flBlock struct {
	addr, size uint64
	seg        *flSegment
	prev, next *flBlock // address neighbours in the segment, nil at its ends
	free       bool
	// pend is async-pool's pending free of a block in a stream's pending
	// tree (pend.s nil otherwise): its stream and place in its frees;
	// serial is its newest free among the pool's, its second key in the
	// pool's trees.
	pend   apFree
	serial uint64
}

// flSegment is a device segment of a coalescing free list.
type flSegment struct {
	addr, size uint64
	first      *flBlock // the block at addr
	index      int      // position in coalescing.segments
}

// coalescing is the allocator shared by FirstFit and BestFit.
type coalescing struct {
	name        string
	dev         Device
	bestFit     bool
	alignment   uint64
	segmentSize uint64
	release     bool

	free      freeTree[*flBlock] // by (size, addr) for best fit, by addr for first fit
	live      trace.AddrMap[*flBlock]
	segments  []*flSegment
	freeBytes uint64
	retries   int64
	spare     []*flBlock
}

func (c *coalescing) init(name string, bestFit bool, dev Device, s Settings) error {
	if err := s.Check(name, "alignment", "segment_size", "release"); err != nil {
		return err
	}
	align, err := s.Bytes(name, "alignment", 512)
	if err != nil {
		return err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	seg, err := s.Bytes(name, "segment_size", deviceGranularity)
	if err != nil {
		return err
	}
	if seg == 0 || seg > maxRequest {
		return invalidSettingf(name, s, "segment_size", "must be from 1 B to 4 EiB")
	}
	rel, err := s.Bool(name, "release", false)
	if err != nil {
		return err
	}
	*c = coalescing{
		name:        name,
		dev:         dev,
		bestFit:     bestFit,
		alignment:   align,
		segmentSize: ceilToMultiple(seg, deviceGranularity),
		release:     rel,
		free:        freeTree[*flBlock]{byAddr: !bestFit},
	}
	return nil
}

// Name returns the policy's registry name.
func (c *coalescing) Name() string { return c.name }

// Retries returns the number of device allocations retried after
// returning the wholly free segments to the device.
func (c *coalescing) Retries() int64 { return c.retries }

// FreeSpace returns the free bytes inside the cached segments and the size
// in bytes of the largest free block.
func (c *coalescing) FreeSpace() (total, largest uint64) {
	return c.freeBytes, c.free.largest()
}

// Malloc places size bytes (rounded up to the alignment) in a free block,
// or in a new segment. Stream is ignored. It returns an error wrapping
// ErrOutOfMemory when the device refuses the segment even after the
// release of every wholly free segment.
func (c *coalescing) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge(c.name, size)
	}
	n := ceilToMultiple(size, c.alignment)
	b := c.take(n)
	if b == nil {
		g, err := c.grow(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy %s: malloc of %d bytes: %w", c.name, size, err)
		}
		b = c.split(g, n)
	}
	b.free = false
	c.freeBytes -= n
	c.live.Put(b.addr, b)
	return Block{Addr: b.addr, Size: n}, nil
}

// Free returns the block at addr to the free list, coalesced with its free
// neighbours; with release set, a segment left wholly free goes back to
// the device. Stream is ignored. It returns an error if addr is not a live
// block.
func (c *coalescing) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	b, ok := c.live.Take(addr)
	if !ok {
		return fmt.Errorf("policy %s: free of %#x: not a live block", c.name, addr)
	}
	return c.freeBlock(b)
}

// freeBlock is Free of live block b, already out of the live map.
func (c *coalescing) freeBlock(b *flBlock) error {
	c.freeBytes += b.size
	p, nx := b.prev, b.next
	pFree, nxFree := p != nil && p.free, nx != nil && nx.free
	switch {
	case c.bestFit:
		// Coalesced, the block goes back by its new size.
		if pFree {
			c.remove(p)
			p.size += b.size
			c.unlink(b)
			b = p
		}
		if nxFree {
			c.remove(nx)
			b.size += nx.size
			c.unlink(nx)
		}
		b.free = true
		c.insert(b)
	case pFree:
		// By address, a free neighbour grows in place.
		size := p.size + b.size
		if nxFree {
			c.remove(nx)
			size += nx.size
			c.unlink(nx)
		}
		c.unlink(b)
		c.resize(p, p.addr, size)
		b = p
	case nxFree:
		c.resize(nx, b.addr, nx.size+b.size)
		c.unlink(b)
		b = nx
	default:
		b.free = true
		c.insert(b)
	}
	if c.release && b.prev == nil && b.next == nil {
		c.remove(b)
		return c.freeSegment(b.seg)
	}
	return nil
}

// EmptyCache returns every wholly free segment to the device.
func (c *coalescing) EmptyCache() error {
	_, err := c.releaseFree()
	return err
}

// releaseFree returns every wholly free segment to the device and reports
// how many it returned.
func (c *coalescing) releaseFree() (int, error) {
	n := 0
	for i := 0; i < len(c.segments); {
		s := c.segments[i]
		if f := s.first; f.free && f.next == nil {
			c.remove(f)
			if err := c.freeSegment(s); err != nil {
				return n, err
			}
			n++
			continue // segments[i] now holds the former last segment
		}
		i++
	}
	return n, nil
}

// freeSegment returns segment s, whose single block is free and out of the
// free tree, to the device.
func (c *coalescing) freeSegment(s *flSegment) error {
	last := c.segments[len(c.segments)-1]
	c.segments[s.index] = last
	last.index = s.index
	c.segments = c.segments[:len(c.segments)-1]
	c.freeBytes -= s.size
	c.recycle(s.first)
	if err := c.dev.Free(s.addr); err != nil {
		return fmt.Errorf("policy %s: %w", c.name, err)
	}
	return nil
}

// grow allocates a segment large enough for n bytes and returns its single
// free block, in the free tree.
func (c *coalescing) grow(n uint64) (*flBlock, error) {
	size := ceilToMultiple(max(c.segmentSize, n), deviceGranularity)
	addr, err := allocRetry(c.dev, size, c.releaseFree, &c.retries)
	if err != nil {
		return nil, err
	}
	s := &flSegment{addr: addr, size: size, index: len(c.segments)}
	b := c.newBlock(addr, size, s)
	b.free = true
	s.first = b
	c.segments = append(c.segments, s)
	c.freeBytes += size
	c.insert(b)
	return b, nil
}

func (c *coalescing) newBlock(addr, size uint64, s *flSegment) *flBlock {
	var b *flBlock
	if k := len(c.spare); k > 0 {
		b = c.spare[k-1]
		c.spare = c.spare[:k-1]
	} else {
		b = new(flBlock)
	}
	*b = flBlock{addr: addr, size: size, seg: s, free: true}
	return b
}

func (c *coalescing) recycle(b *flBlock) {
	*b = flBlock{}
	c.spare = append(c.spare, b)
}

// linkBefore puts new block a in front of b in b's segment.
func (c *coalescing) linkBefore(b, a *flBlock) {
	a.prev, a.next = b.prev, b
	if b.prev != nil {
		b.prev.next = a
	} else {
		b.seg.first = a
	}
	b.prev = a
}

// linkAfter puts new block r after b in b's segment.
func (c *coalescing) linkAfter(b, r *flBlock) {
	r.prev, r.next = b, b.next
	if b.next != nil {
		b.next.prev = r
	}
	b.next = r
}

// unlink takes block b, merged into a neighbour and out of the free tree, out
// of its segment and recycles it.
func (c *coalescing) unlink(b *flBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		b.seg.first = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
	c.recycle(b)
}

// take places n bytes in the free block find would return, in one
// descent of the free tree, and returns the block of n bytes cut from it,
// out of the tree; nil if no free block is large enough. As split, best
// fit takes the front and returns the rest by its new size, first fit
// cuts the front and the rest keeps its place.
func (c *coalescing) take(n uint64) *flBlock {
	if c.bestFit {
		b, ok := c.free.takeBest(n)
		if !ok {
			return nil
		}
		if b.size > n {
			r := c.newBlock(b.addr+n, b.size-n, b.seg)
			c.linkAfter(b, r)
			b.size = n
			c.insert(r)
		}
		return b
	}
	return c.takeFirst(n, ^uint64(0))
}

// takeFirst is take under first fit, from a block below the address
// below only.
func (c *coalescing) takeFirst(n, below uint64) *flBlock {
	b, old, ok := c.free.takeFirst(n, below, nil)
	if !ok {
		return nil
	}
	if old == n {
		return b
	}
	a := c.newBlock(b.addr, n, b.seg)
	c.linkBefore(b, a)
	b.addr, b.size = b.addr+n, b.size-n
	return a
}

// split places n bytes in free block b, in the free tree, and returns the
// block of n bytes cut from it, out of the tree.
func (c *coalescing) split(b *flBlock, n uint64) *flBlock {
	switch {
	case b.size == n:
		c.remove(b)
	case c.bestFit:
		// Every size is a multiple of the alignment, so the remainder is
		// at least one alignment unit. It goes back by its new size.
		c.remove(b)
		r := c.newBlock(b.addr+n, b.size-n, b.seg)
		c.linkAfter(b, r)
		b.size = n
		c.insert(r)
	default:
		// By address, the remainder takes the free block's place in the
		// tree: a new block is cut from the front of it.
		a := c.newBlock(b.addr, n, b.seg)
		c.linkBefore(b, a)
		c.resize(b, b.addr+n, b.size-n)
		b = a
	}
	return b
}

// insert puts free block b into the free tree.
func (c *coalescing) insert(b *flBlock) { c.free.insert(b.size, b.addr, b) }

// remove takes free block b, with the address and size it has in the free
// tree, out of it.
func (c *coalescing) remove(b *flBlock) { c.free.delete(b.size, b.addr) }

// resize sets the address and size of free block b in place, in a tree by
// address; b's place in address order must not change. Under first fit a
// split or a coalesce changes a free block this way.
func (c *coalescing) resize(b *flBlock, addr, size uint64) {
	c.free.resize(b.addr, addr, size)
	b.addr, b.size = addr, size
}
