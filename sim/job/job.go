// Package job groups the per-rank traces of a multi-GPU job and sums up
// their replays: one trace per rank, each replayed on its own simulated
// device, and the job, which fails when its first rank runs out of memory.
//
// A trace belongs to a job by its file name: a name with "rank" and a
// number in it (job.rank0.trace, as record run names the processes a
// launcher started; rank0_memory_snapshot.pickle, as torchtitan dumps its
// snapshots; job_rank3.pickle.gz) is rank N of the job named by the rest,
// in the same folder.
package job

import (
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/gpualloc/allocsim/sim"
)

// rankRE finds the rank in a base name: "rank" (any case) and its number,
// after the start of the name or a separator, before the end or a
// separator or a dot.
var rankRE = regexp.MustCompile(`(?i)(^|[._-])rank[_-]?(\d{1,6})($|[._-])`)

// Rank returns the job a trace's path names and the trace's rank in it:
// the job is the path with the rank's number replaced by '*'
// ("runs/job.rank*.trace" for "runs/job.rank1.trace"). It reports false
// for a path that names no rank (the last match counts).
func Rank(path string) (job string, rank int, ok bool) {
	dir, base := filepath.Split(path)
	all := rankRE.FindAllStringSubmatchIndex(base, -1)
	if len(all) == 0 {
		return "", 0, false
	}
	m := all[len(all)-1]
	n, err := strconv.Atoi(base[m[4]:m[5]])
	if err != nil {
		return "", 0, false
	}
	return dir + base[:m[4]] + "*" + base[m[5]:], n, true
}

// Summary is a job replayed under one policy: its ranks' results side by
// side and what holds for the job. Bytes are bytes; times are the traces'
// nanoseconds.
type Summary struct {
	// Job names the job (Rank's pattern), Policy the policy.
	Job    string
	Policy string
	// Ranks are the job's ranks in ascending order, Results their results
	// in the same order.
	Ranks   []int
	Results []*sim.Result
	// MaxReserved and MinReserved are the largest and smallest peak
	// reserved bytes of a rank, at ranks MaxReservedRank and
	// MinReservedRank (the lowest rank on a tie); MaxFootprint the largest
	// peak footprint, at MaxFootprintRank. The job fits a device of
	// MaxReserved bytes (a card of MaxFootprint) per rank.
	MaxReserved, MinReserved         uint64
	MaxReservedRank, MinReservedRank int
	MaxFootprint                     uint64
	MaxFootprintRank                 int
	// OOMRanks are the ranks with an OOM, ascending. FirstOOMRank is the
	// rank whose first OOM came first in time (the traces' clocks taken
	// as one, as a job's per-rank recordings share a wall clock; the
	// lowest rank on a tie), -1 when no rank ran out of memory; then
	// FirstOOMEvent and FirstOOMTime are its event index and time. Several
	// failing ranks whose traces have no times (every OOM at time 0) give
	// no first rank.
	OOMRanks      []int
	FirstOOMRank  int
	FirstOOMEvent int64
	FirstOOMTime  int64
}

// Spread returns how far the smallest peak reserved of a rank lies below
// the largest, as a fraction of the largest (0 for equal ranks).
func (s *Summary) Spread() float64 {
	if s.MaxReserved == 0 {
		return 0
	}
	return float64(s.MaxReserved-s.MinReserved) / float64(s.MaxReserved)
}

// Summarize groups results by job (the ranks of Rank) and policy, and
// returns a Summary for each job of at least two ranks, in the order of
// the first result of each job and policy. A rank given twice for a job
// and policy keeps its first result.
func Summarize(rs []*sim.Result) []*Summary {
	type key struct{ job, policy string }
	var order []key
	byKey := map[key]map[int]*sim.Result{}
	for _, r := range rs {
		j, rank, ok := Rank(r.Trace)
		if !ok {
			continue
		}
		k := key{j, r.Policy}
		if byKey[k] == nil {
			byKey[k] = map[int]*sim.Result{}
			order = append(order, k)
		}
		if _, dup := byKey[k][rank]; !dup {
			byKey[k][rank] = r
		}
	}
	var out []*Summary
	for _, k := range order {
		ranks := byKey[k]
		if len(ranks) < 2 {
			continue
		}
		s := &Summary{Job: k.job, Policy: k.policy, FirstOOMRank: -1, FirstOOMEvent: -1}
		for _, rank := range slices.Sorted(maps.Keys(ranks)) {
			s.Ranks = append(s.Ranks, rank)
			s.Results = append(s.Results, ranks[rank])
		}
		timed := false // some failing rank has a time
		for i, r := range s.Results {
			rank := s.Ranks[i]
			if i == 0 || r.PeakReserved > s.MaxReserved {
				s.MaxReserved, s.MaxReservedRank = r.PeakReserved, rank
			}
			if i == 0 || r.PeakReserved < s.MinReserved {
				s.MinReserved, s.MinReservedRank = r.PeakReserved, rank
			}
			if i == 0 || r.PeakFootprint > s.MaxFootprint {
				s.MaxFootprint, s.MaxFootprintRank = r.PeakFootprint, rank
			}
			if r.OOMs == 0 {
				continue
			}
			s.OOMRanks = append(s.OOMRanks, rank)
			timed = timed || r.FirstOOMTime != 0
			if s.FirstOOMRank < 0 || r.FirstOOMTime < s.FirstOOMTime {
				s.FirstOOMRank, s.FirstOOMEvent, s.FirstOOMTime = rank, r.FirstOOMEvent, r.FirstOOMTime
			}
		}
		if !timed && len(s.OOMRanks) > 1 {
			s.FirstOOMRank, s.FirstOOMEvent, s.FirstOOMTime = -1, -1, 0
		}
		out = append(out, s)
	}
	return out
}
