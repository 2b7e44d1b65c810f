package replaycli

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/internal/progress"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/fit"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/sim/tune"
	"github.com/gpualloc/allocsim/trace/atomicfile"
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
		*jsonOut = tune.ShardFile(*jsonOut, shardI, shardN)
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
		b, line, err := fit.CardFootprint(*card)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--card %v", err)}
		}
		fmt.Fprintf(stderr, "tune: %s\n", line)
		base.Capacity, base.Card = b, true
	}
	grid, err := tune.ParseGrid(tune.PyTorchGrid, *grids)
	if err != nil {
		return cli.UsageError{Err: err}
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
	mine := tune.ShardOf(confs, shardI, shardN)
	var all []*sim.Result     // a shard's results (kind sim, for --from-results)
	var tunes []*results.Tune // the ranked candidates (kind tune)
	// The per-rank traces of a job: each rank's candidates in the order
	// of confs, and its recorded replay, by job.
	jobRuns := map[string][]tune.RankRun{}
	var jobOrder []string
	for _, path := range fs.Args() {
		counter := progress.NewCounter(stderr, "tune "+cli.Safe(filepath.Base(path)), len(mine)+1)
		cfg := base
		cfg.Progress = counter.Progress()
		h, recorded, cs, err := tune.File(path, cfg, mine, *jobs, *replayAll)
		counter.Finish()
		if err != nil {
			return err
		}
		if shardN > 1 {
			// Each shard carries the recorded setting's replay, for the
			// ranking of --from-results.
			all = append(all, tune.ShardRecorded(recorded, tune.RecordedConf(h)))
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
			jobRuns[name] = append(jobRuns[name], tune.RankRun{Rank: rank, Candidates: append([]tune.Candidate(nil), cs...), Recorded: recorded})
		}
		tune.Rank(cs)
		tunes = append(tunes, tune.Records(recorded, tune.RecordedConf(h), cs)...)
		// The recorded replay's warnings (a failed malloc served for want
		// of a capacity...) apply to every candidate.
		tables.Warnings(stderr, []*sim.Result{recorded})
		if *jsonOut != "-" {
			tune.WriteTable(stdout, path, tune.RecordedConf(h), recorded, cs, *top)
		}
	}
	if *jsonOut != "-" {
		for _, name := range jobOrder {
			tune.WriteJob(stdout, name, jobRuns[name])
		}
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

// tuneFromResults ranks the candidates of tune --shard results files
// together (tune.FromShards) and, with print, prints the output of one
// tune run. It returns every candidate's record, as one run's --json
// holds them.
func tuneFromResults(stdout, stderr io.Writer, paths, confs []string, top int, print bool) ([]*results.Tune, error) {
	shards, err := tune.FromShards(paths, confs)
	if err != nil {
		return nil, err
	}
	var all []*results.Tune
	for _, t := range shards {
		all = append(all, tune.Records(t.Recorded, t.RecConf, t.Candidates)...)
		tables.Warnings(stderr, []*sim.Result{t.Recorded})
		if print {
			tune.WriteTable(stdout, t.Trace, t.RecConf, t.Recorded, t.Candidates, top)
		}
	}
	return all, nil
}
