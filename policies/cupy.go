package policies

import (
	"errors"
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// CuPy is the memory pool of CuPy, its SingleDeviceMemoryPool, as CuPy
// 14.2.0 runs it (cupy/cupy, cupy/cuda/memory.pyx: SingleDeviceMemoryPool,
// _Arena and _Chunk).
//
// Requests are rounded up to a multiple of 512 B (CuPy's allocation unit).
// The free chunks are kept per stream, in an arena for each: a malloc
// looks in its own stream's arena only, for the smallest free chunk that
// holds it; it takes the front of that chunk, and the rest, a chunk of its
// own, goes back to the arena. CuPy orders free chunks of one size by the
// address of their Python objects, which no trace shows: the policy takes
// the chunk it made first (on the H200 recordings of testdata/cupy closer
// to CuPy's choice than the lowest address), and replaying a recording as
// recorded it takes the chunk the recording names when that one is among
// the smallest (TieFollower). When the arena has no chunk
// that fits, the pool allocates a device segment of exactly the rounded
// size, whose chunks belong to the malloc's stream for their whole life.
// A freed chunk goes back to the arena of the stream that allocated it,
// whichever stream frees it, merged with the free chunks beside it in the
// same device segment.
//
// A device segment is given back only when all of it is one free chunk,
// and only by free_all_blocks, which gives back every such segment of
// every arena: at empty_cache (CuPy's free_all_blocks()), and when the
// device refuses an allocation. Then the pool gives back its free segments
// and tries again, and once more (CuPy collects Python's garbage before
// it, which frees nothing a trace has not freed); each try again is a
// retry (Retries), and after the third refusal the malloc is an OOM. The
// device's capacity, if it has one, is the pool's limit (set_limit): a
// request larger than the limit is an OOM at once, with nothing given
// back. A malloc of 0 bytes returns the block {0, 0}, whose free does
// nothing.
type CuPy struct {
	dev    Device
	arenas rmmStreams[cupyArena] // by stream, in the order first seen
	// freeBytes is the free bytes of every arena, largest each arena's
	// largest free chunk by its id less one as of the last FreeSpace, and
	// changed the arenas changed since: FreeSpace then costs the arenas
	// that changed, not a pass over every stream's (which made N streams
	// cost N^2).
	freeBytes uint64
	largest   maxTops
	changed   []*cupyArena
	chunks    trace.AddrMap[*cupyChunk]
	made      uint64 // chunks made so far: the next chunk's seq
	retries   int64
	spare     *cupyChunk // recycled chunks, linked through next
	list      []*cupyChunk
	hint      uint64 // the recorded address of the next malloc (FollowTie)
	hinted    bool

	// Following a log (cupy_follow.go): following is set by the first
	// device allocation shown, logAlloc until the malloc it was for;
	// inferred counts the calls inferred, lastInferred says what the
	// last was.
	following, logAlloc bool
	logAddr, logSize    uint64 // the device allocation logged
	inferred            int64
	lastInferred        string
}

// cupyUnit is CuPy's ALLOCATION_UNIT_SIZE in bytes.
const cupyUnit = 512

// cupyArena is the free chunks of one stream, ordered by (size, seq).
type cupyArena struct {
	free    freeTree[*cupyChunk]
	id      int  // in CuPy.arenas.order, plus one
	changed bool // in CuPy.changed
}

// cupyChunk is a run of bytes of one device segment, free (in its arena)
// or allocated, linked to its address neighbours in the segment.
type cupyChunk struct {
	addr, size uint64
	seq        uint64 // the order in which chunks were made
	prev, next *cupyChunk
	arena      *cupyArena
	free       bool
}

var (
	_ Policy      = (*CuPy)(nil)
	_ Releaser    = (*CuPy)(nil)
	_ FreeSpacer  = (*CuPy)(nil)
	_ Counter     = (*CuPy)(nil)
	_ TieFollower = (*CuPy)(nil)
	_ Follower    = (*CuPy)(nil)
	_ Inferrer    = (*CuPy)(nil)
)

func init() {
	register(Info{
		Name:   "cupy",
		Design: "CuPy's memory pool, SingleDeviceMemoryPool of CuPy 14.2.0 (cupy/cuda/memory.pyx)",
	}, func(dev Device, s Settings) (Policy, error) { return NewCuPy(dev, s) })
}

// NewCuPy returns a cupy policy on dev. It has no settings: it returns an
// error for any.
func NewCuPy(dev Device, s Settings) (*CuPy, error) {
	if err := s.Check("cupy"); err != nil {
		return nil, err
	}
	return &CuPy{dev: dev}, nil
}

// Name returns "cupy".
func (p *CuPy) Name() string { return "cupy" }

// Retries returns the number of device allocations tried again after the
// pool gave back its free segments: two for each malloc that ends in an
// OOM after the device refused.
func (p *CuPy) Retries() int64 { return p.retries }

// FreeSpace returns the bytes of the free chunks of every arena and the
// size in bytes of the largest.
func (p *CuPy) FreeSpace() (total, largest uint64) {
	for _, a := range p.changed {
		p.largest.set(a.id-1, a.free.largest())
		a.changed = false
	}
	p.changed = p.changed[:0]
	return p.freeBytes, p.largest.max()
}

// touched notes that arena a's free chunks changed.
func (p *CuPy) touched(a *cupyArena) {
	if !a.changed {
		a.changed = true
		p.changed = append(p.changed, a)
	}
}

// FollowTie gives the recorded address of the next malloc: if a free
// chunk there is one of the smallest that hold it, in its stream's arena,
// the malloc takes that one.
func (p *CuPy) FollowTie(addr uint64) { p.hint, p.hinted = addr, true }

// Malloc places size bytes, rounded up to 512 B, on stream: in a free
// chunk of the stream's arena, or in a new device segment of the rounded
// size. It returns an error wrapping ErrOutOfMemory when the device
// refuses the segment three times, the pool's free segments given back
// between the tries, or at once for a request over the device's capacity.
func (p *CuPy) Malloc(size, stream uint64) (Block, error) {
	defer func() { p.hinted = false }()
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("cupy", size)
	}
	n := ceilToMultiple(size, cupyUnit)
	a := p.arenas.get(stream)
	if a.id == 0 {
		a.id = len(p.arenas.order)
	}
	var c *cupyChunk
	fresh := false
	if p.following {
		var err error
		if fresh, err = p.follow(a, n); err != nil {
			return Block{}, err
		}
	}
	if !fresh {
		c = p.take(a, n)
	}
	if c == nil {
		addr, err := p.alloc(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy cupy: malloc of %d bytes on stream %#x: %w", size, stream, err)
		}
		c = p.newChunk(addr, n, a)
		p.chunks.Put(addr, c)
	}
	return Block{Addr: c.addr, Size: c.size}, nil
}

// take returns the smallest free chunk of arena a that holds n bytes (the
// hinted one among equals, else the one made first), cut to n bytes, the
// rest back in a; nil if none holds n bytes.
func (p *CuPy) take(a *cupyArena, n uint64) *cupyChunk {
	c, ok := a.free.best(n)
	if !ok {
		return nil
	}
	if p.hinted && p.hint != c.addr {
		if h, ok := p.chunks.Get(p.hint); ok && h.free && h.arena == a && h.size == c.size {
			c = h
		} else if ok && p.following && h.free && h.arena == a && h.size >= n {
			p.infer(fmt.Sprintf("the log shows the malloc served from the free chunk at %#x (%d bytes) where the pool's rule takes the one at %#x (%d bytes): that one was in another stream's arena, or given back by a free_all_blocks(); the log records neither", h.addr, h.size, c.addr, c.size))
			c = h
		}
	}
	p.remove(c)
	if c.size > n {
		r := p.newChunk(c.addr+n, c.size-n, a)
		r.prev, r.next = c, c.next
		if c.next != nil {
			c.next.prev = r
		}
		c.next = r
		c.size = n
		p.chunks.Put(r.addr, r)
		p.insert(r)
	}
	return c
}

// alloc allocates a device segment of n bytes, as CuPy's _try_malloc
// does: when the device refuses, it gives back the free segments and
// tries again, twice.
func (p *CuPy) alloc(n uint64) (uint64, error) {
	if c, ok := p.dev.(Capacitor); ok && c.Capacity() > 0 && n > c.Capacity() {
		return 0, fmt.Errorf("%d bytes are more than the limit of %d: %w", n, c.Capacity(), ErrOutOfMemory)
	}
	for try := 0; ; try++ {
		addr, err := p.dev.Alloc(n)
		if err == nil || !errors.Is(err, ErrOutOfMemory) || try == 2 {
			return addr, err
		}
		if err := p.freeAll(); err != nil {
			return 0, err
		}
		p.retries++
	}
}

// Free returns the chunk at addr to the arena of the stream that
// allocated it, merged with the free chunks beside it. It returns an
// error if addr is not a live block.
func (p *CuPy) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	c, ok := p.chunks.Get(addr)
	if !ok || c.free {
		return fmt.Errorf("policy cupy: free of %#x: not a live block", addr)
	}
	for nx := c.next; nx != nil && nx.free; nx = c.next {
		p.remove(nx)
		c.size += nx.size
		p.drop(nx)
	}
	for pv := c.prev; pv != nil && pv.free; pv = c.prev {
		p.remove(pv)
		pv.size += c.size
		p.drop(c)
		c = pv
	}
	p.insert(c)
	return nil
}

// EmptyCache is CuPy's free_all_blocks(): every device segment that is one
// free chunk goes back to the device.
func (p *CuPy) EmptyCache() error { return p.freeAll() }

// freeAll gives back every device segment that is one free chunk, arena
// by arena in the order the streams were first seen.
func (p *CuPy) freeAll() error {
	for _, a := range p.arenas.order {
		p.list = a.free.appendAll(p.list[:0])
		for _, c := range p.list {
			if c.prev != nil || c.next != nil {
				continue // part of a segment in use
			}
			if err := p.dev.Free(c.addr); err != nil {
				return fmt.Errorf("policy cupy: %w", err)
			}
			p.remove(c)
			p.chunks.Delete(c.addr)
			p.recycle(c)
		}
	}
	clear(p.list)
	return nil
}

// insert puts chunk c, free, into its arena.
func (p *CuPy) insert(c *cupyChunk) {
	c.free = true
	c.arena.free.insert(c.size, c.seq, c)
	p.freeBytes += c.size
	p.touched(c.arena)
}

// remove takes free chunk c out of its arena: it is allocated, or about
// to change.
func (p *CuPy) remove(c *cupyChunk) {
	c.free = false
	c.arena.free.delete(c.size, c.seq)
	p.freeBytes -= c.size
	p.touched(c.arena)
}

// drop unlinks chunk c, merged into its previous neighbour, and recycles
// it.
func (p *CuPy) drop(c *cupyChunk) {
	if c.prev != nil {
		c.prev.next = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	p.chunks.Delete(c.addr)
	p.recycle(c)
}

// newChunk returns a new allocated chunk of size bytes at addr in arena a.
func (p *CuPy) newChunk(addr, size uint64, a *cupyArena) *cupyChunk {
	c := p.spare
	if c != nil {
		p.spare = c.next
		*c = cupyChunk{}
	} else {
		c = new(cupyChunk)
	}
	c.addr, c.size, c.arena, c.seq = addr, size, a, p.made
	p.made++
	return c
}

func (p *CuPy) recycle(c *cupyChunk) {
	*c = cupyChunk{next: p.spare}
	p.spare = c
}
