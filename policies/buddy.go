package policies

import (
	"fmt"
	"math/bits"
)

// Buddy is a binary buddy allocator (Knowlton 1965; Knuth, TAOCP vol. 1,
// 2.5): memory comes from the device in chunks of 2^max_order bytes, a
// malloc takes a block of the smallest power of two from 2^min_order up
// that holds it, splitting a larger free block in halves as needed, and a
// freed block merges with its buddy (the other half of the block it was
// split from) as long as that buddy is free and whole.
//
// A split keeps the lower half and puts the upper half on the free list of
// its order; each order's free list is last in, first out. A request larger
// than a chunk goes straight to the device as a segment of its own, rounded
// up to 2 MiB; that segment is the block. When the device refuses a chunk
// or such a segment, every wholly free chunk is returned to the device and,
// if any was, the device allocation is tried once more (a retry, see
// Retries); then the malloc is an OOM. Streams are ignored. A malloc of 0
// bytes returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - min_order [9]: the smallest block is 2^min_order bytes (512 B).
//   - max_order [26]: a chunk is 2^max_order bytes (64 MiB: three of
//     PyTorch's 20 MiB large segments, a small part of a GPU's memory);
//     min_order <= max_order <= 48.
//   - release [false]: return a chunk to the device as soon as it is wholly
//     free, rather than keep it cached until EmptyCache or a retry.
type Buddy struct {
	dev                Device
	minOrder, maxOrder uint
	chunkSize          uint64
	release            bool

	lists     []*buddyNode // free blocks by order: a doubly linked list, most recent first
	counts    []int        // free blocks by order
	blocks    map[uint64]*buddyNode
	large     map[uint64]uint64 // segments of requests over a chunk: address -> bytes
	freeBytes uint64
	retries   int64
	spare     []*buddyNode
}

// buddyNode is a block of a chunk, free or allocated.
type buddyNode struct {
	addr, chunk uint64 // the block's and its chunk's addresses
	order       uint
	free        bool
	prev, next  *buddyNode // free list of the order, for a free block
}

var (
	_ Policy     = (*Buddy)(nil)
	_ Releaser   = (*Buddy)(nil)
	_ FreeSpacer = (*Buddy)(nil)
	_ Counter    = (*Buddy)(nil)
)

func init() {
	register(Info{
		Name:   "buddy",
		Design: "binary buddy allocator (Knowlton 1965; Knuth, TAOCP vol. 1, 2.5)",
		Settings: []Setting{
			{Key: "min_order", Default: "9", Doc: "the smallest block is 2^min_order bytes"},
			{Key: "max_order", Default: "26", Doc: "a device chunk is 2^max_order bytes; min_order <= max_order <= 48"},
			{Key: "release", Default: "false", Doc: "return a chunk to the device as soon as it is wholly free"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewBuddy(dev, s) })
}

// NewBuddy returns a buddy policy on dev. It returns an error naming the
// key for an unknown or malformed setting.
func NewBuddy(dev Device, s Settings) (*Buddy, error) {
	const name = "buddy"
	if err := s.Check(name, "min_order", "max_order", "release"); err != nil {
		return nil, err
	}
	lo, err := s.Uint(name, "min_order", 9)
	if err != nil {
		return nil, err
	}
	hi, err := s.Uint(name, "max_order", 26)
	if err != nil {
		return nil, err
	}
	if hi > 48 {
		return nil, invalidSettingf(name, s, "max_order", "must be at most 48")
	}
	if lo > hi {
		if _, ok := s["min_order"]; ok {
			return nil, invalidSettingf(name, s, "min_order", "must be at most max_order (%d)", hi)
		}
		return nil, invalidSettingf(name, s, "max_order", "must be at least min_order (%d)", lo)
	}
	rel, err := s.Bool(name, "release", false)
	if err != nil {
		return nil, err
	}
	return &Buddy{
		dev:       dev,
		minOrder:  uint(lo),
		maxOrder:  uint(hi),
		chunkSize: 1 << hi,
		release:   rel,
		lists:     make([]*buddyNode, hi+1),
		counts:    make([]int, hi+1),
		blocks:    map[uint64]*buddyNode{},
		large:     map[uint64]uint64{},
	}, nil
}

// Name returns "buddy".
func (p *Buddy) Name() string { return "buddy" }

// Retries returns the number of device allocations retried after
// returning the wholly free chunks to the device.
func (p *Buddy) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes inside the cached chunks and the size in
// bytes of the largest free block.
func (p *Buddy) FreeSpace() (total, largest uint64) {
	for k := int(p.maxOrder); k >= int(p.minOrder); k-- {
		if p.counts[k] > 0 {
			return p.freeBytes, 1 << k
		}
	}
	return p.freeBytes, 0
}

// Malloc places size bytes in a block of the smallest order that holds
// them, or in a segment of its own for a request over the chunk size.
// Stream is ignored. It returns an error wrapping ErrOutOfMemory when the
// device refuses a chunk or segment even after the release of every wholly
// free chunk.
func (p *Buddy) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("buddy", size)
	}
	if size > p.chunkSize {
		n := ceilToMultiple(size, deviceGranularity)
		addr, err := p.deviceAlloc(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy buddy: malloc of %d bytes: %w", size, err)
		}
		p.large[addr] = n
		return Block{Addr: addr, Size: n}, nil
	}
	k := max(p.minOrder, uint(bits.Len64(size-1)))
	j := k
	for j <= p.maxOrder && p.lists[j] == nil {
		j++
	}
	var b *buddyNode
	if j > p.maxOrder {
		addr, err := p.deviceAlloc(p.chunkSize)
		if err != nil {
			return Block{}, fmt.Errorf("policy buddy: malloc of %d bytes: %w", size, err)
		}
		b = p.newNode(addr, addr, p.maxOrder)
		p.blocks[addr] = b
		p.freeBytes += p.chunkSize
		j = p.maxOrder
	} else {
		b = p.lists[j]
		p.unlink(b)
	}
	for j > k {
		j--
		u := p.newNode(b.addr+1<<j, b.chunk, j)
		p.blocks[u.addr] = u
		p.push(u)
	}
	b.order = k
	b.free = false
	p.freeBytes -= 1 << k
	return Block{Addr: b.addr, Size: 1 << k}, nil
}

// Free returns the block at addr, merging it with its buddy while the buddy
// is free; with release set, a chunk left wholly free goes back to the
// device. A segment of its own goes back to the device at once. Stream is
// ignored. It returns an error if addr is not a live block.
func (p *Buddy) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	b, ok := p.blocks[addr]
	if !ok || b.free {
		if _, ok := p.large[addr]; ok {
			delete(p.large, addr)
			if err := p.dev.Free(addr); err != nil {
				return fmt.Errorf("policy buddy: %w", err)
			}
			return nil
		}
		return fmt.Errorf("policy buddy: free of %#x: not a live block", addr)
	}
	p.freeBytes += 1 << b.order
	for b.order < p.maxOrder {
		u, ok := p.blocks[b.chunk+((b.addr-b.chunk)^(1<<b.order))]
		if !ok || !u.free || u.order != b.order {
			break
		}
		p.unlink(u)
		if u.addr < b.addr {
			b, u = u, b
		}
		delete(p.blocks, u.addr)
		p.recycle(u)
		b.order++
	}
	b.free = true
	if p.release && b.order == p.maxOrder {
		return p.freeChunk(b)
	}
	p.push(b)
	return nil
}

// EmptyCache returns every wholly free chunk to the device.
func (p *Buddy) EmptyCache() error {
	_, err := p.releaseFree()
	return err
}

// releaseFree returns every wholly free chunk to the device and reports how
// many it returned.
func (p *Buddy) releaseFree() (int, error) {
	n := 0
	for b := p.lists[p.maxOrder]; b != nil; b = p.lists[p.maxOrder] {
		p.unlink(b)
		if err := p.freeChunk(b); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// freeChunk returns the chunk of free block b, which spans it and is on no
// list, to the device.
func (p *Buddy) freeChunk(b *buddyNode) error {
	delete(p.blocks, b.addr)
	p.freeBytes -= p.chunkSize
	addr := b.addr
	p.recycle(b)
	if err := p.dev.Free(addr); err != nil {
		return fmt.Errorf("policy buddy: %w", err)
	}
	return nil
}

// deviceAlloc allocates n bytes from the device; when the device refuses,
// it returns the wholly free chunks and, if there were any, tries once more.
func (p *Buddy) deviceAlloc(n uint64) (uint64, error) {
	return allocRetry(p.dev, n, p.releaseFree, &p.retries)
}

func (p *Buddy) push(b *buddyNode) {
	b.free = true
	b.prev, b.next = nil, p.lists[b.order]
	if b.next != nil {
		b.next.prev = b
	}
	p.lists[b.order] = b
	p.counts[b.order]++
}

func (p *Buddy) unlink(b *buddyNode) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		p.lists[b.order] = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
	b.prev, b.next = nil, nil
	p.counts[b.order]--
}

func (p *Buddy) newNode(addr, chunk uint64, order uint) *buddyNode {
	var b *buddyNode
	if k := len(p.spare); k > 0 {
		b = p.spare[k-1]
		p.spare = p.spare[:k-1]
	} else {
		b = new(buddyNode)
	}
	*b = buddyNode{addr: addr, chunk: chunk, order: order}
	return b
}

func (p *Buddy) recycle(b *buddyNode) {
	*b = buddyNode{}
	p.spare = append(p.spare, b)
}
