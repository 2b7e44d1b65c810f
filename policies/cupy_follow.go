package policies

import (
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// Following a CuPy log (policies.Follower). DebugPrintHook logs each
// device allocation of the pool ("alloc": trace.OpSegmentAlloc, right
// before the malloc that made it) but none of its device frees: a
// free_all_blocks() of the program (cupy.get_default_memory_pool()
// .free_all_blocks(), or cupy.fft's plan cache and others calling it) is
// not in the log, and neither is the stream of a malloc. What the log does
// show is where the pool went to the device:
//
//   - A malloc whose log shows a device allocation, while the simulated
//     pool holds a free chunk that fits it, was preceded by a release the
//     log does not show: free_all_blocks() is made before it (every
//     segment that is one free chunk given back), noted as inferred. The
//     log cannot tell this from a malloc on another stream whose arena
//     lacked the chunk, and the note says so.
//   - If a chunk still fits after that (a free part of a segment in use),
//     the real pool looked in another arena: the malloc came from another
//     stream, which the log does not record. The malloc takes a new
//     segment, as the log shows, noted as inferred.
//   - A malloc whose log shows no device allocation while the simulated
//     pool has no free chunk that fits it cannot be explained; it is noted
//     too (the simulation then allocates, and a fidelity check reports the
//     divergence).
//
// The release may have come earlier than the malloc that shows it (at any
// point after the last malloc the released segments could have served):
// segments that became free between the two are given back as well, which
// a later malloc served from one of them in the log would show.

// Follow notes a device allocation of the log: the next malloc made it.
func (p *CuPy) Follow(ev trace.Event) {
	if ev.Op == trace.OpSegmentAlloc {
		p.following, p.logAlloc = true, true
	}
}

// FreeLate is Free: a CuPy log has no late frees.
func (p *CuPy) FreeLate(addr, stream uint64) error { return p.Free(addr, stream) }

// Flush does nothing: a release at the end of a log shows in nothing.
func (p *CuPy) Flush() error { return nil }

// Inferred returns the number of calls the log does not show that the
// policy inferred so far, and what the last was (Inferrer).
func (p *CuPy) Inferred() (int64, string) { return p.inferred, p.lastInferred }

// follow decides, at a malloc of n bytes (rounded) on stream into arena a
// while following a log, what the log's device allocation (or its
// absence) implies; fresh reports that the malloc must take a new segment.
func (p *CuPy) follow(a *cupyArena, n uint64) (fresh bool, err error) {
	logAlloc := p.logAlloc
	p.logAlloc = false
	fits := a.free.largest() >= n
	switch {
	case logAlloc && fits:
		before := p.segmentsFree()
		if err := p.freeAll(); err != nil {
			return false, err
		}
		if a.free.largest() < n {
			p.infer(fmt.Sprintf("the log shows a device allocation where the pool held a free chunk that fits: free_all_blocks() inferred before it (%d free segments given back), which DebugPrintHook does not log (or the malloc came from another stream's arena, which it does not record either)", before))
			return false, nil
		}
		p.infer(fmt.Sprintf("the log shows a device allocation where the pool held a free chunk that fits, in a segment in use: the malloc came from another stream's arena, which the log does not record (%d free segments given back first)", before))
		return true, nil
	case !logAlloc && !fits:
		p.infer("the log shows no device allocation where the pool held no free chunk that fits: the pool's state differs from the real one's here")
	}
	return false, nil
}

// segmentsFree counts the segments that are one free chunk.
func (p *CuPy) segmentsFree() int {
	n := 0
	for _, a := range p.arenas.order {
		p.list = a.free.appendAll(p.list[:0])
		for _, c := range p.list {
			if c.prev == nil && c.next == nil {
				n++
			}
		}
	}
	clear(p.list)
	return n
}

func (p *CuPy) infer(what string) {
	p.inferred++
	p.lastInferred = what
}
