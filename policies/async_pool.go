package policies

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// AsyncPool is a simulation of the CUDA stream-ordered allocator
// (cudaMallocAsync and cudaFreeAsync on a cudaMemPool_t), following the
// CUDA Programming Guide, "Stream Ordered Memory Allocator", and the
// behaviour measured on an H200 (CUDA 13.0, driver 580): the probe programs
// policies/testdata/async_pool_probe*.cu with their output
// async_pool_probe.out, and `replay gpu --policy cuda-async --calls` on the
// real traces, whose pool reserved bytes after every call the model was
// checked against (sim/asyncpool_h200_test.go):
//
//   - The pool's memory is one contiguous range of virtual addresses,
//     reserved once, in chunks of 32 MiB (the granularity) mapped when an
//     allocation first touches them: the first 1-byte malloc reserves 32
//     MiB, 100 MiB from the start of the range 128 MiB, and an allocation
//     straddles the end of the mapped chunks by mapping the next ones.
//   - Allocations are rounded up to 512 bytes (1..512 take 512, 513 take
//     1024) and placed by best fit, the oldest free first among equal
//     sizes (a merged block dated by its newest): first among the
//     stream's own pending frees, else among the ready blocks, the range's
//     unmapped part included, and the pending frees of other streams it
//     may reuse (below), all together (so a malloc maps a chunk below free
//     mapped memory rather than use that memory when it fits better there,
//     and takes a ready block that fits better than another stream's
//     pending free: on the H200 replay of churn, a 1.6 MB malloc on the
//     second stream took a 4.4 MB ready block, not the first stream's
//     pending 44.9 MB). When
//     the block found is the top of the range or needs a chunk mapped, and
//     frees complete at once, every pending free is made ready first (the
//     driver has seen them complete by then) and the best fit taken again.
//     Fitted to the driver's placements on the H200 replays: it picks the
//     driver's block at 97.6 to 99.9% of the mallocs of train_gpt,
//     hf_llama_train and kv_decode when given the driver's state.
//   - A chunk that no live block and no pending free lies on is idle. When an allocation needs a chunk
//     mapped and an idle chunk exists elsewhere, the driver moves that
//     chunk's memory (the highest idle chunk) instead of growing: the
//     reservation stays (measured: 15 freed 100 MiB blocks with 60 MiB
//     reused in each, then a 1500 MiB malloc grew the pool by 43 chunks,
//     not 47).
//   - At every synchronize (stream, event or device) the pool gives idle
//     chunks back, from the highest address down, until it holds no more
//     than the release threshold (cudaMemPoolAttrReleaseThreshold, 0 by
//     default, so the default pool shrinks at every synchronize), but only
//     chunks whose frees the synchronize orders the host after: a stream
//     synchronize of the freeing stream (or of a stream that waited for
//     it), a device synchronize, or an event synchronize of an event
//     recorded after the free. A synchronize of another stream gives
//     nothing back (measured). A threshold keeps whole chunks: 40 MiB keeps
//     32 MiB.
//   - frees_complete says when a pending free becomes ready, reusable by
//     every stream. In a replay no kernels run and the GPU keeps up with
//     the frees; the driver reuses completed frees for any stream
//     (cudaMemPoolReuseAllowOpportunistic) once it has seen them complete,
//     which on the H200 replays it had by the time the pool grew: at_once,
//     the default, makes every pending free ready when a malloc would grow
//     the pool (above). at_sync is the reading for a busy GPU: a free
//     becomes ready only at a synchronize that orders the host after it.
//     In both, memory freed on a stream is reusable at once by that
//     stream; by another, with at_once, when none of its own fits (the
//     GPU has done the free: cudaMemPoolReuseAllowOpportunistic), with
//     at_sync once that stream is ordered after the free through an event
//     recorded on the freeing stream after the free and waited for
//     (cudaMemPoolReuseFollowEventDependencies; measured with the freeing
//     stream busy: another stream's malloc gets new memory; after an event
//     wait it gets the freed block). Pending frees of one
//     stream merge (then waiting for the later of the two), ready blocks
//     merge; a pending free and a ready block do not.
//   - When the device refuses a chunk, the pool reuses memory freed on
//     another stream by making the malloc's stream wait for the freeing
//     stream (cudaMemPoolReuseAllowInternalDependencies; measured: while the
//     pool can grow, it grows instead); else the malloc fails.
//
// Not modelled: which block the driver takes also depends on timing (how
// far the GPU has got with the frees, across streams most of all), so the
// addresses drift from the driver's after a few hundred to a few thousand
// calls. The reserved high is within one chunk of the driver's on all 14
// real traces replayed on the H200 (10 to the byte); the table is in
// sim/asyncpool_h200_test.go.
//
// The range is reserved through the device's Mapper (cuMemAddressReserve,
// then cuMemCreate and cuMemMap of each chunk; one device allocation per
// chunk, a move one free and one allocation), so the simulated device and
// the GPU count the pool's reserved bytes as the driver does. The pool
// holds its device's capacity (policies.Capacitor): a chunk that would pass
// it is refused.
//
// A malloc of 0 bytes returns the block {0, 0}, whose free does nothing.
// EmptyCache is what PyTorch's cudaMallocAsync backend does for
// torch.cuda.empty_cache(): a device synchronize, then cudaMemPoolTrimTo(0).
// The synchronization methods cannot return an error; a device error while
// giving memory back there is returned by the next Malloc, Free or
// EmptyCache.
//
// Settings (defaults in brackets):
//   - release_threshold [0]: bytes the pool keeps at a synchronize; "max"
//     keeps everything (UINT64_MAX).
//   - granularity [32MiB]: the pool's reservation step, a multiple of 2 MiB
//     (the driver's page).
//   - alignment [512]: allocations are rounded up to a multiple of it, a
//     power of two from 1 B to 2 MiB.
//   - frees_complete [at_once]: when a pending free becomes ready for
//     every stream: at_once or at_sync (see above).
//   - reuse_follow_event_dependencies [true]: reuse across streams through
//     event waits.
//   - reuse_allow_internal_dependencies [true]: when the device refuses,
//     reuse memory freed on another stream by waiting for it.
type AsyncPool struct {
	dev          Device
	mapper       Mapper
	granularity  uint64
	alignment    uint64
	threshold    uint64
	followEvents bool
	internalDeps bool

	// ready owns the blocks' spares and the live map of allocated blocks;
	// readyT holds the free blocks whose frees are complete, reusable by
	// every stream, by (size, serial): best fit, the oldest free first.
	// The whole unmapped part of the range is ready free space.
	ready    coalescing
	readyT   freeTree[*flBlock]
	serial   uint64 // frees so far: a free block's serial is its newest free's
	streams  []*apStream
	byStream map[uint64]*apStream // the streams by id (a scan cost N^2 on N streams)
	// pendStreams are the streams with pending frees, and some that had
	// them (pendingStreams drops those), in no order: what a search of
	// other streams' pending frees walks, rather than every stream.
	pendStreams []*apStream
	last        *apStream
	events      map[uint64]apClock // recorded events: what they are ordered after
	host        apClock            // what the host knows to be complete

	// The range: reserved at the first malloc, of rangeBytes at base.
	base uint64
	seg  *flSegment
	// By chunk index from base: whether the chunk is mapped, and the bytes
	// of it that live blocks and pending frees cover (a mapped chunk with
	// none is idle, and goes back at a synchronize).
	mapped []bool
	busy   []uint64
	// freed holds, by chunk, the latest free on it of each stream, when
	// frees complete at once: the chunk goes back only at a synchronize
	// the host knows them complete through.
	freed [][]apFree
	// freedAt indexes a chunk's freed by stream once it holds more than
	// freedScan streams, so that a free on one of N streams finds its tag
	// without a pass over N (which made N streams cost N^2).
	freedAt []map[*apStream]int
	scratch []*flBlock
	atOnce  bool // frees complete at once (frees_complete=at_once)

	reserved uint64 // mapped bytes
	used     uint64 // bytes of live blocks
	err      error  // a device error at a synchronize, for the next call
}

// apRangeBytes is the size of the pool's virtual address range: room for
// any card's memory.
const apRangeBytes = 1 << 40

// apStream is a stream of the async pool.
type apStream struct {
	id uint64
	// seq counts the frees issued on the stream; seen holds, by stream,
	// the count of that stream's frees this stream is ordered after.
	seq  uint64
	seen apClock
	// pend holds the blocks freed on this stream whose frees are not
	// complete, by (size, serial) as readyT; inPend is set while the
	// stream is in AsyncPool.pendStreams.
	pend   freeTree[*flBlock]
	inPend bool
}

// pendingStreams returns the streams with pending frees, in no order.
func (p *AsyncPool) pendingStreams() []*apStream {
	kept := p.pendStreams[:0]
	for _, st := range p.pendStreams {
		if st.pend.len > 0 {
			kept = append(kept, st)
		} else {
			st.inPend = false
		}
	}
	clear(p.pendStreams[len(kept):])
	p.pendStreams = kept
	return kept
}

// apFree is a pending free: its stream and its place in the stream's
// frees.
type apFree struct {
	s   *apStream
	seq uint64
}

// apClock is a vector clock: by stream id, a count of frees.
type apClock map[uint64]uint64

// join raises c to o, entry by entry.
func (c apClock) join(o apClock) {
	for k, v := range o {
		if v > c[k] {
			c[k] = v
		}
	}
}

var (
	_ Policy     = (*AsyncPool)(nil)
	_ Syncer     = (*AsyncPool)(nil)
	_ Releaser   = (*AsyncPool)(nil)
	_ FreeSpacer = (*AsyncPool)(nil)
)

func init() {
	register(Info{
		Name:   "async-pool",
		Design: "the CUDA stream-ordered allocator (cudaMallocAsync on a cudaMemPool_t): one mapped virtual range, as measured on an H200",
		Settings: []Setting{
			{Key: "release_threshold", Default: "0", Doc: "bytes the pool keeps at a synchronize; max keeps everything"},
			{Key: "granularity", Default: "32MiB", Doc: "the pool's reservation step in bytes, a multiple of 2 MiB"},
			{Key: "alignment", Default: "512", Doc: "allocations are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
			{Key: "frees_complete", Default: "at_once", Doc: "when a pending free becomes reusable by every stream: at_once (when the pool would grow: the GPU keeps up, as in a replay; matches the H200) or at_sync (at a synchronize after it)"},
			{Key: "reuse_follow_event_dependencies", Default: "true", Doc: "reuse memory across streams through event waits"},
			{Key: "reuse_allow_internal_dependencies", Default: "true", Doc: "when the device refuses, reuse memory freed on another stream by waiting for it"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewAsyncPool(dev, s) })
}

// NewAsyncPool returns an async-pool policy on dev. It returns an error
// naming the key for an unknown or malformed setting.
func NewAsyncPool(dev Device, s Settings) (*AsyncPool, error) {
	const name = "async-pool"
	if err := s.Check(name, "alignment", "frees_complete", "granularity", "release_threshold",
		"reuse_allow_internal_dependencies", "reuse_follow_event_dependencies"); err != nil {
		return nil, err
	}
	var threshold uint64
	if v, ok := s["release_threshold"]; ok && strings.EqualFold(strings.TrimSpace(v), "max") {
		threshold = math.MaxUint64
	} else {
		var err error
		if threshold, err = s.Bytes(name, "release_threshold", 0); err != nil {
			return nil, err
		}
	}
	gran, err := s.Bytes(name, "granularity", 32<<20)
	if err != nil {
		return nil, err
	}
	if gran == 0 || gran%deviceGranularity != 0 || gran > maxRequest {
		return nil, invalidSettingf(name, s, "granularity", "must be a multiple of 2 MiB")
	}
	align, err := s.Bytes(name, "alignment", 512)
	if err != nil {
		return nil, err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return nil, invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	follow, err := s.Bool(name, "reuse_follow_event_dependencies", true)
	if err != nil {
		return nil, err
	}
	internal, err := s.Bool(name, "reuse_allow_internal_dependencies", true)
	if err != nil {
		return nil, err
	}
	var atOnce bool
	switch v := strings.TrimSpace(s["frees_complete"]); v {
	case "", "at_once":
		atOnce = true
	case "at_sync":
	default:
		return nil, invalidSettingf(name, s, "frees_complete", "want at_once or at_sync")
	}
	mapper, ok := dev.(Mapper)
	if !ok {
		return nil, fmt.Errorf("policy %s: the device cannot map pages (it is no policies.Mapper)", name)
	}
	return &AsyncPool{
		dev:          dev,
		mapper:       mapper,
		granularity:  gran,
		alignment:    align,
		threshold:    threshold,
		followEvents: follow,
		internalDeps: internal,
		atOnce:       atOnce,
		ready:        coalescing{name: name, dev: dev, alignment: align},
		events:       map[uint64]apClock{},
		host:         apClock{},
	}, nil
}

// Name returns "async-pool".
func (p *AsyncPool) Name() string { return "async-pool" }

// FreeSpace returns the free bytes in the pool's mapped chunks, whether
// their frees are complete or not, and the size in bytes of the largest run
// of them (a free block's part in mapped chunks).
func (p *AsyncPool) FreeSpace() (total, largest uint64) {
	for _, st := range p.pendingStreams() {
		largest = max(largest, st.pend.largest())
	}
	if p.seg != nil {
		// Ready blocks may hold unmapped chunks: walk them.
		for b := p.seg.first; b != nil; b = b.next {
			if b.free && b.pend.s == nil {
				largest = max(largest, p.mappedRun(b.addr, b.size))
			}
		}
	}
	return p.reserved - p.used, min(largest, p.reserved-p.used)
}

// mappedRun returns the longest run of mapped bytes in [addr, addr+size).
func (p *AsyncPool) mappedRun(addr, size uint64) uint64 {
	var best, run uint64
	end := addr + size
	for a := addr; a < end; {
		c := (a - p.base) / p.granularity
		next := min(p.base+(c+1)*p.granularity, end)
		if c < uint64(len(p.mapped)) && p.mapped[c] {
			run += next - a
			best = max(best, run)
		} else {
			run = 0
			if c >= uint64(len(p.mapped)) {
				break
			}
		}
		a = next
	}
	return best
}

// stream returns the stream id, created if absent.
func (p *AsyncPool) stream(id uint64) *apStream {
	if p.last != nil && p.last.id == id {
		return p.last
	}
	if st := p.byStream[id]; st != nil {
		p.last = st
		return st
	}
	st := &apStream{id: id, seen: apClock{}}
	p.streams = append(p.streams, st)
	if p.byStream == nil {
		p.byStream = map[uint64]*apStream{}
	}
	p.byStream[id] = st
	p.last = st
	return st
}

// clock returns what stream st is ordered after, its own frees included,
// as a new clock.
func (st *apStream) clock() apClock {
	c := make(apClock, len(st.seen)+1)
	c.join(st.seen)
	c[st.id] = st.seq
	return c
}

// takeErr returns the deferred device error, if any, and forgets it.
func (p *AsyncPool) takeErr() error {
	err := p.err
	p.err = nil
	return err
}

// Malloc places size bytes, rounded up to the alignment, in the free block
// that stream may reuse that fits best (see place; the range's unmapped
// part included), and maps the chunks it touches that are not mapped. It
// returns an error wrapping ErrOutOfMemory when the device refuses a chunk
// and no other stream's pending free fits (or internal dependencies are
// off).
func (p *AsyncPool) Malloc(size, stream uint64) (Block, error) {
	if err := p.takeErr(); err != nil {
		return Block{}, err
	}
	if size == 0 {
		return Block{}, nil
	}
	if size > apRangeBytes {
		return Block{}, errRequestTooLarge("async-pool", size)
	}
	if p.seg == nil {
		if err := p.reserveRange(); err != nil {
			return Block{}, fmt.Errorf("policy async-pool: malloc of %d bytes: %w", size, err)
		}
	}
	n := ceilToMultiple(size, p.alignment)
	st := p.stream(stream)
	b, err := p.place(st, n)
	if err != nil {
		return Block{}, fmt.Errorf("policy async-pool: malloc of %d bytes: %w", size, err)
	}
	b.free = false
	p.used += n
	p.ready.live.Put(b.addr, b)
	return Block{Addr: b.addr, Size: n}, nil
}

// reserveRange reserves the pool's address range, all of it one ready free
// block.
func (p *AsyncPool) reserveRange() error {
	addr, err := p.mapper.Reserve(apRangeBytes)
	if err != nil {
		return err
	}
	p.base = addr
	p.seg = &flSegment{addr: addr, size: apRangeBytes}
	b := p.ready.newBlock(addr, apRangeBytes, p.seg)
	p.seg.first = b
	p.readyT.insert(b.size, b.serial, b)
	return nil
}

// place cuts n bytes for stream st from a free block and maps the chunks
// they touch: the best fit among st's own pending frees, else the best fit
// among the ready blocks and the pending frees of other streams st may
// reuse (see bestOther); the oldest free first among equal sizes
// (measured: on the H200 replays of train_gpt, hf_llama_train and
// kv_decode, one stream each, this picks the driver's block at 97.6 to
// 99.9% of the mallocs).
// When that needs a chunk mapped and frees complete at once, the pending
// frees of every stream become ready first (the driver has seen them
// complete by then) and the best fit is taken again. When the device
// refuses a chunk, it reuses another stream's pending block instead (an
// internal dependency). (No retry after giving idle chunks back: an idle
// chunk is moved before the device is asked for memory.)
func (p *AsyncPool) place(st *apStream, n uint64) (*flBlock, error) {
	if st.pend.len > 0 {
		if b, ok := st.pend.best(n); ok {
			return p.cut(b, n, &st.pend), nil
		}
	}
	r, ok := p.readyT.best(n)
	if b, tree := p.bestOther(st, n); b != nil && (!ok || fitsBefore(b, r)) {
		return p.cut(b, n, tree), nil
	}
	if !ok {
		return nil, fmt.Errorf("the pool's %d-byte address range is full: %w", uint64(apRangeBytes), ErrOutOfMemory)
	}
	if p.atOnce && (r.addr+r.size == p.base+apRangeBytes || p.unmapped(r.addr, n)) && p.pending() {
		for _, o := range p.streams {
			p.moveDone(o, o.seq)
		}
		r, _ = p.readyT.best(n)
	}
	serial := r.serial
	a := p.cut(r, n, &p.readyT)
	err := p.mapChunks(a.addr, n)
	if err == nil {
		p.cover(a.addr, n, true)
		return a, nil
	}
	// Put the cut back, merged with its ready neighbours.
	a.free, a.serial = true, serial
	p.insertReady(a)
	if !errors.Is(err, ErrOutOfMemory) || !p.internalDeps {
		return nil, err
	}
	var b *flBlock
	var from *apStream
	// The least (size, serial) of all: serials are unique, so the order of
	// the streams plays no part.
	for _, o := range p.pendingStreams() {
		if o == st || o.pend.len == 0 {
			continue
		}
		if c, ok := o.pend.best(n); ok && (b == nil || fitsBefore(c, b)) {
			b, from = c, o
		}
	}
	if b == nil {
		return nil, err
	}
	st.seen.join(from.clock())
	return p.cut(b, n, &from.pend), nil
}

// pending reports whether any free is pending.
func (p *AsyncPool) pending() bool {
	return len(p.pendingStreams()) > 0
}

// unmapped reports whether [addr, addr+n) touches a chunk not mapped.
func (p *AsyncPool) unmapped(addr, n uint64) bool {
	first, last := p.chunks(addr, n)
	for c := first; c <= last; c++ {
		if c >= uint64(len(p.mapped)) || !p.mapped[c] {
			return true
		}
	}
	return false
}

// cut takes n bytes from the front of free block b, in tree, and returns
// the block of them, out of every tree and not free; the rest keeps b's
// serial and its pending free.
func (p *AsyncPool) cut(b *flBlock, n uint64, tree *freeTree[*flBlock]) *flBlock {
	tree.delete(b.size, b.serial)
	if b.size == n {
		b.pend, b.free = apFree{}, false
		return b
	}
	a := p.ready.newBlock(b.addr, n, b.seg)
	p.ready.linkBefore(b, a)
	b.addr, b.size = b.addr+n, b.size-n
	tree.insert(b.size, b.serial, b)
	a.free = false
	return a
}

// bestOther returns the best-fitting block of at least n bytes among the
// pending frees of streams other than st that st may reuse, and the tree it
// is in; nil if there is none: when frees complete at once any (the GPU has
// done them: cudaMemPoolReuseAllowOpportunistic), else one st is ordered
// after through an event.
func (p *AsyncPool) bestOther(st *apStream, n uint64) (*flBlock, *freeTree[*flBlock]) {
	if !p.followEvents && !p.atOnce {
		return nil, nil
	}
	var b *flBlock
	var tree *freeTree[*flBlock]
	// The least (size, serial) of all: serials are unique, so the order of
	// the streams plays no part.
	for _, o := range p.pendingStreams() {
		if o == st || o.pend.len == 0 {
			continue
		}
		v := st.seen[o.id]
		if p.atOnce {
			v = o.seq
		}
		if v == 0 {
			continue
		}
		c, ok := o.pend.firstWhere(n, func(x *flBlock) bool { return x.pend.seq <= v })
		if ok && (b == nil || fitsBefore(c, b)) {
			b, tree = c, &o.pend
		}
	}
	return b, tree
}

// fitsBefore reports whether free block a comes before free block b in
// best-fit order: smaller, or as large and freed earlier.
func fitsBefore(a, b *flBlock) bool {
	return a.size < b.size || a.size == b.size && a.serial < b.serial
}

// chunks returns the indexes of the first and last chunk [addr, addr+n)
// touches.
func (p *AsyncPool) chunks(addr, n uint64) (first, last uint64) {
	return (addr - p.base) / p.granularity, (addr + n - 1 - p.base) / p.granularity
}

// mapChunks maps the chunks [addr, addr+n) touches that are not mapped, one
// device allocation each, and on a failure unmaps those it mapped. A chunk
// that would take the device past its capacity is refused with
// ErrOutOfMemory.
func (p *AsyncPool) mapChunks(addr, n uint64) error {
	first, last := p.chunks(addr, n)
	for uint64(len(p.mapped)) <= last {
		p.mapped = append(p.mapped, false)
		p.busy = append(p.busy, 0)
		p.freed = append(p.freed, nil)
		p.freedAt = append(p.freedAt, nil)
	}
	var fresh []uint64 // mapped by this call
	for c := first; c <= last; c++ {
		if p.mapped[c] {
			continue
		}
		var err error
		if d, ok := p.idleChunk(first, last); ok {
			// The driver moves an idle chunk's memory here rather than
			// grow (measured): its reservation stays.
			err = p.unmapOne(d)
		} else {
			err = p.refuse()
		}
		if err == nil {
			err = p.mapper.Map(p.base+c*p.granularity, p.granularity)
		}
		if err != nil {
			for _, d := range fresh {
				if uerr := p.unmapOne(d); uerr != nil {
					return uerr
				}
			}
			return err
		}
		p.mapped[c] = true
		p.reserved += p.granularity
		fresh = append(fresh, c)
	}
	return nil
}

// idleChunk returns the highest mapped chunk outside chunks first..last
// that no live block and no pending free lies on.
func (p *AsyncPool) idleChunk(first, last uint64) (uint64, bool) {
	for c := len(p.mapped) - 1; c >= 0; c-- {
		if p.mapped[c] && p.busy[c] == 0 && (uint64(c) < first || uint64(c) > last) {
			return uint64(c), true
		}
	}
	return 0, false
}

// refuse returns an error wrapping ErrOutOfMemory when one more chunk would
// take the device past its capacity.
func (p *AsyncPool) refuse() error {
	c, ok := p.dev.(Capacitor)
	if !ok || c.Capacity() == 0 {
		return nil
	}
	if r := c.Reserved(); p.granularity > c.Capacity() || r > c.Capacity()-p.granularity {
		return fmt.Errorf("a chunk of %d bytes with %d of %d reserved: %w", p.granularity, r, c.Capacity(), ErrOutOfMemory)
	}
	return nil
}

// unmapOne gives chunk c, mapped and idle, back to the device.
func (p *AsyncPool) unmapOne(c uint64) error {
	if err := p.mapper.Unmap(p.base+c*p.granularity, p.granularity); err != nil {
		return fmt.Errorf("policy async-pool: %w", err)
	}
	p.mapped[c] = false
	p.freed[c] = p.freed[c][:0]
	p.freedAt[c] = nil
	p.reserved -= p.granularity
	return nil
}

// freedScan is the number of a chunk's tags below which tagChunks finds a
// stream's by a pass rather than through freedAt.
const freedScan = 16

// tagChunks notes free f on the chunks [addr, addr+n) touches.
func (p *AsyncPool) tagChunks(addr, n uint64, f apFree) {
	first, last := p.chunks(addr, n)
	for c := first; c <= last; c++ {
		tags := p.freed[c]
		if at := p.freedAt[c]; at != nil {
			if i, ok := at[f.s]; ok {
				tags[i] = f
			} else {
				at[f.s] = len(tags)
				p.freed[c] = append(tags, f)
			}
			continue
		}
		i := 0
		for i < len(tags) && tags[i].s != f.s {
			i++
		}
		if i < len(tags) {
			tags[i] = f
			continue
		}
		p.freed[c] = append(tags, f)
		if len(p.freed[c]) > freedScan {
			at := make(map[*apStream]int, len(p.freed[c]))
			for k, t := range p.freed[c] {
				at[t.s] = k
			}
			p.freedAt[c] = at
		}
	}
}

// synced reports whether the host knows every free on chunk c complete.
func (p *AsyncPool) synced(c int) bool {
	for _, f := range p.freed[c] {
		if p.host[f.s.id] < f.seq {
			return false
		}
	}
	return true
}

// cover adds (or, with add false, takes away) [addr, addr+n) to the busy
// bytes of the chunks it touches.
func (p *AsyncPool) cover(addr, n uint64, add bool) {
	first, last := p.chunks(addr, n)
	for c := first; c <= last; c++ {
		lo := max(addr, p.base+c*p.granularity)
		hi := min(addr+n, p.base+(c+1)*p.granularity)
		if add {
			p.busy[c] += hi - lo
		} else {
			p.busy[c] -= hi - lo
		}
	}
}

// Free takes the block at addr back as a pending free of stream: reusable
// at once by that stream, by others once ordered after it. It merges with
// neighbours that are pending frees of the same stream. It returns an error
// if addr is not a live block.
func (p *AsyncPool) Free(addr, stream uint64) error {
	if err := p.takeErr(); err != nil {
		return err
	}
	if addr == 0 {
		return nil
	}
	b, ok := p.ready.live.Take(addr)
	if !ok {
		return fmt.Errorf("policy async-pool: free of %#x: not a live block", addr)
	}
	p.used -= b.size
	st := p.stream(stream)
	st.seq++
	p.serial++
	tag := apFree{st, st.seq}
	p.tagChunks(b.addr, b.size, tag)
	sameStream := func(x *flBlock) bool { return x != nil && x.free && x.pend.s == st }
	if pv := b.prev; sameStream(pv) {
		st.pend.delete(pv.size, pv.serial)
		pv.size += b.size
		p.ready.unlink(b)
		b = pv
	}
	if nx := b.next; sameStream(nx) {
		st.pend.delete(nx.size, nx.serial)
		b.size += nx.size
		p.ready.unlink(nx)
	}
	b.free, b.pend, b.serial = true, tag, p.serial
	st.pend.insert(b.size, b.serial, b)
	if !st.inPend {
		st.inPend = true
		p.pendStreams = append(p.pendStreams, st)
	}
	return nil
}

// StreamSync is a cudaStreamSynchronize of stream: the host knows every
// free the stream is ordered after to be complete; then the pool shrinks to
// the release threshold.
func (p *AsyncPool) StreamSync(stream uint64) {
	p.host.join(p.stream(stream).clock())
	p.complete()
}

// DeviceSync is a cudaDeviceSynchronize: every free is complete; then the
// pool shrinks to the release threshold.
func (p *AsyncPool) DeviceSync() {
	for _, st := range p.streams {
		p.host.join(st.clock())
	}
	p.complete()
}

// EventRecord records event ev on stream: the event is ordered after what
// the stream is ordered after.
func (p *AsyncPool) EventRecord(ev, stream uint64) {
	p.events[ev] = p.stream(stream).clock()
}

// StreamWaitEvent makes stream wait for event ev (an event never recorded
// is complete at once and orders nothing).
func (p *AsyncPool) StreamWaitEvent(stream, ev uint64) {
	if c, ok := p.events[ev]; ok {
		p.stream(stream).seen.join(c)
	}
}

// EventSync is a cudaEventSynchronize of event ev: the host knows the frees
// the event is ordered after to be complete; then the pool shrinks to the
// release threshold.
func (p *AsyncPool) EventSync(ev uint64) {
	if c, ok := p.events[ev]; ok {
		p.host.join(c)
	}
	p.complete()
}

// complete makes the pending frees the host knows to be complete ready
// and shrinks the pool to the release threshold. A device error is kept
// for the next call.
func (p *AsyncPool) complete() {
	for _, st := range p.streams {
		p.moveDone(st, p.host[st.id])
	}
	if _, err := p.trim(p.threshold); err != nil && p.err == nil {
		p.err = err
	}
}

// moveDone makes the pending frees of stream st up to its h-th ready,
// each merged with its ready neighbours.
func (p *AsyncPool) moveDone(st *apStream, h uint64) {
	if st.pend.len == 0 || h == 0 {
		return
	}
	done := p.scratch[:0]
	for _, b := range st.pend.appendAll(p.scratch[:0]) {
		if b.pend.seq <= h {
			done = append(done, b)
		}
	}
	for _, b := range done {
		st.pend.delete(b.size, b.serial)
		b.pend = apFree{}
		p.cover(b.addr, b.size, false)
		p.insertReady(b)
	}
	p.scratch = done[:0]
}

// insertReady puts free block b, in no tree, into the ready tree, merged
// with its ready neighbours; the merged block takes the newest serial.
func (p *AsyncPool) insertReady(b *flBlock) {
	isReady := func(x *flBlock) bool { return x != nil && x.free && x.pend.s == nil }
	if pv := b.prev; isReady(pv) {
		p.readyT.delete(pv.size, pv.serial)
		pv.size += b.size
		pv.serial = max(pv.serial, b.serial)
		p.ready.unlink(b)
		b = pv
	}
	if nx := b.next; isReady(nx) {
		p.readyT.delete(nx.size, nx.serial)
		b.size += nx.size
		b.serial = max(b.serial, nx.serial)
		p.ready.unlink(nx)
	}
	p.readyT.insert(b.size, b.serial, b)
}

// trim gives idle chunks (no live block and no pending free on them) back
// to the device, from the highest address down, while the pool holds more
// than limit bytes, and reports how many it gave back.
func (p *AsyncPool) trim(limit uint64) (int, error) {
	n := 0
	for c := len(p.mapped) - 1; c >= 0 && p.reserved > limit; c-- {
		if !p.mapped[c] || p.busy[c] != 0 || !p.synced(c) {
			continue
		}
		if err := p.unmapOne(uint64(c)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// EmptyCache is a device synchronize followed by cudaMemPoolTrimTo(0):
// every idle chunk goes back to the device, whatever the release
// threshold.
func (p *AsyncPool) EmptyCache() error {
	saved := p.threshold
	p.threshold = 0
	p.DeviceSync()
	p.threshold = saved
	return p.takeErr()
}
