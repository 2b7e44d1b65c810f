// Package tune searches an allocator's settings for a trace: it replays
// every candidate setting string from memory (the trace decoded once) and
// ranks them by a stated objective, for `replay tune`.
//
// The search is exhaustive over a grid (Grid): for the pytorch policy the
// PYTORCH_CUDA_ALLOC_CONF keys that move placement, each over the values
// people set (PyTorch's docs and the issues that recommend them). What it
// can miss: values between the grid's points, keys outside the grid
// (max_non_split_rounding_mb, pinned-memory keys), and effects that the
// trace cannot show because the program would have run differently (a job
// that caught an OOM and retried smaller makes other requests once the OOM
// is gone).
package tune

import (
	"sort"
	"strings"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// Axis is one setting key of the grid and the values tried; "" leaves the
// key out (the allocator's default).
type Axis struct {
	Key    string
	Values []string
}

// PyTorchGrid is the default grid for the pytorch policy: 6 x 5 x 3 x 2 =
// 180 PYTORCH_CUDA_ALLOC_CONF strings.
var PyTorchGrid = []Axis{
	{"max_split_size_mb", []string{"", "64", "128", "256", "512", "1024"}},
	{"roundup_power2_divisions", []string{"", "2", "4", "8", "16"}},
	{"garbage_collection_threshold", []string{"", "0.6", "0.8"}},
	{"expandable_segments", []string{"False", "True"}},
}

// Candidates returns the PYTORCH_CUDA_ALLOC_CONF strings of the grid's
// product ("key:value,..." in the grid's key order, keys left out where the
// value is "" or False), without duplicates, in grid order.
func Candidates(grid []Axis) []string {
	confs := []string{""}
	for _, ax := range grid {
		var next []string
		for _, c := range confs {
			for _, v := range ax.Values {
				switch {
				case v == "" || strings.EqualFold(v, "false"):
					next = append(next, c)
				case c == "":
					next = append(next, ax.Key+":"+v)
				default:
					next = append(next, c+","+ax.Key+":"+v)
				}
			}
		}
		confs = next
	}
	seen := map[string]bool{}
	var out []string
	for _, c := range confs {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// Candidate is one setting's replay.
type Candidate struct {
	Conf   string      // the PYTORCH_CUDA_ALLOC_CONF string; "" is the default
	Result *sim.Result // its replay
	Front  bool        // on the Pareto front (Rank)
}

// Calls is a result's device calls: allocations and frees.
func Calls(r *sim.Result) int64 { return r.DeviceAllocs + r.DeviceFrees }

// Better reports whether a is better than b by the objective: fewer OOMs,
// then a lower peak reserved, then fewer device calls, then less simulated
// allocator time, then the shorter setting string.
func Better(a, b *Candidate) bool {
	x, y := a.Result, b.Result
	switch {
	case x.OOMs != y.OOMs:
		return x.OOMs < y.OOMs
	case x.PeakReserved != y.PeakReserved:
		return x.PeakReserved < y.PeakReserved
	case Calls(x) != Calls(y):
		return Calls(x) < Calls(y)
	case x.SimAllocTimeNS != y.SimAllocTimeNS:
		return x.SimAllocTimeNS < y.SimAllocTimeNS
	}
	return len(a.Conf) < len(b.Conf)
}

// dominates reports whether a is at least as good as b in peak reserved,
// device calls and allocator time, and better in one (with as few OOMs).
func dominates(a, b *sim.Result) bool {
	if a.OOMs > b.OOMs {
		return false
	}
	le := a.PeakReserved <= b.PeakReserved && Calls(a) <= Calls(b) && a.SimAllocTimeNS <= b.SimAllocTimeNS
	lt := a.PeakReserved < b.PeakReserved || Calls(a) < Calls(b) || a.SimAllocTimeNS < b.SimAllocTimeNS || a.OOMs < b.OOMs
	return le && lt
}

// Rank sorts cs best first (Better) and marks the Pareto front among those
// with the fewest OOMs: peak reserved, device calls and allocator time,
// each lower being better.
func Rank(cs []Candidate) {
	sort.SliceStable(cs, func(i, j int) bool { return Better(&cs[i], &cs[j]) })
	if len(cs) == 0 {
		return
	}
	least := cs[0].Result.OOMs
	for i := range cs {
		if cs[i].Result.OOMs != least {
			continue
		}
		cs[i].Front = true
		for j := range cs {
			if j != i && cs[j].Result.OOMs == least && dominates(cs[j].Result, cs[i].Result) {
				cs[i].Front = false
				break
			}
		}
	}
}

// Run replays the trace h, evs under base (its policy, capacity and
// card) with each setting string of confs, in up to jobs groups at a time
// (each group one pass over the events), and returns the candidates in
// the order of confs. base's Settings are replaced by {"conf": conf}: as
// recorded (base.AsRecorded) the string replaces the recorded settings
// whole, and the replay still follows what the program did (its
// empty_cache calls, its frees that completed late).
// It returns the first error of a replay.
func Run(h trace.Header, evs []trace.Event, base sim.Config, confs []string, jobs int) ([]Candidate, error) {
	cfgs := make([]sim.Config, len(confs))
	for k, conf := range confs {
		cfgs[k] = base
		cfgs[k].Settings = map[string]string{"conf": conf}
	}
	rs, err := sim.RunSplit(jobs, func(int) (trace.Source, func()) { return trace.NewSliceSource(h, evs), nil }, cfgs...)
	if err != nil {
		return nil, err
	}
	out := make([]Candidate, len(confs))
	for k, r := range rs {
		out[k] = Candidate{Conf: confs[k], Result: r}
	}
	return out, nil
}

// Describe returns a candidate's setting as PYTORCH_CUDA_ALLOC_CONF would
// hold it: the string, or "(default)".
func Describe(conf string) string {
	if conf == "" {
		return "(default)"
	}
	return conf
}

// Combine returns the candidates of a job of many ranks, each run under one
// setting (PYTORCH_CUDA_ALLOC_CONF is the job's, the same on every rank):
// ranks holds each rank's candidates in the same order of settings, and
// the job's candidate of a setting has for result the job's figures, its
// largest rank's peak reserved and footprint (the device every rank needs)
// and the sums of the ranks' OOMs, device calls and allocator time, so that
// Rank orders settings for the job. It returns nil for ranks whose
// settings differ.
func Combine(name string, ranks [][]Candidate) []Candidate {
	if len(ranks) == 0 {
		return nil
	}
	out := make([]Candidate, len(ranks[0]))
	for k := range out {
		conf := ranks[0][k].Conf
		r := &sim.Result{Trace: name, Policy: ranks[0][k].Result.Policy, FirstOOMEvent: -1}
		for _, cs := range ranks {
			if len(cs) != len(out) || cs[k].Conf != conf {
				return nil
			}
			x := cs[k].Result
			r.PeakReserved = max(r.PeakReserved, x.PeakReserved)
			r.PeakFootprint = max(r.PeakFootprint, x.PeakFootprint)
			r.OOMs += x.OOMs
			r.DeviceAllocs += x.DeviceAllocs
			r.DeviceFrees += x.DeviceFrees
			r.SimAllocTimeNS += x.SimAllocTimeNS
		}
		out[k] = Candidate{Conf: conf, Result: r}
	}
	return out
}
