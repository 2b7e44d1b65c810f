package policies

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// This file makes STAlloc's plan (stalloc.go) from the events given to
// Plan: it finds the iterations, profiles the first ones, sorts the mallocs
// into classes and places the planned ones in the region.
//
// Times inside the plan are doubled event indices: a malloc at event i is
// at 2i, its free at event f at 2f, and the free of a failed malloc (which
// the replay makes at once) at 2i+1, so that every lifetime is a half-open
// interval [malloc, free) of the same clock.

// stClass is what the plan made of a malloc.
type stClass uint8

const (
	stOnline     stClass = iota // not planned: to the online manager
	stSmall                     // at most small bytes: to the online manager
	stPersistent                // before iteration 1, live at the end of the profile
	stOnce                      // before iteration 1, freed within the profile
	stStatic                    // iteration 1's, freed in its iteration, alike in every profiled one
	stCross                     // iteration 1's, freed in the next iteration, alike in every profiled one
	stDynamic                   // iteration 1's, of a size or lifetime that differs between profiled iterations
)

// stCall is one malloc call of the trace, in the order the replay makes
// them.
type stCall struct {
	size  uint64
	event int   // its event's index in the planned events
	free  int64 // the time of its free (doubled, see above), -1 if never freed
	iter  int   // its iteration, -1 before the first
	pos   int   // its position among its iteration's calls (in the trace before the first)
	class stClass
	// offset is the offset of a call before iteration 1 in the region,
	// noOffset when it is not planned.
	offset uint64
}

// stSlot is one position of the pattern: iteration 1's call at that
// position, as every later iteration's call at the same position is
// served.
type stSlot struct {
	size   uint64
	class  stClass
	offset uint64 // noOffset unless class is stStatic or stCross and it was placed
}

// stLife is a lifetime as the profile compares them: where the free falls
// relative to the calls of the iteration of the malloc (kind stWithin) or
// of the next (stCrossing), as the number of that iteration's calls made
// before it.
type stLife struct {
	kind uint8
	r    int
}

const (
	stWithin   = iota + 1 // freed in its own iteration, before call r
	stCrossing            // freed in the next iteration, before call r
	stLong                // freed two iterations later or after, or never
	stUnknown             // not freed by the end of the profile, which ends with the next iteration
)

// stKey identifies a call for the search for iterations: its call stack
// where the trace records one, else its size.
type stKey struct {
	stack uint32
	size  uint64
}

// stPlan is the plan: the calls, the iterations and the pattern.
type stPlan struct {
	calls   []stCall
	starts  []int // the event index where each iteration starts
	found   string
	anchor  string // the key whose mallocs start the iterations (periodicity)
	profile int    // iterations profiled
	pattern []stSlot
	height  uint64
}

// make makes the plan of p from evs (see STAlloc.Plan).
func (pl *stPlan) make(p *STAlloc, evs []trace.Event) {
	*pl = stPlan{}
	lives := pl.collect(evs)
	pl.findIterations(evs, lives, p.marker)
	if len(pl.starts) == 0 {
		return // no profile: everything goes online
	}
	pl.assign()
	pl.profile = min(p.profile, len(pl.starts))
	end := int64(2 * len(evs)) // the end of the profile window
	if len(pl.starts) > pl.profile {
		end = int64(2 * pl.starts[pl.profile])
	}
	horizon := int64(2*len(evs) + 2) // after every event: a lifetime to the end of the trace
	var bufs []packBuf
	// bufs[k].call is the index of the call for calls before iteration 1,
	// and -1-pos for the pattern's position pos.
	add := func(call int, size uint64, start, stop int64) {
		bufs = append(bufs, packBuf{start: start, end: stop, size: ceilToMultiple(size, p.alignment), call: call})
	}
	for k := range pl.calls {
		c := &pl.calls[k]
		c.offset = noOffset
		if c.iter > 0 {
			continue
		}
		switch {
		case c.size > maxRequest:
			c.class = stOnline // no device holds it: the online manager's OOM
		case c.size <= p.small:
			c.class = stSmall
		case c.free >= 0 && c.free < end:
			c.class = stOnce
			add(k, c.size, int64(2*c.event), c.free)
		default:
			c.class = stPersistent
			add(k, c.size, int64(2*c.event), horizon)
		}
	}
	if len(pl.starts) >= 2 {
		byIter := pl.iterationCalls()
		last := pl.profile - 1
		var first int64 // the time of iteration 1's first malloc
		if len(byIter[1]) > 0 {
			first = int64(2 * pl.calls[byIter[1][0]].event)
		}
		for pos, k := range byIter[1] {
			c := pl.calls[k]
			slot := stSlot{size: c.size, class: stDynamic, offset: noOffset}
			switch {
			case c.size <= p.small:
				slot.class = stSmall
			case c.size > maxRequest:
				slot.class = stOnline
			default:
				life := pl.life(k, byIter, last)
				// A tensor freed in the next iteration after that
				// iteration's malloc at its position would meet its
				// successor at its offset: it lives too long.
				fits := life.kind == stWithin || life.kind == stCrossing && life.r <= pos
				if fits && pl.alike(pos, c.size, life, byIter, last) {
					if life.kind == stWithin {
						slot.class = stStatic
						add(-1-pos, c.size, int64(2*c.event), c.free)
					} else {
						// Its offset is held into the next iteration, which
						// makes the pattern's first life.r mallocs before
						// the free: it must stay clear of them too, so its
						// lifetime is taken from the first of them.
						slot.class = stCross
						start := int64(2 * c.event)
						if life.r > 0 {
							start = first
						}
						add(-1-pos, c.size, start, c.free)
					}
				}
			}
			pl.pattern = append(pl.pattern, slot)
		}
	}
	bufs = stDropOverflow(bufs)
	pk := solvePacking(bufs, greedyOrders, p.nodes)
	for k, b := range bufs {
		if b.call >= 0 {
			pl.calls[b.call].offset = pk.offsets[k]
		} else {
			pl.pattern[-1-b.call].offset = pk.offsets[k]
		}
	}
	pl.height = pk.height
}

// collect makes the calls of evs, following the replay's rules for which
// events reach a policy (as Offline.plan does: a malloc of device memory
// whose address is not live, a failed malloc of device memory freed at
// once, the free of a live device malloc), and returns the live requested
// bytes before each call.
func (pl *stPlan) collect(evs []trace.Event) []uint64 {
	live := map[uint64]int{} // address -> call, -1 for host memory
	var lives []uint64
	var bytes uint64
	for i := range evs {
		ev := &evs[i]
		switch ev.Op {
		case trace.OpMalloc:
			if _, dup := live[ev.Addr]; dup {
				continue
			}
			if !ev.Kind.OnDevice() {
				live[ev.Addr] = -1
				continue
			}
			live[ev.Addr] = len(pl.calls)
			pl.calls = append(pl.calls, stCall{size: ev.Size, event: i, free: -1})
			lives = append(lives, bytes)
			bytes = satAdd(bytes, ev.Size)
		case trace.OpMallocFailed:
			if ev.Kind.OnDevice() {
				pl.calls = append(pl.calls, stCall{size: ev.Size, event: i, free: int64(2*i + 1)})
				lives = append(lives, bytes)
			}
		case trace.OpFree:
			k, ok := live[ev.Addr]
			if !ok {
				continue
			}
			delete(live, ev.Addr)
			if k >= 0 {
				pl.calls[k].free = int64(2 * i)
				bytes -= min(bytes, pl.calls[k].size)
			}
		}
	}
	return lives
}

// satAdd returns a+b, or the largest uint64 when that wraps.
func satAdd(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 {
		return ^uint64(0)
	}
	return s
}

// findIterations sets the iterations' starts: at the markers whose label
// starts with marker, else where the trace repeats (stPeriod).
func (pl *stPlan) findIterations(evs []trace.Event, lives []uint64, marker string) {
	if marker != "" {
		for i := range evs {
			if evs[i].Op == trace.OpMarker && strings.HasPrefix(evs[i].Label, marker) {
				pl.starts = append(pl.starts, i)
			}
		}
		if len(pl.starts) > 0 {
			pl.found = "markers"
			return
		}
	}
	keys := make([]stKey, len(pl.calls))
	for k, c := range pl.calls {
		if st := evs[c.event].Stack; st != 0 {
			keys[k] = stKey{stack: st}
		} else {
			keys[k] = stKey{size: c.size}
		}
	}
	occ, key := stPeriod(keys, lives)
	if occ == nil {
		return
	}
	pl.found = "periodicity"
	if key.stack != 0 {
		pl.anchor = fmt.Sprintf("the mallocs of call stack %d", key.stack)
	} else {
		pl.anchor = fmt.Sprintf("the mallocs of %d bytes", key.size)
	}
	for _, k := range occ {
		pl.starts = append(pl.starts, pl.calls[k].event)
	}
}

// stPeriod finds where a trace of calls with keys repeats: the key that
// recurs at regular gaps over most of the trace, and returns the calls
// where it recurs (nil if no key does) and the key. A key qualifies when
// it recurs at least 4 times (so that two gaps after the first compare),
// its gaps (in calls) after the first are within 5/4 of each other, the
// first (the first iteration, which may make state the others reuse) is
// from 4/5 of the shortest to twice the longest of the others, and its
// occurrences span at least half of the calls.
// Of those, the one whose calls find the fewest live bytes on average
// (lives[k], the live requested bytes before call k: where an iteration
// starts, its activations are freed) wins; then the one that recurs most,
// then the one that comes first.
func stPeriod(keys []stKey, lives []uint64) ([]int, stKey) {
	occ := map[stKey][]int{}
	var order []stKey
	for k, key := range keys {
		if _, seen := occ[key]; !seen {
			order = append(order, key)
		}
		occ[key] = append(occ[key], k)
	}
	type cand struct {
		key stKey
		pos []int
		sum [2]uint64 // the live bytes at its calls, 128 bits (hi, lo)
	}
	var best *cand
	better := func(a, b *cand) bool { // a better than b
		// Mean live a.sum/len(a.pos) < b.sum/len(b.pos), in 256 bits.
		la, lb := uint64(len(a.pos)), uint64(len(b.pos))
		x := mul128(a.sum, lb)
		y := mul128(b.sum, la)
		if c := cmpWords(x, y); c != 0 {
			return c < 0
		}
		if len(a.pos) != len(b.pos) {
			return len(a.pos) > len(b.pos)
		}
		return a.pos[0] < b.pos[0]
	}
	for _, key := range order {
		pos := occ[key]
		if len(pos) < 4 {
			continue
		}
		lo, hi := pos[2]-pos[1], pos[2]-pos[1]
		for j := 2; j+1 < len(pos); j++ {
			g := pos[j+1] - pos[j]
			lo, hi = min(lo, g), max(hi, g)
		}
		first := pos[1] - pos[0]
		if 4*hi > 5*lo || 5*first < 4*lo || first > 2*hi {
			continue
		}
		if 2*(pos[len(pos)-1]-pos[0]+lo) < len(keys) {
			continue
		}
		c := &cand{key: key, pos: pos}
		for _, k := range pos {
			var carry uint64
			c.sum[1], carry = bits.Add64(c.sum[1], lives[k], 0)
			c.sum[0] += carry
		}
		if best == nil || better(c, best) {
			best = c
		}
	}
	if best == nil {
		return nil, stKey{}
	}
	return best.pos, best.key
}

// mul128 returns the 128-bit x (hi, lo) times m as 192 bits (high first).
func mul128(x [2]uint64, m uint64) [3]uint64 {
	h1, l1 := bits.Mul64(x[1], m)
	h0, l0 := bits.Mul64(x[0], m)
	mid, c := bits.Add64(l0, h1, 0)
	return [3]uint64{h0 + c, mid, l1}
}

// cmpWords compares two numbers of the same count of words, high first.
func cmpWords(a, b [3]uint64) int {
	for k := range a {
		if c := cmp.Compare(a[k], b[k]); c != 0 {
			return c
		}
	}
	return 0
}

// assign sets each call's iteration and position.
func (pl *stPlan) assign() {
	it, pos := -1, 0
	for k := range pl.calls {
		c := &pl.calls[k]
		for it+1 < len(pl.starts) && pl.starts[it+1] <= c.event {
			it++
			pos = 0
		}
		c.iter, c.pos = it, pos
		pos++
	}
}

// iterationOf returns the iteration of the time t (doubled, as a free's),
// -1 before the first.
func (pl *stPlan) iterationOf(t int64) int {
	// The last start at or before t: a start is a marker or a malloc, at
	// an even time; a free at the same event index cannot be.
	j, _ := slices.BinarySearchFunc(pl.starts, t, func(s int, t int64) int { return cmp.Compare(int64(2*s), t) })
	if j < len(pl.starts) && int64(2*pl.starts[j]) == t {
		return j
	}
	return j - 1
}

// iterationCalls returns the calls of each iteration, in order.
func (pl *stPlan) iterationCalls() [][]int {
	by := make([][]int, len(pl.starts))
	for k, c := range pl.calls {
		if c.iter >= 0 {
			by[c.iter] = append(by[c.iter], k)
		}
	}
	return by
}

// life returns the lifetime of call k of a profiled iteration, last being
// the last profiled iteration.
func (pl *stPlan) life(k int, byIter [][]int, last int) stLife {
	c := pl.calls[k]
	fi := -1 // the iteration of the free
	if c.free >= 0 {
		fi = pl.iterationOf(c.free)
	}
	if c.free < 0 || fi > last {
		// Not freed within the profile: two iterations later or after,
		// where the profile saw the whole next iteration; else it cannot
		// tell.
		if c.iter >= last {
			return stLife{kind: stUnknown}
		}
		return stLife{kind: stLong}
	}
	// The calls of iteration fi made before the free.
	r, _ := slices.BinarySearchFunc(byIter[fi], c.free, func(k int, t int64) int { return cmp.Compare(int64(2*pl.calls[k].event), t) })
	switch fi - c.iter {
	case 0:
		return stLife{kind: stWithin, r: r}
	case 1:
		return stLife{kind: stCrossing, r: r}
	}
	return stLife{kind: stLong}
}

// alike reports whether every profiled iteration after the first two
// (iterations 2 to last) makes, at position pos, a call of size bytes with
// lifetime life; the last one's may be unknown where life crosses into the
// next iteration, which the profile does not see.
func (pl *stPlan) alike(pos int, size uint64, life stLife, byIter [][]int, last int) bool {
	for it := 2; it <= last; it++ {
		if pos >= len(byIter[it]) {
			return false
		}
		k := byIter[it][pos]
		if pl.calls[k].size != size {
			return false
		}
		l := pl.life(k, byIter, last)
		if l != life && !(l.kind == stUnknown && life.kind == stCrossing) {
			return false
		}
	}
	return true
}

// stDropOverflow returns bufs without the blocks that would take the bytes
// live at once past maxPlanHeight (taken in order of their start), so that
// the sums of the placement fit in 64 bits; their calls are not planned.
func stDropOverflow(bufs []packBuf) []packBuf {
	order := make([]int, len(bufs))
	for k := range order {
		order[k] = k
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(bufs[a].start, bufs[b].start) })
	drop := make([]bool, len(bufs))
	var live uint64
	var ends endHeap
	for _, k := range order {
		b := bufs[k]
		for len(ends) > 0 && ends[0].end <= b.start {
			live -= heap.Pop(&ends).(endSize).size
		}
		if b.size > maxPlanHeight-live {
			drop[k] = true
			continue
		}
		live += b.size
		heap.Push(&ends, endSize{b.end, b.size})
	}
	kept := bufs[:0]
	for k, b := range bufs {
		if !drop[k] {
			kept = append(kept, b)
		}
	}
	return kept
}
