package policies

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// This file is the optimal policy's minimization: the least height of a
// placement of the blocks, by decision problems ("do they fit under C?",
// exactSearch) posed at C = the load bound first, then by bisection
// between what is proven and the best placement found, each given half of
// the nodes and time left (all of them for the last height left to try).

// OptimalStats describes a plan of the optimal policy. Sizes are in bytes
// (after the alignment rounding).
type OptimalStats struct {
	// Blocks is the number of mallocs of a non-zero size planned.
	Blocks int
	// Height is the plan's height: its arena, the peak reserved bytes
	// of its replay on a device with room for it.
	Height uint64
	// LowerBound is proven: no placement of the blocks has a lower
	// height. It is the largest of LoadBound and, for each decision
	// problem the search proved infeasible under a capacity C, the least
	// height above C that a placement can have (C plus the greatest
	// common divisor of the sizes: every height is a sum of sizes).
	LowerBound uint64
	// Proven reports that Height is the least: Height == LowerBound.
	Proven bool
	// LoadBound is the most bytes live at once: a lower bound that needs
	// no search.
	LoadBound uint64
	// Greedy is the height of the best greedy placement, the search's
	// first upper bound.
	Greedy uint64
	// Nodes is the number of search nodes (placements tried); Probes the
	// number of decision problems posed, Infeasible those proved to have
	// no placement.
	Nodes              int64
	Probes, Infeasible int
	// Elapsed is the time the plan took, greedy placements included.
	Elapsed time.Duration
	// Stopped says what ended the search before a proof: "time" (the
	// time limit), "nodes" (the node budget), "pairs" (too many blocks
	// live at once to search: the greedy placement stands); "" when
	// Proven.
	Stopped string
}

// optimalResult is a placement of the optimal policy: an offset per
// block, the height, and what the search knows of it.
type optimalResult struct {
	offsets []uint64
	height  uint64
	stats   OptimalStats
}

// solveOptimal places bufs at the least height it can prove or find with
// at most nodes search nodes (0: no limit) and within limit (0: none);
// width is the lifetime of each block in the trace's time, for the
// search's preorders (nil: in trace events). It
// returns an error only for a placement that fails its own check (two
// blocks live at once that overlap), a bug, never a wrong plan.
func solveOptimal(bufs []packBuf, width []int64, nodes int64, limit time.Duration) (res optimalResult, err error) {
	start := time.Now()
	pp := newPackProblem(bufs)
	res = optimalResult{offsets: make([]uint64, len(bufs))}
	st := &res.stats
	st.Blocks, st.LoadBound, st.LowerBound = len(bufs), pp.lb, pp.lb
	placedAll := true
	defer func() {
		st.Height, st.Proven = res.height, placedAll && st.LowerBound == res.height
		if st.Proven {
			st.Stopped = ""
		}
		st.Elapsed = time.Since(start)
	}()
	if len(bufs) == 0 {
		return res, nil
	}
	// The first upper bound: the best greedy placement that places every
	// block (one that leaves one out, past maxPlanHeight, is no bound).
	placedAll = false
	for k, o := range greedyOrders {
		offs, h := pp.greedy(pp.sortedBy(o))
		all := !slices.Contains(offs, noOffset)
		if k == 0 || all && (!placedAll || h < res.height) || !all && !placedAll && h < res.height {
			res.offsets, res.height, placedAll = offs, h, all
		}
		if placedAll && res.height == pp.lb {
			break
		}
	}
	st.Greedy = res.height
	if !placedAll || res.height == pp.lb {
		return res, nil
	}
	if pp.adj == nil && !listPairs(pp, optimalMaxPairs) {
		st.Stopped = "pairs"
		return res, nil
	}
	// Every height of a canonical placement is a sum of sizes: a
	// multiple of their greatest common divisor.
	var g uint64
	for _, b := range bufs {
		g = gcd(g, b.size)
	}
	s := newExactSearch(pp, width)
	var end time.Time
	if limit > 0 {
		end = start.Add(limit)
	}
	lo, hi := pp.lb, res.height // heights below lo are ruled out (or given up on); hi is reached
	for lo < hi {
		c := lo
		if st.Probes > 0 {
			c = lo + (hi-g-lo)/g/2*g
		}
		last := c == hi-g // the last height left to try gets every node and all the time left
		var share int64
		if nodes > 0 {
			left := nodes - s.used
			if left <= 0 {
				st.Stopped = "nodes"
				break
			}
			share = left
			if !last {
				share = max(left/2, min(left, int64(4*len(bufs))))
			}
		}
		s.deadline, s.late = time.Time{}, false
		if !end.IsZero() {
			now := time.Now()
			if !now.Before(end) {
				st.Stopped = "time"
				break
			}
			s.deadline = end
			if !last {
				s.deadline = now.Add(end.Sub(now) / 2)
			}
		}
		st.Probes++
		offs, outcome := s.decide(c, share)
		switch outcome {
		case decideFound:
			res.offsets = offs
			hi = 0
			for b, off := range offs {
				hi = max(hi, off+bufs[b].size)
			}
			res.height = hi
		case decideInfeasible:
			st.Infeasible++
			lo = c + g
			st.LowerBound = max(st.LowerBound, lo)
		default:
			// Not decided within its share: look higher, nothing proven.
			lo = c + g
			st.Stopped = "nodes"
			if s.late {
				st.Stopped = "time"
			}
		}
	}
	st.Nodes = s.used
	if err := checkPlacement(pp, res.offsets); err != nil {
		return res, err
	}
	return res, nil
}

// optimalMaxPairs bounds the pairs of blocks live at once that the search
// lists (8 bytes a pair: 256 MiB), above the greedy placements' bound
// (maxPairs); above it the search does not run.
const optimalMaxPairs = 32 << 20

// listPairs sets pp.adj, the blocks that overlap each block in time, when
// there are at most limit such pairs, and reports whether it did.
func listPairs(pp *packProblem, limit int64) bool {
	n := len(pp.bufs)
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(pp.bufs[a].start, pp.bufs[b].start) })
	// Count first: each block meets the blocks live at its start.
	var pairs int64
	deg := make([]int32, n)
	var active []int32
	for _, i := range order {
		active = slices.DeleteFunc(active, func(j int32) bool { return pp.bufs[j].end <= pp.bufs[i].start })
		pairs += int64(len(active))
		if pairs > limit {
			return false
		}
		for _, j := range active {
			deg[j]++
		}
		deg[i] += int32(len(active))
		active = append(active, i)
	}
	adj := make([][]int32, n)
	for i := range adj {
		adj[i] = make([]int32, 0, deg[i])
	}
	active = active[:0]
	for _, i := range order {
		active = slices.DeleteFunc(active, func(j int32) bool { return pp.bufs[j].end <= pp.bufs[i].start })
		for _, j := range active {
			adj[i] = append(adj[i], j)
			adj[j] = append(adj[j], i)
		}
		active = append(active, i)
	}
	pp.adj = adj
	return true
}

// checkPlacement returns an error if two blocks of pp live at the same
// time overlap at offsets.
func checkPlacement(pp *packProblem, offsets []uint64) error {
	for a, adj := range pp.adj {
		for _, b := range adj {
			x, y := offsets[a], offsets[b]
			if x < y+pp.bufs[b].size && y < x+pp.bufs[a].size {
				return fmt.Errorf("blocks %d and %d, live at once, overlap at offsets %d and %d", a, b, x, y)
			}
		}
	}
	return nil
}

// gcd returns the greatest common divisor of a and b (gcd(0, b) = b).
func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
