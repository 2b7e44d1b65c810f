// Package tune searches an allocator's settings for a trace: it replays
// every candidate setting string from memory (the trace decoded once) and
// ranks them by a stated objective, for `replay tune`.
//
// The search is exhaustive over a grid (Grid): for the pytorch policy the
// PYTORCH_CUDA_ALLOC_CONF keys that move placement, each over the values
// people set (PyTorch's docs and the issues that recommend them). Every
// candidate is replayed, one pass over the events each, except one that
// differs from another only in max_split_size_mb or
// garbage_collection_threshold (the other leaving it out) where the other's
// replay shows that the value could not have acted: its figures are the
// other's, exactly (Run). What it can miss: values between the grid's points, keys outside the grid
// (max_non_split_rounding_mb, pinned-memory keys), and effects that the
// trace cannot show because the program would have run differently (a job
// that caught an OOM and retried smaller makes other requests once the OOM
// is gone).
package tune

import (
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/gpualloc/allocsim/policies"
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
	// Same is the setting string whose replay gave the result (Run's
	// SameReplay), "" when the candidate was replayed itself.
	Same string
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
// card) with each setting string of confs, jobs replays at a time (each
// its own pass over the events), and returns the candidates in the order
// of confs. base's Settings are replaced by {"conf": conf}: as recorded
// (base.AsRecorded) the string replaces the recorded settings whole, and
// the replay still follows what the program did (its empty_cache calls,
// its frees that completed late).
//
// For the pytorch policy a candidate that differs from another of confs
// only in max_split_size_mb or garbage_collection_threshold, where the
// other's is unlimited or off, is not replayed when the other's replay
// shows that its value would have changed none of the allocator's
// decisions (policies.PyTorch.SameReplay: no request or block that
// large, no collection point with reserved bytes past its threshold):
// its result is the other's, exactly, under its own settings. Set
// replayAll to replay every candidate all the same.
// It returns the first error of a replay.
func Run(h trace.Header, evs []trace.Event, base sim.Config, confs []string, jobs int, replayAll bool) ([]Candidate, error) {
	// A setting the policy refuses fails the run, the first of confs so
	// named, whichever candidates are replayed.
	for _, conf := range confs {
		if err := policies.CheckSettings(base.Policy, policies.Settings{"conf": conf}); err != nil {
			return nil, err
		}
	}
	out := make([]Candidate, len(confs))
	// stand[k] is the candidate whose replay stands for k's (k itself
	// when k was replayed), -1 while undecided.
	stand := make([]int, len(confs))
	for k := range stand {
		stand[k] = -1
	}
	refs := references(confs)
	// deps[r] counts the undecided candidates compared with r; pols[r]
	// is the policy of the replay that stands for r while deps[r] > 0
	// (nil after: a replay's tables can be large).
	deps := make([]int, len(confs))
	pols := make([]policies.Policy, len(confs))
	for k, r := range refs {
		if base.Policy != "pytorch" || replayAll || r == k {
			refs[k] = -1
		} else if r >= 0 {
			deps[r]++
		}
	}
	// Level by level: the candidates without a reference, then those
	// whose reference is decided.
	for done := 0; done < len(confs); {
		var replay, same []int
		for k := range confs {
			if stand[k] >= 0 {
				continue
			}
			switch r := refs[k]; {
			case r < 0:
				replay = append(replay, k)
			case stand[r] >= 0:
				same = append(same, k)
			}
		}
		for _, k := range same {
			r := refs[k]
			pt, _ := pols[r].(*policies.PyTorch)
			ok := false
			if pt != nil {
				settings, err := settingsOf(h, base, confs[k])
				if err != nil {
					return nil, err
				}
				if ok, err = pt.SameReplay(settings); err != nil {
					return nil, err
				}
				if ok {
					res := *out[r].Result
					res.Settings = settings
					res.Series = slices.Clone(res.Series)
					out[k] = Candidate{Conf: confs[k], Result: &res, Same: confs[stand[r]]}
					stand[k] = stand[r]
					if deps[k] > 0 {
						pols[k] = pt
					}
					done++
				}
			}
			if !ok {
				replay = append(replay, k)
			}
			if deps[r]--; deps[r] == 0 {
				pols[r] = nil
			}
		}
		if err := replayEach(h, evs, base, confs, replay, jobs, out, pols, deps); err != nil {
			return nil, err
		}
		for _, k := range replay {
			stand[k] = k
		}
		done += len(replay)
	}
	return out, nil
}

// references returns, for each setting string of confs, the index of the
// one it can be compared with (SameReplay), -1 for none: for one with
// garbage_collection_threshold, the same without it; else for one with
// max_split_size_mb, the same without it.
func references(confs []string) []int {
	index := map[string]int{}
	for k, c := range confs {
		index[c] = k
	}
	refs := make([]int, len(confs))
	for k, c := range confs {
		refs[k] = -1
		for _, key := range []string{"garbage_collection_threshold", "max_split_size_mb"} {
			if without, ok := withoutKey(c, key); ok {
				if r, ok := index[without]; ok {
					refs[k] = r
				}
				break
			}
		}
	}
	return refs
}

// withoutKey returns the setting string c without its key:value part for
// key, and whether it had one. Parts are split at the commas outside
// brackets (roundup_power2_divisions:[256:1,>:4]).
func withoutKey(c, key string) (string, bool) {
	var parts []string
	depth, start := 0, 0
	for i := 0; i <= len(c); i++ {
		switch {
		case i == len(c) || c[i] == ',' && depth == 0:
			parts = append(parts, c[start:i])
			start = i + 1
		case c[i] == '[':
			depth++
		case c[i] == ']':
			depth--
		}
	}
	kept := parts[:0]
	found := false
	for _, part := range parts {
		if k, _, _ := strings.Cut(part, ":"); strings.TrimSpace(k) == key {
			found = true
			continue
		}
		kept = append(kept, part)
	}
	return strings.Join(kept, ","), found
}

// settingsOf returns the settings a replay of base with conf runs under:
// {"conf": conf}, or as recorded what the recorded settings become under it.
func settingsOf(h trace.Header, base sim.Config, conf string) (policies.Settings, error) {
	s := policies.Settings{"conf": conf}
	if !base.AsRecorded {
		return s, nil
	}
	rs, ok, err := policies.Recorded(base.Policy, h, s)
	if err != nil {
		return nil, err
	}
	if ok {
		s = rs
	}
	return s, nil
}

// replayEach replays the candidates idx of confs, jobs at a time, into out,
// and the policies of those compared with others (deps) into pols.
func replayEach(h trace.Header, evs []trace.Event, base sim.Config, confs []string, idx []int, jobs int, out []Candidate, pols []policies.Policy, deps []int) error {
	if len(idx) == 0 {
		return nil
	}
	cfgs := make([]sim.Config, len(idx))
	for n, k := range idx {
		cfgs[n] = base
		cfgs[n].Settings = map[string]string{"conf": confs[k]}
		cfgs[n].NewPolicy = func(dev policies.Device, s policies.Settings) (policies.Policy, error) {
			p, err := policies.New(base.Policy, dev, s)
			if deps[k] > 0 {
				pols[k] = p
			}
			return p, err
		}
	}
	rs, err := sim.RunSplit(jobs, func(int) (trace.Source, func()) { return trace.NewSliceSource(h, evs), nil }, cfgs...)
	if err != nil {
		return err
	}
	for n, k := range idx {
		out[k] = Candidate{Conf: confs[k], Result: rs[n]}
	}
	return nil
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
			// Saturated: a rank's time may be math.MaxInt64 already.
			r.SimAllocTimeNS = addSat(r.SimAllocTimeNS, x.SimAllocTimeNS)
		}
		out[k] = Candidate{Conf: conf, Result: r}
	}
	return out
}

// addSat returns a+b for non-negative a and b, math.MaxInt64 where the sum
// would pass it.
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
