package policies

import (
	"cmp"
	"slices"
)

// This file is the offline policy's search for a placement under a given
// height (a capacity), after the canonical search of MiniMalloc (Moffitt,
// ASPLOS 2023; google/minimalloc, src/solver.cc), written anew for this
// problem. Blocks are placed in non-decreasing order of offset, each at its
// minimum offset (the top of the placed blocks it overlaps in time): every
// placement can be pushed down into that form, so no solution is lost. A
// branch is cut when a block would leave a gap below the top of another
// block still to place (dominance), or when at some section (a moment of
// the trace) the blocks still to place there cannot stack under the
// capacity above the section's floor.

// search holds the state of the depth-first search.
type search struct {
	pp      *packProblem
	n       int
	secBufs [][]int32 // blocks by section

	capacity uint64
	rank     []int32 // position of each block in the preorder
	minOff   []uint64
	offset   []uint64
	placed   []bool
	floor    []uint64 // per section: the lowest offset a block still to place there can take
	total    []uint64 // per section: bytes of the blocks still to place there
	totals   maxTree  // total, for the largest over a partition

	pre     int   // the preorder in use
	nodes   int64 // budget left
	aborted bool
	sol     []uint64 // offsets of the placement found
	// cuts[k] counts the blocks still to place that are live in both
	// section k and section k+1: at 0, the blocks left on either side
	// are independent subproblems.
	cuts []int32

	minLog   []change
	floorLog []change
	affected []int32
	stamp    []int32
	query    int32
	cands    []cand // candidate lists of the recursion levels, stacked
}

type change struct {
	i   int32
	old uint64
}

type cand struct {
	off  uint64
	rank int32
	b    int32
}

// partition is a run of sections [lo, hi) that no block crosses out of,
// with its blocks: a subproblem solved on its own.
type partition struct {
	lo, hi int32
	bufs   []int32
}

func newSearch(pp *packProblem) *search {
	n := len(pp.bufs)
	nsec := len(pp.secLoad)
	s := &search{
		pp:      pp,
		n:       n,
		secBufs: make([][]int32, nsec),
		rank:    make([]int32, n),
		minOff:  make([]uint64, n),
		offset:  make([]uint64, n),
		placed:  make([]bool, n),
		floor:   make([]uint64, nsec),
		total:   make([]uint64, nsec),
		stamp:   make([]int32, nsec),
		sol:     make([]uint64, n),
		cuts:    make([]int32, nsec),
	}
	for b := range n {
		for sec := pp.secLo[b]; sec < pp.secHi[b]; sec++ {
			s.secBufs[sec] = append(s.secBufs[sec], int32(b))
		}
	}
	return s
}

// partitions splits the problem where no block is live across a section
// boundary.
func (s *search) partitions() []partition {
	pp := s.pp
	nsec := int32(len(pp.secLoad))
	// reach[k] is the furthest section end of the blocks starting at or
	// before section k.
	reach := make([]int32, nsec+1)
	for b := range s.n {
		reach[pp.secLo[b]] = max(reach[pp.secLo[b]], pp.secHi[b])
	}
	var parts []partition
	var lo, far int32
	for k := range nsec {
		far = max(far, reach[k])
		if far <= k+1 {
			parts = append(parts, partition{lo: lo, hi: k + 1})
			lo = k + 1
		}
	}
	for b := range s.n {
		// Find the partition of b by its first section.
		i, _ := slices.BinarySearchFunc(parts, pp.secLo[b], func(p partition, sec int32) int {
			switch {
			case p.hi <= sec:
				return -1
			case p.lo > sec:
				return 1
			}
			return 0
		})
		parts[i].bufs = append(parts[i].bufs, int32(b))
	}
	return slices.DeleteFunc(parts, func(p partition) bool { return len(p.bufs) == 0 })
}

// preorders are the static orders that break ties among blocks of equal
// minimum offset, tried in turn: after MiniMalloc's WAT, TAW and TWA, keys
// of width (here the number of sections the lifetime spans), area (size
// times lifetime) and total (the largest load of a section of the
// lifetime), each decreasing.
var preorders = [][3]byte{{'W', 'A', 'T'}, {'T', 'A', 'W'}, {'T', 'W', 'A'}}

// rankBlocks sets the rank of each block of bufs by the current preorder.
func (s *search) rankBlocks(bufs []int32) {
	type key struct {
		b int32
		w int64
		a float64
		t uint64
	}
	keys := make([]key, len(bufs))
	pre := preorders[s.pre]
	for i, b := range bufs {
		x := s.pp.bufs[b]
		keys[i] = key{b, int64(s.pp.secHi[b] - s.pp.secLo[b]), float64(x.size) * float64(lifetime(x)), s.pp.load[b]}
	}
	slices.SortFunc(keys, func(x, y key) int {
		for _, k := range pre {
			var c int
			switch k {
			case 'W':
				c = cmp.Compare(y.w, x.w)
			case 'A':
				c = cmp.Compare(y.a, x.a)
			case 'T':
				c = cmp.Compare(y.t, x.t)
			}
			if c != 0 {
				return c
			}
		}
		return cmp.Compare(x.b, y.b)
	})
	for r, k := range keys {
		s.rank[k.b] = int32(r)
	}
}

// probe outcomes.
const (
	probeFound = iota
	probeInfeasible
	probeAborted
)

// minimize looks for a placement lower than ub (the height of a placement
// already known) with at most budget nodes. It returns the best placement
// found (nil if none lower than ub), its height and the nodes used.
func (s *search) minimize(ub uint64, budget int64) ([]uint64, uint64, int64) {
	parts := s.partitions()
	// Every height is a multiple of align, the largest power of two
	// that divides every size.
	align := ^uint64(0)
	for _, b := range s.pp.bufs {
		align = min(align, b.size&-b.size)
	}
	lo, hi := s.pp.lb, ub
	var best []uint64
	left := budget
	for lo < hi && left > 0 {
		// The lower bound first, with half the budget; then halve the
		// gap, each probe with half the budget left.
		c := lo
		if best != nil || c != s.pp.lb {
			c = lo + (hi-lo)/2/align*align
		}
		share := max(left/2, min(left, int64(4*s.n)))
		offs, outcome, used := s.probe(parts, c, share)
		left -= used
		switch outcome {
		case probeFound:
			best = offs
			var h uint64
			for b, off := range offs {
				h = max(h, off+s.pp.bufs[b].size)
			}
			hi = h
		default:
			// Infeasible, or not found within the share: look higher.
			lo = c + align
		}
	}
	if best == nil {
		return nil, ub, budget - left
	}
	return best, hi, budget - left
}

// probe looks for a placement of height at most capacity, trying each
// preorder with a node limit that doubles (MiniMalloc's round robin), all
// within budget nodes.
func (s *search) probe(parts []partition, capacity uint64, budget int64) ([]uint64, int, int64) {
	s.capacity = capacity
	used := int64(0)
	limit := int64(2 * s.n)
	for {
		for pre := range preorders {
			lim := min(limit, budget-used)
			if lim <= 0 {
				return nil, probeAborted, used
			}
			s.pre = pre
			s.nodes = lim
			s.aborted = false
			ok := true
			for _, p := range parts {
				s.reset(p)
				if !s.dfs(p, 0, -1) {
					ok = false
					break
				}
			}
			used += lim - s.nodes
			if ok {
				return slices.Clone(s.sol), probeFound, used
			}
			if !s.aborted {
				return nil, probeInfeasible, used
			}
		}
		limit *= 2
	}
}

// reset prepares the state for partition p: nothing placed.
func (s *search) reset(p partition) {
	for _, b := range p.bufs {
		s.placed[b] = false
		s.minOff[b] = 0
	}
	for sec := p.lo; sec < p.hi; sec++ {
		s.floor[sec] = 0
		s.total[sec] = s.pp.secLoad[sec]
	}
	s.totals.build(s.total)
	s.rankBlocks(p.bufs)
	for k := p.lo; k < p.hi; k++ {
		s.cuts[k] = 0
	}
	for _, b := range p.bufs {
		for k := s.pp.secLo[b]; k+1 < s.pp.secHi[b]; k++ {
			s.cuts[k]++
		}
	}
	s.minLog, s.floorLog = s.minLog[:0], s.floorLog[:0]
	s.cands = s.cands[:0]
}

// dfs places the blocks of p still to place, every offset at least lastOff
// (and, at lastOff, of a rank above lastRank). It reports whether it found
// a placement; s.aborted says whether it ran out of nodes (placements
// tried).
func (s *search) dfs(p partition, lastOff uint64, lastRank int32) bool {
	return s.dfsFrom(p, lastOff, lastRank, -1, 0)
}

// dfsFrom is dfs; when from >= 0, the blocks of p still to place are among
// s.cands[from:from+fromN], the parent level's candidates, already nearly
// in order.
func (s *search) dfsFrom(p partition, lastOff uint64, lastRank int32, from, fromN int) bool {
	base := len(s.cands)
	minHeight := ^uint64(0)
	if from < 0 {
		for _, b := range p.bufs {
			if !s.placed[b] {
				s.cands = append(s.cands, cand{off: s.minOff[b], rank: s.rank[b], b: b})
				minHeight = min(minHeight, s.minOff[b]+s.pp.bufs[b].size)
			}
		}
	} else {
		for i := from; i < from+fromN; i++ {
			if b := s.cands[i].b; !s.placed[b] {
				s.cands = append(s.cands, cand{off: s.minOff[b], rank: s.rank[b], b: b})
				minHeight = min(minHeight, s.minOff[b]+s.pp.bufs[b].size)
			}
		}
	}
	cands := s.cands[base:]
	if len(cands) == 0 {
		return true
	}
	if from < 0 {
		slices.SortFunc(cands, func(x, y cand) int {
			if x.off != y.off {
				return cmp.Compare(x.off, y.off)
			}
			return cmp.Compare(x.rank, y.rank)
		})
	} else {
		// Placing a block only raises minimum offsets: few moves.
		for i := 1; i < len(cands); i++ {
			x := cands[i]
			j := i - 1
			for j >= 0 && (x.off < cands[j].off || x.off == cands[j].off && x.rank < cands[j].rank) {
				cands[j+1] = cands[j]
				j--
			}
			cands[j+1] = x
		}
	}
	// Every block placed from here is at least at its offset, so the
	// blocks still to place at any section stack above it.
	maxTotal := s.totals.max(int(p.lo), int(p.hi))
	found := false
	for k := 0; k < len(cands); k++ {
		c := s.cands[base+k] // s.cands may grow (and move) below
		if c.off < lastOff || (c.off == lastOff && c.rank < lastRank) {
			continue
		}
		if c.off >= minHeight {
			break // a gap under a block still to place: dominated
		}
		if c.off > s.capacity || maxTotal > s.capacity-c.off {
			break // and so for every later candidate
		}
		if s.nodes <= 0 {
			s.aborted = true
			break
		}
		s.nodes--
		ml, fl := len(s.minLog), len(s.floorLog)
		s.place(c.b, c.off)
		ok := s.floorsFit(fl) && s.next(p, c, base, len(cands))
		s.unplace(c.b, ml, fl)
		if ok {
			s.sol[c.b] = c.off
			found = true
			break
		}
		if s.aborted {
			break
		}
	}
	s.cands = s.cands[:base]
	return found
}

// next goes on after c was placed in p: with the rest of p, or, when no
// block still to place is live across some section boundaries in c's
// lifetime, with each of the parts p splits into there, on its own (after
// MiniMalloc's dynamic decomposition). Every part must succeed: a failure
// in one is not retried with other placements of another.
func (s *search) next(p partition, c cand, base, m int) bool {
	pp := s.pp
	b := c.b
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
		return s.dfsFrom(p, c.off, c.rank, base, m)
	}
	parts := make([]partition, 0, len(cut)+1)
	lo := p.lo
	for _, k := range cut {
		parts = append(parts, partition{lo: lo, hi: k})
		lo = k
	}
	parts = append(parts, partition{lo: lo, hi: p.hi})
	for _, o := range p.bufs {
		if s.placed[o] {
			continue
		}
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
		if len(q.bufs) == 0 {
			continue
		}
		if !s.dfs(q, 0, -1) {
			return false
		}
	}
	return true
}

// place puts block b at offset off and brings the minimum offsets and the
// sections' floors and totals up to date, logging the old values.
func (s *search) place(b int32, off uint64) {
	pp := s.pp
	top := off + pp.bufs[b].size
	s.placed[b] = true
	s.offset[b] = off
	s.query++
	s.affected = s.affected[:0]
	for _, o := range pp.adj[b] {
		if s.placed[o] || s.minOff[o] >= top {
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
		s.total[sec] -= pp.bufs[b].size
	}
	s.totals.add(int(pp.secLo[b]), int(pp.secHi[b]), -pp.bufs[b].size)
	// A section's floor is at least the lowest minimum offset of the
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
}

// unplace undoes place(b) back to the given log lengths.
func (s *search) unplace(b int32, ml, fl int) {
	for i := len(s.floorLog) - 1; i >= fl; i-- {
		s.floor[s.floorLog[i].i] = s.floorLog[i].old
	}
	s.floorLog = s.floorLog[:fl]
	for i := len(s.minLog) - 1; i >= ml; i-- {
		s.minOff[s.minLog[i].i] = s.minLog[i].old
	}
	s.minLog = s.minLog[:ml]
	pp := s.pp
	for sec := pp.secLo[b]; sec < pp.secHi[b]; sec++ {
		s.total[sec] += pp.bufs[b].size
	}
	s.totals.add(int(pp.secLo[b]), int(pp.secHi[b]), pp.bufs[b].size)
	s.placed[b] = false
}

// floorsFit reports whether the sections whose floor changed since
// floorLog had length fl can still hold the blocks to place there, stacked
// from the floor under the capacity. (For the other sections dfs checks
// the offset against the largest total; their floors were checked when
// they were set.)
func (s *search) floorsFit(fl int) bool {
	for _, c := range s.floorLog[fl:] {
		f := s.floor[c.i]
		if f > s.capacity || s.total[c.i] > s.capacity-f {
			return false
		}
	}
	return true
}

// maxTree is a segment tree over the sections: add a value to a range,
// take the largest over a range. Values are uint64 that stay non-negative;
// an add of a negative value is done in two's complement.
type maxTree struct {
	n      int
	mx, ad []uint64 // per node: largest in its range (its own adds included), adds to the whole range
}

func (t *maxTree) build(v []uint64) {
	t.n = len(v)
	if len(t.mx) < 4*t.n {
		t.mx = make([]uint64, 4*t.n)
		t.ad = make([]uint64, 4*t.n)
	}
	if t.n > 0 {
		t.buildNode(1, 0, t.n, v)
	}
}

func (t *maxTree) buildNode(x, l, r int, v []uint64) {
	t.ad[x] = 0
	if r-l == 1 {
		t.mx[x] = v[l]
		return
	}
	m := (l + r) / 2
	t.buildNode(2*x, l, m, v)
	t.buildNode(2*x+1, m, r, v)
	t.mx[x] = max(t.mx[2*x], t.mx[2*x+1])
}

func (t *maxTree) add(l, r int, d uint64) {
	if l < r {
		t.addNode(1, 0, t.n, l, r, d)
	}
}

func (t *maxTree) addNode(x, nl, nr, l, r int, d uint64) {
	if l <= nl && nr <= r {
		t.mx[x] += d
		t.ad[x] += d
		return
	}
	m := (nl + nr) / 2
	if l < m {
		t.addNode(2*x, nl, m, l, r, d)
	}
	if r > m {
		t.addNode(2*x+1, m, nr, l, r, d)
	}
	t.mx[x] = max(t.mx[2*x], t.mx[2*x+1]) + t.ad[x]
}

func (t *maxTree) max(l, r int) uint64 {
	if l >= r {
		return 0
	}
	return t.maxNode(1, 0, t.n, l, r)
}

func (t *maxTree) maxNode(x, nl, nr, l, r int) uint64 {
	if l <= nl && nr <= r {
		return t.mx[x]
	}
	m := (nl + nr) / 2
	var v uint64
	if l < m {
		v = t.maxNode(2*x, nl, m, l, r)
	}
	if r > m {
		v = max(v, t.maxNode(2*x+1, m, nr, l, r))
	}
	return v + t.ad[x]
}
