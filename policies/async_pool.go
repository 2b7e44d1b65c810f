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
//     1024) and placed first fit by address over the whole range, mapped or
//     not: a malloc maps a chunk below free mapped memory rather than use
//     that memory.
//   - A chunk that no live block (and, with frees_complete=at_sync, no
//     pending free) lies on is idle. When an allocation needs a chunk
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
//   - frees_complete says when a free is reusable by other streams. In a
//     replay no kernels run, the GPU keeps up with the frees, and the
//     driver reuses a completed free for any stream at once
//     (cudaMemPoolReuseAllowOpportunistic): at_once, the default, matches
//     the pool's reserved high on the H200 replays. at_sync is the
//     conservative reading for a busy GPU: memory freed on a stream is
//     reusable at once by that stream, by another only once it is ordered
//     after the free, through an event recorded on the freeing stream after
//     the free and waited for by the other stream
//     (cudaMemPoolReuseFollowEventDependencies), or once the host has seen
//     the free complete at a synchronize (measured with the freeing stream
//     busy: another stream's malloc gets new memory; after an event wait it
//     gets the freed block). Free blocks of one kind merge: completed with
//     completed, pending with pending freed on the same stream (then waiting
//     for the later free of the two).
//   - When the device refuses a chunk, the pool reuses memory freed on
//     another stream by making the malloc's stream wait for the freeing
//     stream (cudaMemPoolReuseAllowInternalDependencies; measured: while the
//     pool can grow, it grows instead); else the malloc fails.
//
// Not modelled: the driver does not always take the lowest free address;
// which free block it takes depends on timing (how far the GPU has got with
// the frees) in a way not worked out, so the addresses drift from the
// driver's after a few hundred calls. The reserved high is within one chunk
// of the driver's on 9 of 14 real traces replayed on the H200 (8 to the
// byte) and up to 10 chunks below it on the others: 64 MiB on mlp (9%), 96
// MiB on churn_mixed (6%), 192 MiB on train_gpt (2%) and multistream (23%),
// 320 MiB on hf_llama_train (7%); the table is in
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
//   - frees_complete [at_once]: when another stream may reuse a free:
//     at_once or at_sync (see above).
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

	// ready holds the free blocks whose frees are complete, reusable by
	// every stream, as an address-ordered tree; it also owns the blocks'
	// spares and the live map of allocated blocks. The whole unmapped part
	// of the range is ready free space.
	ready   coalescing
	streams []*apStream
	last    *apStream
	events  map[uint64]apClock // recorded events: what they are ordered after
	host    apClock            // what the host knows to be complete

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
	freed  [][]apFree
	atOnce bool // frees complete at once (frees_complete=at_once)

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
)

func init() {
	register(Info{
		Name:   "async-pool",
		Design: "the CUDA stream-ordered allocator (cudaMallocAsync on a cudaMemPool_t): one mapped virtual range, as measured on an H200",
		Settings: []Setting{
			{Key: "release_threshold", Default: "0", Doc: "bytes the pool keeps at a synchronize; max keeps everything"},
			{Key: "granularity", Default: "32MiB", Doc: "the pool's reservation step in bytes, a multiple of 2 MiB"},
			{Key: "alignment", Default: "512", Doc: "allocations are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
			{Key: "frees_complete", Default: "at_once", Doc: "when another stream may reuse a free: at_once (the GPU keeps up, as in a replay; matches the H200) or at_sync (only after an event wait or a synchronize)"},
			{Key: "reuse_follow_event_dependencies", Default: "true", Doc: "reuse memory across streams through event waits"},
			{Key: "reuse_allow_internal_dependencies", Default: "true", Doc: "when the device refuses, reuse memory freed on another stream by waiting for it"},
		},
		Abilities: Abilities{Syncer: true, Releaser: true, FreeSpacer: true},
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
		ready:        coalescing{name: name, dev: dev, alignment: align, free: freeTree[*flBlock]{byAddr: true}},
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
	for _, st := range p.streams {
		largest = max(largest, st.pend.free.largest())
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
// with the lowest address that stream may reuse (the range's unmapped part
// included), and maps the chunks it touches that are not mapped. It
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
	p.ready.insert(b)
	return nil
}

// place cuts n bytes for stream st from the lowest free block it may reuse
// and maps the chunks they touch. When the device refuses a chunk, it
// reuses another stream's pending block instead (an internal dependency).
// (No retry after giving idle chunks back: an idle chunk is moved before
// the device is asked for memory.)
func (p *AsyncPool) place(st *apStream, n uint64) (*flBlock, error) {
	// The lowest pending block st may reuse, then the ready tree's first
	// fit below it, taken in the same descent.
	b, tree := p.findPending(st, n)
	below := ^uint64(0)
	if b != nil {
		below = b.addr
	}
	if r := p.ready.takeFirst(n, below); r != nil {
		err := p.mapChunks(r.addr, n)
		if err == nil {
			p.cover(r.addr, n, true)
			return r, nil
		}
		// Put the cut back, merged with its ready neighbours.
		p.insertReady(r)
		if !errors.Is(err, ErrOutOfMemory) {
			return nil, err
		}
		// The pending block st may reuse, above the refused place; else,
		// with internal dependencies, another stream's that st then waits
		// for.
		if b == nil && p.internalDeps {
			var from *apStream
			for _, o := range p.streams {
				if o == st || o.npend == 0 {
					continue
				}
				if c := o.pend.find(n); c != nil && (b == nil || c.addr < b.addr) {
					b, from, tree = c, o, &o.pend
				}
			}
			if b != nil {
				st.seen.join(from.clock())
			}
		}
		if b == nil {
			return nil, err
		}
	} else if b == nil {
		return nil, fmt.Errorf("the pool's %d-byte address range is full: %w", uint64(apRangeBytes), ErrOutOfMemory)
	}
	// A pending block, mapped and covered already.
	if b.size == n {
		tree.remove(b)
		p.untag(b, tree)
		return b, nil
	}
	// Cut from the front; the rest keeps b's place in its tree.
	a := p.ready.newBlock(b.addr, n, b.seg)
	p.ready.linkBefore(b, a)
	tree.resize(b, b.addr+n, b.size-n)
	return a, nil
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
	p.reserved -= p.granularity
	return nil
}

// tagChunks notes free f on the chunks [addr, addr+n) touches.
func (p *AsyncPool) tagChunks(addr, n uint64, f apFree) {
	first, last := p.chunks(addr, n)
	for c := first; c <= last; c++ {
		tags := p.freed[c]
		i := 0
		for i < len(tags) && tags[i].s != f.s {
			i++
		}
		if i == len(tags) {
			p.freed[c] = append(tags, f)
		} else {
			tags[i] = f
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
	tag := apFree{st, st.seq}
	if p.atOnce {
		// Reusable by every stream at once; its chunks go back only at a
		// synchronize ordered after the free.
		b.free = true
		p.cover(b.addr, b.size, false)
		p.tagChunks(b.addr, b.size, tag)
		p.insertReady(b)
		return nil
	}
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
			p.cover(b.addr, b.size, false)
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
