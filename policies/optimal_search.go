package policies

import (
	"cmp"
	"slices"
	"time"
)

// This file is the optimal policy's decision search: do the blocks of a
// packProblem fit under a capacity C, and where? It follows the search
// that MiniMalloc published (Moffitt, "MiniMalloc: A Lightweight Memory
// Allocator for Hardware-Accelerated Machine Learning", ASPLOS 2023;
// google/minimalloc, src/solver.cc), written anew here, and it is exact:
// a run that ends without a placement and without reaching its node limit
// or the deadline proves that none exists under C.
//
// The rules, each sound (no placement under C is lost):
//   - canonical solutions: blocks are placed in non-decreasing order of
//     offset (among equal offsets, by a static preorder), each at its
//     minimum offset, the top of the placed blocks live at the same time.
//     Any placement pushed down until no block can move lower is of that
//     form, and is found in that order.
//   - spatial inference: at every section (a maximal set of blocks live at
//     once) the blocks still to place there stack from the section's
//     floor (the top of the last block placed there, or the least minimum
//     offset of those still to place) and must fit under C; as placements
//     go in non-decreasing offset, every section's blocks still to place
//     also stack above the current offset.
//   - dominance: a block placed at or above the top that another block
//     still to place would reach at its minimum offset leaves a gap that
//     block could drop into, lowering no end: the branch is cut.
//   - hatless pruning: a block none of whose neighbours in time is still
//     to place has a fixed offset, and every later candidate would have to
//     come before it in the order; when the search after it fails, its
//     siblings are not tried.
//   - temporal decomposition: where no block still to place is live
//     across a section boundary, the blocks on either side are independent
//     and are solved apart; a failure of one fails the branch.
//   - preorders in round robin: the static orders WAT, TAW and TWA
//     (W: lifetime in the trace's time, A: size times lifetime, T: the largest
//     load of a section of the lifetime; each decreasing), each run with a
//     node limit that doubles, as MiniMalloc does; a run that ends within
//     its limit decides.

// exactSearch holds the state of the decision search.
type exactSearch struct {
	pp      *packProblem
	n       int
	width   []int64   // lifetime of each block, for the preorders
	tload   []uint64  // T of each block, for the preorders (rankBlocks)
	pre     int       // the preorder of the run
	saved   []int32   // ranks saved around subproblems, stacked
	secBufs [][]int32 // blocks by section

	capacity uint64
	rank     []int32 // position of each block in the preorder in use
	minOff   []uint64
	placed   []bool
	sol      []uint64 // offsets of the placement found
	floor    []uint64 // per section: the lowest offset a block still to place there can take
	total    []uint64 // per section: bytes of the blocks still to place there
	totals   maxTree  // total, for the largest over a partition
	cuts     []int32  // per section boundary k|k+1: blocks still to place live across it

	nodes    int64     // nodes left to the run
	used     int64     // nodes used by every run so far
	deadline time.Time // the zero time: none
	stopped  bool      // the run reached its node limit or the deadline
	late     bool      // the deadline passed: every run from here stops

	minLog, floorLog []change
	affected         []int32
	stamp            []int32
	query            int32
}

// exactPreorders are MiniMalloc's default static preorders.
var exactPreorders = [][3]byte{{'W', 'A', 'T'}, {'T', 'A', 'W'}, {'T', 'W', 'A'}}

// decision outcomes.
const (
	decideFound = iota
	decideInfeasible
	decideStopped
)

// newExactSearch returns the search of pp; width is the lifetime of each
// block for the preorders (in the trace's time), nil for its lifetime in
// trace events.
func newExactSearch(pp *packProblem, width []int64) *exactSearch {
	n := len(pp.bufs)
	nsec := len(pp.secLoad)
	if width == nil {
		width = make([]int64, n)
		for b, x := range pp.bufs {
			width[b] = lifetime(x)
		}
	}
	s := &exactSearch{
		pp:      pp,
		n:       n,
		width:   width,
		secBufs: make([][]int32, nsec),
		rank:    make([]int32, n),
		minOff:  make([]uint64, n),
		placed:  make([]bool, n),
		sol:     make([]uint64, n),
		floor:   make([]uint64, nsec),
		total:   make([]uint64, nsec),
		cuts:    make([]int32, nsec),
		stamp:   make([]int32, nsec),
	}
	for b := range n {
		for sec := pp.secLo[b]; sec < pp.secHi[b]; sec++ {
			s.secBufs[sec] = append(s.secBufs[sec], int32(b))
		}
	}
	return s
}

// decide looks for a placement of height at most capacity with at most
// budget nodes (0: no limit) and before the deadline (the zero time:
// none). It returns the offsets found (a copy), or says that none exists
// (decideInfeasible: a proof) or that the search stopped first.
func (s *exactSearch) decide(capacity uint64, budget int64) ([]uint64, int) {
	s.capacity = capacity
	parts := (&search{pp: s.pp, n: s.n}).partitions()
	var spent int64
	limit := int64(2 * max(s.n, 1))
	for {
		for pre := range exactPreorders {
			lim := limit
			if budget > 0 {
				lim = min(lim, budget-spent)
			}
			if lim <= 0 || s.late {
				return nil, decideStopped
			}
			s.nodes, s.stopped = lim, false
			ok := true
			for _, p := range parts {
				s.reset(p, pre)
				if !s.dfs(p, slices.Clone(p.bufs), len(p.bufs), 0, -1) {
					ok = false
					break
				}
			}
			spent += lim - s.nodes
			s.used += lim - s.nodes
			if ok {
				return slices.Clone(s.sol), decideFound
			}
			if !s.stopped {
				return nil, decideInfeasible
			}
		}
		limit *= 2
	}
}

// reset prepares the state for partition p with preorder pre: nothing of
// p placed.
func (s *exactSearch) reset(p partition, pre int) {
	pp := s.pp
	for _, b := range p.bufs {
		s.placed[b] = false
		s.minOff[b] = 0
	}
	for sec := p.lo; sec < p.hi; sec++ {
		s.floor[sec] = 0
		s.total[sec] = pp.secLoad[sec]
		s.cuts[sec] = 0
	}
	s.totals.build(s.total)
	for _, b := range p.bufs {
		for k := pp.secLo[b]; k+1 < pp.secHi[b]; k++ {
			s.cuts[k]++
		}
	}
	s.pre = pre
	s.rankBlocks(p.bufs, pre)
	s.minLog, s.floorLog = s.minLog[:0], s.floorLog[:0]
}

// rankBlocks sets the rank of each block of bufs by preorder pre, ties
// broken by index; a block's T is the most bytes still to place at a
// section of its lifetime, as MiniMalloc takes it where a (sub)problem
// starts.
func (s *exactSearch) rankBlocks(bufs []int32, pre int) {
	order := slices.Clone(bufs)
	keys := exactPreorders[pre]
	pp := s.pp
	if len(s.tload) < s.n {
		s.tload = make([]uint64, s.n)
	}
	for _, b := range bufs {
		s.tload[b] = s.totals.max(int(pp.secLo[b]), int(pp.secHi[b]))
	}
	slices.SortFunc(order, func(a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		for _, k := range keys {
			var c int
			switch k {
			case 'W':
				c = cmp.Compare(s.width[b], s.width[a])
			case 'A':
				c = cmp.Compare(float64(y.size)*float64(s.width[b]), float64(x.size)*float64(s.width[a]))
			case 'T':
				c = cmp.Compare(s.tload[b], s.tload[a])
			}
			if c != 0 {
				return c
			}
		}
		return cmp.Compare(a, b)
	})
	for r, b := range order {
		s.rank[b] = int32(r)
	}
}

// tick counts one node; it reports false, and marks the run stopped, when
// the run has no node left or the deadline has passed (the clock read
// every 256 nodes).
func (s *exactSearch) tick() bool {
	if s.nodes <= 0 || s.late {
		s.stopped = true
		return false
	}
	s.nodes--
	if s.nodes&255 == 0 && !s.deadline.IsZero() && time.Now().After(s.deadline) {
		s.late = true
	}
	return true
}

// dfs places the blocks of p still to place, list[:left] in any order
// (dfs sorts it, and the levels below reorder it), each offset at least
// lastOff (and, at lastOff, of a rank above lastRank): the levels of one
// subproblem share one list, so the search holds the blocks once, not
// once a level. It reports whether it found a placement (its offsets in
// s.sol); s.stopped says whether the run stopped.
func (s *exactSearch) dfs(p partition, list []int32, left int, lastOff uint64, lastRank int32) bool {
	if left == 0 {
		return true
	}
	cur := list[:left]
	s.sortBlocks(cur)
	minTop := ^uint64(0)
	for _, b := range cur {
		minTop = min(minTop, s.minOff[b]+s.pp.bufs[b].size)
	}
	// Every block still to place goes at or above the offset tried, so
	// the bytes still to place at any section of p stack above it.
	most := s.totals.max(int(p.lo), int(p.hi))
	// Candidates in order of (minimum offset, rank); the canonical ones
	// come after the block placed last.
	for k := s.after(cur, lastOff, lastRank); k < left; {
		b := cur[k]
		off, rank := s.minOff[b], s.rank[b]
		if off >= minTop {
			break // dominated: a block still to place fits below off
		}
		if off > s.capacity || most > s.capacity-off {
			break // spatial inference, for this and every later candidate
		}
		if !s.tick() {
			break
		}
		ml, fl := len(s.minLog), len(s.floorLog)
		hatless := s.place(b, off)
		cur[k], cur[left-1] = cur[left-1], cur[k]
		ok := s.floorsFit(fl) && s.next(p, list, left-1, b, off, rank)
		s.unplace(b, ml, fl)
		if ok {
			s.sol[b] = off
			return true
		}
		if s.stopped || hatless {
			return false
		}
		// The minimum offsets are as they were: sorted again, the
		// list is in this level's order; go on after b.
		s.sortBlocks(cur)
		k = s.after(cur, off, rank)
	}
	return false
}

// sortBlocks sorts list by minimum offset, then rank: by insertion while
// it is nearly in order (a placement raises a few minimum offsets), else
// by a sort of its own.
func (s *exactSearch) sortBlocks(list []int32) {
	less := func(a, b int32) bool {
		return s.minOff[a] < s.minOff[b] || s.minOff[a] == s.minOff[b] && s.rank[a] < s.rank[b]
	}
	moves := 0
	for i := 1; i < len(list); i++ {
		x, j := list[i], i-1
		for ; j >= 0 && less(x, list[j]); j-- {
			list[j+1] = list[j]
			moves++
		}
		list[j+1] = x
		if moves > 4*len(list) {
			slices.SortFunc(list, func(a, b int32) int {
				return cmpChain(cmp.Compare(s.minOff[a], s.minOff[b]), cmp.Compare(s.rank[a], s.rank[b]))
			})
			return
		}
	}
}

// after returns the index of the first block of sorted whose (minimum
// offset, rank) is above (off, rank).
func (s *exactSearch) after(sorted []int32, off uint64, rank int32) int {
	k, _ := slices.BinarySearchFunc(sorted, off, func(b int32, off uint64) int {
		return cmpChain(cmp.Compare(s.minOff[b], off), cmp.Compare(s.rank[b], rank+1)) // rank+1: above rank
	})
	return k
}

// next goes on after block b was placed at off in p, list[:left] the
// blocks of p still to place: with the rest of p, or, where no block
// still to place is live across a section boundary inside b's lifetime
// any more, with each part of p between such boundaries on its own.
func (s *exactSearch) next(p partition, list []int32, left int, b int32, off uint64, rank int32) bool {
	pp := s.pp
	var cut []int32
	for k := pp.secLo[b]; k+1 < pp.secHi[b]; k++ {
		s.cuts[k]--
		if s.cuts[k] == 0 && k+1 > p.lo && k+1 < p.hi {
			cut = append(cut, k+1)
		}
	}
	defer func() {
		for k := pp.secLo[b]; k+1 < pp.secHi[b]; k++ {
			s.cuts[k]++
		}
	}()
	if len(cut) == 0 {
		return s.dfs(p, list, left, off, rank)
	}
	parts := make([]partition, 0, len(cut)+1)
	lo := p.lo
	for _, k := range cut {
		parts = append(parts, partition{lo: lo, hi: k})
		lo = k
	}
	parts = append(parts, partition{lo: lo, hi: p.hi})
	for _, o := range list[:left] {
		// The part that holds o's first section (o crosses no cut).
		i, _ := slices.BinarySearchFunc(parts, pp.secLo[o], func(q partition, sec int32) int {
			switch {
			case q.hi <= sec:
				return -1
			case q.lo > sec:
				return 1
			}
			return 0
		})
		parts[i].bufs = append(parts[i].bufs, o)
	}
	for _, q := range parts {
		if len(q.bufs) > 0 && !s.subSolve(q) {
			return false
		}
	}
	return true
}

// subSolve is dfs of subproblem q, its blocks ranked anew by the bytes
// still to place (rankBlocks), their ranks restored after.
func (s *exactSearch) subSolve(q partition) bool {
	base := len(s.saved)
	for _, b := range q.bufs {
		s.saved = append(s.saved, s.rank[b])
	}
	s.rankBlocks(q.bufs, s.pre)
	ok := s.dfs(q, slices.Clone(q.bufs), len(q.bufs), 0, -1)
	for k, b := range q.bufs {
		s.rank[b] = s.saved[base+k]
	}
	s.saved = s.saved[:base]
	return ok
}

// place puts block b at offset off and brings the minimum offsets and the
// sections' floors and totals up to date, logging the old values. It
// reports whether b is hatless: no block live at the same time is still
// to place.
func (s *exactSearch) place(b int32, off uint64) bool {
	pp := s.pp
	size := pp.bufs[b].size
	top := off + size
	s.placed[b] = true
	s.query++
	s.affected = s.affected[:0]
	hatless := true
	for _, o := range pp.adj[b] {
		if s.placed[o] {
			continue
		}
		hatless = false
		if s.minOff[o] >= top {
			continue
		}
		s.minLog = append(s.minLog, change{o, s.minOff[o]})
		s.minOff[o] = top
		for sec := pp.secLo[o]; sec < pp.secHi[o]; sec++ {
			if s.stamp[sec] != s.query {
				s.stamp[sec] = s.query
				s.affected = append(s.affected, sec)
			}
		}
	}
	for sec := pp.secLo[b]; sec < pp.secHi[b]; sec++ {
		s.floorLog = append(s.floorLog, change{sec, s.floor[sec]})
		s.floor[sec] = top
		s.total[sec] -= size
	}
	s.totals.add(int(pp.secLo[b]), int(pp.secHi[b]), -size)
	// A section's floor is at least the least minimum offset of the
	// blocks still to place there.
	for _, sec := range s.affected {
		low := ^uint64(0)
		for _, o := range s.secBufs[sec] {
			if !s.placed[o] {
				low = min(low, s.minOff[o])
			}
		}
		if low != ^uint64(0) && low > s.floor[sec] {
			s.floorLog = append(s.floorLog, change{sec, s.floor[sec]})
			s.floor[sec] = low
		}
	}
	return hatless
}

// unplace undoes place(b) back to the given log lengths.
func (s *exactSearch) unplace(b int32, ml, fl int) {
	for i := len(s.floorLog) - 1; i >= fl; i-- {
		s.floor[s.floorLog[i].i] = s.floorLog[i].old
	}
	s.floorLog = s.floorLog[:fl]
	for i := len(s.minLog) - 1; i >= ml; i-- {
		s.minOff[s.minLog[i].i] = s.minLog[i].old
	}
	s.minLog = s.minLog[:ml]
	pp := s.pp
	size := pp.bufs[b].size
	for sec := pp.secLo[b]; sec < pp.secHi[b]; sec++ {
		s.total[sec] += size
	}
	s.totals.add(int(pp.secLo[b]), int(pp.secHi[b]), size)
	s.placed[b] = false
}

// floorsFit reports whether every section whose floor changed since
// floorLog had length fl still holds the blocks to place there, stacked
// from its floor, under the capacity. (A section whose floor did not
// change had it checked when it was set, with as many bytes or more.)
func (s *exactSearch) floorsFit(fl int) bool {
	for _, c := range s.floorLog[fl:] {
		f := s.floor[c.i]
		if f > s.capacity || s.total[c.i] > s.capacity-f {
			return false
		}
	}
	return true
}
