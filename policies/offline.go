package policies

import (
	"container/heap"
	"fmt"
	"slices"

	"github.com/gpualloc/allocsim/trace"
)

// OfflineName is the registry name of the Offline policy, whose peak
// reserved bytes a replay reports beside the lower bound: what a placement
// knowing the future reached (a heuristic's, not the optimum).
const OfflineName = "offline"

// Offline is a clairvoyant placement: it sees the whole trace before the
// replay (it is a Planner), so it knows when each malloc is freed, and
// solves the static placement problem (dynamic storage allocation: give
// each block an offset so that blocks live at the same time never overlap,
// minimizing the highest end) once, before the first malloc. The replay
// then places each malloc at its planned offset inside one device segment
// (the arena) of exactly the planned height, allocated at the first malloc
// of a non-zero size. Its peak reserved bytes are what a placement knowing
// the lifetimes reached, an upper estimate of the optimum, not the optimum
// itself: on MiniMalloc's benchmarks A..K, each solvable in 1048576 bytes,
// it reaches 1.000 (F, H, K) to 1.100 (E) times that (C: 0.991) with the
// default budget (A 1.080 reaches 1.000 with 2000000 nodes); MiniMalloc's
// own search, with more pruning, solves them all. Peak requested live bytes stay the hard lower bound (the two are
// equal when the plan packs perfectly).
//
// The plan is the best of a portfolio: the classic greedy placements (each
// block in turn, in an order by size, by lifetime, by area or by the most
// loaded moment of its lifetime, at the best-fitting gap that the blocks
// already placed and live at the same time leave; see GreedyBySize), then a
// branch-and-bound search for a lower height after the canonical search of
// MiniMalloc (Moffitt, "MiniMalloc: A Lightweight Memory Allocator for
// Hardware-Accelerated Machine Learning", ASPLOS 2023; google/minimalloc):
// blocks in non-decreasing offset order, each at the top of the placed
// blocks it meets, pruned where the blocks left over at some moment cannot
// fit under the height. The search has a node budget, so the plan is
// deterministic and needs no time limit; on a large trace (many blocks live
// at once) it is skipped and the greedy portfolio decides.
//
// The replay must give the policy the mallocs and frees of the trace given
// to Plan, in order (sim.Run does); a malloc that does not match the plan
// is an error, not an OOM. Streams play no part: a block's offset is fixed,
// and it is reusable once its free is replayed. A malloc of 0 bytes returns
// the block {0, 0}. Under a device with a capacity (a Capacitor) that
// cannot hold the plan's height, the arena is what the capacity leaves: a
// block goes at its planned offset where that is inside the arena and
// free, else at the top of the highest gap that holds it, and is an OOM only when none
// does; when the device refuses
// the arena, every malloc before the next successful arena allocation is
// an OOM.
//
// Settings (defaults in brackets):
//   - alignment [256]: sizes, and so offsets, are rounded up to a multiple
//     of it (bytes, a power of two up to 2 MiB; 256 B is the alignment
//     cudaMalloc guarantees, the finest a real allocator can keep).
//   - nodes [200000]: the search's node budget (0: greedy portfolio only).
type Offline struct {
	name      string
	dev       Device
	alignment uint64
	orders    []greedyOrder // the greedy orders tried
	nodes     int64         // search budget

	planned bool
	mallocs []plannedMalloc // by malloc call, in order
	next    int             // index of the next malloc call
	height  uint64          // arena size in bytes
	stats   PlanStats

	arena     uint64 // arena address, valid when hasArena
	arenaSize uint64 // its size in bytes: the plan's height, or less under a capacity
	hasArena  bool
	live      []uint64          // offsets of live blocks, sorted
	liveSize  map[uint64]uint64 // offset -> block size
	liveBytes uint64
}

// plannedMalloc is one malloc call of the plan.
type plannedMalloc struct {
	size   uint64 // requested bytes
	offset uint64 // offset in the arena of its block, noOffset if unplaced
}

// maxPlanHeight is the largest arena in bytes a plan may take, 8 EiB:
// every offset and end of a block then fits in 64 bits with room to spare
// (a block is at most maxRequest bytes). A block that would end above it
// is left out of the plan, and its malloc is an OOM (ErrOverflow), rather
// than placed at a sum that wraps.
const maxPlanHeight = 1 << 63

// noOffset is the offset of a block left out of the plan (maxPlanHeight).
const noOffset = ^uint64(0)

// PlanStats describes an Offline plan.
type PlanStats struct {
	// Blocks is the number of mallocs of a non-zero size planned.
	Blocks int
	// LowerBound is the peak of live bytes (after rounding): no placement
	// is lower. Height is the plan's height, the arena size in bytes.
	LowerBound, Height uint64
	// Greedy is the height of the best greedy placement and GreedyBy its
	// order's name; Heights has each greedy order's height by name (the
	// orders tried: they stop at one that reaches the lower bound).
	Greedy   uint64
	GreedyBy string
	Heights  map[string]uint64
	// Nodes is the number of search nodes used; Searched reports whether
	// the search ran at all.
	Nodes    int64
	Searched bool
}

var (
	_ Policy     = (*Offline)(nil)
	_ Planner    = (*Offline)(nil)
	_ Releaser   = (*Offline)(nil)
	_ FreeSpacer = (*Offline)(nil)
)

// offlineAlignmentSetting is the alignment setting of the clairvoyant
// policies.
var offlineAlignmentSetting = Setting{Key: "alignment", Default: "256", Doc: "sizes, and so offsets, are rounded up to a multiple of it, in bytes: a power of two up to 2 MiB"}

func init() {
	register(Info{
		Name:   OfflineName,
		Design: "clairvoyant static placement of the whole trace (dynamic storage allocation), greedy orders and a budgeted search after MiniMalloc: a heuristic, not the optimum (MiniMalloc A..K, each solvable in 1048576 bytes: 0.99 to 1.10 of that)",
		Settings: []Setting{
			offlineAlignmentSetting,
			{Key: "nodes", Default: "200000", Doc: "the search's budget in nodes (0: the greedy orders only), at most 2^40"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewOffline(dev, s) })
	register(Info{
		Name:     "greedy-by-size",
		Design:   "clairvoyant greedy by size with best-fit offsets (Pisarchyk and Lee 2020; TensorFlow Lite's GreedyBySize)",
		Settings: []Setting{offlineAlignmentSetting},
	}, func(dev Device, s Settings) (Policy, error) { return NewGreedyBySize(dev, s) })
	register(Info{
		Name:     "greedy-by-lifetime",
		Design:   "clairvoyant greedy by lifetime with best-fit offsets, the longest-lived blocks at the bottom",
		Settings: []Setting{offlineAlignmentSetting},
	}, func(dev Device, s Settings) (Policy, error) { return NewGreedyByLifetime(dev, s) })
}

// NewOffline returns the offline policy on dev. It returns an error naming
// the key for an unknown or malformed setting.
func NewOffline(dev Device, s Settings) (*Offline, error) {
	if err := s.Check(OfflineName, "alignment", "nodes"); err != nil {
		return nil, err
	}
	align, err := offlineAlignment(OfflineName, s)
	if err != nil {
		return nil, err
	}
	nodes, err := s.Uint(OfflineName, "nodes", 200000)
	if err != nil {
		return nil, err
	}
	if nodes > 1<<40 {
		return nil, invalidSettingf(OfflineName, s, "nodes", "must be at most 2^40")
	}
	return &Offline{name: OfflineName, dev: dev, alignment: align, orders: greedyOrders, nodes: int64(nodes)}, nil
}

// NewGreedyBySize returns the greedy-by-size policy on dev: a clairvoyant
// static placement like Offline, but only the classic greedy by size with
// best-fit offsets (Pisarchyk and Lee, "Efficient Memory Management for Deep
// Neural Net Inference", 2020; TensorFlow Lite's GreedyBySize): blocks in
// order of decreasing size (longer lifetime first among equals), each at
// the smallest gap that fits among the blocks already placed that are live
// at the same time, else above them all. Its one setting is alignment
// [256], as for Offline.
func NewGreedyBySize(dev Device, s Settings) (*Offline, error) {
	return newGreedy("greedy-by-size", orderBySize, dev, s)
}

// NewGreedyByLifetime returns the greedy-by-lifetime policy on dev: as
// greedy-by-size, but blocks in order of decreasing lifetime (in trace
// events; larger first among equals), the longest-lived at the bottom.
func NewGreedyByLifetime(dev Device, s Settings) (*Offline, error) {
	return newGreedy("greedy-by-lifetime", orderByLifetime, dev, s)
}

func newGreedy(name string, o greedyOrder, dev Device, s Settings) (*Offline, error) {
	if err := s.Check(name, "alignment"); err != nil {
		return nil, err
	}
	align, err := offlineAlignment(name, s)
	if err != nil {
		return nil, err
	}
	return &Offline{name: name, dev: dev, alignment: align, orders: []greedyOrder{o}}, nil
}

func offlineAlignment(name string, s Settings) (uint64, error) {
	align, err := s.Bytes(name, "alignment", 256)
	if err != nil {
		return 0, err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return 0, invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	return align, nil
}

// Name returns the policy's registry name.
func (p *Offline) Name() string { return p.name }

// Stats returns the statistics of the plan made by Plan.
func (p *Offline) Stats() PlanStats { return p.stats }

// Plan places every malloc of the trace evs. It follows the replay's rules
// for which events reach a policy: a malloc of device memory (any kind but
// pinned and managed) whose address is not live, its free, and a failed
// malloc (malloc_failed) of device memory, replayed as a malloc freed at
// once. A malloc never freed lives to the end of the trace. A request over
// 4 EiB is left out of the plan and answered with an OOM at its malloc, as
// the online policies answer it.
func (p *Offline) Plan(evs []trace.Event) error {
	key := p.planKeyOf(evs)
	if c := cachedPlanOf(key); c != nil {
		p.mallocs = append(p.mallocs[:0], c.mallocs...)
		p.height, p.stats = c.height, c.stats
		p.planned, p.next = true, 0
		return nil
	}
	if err := p.plan(evs); err != nil {
		return err
	}
	p.keepPlan(key)
	return nil
}

// plan is Plan without the cache.
func (p *Offline) plan(evs []trace.Event) error {
	bufs, err := p.blocks(evs)
	if err != nil {
		return err
	}
	pk := solvePacking(bufs, p.orders, p.nodes)
	for k, b := range bufs {
		p.mallocs[b.call].offset = pk.offsets[k]
	}
	p.height = pk.height
	p.stats = pk.stats
	p.planned = true
	p.next = 0
	return nil
}

// blocks sets p.mallocs to the malloc calls of evs, in order, and returns
// the blocks to place, in order of their start (the rules of Plan), with
// those that would take the bytes live at once past maxPlanHeight left
// out (dropOverflow).
func (p *Offline) blocks(evs []trace.Event) ([]packBuf, error) {
	type liveEntry struct {
		buf    int // index into bufs, -1 for host memory or a size of 0
		device bool
	}
	var bufs []packBuf
	p.mallocs = p.mallocs[:0]
	live := map[uint64]liveEntry{}
	addBuf := func(size uint64, start, end int64) (int, error) {
		p.mallocs = append(p.mallocs, plannedMalloc{size: size})
		if size == 0 || size > maxRequest {
			// Nothing to place: a null pointer, or an OOM at its malloc
			// (no device holds it), as the online policies answer.
			return -1, nil
		}
		bufs = append(bufs, packBuf{start: start, end: end, size: ceilToMultiple(size, p.alignment), call: len(p.mallocs) - 1})
		return len(bufs) - 1, nil
	}
	n := int64(len(evs))
	for i, ev := range evs {
		t := int64(i)
		switch ev.Op {
		case trace.OpMalloc:
			if _, dup := live[ev.Addr]; dup {
				continue
			}
			if ev.Kind == trace.KindPinned || ev.Kind == trace.KindManaged {
				live[ev.Addr] = liveEntry{buf: -1}
				continue
			}
			b, err := addBuf(ev.Size, t, n)
			if err != nil {
				return nil, fmt.Errorf("event %d: %w", i, err)
			}
			live[ev.Addr] = liveEntry{buf: b, device: ev.Kind.OnDevice()}
		case trace.OpMallocFailed:
			if !ev.Kind.OnDevice() {
				continue
			}
			if _, err := addBuf(ev.Size, t, t+1); err != nil {
				return nil, fmt.Errorf("event %d: %w", i, err)
			}
		case trace.OpFree:
			e, ok := live[ev.Addr]
			if !ok {
				continue
			}
			delete(live, ev.Addr)
			if e.buf >= 0 && e.device {
				bufs[e.buf].end = t
			}
		}
	}
	return p.dropOverflow(bufs), nil
}

// dropOverflow returns bufs (in order of their start) without the blocks
// that would take the bytes live at once past maxPlanHeight, taken in
// order of their start, and marks their mallocs unplaced: the section
// loads of the plan then fit in 64 bits.
func (p *Offline) dropOverflow(bufs []packBuf) []packBuf {
	var live uint64
	var ends endHeap
	kept := bufs[:0]
	for _, b := range bufs {
		for len(ends) > 0 && ends[0].end <= b.start {
			live -= heap.Pop(&ends).(endSize).size
		}
		if b.size > maxPlanHeight-live {
			p.mallocs[b.call].offset = noOffset
			continue
		}
		live += b.size
		heap.Push(&ends, endSize{b.end, b.size})
		kept = append(kept, b)
	}
	return kept
}

// endSize is a block's end and size; endHeap a min-heap of them by end.
type endSize struct {
	end  int64
	size uint64
}

type endHeap []endSize

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(endSize)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Malloc places the next malloc of the plan, which must be of size bytes,
// at its planned offset in the arena, allocating the arena first if need
// be. Stream is ignored. It returns an error wrapping ErrOutOfMemory when
// the device refuses the arena, and another error when there is no plan
// or the malloc is not the plan's next.
func (p *Offline) Malloc(size, stream uint64) (Block, error) {
	if !p.planned {
		return Block{}, fmt.Errorf("policy %s: malloc of %d bytes: no plan: the policy must see the whole trace first (Plan)", p.name, size)
	}
	k := p.next
	if k >= len(p.mallocs) || p.mallocs[k].size != size {
		want := "none"
		if k < len(p.mallocs) {
			want = fmt.Sprintf("%d bytes", p.mallocs[k].size)
		}
		return Block{}, fmt.Errorf("policy %s: malloc #%d of %d bytes on stream %#x does not follow the plan (expected %s): replay the trace given to Plan", p.name, k, size, stream, want)
	}
	p.next++
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge(p.name, size)
	}
	off := p.mallocs[k].offset
	if off == noOffset {
		return Block{}, fmt.Errorf("policy %s: malloc #%d of %d bytes: the plan's arena would pass %d bytes: %w: %w", p.name, k, size, uint64(maxPlanHeight), ErrOverflow, ErrOutOfMemory)
	}
	n := ceilToMultiple(size, p.alignment)
	if !p.hasArena {
		if err := p.allocArena(size, n); err != nil {
			return Block{}, err
		}
	}
	if p.liveSize == nil {
		p.liveSize = map[uint64]uint64{}
	}
	i, found := slices.BinarySearch(p.live, off)
	if p.arenaSize < p.height {
		// Under a capacity below the plan's height: the planned offset
		// where it is inside the arena and free, else the top of the highest gap
		// that holds the block now; an OOM only when none does.
		if !p.freeAt(off, n, i) {
			var ok bool
			if off, ok = p.lastGap(n); !ok {
				return Block{}, fmt.Errorf("policy %s: malloc of %d bytes: no room in the arena of %d bytes the device's capacity leaves (%d bytes live): %w", p.name, size, p.arenaSize, p.liveBytes, ErrOutOfMemory)
			}
			i, _ = slices.BinarySearch(p.live, off)
		}
	} else if found {
		// The plan never overlaps blocks live at the same time; this is
		// a bug of the plan, caught here rather than by a corrupt replay.
		return Block{}, fmt.Errorf("policy %s: malloc #%d: offset %d is taken", p.name, k, off)
	}
	p.live = slices.Insert(p.live, i, off)
	p.liveSize[off] = n
	p.liveBytes += n
	return Block{Addr: p.arena + off, Size: n}, nil
}

// freeAt reports whether [off, off+n) is inside the arena and overlaps no
// live block; i is where off goes in the live offsets.
func (p *Offline) freeAt(off, n uint64, i int) bool {
	if off+n > p.arenaSize {
		return false
	}
	if i > 0 && p.live[i-1]+p.liveSize[p.live[i-1]] > off {
		return false
	}
	return i == len(p.live) || off+n <= p.live[i]
}

// lastGap returns the highest offset in the arena where n bytes overlap
// no live block, at the top of its gap (the plan packs from offset 0 up, so
// a block out of its place is kept clear of the planned ones as far as it
// can be), and false if there is none.
func (p *Offline) lastGap(n uint64) (uint64, bool) {
	top := p.arenaSize
	for k := len(p.live) - 1; ; k-- {
		var end uint64 // the end of the live block below the gap
		if k >= 0 {
			end = p.live[k] + p.liveSize[p.live[k]]
		}
		if top >= end+n {
			return (top - n) / p.alignment * p.alignment, true
		}
		if k < 0 {
			return 0, false
		}
		top = min(top, p.live[k])
	}
}

// allocArena allocates the arena, of the plan's height, or under a device
// with a capacity that cannot hold it (a Capacitor) of the bytes the
// capacity leaves, in which Malloc then places what it can; need is the
// size of the block being placed. It returns an error wrapping
// ErrOutOfMemory when the device refuses even that.
func (p *Offline) allocArena(size, need uint64) error {
	arena := p.height
	if c, ok := p.dev.(Capacitor); ok && c.Capacity() > 0 {
		room := c.Capacity() - min(c.Capacity(), c.Reserved())
		arena = min(arena, room/p.alignment*p.alignment)
	}
	if arena < need {
		return fmt.Errorf("policy %s: malloc of %d bytes: arena of %d bytes: the device has room for %d: %w", p.name, size, p.height, arena, ErrOutOfMemory)
	}
	addr, err := p.dev.Alloc(arena)
	if err != nil {
		return fmt.Errorf("policy %s: malloc of %d bytes: arena of %d bytes: %w", p.name, size, arena, err)
	}
	p.arena, p.arenaSize, p.hasArena = addr, arena, true
	return nil
}

// Free takes back the block at addr. Stream is ignored. It returns an error
// if addr is not a live block.
func (p *Offline) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	if !p.hasArena || addr < p.arena {
		return fmt.Errorf("policy %s: free of %#x: not a live block", p.name, addr)
	}
	off := addr - p.arena
	n, ok := p.liveSize[off]
	if !ok {
		return fmt.Errorf("policy %s: free of %#x: not a live block", p.name, addr)
	}
	delete(p.liveSize, off)
	i, _ := slices.BinarySearch(p.live, off)
	p.live = slices.Delete(p.live, i, i+1)
	p.liveBytes -= n
	return nil
}

// EmptyCache returns the arena to the device when no block is live; the
// next malloc allocates it again.
func (p *Offline) EmptyCache() error {
	if !p.hasArena || len(p.live) > 0 {
		return nil
	}
	p.hasArena = false
	if err := p.dev.Free(p.arena); err != nil {
		return fmt.Errorf("policy %s: %w", p.name, err)
	}
	return nil
}

// FreeSpace returns the free bytes in the arena and the size in bytes of
// its largest free gap.
func (p *Offline) FreeSpace() (total, largest uint64) {
	if !p.hasArena {
		return 0, 0
	}
	var end uint64
	for _, off := range p.live {
		if off > end {
			largest = max(largest, off-end)
		}
		end = off + p.liveSize[off]
	}
	largest = max(largest, p.arenaSize-end)
	return p.arenaSize - p.liveBytes, largest
}
