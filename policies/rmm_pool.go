package policies

import (
	"errors"
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// RMMPool is RAPIDS RMM's pool_memory_resource over cudaMalloc, as in
// rapidsai/rmm pool_memory_resource (include/rmm/mr/device/
// pool_memory_resource.hpp, now cpp/src/mr/detail/
// pool_memory_resource_impl.cpp) and its stream-ordered base
// (detail/stream_ordered_memory_resource.hpp, coalescing_free_list.hpp).
//
// Requests are rounded up to 256 B. Free blocks are kept in one coalescing
// free list per stream: a freed block joins the list of the stream it is
// freed on, merged with address neighbours of that list, never across two
// upstream allocations. A malloc takes the best fit (the smallest block
// that holds it, the lowest address among equals) from its own stream's
// list, splitting off the rest, which stays in that list. Failing that, it
// takes the best fit of the first other stream's list that has one (RMM
// makes the allocating stream wait on an event recorded at the free, so
// no host synchronization is needed and the block is reusable at once in
// the replay); the rest stays in that other list. Failing that, it merges
// the other streams' lists into its own one by one, coalescing, until a
// block fits. The other streams are visited in the order RMM keeps them,
// by their event handles, which the policy takes to be the order in which
// the streams were first seen. Failing that, the pool grows: it asks the
// device for max(request, current pool size) bytes, or with a maximum pool
// size for max(request, half the room left) when the request fits in the
// room left; when the device refuses, it halves the size, down to the
// request, and tries again (each a retry, see Retries). Then the malloc is
// an OOM. The pool never gives memory back to the device (RMM only does at
// destruction); empty_cache does nothing. A malloc of 0 bytes returns the
// block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - initial_pool_size [0]: bytes taken from the device when the policy is
//     built, in the default stream's list; a multiple of 256.
//   - maximum_pool_size [none]: the most bytes the pool may hold; a
//     multiple of 256, at least initial_pool_size.
type RMMPool struct {
	name     string
	dev      Device
	maxSize  uint64 // maximum pool size; 0 if none
	poolSize uint64 // bytes taken from the device
	streams  rmmStreams[rmmPoolList]
	live     trace.AddrMap[*fitBlock]
	retries  int64
	nodes    fitNodes
	// free is the free bytes of every stream's list and largest their
	// largest free blocks by the order of streams, kept as lists change,
	// so that a malloc finds the first other stream with room (and
	// FreeSpace its answer) without trying every stream (N streams cost
	// N^2).
	free    uint64
	largest sizeTree
}

// rmmPoolList is one stream's coalescing free list.
type rmmPoolList struct {
	free  fitTree
	id    int    // in RMMPool.streams.order, plus one; 0 until counted
	bytes uint64 // free.bytes when last counted in RMMPool.free
}

// list returns the free list of stream, created empty if new.
func (p *RMMPool) list(stream uint64) *rmmPoolList {
	l := p.streams.get(stream)
	if l.id == 0 {
		l.id = len(p.streams.order)
	}
	return l
}

// counted counts list l again in p.free and p.largest, after a change.
func (p *RMMPool) counted(l *rmmPoolList) {
	p.free = p.free - l.bytes + l.free.bytes
	l.bytes = l.free.bytes
	p.largest.set(l.id-1, l.free.largest())
}

// rmmAlignment is RMM's CUDA_ALLOCATION_ALIGNMENT in bytes.
const rmmAlignment = 256

var (
	_ Policy     = (*RMMPool)(nil)
	_ FreeSpacer = (*RMMPool)(nil)
	_ Counter    = (*RMMPool)(nil)
)

// rmmPoolSettings are the settings of rmm-pool, which rmm-binning has too.
var rmmPoolSettings = []Setting{
	{Key: "initial_pool_size", Default: "0", Doc: "bytes taken from the device when the policy is built, a multiple of 256"},
	{Key: "maximum_pool_size", Default: "none", Derived: true, Doc: "the most bytes the pool may hold, a multiple of 256, at least initial_pool_size"},
}

func init() {
	register(Info{
		Name:     "rmm-pool",
		Design:   "RAPIDS RMM's pool_memory_resource over cudaMalloc (pool_memory_resource_impl.cpp)",
		Settings: rmmPoolSettings,
	}, func(dev Device, s Settings) (Policy, error) { return NewRMMPool(dev, s) })
}

// NewRMMPool returns an rmm-pool policy on dev, with its initial pool
// allocated. It returns an error naming the key for an unknown or
// malformed setting, and an error wrapping ErrOutOfMemory when the device
// refuses the initial pool.
func NewRMMPool(dev Device, s Settings) (*RMMPool, error) {
	if err := s.Check("rmm-pool", "initial_pool_size", "maximum_pool_size"); err != nil {
		return nil, err
	}
	return newRMMPool("rmm-pool", dev, s)
}

// newRMMPool builds a pool reading the settings initial_pool_size and
// maximum_pool_size of s; name is the policy's, for errors.
func newRMMPool(name string, dev Device, s Settings) (*RMMPool, error) {
	initial, err := s.Bytes(name, "initial_pool_size", 0)
	if err != nil {
		return nil, err
	}
	if initial%rmmAlignment != 0 || initial > maxRequest {
		return nil, invalidSettingf(name, s, "initial_pool_size", "must be a multiple of 256 B")
	}
	maxSize, err := s.Bytes(name, "maximum_pool_size", 0)
	if err != nil {
		return nil, err
	}
	if _, set := s["maximum_pool_size"]; set {
		if maxSize == 0 || maxSize%rmmAlignment != 0 || maxSize > maxRequest {
			return nil, invalidSettingf(name, s, "maximum_pool_size", "must be a positive multiple of 256 B")
		}
		if initial > maxSize {
			return nil, invalidSettingf(name, s, "initial_pool_size", "exceeds maximum_pool_size (%d)", maxSize)
		}
	}
	p := &RMMPool{name: name, dev: dev, maxSize: maxSize}
	if initial > 0 {
		b, err := p.expand(initial, initial)
		if err != nil {
			return nil, fmt.Errorf("policy %s: initial pool of %d bytes: %w", name, initial, err)
		}
		l := p.list(0)
		l.free.insert(b)
		p.counted(l)
	}
	return p, nil
}

// Name returns "rmm-pool".
func (p *RMMPool) Name() string { return p.name }

// Retries returns the number of device allocations tried again at half
// the size after the device refused.
func (p *RMMPool) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes in all the streams' lists and the size
// in bytes of the largest free block.
func (p *RMMPool) FreeSpace() (total, largest uint64) {
	return p.free, p.largest.max()
}

// Malloc places size bytes, rounded up to 256 B, on stream: from the
// stream's own free list, another stream's, the lists merged, or a new
// upstream block. It returns an error wrapping ErrOutOfMemory when the
// pool cannot grow.
func (p *RMMPool) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge(p.name, size)
	}
	n := ceilToMultiple(size, rmmAlignment)
	own := p.list(stream)
	if b := own.free.takeBest(n); b != nil {
		return p.placeIn(own, b, n), nil
	}
	// The first other stream, in the order first seen, with a block of n
	// bytes.
	i := p.largest.first(0, n)
	if i == own.id-1 {
		i = p.largest.first(i+1, n)
	}
	if i >= 0 {
		o := p.streams.order[i]
		return p.placeIn(o, o.free.takeBest(n), n), nil
	}
	// The other streams' lists that hold any, in that order, merged into
	// own's until a block fits.
	for i := p.largest.first(0, 1); i >= 0; i = p.largest.first(i+1, 1) {
		o := p.streams.order[i]
		if o == own {
			continue
		}
		p.merge(&own.free, &o.free)
		p.counted(o)
		if b := own.free.takeBest(n); b != nil {
			return p.placeIn(own, b, n), nil
		}
		p.counted(own)
	}
	b, err := p.expand(p.sizeToGrow(n), n)
	if err != nil {
		return Block{}, fmt.Errorf("policy %s: malloc of %d bytes on stream %#x: %w", p.name, size, stream, err)
	}
	return p.placeIn(own, b, n), nil
}

// Free returns the block at addr to the free list of stream, coalesced
// with its neighbours in that list. It returns an error if addr is not a
// live block.
func (p *RMMPool) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	b, _ := p.live.Take(addr)
	if b == nil {
		return fmt.Errorf("policy %s: free of %#x: not a live block", p.name, addr)
	}
	l := p.list(stream)
	p.insert(&l.free, b)
	p.counted(l)
	return nil
}

// placeIn is place in the list of a stream, counted after.
func (p *RMMPool) placeIn(l *rmmPoolList, b *fitBlock, n uint64) Block {
	blk := p.place(&l.free, b, n)
	p.counted(l)
	return blk
}

// place allocates n bytes from the front of block b, taken out of list t
// (or new); the rest goes to t.
func (p *RMMPool) place(t *fitTree, b *fitBlock, n uint64) Block {
	if b.size > n {
		r := p.nodes.get(b.addr+n, b.size-n)
		linkAfter(b, r)
		b.size = n
		p.insert(t, r)
	}
	p.live.Put(b.addr, b)
	return Block{Addr: b.addr, Size: n}
}

// insert puts free block b into list t, merged with its address
// neighbours of the same list (neighbours never cross an upstream block).
func (p *RMMPool) insert(t *fitTree, b *fitBlock) {
	if pv := b.prev; pv != nil && pv.tree == t {
		t.remove(pv)
		pv.size += b.size
		unlink(b)
		p.nodes.put(b)
		b = pv
	}
	if nx := b.next; nx != nil && nx.tree == t {
		t.remove(nx)
		b.size += nx.size
		unlink(nx)
		p.nodes.put(nx)
	}
	t.insert(b)
}

// merge moves every block of list src into list dst, coalescing.
func (p *RMMPool) merge(dst, src *fitTree) {
	// Coalescing makes the result the same whatever the order of the moves.
	for {
		b, ok := src.blocks.any()
		if !ok {
			return
		}
		src.remove(b)
		p.insert(dst, b)
	}
}

// sizeToGrow returns the bytes to ask of the device for a request of n
// bytes, 0 if the maximum pool size leaves no room.
func (p *RMMPool) sizeToGrow(n uint64) uint64 {
	if p.maxSize == 0 {
		return max(n, p.poolSize)
	}
	room := ceilToMultiple(p.maxSize-p.poolSize, rmmAlignment)
	if n > room {
		return 0
	}
	return max(n, room/2)
}

// expand allocates an upstream block of try bytes, halving down to least
// bytes while the device refuses, and returns it as one free block in no
// list.
func (p *RMMPool) expand(try, least uint64) (*fitBlock, error) {
	for try >= least && try > 0 {
		addr, err := p.dev.Alloc(try)
		if err == nil {
			p.poolSize += try
			return p.nodes.get(addr, try), nil
		}
		if !errors.Is(err, ErrOutOfMemory) {
			return nil, err
		}
		if try == least {
			return nil, err
		}
		p.retries++
		try = max(least, try/2)
	}
	return nil, fmt.Errorf("maximum pool size exceeded: pool %d of %d bytes, request %d: %w", p.poolSize, p.maxSize, least, ErrOutOfMemory)
}

// rmmStreams holds per-stream state (free lists) in the order in which
// the streams were first seen, the order RMM's stream-ordered resources
// visit the other streams' lists in.
type rmmStreams[L any] struct {
	byID   map[uint64]*L
	order  []*L
	lastID uint64
	last   *L
}

// get returns the state of stream, created empty if new.
func (s *rmmStreams[L]) get(stream uint64) *L {
	if s.last != nil && s.lastID == stream {
		return s.last
	}
	l, ok := s.byID[stream]
	if !ok {
		if s.byID == nil {
			s.byID = map[uint64]*L{}
		}
		l = new(L)
		s.byID[stream] = l
		s.order = append(s.order, l)
	}
	s.lastID, s.last = stream, l
	return l
}
