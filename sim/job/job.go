// Package job groups the per-rank traces of a multi-GPU job and sums up
// their replays: one trace per rank, each replayed on its own simulated
// device, and the job, which fails when its first rank runs out of memory.
//
// A trace belongs to a job by its file name: a name with "rank" and a
// number in it (job.rank0.trace, as record run names the processes a
// launcher started; rank0_memory_snapshot.pickle, as torchtitan dumps its
// snapshots; job_rank3.pickle.gz) is rank N of the job named by the rest,
// in the same folder; so is snap.pickle.gz#rankN, the name replay sim gives
// device N of a multi-device snapshot.
package job

import (
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/gpualloc/allocsim/sim/results"
)

// rankRE finds the rank in a base name: "rank" (any case) and its number,
// after the start of the name or a separator, before the end or a
// separator or a dot.
var rankRE = regexp.MustCompile(`(?i)(^|[._#-])rank[_-]?(\d{1,6})($|[._-])`)

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
	Results []*results.Result
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
func Summarize(rs []*results.Result) []*Summary {
	var out []*Summary
	for _, g := range group(rs, func(r *results.Result) (string, string) { return r.Trace, r.Policy }) {
		out = append(out, SummaryOf(g.job, g.policy, g.ranks, g.items))
	}
	return out
}

// SummaryOf sums up the results rs of a job's ranks under policy, as
// Summarize does for each job it finds by the traces' names, for a job
// whose ranks are known otherwise (replay fidelity's, given in order):
// ranks ascending, rs the results of those ranks in the same order.
func SummaryOf(job, policy string, ranks []int, rs []*results.Result) *Summary {
	s := &Summary{Job: job, Policy: policy, Ranks: ranks, Results: rs, FirstOOMRank: -1, FirstOOMEvent: -1}
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
	return s
}

// Record returns the job as a results file lists it (results.Job).
func (s *Summary) Record() *results.Job {
	j := &results.Job{
		Job: s.Job, Policy: s.Policy, Ranks: s.Ranks, Traces: make([]string, len(s.Results)),
		MaxReserved: s.MaxReserved, MaxReservedRank: s.MaxReservedRank,
		MinReserved: s.MinReserved, MinReservedRank: s.MinReservedRank, Spread: s.Spread(),
		MaxFootprint: s.MaxFootprint, MaxFootprintRank: s.MaxFootprintRank,
		OOMRanks: s.OOMRanks, FirstOOMRank: s.FirstOOMRank, FirstOOMEvent: s.FirstOOMEvent, FirstOOMTime: s.FirstOOMTime,
	}
	if j.OOMRanks == nil {
		j.OOMRanks = []int{}
	}
	for i, r := range s.Results {
		j.Traces[i] = r.Trace
	}
	return j
}

// MarkRanks sets each result of the jobs to its rank (results.Result.Rank).
func MarkRanks(sums []*Summary) {
	for _, s := range sums {
		for i, r := range s.Results {
			rank := s.Ranks[i]
			r.Rank = &rank
		}
	}
}

// jobGroup is the items of one job and policy, by ascending rank.
type jobGroup[T any] struct {
	job, policy string
	ranks       []int
	items       []T
}

// group groups items (each of a trace and a policy, by key) by job (Rank)
// and policy, in the order of each group's first item, and returns the
// groups of at least two ranks; a rank given twice keeps its first item.
func group[T any](items []T, key func(T) (trace, policy string)) []jobGroup[T] {
	type k struct{ job, policy string }
	var order []k
	byKey := map[k]map[int]T{}
	for _, it := range items {
		trace, policy := key(it)
		j, rank, ok := Rank(trace)
		if !ok {
			continue
		}
		kk := k{j, policy}
		if byKey[kk] == nil {
			byKey[kk] = map[int]T{}
			order = append(order, kk)
		}
		if _, dup := byKey[kk][rank]; !dup {
			byKey[kk][rank] = it
		}
	}
	var out []jobGroup[T]
	for _, kk := range order {
		m := byKey[kk]
		if len(m) < 2 {
			continue
		}
		g := jobGroup[T]{job: kk.job, policy: kk.policy}
		for _, rank := range slices.Sorted(maps.Keys(m)) {
			g.ranks = append(g.ranks, rank)
			g.items = append(g.items, m[rank])
		}
		out = append(out, g)
	}
	return out
}

// FitSummary is replay fit's answer for a job under one policy: the job
// fits a device (a card) when every rank does, so its smallest capacity
// and card are its largest rank's. Bytes are bytes.
type FitSummary struct {
	Job, Policy string
	Ranks       []int
	// Fits is false when some rank runs out of memory at every capacity.
	Fits bool
	// MinCapacity and MinCard are the largest of the ranks' smallest
	// capacity and card, at ranks MinCapacityRank and MinCardRank (the
	// lowest on a tie); 0 and -1 when the job does not fit.
	MinCapacity     uint64
	MinCapacityRank int
	MinCard         uint64
	MinCardRank     int
	// Cards says for each card whether every rank runs on it.
	Cards []results.CardFit
}

// SummarizeFits groups fit answers by job and policy (as Summarize does)
// and answers for each job of at least two ranks.
func SummarizeFits(fs []*results.Fit) []*FitSummary {
	var out []*FitSummary
	for _, g := range group(fs, func(f *results.Fit) (string, string) { return f.Trace, f.Policy }) {
		s := &FitSummary{Job: g.job, Policy: g.policy, Ranks: g.ranks, Fits: true, MinCapacityRank: -1, MinCardRank: -1}
		for i, f := range g.items {
			if !f.Fits {
				s.Fits = false
			}
			if f.MinCapacity > s.MinCapacity || s.MinCapacityRank < 0 {
				s.MinCapacity, s.MinCapacityRank = f.MinCapacity, g.ranks[i]
			}
			if f.MinCard > s.MinCard || s.MinCardRank < 0 {
				s.MinCard, s.MinCardRank = f.MinCard, g.ranks[i]
			}
			for c, cf := range f.Cards {
				if i == 0 {
					s.Cards = append(s.Cards, cf)
				} else if c < len(s.Cards) && !cf.Fits {
					s.Cards[c].Fits = false
				}
			}
		}
		if !s.Fits {
			s.MinCapacity, s.MinCapacityRank, s.MinCard, s.MinCardRank = 0, -1, 0, -1
		}
		out = append(out, s)
	}
	return out
}
