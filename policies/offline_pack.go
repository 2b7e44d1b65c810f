package policies

import (
	"cmp"
	"slices"
)

// This file solves the static placement problem of the offline policies:
// blocks with known lifetimes [start, end) in trace events and sizes in
// bytes get offsets such that blocks live at the same time never overlap,
// and the height (the highest end of a block) is as low as the greedy
// portfolio and the budgeted search can make it.

// packBuf is a block to place: live over [start, end), size bytes (already
// rounded to the alignment), for malloc call number call.
type packBuf struct {
	start, end int64
	size       uint64
	call       int
}

// packResult is a placement: an offset per block and the height.
type packResult struct {
	offsets []uint64
	height  uint64
	stats   PlanStats
}

// packProblem is the problem with the derived data the heuristics use.
type packProblem struct {
	bufs []packBuf
	// Sections are the maximal runs of time over which the set of live
	// blocks does not change; block b spans sections [secLo[b], secHi[b]).
	secLo, secHi []int32
	secLoad      []uint64 // bytes live in each section
	// load is the largest section load over each block's lifetime.
	load []uint64
	// adj lists the blocks that overlap each block in time, nil when
	// there are too many pairs to list.
	adj [][]int32
	lb  uint64 // the largest section load: a lower bound on the height
}

// maxPairs bounds the overlapping pairs listed in packProblem.adj (and so
// the memory and time of the greedy placements); above it the greedy
// placements find the overlapping blocks by sweeping the sections instead.
const maxPairs = 4 << 20

// maxSearchBlocks bounds the blocks of a problem the search is tried on.
const maxSearchBlocks = 4000

func newPackProblem(bufs []packBuf) *packProblem {
	n := len(bufs)
	pp := &packProblem{bufs: bufs, secLo: make([]int32, n), secHi: make([]int32, n), load: make([]uint64, n)}
	if n == 0 {
		return pp
	}
	// Sections are the maximal sets of blocks live at once (as
	// MiniMalloc's sweep makes them): the live set just before an end
	// that follows a start. Ends sort before starts at equal times, as
	// lifetimes are half-open.
	type point struct {
		t     int64
		start bool
		b     int32
	}
	pts := make([]point, 0, 2*n)
	for i, b := range bufs {
		pts = append(pts, point{b.start, true, int32(i)}, point{b.end, false, int32(i)})
	}
	slices.SortFunc(pts, func(x, y point) int {
		if c := cmp.Compare(x.t, y.t); c != 0 {
			return c
		}
		if x.start != y.start {
			if x.start {
				return 1
			}
			return -1
		}
		return cmp.Compare(x.b, y.b)
	})
	var cur uint64
	grown := false
	for _, pt := range pts {
		b := bufs[pt.b]
		if pt.start {
			pp.secLo[pt.b] = int32(len(pp.secLoad))
			cur += b.size
			grown = true
			continue
		}
		if grown {
			pp.secLoad = append(pp.secLoad, cur)
			pp.lb = max(pp.lb, cur)
			grown = false
		}
		pp.secHi[pt.b] = int32(len(pp.secLoad))
		cur -= b.size
	}
	var pairs int64
	// Largest load over each block's sections, by a sparse table.
	pp.load = rangeMax(pp.secLoad, pp.secLo, pp.secHi)
	// Overlapping pairs: each block meets those live at its start and
	// those starting during its life; count them first.
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(bufs[a].start, bufs[b].start) })
	ends := make([]int64, 0, n)
	for _, i := range order {
		b := bufs[i]
		for len(ends) > 0 && ends[0] <= b.start {
			ends = heapPop(ends)
		}
		pairs += int64(len(ends))
		ends = heapPush(ends, b.end)
	}
	if pairs <= maxPairs {
		pp.adj = make([][]int32, n)
		active := make([]int32, 0)
		for _, i := range order {
			b := bufs[i]
			k := 0
			for _, j := range active {
				if bufs[j].end > b.start {
					active[k] = j
					k++
				}
			}
			active = active[:k]
			for _, j := range active {
				pp.adj[i] = append(pp.adj[i], j)
				pp.adj[j] = append(pp.adj[j], i)
			}
			active = append(active, i)
		}
	}
	return pp
}

// rangeMax returns, for each i, the largest of v[lo[i]:hi[i]] (0 if empty).
func rangeMax(v []uint64, lo, hi []int32) []uint64 {
	n := len(v)
	table := [][]uint64{v}
	for w := 1; 2*w <= n; w *= 2 {
		prev := table[len(table)-1]
		next := make([]uint64, n-2*w+1)
		for i := range next {
			next[i] = max(prev[i], prev[i+w])
		}
		table = append(table, next)
	}
	out := make([]uint64, len(lo))
	for i := range lo {
		l, h := int(lo[i]), int(hi[i])
		if h <= l {
			continue
		}
		k := 0
		for 1<<(k+1) <= h-l {
			k++
		}
		out[i] = max(table[k][l], table[k][h-(1<<k)])
	}
	return out
}

// heapPush and heapPop keep a min-heap of int64.
func heapPush(h []int64, x int64) []int64 {
	h = append(h, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []int64) []int64 {
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h[l] < h[m] {
			m = l
		}
		if r < n && h[r] < h[m] {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return h
}

// greedyOrder is an order in which the greedy placement takes the blocks.
type greedyOrder struct {
	name string
	cmp  func(pp *packProblem, a, b int32) int
}

func lifetime(b packBuf) int64 { return b.end - b.start }

var (
	orderBySize = greedyOrder{"size", func(pp *packProblem, a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		return cmpChain(cmp.Compare(y.size, x.size), cmp.Compare(lifetime(y), lifetime(x)), cmp.Compare(x.start, y.start))
	}}
	orderByLifetime = greedyOrder{"lifetime", func(pp *packProblem, a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		return cmpChain(cmp.Compare(lifetime(y), lifetime(x)), cmp.Compare(y.size, x.size), cmp.Compare(x.start, y.start))
	}}
	orderByArea = greedyOrder{"area", func(pp *packProblem, a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		ax, ay := float64(x.size)*float64(lifetime(x)), float64(y.size)*float64(lifetime(y))
		return cmpChain(cmp.Compare(ay, ax), cmp.Compare(y.size, x.size), cmp.Compare(x.start, y.start))
	}}
	// orderByLoad takes first the blocks live at the most loaded moments
	// (greedy by breadth), the largest first among those.
	orderByLoad = greedyOrder{"load", func(pp *packProblem, a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		return cmpChain(cmp.Compare(pp.load[b], pp.load[a]), cmp.Compare(y.size, x.size), cmp.Compare(lifetime(y), lifetime(x)), cmp.Compare(x.start, y.start))
	}}
	// orderByStart is the order of the trace: the placement an online
	// best-fit allocator would make with one arena.
	orderByStart = greedyOrder{"start", func(pp *packProblem, a, b int32) int {
		x, y := pp.bufs[a], pp.bufs[b]
		return cmpChain(cmp.Compare(x.start, y.start), cmp.Compare(y.size, x.size))
	}}
)

// greedyOrders is the greedy portfolio of Offline.
var greedyOrders = []greedyOrder{orderBySize, orderByLoad, orderByStart, orderByLifetime, orderByArea}

func cmpChain(cs ...int) int {
	for _, c := range cs {
		if c != 0 {
			return c
		}
	}
	return 0
}

// sortedBy returns the block indices in order o, ties broken by index.
func (pp *packProblem) sortedBy(o greedyOrder) []int32 {
	order := make([]int32, len(pp.bufs))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return o.cmp(pp, a, b) })
	return order
}

type interval struct{ lo, hi uint64 }

// greedy places the blocks in the given order, each at the lowest offset
// of the smallest gap that fits among the placed blocks it overlaps in
// time, or above them all when no gap fits. It returns the offsets and
// the height.
func (pp *packProblem) greedy(order []int32) ([]uint64, uint64) {
	n := len(pp.bufs)
	offsets := make([]uint64, n)
	placed := make([]bool, n)
	var height uint64
	var ivs, scratch []interval
	var sweep *sectionIndex
	if pp.adj == nil {
		sweep = newSectionIndex(pp)
	}
	for _, b := range order {
		ivs = ivs[:0]
		if sweep != nil {
			ivs = sweep.overlapping(b, offsets, ivs)
		} else {
			for _, o := range pp.adj[b] {
				if placed[o] {
					ivs = append(ivs, interval{offsets[o], offsets[o] + pp.bufs[o].size})
				}
			}
		}
		scratch = sortByLo(ivs, scratch)
		off := bestFit(ivs, pp.bufs[b].size)
		if pp.bufs[b].size > maxPlanHeight-min(off, maxPlanHeight) {
			// Checked: the block would end past the plan's largest
			// arena (the sum could wrap); it is left out, an OOM.
			offsets[b] = noOffset
			continue
		}
		offsets[b] = off
		placed[b] = true
		if sweep != nil {
			sweep.add(b)
		}
		height = max(height, off+pp.bufs[b].size)
	}
	return offsets, height
}

// sortByLo sorts ivs by lo, the order of intervals of equal lo
// unspecified (bestFit's answer does not depend on it), and returns
// scratch, grown to len(ivs) if it was shorter, for the next call. Past a
// few dozen intervals it is a radix sort, least significant byte first,
// over the bytes in which the los differ. On kv_decode a pass of the
// offline planners' greedy sorts 22 million intervals, 91 a block on
// average and up to 135255; slices.SortFunc's comparisons took a third of
// `replay sim --policy all`, and `replay sim --policy offline` took 4.7 to
// 5.0 s with them, 3.4 to 3.5 s with this sort (packing each lo and index
// into a uint64 for slices.Sort: 3.8 to 4.2 s).
func sortByLo(ivs, scratch []interval) []interval {
	if len(ivs) < 64 {
		for i := 1; i < len(ivs); i++ {
			for j := i; j > 0 && ivs[j].lo < ivs[j-1].lo; j-- {
				ivs[j], ivs[j-1] = ivs[j-1], ivs[j]
			}
		}
		return scratch
	}
	if cap(scratch) < len(ivs) {
		scratch = make([]interval, len(ivs))
	}
	var diff uint64
	for _, iv := range ivs {
		diff |= iv.lo ^ ivs[0].lo
	}
	src, dst := ivs, scratch[:len(ivs)]
	for shift := 0; shift < 64 && diff>>shift != 0; shift += 8 {
		if diff>>shift&0xff == 0 {
			continue
		}
		var at [256]int
		for _, iv := range src {
			at[iv.lo>>shift&0xff]++
		}
		sum := 0
		for d, n := range at {
			at[d] = sum
			sum += n
		}
		for _, iv := range src {
			d := iv.lo >> shift & 0xff
			dst[at[d]] = iv
			at[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &ivs[0] {
		copy(ivs, src)
	}
	return scratch
}

// bestFit returns the offset of a block of size bytes among the occupied
// intervals ivs, sorted by lo (sortByLo): the start of the smallest gap
// that holds it, the lowest among equals, else the end of the highest
// interval.
func bestFit(ivs []interval, size uint64) uint64 {
	var cur uint64
	best, bestGap := uint64(0), ^uint64(0)
	found := false
	for _, iv := range ivs {
		if iv.lo > cur {
			if gap := iv.lo - cur; gap >= size && gap < bestGap {
				best, bestGap, found = cur, gap, true
			}
		}
		cur = max(cur, iv.hi)
	}
	if !found {
		return cur
	}
	return best
}

// sectionIndex finds the placed blocks that overlap a block in time
// without a list of pairs: a segment tree over the sections, each placed
// block stored at the O(log n) nodes that cover its sections exactly. A
// block overlaps every block stored at a node whose range meets its own
// sections; a node with nothing stored below it is skipped. A block stored
// at several such nodes is reported once per query, by a stamp.
type sectionIndex struct {
	pp    *packProblem
	size  int       // leaves: a power of two >= the number of sections
	here  [][]int32 // blocks stored at each node (1 is the root)
	below []int32   // blocks stored in each node's subtree
	stamp []int32
	query int32
}

func newSectionIndex(pp *packProblem) *sectionIndex {
	size := 1
	for size < len(pp.secLoad) {
		size *= 2
	}
	return &sectionIndex{pp: pp, size: size, here: make([][]int32, 2*size), below: make([]int32, 2*size), stamp: make([]int32, len(pp.bufs))}
}

func (x *sectionIndex) overlapping(b int32, offsets []uint64, ivs []interval) []interval {
	x.query++
	lo, hi := int(x.pp.secLo[b]), int(x.pp.secHi[b])
	var visit func(node, nl, nr int)
	visit = func(node, nl, nr int) {
		if nr <= lo || hi <= nl || x.below[node] == 0 {
			return
		}
		for _, o := range x.here[node] {
			if x.stamp[o] != x.query {
				x.stamp[o] = x.query
				ivs = append(ivs, interval{offsets[o], offsets[o] + x.pp.bufs[o].size})
			}
		}
		if nr-nl > 1 && x.below[node] > int32(len(x.here[node])) {
			m := (nl + nr) / 2
			visit(2*node, nl, m)
			visit(2*node+1, m, nr)
		}
	}
	visit(1, 0, x.size)
	return ivs
}

func (x *sectionIndex) add(b int32) {
	lo, hi := int(x.pp.secLo[b]), int(x.pp.secHi[b])
	var put func(node, nl, nr int)
	put = func(node, nl, nr int) {
		if nr <= lo || hi <= nl {
			return
		}
		x.below[node]++
		if lo <= nl && nr <= hi {
			x.here[node] = append(x.here[node], b)
			return
		}
		m := (nl + nr) / 2
		put(2*node, nl, m)
		put(2*node+1, m, nr)
	}
	put(1, 0, x.size)
}

// solvePacking places bufs: the best of the greedy orders, then, with a
// node budget and a problem small enough, the search for a lower height.
func solvePacking(bufs []packBuf, orders []greedyOrder, nodes int64) packResult {
	pp := newPackProblem(bufs)
	res := packResult{offsets: make([]uint64, len(bufs))}
	res.stats = PlanStats{Blocks: len(bufs), LowerBound: pp.lb, Heights: map[string]uint64{}}
	if len(bufs) == 0 {
		return res
	}
	first := true
	for _, o := range orders {
		if !first && res.height == pp.lb {
			break // optimal already
		}
		offs, h := pp.greedy(pp.sortedBy(o))
		res.stats.Heights[o.name] = h
		if first || h < res.height {
			res.offsets, res.height = offs, h
			res.stats.Greedy, res.stats.GreedyBy = h, o.name
			first = false
		}
	}
	if nodes > 0 && res.height > pp.lb && len(bufs) <= maxSearchBlocks && pp.adj != nil {
		res.stats.Searched = true
		s := newSearch(pp)
		if offs, h, used := s.minimize(res.height, nodes); offs != nil && h < res.height {
			res.offsets, res.height = offs, h
			res.stats.Nodes = used
		} else {
			res.stats.Nodes = used
		}
	}
	res.stats.Height = res.height
	return res
}
