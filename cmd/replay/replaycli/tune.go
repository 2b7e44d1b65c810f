package replaycli

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/fit"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/sim/tune"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const tuneUsage = `usage: replay tune [--capacity SIZE | --card SIZE] [--grid KEY=v1,v2,...]... [--top N]
                   [-j N] [--json FILE] [--shard i/n|auto] [--replay-all] TRACE...
       replay tune [--grid KEY=v1,v2,...]... [--top N] --from-results FILE...

Searches PyTorch's caching allocator settings (PYTORCH_CUDA_ALLOC_CONF) for
each trace: every setting string of a grid (by default max_split_size_mb,
roundup_power2_divisions, garbage_collection_threshold and
expandable_segments over the values people set: 180 strings; --grid
replaces a key's values, "" meaning the key left out) is replayed with the
pytorch policy from memory, the trace decoded once, on -j workers. The
candidates are ranked by fewer OOMs, then peak reserved bytes, then device
calls (cudaMalloc and cudaFree), then simulated allocator time; '*' marks
the Pareto front of the three. The best is printed as the string to paste,
with its predicted figures against those of the recorded setting (the
trace replayed as recorded). --capacity holds the reserved bytes (a
per-process cap), --card holds the footprint to a card's memory less its
context; without either, a record run trace's card is used. The per-rank
traces of a job (job.rank0.trace ...: see replay sim) get one setting for
every rank, ranked by the largest rank's peak reserved bytes and the
ranks' OOMs, device calls and allocator time together.

A setting string that differs from another of the grid only in
max_split_size_mb or garbage_collection_threshold, where the other's is
left out, is not replayed when the other's replay shows that its value
could not have acted: no rounded request and no cached block it compared
was that large, and the reserved bytes never passed the threshold where
a collection would have run. Its figures are then the other's, exactly
(--replay-all replays it all the same).

Across a scheduler, --shard i/n replays every n-th setting string from
the i-th (and the recorded setting) and writes their results to the --json
FILE with .shard-i-of-n before its extension; --shard auto takes i and n
from a Slurm array task (the default in one) or, as auto/N, i from a
Kubernetes Indexed Job, as replay sweep does. A task run again writes the
same file. --from-results ranks the candidates of those files together, as
one run would: every setting string of the grid (give the same --grid) must
be there once per trace, else it names the missing or repeated one.

What the search can miss: values between the grid's points, other keys,
and a program that would have run differently (one that caught an OOM and
retried smaller makes other requests once the OOM is gone).

Flags:
`

func runTune(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("tune", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), tuneUsage)
		fs.PrintDefaults()
	}
	capacity := fs.String("capacity", "", "hold the reserved bytes to `SIZE` (a per-process cap)")
	card := fs.String("card", "", "hold the footprint to a `CARD` less its context (552402944 bytes, the H200's): a size (80GB, GB are 10^9 bytes), H100-80GB (its nominal size) or H200 (its measured 150109880320 bytes)")
	grids := fs.StringArray("grid", nil, "a key's values, `KEY=v1,v2,...` (\"\" leaves the key out; repeatable)")
	top := fs.Int("top", 10, "list `N` candidates per trace")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "`N` replays at a time (default: every core)")
	fs.Lookup("jobs").DefValue = "0" // every core, said in the usage: not this machine's count in the help
	jsonOut := fs.String("json", "", "write every candidate's result to `FILE` (- for stdout), its setting as set:conf")
	shard := fs.String("shard", "", "replay only shard `i/n` of the setting strings (0 <= i < n) into the --json FILE with .shard-i-of-n before its extension; auto takes i and n from a Slurm array task (the default in one) or, as auto/N, i from a Kubernetes Indexed Job's JOB_COMPLETION_INDEX")
	fromResults := fs.Bool("from-results", false, "the arguments are the --json files of tune --shard runs: rank their candidates together")
	replayAll := fs.Bool("replay-all", false, "replay every setting, also those that differ from one replayed only where its replay shows they cannot act (see above)")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return cli.UsageError{Err: fmt.Errorf("tune: no trace given")}
	}
	if *capacity != "" && *card != "" {
		return cli.UsageError{Err: fmt.Errorf("tune: --capacity and --card are exclusive")}
	}
	if *top < 0 {
		return cli.UsageError{Err: fmt.Errorf("--top %d: want 0 or more", *top)}
	}
	if *jobs < 1 {
		return cli.UsageError{Err: fmt.Errorf("-j %d: want at least 1", *jobs)}
	}
	shardI, shardN := 0, 1
	if !*fromResults {
		var err error
		if shardI, shardN, _, err = shardFlag(*shard, fs.Changed("shard"), nil); err != nil {
			return err
		}
	} else if *shard != "" {
		return cli.UsageError{Err: fmt.Errorf("tune: --shard and --from-results are exclusive")}
	} else if *replayAll {
		return cli.UsageError{Err: fmt.Errorf("tune: --replay-all and --from-results are exclusive (the shards' runs replayed)")}
	}
	if shardN > 1 {
		if *jsonOut == "" || *jsonOut == "-" {
			return cli.UsageError{Err: fmt.Errorf("tune --shard %d/%d: give the results file with --json FILE", shardI, shardN)}
		}
		*jsonOut = shardFile(*jsonOut, shardI, shardN)
	}
	// As recorded: the candidates replace the recorded settings, and the
	// replay follows the program's own actions (empty_cache, late frees),
	// which is what made the H200 runs of the recommended settings match.
	base := sim.Config{Policy: "pytorch", AsRecorded: true, CardCapacity: *capacity == "" && *card == ""}
	switch {
	case *capacity != "":
		b, err := policies.ParseCapacity(*capacity)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--capacity %q: %v", *capacity, err)}
		}
		base.Capacity = b
	case *card != "":
		c, err := fit.ParseCard(*card)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--card %v", err)}
		}
		b := c.Capacity
		if b <= sim.ContextBytes {
			return cli.UsageError{Err: fmt.Errorf("--card %q: not above the %d-byte context", *card, uint64(sim.ContextBytes))}
		}
		fmt.Fprintf(stderr, "tune: card %s: %d bytes%s, less its %d-byte context: the footprint held to %d bytes\n", cli.Safe(c.Label()), b, nominalNote(c), uint64(sim.ContextBytes), b-sim.ContextBytes)
		base.Capacity, base.Card = b-sim.ContextBytes, true
	}
	grid := append([]tune.Axis(nil), tune.PyTorchGrid...)
	for _, g := range *grids {
		key, vals, ok := strings.Cut(g, "=")
		if !ok || key == "" {
			return cli.UsageError{Err: fmt.Errorf("--grid %q: want KEY=VALUES, the values separated by commas", g)}
		}
		ax := tune.Axis{Key: strings.TrimSpace(key)}
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
	confs := tune.Candidates(grid)
	for _, c := range confs {
		if err := policies.CheckSettings("pytorch", policies.Settings{"conf": c}); err != nil {
			return cli.UsageError{Err: fmt.Errorf("tune --grid: %w", err)}
		}
	}
	if err := checkOutputs(fs.Args(), "json", *jsonOut); err != nil {
		return err
	}
	if *fromResults {
		all, err := tuneFromResults(stdout, stderr, fs.Args(), confs, *top, *jsonOut != "-")
		if err != nil || *jsonOut == "" {
			return err
		}
		return writeTuneJSON(stdout, *jsonOut, func(w io.Writer) error { return results.WriteTune(w, all) })
	}
	mine := confs
	if shardN > 1 {
		mine = nil
		for k, c := range confs {
			if k%shardN == shardI {
				mine = append(mine, c)
			}
		}
	}
	var all []*sim.Result     // a shard's results (kind sim, for --from-results)
	var tunes []*results.Tune // the ranked candidates (kind tune)
	// The per-rank traces of a job: each rank's candidates in the order
	// of confs, and its recorded replay, by job.
	type rankRun struct {
		rank     int
		cs       []tune.Candidate
		recorded *sim.Result
	}
	jobRuns := map[string][]rankRun{}
	var jobOrder []string
	for _, path := range fs.Args() {
		h, evs, err := tracefile.ReadAll(path, tracefile.Options{})
		if err != nil {
			return err
		}
		cfg := base
		cfg.Trace = path
		counter := newReplayCounter(stderr, "tune "+cli.Safe(filepath.Base(path)), len(mine)+1)
		cfg.Progress = counter.Progress()
		// The recorded setting: the trace as recorded.
		rs, err := sim.Run(trace.NewSliceSource(h, evs), cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		recorded := rs[0]
		cs, err := tune.Run(h, evs, cfg, mine, *jobs, *replayAll)
		counter.Finish()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if shardN > 1 {
			// Each shard carries the recorded setting's replay, for the
			// ranking of --from-results.
			all = append(all, recordedResult(recorded, recordedConf(h)))
		}
		for _, c := range cs {
			all = append(all, c.Result)
		}
		if shardN > 1 {
			fmt.Fprintf(stdout, "%s: shard %d/%d: %d of %d settings tried; rank every shard's with replay tune --from-results\n", cli.Safe(path), shardI, shardN, len(cs), len(confs))
			continue
		}
		if name, rank, ok := job.Rank(path); ok {
			if jobRuns[name] == nil {
				jobOrder = append(jobOrder, name)
			}
			jobRuns[name] = append(jobRuns[name], rankRun{rank, append([]tune.Candidate(nil), cs...), recorded})
		}
		tune.Rank(cs)
		tunes = append(tunes, tuneRecords(recorded, recordedConf(h), cs)...)
		// The recorded replay's warnings (a failed malloc served for want
		// of a capacity...) apply to every candidate.
		tables.Warnings(stderr, []*sim.Result{recorded})
		if *jsonOut != "-" {
			writeTune(stdout, path, recordedConf(h), recorded, cs, *top)
		}
	}
	for _, name := range jobOrder {
		runs := jobRuns[name]
		if len(runs) < 2 || *jsonOut == "-" {
			continue
		}
		// One setting for the whole job: ranked by its largest rank's
		// peak and the ranks' OOMs, calls and time together.
		var ranks, recorded [][]tune.Candidate
		for _, r := range runs {
			ranks = append(ranks, r.cs)
			recorded = append(recorded, []tune.Candidate{{Conf: "recorded", Result: r.recorded}})
		}
		cs, rec := tune.Combine(name, ranks), tune.Combine(name, recorded)
		if cs == nil || rec == nil {
			continue
		}
		tune.Rank(cs)
		best := cs[0].Result
		fmt.Fprintf(stdout, "job %s (%d ranks): recommended for every rank: PYTORCH_CUDA_ALLOC_CONF=%q: predicted peak reserved of its largest rank %d bytes, %d OOMs over the ranks, %d device calls (recorded: %d bytes, %d OOMs, %d)\n",
			cli.Safe(filepath.Base(name)), len(runs), cs[0].Conf, best.PeakReserved, best.OOMs, tune.Calls(best), rec[0].Result.PeakReserved, rec[0].Result.OOMs, tune.Calls(rec[0].Result))
	}
	if *jsonOut != "" {
		if shardN > 1 {
			return writeTuneJSON(stdout, *jsonOut, func(w io.Writer) error { return results.WriteSim(w, all) })
		}
		return writeTuneJSON(stdout, *jsonOut, func(w io.Writer) error { return results.WriteTune(w, tunes) })
	}
	return nil
}

// writeTuneJSON writes the candidates' results (write) to path (- for stdout),
// unless a write of the tables to stdout has failed already: the tables
// are printed as the traces are tuned, and a full disk or a closed pipe
// there must not leave the --json file replaced as if all went well.
func writeTuneJSON(stdout io.Writer, path string, write func(io.Writer) error) error {
	if cw, ok := stdout.(*cli.CheckedWriter); ok && cw.Err != nil {
		return fmt.Errorf("writing standard output: %w (--json %s not written)", cw.Err, path)
	}
	if err := atomicfile.WriteOutput(stdout, path, write); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

// writeTune prints a trace's ranked candidates, the recorded setting
// (recConf, as recordedConf says it) and its figures, and the
// recommendation.
func writeTune(w io.Writer, path, recConf string, recorded *sim.Result, cs []tune.Candidate, top int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\trank\tPYTORCH_CUDA_ALLOC_CONF\treserved MiB\tdevice calls\talloc ms\tOOMs\tfront\n", results.TraceName(path))
	row := func(rank, conf string, r *sim.Result, front bool) {
		mark := ""
		if front {
			mark = "*"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%d\t%.1f\t%d\t%s\n", rank, conf, tables.MiB(r.PeakReserved), tune.Calls(r), float64(r.SimAllocTimeNS)/1e6, r.OOMs, mark)
	}
	row("recorded", cli.Safe(recConf), recorded, false)
	for k := range cs[:min(top, len(cs))] {
		row(fmt.Sprint(k+1), tune.Describe(cs[k].Conf), cs[k].Result, cs[k].Front)
	}
	tw.Flush()
	best := cs[0]
	fmt.Fprintf(w, "%s: %d settings tried; recommended: PYTORCH_CUDA_ALLOC_CONF=%q: predicted peak reserved %d bytes, %d device allocations (cudaMalloc or page maps), %d OOMs (recorded %s: %d bytes, %d, %d OOMs)\n",
		cli.Safe(path), len(cs), best.Conf, best.Result.PeakReserved, best.Result.DeviceAllocs, best.Result.OOMs,
		cli.Safe(recConf), recorded.PeakReserved, recorded.DeviceAllocs, recorded.OOMs)
}

// recordedConf is the setting string the trace was recorded with, as its
// header says.
func recordedConf(h trace.Header) string {
	if c, ok := h.Settings["PYTORCH_CUDA_ALLOC_CONF"]; ok {
		return tune.Describe(c)
	}
	return "(as recorded)"
}

// shardFile is the results file of shard i of n: path with
// .shard-i-of-n before its extension.
func shardFile(path string, i, n int) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + fmt.Sprintf(".shard-%d-of-%d", i, n) + ext
}

// Settings keys of the recorded setting's replay in a shard's results.
const (
	tuneRecordedKey     = "tune"     // "recorded"
	tuneRecordedConfKey = "recorded" // the recorded setting string, as recordedConf says it
)

// recordedResult is the recorded setting's replay as a shard's results
// file holds it: its settings say so and name the recorded setting.
func recordedResult(r *sim.Result, conf string) *sim.Result {
	c := *r
	c.Settings = map[string]string{tuneRecordedKey: "recorded", tuneRecordedConfKey: conf}
	return &c
}

// tuneFromResults ranks the candidates of tune --shard results files
// (paths) together: per trace, in the order of first appearance, every
// setting string of confs exactly once and the recorded setting's replay
// (the same in every shard), then (with print) the output of one tune
// run. It returns every candidate's result, as one run's --json holds
// them, or an error naming the trace and the setting string missing or
// repeated.
func tuneFromResults(stdout, stderr io.Writer, paths, confs []string, top int, print bool) ([]*results.Tune, error) {
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
			if r.Settings[tuneRecordedKey] == "recorded" {
				if tr.recorded != nil && (tr.recorded.PeakReserved != r.PeakReserved || tr.recorded.OOMs != r.OOMs || tune.Calls(tr.recorded) != tune.Calls(r)) {
					return nil, fmt.Errorf("%s: %s: the recorded setting's replay differs from another file's: not shards of one tune", path, r.Trace)
				}
				tr.recorded, tr.recConf = r, r.Settings[tuneRecordedConfKey]
				continue
			}
			conf, ok := r.Settings["conf"]
			if !ok {
				return nil, fmt.Errorf("%s: %s, policy %s: not a result of replay tune (no set:conf)", path, r.Trace, r.Policy)
			}
			if prev, dup := tr.from[conf]; dup {
				return nil, fmt.Errorf("%s: %s: setting %q is also in %s: a shard given twice", path, r.Trace, tune.Describe(conf), prev)
			}
			tr.byConf[conf], tr.from[conf] = r, path
		}
	}
	var all []*results.Tune
	if len(order) == 0 {
		return nil, fmt.Errorf("tune --from-results: no results in %s", strings.Join(paths, ", "))
	}
	for _, name := range order {
		tr := runs[name]
		if tr.recorded == nil {
			return nil, fmt.Errorf("%s: no recorded setting's replay in the results (not written by tune --shard)", name)
		}
		cs := make([]tune.Candidate, 0, len(confs))
		for _, conf := range confs {
			r, ok := tr.byConf[conf]
			if !ok {
				return nil, fmt.Errorf("%s: setting %q of the grid is in none of the results: a shard missing (or another --grid)", name, tune.Describe(conf))
			}
			cs = append(cs, tune.Candidate{Conf: conf, Result: r})
		}
		if len(tr.byConf) != len(confs) {
			for conf := range tr.byConf {
				if !slices.Contains(confs, conf) {
					return nil, fmt.Errorf("%s: setting %q of %s is not of the grid (give the --grid of the shards)", name, tune.Describe(conf), tr.from[conf])
				}
			}
		}
		tune.Rank(cs)
		all = append(all, tuneRecords(tr.recorded, tr.recConf, cs)...)
		tables.Warnings(stderr, []*sim.Result{tr.recorded})
		if print {
			writeTune(stdout, name, tr.recConf, tr.recorded, cs, top)
		}
	}
	return all, nil
}

// tuneRecords returns a trace's records of kind tune: the recorded
// setting's replay (recConf), then the candidates cs in their rank order
// (tune.Rank).
func tuneRecords(recorded *sim.Result, recConf string, cs []tune.Candidate) []*results.Tune {
	rec := *recorded
	rec.Settings = map[string]string{"conf": recConf} // as the candidates'; a shard's says "recorded"
	out := []*results.Tune{{Result: rec, Conf: recConf, Recorded: true}}
	for k, c := range cs {
		out = append(out, &results.Tune{Result: *c.Result, Conf: c.Conf, Rank: k + 1, Front: c.Front, Recommended: k == 0, SameAs: c.Same})
	}
	return out
}

// nominalNote is what a line naming a card adds for a nominal one.
func nominalNote(c results.Card) string {
	if c.Nominal {
		return " (nominal: as sold, not what CUDA reports for it)"
	}
	return ""
}
