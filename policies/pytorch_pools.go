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
// segments is left; until then its segments stay, however long unused. A
// MemPool's deletion empties its own cache at once (EmptyPool), and
// torch.compile's cudagraph trees set a pool's checkpointed blocks back in
// place before they record a new graph (RestoreBlock).

// ptPrivate is a private pool (PrivatePool).
type ptPrivate struct {
	id           uint32
	large, small ptPool
	released     bool // in freeable
	// restored is the block a checkpoint restore set back last, nil when
	// none is under way (RestoreBlock).
	restored *ptBlock
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
	pp.restored = nil
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

// RestoreBlock sets a block of size bytes (a multiple of 512, the
// block's whole size) of private pool id back in place, as
// setSegmentStateToCheckpoint does when torch.compile's cudagraph trees
// restore a pool's checkpointed state: every block of each checkpointed
// segment is allocated, in address order, and the free ones then freed.
// The block is the one right after the block restored before it, when
// that one did not end its segment; else the first block of the smallest
// of the pool's segments (small or large) whose memory is all free and
// holds size bytes, the lowest address among equals. The rest of the
// segment is split off whenever there is any. Replaying a recording as
// recorded (FollowTie), a segment's first block is the one at the
// recorded address when it is free and holds size bytes (a segment all
// free, or a mapped block of an expandable segment): the checkpoint names
// its segments by address, which the trace shows only there. When there is no such
// block (a pool not yet malloced into, an expandable segment), it is
// MallocPool. It returns the errors MallocPool does.
func (p *PyTorch) RestoreBlock(size, stream uint64, id uint32) (Block, error) {
	if p.releasesSeen > 0 || len(p.staged) > 0 {
		if err := p.settle(); err != nil {
			return Block{}, err
		}
	}
	pp := p.pools[id]
	if pp == nil || size == 0 || size%ptMinBlockSize != 0 {
		return p.MallocPool(size, stream, id)
	}
	hinted := p.restoreHinted
	p.restoreHinted = false
	var b *ptBlock
	if last := pp.restored; last != nil && last.allocated && last.next != nil && !last.next.allocated && !last.next.unmapped && last.next.size >= size {
		b = last.next
	} else {
		if hinted {
			b = pp.wholeFreeAt(p.restoreHint, size)
		}
		if b == nil {
			b = pp.smallestWholeFree(size)
		}
	}
	if b == nil {
		pp.restored = nil
		return p.MallocPool(size, stream, id)
	}
	p.removeFree(b)
	if b.size > size {
		b = p.splitOff(b, size)
	}
	b.allocated = true
	p.active.put(b.addr, b)
	pp.restored = b
	return Block{Addr: b.addr, Size: b.size}, nil
}

// EmptyPool frees the cached segments of private pool id that are not
// split, its small pool's before its large one's (release_cached_blocks
// of a MemPool's id, which its deletion makes), and forgets the pool when
// it is released and none is left. Following a recording, the source's
// segment frees seen right before it are this one's, not an empty_cache's.
// It returns the device's error for a free that fails.
func (p *PyTorch) EmptyPool(id uint32) error {
	pp := p.pools[id]
	if pp == nil {
		return nil
	}
	allocs := pp.devAllocs
	if err := p.releasePools(&pp.small, &pp.large); err != nil {
		return err
	}
	p.releasesSeen = max(p.releasesSeen-(allocs-pp.devAllocs), 0)
	if pp.released && pp.devAllocs == 0 {
		p.unfree(pp)
		delete(p.pools, id)
	}
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

// FollowTie gives the recorded address of the next malloc (TieFollower).
// Only a checkpoint restore's first block of a segment follows it
// (RestoreBlock); the searches of Malloc decide by their own rules.
func (p *PyTorch) FollowTie(addr uint64) { p.restoreHint, p.restoreHinted = addr, true }

// wholeFreeAt returns the free block at addr of pp of at least size
// bytes that is a whole segment (not split), or a mapped block of an
// expandable segment; nil if none.
func (pp *ptPrivate) wholeFreeAt(addr, size uint64) *ptBlock {
	for _, pl := range [...]*ptPool{&pp.small, &pp.large} {
		for _, sb := range pl.ordered() {
			for c := sb.free.lowerBound(size); c != nil; c = sb.free.successor(c) {
				if c.addr == addr && !c.unmapped && (c.seg != nil || !c.isSplit()) {
					return c
				}
			}
		}
	}
	return nil
}

// smallestWholeFree returns the smallest free block of pp that is a whole
// segment (not split) of at least size bytes, the lowest address among
// equals; nil if none.
func (pp *ptPrivate) smallestWholeFree(size uint64) *ptBlock {
	var b *ptBlock
	for _, pl := range [...]*ptPool{&pp.small, &pp.large} {
		for _, sb := range pl.ordered() {
			for c := sb.free.lowerBound(size); c != nil; c = sb.free.successor(c) {
				if c.isSplit() || c.seg != nil {
					continue
				}
				if b == nil || c.size < b.size || c.size == b.size && c.addr < b.addr {
					b = c
				}
				break
			}
		}
	}
	return b
}
