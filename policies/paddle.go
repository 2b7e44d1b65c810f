package policies

import (
	"errors"
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// Paddle is a simulation of PaddlePaddle's default GPU allocator, the
// auto-growth best-fit allocator (PaddlePaddle/Paddle
// paddle/phi/core/memory/allocation/auto_growth_best_fit_allocator.cc, with
// the stream-safe wrapper of stream_safe_cuda_allocator.cc and the
// construction of allocator_facade.cc under FLAGS_allocator_strategy=
// auto_growth).
//
// Each request is rounded up to the alignment (256 B, GpuMinChunkSize). The
// free blocks are ordered by (size, address) and a malloc takes the
// smallest one that is large enough, the lowest address among equal sizes
// (best fit across every chunk of the pool). A larger block is split: the
// allocation is cut from its high end and the low part stays free. With no
// fitting block the pool grows by a chunk, a device allocation of
// max(request, chunk_size) bytes with no further rounding (chunk_size is 0
// by default, so a chunk is the aligned request itself); the allocation
// takes the chunk's high end. A freed block merges with its free
// neighbours in its chunk. Chunks that are wholly free (idle) stay cached
// and are given back to the device when asked (EmptyCache, as
// paddle.device.cuda.empty_cache()) and when the device refuses a chunk.
//
// Streams: Paddle's stream-safe allocator gives every stream an allocator
// of its own (per_stream), so a block is reused only by the stream it was
// allocated on; a free, on whatever stream, returns the block to its own
// stream's pool (the trace's free is the completed free). When the device
// refuses a chunk the pool gives back its own idle chunks and tries again;
// if refused again, every stream's pool gives back its idle chunks and the
// device is tried once more; each new attempt after a release is a retry
// (see Retries). Then the malloc is an OOM (Paddle's retry allocator would
// wait for frees from other threads, which a replay has none of). A malloc
// of 0 bytes returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets, Paddle's flag in parentheses):
//   - alignment [256]: requests are rounded up to a multiple of it, from
//     1 B to 2 MiB.
//   - chunk_size [0]: the smallest chunk asked of the device
//     (FLAGS_auto_growth_chunk_size_in_mb, here in bytes).
//   - allow_free_idle_chunk [true]: idle chunks may be given back at all.
//   - free_idle_chunk [false]: give idle chunks back at every free
//     (FLAGS_free_idle_chunk).
//   - free_when_no_cache_hit [false]: give the pool's idle chunks back
//     before every growth, and give up on the pool's own retry
//     (FLAGS_free_when_no_cache_hit).
//   - per_stream [true]: one pool per stream (FLAGS_use_stream_safe_cuda_allocator);
//     false shares one pool among all streams.
type Paddle struct {
	dev                Device
	alignment          uint64
	chunkSize          uint64
	allowFreeIdle      bool
	freeWhenNoCacheHit bool
	perStream          bool
	freeIdleChunk      bool

	pools    []*paddlePool
	byStream map[uint64]*paddlePool
	last     *paddlePool // the pool of the last malloc or free
	retries  int64

	// live are the allocated blocks of every pool, with their pool, so
	// that a free on another stream than its block's finds it at once;
	// free is the free bytes of every pool, tops their largest blocks.
	live trace.AddrMap[paddleLive]
	free uint64
	tops maxTops
}

// paddleLive is an allocated block and its pool.
type paddleLive struct {
	b  *flBlock
	pl *paddlePool
}

// paddlePool is the auto-growth best-fit allocator of one stream: the
// coalescing free list of freelist.go (best fit by size, then address)
// with Paddle's own split and growth.
type paddlePool struct {
	stream uint64
	c      coalescing
	index  int    // in Paddle.pools
	free   uint64 // c's free bytes when last counted in Paddle.free
}

// counted counts pool pl's free bytes and largest free block again in
// p.free and p.tops, after a change.
func (p *Paddle) counted(pl *paddlePool) {
	total, largest := pl.c.FreeSpace()
	p.free = p.free - pl.free + total
	pl.free = total
	p.tops.set(pl.index, largest)
}

var (
	_ Policy     = (*Paddle)(nil)
	_ Releaser   = (*Paddle)(nil)
	_ FreeSpacer = (*Paddle)(nil)
	_ Counter    = (*Paddle)(nil)
)

func init() {
	register(Info{
		Name:   "paddle",
		Design: "PaddlePaddle's auto-growth best-fit allocator (paddle/phi/core/memory/allocation/auto_growth_best_fit_allocator.cc)",
		Settings: []Setting{
			{Key: "alignment", Default: "256", Doc: "requests are rounded up to a multiple of it, in bytes, from 1 B to 2 MiB"},
			{Key: "chunk_size", Default: "0", Doc: "the smallest chunk asked of the device, in bytes (FLAGS_auto_growth_chunk_size_in_mb)"},
			{Key: "allow_free_idle_chunk", Default: "true", Doc: "idle chunks may be given back to the device at all"},
			{Key: "free_idle_chunk", Default: "false", Doc: "give idle chunks back at every free (FLAGS_free_idle_chunk)"},
			{Key: "free_when_no_cache_hit", Default: "false", Doc: "give the pool's idle chunks back before every growth, without the pool's own retry (FLAGS_free_when_no_cache_hit)"},
			{Key: "per_stream", Default: "true", Doc: "one pool per stream (FLAGS_use_stream_safe_cuda_allocator); false: one pool for all streams"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewPaddle(dev, s) })
}

// NewPaddle returns a paddle policy on dev. It returns an error naming the
// key for an unknown or malformed setting.
func NewPaddle(dev Device, s Settings) (*Paddle, error) {
	const name = "paddle"
	if err := s.Check(name, "alignment", "allow_free_idle_chunk", "chunk_size", "free_idle_chunk",
		"free_when_no_cache_hit", "per_stream"); err != nil {
		return nil, err
	}
	align, err := s.Bytes(name, "alignment", 256)
	if err != nil {
		return nil, err
	}
	if align == 0 || align > deviceGranularity {
		return nil, invalidSettingf(name, s, "alignment", "must be from 1 B to 2 MiB")
	}
	chunk, err := s.Bytes(name, "chunk_size", 0)
	if err != nil {
		return nil, err
	}
	if chunk > maxRequest {
		return nil, invalidSettingf(name, s, "chunk_size", "must be at most 4 EiB")
	}
	p := &Paddle{dev: dev, alignment: align}
	// The allocator's chunk_size_: at least one alignment unit.
	p.chunkSize = max(ceilToMultiple(chunk, align), align)
	for _, b := range []struct {
		key string
		def bool
		v   *bool
	}{
		{"allow_free_idle_chunk", true, &p.allowFreeIdle},
		{"free_idle_chunk", false, &p.freeIdleChunk},
		{"free_when_no_cache_hit", false, &p.freeWhenNoCacheHit},
		{"per_stream", true, &p.perStream},
	} {
		if *b.v, err = s.Bool(name, b.key, b.def); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Name returns "paddle".
func (p *Paddle) Name() string { return "paddle" }

// Retries returns the number of device allocations tried again after
// idle chunks were given back.
func (p *Paddle) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes in the chunks of every pool and the
// size in bytes of the largest free block.
func (p *Paddle) FreeSpace() (total, largest uint64) {
	return p.free, p.tops.max()
}

// pool returns the pool of stream; if there is none, a new one when
// create is set, else nil.
func (p *Paddle) pool(stream uint64, create bool) *paddlePool {
	if !p.perStream {
		stream = 0
	}
	if p.last != nil && p.last.stream == stream {
		return p.last
	}
	if pl := p.byStream[stream]; pl != nil {
		p.last = pl
		return pl
	}
	if !create {
		return nil
	}
	pl := &paddlePool{stream: stream, c: coalescing{
		name:      "paddle",
		dev:       p.dev,
		bestFit:   true,
		alignment: p.alignment,
		release:   p.freeIdleChunk && p.allowFreeIdle,
	}}
	pl.index = len(p.pools)
	p.pools = append(p.pools, pl)
	if p.byStream == nil {
		p.byStream = map[uint64]*paddlePool{}
	}
	p.byStream[stream] = pl
	p.last = pl
	return pl
}

// Malloc places size bytes, rounded up to the alignment, at the high end of
// the best-fitting free block of the stream's pool, or of a new chunk. It
// returns an error wrapping ErrOutOfMemory when the device refuses the
// chunk even after every idle chunk was given back.
func (p *Paddle) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("paddle", size)
	}
	n := ceilToMultiple(size, p.alignment)
	pl := p.pool(stream, true)
	c := &pl.c
	b, ok := c.free.takeBest(n)
	if !ok {
		var err error
		if b, err = p.grow(pl, n); err != nil {
			p.counted(pl)
			return Block{}, fmt.Errorf("policy paddle: malloc of %d bytes: %w", size, err)
		}
	} else {
		if b.size > n {
			// The low part stays free, at its address, with its new size.
			a := c.newBlock(b.addr+b.size-n, n, b.seg)
			c.linkAfter(b, a)
			b.size -= n
			c.insert(b)
			b = a
		}
		c.freeBytes -= n
	}
	b.free = false
	p.live.Put(b.addr, paddleLive{b, pl})
	p.counted(pl)
	return Block{Addr: b.addr, Size: n}, nil
}

// grow adds a chunk of max(n, chunk_size) bytes to pool pl and returns its
// high n bytes as an allocated block, not yet in the live map; the rest of
// the chunk, below it, is a free block.
func (p *Paddle) grow(pl *paddlePool, n uint64) (*flBlock, error) {
	c := &pl.c
	size := max(n, p.chunkSize)
	if p.freeWhenNoCacheHit {
		if _, err := p.freeIdle(pl); err != nil {
			return nil, err
		}
	}
	addr, err := p.dev.Alloc(size)
	if err != nil && errors.Is(err, ErrOutOfMemory) && !p.freeWhenNoCacheHit {
		// The pool's own FreeIdleChunks, then one more try.
		addr, err = p.retry(size, err, func() (int, error) { return p.freeIdle(pl) })
	}
	if err != nil && errors.Is(err, ErrOutOfMemory) {
		// The stream-safe wrapper: every stream's idle chunks, then one
		// more try.
		addr, err = p.retry(size, err, func() (int, error) {
			n := 0
			for _, q := range p.pools {
				k, err := p.freeIdle(q)
				n += k
				if err != nil {
					return n, err
				}
			}
			return n, nil
		})
	}
	if err != nil {
		return nil, err
	}
	s := &flSegment{addr: addr, size: size, index: len(c.segments)}
	c.segments = append(c.segments, s)
	b := c.newBlock(addr+size-n, n, s)
	s.first = b
	if rest := size - n; rest > 0 {
		f := c.newBlock(addr, rest, s)
		c.linkBefore(b, f)
		c.insert(f)
		c.freeBytes += rest
	}
	return b, nil
}

// retry calls release and, if it gave anything back, tries the device
// allocation of size bytes once more (a retry). Otherwise it returns the
// refusal err.
func (p *Paddle) retry(size uint64, err error, release func() (int, error)) (uint64, error) {
	released, rerr := release()
	if rerr != nil {
		return 0, rerr
	}
	if released == 0 {
		return 0, err
	}
	p.retries++
	return p.dev.Alloc(size)
}

// freeIdle is FreeIdleChunks: it gives the idle chunks of pool pl back to
// the device, unless allow_free_idle_chunk is off, and reports how many.
func (p *Paddle) freeIdle(pl *paddlePool) (int, error) {
	if !p.allowFreeIdle {
		return 0, nil
	}
	n, err := pl.c.releaseFree()
	p.counted(pl)
	return n, err
}

// Free returns the block at addr to its own stream's pool, merged with its
// free neighbours; with free_idle_chunk, a chunk left idle goes back to the
// device. It returns an error if addr is not a live block.
func (p *Paddle) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	// Its own pool, whatever the stream of the free.
	if l, ok := p.live.Take(addr); ok {
		p.last = l.pl
		err := l.pl.c.freeBlock(l.b)
		p.counted(l.pl)
		return err
	}
	return fmt.Errorf("policy paddle: free of %#x: not a live block", addr)
}

// EmptyCache gives every idle chunk of every pool back to the device,
// unless allow_free_idle_chunk is off.
func (p *Paddle) EmptyCache() error {
	for _, pl := range p.pools {
		if _, err := p.freeIdle(pl); err != nil {
			return err
		}
	}
	return nil
}
