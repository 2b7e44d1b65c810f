package replaycli

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/internal/progress"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const sweepUsage = `usage: replay sweep --traces GLOB... [--policy LIST|all] [--set NAME.key=value]...
                    [--grid NAME.key=v1,v2,...]... [--capacity SIZE[,SIZE...]] [--shard i/n]
                    [-j N] [--parquet] -o DIR [TRACE|GLOB|DIR...]

Replays every (trace, policy, setting, capacity) cell in parallel and streams
the results to DIR: DIR/cells/*.json (one file per finished cell, so that a
rerun skips them), DIR/results.csv (a row per cell as it finishes) and, at the
end, DIR/results.json (the shape of 'replay sim --json') and results.csv again
in plan order. --shard i/n (0 <= i < n) runs every n-th cell from the i-th,
for a job array; give each shard its own DIR and join them with
'replay merge'. In a Slurm array task (--array=0-N, numbered from 0) the
shard is the task's, SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_MAX+1, as with
--shard auto; in a Kubernetes Indexed Job, --shard auto/N takes it from
JOB_COMPLETION_INDEX, N the Job's completions. Either way the task writes
into DIR/shard-i-of-n, and a task run again (after a failure or preemption,
sbatch --array=i alone) resumes there, the number of shards taken from the
shard directories in DIR: finished cells are kept, partial ones never count.

Flags:
`

func runSweep(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("sweep", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), sweepUsage)
		fs.PrintDefaults()
	}
	traceGlobs := fs.StringArray("traces", nil, "traces to replay, `GLOB`: a file, a glob (** matches any number of directories) or a directory (every trace file in it); repeatable")
	policyList := fs.String("policy", "all", "policies, a comma-separated `LIST` of names, or all ("+strings.Join(policies.Names(), ", ")+")")
	sets := fs.StringArray("set", nil, "a policy setting `NAME.key=value` for every cell of that policy (repeatable)")
	grids := fs.StringArray("grid", nil, "a policy setting to sweep, `NAME.key=v1,v2,...`: one cell per value (repeatable; several make a product)")
	capacity := fs.String("capacity", "0", "device capacities `SIZE,...`: a comma-separated list of bytes or sizes like 24GiB (0 = unlimited)")
	outDir := fs.StringP("out", "o", "", "write the results into `DIR` (required)")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "`N` replays run in parallel (default: every core)")
	parquetOut := fs.Bool("parquet", false, "also write DIR/results.parquet: one row per (trace, policy, settings, capacity), typed columns, for DuckDB or pandas")
	fs.Lookup("jobs").DefValue = "0" // every core, said in the usage: not this machine's count in the help
	shard := fs.String("shard", "", "run only shard `i/n` of the cells (0 <= i < n); auto takes i and n from a Slurm array task (the default in one) or, as auto/N, i from a Kubernetes Indexed Job's JOB_COMPLETION_INDEX, and writes into DIR/shard-i-of-n")
	progressMode := fs.String("progress", "auto", "progress display on stderr, `MODE`: auto (a bar on a terminal, lines otherwise), bar, lines or none")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	asRecorded := fs.Bool("as-recorded", true, "replay a recording as recorded, as replay sim does: with the allocator settings it records (--set and --grid override them) and at its recorded addresses")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if *outDir == "" {
		return cli.UsageError{Err: fmt.Errorf("sweep: no output directory (-o DIR)")}
	}
	if *jobs < 1 {
		return cli.UsageError{Err: fmt.Errorf("-j %d: want at least 1", *jobs)}
	}
	shardI, shardN, auto, err := shardFlag(*shard, fs.Changed("shard"), func(count int) (int, error) {
		done, err := sweep.ShardsIn(*outDir)
		if err == nil && count > 0 && done > 0 && count != done {
			err = fmt.Errorf("%s holds the shards of an array of %d tasks", *outDir, done)
		}
		return done, err
	})
	if err != nil {
		return err
	}
	if auto {
		*outDir = sweep.ShardDir(*outDir, shardI, shardN)
		fmt.Fprintf(stderr, "sweep: shard %d/%d from the scheduler, into %s\n", shardI, shardN, *outDir)
	}
	traces, skipped, err := tracefile.Glob(append(append([]string(nil), *traceGlobs...), fs.Args()...))
	if err != nil {
		return fmt.Errorf("--traces: %w", err)
	}
	for _, s := range skipped {
		fmt.Fprintf(stderr, "sweep: %s\n", cli.Safe(s))
	}
	if len(traces) == 0 {
		return cli.UsageError{Err: fmt.Errorf("sweep: no trace given (--traces GLOB)")}
	}
	// No trace is one of the files the sweep writes in DIR, checked
	// before anything runs.
	if err := checkOutputs(traces, "out", filepath.Join(*outDir, "plan.json"), "out", filepath.Join(*outDir, "results.json"), "out", filepath.Join(*outDir, "results.csv")); err != nil {
		return err
	}
	if err := atomicfile.CheckDir(traces, "out", filepath.Join(*outDir, "cells"), []string{".json"}); err != nil {
		return err
	}
	spec := sweep.Spec{Traces: traces, AsRecorded: *asRecorded}
	if spec.Policies, err = policyNames(*policyList); err != nil {
		return err
	}
	if spec.Fixed, err = parseSets(*sets, spec.Policies); err != nil {
		return err
	}
	for _, g := range *grids {
		ax, err := sweep.ParseAxis(g)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--grid %w", err)}
		}
		spec.Axes = append(spec.Axes, ax)
	}
	for _, c := range policies.SplitList(*capacity) {
		b, err := policies.ParseCapacity(c)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--capacity %q: %v", c, err)}
		}
		spec.Capacities = append(spec.Capacities, b)
	}
	if len(spec.Capacities) == 0 {
		return cli.UsageError{Err: fmt.Errorf("--capacity: no capacity given")}
	}
	all, err := spec.Cells()
	if ae := (*sweep.AxisError)(nil); errors.As(err, &ae) {
		return cli.UsageError{Err: fmt.Errorf("--grid %w", err)}
	} else if err != nil {
		return err
	}
	plan := sweep.NewPlan(all, shardI, shardN)
	s := &sweep.Runner{Dir: *outDir, Plan: plan, Workers: *jobs, Open: tracefile.Options{From: *from, Device: *device}, Log: stderr, Parquet: *parquetOut}
	dir := *outDir
	atomicfile.SetInterruptNote(func() string {
		// The cell files on disk: what a rerun skips.
		cells, _ := filepath.Glob(filepath.Join(dir, "cells", "*.json"))
		return fmt.Sprintf("%d of the %d cells kept in %s; run the same sweep again to resume (results.json is written when all are done)", len(cells), len(plan.Cells), filepath.Join(dir, "cells"))
	})
	start := time.Now()
	defer s.Close()
	if err := s.Prepare(); err != nil {
		return err
	}
	pg, err := progress.NewSweep(*progressMode, stderr, len(plan.Cells), s.DoneBefore())
	if err != nil {
		return err
	}
	s.Progress = pg.JobDone
	runErr := s.Run()
	pg.Finish()
	if err := s.WriteResults(); err != nil {
		return err
	}
	elapsed := time.Since(start)
	what := fmt.Sprintf("%d cells", len(plan.Cells))
	if shardN > 1 {
		what = fmt.Sprintf("shard %d/%d: %d of %d cells", shardI, shardN, len(plan.Cells), plan.Total)
	}
	failed, caps := s.Failed(), len(spec.Capacities)
	fmt.Fprintf(stdout, "sweep: %s (%d traces x %d policies and settings x %d capacities): %d run, %d already done, %d failed, in %.1f s with %d workers\n",
		what, len(traces), len(all)/max(len(traces)*caps, 1), caps, s.Ran(), s.DoneBefore(), len(failed), elapsed.Seconds(), *jobs)
	if *parquetOut {
		fmt.Fprintf(stdout, "sweep: results in %s, %s and %s\n", filepath.Join(*outDir, "results.csv"), filepath.Join(*outDir, "results.json"), filepath.Join(*outDir, "results.parquet"))
	} else {
		fmt.Fprintf(stdout, "sweep: results in %s and %s\n", filepath.Join(*outDir, "results.csv"), filepath.Join(*outDir, "results.json"))
	}
	tables.CellWarnings(stderr, s.Results())
	if len(failed) > 0 {
		for _, f := range failed[:min(len(failed), 5)] {
			fmt.Fprintf(stderr, "sweep: cell %d: %s\n", f.Index, cli.Safe(f.Err.Error()))
		}
		return fmt.Errorf("sweep: %d of %d cells failed (first: %v); a rerun retries them", len(failed), len(plan.Cells), failed[0].Err)
	}
	return runErr
}

// shardFlag is sweep.ResolveShard, its errors usage errors.
func shardFlag(spec string, given bool, done func(count int) (int, error)) (i, n int, auto bool, err error) {
	i, n, auto, err = sweep.ResolveShard(spec, given, done)
	if err != nil {
		return 0, 0, false, cli.UsageError{Err: err}
	}
	return i, n, auto, nil
}
