package policies

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// This file simulates PyTorch's CUDA caching allocator, following
// pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator:
// malloc, get_free_block, garbage_collect_cached_blocks, alloc_block,
// release_available_cached_blocks, release_cached_blocks, release_block,
// free_block, should_split, round_size, get_allocation_size), as PyTorch
// 2.11 runs it. Expandable segments are in pytorch_expandable.go, private
// pools in pytorch_pools.go, the settings in pytorch_conf.go, following a
// recording in pytorch_follow.go.

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

// pytorchConfig holds the allocator settings of PYTORCH_CUDA_ALLOC_CONF
// that change placement (see pytorch_conf.go for how they are read).
type pytorchConfig struct {
	// maxSplitSize is max_split_size_mb in bytes: blocks of at least this
	// size are never split, and requests below it never take them.
	// math.MaxUint64 (the default) means unlimited.
	maxSplitSize uint64
	// maxNonSplitRounding is how much larger than a request of at least
	// maxSplitSize a cached block may be and still be taken
	// (max_non_split_rounding_mb; the default is 20 MiB).
	maxNonSplitRounding uint64
	// roundupDivisions are roundup_power2_divisions by power-of-two
	// interval: entry 0 for requests below 2 MiB, entry k for
	// [2^(20+k), 2^(21+k)), the last for everything above. 0 or 1 means
	// plain 512-byte rounding.
	roundupDivisions [ptRoundupIntervals]uint64
	// garbageCollectionThreshold is garbage_collection_threshold (0 = off;
	// it acts only under a capacity, PyTorch's memory fraction).
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
// (c10/cuda/CUDACachingAllocator.cpp). With its default settings: requests
// rounded up to 512 bytes; a small pool (requests up to 1 MiB, carved out of
// 2 MiB segments) and a large pool (20 MiB segments for requests under
// 10 MiB, else the request rounded up to 2 MiB); free blocks kept per pool
// in (stream, size, address) order and taken best fit, ties to the lowest
// address, never across streams; a taken block split when the remainder is
// at least 512 bytes (small pool) or more than 1 MiB (large pool); freed
// blocks merged with their free neighbours. When a new segment would pass
// the device's capacity (PyTorch's per-process memory fraction) or the
// device refuses it, every cached segment that is not split is freed and
// the device allocation is tried once more (a retry), then the malloc fails
// (an OOM).
//
// Its settings are those of PYTORCH_CUDA_ALLOC_CONF (pytorch_conf.go):
// max_split_size_mb (blocks that large are never split, smaller requests
// never take them, larger ones only within max_non_split_rounding_mb, and
// before a retry only enough of them are freed), roundup_power2_divisions,
// garbage_collection_threshold (under a capacity, the oldest unused cached
// segments are freed before reserved memory passes the threshold), and
// expandable_segments (pytorch_expandable.go: one growing range per stream
// and pool, pages of 2 MiB or 20 MiB mapped on demand, which needs a device
// that is a Mapper).
//
// Private pools (pytorch_pools.go, a Pooler): the mallocs of a CUDA graph
// capture or of a MemPool go to their pool's own small and large pools,
// with segments of their own, and a pool's segments are freed only after
// ReleasePool, at the next release.
//
// Blocks freed on another stream than their own return to their own
// stream's free blocks. A free that completes late (FreeLate, for a block
// used on other streams) is taken back at the next malloc, or at the
// synchronization of its retry when that malloc retries (pytorch_follow.go).
type PyTorch struct {
	// segSeen is set by a segment allocation or map of the recording
	// (Follow), until the malloc it was for; inferred counts the mallocs
	// that the recording served otherwise than the simulation, and
	// lastInferred says what the last was (Inferred).
	segSeen      bool
	inferred     int64
	lastInferred string

	// restoreHint is the recorded address of the next malloc, for a
	// checkpoint restore (FollowTie), while restoreHinted.
	restoreHint   uint64
	restoreHinted bool

	dev    Device
	mapper Mapper // dev as a Mapper, nil if it is none
	// capacity is PyTorch's allowed_memory_maximum: the capacity of the
	// device if it is a Capacitor, 0 for none.
	capacity uint64
	cfg      pytorchConfig
	roundup  bool // some roundup_power2_divisions above 1: roundSize's slow path

	large, small ptPool
	active       ptActive  // allocated blocks by address
	handles      ptHandles // allocated blocks by handle (MallocHandle)
	tops         ptTops    // the sets of free blocks of every pool, by their largest

	// Private pools (pytorch_pools.go): by id, and those released, in the
	// order of their release (graph_pools, graph_pools_freeable).
	pools    map[uint32]*ptPrivate
	freeable []*ptPrivate

	reserved  uint64 // bytes in live segments and mapped pages (total_allocated_memory)
	freeBytes uint64 // bytes in cached free blocks
	retries   int64

	segments []*ptSegment // live expandable segments

	// Following a recording (pytorch_follow.go).
	staged       []*ptBlock // late frees not taken back yet
	pending      []*ptBlock // late frees taken back at the malloc's synchronization
	releasesSeen int        // segment frees and unmaps the source made since the last call
	explicitSeen bool       // one of them was labelled trace.ReleaseByEmptyCache

	spare   *ptBlock   // recycled blocks, linked through next
	scratch []*ptBlock // reused by release
	unmaps  []*ptBlock // reused by release

	reach ptReach // how far the replay came to where two settings act (SameReplay)
}

// ptReach is what SameReplay needs to know of a replay: the sizes that a
// max_split_size_mb would have been compared with and the reserved bytes
// where a garbage_collection_threshold would have been.
type ptReach struct {
	// split is the largest rounded request, free block found for one and
	// largest free block where oversize blocks would have been freed.
	split uint64
	// gc is the most reserved bytes at a point where a garbage collection
	// would have run, under a capacity.
	gc uint64
}

var (
	_ Policy     = (*PyTorch)(nil)
	_ Releaser   = (*PyTorch)(nil)
	_ FreeSpacer = (*PyTorch)(nil)
	_ Counter    = (*PyTorch)(nil)
	_ Follower   = (*PyTorch)(nil)
	_ Inferrer   = (*PyTorch)(nil)
	_ Pooler     = (*PyTorch)(nil)
	_ Handler    = (*PyTorch)(nil)
)

func init() {
	register(Info{
		Name:   "pytorch",
		Design: "PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), every placement setting",
		Settings: []Setting{
			{Key: ptKeyConf, Default: "", Doc: "a whole PYTORCH_CUDA_ALLOC_CONF string, read before the single keys (as recorded: the snapshot's settings)"},
			{Key: ptKeyMaxSplit, Default: "unlimited", Derived: true, Doc: "blocks of at least this many MiB are never split and smaller requests never take them; at least 20"},
			{Key: ptKeyMaxNonSplitRound, Default: "20", Doc: "how many MiB larger than a request of at least max_split_size_mb a cached block taken for it may be; at least 20"},
			{Key: ptKeyRoundup, Default: "off", Derived: true, Doc: "requests are rounded up to one of this many steps of their power-of-two interval: a power of two, or [MiB:divisions,...,>:divisions]; 1 is off"},
			{Key: ptKeyGCThreshold, Default: "off", Derived: true, Doc: "under a capacity, the oldest unused cached segments are freed before reserved bytes pass this fraction of it, in (0.0, 1.0)"},
			{Key: ptKeyExpandableSegments, Default: "False", Doc: "True maps pages of one growing range per stream and pool on demand; it needs a device that is a Mapper"},
		},
		Abilities: Abilities{MapperSetting: ptKeyExpandableSegments}, // the rest derived by Register
	}, func(dev Device, s Settings) (Policy, error) { return NewPyTorch(dev, s) })
	registerRecorded("pytorch", pytorchRecorded)
}

// NewPyTorch returns the PyTorch caching allocator on dev with settings s:
// conf (a whole PYTORCH_CUDA_ALLOC_CONF string) and the single keys
// max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions,
// garbage_collection_threshold and expandable_segments, with values written
// as in PYTORCH_CUDA_ALLOC_CONF (a single key is read over conf). It returns
// an error naming the key for an unknown key or a value PyTorch would
// refuse, and for expandable_segments on a device that is not a Mapper.
func NewPyTorch(dev Device, s Settings) (*PyTorch, error) {
	cfg, err := pytorchSettings(s)
	if err != nil {
		return nil, err
	}
	p := newPyTorch(dev, cfg)
	if cfg.expandableSegments && p.mapper == nil {
		return nil, fmt.Errorf("policy pytorch: setting expandable_segments: the device cannot map pages (it is no policies.Mapper)")
	}
	return p, nil
}

func newPyTorch(dev Device, cfg pytorchConfig) *PyTorch {
	p := &PyTorch{dev: dev, cfg: cfg}
	for _, d := range cfg.roundupDivisions {
		p.roundup = p.roundup || d > 1
	}
	p.mapper, _ = dev.(Mapper)
	if c, ok := dev.(Capacitor); ok {
		p.capacity = c.Capacity()
	}
	p.small.small = true
	p.small.page = ptSmallBuffer
	p.large.page = ptLargeBuffer
	return p
}

// Name returns "pytorch".
func (p *PyTorch) Name() string { return "pytorch" }

// ptBlock is a block of a segment: allocated, free and then in its pool's
// free blocks of its stream (a ptFree), or (in an expandable segment)
// unmapped and then in its pool's unmapped list. The blocks of one segment
// form an address-ordered list through prev and next; a segment that is
// one block has neither.
type ptBlock struct {
	addr, size uint64
	stream     uint64
	pool       *ptPool
	prev, next *ptBlock
	seg        *ptSegment // the expandable segment, nil for a cudaMalloc one
	gcBase     int64      // pool.gcCalls when it became free (gc_count_base)
	// While free: the free blocks it is in (its pool's, of its stream),
	// its neighbours in its bin there, and the bin.
	set              *ptFree
	binPrev, binNext *ptBlock
	bin              uint16
	allocated        bool // also while a late free is not taken back
	unmapped         bool
	indexed          bool // while free: its bin is indexed (ptFree.long)
}

func (b *ptBlock) isSplit() bool { return b.prev != nil || b.next != nil }

// ptPool is a pool of free blocks (BlockPool): per stream, a set ordered
// by (size, address); the streams found by a map, and listed in ascending
// order where the pool is walked (ordered).
type ptPool struct {
	small bool
	owner *ptPrivate // the private pool it is part of, nil for a default one
	page  uint64     // page size of its expandable segments
	// streams are the free blocks of each stream, in ascending order of
	// stream up to sorted and in the order of their creation after it
	// (ordered sorts them); byStream finds them.
	streams  []*ptStreamBlocks
	sorted   int
	byStream map[uint64]*ptStreamBlocks
	last     *ptStreamBlocks // the last looked up, or nil
	// unmapped are the unmapped blocks of expandable segments, by
	// (stream, address).
	unmapped []*ptBlock
	// gcCalls counts searches while garbage collection is on
	// (get_free_blocks_call_count), the clock of blocks' ages.
	gcCalls int64
}

type ptStreamBlocks struct {
	stream uint64
	free   ptFree
}

// blocks returns the free blocks of stream, created if absent when create
// is set, else nil if absent.
func (pl *ptPool) blocks(stream uint64, create bool) *ptStreamBlocks {
	if pl.last != nil && pl.last.stream == stream {
		return pl.last // small enough to inline: the common case
	}
	return pl.lookup(stream, create)
}

// lookup is blocks past its last lookup: a map's (a scan of the streams
// made mallocs on N streams cost N^2, and so did the moves of a sorted
// list's insertions).
func (pl *ptPool) lookup(stream uint64, create bool) *ptStreamBlocks {
	if sb := pl.byStream[stream]; sb != nil {
		pl.last = sb
		return sb
	}
	if !create {
		return nil
	}
	if pl.byStream == nil {
		pl.byStream = map[uint64]*ptStreamBlocks{}
	}
	sb := &ptStreamBlocks{stream: stream}
	pl.byStream[stream] = sb
	pl.streams = append(pl.streams, sb)
	pl.last = sb
	return sb
}

// ordered returns the free blocks of each stream of pl, in ascending order
// of stream: the streams created since the last call are sorted and merged
// in, in O(streams + new log new).
func (pl *ptPool) ordered() []*ptStreamBlocks {
	s := pl.streams
	if pl.sorted == len(s) {
		return s
	}
	byStream := func(a, b *ptStreamBlocks) int { return cmp.Compare(a.stream, b.stream) }
	tail := s[pl.sorted:]
	slices.SortFunc(tail, byStream)
	if pl.sorted > 0 && s[pl.sorted-1].stream > tail[0].stream {
		merged := make([]*ptStreamBlocks, 0, cap(s))
		a, b := s[:pl.sorted], tail
		for len(a) > 0 && len(b) > 0 {
			if a[0].stream < b[0].stream {
				merged, a = append(merged, a[0]), a[1:]
			} else {
				merged, b = append(merged, b[0]), b[1:]
			}
		}
		merged = append(append(merged, a...), b...)
		pl.streams = merged
	}
	pl.sorted = len(pl.streams)
	return pl.streams
}

func (p *PyTorch) newBlock() *ptBlock {
	b := p.spare
	if b == nil {
		return &ptBlock{}
	}
	p.spare = b.next
	b.next = nil // recycle left the rest zero
	return b
}

func (p *PyTorch) recycle(b *ptBlock) {
	*b = ptBlock{next: p.spare}
	p.spare = b
}

// insertFree puts the free block b into its pool (insert_into_blocks).
func (p *PyTorch) insertFree(b *ptBlock) {
	b.gcBase = b.pool.gcCalls
	t := &b.pool.blocks(b.stream, true).free
	t.insert(b)
	p.tops.touch(t)
	p.freeBytes += b.size
}

// removeFree takes the free block b out of its pool.
func (p *PyTorch) removeFree(b *ptBlock) {
	t := b.set
	t.delete(b)
	p.tops.touch(t)
	p.freeBytes -= b.size
}

// roundSize is round_size: the block size for a request of size bytes.
func (p *PyTorch) roundSize(size uint64) uint64 {
	if size < ptMinBlockSize {
		return ptMinBlockSize
	}
	if p.roundup {
		return p.roundSizeDivided(size)
	}
	return (size + ptMinBlockSize - 1) &^ (ptMinBlockSize - 1)
}

// roundSizeDivided is roundSize where roundup_power2_divisions is set.
func (p *PyTorch) roundSizeDivided(size uint64) uint64 {
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

// gcActive reports whether garbage collection is on: a threshold, under a
// capacity.
func (p *PyTorch) gcActive() bool {
	return p.capacity > 0 && p.cfg.garbageCollectionThreshold > 0
}

// gcPoint is gcActive where a garbage collection would run: it also notes
// the reserved bytes there, for SameReplay.
func (p *PyTorch) gcPoint() bool {
	if p.capacity > 0 {
		p.reach.gc = max(p.reach.gc, p.reserved)
	}
	return p.gcActive()
}

// Malloc places a request of size bytes on stream, as
// DeviceCachingAllocator::malloc does: the best-fitting cached block of the
// pool on stream, else (after garbage collection, when on) a new segment
// from the device, else after freeing enough oversize cached segments (with
// max_split_size) a new segment, else after freeing every cached segment
// that is not split a new segment (a retry). The Block's Size is the
// block's size as PyTorch counts it in allocated_bytes (the rounded request,
// or more when the remainder was too small to split off). It returns an
// error wrapping ErrOutOfMemory when the retry fails too, and any other
// error of the device as it is.
func (p *PyTorch) Malloc(size, stream uint64) (Block, error) {
	return p.malloc(size, stream, nil)
}

// malloc is Malloc into the private pool priv, or the default pools when
// priv is nil.
func (p *PyTorch) malloc(size, stream uint64, priv *ptPrivate) (Block, error) {
	b, err := p.place(size, stream, priv)
	if b == nil {
		return Block{}, err
	}
	p.active.put(b.addr, b)
	return Block{Addr: b.addr, Size: b.size}, nil
}

// MallocHandle is Malloc that also returns the block's handle, for its
// FreeHandle (Handler): 0 for the null pointer of a 0-byte malloc.
func (p *PyTorch) MallocHandle(size, stream uint64) (Block, uint64, error) {
	b, err := p.place(size, stream, nil)
	if b == nil {
		return Block{}, 0, err
	}
	return Block{Addr: b.addr, Size: b.size}, p.handles.put(b), nil
}

// FreeHandle is Free, or with late FreeLate, of the block that MallocHandle
// returned with handle h; handle 0 (a 0-byte malloc's) frees nothing. It
// returns an error if h is no allocated block's.
func (p *PyTorch) FreeHandle(h, stream uint64, late bool) error {
	if h == 0 {
		return nil
	}
	if p.releasesSeen > 0 || !late && len(p.staged) > 0 {
		// As Free and FreeLate do.
		if err := p.settle(); err != nil {
			return err
		}
	}
	b := p.handles.take(h)
	if b == nil {
		return fmt.Errorf("pytorch: free of handle %d on stream %#x: not an allocated block", h, stream)
	}
	if late {
		p.staged = append(p.staged, b) // allocated until taken back
		return nil
	}
	p.freeBlock(b)
	return nil
}

// place is malloc's placement: the block allocated for a request of size
// bytes, nil for 0 bytes or an error.
func (p *PyTorch) place(size, stream uint64, priv *ptPrivate) (*ptBlock, error) {
	if size == 0 {
		// PyTorch hands out a null pointer for 0 bytes and allocates
		// nothing (NativeCachingAllocator::allocate).
		return nil, nil
	}
	if size > maxRequest {
		// No device holds it (and its rounding would wrap around).
		return nil, errRequestTooLarge(p.Name(), size)
	}
	rsize := p.roundSize(size)
	p.reach.split = max(p.reach.split, rsize)
	pool := &p.large
	if priv != nil {
		pool = &priv.large
	}
	if rsize <= ptSmallSize {
		pool = &p.small
		if priv != nil {
			pool = &priv.small
		}
	}
	segSize := allocationSize(rsize)
	if len(p.staged) > 0 || p.releasesSeen > 0 {
		if err := p.processEvents(pool, stream, rsize, segSize); err != nil {
			return nil, err
		}
	}
	b := p.getFreeBlock(pool, stream, rsize)
	if p.segSeen {
		p.segSeen = false
		if b != nil {
			p.noteCached(b)
		}
	}
	var err error
	if b == nil {
		b, err = p.allocate(pool, stream, rsize, segSize)
	}
	if len(p.pending) > 0 {
		// Deferred to a synchronization the malloc did not reach.
		p.completePending()
	}
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("pytorch: malloc of %d bytes on stream %#x: segment of %d bytes with %d reserved, %d cached free: %w",
			size, stream, segSize, p.reserved, p.freeBytes, ErrOutOfMemory)
	}
	if p.shouldSplit(b, rsize) {
		b = p.splitOff(b, rsize)
	}
	b.allocated = true
	return b, nil
}

// splitOff splits the free block b, out of its pool, into a block of its
// first size bytes, which it returns, and the rest, which stays b and goes
// back to the pool (the split of alloc_found_block).
func (p *PyTorch) splitOff(b *ptBlock, size uint64) *ptBlock {
	front := p.split(b, size)
	p.insertFree(b)
	return front
}

// split cuts the first size bytes of b off into a block of their own,
// which it returns; b keeps the rest.
func (p *PyTorch) split(b *ptBlock, size uint64) *ptBlock {
	// Field by field into the zeroed block: a composite literal is built
	// on the stack and copied, and that copy's wide loads of the narrow
	// stores just made stall (no store forwarding).
	front := p.newBlock()
	front.addr, front.size, front.stream, front.pool, front.seg = b.addr, size, b.stream, b.pool, b.seg
	front.prev, front.next = b.prev, b
	if front.prev != nil {
		front.prev.next = front
	}
	b.prev = front
	b.addr += size
	b.size -= size
	return front
}

// allocate is the allocation path of malloc where getFreeBlock found no
// cached block: it returns a new block (out of the free blocks) of at
// least rsize bytes, nil and no error for an OOM.
func (p *PyTorch) allocate(pool *ptPool, stream, rsize, segSize uint64) (*ptBlock, error) {
	if p.gcPoint() {
		if err := p.releaseBlocks(p.gcPlan()); err != nil {
			return nil, err
		}
	}
	b, err := p.allocBlock(pool, stream, rsize, segSize)
	if b != nil || err != nil {
		return b, err
	}
	blocks, ok := p.releaseAvailablePlan(pool, stream, rsize, nil)
	if err := p.releaseBlocks(blocks); err != nil {
		return nil, err
	}
	if ok {
		if b, err = p.allocBlock(pool, stream, rsize, segSize); b != nil || err != nil {
			return b, err
		}
	}
	if pool.owner != nil {
		// A capture (or a MemPool's context) is under way: malloc frees
		// nothing more and does not retry.
		return nil, nil
	}
	if err := p.releaseCachedBlocks(); err != nil {
		return nil, err
	}
	p.retries++
	return p.allocBlock(pool, stream, rsize, segSize)
}

// getFreeBlock is get_free_block: it takes the block findFreeBlock finds
// out of pool, and counts the search for garbage collection.
func (p *PyTorch) getFreeBlock(pool *ptPool, stream, size uint64) *ptBlock {
	if p.gcActive() {
		pool.gcCalls++
	}
	b, sb := p.findFree(pool, stream, size)
	if b == nil {
		return nil
	}
	sb.free.delete(b)
	p.tops.touch(&sb.free)
	if len(p.pending) == 0 && p.shouldSplit(b, size) {
		// Split here, as malloc would right after (no late free to take
		// back in between).
		front := p.split(b, size)
		b.gcBase = pool.gcCalls
		sb.free.insert(b)
		p.freeBytes -= size
		return front
	}
	p.freeBytes -= b.size
	return b
}

// findFreeBlock returns the smallest free block of at least size bytes on
// stream in pool (the lowest address among equals), or nil, leaving it
// there. In an expandable segment a block's size, for best fit, counts the
// unmapped space after it. With max_split_size, a smaller request never
// takes a block of that size, a larger one only a block less than
// max_non_split_rounding larger than itself.
func (p *PyTorch) findFreeBlock(pool *ptPool, stream, size uint64) *ptBlock {
	b, _ := p.findFree(pool, stream, size)
	return b
}

// findFree is findFreeBlock that also returns the free blocks of stream
// in pool that it searched.
func (p *PyTorch) findFree(pool *ptPool, stream, size uint64) (*ptBlock, *ptStreamBlocks) {
	sb := pool.blocks(stream, false)
	if sb == nil {
		return nil, nil
	}
	b := sb.free.lowerBound(size)
	if b == nil {
		return nil, nil
	}
	if b.seg != nil {
		if p.cfg.expandableSegments {
			for b.seg != nil {
				next := sb.free.successor(b)
				if next == nil || expandableSize(next) >= expandableSize(b) {
					break
				}
				b = next
			}
		} else {
			// Expandable segments turned off: only the others.
			for b != nil && b.seg != nil {
				b = sb.free.successor(b)
			}
			if b == nil {
				return nil, nil
			}
		}
	}
	p.reach.split = max(p.reach.split, b.size)
	maxSplit := p.cfg.maxSplitSize
	if size < maxSplit && b.size >= maxSplit {
		return nil, nil // never hand an oversize block to a smaller request
	}
	if size >= maxSplit && b.size >= size+p.cfg.maxNonSplitRounding {
		return nil, nil
	}
	return b, sb
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

// fits reports whether a new segment of size bytes stays within the
// capacity.
func (p *PyTorch) fits(reserved, size uint64) bool {
	return p.capacity == 0 || size <= p.capacity && reserved <= p.capacity-size
}

// allocBlock is alloc_block: a new segment of segSize bytes for a block of
// rsize bytes of pool on stream, from the device or (with expandable
// segments) by mapping pages. Past the capacity it asks the device
// nothing. It returns nil and no error when refused, nil and the error for
// any other failure.
func (p *PyTorch) allocBlock(pool *ptPool, stream, rsize, segSize uint64) (*ptBlock, error) {
	if !p.fits(p.reserved, segSize) {
		return nil, nil
	}
	if p.cfg.expandableSegments {
		return p.allocExpandable(pool, stream, rsize)
	}
	addr, err := p.dev.Alloc(segSize)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("pytorch: device alloc of %d bytes: %w", segSize, err)
	}
	p.reserved += segSize
	if pool.owner != nil {
		pool.owner.devAllocs++
	}
	b := p.newBlock()
	*b = ptBlock{addr: addr, size: segSize, stream: stream, pool: pool}
	return b, nil
}

// gcPlan is the choice of garbage_collect_cached_blocks: the cached large
// segments (unsplit) to free, in order, when reserved bytes pass the
// threshold; those at least as old as the average first, round after
// round, until enough is freed.
func (p *PyTorch) gcPlan() []*ptBlock {
	threshold := uint64(p.cfg.garbageCollectionThreshold * float64(p.capacity))
	if p.reserved <= threshold {
		return nil
	}
	target := p.reserved - threshold
	cands := p.scratch[:0]
	for _, sb := range p.large.ordered() {
		cands = sb.free.appendIf(cands, func(b *ptBlock) bool { return !b.isSplit() && b.seg == nil })
	}
	p.scratch = cands
	if len(cands) == 0 {
		return nil
	}
	age := func(b *ptBlock) float64 { return float64(uint64(int32(p.large.gcCalls - b.gcBase))) }
	var total float64
	for _, b := range cands {
		total += age(b)
	}
	n := len(cands)
	var reclaimed uint64
	var plan []*ptBlock // in the order of release: round after round
	for freed := true; reclaimed < target && freed && n > 0; {
		threshold := total / float64(n)
		freed = false
		for k, b := range cands {
			if b == nil || age(b) < threshold {
				continue
			}
			cands[k], freed = nil, true
			plan = append(plan, b)
			reclaimed += b.size
			total -= age(b)
			n--
		}
	}
	clear(cands)
	return plan
}

// releaseAvailablePlan is the choice of release_available_cached_blocks:
// with a max_split_size, the oversize cached segments on stream in pool to
// free before retrying the device (leaving out those in gone): the
// smallest one of at least max(size, max_split_size) bytes, else the
// largest ones down while they are oversize, until that much. ok reports
// whether they free enough (PyTorch frees them even when they do not).
func (p *PyTorch) releaseAvailablePlan(pool *ptPool, stream, size uint64, gone []*ptBlock) (plan []*ptBlock, ok bool) {
	sb := pool.blocks(stream, false)
	if sb != nil {
		if b := sb.free.max(); b != nil {
			p.reach.split = max(p.reach.split, b.size)
		}
	}
	if p.cfg.maxSplitSize == math.MaxUint64 || sb == nil {
		return nil, false
	}
	key := max(size, p.cfg.maxSplitSize)
	isGone := func(b *ptBlock) bool {
		for _, g := range gone {
			if g == b {
				return true
			}
		}
		return false
	}
	b := sb.free.lowerBound(key)
	for b != nil && isGone(b) {
		b = sb.free.successor(b)
	}
	if b != nil {
		if b.seg != nil {
			return nil, false
		}
		return []*ptBlock{b}, true
	}
	over := sb.free.appendIf(nil, func(b *ptBlock) bool { return b.size >= p.cfg.maxSplitSize && b.seg == nil && !isGone(b) })
	var freed uint64
	for k := len(over) - 1; k >= 0 && freed < key; k-- {
		freed += over[k].size
		plan = append(plan, over[k])
	}
	return plan, freed >= key
}

// releaseBlocks frees the cached segments in list (release_block each).
func (p *PyTorch) releaseBlocks(list []*ptBlock) error {
	for _, b := range list {
		if err := p.releaseBlock(b); err != nil {
			return err
		}
	}
	return nil
}

// releaseCachedBlocks is release_cached_blocks: it takes back the late
// frees waiting for a synchronization, then frees every cached segment
// that is not split and unmaps the free pages of expandable segments, the
// large pool first, each in (stream, size, address) order.
func (p *PyTorch) releaseCachedBlocks() error {
	p.completePending()
	if err := p.releasePools(&p.large, &p.small); err != nil {
		return err
	}
	return p.releaseFreeable()
}

// releasePools frees the cached segments that are not split and unmaps the
// free pages of expandable segments of each pool, in turn.
func (p *PyTorch) releasePools(pools ...*ptPool) error {
	for _, pool := range pools {
		list := p.scratch[:0]
		for _, sb := range pool.ordered() {
			list = sb.free.appendIf(list, func(b *ptBlock) bool { return b.seg != nil || !b.isSplit() })
		}
		unmaps := p.unmaps[:0]
		var err error
		for k, b := range list {
			list[k] = nil
			if err == nil {
				if b.seg != nil {
					unmaps = append(unmaps, b)
				} else {
					err = p.releaseBlock(b)
				}
			}
		}
		p.scratch = list[:0]
		for k, b := range unmaps {
			unmaps[k] = nil
			if err == nil {
				err = p.unmapBlock(b)
			}
		}
		p.unmaps = unmaps[:0]
		if err != nil {
			return err
		}
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
	if b.pool.owner != nil {
		b.pool.owner.devAllocs--
	}
	p.recycle(b)
	return nil
}

// Free takes back the block at addr, as free_block does: it merges with
// its free neighbours and returns to the free blocks of the stream it was
// allocated on (stream, the stream of the free, plays no part). It returns
// an error if addr is not an allocated block.
func (p *PyTorch) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil // the null pointer of a 0-byte malloc
	}
	if len(p.staged) > 0 || p.releasesSeen > 0 {
		if err := p.settle(); err != nil {
			return err
		}
	}
	b := p.active.take(addr)
	if b == nil {
		return fmt.Errorf("pytorch: free of %#x on stream %#x: not an allocated block", addr, stream)
	}
	p.freeBlock(b)
	return nil
}

// freeBlock is free_block: the block b, no longer allocated, merges with
// its free neighbours and goes back to its pool.
func (p *PyTorch) freeBlock(b *ptBlock) {
	b.allocated = false
	p.tryMerge(b, b.prev)
	p.tryMerge(b, b.next)
	p.insertFree(b)
}

// tryMerge is try_merge_blocks: src, a neighbour of dst, joins dst if it
// is free (or unmapped) as dst is.
func (p *PyTorch) tryMerge(dst, src *ptBlock) {
	if src != nil && !src.allocated && src.unmapped == dst.unmapped {
		p.merge(dst, src) // the test small enough to inline
	}
}

// merge is tryMerge where src joins dst.
func (p *PyTorch) merge(dst, src *ptBlock) {
	if src.unmapped {
		src.pool.removeUnmapped(src)
	} else {
		p.removeFree(src)
	}
	p.join(dst, src)
}

// join merges src, a neighbour of dst out of its pool, into dst.
func (p *PyTorch) join(dst, src *ptBlock) {
	if dst.prev == src {
		dst.addr = src.addr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		}
	} else {
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	dst.size += src.size
	p.recycle(src)
}

// EmptyCache frees every cached segment that is not split and unmaps the
// free pages of expandable segments, as torch.cuda.empty_cache() does,
// after taking back every late free. It returns the device's error for a
// call that fails.
func (p *PyTorch) EmptyCache() error {
	p.releasesSeen, p.explicitSeen = 0, false
	p.completeStaged()
	return p.releaseCachedBlocks()
}

// FreeSpace returns the bytes in cached free blocks and the size in bytes
// of the largest: the sets of free blocks changed since the last call
// settle into a heap by their largest (ptTops), in O(log sets) each.
func (p *PyTorch) FreeSpace() (total, largest uint64) {
	return p.freeBytes, p.tops.largest()
}

// Retries returns the number of device allocations retried after freeing
// the cached segments (num_alloc_retries).
func (p *PyTorch) Retries() int64 { return p.retries }

// SameReplay reports whether a replay of the same trace on the same
// device with settings s would make every decision that this replay made,
// and so end with the same figures, so that a search over settings need
// not replay it (replay tune). That holds where s differs from p's
// settings at most in two keys, each where p's replay never reached the
// point where s's value acts:
//   - max_split_size_mb, when p's is unlimited and s's is above every
//     rounded request, every free block found for one and the largest free
//     block where oversize blocks would have been freed (a block or a
//     request that large is what the setting acts on);
//   - garbage_collection_threshold, when p's is off and, under a capacity,
//     the reserved bytes at every point where a collection would have run
//     stayed at or under s's threshold of it (where
//     garbage_collect_cached_blocks returns at once).
//
// It returns false for any other difference, and the error of reading s.
func (p *PyTorch) SameReplay(s Settings) (bool, error) {
	cfg, err := pytorchSettings(s)
	if err != nil {
		return false, err
	}
	if cfg.maxSplitSize != p.cfg.maxSplitSize {
		if p.cfg.maxSplitSize != math.MaxUint64 || p.reach.split >= cfg.maxSplitSize {
			return false, nil
		}
		cfg.maxSplitSize = p.cfg.maxSplitSize
	}
	if t := cfg.garbageCollectionThreshold; t != p.cfg.garbageCollectionThreshold {
		if p.cfg.garbageCollectionThreshold != 0 || p.capacity > 0 && p.reach.gc > uint64(t*float64(p.capacity)) {
			return false, nil
		}
		cfg.garbageCollectionThreshold = p.cfg.garbageCollectionThreshold
	}
	return cfg == p.cfg, nil
}
