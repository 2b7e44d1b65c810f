package policies

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// AsyncPool is a simulation of the CUDA stream-ordered allocator
// (cudaMallocAsync and cudaFreeAsync on a device's default cudaMemPool_t),
// following the CUDA Programming Guide, "Stream Ordered Memory Allocator",
// and the behaviour measured on an H200 (CUDA 13.0, driver 580; the probe
// programs are policies/testdata/async_pool_probe*.cu, their output
// async_pool_probe.out):
//
//   - Memory freed on a stream is reusable at once by that stream. Another
//     stream reuses it only once it is ordered after the free: through an
//     event recorded on the freeing stream after the free and waited for by
//     the other stream (cudaMemPoolReuseFollowEventDependencies), or once
//     the host has seen the free complete, at a stream synchronize of the
//     freeing stream (or of a stream that waited for it), a device
//     synchronize, or an event synchronize of an event recorded after the
//     free (opportunistic reuse: a replay knows of no GPU progress between
//     synchronizations). Measured: with the freeing stream busy, another
//     stream's malloc gets new memory; after an event wait it gets the freed
//     block.
//   - When nothing fits and the pool cannot grow (the device refuses), the
//     pool reuses memory freed on another stream by making the malloc's
//     stream wait for the freeing stream
//     (cudaMemPoolReuseAllowInternalDependencies); measured: while the pool
//     can grow, it grows instead.
//   - At every synchronize (stream, event or device) the pool gives memory
//     whose frees are complete back to the device until it holds no more
//     than the release threshold (cudaMemPoolAttrReleaseThreshold, 0 by
//     default, so the default pool shrinks at every synchronize); a
//     synchronize that completes no free of the pool gives nothing back
//     (measured). Memory goes back from the highest address down, so the
//     lowest memory stays under a threshold (measured).
//   - The pool reserves memory in chunks of 32 MiB (measured: the first
//     1-byte malloc reserves 32 MiB, and the reservation grows and shrinks
//     in 32 MiB steps) and places allocations at 512-byte steps (1..512
//     bytes take 512, 513 take 1024), lowest address first: address-ordered
//     first fit (measured).
//
// Simplified: the driver maps its 32 MiB chunks into one contiguous virtual
// range, so an allocation can straddle the free end of one chunk and a new
// one, and a freed large allocation gives back its chunks one by one. The
// Device here hands out separate segments, so a growth is a segment of its
// own of the request rounded up to the granularity, and a segment goes back
// whole. The reserved bytes therefore differ from the driver's: more at a
// growth (by up to the free end of the last chunk) and while a large
// segment is partly in use (kept whole); less where the driver maps a chunk
// at a free lower address rather than use free mapped memory above it
// (measured), since a segment given back leaves no address range behind.
// Free blocks of one kind merge: completed with completed, pending with
// pending freed on the same stream (then waiting for the later free of the
// two).
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
//   - reuse_follow_event_dependencies [true]: reuse across streams through
//     event waits.
//   - reuse_allow_internal_dependencies [true]: when the device refuses,
//     reuse memory freed on another stream by waiting for it.
type AsyncPool struct {
	dev          Device
	granularity  uint64
	alignment    uint64
	threshold    uint64
	followEvents bool
	internalDeps bool

	// ready holds the free blocks whose frees are complete, reusable by
	// every stream, as an address-ordered tree; it also owns the blocks'
	// spares and the live map of allocated blocks.
	ready    coalescing
	streams  []*apStream
	last     *apStream
	events   map[uint64]apClock // recorded events: what they are ordered after
	host     apClock            // what the host knows to be complete
	segments []*flSegment

	reserved  uint64
	freeBytes uint64 // ready and pending
	retries   int64
	err       error // a device error at a synchronize, for the next call
}

// apStream is a stream of the async pool.
type apStream struct {
	id uint64
	// seq counts the frees issued on the stream; seen holds, by stream,
	// the count of that stream's frees this stream is ordered after.
	seq  uint64
	seen apClock
	// pend holds the blocks freed on this stream whose frees are not known
	// complete, as an address-ordered tree (only its free tree is used).
	pend  coalescing
	npend int
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
	_ Counter    = (*AsyncPool)(nil)
)

func init() {
	register(Info{
		Name:   "async-pool",
		Design: "the CUDA stream-ordered allocator (cudaMallocAsync on the default cudaMemPool_t), as measured on an H200",
		Settings: []Setting{
			{Key: "release_threshold", Default: "0", Doc: "bytes the pool keeps at a synchronize; max keeps everything"},
			{Key: "granularity", Default: "32MiB", Doc: "the pool's reservation step in bytes, a multiple of 2 MiB"},
			{Key: "alignment", Default: "512", Doc: "allocations are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
			{Key: "reuse_follow_event_dependencies", Default: "true", Doc: "reuse memory across streams through event waits"},
			{Key: "reuse_allow_internal_dependencies", Default: "true", Doc: "when the device refuses, reuse memory freed on another stream by waiting for it"},
		},
		Abilities: Abilities{Syncer: true, Releaser: true, FreeSpacer: true, Counter: true},
	}, func(dev Device, s Settings) (Policy, error) { return NewAsyncPool(dev, s) })
}

// NewAsyncPool returns an async-pool policy on dev. It returns an error
// naming the key for an unknown or malformed setting.
func NewAsyncPool(dev Device, s Settings) (*AsyncPool, error) {
	const name = "async-pool"
	if err := s.Check(name, "alignment", "granularity", "release_threshold",
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
	return &AsyncPool{
		dev:          dev,
		granularity:  gran,
		alignment:    align,
		threshold:    threshold,
		followEvents: follow,
		internalDeps: internal,
		ready:        coalescing{name: name, dev: dev, alignment: align, free: freeTree[*flBlock]{byAddr: true}},
		events:       map[uint64]apClock{},
		host:         apClock{},
	}, nil
}

// Name returns "async-pool".
func (p *AsyncPool) Name() string { return "async-pool" }

// Retries returns the number of device allocations tried again after the
// pool gave its unused memory back.
func (p *AsyncPool) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes in the pool, whether their frees are
// complete or not, and the size in bytes of the largest free block.
func (p *AsyncPool) FreeSpace() (total, largest uint64) {
	largest = p.ready.free.largest()
	for _, st := range p.streams {
		largest = max(largest, st.pend.free.largest())
	}
	return p.freeBytes, largest
}

// stream returns the stream id, created if absent.
func (p *AsyncPool) stream(id uint64) *apStream {
	if p.last != nil && p.last.id == id {
		return p.last
	}
	for _, st := range p.streams {
		if st.id == id {
			p.last = st
			return st
		}
	}
	st := &apStream{id: id, seen: apClock{}, pend: coalescing{name: "async-pool", free: freeTree[*flBlock]{byAddr: true}}}
	p.streams = append(p.streams, st)
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
// with the lowest address that stream may reuse, or in a new segment. It
// returns an error wrapping ErrOutOfMemory when the device refuses the
// segment even after the pool reused other streams' frees and gave its
// unused memory back.
func (p *AsyncPool) Malloc(size, stream uint64) (Block, error) {
	if err := p.takeErr(); err != nil {
		return Block{}, err
	}
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("async-pool", size)
	}
	n := ceilToMultiple(size, p.alignment)
	st := p.stream(stream)
	// The lowest pending block st may reuse, then the ready tree's first
	// fit below it, taken in the same descent.
	b, tree := p.findPending(st, n)
	below := ^uint64(0)
	if b != nil {
		below = b.addr
	}
	if r := p.ready.takeFirst(n, below); r != nil {
		b, tree = r, nil
	} else if b == nil {
		var err error
		if b, tree, err = p.grow(st, n); err != nil {
			return Block{}, fmt.Errorf("policy async-pool: malloc of %d bytes: %w", size, err)
		}
	}
	switch {
	case tree == nil:
		// Cut already, from the ready tree.
	case b.size == n:
		tree.remove(b)
		p.untag(b, tree)
	default:
		// Cut from the front; the rest keeps b's place in its tree.
		a := p.ready.newBlock(b.addr, n, b.seg)
		p.ready.linkBefore(b, a)
		tree.resize(b, b.addr+n, b.size-n)
		b = a
	}
	b.free = false
	p.freeBytes -= n
	p.ready.live.Put(b.addr, b)
	return Block{Addr: b.addr, Size: n}, nil
}

// untag forgets b's pending free, if b was in a stream's pending tree.
func (p *AsyncPool) untag(b *flBlock, tree *coalescing) {
	if tree != &p.ready {
		b.pend.s.npend--
		b.pend = apFree{}
	}
}

// findPending returns the pending free block with the lowest address of
// at least n bytes that stream st may reuse, and the tree it is in; nil if
// there is none.
func (p *AsyncPool) findPending(st *apStream, n uint64) (*flBlock, *coalescing) {
	var b *flBlock
	var tree *coalescing
	if st.npend > 0 {
		if c := st.pend.find(n); c != nil && (b == nil || c.addr < b.addr) {
			b, tree = c, &st.pend
		}
	}
	if !p.followEvents {
		return b, tree
	}
	for _, o := range p.streams {
		if o == st || o.npend == 0 {
			continue
		}
		v := st.seen[o.id]
		if v == 0 {
			continue
		}
		var c *flBlock
		if v >= o.seq {
			c = o.pend.find(n) // every pending free of o is visible
		} else {
			c = p.findVisible(&o.pend, n, v)
		}
		if c != nil && (b == nil || c.addr < b.addr) {
			b, tree = c, &o.pend
		}
	}
	return b, tree
}

// findVisible returns the lowest-addressed block of at least n bytes in
// pending list c whose free is at most the v-th of its stream.
func (p *AsyncPool) findVisible(c *coalescing, n, v uint64) *flBlock {
	b, _ := c.free.firstWhere(n, func(x *flBlock) bool { return x.pend.seq <= v })
	return b
}

// grow makes room for n bytes for stream st when no free block it may
// reuse fits: a new segment of n rounded up to the granularity; if the
// device refuses, another stream's pending block that st then waits for;
// else the pool's unused memory is given back and the device tried once
// more. It returns the free block to place n bytes in and its tree.
func (p *AsyncPool) grow(st *apStream, n uint64) (*flBlock, *coalescing, error) {
	size := ceilToMultiple(n, p.granularity)
	addr, err := p.dev.Alloc(size)
	if err != nil {
		if !errors.Is(err, ErrOutOfMemory) {
			return nil, nil, err
		}
		if p.internalDeps {
			var b *flBlock
			var from *apStream
			for _, o := range p.streams {
				if o == st || o.npend == 0 {
					continue
				}
				if c := o.pend.find(n); c != nil && (b == nil || c.addr < b.addr) {
					b, from = c, o
				}
			}
			if b != nil {
				st.seen.join(from.clock())
				return b, &from.pend, nil
			}
		}
		released, rerr := p.trim(0)
		if rerr != nil {
			return nil, nil, rerr
		}
		if released == 0 {
			return nil, nil, err
		}
		p.retries++
		if addr, err = p.dev.Alloc(size); err != nil {
			return nil, nil, err
		}
	}
	s := &flSegment{addr: addr, size: size, index: len(p.segments)}
	p.segments = append(p.segments, s)
	p.reserved += size
	p.freeBytes += size
	b := p.ready.newBlock(addr, size, s)
	s.first = b
	p.ready.insert(b)
	return b, &p.ready, nil
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
	p.freeBytes += b.size
	st := p.stream(stream)
	st.seq++
	tag := apFree{st, st.seq}
	sameStream := func(x *flBlock) bool { return x != nil && x.free && x.pend.s == st }
	switch pv, nx := b.prev, b.next; {
	case sameStream(pv):
		// The free neighbour before grows in place (its key, the address,
		// stays).
		size := pv.size + b.size
		if sameStream(nx) {
			st.pend.remove(nx)
			st.npend--
			size += nx.size
			p.ready.unlink(nx)
		}
		p.ready.unlink(b)
		st.pend.resize(pv, pv.addr, size)
		pv.pend = tag
	case sameStream(nx):
		// The free neighbour after takes b's address: no other block of
		// the tree lies between them, so its place stays.
		st.pend.resize(nx, b.addr, nx.size+b.size)
		p.ready.unlink(b)
		nx.pend = tag
	default:
		b.free = true
		st.pend.insert(b)
		b.pend = tag
		st.npend++
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

// complete moves the pending frees the host knows to be complete to the
// ready blocks and shrinks the pool to the release threshold. A device
// error is kept for the next call.
func (p *AsyncPool) complete() {
	var done []*flBlock
	for _, st := range p.streams {
		h := p.host[st.id]
		if st.npend == 0 || h == 0 {
			continue
		}
		done = p.collect(&st.pend, h, done[:0])
		for _, b := range done {
			st.pend.remove(b)
			b.pend = apFree{}
			st.npend--
			p.insertReady(b)
		}
	}
	if _, err := p.trim(p.threshold); err != nil && p.err == nil {
		p.err = err
	}
}

// collect appends to bs the blocks of pending list c whose frees are at
// most the h-th of their stream, in address order.
func (p *AsyncPool) collect(c *coalescing, h uint64, bs []*flBlock) []*flBlock {
	all := c.free.appendAll(bs)
	bs = all[:len(bs)]
	for _, x := range all[len(bs):] {
		if x.pend.seq <= h {
			bs = append(bs, x)
		}
	}
	return bs
}

// insertReady puts free block b, in no tree, into the ready tree, merged
// with its ready neighbours.
func (p *AsyncPool) insertReady(b *flBlock) {
	isReady := func(x *flBlock) bool {
		if x == nil || !x.free {
			return false
		}
		return x.pend.s == nil
	}
	if pv := b.prev; isReady(pv) {
		p.ready.remove(pv)
		pv.size += b.size
		p.ready.unlink(b)
		b = pv
	}
	if nx := b.next; isReady(nx) {
		p.ready.remove(nx)
		b.size += nx.size
		p.ready.unlink(nx)
	}
	p.ready.insert(b)
}

// trim gives wholly free segments whose frees are complete back to the
// device, from the highest address down, while the pool holds more than
// limit bytes, and reports how many it gave back.
func (p *AsyncPool) trim(limit uint64) (int, error) {
	if p.reserved <= limit {
		return 0, nil
	}
	var idle []*flSegment
	for _, s := range p.segments {
		if f := s.first; f.free && f.next == nil && !p.isPending(f) {
			idle = append(idle, s)
		}
	}
	slices.SortFunc(idle, func(a, b *flSegment) int { return cmp.Compare(b.addr, a.addr) })
	n := 0
	for _, s := range idle {
		if p.reserved <= limit {
			break
		}
		p.ready.remove(s.first)
		last := p.segments[len(p.segments)-1]
		p.segments[s.index] = last
		last.index = s.index
		p.segments = p.segments[:len(p.segments)-1]
		p.reserved -= s.size
		p.freeBytes -= s.size
		p.ready.recycle(s.first)
		if err := p.dev.Free(s.addr); err != nil {
			return n, fmt.Errorf("policy async-pool: %w", err)
		}
		n++
	}
	return n, nil
}

func (p *AsyncPool) isPending(b *flBlock) bool {
	return b.pend.s != nil
}

// EmptyCache is a device synchronize followed by cudaMemPoolTrimTo(0):
// every wholly free segment goes back to the device, whatever the release
// threshold.
func (p *AsyncPool) EmptyCache() error {
	saved := p.threshold
	p.threshold = 0
	p.DeviceSync()
	p.threshold = saved
	return p.takeErr()
}
