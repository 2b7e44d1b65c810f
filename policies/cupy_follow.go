package policies

import (
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// Following a CuPy log (policies.Follower). DebugPrintHook logs each
// device allocation of the pool ("alloc": trace.OpSegmentAlloc, right
// before the malloc that made it) and the address of each malloc, but
// none of the pool's device frees: a free_all_blocks() of the program
// (cupy.get_default_memory_pool().free_all_blocks()) is not in the log,
// and neither is the stream of a malloc, whose arena CuPy searches alone.
// So where the log parts from the pool's own rule, replaying it as
// recorded follows the log and notes it (Inferred), naming the malloc:
//
//   - A malloc that the log shows making a device allocation takes a new
//     segment, whether or not a free chunk fits it: the real pool had none
//     in the malloc's arena (another stream's arena, or chunks given back
//     by a free_all_blocks()). Where the new segment's recorded address
//     lies in a segment the simulated pool holds free, that segment was
//     given back before: a free_all_blocks() is made first (every segment
//     that is one free chunk given back).
//   - A malloc that the log shows served from a free chunk other than the
//     one the rule takes (not one of equal size, which is a tie:
//     TieFollower) takes the recorded chunk, when it is free and holds
//     it: the rule's chunk was in another stream's arena, or given back.
//   - A malloc that the log shows served from the pool while the
//     simulated pool has no free chunk that fits cannot be followed: it is
//     noted, and a fidelity check reports the divergence there.
//
// A free_all_blocks() is thus made only where an address shows it, and
// later than the program called it: the segments it gave back count as
// reserved in the meantime.

// Follow notes a device allocation of the log: the next malloc made it.
func (p *CuPy) Follow(ev trace.Event) {
	if ev.Op == trace.OpSegmentAlloc {
		p.following, p.logAlloc = true, true
		p.logAddr, p.logSize = ev.Addr, ev.Size
	}
}

// FreeLate is Free: a CuPy log has no late frees.
func (p *CuPy) FreeLate(addr, stream uint64) error { return p.Free(addr, stream) }

// Flush does nothing: a release at the end of a log shows in nothing.
func (p *CuPy) Flush() error { return nil }

// Inferred returns the number of calls the log does not show that the
// policy inferred so far, and what the last was (Inferrer).
func (p *CuPy) Inferred() (int64, string) { return p.inferred, p.lastInferred }

// follow decides, at a malloc of n bytes (rounded) into arena a while
// following a log, what the log's device allocation (or its absence)
// implies; fresh reports that the malloc must take a new segment.
func (p *CuPy) follow(a *cupyArena, n uint64) (fresh bool, err error) {
	logAlloc := p.logAlloc
	p.logAlloc = false
	fits := a.free.largest() >= n
	if !logAlloc {
		if !fits {
			p.infer("the log shows the malloc served from the pool where the simulated pool holds no free chunk that fits: the pool's state differs from the real one's here")
		}
		return false, nil
	}
	if held := p.freeSegmentIn(p.logAddr, p.logSize); held != 0 {
		before := p.segmentsFree()
		if err := p.freeAll(); err != nil {
			return false, err
		}
		p.infer(fmt.Sprintf("the device gave the malloc's new segment an address in the segment at %#x, which the pool held free: free_all_blocks() inferred before it (%d free segments given back), which DebugPrintHook does not log", held, before))
		fits = a.free.largest() >= n
	}
	if fits {
		p.infer("the log shows a device allocation where the pool held a free chunk that fits: the malloc came from another stream's arena, or the chunk was given back by a free_all_blocks(); the log records neither")
	}
	return true, nil
}

// freeSegmentIn returns the address of a segment that is one free chunk
// and overlaps [addr, addr+size), 0 if none.
func (p *CuPy) freeSegmentIn(addr, size uint64) uint64 {
	for _, a := range p.arenas.order {
		p.list = a.free.appendAll(p.list[:0])
		for _, c := range p.list {
			if c.prev == nil && c.next == nil && c.addr < addr+size && addr < c.addr+c.size {
				clear(p.list)
				return c.addr
			}
		}
	}
	clear(p.list)
	return 0
}

// Releasable appends the segments that are one free chunk to dst: what
// free_all_blocks() would give back now (policies.Releasable).
func (p *CuPy) Releasable(dst []Block) []Block {
	for _, a := range p.arenas.order {
		p.list = a.free.appendAll(p.list[:0])
		for _, c := range p.list {
			if c.prev == nil && c.next == nil {
				dst = append(dst, Block{Addr: c.addr, Size: c.size})
			}
		}
	}
	clear(p.list)
	return dst
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
