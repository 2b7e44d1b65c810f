package tune

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// WriteTable prints a trace's ranked candidates, the recorded setting
// (recConf, as recordedConf says it) and its figures, and the
// recommendation.
func WriteTable(w io.Writer, path, recConf string, recorded *sim.Result, cs []Candidate, top int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\trank\tPYTORCH_CUDA_ALLOC_CONF\treserved MiB\tdevice calls\talloc ms\tOOMs\tfront\n", results.TraceName(path))
	row := func(rank, conf string, r *sim.Result, front bool) {
		mark := ""
		if front {
			mark = "*"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%d\t%.1f\t%d\t%s\n", rank, conf, tables.MiB(r.PeakReserved), Calls(r), float64(r.SimAllocTimeNS)/1e6, r.OOMs, mark)
	}
	row("recorded", termsafe.String(recConf), recorded, false)
	for k := range cs[:min(top, len(cs))] {
		row(fmt.Sprint(k+1), Describe(cs[k].Conf), cs[k].Result, cs[k].Front)
	}
	tw.Flush()
	best := cs[0]
	fmt.Fprintf(w, "%s: %d settings tried; recommended: PYTORCH_CUDA_ALLOC_CONF=%q: predicted peak reserved %d bytes, %d device allocations (cudaMalloc or page maps), %d OOMs (recorded %s: %d bytes, %d, %d OOMs)\n",
		termsafe.String(path), len(cs), best.Conf, best.Result.PeakReserved, best.Result.DeviceAllocs, best.Result.OOMs,
		termsafe.String(recConf), recorded.PeakReserved, recorded.DeviceAllocs, recorded.OOMs)
}

// RecordedConf is the setting string the trace was recorded with, as its
// header says.
func RecordedConf(h trace.Header) string {
	if c, ok := h.Settings["PYTORCH_CUDA_ALLOC_CONF"]; ok {
		return Describe(c)
	}
	return "(as recorded)"
}

// ShardFile is the results file of shard i of n: path with
// .shard-i-of-n before its extension.
func ShardFile(path string, i, n int) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + fmt.Sprintf(".shard-%d-of-%d", i, n) + ext
}

// Settings keys of the recorded setting's replay in a shard's results.
const (
	recordedKey     = "tune"     // "recorded"
	recordedConfKey = "recorded" // the recorded setting string, as recordedConf says it
)

// ShardRecorded is the recorded setting's replay as a shard's results
// file holds it: its settings say so and name the recorded setting.
func ShardRecorded(r *sim.Result, conf string) *sim.Result {
	c := *r
	c.Settings = map[string]string{recordedKey: "recorded", recordedConfKey: conf}
	return &c
}

// Records returns a trace's records of kind tune: the recorded
// setting's replay (recConf), then the candidates cs in their rank order
// (Rank).
func Records(recorded *sim.Result, recConf string, cs []Candidate) []*results.Tune {
	rec := *recorded
	rec.Settings = map[string]string{"conf": recConf} // as the candidates'; a shard's says "recorded"
	out := []*results.Tune{{Result: rec, Conf: recConf, Recorded: true}}
	for k, c := range cs {
		out = append(out, &results.Tune{Result: *c.Result, Conf: c.Conf, Rank: k + 1, Front: c.Front, Recommended: k == 0, SameAs: c.Same})
	}
	return out
}

// Shard is a trace's candidates ranked together from the results files
// of tune --shard runs (FromShards).
type Shard struct {
	// Trace is the trace's path as the results name it.
	Trace string
	// RecConf is the recorded setting (RecordedConf), Recorded its replay.
	RecConf  string
	Recorded *sim.Result
	// Candidates are every setting of the grid, ranked (Rank).
	Candidates []Candidate
}

// FromShards ranks the candidates of tune --shard results files (paths)
// together: per trace, in the order of first appearance, every setting
// string of confs exactly once and the recorded setting's replay (the
// same in every shard). Errors: a file that cannot be read, and one naming
// the trace and the setting string missing, repeated or not of the grid.
func FromShards(paths, confs []string) ([]Shard, error) {
	type traceRuns struct {
		byConf   map[string]*sim.Result
		from     map[string]string // the file of each conf's result
		recorded *sim.Result
		recConf  string
	}
	runs := map[string]*traceRuns{}
	var order []string
	for _, path := range paths {
		rs, err := results.ReadSim(path)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			tr := runs[r.Trace]
			if tr == nil {
				tr = &traceRuns{byConf: map[string]*sim.Result{}, from: map[string]string{}}
				runs[r.Trace] = tr
				order = append(order, r.Trace)
			}
			if r.Settings[recordedKey] == "recorded" {
				if tr.recorded != nil && (tr.recorded.PeakReserved != r.PeakReserved || tr.recorded.OOMs != r.OOMs || Calls(tr.recorded) != Calls(r)) {
					return nil, fmt.Errorf("%s: %s: the recorded setting's replay differs from another file's: not shards of one tune", path, r.Trace)
				}
				tr.recorded, tr.recConf = r, r.Settings[recordedConfKey]
				continue
			}
			conf, ok := r.Settings["conf"]
			if !ok {
				return nil, fmt.Errorf("%s: %s, policy %s: not a result of replay tune (no set:conf)", path, r.Trace, r.Policy)
			}
			if prev, dup := tr.from[conf]; dup {
				return nil, fmt.Errorf("%s: %s: setting %q is also in %s: a shard given twice", path, r.Trace, Describe(conf), prev)
			}
			tr.byConf[conf], tr.from[conf] = r, path
		}
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("tune --from-results: no results in %s", strings.Join(paths, ", "))
	}
	var out []Shard
	for _, name := range order {
		tr := runs[name]
		if tr.recorded == nil {
			return nil, fmt.Errorf("%s: no recorded setting's replay in the results (not written by tune --shard)", name)
		}
		cs := make([]Candidate, 0, len(confs))
		for _, conf := range confs {
			r, ok := tr.byConf[conf]
			if !ok {
				return nil, fmt.Errorf("%s: setting %q of the grid is in none of the results: a shard missing (or another --grid)", name, Describe(conf))
			}
			cs = append(cs, Candidate{Conf: conf, Result: r})
		}
		if len(tr.byConf) != len(confs) {
			for conf := range tr.byConf {
				if !slices.Contains(confs, conf) {
					return nil, fmt.Errorf("%s: setting %q of %s is not of the grid (give the --grid of the shards)", name, Describe(conf), tr.from[conf])
				}
			}
		}
		Rank(cs)
		out = append(out, Shard{Trace: name, RecConf: tr.recConf, Recorded: tr.recorded, Candidates: cs})
	}
	return out, nil
}

// ParseGrid returns grid with each of specs (KEY=v1,v2,..., as --grid
// writes them; "" leaves the key out) in place of the axis of its key, or
// added after the others. Errors: a spec without KEY=.
func ParseGrid(grid []Axis, specs []string) ([]Axis, error) {
	grid = append([]Axis(nil), grid...)
	for _, g := range specs {
		key, vals, ok := strings.Cut(g, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("--grid %q: want KEY=VALUES, the values separated by commas", g)
		}
		ax := Axis{Key: strings.TrimSpace(key)}
		for _, v := range strings.Split(vals, ",") {
			ax.Values = append(ax.Values, strings.Trim(strings.TrimSpace(v), `"`))
		}
		found := false
		for k := range grid {
			if grid[k].Key == ax.Key {
				grid[k], found = ax, true
			}
		}
		if !found {
			grid = append(grid, ax)
		}
	}
	return grid, nil
}

// RankRun is a rank of a multi-GPU job tuned trace by trace: its rank,
// its candidates in the order of the grid, and its recorded replay.
type RankRun struct {
	Rank       int
	Candidates []Candidate
	Recorded   *sim.Result
}

// WriteJob prints the line of a job of two ranks or more (runs): the one
// setting recommended for every rank, ranked by its largest rank's peak
// reserved bytes and the ranks' OOMs, calls and time together (Combine),
// beside the recorded setting's figures. It prints nothing for a job of
// one rank, or whose ranks' candidates do not combine.
func WriteJob(w io.Writer, name string, runs []RankRun) {
	if len(runs) < 2 {
		return
	}
	var ranks, recorded [][]Candidate
	for _, r := range runs {
		ranks = append(ranks, r.Candidates)
		recorded = append(recorded, []Candidate{{Conf: "recorded", Result: r.Recorded}})
	}
	cs, rec := Combine(name, ranks), Combine(name, recorded)
	if cs == nil || rec == nil {
		return
	}
	Rank(cs)
	best := cs[0].Result
	fmt.Fprintf(w, "job %s (%d ranks): recommended for every rank: PYTORCH_CUDA_ALLOC_CONF=%q: predicted peak reserved of its largest rank %d bytes, %d OOMs over the ranks, %d device calls (recorded: %d bytes, %d OOMs, %d)\n",
		termsafe.String(filepath.Base(name)), len(runs), cs[0].Conf, best.PeakReserved, best.OOMs, Calls(best), rec[0].Result.PeakReserved, rec[0].Result.OOMs, Calls(rec[0].Result))
}

// ShardOf returns the setting strings of shard i of n: every n-th of
// confs from the i-th (all of them for n of 1).
func ShardOf(confs []string, i, n int) []string {
	if n <= 1 {
		return confs
	}
	var mine []string
	for k, c := range confs {
		if k%n == i {
			mine = append(mine, c)
		}
	}
	return mine
}

// File tunes the trace at path, read whole into memory once: its replay
// as recorded (cfg with the trace's own settings), then a replay per
// setting string of confs (Run, jobs at a time; replayAll as there), the
// candidates in the order of confs, not ranked. cfg.Progress, when set,
// is told of each replay. Errors name the trace.
func File(path string, cfg sim.Config, confs []string, jobs int, replayAll bool) (h trace.Header, recorded *sim.Result, cs []Candidate, err error) {
	h, evs, err := tracefile.ReadAll(path, tracefile.Options{})
	if err != nil {
		return h, nil, nil, err
	}
	cfg.Trace = path
	rs, err := sim.Run(trace.NewSliceSource(h, evs), cfg)
	if err != nil {
		return h, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	cs, err = Run(h, evs, cfg, confs, jobs, replayAll)
	if err != nil {
		return h, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, rs[0], cs, nil
}
