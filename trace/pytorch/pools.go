package pytorch

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"github.com/gpualloc/allocsim/trace"
)

// Private pools. The caching allocator of PyTorch 2.11 sends the mallocs
// made while a CUDA graph is captured (on the capture's streams) to the
// graph's private pool, and those inside a MemPool's use_mem_pool context
// to the MemPool's, but its trace entries do not say which pool a malloc
// went to. What a snapshot does say, and what Import infers from it:
//
//   - The final segments carry segment_pool_id: each segment alive at the
//     dump, with every malloc placed in it over the trace, is of that pool
//     (a pool's segments hold its blocks only).
//   - A malloc is in the segment holding its address: a cudaMalloc
//     segment from its segment_alloc to its segment_free, or an
//     expandable segment (one address range per stream and pool, whose
//     pages segment_map entries map at its start and then at or below the
//     end of what it mapped so far).
//   - A segment that is gone by the dump has no pool id. Its pool is
//     inferred from its stream: a capture's mallocs come one after the
//     other on the capture stream, so a segment with a malloc between two
//     mallocs of one private pool on its stream is of that pool (repeated
//     until nothing changes); any other is of the default pools. So the
//     mallocs torch.cuda.graph makes on the capture stream just before the
//     capture begins (the generator's seed and offset) are rightly of the
//     default pools, and a capture's segment whose mallocs all come before
//     the first malloc of a segment that survives is taken for a default
//     one: the inference cannot see it.
//   - A failed malloc (no address) between two mallocs of one private pool
//     on its stream is of that pool.
//   - torch.compile's cudagraph trees restore a pool's checkpointed state
//     (in a snapshot recorded with stacks, the mallocs whose stacks hold
//     setCheckpointPoolState or apply_checkpoint_execution_state_in_allocator
//     are the restore's, and nothing else is; without stacks, this:)
//     before they record a new graph (setCheckpointPoolState): every block
//     of the pool is freed, then each checkpointed segment is allocated
//     block by block, whole sizes from its start to its end, and the
//     blocks not live in the checkpoint freed again. A run of mallocs that
//     starts at the start of a cudaMalloc segment of a private pool with
//     no live block, made earlier than right before it, each at the end
//     of the one before, in sizes of whole 512 bytes, and ends at the
//     segment's end, is such a restore: its mallocs are marked Restore.
//   - A pool is released (its graphs destroyed, its MemPool deleted) at the
//     latest when the first of its segments is freed or unmapped: a
//     trace.OpPoolRelease is put before the run of segment frees and
//     unmaps that holds the first one. A pool none of whose segments is
//     freed is never released in the trace.
//
// A MemPool deleted before the dump, or a graph pool whose segments were
// all freed, leaves no pool id at all. When a malloc shows such a pool
// (poolwatch.go), or a segment free's stack does (a snapshot recorded
// with stacks, PyTorch's default, names at::cuda::MemPool::~MemPool in
// the C++ frames of the frees a MemPool's deletion makes), the pools are
// found from those stacks and the order in which their segments were
// freed (decideUnnamed), each named in Metadata "pools" by
// the trace entry its release begins at ("1=unnamed1-released-at-entry-142");
// when that finds none, or the final segments carry no segment_pool_id at
// all (a snapshot of a PyTorch before 2.1, whose surviving pools it cannot
// tell), Metadata "pool_warning" says which malloc showed one, and its
// mallocs are taken for the default pools'.
//
// This needs a reading of the snapshot of its own, made only when the
// final segments name a private pool or a malloc shows one; it keeps a
// record per malloc.

// poolPlan is what the inference decided: the pool of each unit (segment)
// and failed malloc, and where pools are released.
type poolPlan struct {
	ids   [][2]uint64 // pool number k+1 is ids[k]
	final []finalRange
	// unitPool is the pool number of each unit, by unit id.
	unitPool []uint32
	// failedPool is the pool of failed mallocs not of the default pools,
	// by entry index.
	failedPool map[int64]uint32
	// release lists, by entry index, the pools released before it.
	release map[int64][]uint32
	// restore holds the event indexes of the mallocs of restores.
	restore map[int64]bool
	// mixed is set when pools the final segments name come first in ids
	// and MemPools deleted before the dump after them (addMemPools).
	mixed bool
	// empty lists, by entry index, the private pools whose cached
	// memory was released by the segment frees right before it (after
	// their release): a MemPool's deletion.
	empty map[int64][]uint32
}

// finalRange is a final segment as the unit tracker sees it.
type finalRange struct {
	addr, size, stream uint64
	expandable         bool
	pool               uint32 // its pool number, 0 for the default pools
}

// finalPools numbers the private pools of the final segments of device dev
// (by id, ascending) and returns them and the segments, and whether the
// segments carry segment_pool_id at all (PyTorch before 2.1 wrote none).
// It returns an error for a segment_pool_id that is not a pair of
// non-negative ints.
func finalPools(segs []snapSegment, dev int) (ids [][2]uint64, final []finalRange, keyed bool, err error) {
	num := map[[2]uint64]uint32{}
	keyed = true
	for _, s := range segs {
		if s.bad != "" || (s.device >= 0 && s.device != int64(dev)) {
			continue
		}
		if s.badPool != "" {
			return nil, nil, false, fmt.Errorf("the final segment at %#x: its segment_pool_id %s", s.addr, s.badPool)
		}
		keyed = keyed && s.havePool
		if s.pool != [2]uint64{} {
			if _, ok := num[s.pool]; !ok {
				num[s.pool] = 0
				ids = append(ids, s.pool)
			}
		}
	}
	slices.SortFunc(ids, func(a, b [2]uint64) int {
		if c := cmp.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return cmp.Compare(a[1], b[1])
	})
	for k, id := range ids {
		num[id] = uint32(k + 1)
	}
	for _, s := range segs {
		if s.bad != "" || (s.device >= 0 && s.device != int64(dev)) {
			continue
		}
		final = append(final, finalRange{addr: s.addr, size: s.size, stream: s.stream, expandable: s.expandable, pool: num[s.pool]})
	}
	return ids, final, keyed, nil
}

// unnamedNames returns the "pools" metadata of pools no final segment
// names: each by the trace entry its release (its segments' frees) begins
// at, "1=unnamed1-released-at-entry-142".
func unnamedNames(plan *poolPlan) string {
	at := make([]int64, len(plan.ids))
	for i, ps := range plan.release {
		for _, p := range ps {
			at[p-1] = i
		}
	}
	names := make([]string, len(at))
	for k, i := range at {
		names[k] = fmt.Sprintf("unnamed%d-released-at-entry-%d", k+1, i)
	}
	return trace.FormatPoolNames(names)
}

// poolNames returns the "pools" metadata: "1=(1,0) 2=(0,1)".
func poolNames(ids [][2]uint64) string {
	names := make([]string, len(ids))
	for k, id := range ids {
		names[k] = fmt.Sprintf("(%d,%d)", id[0], id[1])
	}
	return trace.FormatPoolNames(names)
}

// unitTracker gives each segment alloc, map and malloc the unit it belongs
// to, the same way in the inference's reading and the events' own: a unit
// is a cudaMalloc segment from its segment_alloc to its segment_free, or
// an expandable segment's address range (the final segments' expandable
// ones are units 0 to n-1, in address order).
type unitTracker struct {
	segs   []liveUnit   // live cudaMalloc segments, by address
	ranges []rangeUnit  // expandable ranges, by (stream, base)
	final  []finalRange // the final segments
	next   int
}

type liveUnit struct {
	addr, size uint64
	unit       int
}

type rangeUnit struct {
	stream, base, hi uint64 // hi: the end of the highest page mapped so far
	unit             int
}

func newUnitTracker(final []finalRange) *unitTracker {
	u := &unitTracker{final: final}
	for _, f := range final {
		if f.expandable {
			u.addRange(rangeUnit{stream: f.stream, base: f.addr, hi: f.addr, unit: u.next})
			u.next++
		}
	}
	return u
}

func (u *unitTracker) addRange(r rangeUnit) {
	i := sort.Search(len(u.ranges), func(i int) bool {
		x := u.ranges[i]
		return x.stream > r.stream || x.stream == r.stream && x.base >= r.base
	})
	u.ranges = slices.Insert(u.ranges, i, r)
}

// rangeOf returns the index in u.ranges of the expandable range of stream
// that holds addr (at or below the end of what it mapped; at is true for a
// map, which may start right at that end), or -1.
func (u *unitTracker) rangeOf(stream, addr uint64, at bool) int {
	i := sort.Search(len(u.ranges), func(i int) bool {
		x := u.ranges[i]
		return x.stream > stream || x.stream == stream && x.base > addr
	}) - 1
	if i < 0 || u.ranges[i].stream != stream {
		return -1
	}
	if r := u.ranges[i]; addr < r.hi || at && addr == r.hi {
		return i
	}
	return -1
}

// segOf returns the index in u.segs of the live segment holding addr, or -1.
func (u *unitTracker) segOf(addr uint64) int {
	i := sort.Search(len(u.segs), func(i int) bool { return u.segs[i].addr > addr }) - 1
	if i >= 0 && addr < u.segs[i].addr+u.segs[i].size {
		return i
	}
	return -1
}

// event follows ev and returns the unit it concerns, -1 for none (an op
// of no segment, or an address no segment the tracker knows holds).
func (u *unitTracker) event(ev *trace.Event) int {
	switch ev.Op {
	case trace.OpSegmentAlloc:
		i := sort.Search(len(u.segs), func(i int) bool { return u.segs[i].addr > ev.Addr })
		u.segs = slices.Insert(u.segs, i, liveUnit{addr: ev.Addr, size: ev.Size, unit: u.next})
		u.next++
		return u.next - 1
	case trace.OpSegmentFree:
		if i := u.segOf(ev.Addr); i >= 0 && u.segs[i].addr == ev.Addr {
			unit := u.segs[i].unit
			u.segs = slices.Delete(u.segs, i, i+1)
			return unit
		}
	case trace.OpSegmentMap:
		if i := u.rangeOf(ev.Stream, ev.Addr, true); i >= 0 {
			u.ranges[i].hi = max(u.ranges[i].hi, ev.Addr+ev.Size)
			return u.ranges[i].unit
		}
		u.addRange(rangeUnit{stream: ev.Stream, base: ev.Addr, hi: ev.Addr + ev.Size, unit: u.next})
		u.next++
		return u.next - 1
	case trace.OpSegmentUnmap:
		if i := u.rangeOf(ev.Stream, ev.Addr, false); i >= 0 {
			return u.ranges[i].unit
		}
	case trace.OpMalloc:
		if i := u.segOf(ev.Addr); i >= 0 {
			return u.segs[i].unit
		}
		if i := u.rangeOf(ev.Stream, ev.Addr, false); i >= 0 {
			return u.ranges[i].unit
		}
	}
	return -1
}

// finalUnits returns the pool number of the units alive at the end that
// are final segments: unit -> pool.
func (u *unitTracker) finalUnits() map[int]uint32 {
	out := map[int]uint32{}
	k := 0
	for _, f := range u.final {
		if f.expandable {
			out[k] = f.pool // the first units, in address order
			k++
			continue
		}
		if i := u.segOf(f.addr); i >= 0 && u.segs[i].addr == f.addr {
			out[u.segs[i].unit] = f.pool
		}
	}
	return out
}

// inferSink is the sink of the inference's reading.
type inferSink struct {
	ev      trace.Event
	units   *unitTracker
	mallocs []mallocRec
	// framed is set when a malloc's entry has a stack (a snapshot
	// recorded with context); restoring then holds the event indexes of
	// the mallocs whose stacks show a checkpoint restore.
	framed    bool
	restoring map[int64]bool
	// releases: the first entry of the current run of segment frees and
	// unmaps, and the run of each unit's first release.
	runStart  int64
	inRun     bool
	unitFreed map[int]int64
	prefix    int64 // events before the entries (reconstructed)

	// Checkpoint restores: the units' segments, the unit of each live
	// malloc, and the runs found.
	unitSeg []unitSeg
	liveAt  map[uint64]int
	runs    [][]int64 // the event indexes of each complete run

	// freeRuns are the runs of segment frees, for pools no final
	// segment names (decideUnnamed).
	freeRuns [][]segFree
}

// segFree is a segment free of a run.
type segFree struct {
	index              int64
	unit               int
	stream, size, addr uint64
	memPool            bool // made by a MemPool's deletion (its stack says so)
	unmap              bool // an expandable segment's pages unmapped
}

// inReleaseOrder reports whether f comes after p in the order in which
// release_blocks frees a pool's segments: by (stream, size, address).
func inReleaseOrder(p, f segFree) bool {
	return p.stream < f.stream || p.stream == f.stream && (p.size < f.size || p.size == f.size && p.addr < f.addr)
}

// pieces cuts run where its frees' stacks change between a MemPool's
// deletion and anything else.
func pieces(run []segFree) [][]segFree {
	var out [][]segFree
	for len(run) > 0 {
		n := 1
		for n < len(run) && run[n].memPool == run[0].memPool {
			n++
		}
		out = append(out, run[:n])
		run = run[n:]
	}
	return out
}

// frees returns the segment frees of run, without its unmaps.
func frees(run []segFree) []segFree {
	out := run[:0:0]
	for _, f := range run {
		if !f.unmap {
			out = append(out, f)
		}
	}
	return out
}

// unitSeg is what restore detection keeps of a unit.
type unitSeg struct {
	base, size uint64 // 0 size: an expandable range, never restored
	created    int64  // event index of its segment_alloc
	live       int    // live mallocs
	run        []int64
	cursor     uint64 // where the run's next malloc must be
}

func (s *inferSink) seg(unit int) *unitSeg {
	for unit >= len(s.unitSeg) {
		s.unitSeg = append(s.unitSeg, unitSeg{created: -1})
	}
	return &s.unitSeg[unit]
}

// restoreStep follows the mallocs and frees of units for runs of a
// checkpoint restore.
func (s *inferSink) restoreStep(index int64, ev *trace.Event, unit int) {
	switch ev.Op {
	case trace.OpSegmentAlloc:
		if unit >= 0 {
			*s.seg(unit) = unitSeg{base: ev.Addr, size: ev.Size, created: index}
		}
	case trace.OpFree:
		if u, ok := s.liveAt[ev.Addr]; ok {
			delete(s.liveAt, ev.Addr)
			g := s.seg(u)
			g.live--
			g.run = nil
		}
	case trace.OpMalloc:
		if unit < 0 {
			return
		}
		g := s.seg(unit)
		s.liveAt[ev.Addr] = unit
		whole := ev.Size > 0 && ev.Size%512 == 0 && g.size > 0
		switch {
		case whole && g.run != nil && ev.Addr == g.cursor:
			g.run = append(g.run, index)
		case whole && g.live == 0 && ev.Addr == g.base && g.created >= 0 && g.created < index-1:
			g.run = []int64{index}
		default:
			g.run = nil
		}
		g.live++
		if g.run != nil {
			g.cursor = ev.Addr + ev.Size
			if g.cursor == g.base+g.size {
				s.runs = append(s.runs, g.run)
				g.run = nil
			}
		}
	}
}

// mallocRec is a malloc (or failed malloc: unit -1, failed) of the
// inference's reading.
type mallocRec struct {
	index  int64 // event index: entries count from the prefix's length
	stream uint64
	unit   int
	failed bool
}

func (s *inferSink) observe(index int64, ev *trace.Event) {
	unit := s.units.event(ev)
	s.restoreStep(index, ev, unit)
	switch ev.Op {
	case trace.OpSegmentFree, trace.OpSegmentUnmap:
		if !s.inRun {
			s.inRun, s.runStart = true, index
			s.freeRuns = append(s.freeRuns, nil)
		}
		if unit >= 0 {
			r := &s.freeRuns[len(s.freeRuns)-1]
			*r = append(*r, segFree{index: index, unit: unit, stream: ev.Stream, size: ev.Size, addr: ev.Addr, unmap: ev.Op == trace.OpSegmentUnmap})
		}
		if _, ok := s.unitFreed[unit]; !ok && unit >= 0 {
			s.unitFreed[unit] = s.runStart
		}
		return
	case trace.OpMalloc:
		s.mallocs = append(s.mallocs, mallocRec{index: index, stream: ev.Stream, unit: unit})
	case trace.OpMallocFailed:
		s.mallocs = append(s.mallocs, mallocRec{index: index, stream: ev.Stream, unit: -1, failed: true})
	}
	s.inRun = false
}

func (s *inferSink) entry(d *decoder, index int64, f *entryFields) error {
	s.ev = trace.Event{}
	if err := convertEntry(d, f, &s.ev); err != nil {
		return err
	}
	s.observe(s.prefix+index, &s.ev)
	if s.ev.Op == trace.OpMalloc && d.entryStack != 0 {
		s.framed = true
		if d.restoreStack(d.entryStack) {
			if s.restoring == nil {
				s.restoring = map[int64]bool{}
			}
			s.restoring[s.prefix+index] = true
		}
	}
	if (s.ev.Op == trace.OpSegmentFree || s.ev.Op == trace.OpSegmentUnmap) && len(s.freeRuns) > 0 && d.byMemPool(d.entryStack) {
		if r := s.freeRuns[len(s.freeRuns)-1]; len(r) > 0 && r[len(r)-1].index == s.prefix+index {
			r[len(r)-1].memPool = true
		}
	}
	return nil
}

// decide labels the units and failed mallocs the inference read: see the
// comment at the top of the file.
func (s *inferSink) decide(ids [][2]uint64, final []finalRange) *poolPlan {
	const unknown = ^uint32(0)
	label := make([]uint32, s.units.next)
	for k := range label {
		label[k] = unknown
	}
	for unit, pool := range s.units.finalUnits() {
		label[unit] = pool
	}
	for _, unit := range s.defaultLarge() {
		if label[unit] == unknown {
			label[unit] = 0
		}
	}
	byStream := map[uint64][]int{} // indexes into s.mallocs
	var streams []uint64
	for k, m := range s.mallocs {
		if _, ok := byStream[m.stream]; !ok {
			streams = append(streams, m.stream)
		}
		byStream[m.stream] = append(byStream[m.stream], k)
	}
	slices.Sort(streams)
	failed := map[int64]uint32{}
	of := func(m mallocRec) uint32 {
		if m.unit < 0 {
			return unknown
		}
		return label[m.unit]
	}
	spread := func() {
		for changed := true; changed; {
			changed = false
			for _, st := range streams {
				ms := byStream[st]
				last := -1 // the last malloc of ms with a label
				for k, mi := range ms {
					p := of(s.mallocs[mi])
					if p == unknown {
						continue
					}
					if last >= 0 && p != 0 && of(s.mallocs[ms[last]]) == p {
						for _, mj := range ms[last+1 : k] {
							m := s.mallocs[mj]
							switch {
							case m.failed:
								failed[m.index] = p
							case m.unit >= 0 && label[m.unit] == unknown:
								label[m.unit] = p
								changed = true
							}
						}
					}
					last = k
				}
			}
		}
	}
	spread()
	// A unit that a release shows private (a large segment freed after a
	// small one) and that nothing names: the pool of the last malloc of a
	// named private pool on its stream before its own first malloc, else
	// a pool of its own (a graph's, all of whose segments were freed).
	added := 0
	if late := s.privateLarge(); len(late) > 0 {
		first := map[int]int{} // unit -> its first malloc, an index into s.mallocs
		for k, m := range s.mallocs {
			if _, ok := first[m.unit]; !ok && m.unit >= 0 {
				first[m.unit] = k
			}
		}
		for _, unit := range late {
			k, ok := first[unit]
			if !ok || label[unit] != unknown {
				continue
			}
			ms := byStream[s.mallocs[k].stream]
			at, _ := slices.BinarySearch(ms, k)
			for j := at - 1; j >= 0 && label[unit] == unknown; j-- {
				if p := of(s.mallocs[ms[j]]); p != unknown && p != 0 {
					label[unit] = p
				}
			}
			if label[unit] == unknown {
				added++
				label[unit] = uint32(len(ids) + added)
			}
		}
		if added > 0 {
			spread()
		}
	}
	plan := &poolPlan{ids: slices.Clone(ids), final: final, unitPool: label, failedPool: failed, release: map[int64][]uint32{}, restore: map[int64]bool{}}
	for range added {
		plan.ids = append(plan.ids, [2]uint64{})
	}
	plan.mixed = added > 0
	for k := range label {
		if label[k] == unknown {
			label[k] = 0
		}
	}
	if s.framed {
		// The stacks say which mallocs a restore made.
		for i := range s.restoring {
			if m := s.mallocOf(i); m.unit >= 0 && label[m.unit] != 0 {
				plan.restore[i] = true
			}
		}
	} else {
		for _, run := range s.runs {
			m := s.mallocOf(run[0])
			if m.unit < 0 || label[m.unit] == 0 {
				continue
			}
			for _, i := range run {
				plan.restore[i] = true
			}
		}
	}
	first := map[uint32]int64{}
	for unit, at := range s.unitFreed {
		if p := label[unit]; p != 0 {
			if f, ok := first[p]; !ok || at < f {
				first[p] = at
			}
		}
	}
	for p, at := range first {
		plan.release[at] = append(plan.release[at], p)
	}
	for _, ps := range plan.release {
		slices.Sort(ps)
	}
	return plan
}

// decideUnnamed labels the units of a snapshot whose final segments name
// no private pool but whose mallocs or segment frees show one (poolWatch,
// checker.memPool): see the comment at the top of the file. Each run of
// segment frees is cut where its frees' stacks change between a MemPool's
// deletion and anything else (where the snapshot records stacks), and
// each piece into parts where the order of release breaks:
// release_cached_blocks frees the default pools' cached segments, large
// then small, each by (stream, size, address), and a MemPool's deletion
// frees its own (emptyCache of the pool), small then large. The parts of
// a piece made by MemPool deletions are private pools, each a small part
// with the large part after it, or a part alone. In any other piece, a
// piece that is one part, or a large part and a small one, is a plain
// empty_cache's; else parts are taken from the start as private pools of
// their own, until what is left is a plain empty_cache's. Each private
// pool is released right before its piece and emptied
// (trace.OpEmptyCache of the pool) right after its part. It returns nil
// when no run has a private pool's part. A graph's pool freed whole (its
// segments come after the default pools' in a run) is not told apart.
func (s *inferSink) decideUnnamed() *poolPlan {
	label := make([]uint32, s.units.next)
	plan := &poolPlan{unitPool: label, failedPool: map[int64]uint32{}, release: map[int64][]uint32{}, restore: map[int64]bool{}, empty: map[int64][]uint32{}}
	for _, run := range s.freeRuns {
		run = frees(run)
		for _, piece := range pieces(run) {
			s.decidePiece(plan, piece, piece[0].memPool)
		}
	}
	if len(plan.ids) == 0 {
		return nil
	}
	return plan
}

// decidePiece labels the private pools of piece, a piece of a run of
// segment frees, all made by MemPool deletions (memPool) or none.
func (s *inferSink) decidePiece(plan *poolPlan, piece []segFree, memPool bool) {
	// Sorted parts: one size class, ascending (stream, size, address).
	type part struct {
		from, to int
		small    bool
	}
	var parts []part
	for k, f := range piece {
		small := f.size == 2<<20
		if n := len(parts); n > 0 && parts[n-1].small == small {
			if inReleaseOrder(piece[k-1], f) {
				parts[n-1].to = k + 1
				continue
			}
		}
		parts = append(parts, part{k, k + 1, small})
	}
	// What a plain empty_cache frees: large, small, or both in that
	// order; a MemPool's deletion frees nothing of the default pools.
	global := func(ps []part) bool {
		if memPool {
			return len(ps) == 0
		}
		return len(ps) <= 1 || len(ps) == 2 && !ps[0].small && ps[1].small
	}
	k := 0
	for !global(parts[k:]) {
		from, to := parts[k].from, parts[k].to
		if parts[k].small && k+1 < len(parts) && !parts[k+1].small {
			k++
			to = parts[k].to
		}
		k++
		plan.ids = append(plan.ids, [2]uint64{})
		id := uint32(len(plan.ids))
		for _, f := range piece[from:to] {
			plan.unitPool[f.unit] = id
		}
		at, end := piece[0].index, piece[to-1].index+1
		plan.release[at] = append(plan.release[at], id)
		plan.empty[end] = append(plan.empty[end], id)
	}
}

// defaultLarge returns the units that a release shows to be of the
// default large pool: release_cached_blocks frees the default pools'
// cached segments, large then small, each by (stream, size, address),
// before any private pool's, small then large; so in a run of segment
// frees (not a MemPool's deletion) whose first part in that order is
// large and the next small, the first part is the default large pool's.
func (s *inferSink) defaultLarge() []int {
	var units []int
	for _, run := range s.freeRuns {
		end := 0
		for end < len(run) && !run[end].memPool {
			end++
		}
		piece := run[:end]
		first := 1 // the end of the first sorted part of one size class
		for first < len(piece) {
			p, f := piece[first-1], piece[first]
			if (p.size == 2<<20) != (f.size == 2<<20) || !inReleaseOrder(p, f) {
				break
			}
			first++
		}
		if first < len(piece) && piece[0].size != 2<<20 && piece[first].size == 2<<20 {
			for _, f := range piece[:first] {
				units = append(units, f.unit)
			}
		}
	}
	return units
}

// privateLarge returns the units that a release shows to be of a private
// pool: in a run of segment frees (not a MemPool's deletion), a large
// segment freed after a small one (release_cached_blocks frees the default
// large pool's first, then the default small pool's, then each private
// pool's, small then large).
func (s *inferSink) privateLarge() []int {
	var units []int
	for _, run := range s.freeRuns {
		small := false
		for _, f := range frees(run) {
			if f.memPool {
				break
			}
			if f.size == 2<<20 {
				small = true
			} else if small {
				units = append(units, f.unit)
			}
		}
	}
	return units
}

// addMemPools labels, in plan (decide's, for pools the final segments
// name), the units that MemPool deletions freed (their segment frees'
// stacks say so) as pools of their own, numbered after the named ones,
// each released and emptied as decideUnnamed does; it returns how many.
func (s *inferSink) addMemPools(plan *poolPlan) int {
	if plan.empty == nil {
		plan.empty = map[int64][]uint32{}
	}
	n := len(plan.ids)
	for _, run := range s.freeRuns {
		run = frees(run)
		for _, piece := range pieces(run) {
			if piece[0].memPool {
				s.decidePiece(plan, piece, true)
			}
		}
	}
	return len(plan.ids) - n
}

// mixedNames returns the "pools" metadata of a plan whose first named
// pools are named by the final segments (ids) and the rest are MemPools
// deleted before the dump: "1=(0,3) 2=unnamed2-released-at-entry-49".
func mixedNames(plan *poolPlan, named int) string {
	names := make([]string, len(plan.ids))
	for k, id := range plan.ids[:named] {
		names[k] = fmt.Sprintf("(%d,%d)", id[0], id[1])
	}
	for i, ps := range plan.release {
		for _, p := range ps {
			if int(p) > named {
				names[p-1] = fmt.Sprintf("unnamed%d-released-at-entry-%d", p, i)
			}
		}
	}
	return trace.FormatPoolNames(names)
}

// mallocOf returns the malloc of event index i.
func (s *inferSink) mallocOf(i int64) mallocRec {
	k, _ := slices.BinarySearchFunc(s.mallocs, i, func(m mallocRec, i int64) int { return cmp.Compare(m.index, i) })
	return s.mallocs[k]
}

// labeler puts the plan on the events as they are read: each malloc's
// pool, and the pool_release events.
type labeler struct {
	plan  *poolPlan
	units *unitTracker
}

func newLabeler(plan *poolPlan) *labeler {
	return &labeler{plan: plan, units: newUnitTracker(plan.final)}
}

// label sets the pool of ev, the event of the given index, and returns the
// pool_release events that come before it.
func (l *labeler) label(index int64, ev *trace.Event) []trace.Event {
	unit := l.units.event(ev)
	switch ev.Op {
	case trace.OpMalloc:
		if unit >= 0 && unit < len(l.plan.unitPool) {
			ev.Pool = l.plan.unitPool[unit]
		}
		ev.Restore = ev.Pool != 0 && l.plan.restore[index]
	case trace.OpMallocFailed:
		ev.Pool = l.plan.failedPool[index]
	}
	ps, es := l.plan.release[index], l.plan.empty[index]
	if len(ps)+len(es) == 0 {
		return nil
	}
	var out []trace.Event
	for _, p := range es {
		out = append(out, trace.Event{Op: trace.OpEmptyCache, Pool: p, Time: ev.Time})
	}
	for _, p := range ps {
		out = append(out, trace.Event{Op: trace.OpPoolRelease, Pool: p, Time: ev.Time})
	}
	return out
}
