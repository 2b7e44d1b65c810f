package policies

import (
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// Following a PyTorch snapshot (policies.Follower): what the recording says
// of the real allocator's path that the requests and frees alone do not.
//
// Late frees. A block used on other streams (record_stream) is freed when
// the events recorded on them complete: the real allocator takes such
// blocks back at the start of a malloc (process_events), or, when that
// malloc's device allocation is refused, at the synchronization before its
// retry (synchronize_and_free_events), after its search of the pool has
// failed. Their free_completed entries stand, either way, right before the
// malloc's own entries, so FreeLate stages them; the next malloc takes
// them back before its search, unless it will retry (no cached block fits
// without them, and a new segment would pass the capacity even after
// garbage collection and freeing oversize blocks) and the recording shows
// the retry's releases before the malloc or the retry would release
// nothing: then its retry's synchronization takes them back.
//
// Explicit releases. A run of segment frees (or unmaps) that the policy's
// own malloc does not make at that point was torch.cuda.empty_cache(): a
// malloc after them that finds a cached block, or that needs no retry
// (and no garbage collection, and no freeing of oversize blocks), or any
// other call after them, was preceded by one. Follow counts them; the next
// call decides, and an explicit one is made before it (synchronizing
// first, as empty_cache does). Where the recording's stacks say so (a
// release labelled trace.ReleaseByEmptyCache), it was one whatever the
// malloc after it: one that would retry without it did not (the retries
// counted are the real allocator's).

// Follow counts the source's segment frees and unmaps; see the comment at
// the top of pytorch_follow.go.
func (p *PyTorch) Follow(ev trace.Event) {
	switch ev.Op {
	case trace.OpSegmentFree, trace.OpSegmentUnmap:
		p.releasesSeen++
		if ev.Label == trace.ReleaseByEmptyCache {
			p.explicitSeen = true
		}
	case trace.OpSegmentAlloc, trace.OpSegmentMap:
		p.segSeen = true
	}
}

// Inferred returns the number of mallocs for which the recording shows a
// new segment where the simulated pool had a cached block that fits, and
// what the last was (Inferrer): the replay parts from the recording
// there, and the note says what the snapshot does not show.
func (p *PyTorch) Inferred() (int64, string) { return p.inferred, p.lastInferred }

// noteCached notes a malloc that the recording served with a new segment
// (or mapped pages) while the simulation found the cached block b.
func (p *PyTorch) noteCached(b *ptBlock) {
	p.inferred++
	p.lastInferred = fmt.Sprintf("the recording shows a new segment for this malloc where the simulated pool had a cached block of %d bytes at %#x that fits: the malloc went to a private pool the snapshot does not tell apart (a CUDA graph capture's or a MemPool's, its segments freed before the dump), or the pools' states differ here", b.size, b.addr)
}

// FreeLate takes back the block at addr at the next malloc (or its retry's
// synchronization), as a late free_completed. It returns an error if addr
// is not an allocated block.
func (p *PyTorch) FreeLate(addr, stream uint64) error {
	if addr == 0 {
		return nil // the null pointer of a 0-byte malloc, as in Free
	}
	if p.releasesSeen > 0 {
		if err := p.settle(); err != nil {
			return err
		}
	}
	b := p.active.take(addr)
	if b == nil {
		return fmt.Errorf("pytorch: free of %#x on stream %#x: not an allocated block", addr, stream)
	}
	p.staged = append(p.staged, b) // allocated until taken back
	return nil
}

// Flush takes back the staged late frees and makes the explicit
// empty_cache that releases seen last imply.
func (p *PyTorch) Flush() error { return p.settle() }

// settle is what a call other than a malloc implies: releases seen since
// the last call were an explicit empty_cache (which takes back every late
// free first), and late frees staged were taken back.
func (p *PyTorch) settle() error {
	if p.releasesSeen > 0 {
		return p.EmptyCache()
	}
	p.completeStaged()
	return nil
}

// processEvents decides, at the start of a malloc of rsize bytes (a new
// segment of segSize) on stream in pool, where the staged late frees are
// taken back and whether the releases seen were an explicit empty_cache.
func (p *PyTorch) processEvents(pool *ptPool, stream, rsize, segSize uint64) error {
	if p.explicitSeen {
		p.explicitSeen = false
		return p.EmptyCache() // the stacks say so
	}
	if p.findFreeBlock(pool, stream, rsize) == nil && p.wouldRetry(pool, stream, rsize, segSize) &&
		(p.releasesSeen > 0 || !p.retryReleases()) {
		// Taken back at the retry's synchronization, which also makes
		// the releases seen.
		p.pending = append(p.pending, p.staged...)
		clear(p.staged)
		p.staged = p.staged[:0]
		p.releasesSeen = 0
		return nil
	}
	p.completeStaged()
	if p.releasesSeen == 0 {
		return nil
	}
	p.releasesSeen = 0
	if p.findFreeBlock(pool, stream, rsize) == nil && p.releasesBeforeAlloc(pool, stream, rsize, segSize) {
		return nil // its garbage collection or oversize release makes them
	}
	return p.EmptyCache()
}

// retryReleases reports whether a retry's release_cached_blocks, after the
// synchronization that takes the staged late frees back, would free or
// unmap anything of the default pools: a cached block that is a whole
// segment, or holds a whole page of an expandable one, or a staged block
// that would be one (counted alone, before merging with its neighbours).
// A recording that shows no release before the malloc then proves that the
// malloc did not retry, and so took its late frees back at its start.
func (p *PyTorch) retryReleases() bool {
	for _, b := range p.staged {
		if b.pool.owner == nil && releasable(b) {
			return true
		}
	}
	for _, pool := range [...]*ptPool{&p.large, &p.small} {
		for _, sb := range pool.ordered() {
			if sb.free.appendIf(nil, releasable) != nil {
				return true
			}
		}
	}
	return false
}

// releasable reports whether release_cached_blocks would give back some of
// the free block b: all of it if it is a whole cudaMalloc segment, its
// whole pages in an expandable segment.
func releasable(b *ptBlock) bool {
	if b.seg == nil {
		return !b.isSplit()
	}
	begin := (b.addr - b.seg.base + b.seg.page - 1) / b.seg.page
	end := (b.addr + b.size - b.seg.base) / b.seg.page
	return begin < end
}

// wouldRetry reports whether a malloc that finds no cached block would
// retry: a new segment passes the capacity even after garbage collection
// and the freeing of oversize blocks.
func (p *PyTorch) wouldRetry(pool *ptPool, stream, rsize, segSize uint64) bool {
	if p.capacity == 0 {
		return false
	}
	var gc []*ptBlock
	reserved := p.reserved
	if p.gcPoint() {
		gc = p.gcPlan()
		for _, b := range gc {
			reserved -= b.size
		}
	}
	if p.fits(reserved, segSize) {
		return false
	}
	ra, ok := p.releaseAvailablePlan(pool, stream, rsize, gc)
	for _, b := range ra {
		reserved -= b.size
	}
	return !ok || !p.fits(reserved, segSize)
}

// releasesBeforeAlloc reports whether a malloc that finds no cached block
// frees cached segments before any retry: by garbage collection, or by
// freeing oversize blocks when the new segment passes the capacity.
func (p *PyTorch) releasesBeforeAlloc(pool *ptPool, stream, rsize, segSize uint64) bool {
	if p.gcPoint() && len(p.gcPlan()) > 0 {
		return true
	}
	if p.fits(p.reserved, segSize) {
		return false
	}
	ra, _ := p.releaseAvailablePlan(pool, stream, rsize, nil)
	return len(ra) > 0
}

// completeStaged and completePending take back late frees.
func (p *PyTorch) completeStaged() {
	for k, b := range p.staged {
		p.staged[k] = nil
		p.freeBlock(b)
	}
	p.staged = p.staged[:0]
}

func (p *PyTorch) completePending() {
	for k, b := range p.pending {
		p.pending[k] = nil
		p.freeBlock(b)
	}
	p.pending = p.pending[:0]
}
