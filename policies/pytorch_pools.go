package policies

import "fmt"

// Private pools, following CUDACachingAllocator.cpp's PrivatePool,
// beginAllocateToPool, get_pool, releasePool and release_cached_blocks
// (PyTorch 2.11). While a CUDA graph is captured, the allocations of its
// capture go to the graph's private pool (torch.cuda.graph's pool=,
// graph_pool_handle() and torch.compile's cudagraph trees share one pool
// between captures), and inside torch.cuda.use_mem_pool to the MemPool's:
// a pool has its own small and large pools, with segments of their own,
// searched and split by the same rules as the default ones and never
// reused across pools. Its mallocs do not free every cached segment and
// retry when the device refuses (release_cached_blocks is skipped while a
// capture is under way): they fail at once. Garbage collection never
// touches a private pool. Once no graph uses a pool (or its MemPool is
// deleted: releasePool), each release (empty_cache, or a retry's) frees its
// cached segments that are not split, the small pool's before the large
// one's, after the default pools', and forgets the pool once none of its
// segments is left; until then its segments stay, however long unused.

// ptPrivate is a private pool (PrivatePool).
type ptPrivate struct {
	id           uint32
	large, small ptPool
	released     bool // in freeable
	// devAllocs counts its device allocations not freed: segments and
	// mapped pages of expandable segments (cudaMalloc_count).
	devAllocs int
}

// MallocPool is Malloc into private pool id, created by its first malloc.
// It returns the errors Malloc does, and an error for pool 0 (the default
// pools, which Malloc serves).
func (p *PyTorch) MallocPool(size, stream uint64, id uint32) (Block, error) {
	if id == 0 {
		return Block{}, fmt.Errorf("pytorch: malloc of %d bytes into pool 0: the default pools are no private pool", size)
	}
	pp := p.pools[id]
	if pp == nil {
		if p.pools == nil {
			p.pools = map[uint32]*ptPrivate{}
		}
		pp = &ptPrivate{id: id}
		for _, pl := range [...]*ptPool{&pp.large, &pp.small} {
			pl.owner = pp
			pl.page = ptLargeBuffer
		}
		pp.small.small = true
		pp.small.page = ptSmallBuffer
		p.pools[id] = pp
	} else if pp.released {
		// A new capture into a pool no graph used any more.
		p.unfree(pp)
	}
	return p.malloc(size, stream, pp)
}

// ReleasePool makes private pool id freeable: no graph uses it any more
// (releasePool), or its MemPool was deleted. Its cached segments are freed
// at the next release. A pool never malloced into, or released already,
// is left as it is. Following a recording, it first makes the
// empty_cache that the source's releases seen before it imply, and
// returns the device's error if that fails.
func (p *PyTorch) ReleasePool(id uint32) error {
	if p.releasesSeen > 0 {
		// The releases seen were an empty_cache before it.
		if err := p.settle(); err != nil {
			return err
		}
	}
	pp := p.pools[id]
	if pp == nil || pp.released {
		return nil
	}
	pp.released = true
	p.freeable = append(p.freeable, pp)
	return nil
}

// unfree takes pp out of the freeable pools.
func (p *PyTorch) unfree(pp *ptPrivate) {
	pp.released = false
	for i, f := range p.freeable {
		if f == pp {
			p.freeable = append(p.freeable[:i], p.freeable[i+1:]...)
			return
		}
	}
}

// releaseFreeable is release_cached_blocks' part for the private pools no
// graph uses: in the order of their release, each one's small and large
// cached segments are freed, and a pool left without device allocations
// is forgotten.
func (p *PyTorch) releaseFreeable() error {
	kept := p.freeable[:0]
	for _, pp := range p.freeable {
		if err := p.releasePools(&pp.small, &pp.large); err != nil {
			return err
		}
		if pp.devAllocs == 0 {
			delete(p.pools, pp.id)
			continue
		}
		kept = append(kept, pp)
	}
	clear(p.freeable[len(kept):])
	p.freeable = kept
	return nil
}
