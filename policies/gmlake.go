package policies

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// This file simulates GMLake's allocator: the caching allocator of
// intelligent-machine-learning/glake, GMLake/src/CUDACachingAllocator.cpp
// (with GMLake/include/cuda_vmm_allocator.h), a PyTorch 2.0
// CUDACachingAllocator.cpp whose large pool is made of 2 MiB physical
// chunks mapped through the driver's virtual memory calls, and which
// stitches free blocks into one virtual range when no single one fits
// (Cong Guo et al., "GMLake: Efficient and Transparent GPU Memory
// Defragmentation for Large-scale DNN Training with Virtual Memory
// Stitching", ASPLOS 2024). The malloc and free paths are here, stitching
// and the stitched blocks' pages in gmlake_stitch.go.

// GMLake constants, in bytes.
const (
	gmChunk = 2 << 20 // a physical chunk (kGranularity); large requests are rounded up to it
	gmGiB   = 1 << 30 // the unit of autoGC
	// gmMaxStitch is the largest segment whose pages may be stitched (2
	// TiB, more than any device holds): the pages of a segment are
	// tracked one by one once stitched.
	gmMaxStitch = 1 << 41
)

// The keys of GMLake's settings: its environment variables' names.
const (
	gmKeyFragLimit   = "fragLimit"
	gmKeyReuseLimit  = "reuseLimit"
	gmKeyDefragLevel = "defragLevel"
	gmKeyAutoGC      = "autoGC"
)

// GMLake is a simulation of GMLake's caching allocator
// (intelligent-machine-learning/glake, GMLake/src/CUDACachingAllocator.cpp;
// the ASPLOS 2024 paper "GMLake: Efficient and Transparent GPU Memory
// Defragmentation for Large-scale DNN Training with Virtual Memory
// Stitching"), with its defaults (vmmDefragment=1). Sizes are in bytes.
//
// It is PyTorch's caching allocator (see PyTorch) as GMLake changes it:
// requests are rounded up to 512 bytes, and those over 1 MiB (the large
// pool) further up to 2 MiB; small requests are carved out of 2 MiB
// segments from the device (cudaMalloc), large ones out of segments of 20
// MiB (requests under 10 MiB) or of the request, each a reserved address
// range with all its 2 MiB pages mapped (one device allocation); free
// blocks are taken best fit per stream, ties to the lowest address; a
// large block is split when 2 MiB or more remains, a small one when 512
// bytes do; freed blocks merge with their free neighbours.
//
// Stitching: a large malloc that finds no free block takes, before a new
// segment, a cached stitched block of its stream at least its size and at
// most reuseLimit times it (the smallest; its first pages, as many as the
// request needs, are taken out of the free blocks that hold them). Else,
// for a request of at least fragLimit bytes, when the stream has two free
// large blocks or more that add up to the request, the largest (ties: the
// highest address) are taken until they do, the last one split when 2 MiB
// or more is over, and their pages are mapped into one new address range:
// a stitched block, which stays cached when freed. defragLevel says when
// stitching is tried: 0 before a new segment, 1 only after a new segment
// failed, 2 only after the retry failed. When a new segment would pass
// the capacity, every cached segment that is not split is freed (with the
// stitched blocks over its pages) and the segment is tried once more (a
// retry); then, as stitching allows, the malloc fails (an OOM). Once more
// than autoGC GiB of stitched blocks were made (less those collected),
// every stitched block not in use is collected (its address range given
// back), as after empty_cache.
//
// The Mapper seam has no call that maps memory already mapped at a second
// address (GMLake's cuMemMap of a chunk's handle into the stitched range),
// so each 2 MiB page is mapped at one place at a time: a stitched block's
// pages are moved into its range when it is handed out (an unmap where
// they were, a map there), and back home when an original block holding
// them is handed out or the stitched block is collected. The memory
// reserved is GMLake's (each page counted once); the device allocations
// and frees, and their cost (a map is charged as a cudaMalloc of its size,
// an unmap as a cudaFree), are those moves rather than GMLake's maps of
// retained chunks, which allocate nothing; and a replay's fragmentation
// figure, which takes a malloc that made a device allocation while its
// free bytes sufficed as fragmented, takes a malloc that moved pages so.
//
// Not modelled: PYTORCH_CUDA_ALLOC_CONF (max_split_size_mb,
// roundup_power2_divisions, garbage_collection_threshold: their defaults
// are taken), private pools (CUDA graphs), following a recording, GPU
// time (a stitched block's last event is always complete), the garbage
// collection of stitched blocks that a failed cuMemAddressReserve or
// cuMemCreate triggers (address space never runs out here, and stitched
// blocks hold no memory of their own), and the variables reAlloc (0 by
// default: the paper's case of free blocks too few to cover a request,
// stitched with a new segment only as large as the rest) and vmmDefragment
// (1 by default; 0 is the same allocator without stitching, near the
// pytorch policy but for the 2 MiB rounding and split). Not followed:
// release_block takes only the first page of a segment given back out of a
// stitched block in use (a slip that keeps the other pages' memory until
// that block is freed, while GMLake's reserved bytes no longer count it);
// here all of them leave it. Added: a segment over 2 TiB (more than any
// device holds) is never stitched, as its pages would be tracked one by
// one.
type GMLake struct {
	dev      Device
	mapper   Mapper
	capacity uint64 // PyTorch's allowed_memory_maximum: the device's capacity, 0 for none

	fragLimit   uint64  // fragLimit: the smallest request stitching serves
	reuseLimit  float64 // reuseLimit
	defragLevel int     // defragLevel: 0, 1 or 2
	autoGC      uint64  // autoGC in bytes (autoGC GiB)

	small, large gmSet[*gmBlock] // free blocks by (stream, size, address)
	bySize       gmSet[*gmBlock] // every free block by (size, address), for the largest
	// reusable are the stitched blocks that are free and whose pages are
	// all free (free_fused_blocks), by (stream, size, address), and
	// reusableBySize the same by (size, address).
	reusable, reusableBySize gmSet[*gmStitch]
	stitches                 []*gmStitch // every stitched block, in the order made

	active   map[uint64]*gmBlock  // original blocks handed out, by address
	stitched map[uint64]*gmStitch // stitched blocks handed out, by address

	reserved  uint64 // bytes of live segments (total_allocated_memory)
	freeBytes uint64 // bytes of free blocks
	fused     uint64 // total_fuse_size: bytes of stitched blocks made, less those collected
	retries   int64
}

var (
	_ Policy     = (*GMLake)(nil)
	_ Releaser   = (*GMLake)(nil)
	_ FreeSpacer = (*GMLake)(nil)
	_ Counter    = (*GMLake)(nil)
)

func init() {
	register(Info{
		Name:   "gmlake",
		Design: "GMLake's virtual memory stitching over PyTorch's caching allocator (glake GMLake/src/CUDACachingAllocator.cpp; ASPLOS'24): 2 MiB pages through a Mapper",
		Settings: []Setting{
			{Key: gmKeyFragLimit, Default: "512MiB", Doc: "bytes: a large request at least this size may be stitched from the stream's free blocks when no single one fits"},
			{Key: gmKeyReuseLimit, Default: "10", Doc: "a cached stitched block serves requests down to 1/reuseLimit of its size (a factor, 0 never reuses)"},
			{Key: gmKeyDefragLevel, Default: "0", Doc: "when stitching is tried: 0 before a new segment, 1 only after a new segment failed, 2 only after the retry failed"},
			{Key: gmKeyAutoGC, Default: "1000", Doc: "GiB of stitched blocks made past which every stitched block not in use is collected"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewGMLake(dev, s) })
}

// NewGMLake returns GMLake's allocator on dev with settings s (fragLimit,
// reuseLimit, defragLevel, autoGC; see Info). It returns an error naming
// the key for an unknown key or a bad value, and an error for a device
// that is not a Mapper.
func NewGMLake(dev Device, s Settings) (*GMLake, error) {
	const name = "gmlake"
	if err := s.Check(name, gmKeyFragLimit, gmKeyReuseLimit, gmKeyDefragLevel, gmKeyAutoGC); err != nil {
		return nil, err
	}
	fragLimit, err := s.Bytes(name, gmKeyFragLimit, 512<<20)
	if err != nil {
		return nil, err
	}
	reuseLimit := 10.0
	if v, ok := s[gmKeyReuseLimit]; ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, invalidSettingf(name, s, gmKeyReuseLimit, "want a factor of 0 or more")
		}
		reuseLimit = f
	}
	level, err := s.Uint(name, gmKeyDefragLevel, 0)
	if err != nil {
		return nil, err
	}
	if level > 2 {
		return nil, invalidSettingf(name, s, gmKeyDefragLevel, "want 0, 1 or 2")
	}
	autoGC, err := s.Uint(name, gmKeyAutoGC, 1000)
	if err != nil {
		return nil, err
	}
	if autoGC > math.MaxUint64/gmGiB {
		return nil, invalidSettingf(name, s, gmKeyAutoGC, "GiB past 64 bits of bytes")
	}
	mapper, ok := dev.(Mapper)
	if !ok {
		return nil, fmt.Errorf("policy %s: the device cannot map pages (it is no policies.Mapper)", name)
	}
	p := &GMLake{
		dev: dev, mapper: mapper,
		fragLimit: fragLimit, reuseLimit: reuseLimit, defragLevel: int(level), autoGC: autoGC * gmGiB,
		active: map[uint64]*gmBlock{}, stitched: map[uint64]*gmStitch{},
	}
	if c, ok := dev.(Capacitor); ok {
		p.capacity = c.Capacity()
	}
	return p, nil
}

// Name returns "gmlake".
func (p *GMLake) Name() string { return "gmlake" }

// gmBlock is a block of a segment, allocated or free; the blocks of a
// segment form an address-ordered list through prev and next. An allocated
// block is handed out, or held by a stitched block that is (its pages in
// use through the stitched block's range).
type gmBlock struct {
	addr, size uint64
	stream     uint64
	seg        *gmSeg // the large pool's segment; nil in the small pool
	prev, next *gmBlock
	allocated  bool
}

// gmSeg is a segment of the large pool: a reserved address range whose 2
// MiB pages are physical chunks, each mapped at home (its place in the
// range) or in one stitched block's range.
type gmSeg struct {
	base, size uint64
	first      *gmBlock // the block at base
	pages      []gmPage // nil until a stitched block is over some: all at home
	refs       int      // stitched blocks' references to its pages
	away       int      // pages not mapped at home
	dropping   bool     // being given back (release)
}

// gmPage is a 2 MiB physical chunk of a segment.
type gmPage struct {
	at   *gmStitch // the stitched block in whose range it is mapped, nil at home, gmNowhere unmapped
	atIx int       // its index in at's pages
	refs []gmRef   // the stitched blocks over it (mapped_blocks)
}

// gmRef is the page of index ix of stitched block st.
type gmRef struct {
	st *gmStitch
	ix int
}

// gmNowhere is where the pages of a segment being given back are, once
// unmapped from a stitched block's range.
var gmNowhere = &gmStitch{}

// gmRoundSize is GMLake's round_size: the block size for a request of size
// bytes (below maxRequest).
func gmRoundSize(size uint64) uint64 {
	if size < ptMinBlockSize {
		return ptMinBlockSize
	}
	r := ceilToMultiple(size, ptMinBlockSize)
	if r > ptSmallSize {
		r = ceilToMultiple(size, gmChunk)
	}
	return r
}

// Malloc places a request of size bytes on stream, as GMLake's
// DeviceCachingAllocator::malloc does (see GMLake). The Block's Size is the
// rounded request (or the whole small block when less than 512 bytes would
// be over). It returns an error wrapping ErrOutOfMemory when the request
// cannot be placed, and any other error of the device as it is.
func (p *GMLake) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil // a null pointer, as PyTorch's
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge(p.Name(), size)
	}
	rsize := gmRoundSize(size)
	small := rsize <= ptSmallSize
	pool := &p.large
	if small {
		pool = &p.small
	}
	// get_free_block: the pool, then a cached stitched block.
	if b := p.takeFree(pool, stream, rsize); b != nil {
		return p.handOut(b, rsize)
	}
	if !small {
		if st := p.findReusable(stream, rsize); st != nil {
			return p.reuse(st, rsize)
		}
	}
	try := func(level int) (Block, bool, error) {
		if small || level < p.defragLevel || rsize < p.fragLimit {
			return Block{}, false, nil
		}
		return p.stitch(stream, rsize)
	}
	if blk, ok, err := try(0); ok || err != nil {
		return blk, err
	}
	segSize := allocationSize(rsize)
	b, err := p.newSegment(small, stream, segSize)
	if err != nil {
		return Block{}, err
	}
	if b == nil {
		if blk, ok, err := try(1); ok || err != nil {
			return blk, err
		}
		if err := p.releaseCached(); err != nil {
			return Block{}, err
		}
		p.retries++
		if b, err = p.newSegment(small, stream, segSize); err != nil {
			return Block{}, err
		}
	}
	if b == nil {
		if blk, ok, err := try(2); ok || err != nil {
			return blk, err
		}
		return Block{}, fmt.Errorf("gmlake: malloc of %d bytes on stream %#x: segment of %d bytes with %d reserved, %d cached free: %w",
			size, stream, segSize, p.reserved, p.freeBytes, ErrOutOfMemory)
	}
	return p.handOut(b, rsize)
}

// handOut hands out the free block b, out of its pool, for a block of
// rsize bytes: split when enough is over (the rest back to the pool), its
// pages mapped at home.
func (p *GMLake) handOut(b *gmBlock, rsize uint64) (Block, error) {
	if rest := b.size - rsize; b.seg == nil && rest >= ptMinBlockSize || b.seg != nil && rest >= gmChunk {
		front := p.split(b, rsize)
		p.insertFree(b)
		b = front
	}
	p.allocate(b)
	if b.seg != nil && b.seg.away > 0 {
		if err := p.placeHome(b.seg, p.pageOf(b), p.pageOf(b)+int(b.size/gmChunk)); err != nil {
			return Block{}, err
		}
	}
	p.active[b.addr] = b
	return Block{Addr: b.addr, Size: b.size}, nil
}

// pageOf returns the index of b's first page in its segment.
func (p *GMLake) pageOf(b *gmBlock) int { return int((b.addr - b.seg.base) / gmChunk) }

// takeFree takes the best-fitting free block of at least size bytes on
// stream out of pool: the smallest, the lowest address among equals; nil
// if there is none.
func (p *GMLake) takeFree(pool *gmSet[*gmBlock], stream, size uint64) *gmBlock {
	i := pool.search(gmKey{stream, size, 0})
	if i == len(pool.keys) || pool.keys[i].stream != stream {
		return nil
	}
	b := pool.vals[i]
	p.removeFree(b)
	return b
}

func (p *GMLake) poolOf(b *gmBlock) *gmSet[*gmBlock] {
	if b.seg == nil {
		return &p.small
	}
	return &p.large
}

// insertFree puts the free block b into its pool.
func (p *GMLake) insertFree(b *gmBlock) {
	p.poolOf(b).insert(gmKey{b.stream, b.size, b.addr}, b)
	p.bySize.insert(gmKey{0, b.size, b.addr}, b)
	p.freeBytes += b.size
}

// removeFree takes the free block b out of its pool.
func (p *GMLake) removeFree(b *gmBlock) {
	p.poolOf(b).remove(gmKey{b.stream, b.size, b.addr})
	p.bySize.remove(gmKey{0, b.size, b.addr})
	p.freeBytes -= b.size
}

// split cuts the first size bytes of b off into a block of their own,
// which it returns; b keeps the rest. Neither is in a pool.
func (p *GMLake) split(b *gmBlock, size uint64) *gmBlock {
	front := &gmBlock{addr: b.addr, size: size, stream: b.stream, seg: b.seg, prev: b.prev, next: b}
	if front.prev != nil {
		front.prev.next = front
	}
	if b.seg != nil && b.seg.first == b {
		b.seg.first = front
	}
	b.prev = front
	b.addr += size
	b.size -= size
	return front
}

// allocate marks the block b, out of its pool, allocated: its pages are
// in use.
func (p *GMLake) allocate(b *gmBlock) {
	b.allocated = true
	p.pagesInUse(b, 1)
}

// newSegment allocates a new segment of segSize bytes for a block on
// stream: from the device in the small pool; in the large pool an address
// range with every page mapped. Past the capacity it asks the device
// nothing. It returns the segment's block, out of the pool; nil and no
// error when refused.
func (p *GMLake) newSegment(small bool, stream, segSize uint64) (*gmBlock, error) {
	if p.capacity > 0 && (segSize > p.capacity || p.reserved > p.capacity-segSize) {
		return nil, nil
	}
	if small {
		addr, err := p.dev.Alloc(segSize)
		if err != nil {
			if errors.Is(err, ErrOutOfMemory) {
				return nil, nil
			}
			return nil, fmt.Errorf("gmlake: device alloc of %d bytes: %w", segSize, err)
		}
		p.reserved += segSize
		return &gmBlock{addr: addr, size: segSize, stream: stream}, nil
	}
	base, err := p.mapper.Reserve(segSize)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("gmlake: reserving %d bytes of address space: %w", segSize, err)
	}
	if err := p.mapper.Map(base, segSize); err != nil {
		if rerr := p.mapper.Release(base); rerr != nil {
			return nil, fmt.Errorf("gmlake: giving back the address range at %#x: %w", base, rerr)
		}
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("gmlake: mapping %d bytes at %#x: %w", segSize, base, err)
	}
	p.reserved += segSize
	seg := &gmSeg{base: base, size: segSize}
	b := &gmBlock{addr: base, size: segSize, stream: stream, seg: seg}
	seg.first = b
	return b, nil
}

// Free takes back the block at addr, an original block or a stitched one,
// as GMLake's free (update_block, free_block) does: an original block
// merges with its free neighbours and returns to the free blocks of the
// stream it was allocated on; a stitched block gives its pages back to the
// blocks that hold them and stays cached (or is collected, if a segment
// under it was given back meanwhile). It returns an error if addr is not
// an allocated block.
func (p *GMLake) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil // the null pointer of a 0-byte malloc
	}
	if st := p.stitched[addr]; st != nil {
		delete(p.stitched, addr)
		return p.freeStitch(st)
	}
	b := p.active[addr]
	if b == nil {
		return fmt.Errorf("gmlake: free of %#x on stream %#x: not an allocated block", addr, stream)
	}
	delete(p.active, addr)
	p.freeBlock(b)
	return nil
}

// freeBlock is free_block: the allocated block b is free again, merged
// with its free neighbours, and back in its pool.
func (p *GMLake) freeBlock(b *gmBlock) {
	b.allocated = false
	p.pagesInUse(b, -1)
	for _, n := range [2]*gmBlock{b.prev, b.next} {
		if n == nil || n.allocated {
			continue
		}
		p.removeFree(n)
		if n == b.prev {
			b.addr = n.addr
			b.prev = n.prev
			if b.prev != nil {
				b.prev.next = b
			}
			if b.seg != nil && b.seg.first == n {
				b.seg.first = b
			}
		} else {
			b.next = n.next
			if b.next != nil {
				b.next.prev = b
			}
		}
		b.size += n.size
	}
	p.insertFree(b)
}

// releaseCached is release_cached_blocks: every free block that is a
// whole segment is given back, the large pool first, each in (stream,
// size, address) order; the stitched blocks over a large one's pages are
// collected (or, in use, lose those pages and are collected when freed).
func (p *GMLake) releaseCached() error {
	var segs []*gmBlock
	for _, b := range p.large.vals {
		if b.prev == nil && b.next == nil {
			segs = append(segs, b)
			b.seg.dropping = true
		}
	}
	for _, b := range segs {
		if err := p.releaseSegment(b); err != nil {
			return err
		}
	}
	var small []*gmBlock
	for _, b := range p.small.vals {
		if b.prev == nil && b.next == nil {
			small = append(small, b)
		}
	}
	for _, b := range small {
		if err := p.dev.Free(b.addr); err != nil {
			return fmt.Errorf("gmlake: device free of the segment at %#x: %w", b.addr, err)
		}
		p.removeFree(b)
		p.reserved -= b.size
	}
	return nil
}

// EmptyCache frees every cached segment that is not split and then
// collects every stitched block not in use, as GMLake's emptyCache does.
// It returns the device's error for a call that fails.
func (p *GMLake) EmptyCache() error {
	if err := p.releaseCached(); err != nil {
		return err
	}
	return p.collect()
}

// FreeSpace returns the bytes of free blocks and the size in bytes of the
// largest free run of virtual memory: the largest free block, or the
// largest cached stitched block whose pages are all free, if larger.
func (p *GMLake) FreeSpace() (total, largest uint64) {
	if n := len(p.bySize.keys); n > 0 {
		largest = p.bySize.keys[n-1].size
	}
	if n := len(p.reusableBySize.keys); n > 0 {
		largest = max(largest, p.reusableBySize.keys[n-1].size)
	}
	return p.freeBytes, largest
}

// Retries returns the number of segment allocations retried after freeing
// the cached segments (num_alloc_retries).
func (p *GMLake) Retries() int64 { return p.retries }

// gmKey orders GMLake's sets as PyTorch's BlockComparator does: by stream,
// size, then address.
type gmKey struct{ stream, size, addr uint64 }

func (a gmKey) less(b gmKey) bool {
	if a.stream != b.stream {
		return a.stream < b.stream
	}
	if a.size != b.size {
		return a.size < b.size
	}
	return a.addr < b.addr
}

// gmSet is a set of values under distinct keys, in key order: sorted
// slices (the free blocks of a real trace number in the hundreds).
type gmSet[T any] struct {
	keys []gmKey
	vals []T
}

// search returns the index of the first key not below k.
func (s *gmSet[T]) search(k gmKey) int {
	return sort.Search(len(s.keys), func(i int) bool { return !s.keys[i].less(k) })
}

func (s *gmSet[T]) insert(k gmKey, v T) {
	i := s.search(k)
	var zero T
	s.keys = append(s.keys, gmKey{})
	s.vals = append(s.vals, zero)
	copy(s.keys[i+1:], s.keys[i:])
	copy(s.vals[i+1:], s.vals[i:])
	s.keys[i], s.vals[i] = k, v
}

// remove deletes the value under k, which must be there.
func (s *gmSet[T]) remove(k gmKey) {
	i := s.search(k)
	if i == len(s.keys) || s.keys[i] != k {
		panic(fmt.Sprintf("policies: gmlake: no %+v in the set", k))
	}
	var zero T
	copy(s.keys[i:], s.keys[i+1:])
	copy(s.vals[i:], s.vals[i+1:])
	s.keys = s.keys[:len(s.keys)-1]
	s.vals[len(s.vals)-1] = zero
	s.vals = s.vals[:len(s.vals)-1]
}
