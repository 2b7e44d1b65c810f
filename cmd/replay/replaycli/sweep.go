package replaycli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
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
	progress := fs.String("progress", "auto", "progress display on stderr, `MODE`: auto (a bar on a terminal, lines otherwise), bar, lines or none")
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
	pg, err := newProgress(*progress, stderr, len(plan.Cells), s.DoneBefore())
	if err != nil {
		return err
	}
	s.Progress = pg.jobDone
	runErr := s.Run()
	pg.finish()
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
	writeSweepWarnings(stderr, s.Results())
	if len(failed) > 0 {
		for _, f := range failed[:min(len(failed), 5)] {
			fmt.Fprintf(stderr, "sweep: cell %d: %s\n", f.Index, cli.Safe(f.Err.Error()))
		}
		return fmt.Errorf("sweep: %d of %d cells failed (first: %v); a rerun retries them", len(failed), len(plan.Cells), failed[0].Err)
	}
	return runErr
}

// progress shows a sweep's progress on stderr.
type progress interface {
	jobDone(j sweep.Job)
	finish()
}

func newProgress(mode string, w io.Writer, total, done int) (progress, error) {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch mode {
	case "none":
		return noProgress{}, nil
	case "lines":
		return &lineProgress{w: w, total: total, done: done}, nil
	case "bar":
		bar := progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("sweep"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("cells"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionFullWidth(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		if done > 0 {
			bar.Add(done)
		}
		return &barProgress{bar: bar}, nil
	}
	return nil, fmt.Errorf("--progress %q: want auto, bar, lines or none", mode)
}

type noProgress struct{}

func (noProgress) jobDone(sweep.Job) {}
func (noProgress) finish()           {}

// lineProgress writes a line per finished job.
type lineProgress struct {
	w           io.Writer
	total, done int
}

func (p *lineProgress) jobDone(j sweep.Job) {
	p.done += len(j.Cells)
	status := fmt.Sprintf("%d cells in %.1f s", len(j.Cells), j.Elapsed.Seconds())
	if j.Err != nil {
		status = "failed: " + j.Err.Error()
	}
	fmt.Fprintf(p.w, "sweep: %d/%d %s: %s\n", p.done, p.total, cli.Safe(filepath.Base(j.Trace)), cli.Safe(status))
}

func (p *lineProgress) finish() {}

type barProgress struct{ bar *progressbar.ProgressBar }

func (p *barProgress) jobDone(j sweep.Job) {
	p.bar.Describe("sweep " + cli.Safe(filepath.Base(j.Trace)))
	p.bar.Add(len(j.Cells))
}

func (p *barProgress) finish() { p.bar.Finish() }

// writeSweepWarnings prints the cells' warnings (sim.Result.Warnings) to
// w, one line per trace and warning with the number of cells that have it.
func writeSweepWarnings(w io.Writer, rs []*sim.Result) {
	type key struct{ trace, text string }
	var order []key
	cells := map[key]int{}
	for _, r := range rs {
		for _, x := range r.Warnings {
			k := key{r.Trace, x}
			if cells[k] == 0 {
				order = append(order, k)
			}
			cells[k]++
		}
	}
	for _, k := range order {
		fmt.Fprintf(w, "%s: warning (%d cells): %s\n", cli.Safe(k.trace), cells[k], cli.Safe(k.text))
	}
}

// shardFlag returns shard i of n that a --shard value spec names (given:
// the flag was set): i/n as written ("" for 0 of 1), or, for auto, auto/N
// or no --shard inside a Slurm array task, the scheduler's
// (sweep.SchedulerShard), which auto reports. done, when not nil, is told
// the number of tasks auto/N gives (0 for plain auto) and returns the
// number of shards an earlier run of the array left (0 if none), or an
// error to refuse the shard with. Every error is a usage error.
func shardFlag(spec string, given bool, done func(count int) (int, error)) (i, n int, auto bool, err error) {
	autoSpec, count, ok := autoShard(spec, given)
	if !ok {
		i, n, err = sweep.ParseShard(spec)
		if err != nil {
			return 0, 0, false, cli.UsageError{Err: fmt.Errorf("--shard %w", err)}
		}
		return i, n, false, nil
	}
	if count < 0 {
		return 0, 0, false, cli.UsageError{Err: fmt.Errorf("--shard %q: want auto, auto/N (N > 0) or i/n", autoSpec)}
	}
	left := 0
	if done != nil {
		if left, err = done(count); err != nil {
			return 0, 0, false, cli.UsageError{Err: fmt.Errorf("--shard %s: %w", autoSpec, err)}
		}
	}
	i, n, found, err := sweep.SchedulerShard(os.Getenv, count, left)
	switch {
	case err != nil:
		return 0, 0, false, cli.UsageError{Err: fmt.Errorf("--shard auto: %w", err)}
	case !found:
		return 0, 0, false, cli.UsageError{Err: fmt.Errorf("--shard %s: neither SLURM_ARRAY_TASK_ID nor JOB_COMPLETION_INDEX is set (not a Slurm array task or a Kubernetes Indexed Job pod)", autoSpec)}
	}
	return i, n, true, nil
}

// autoShard reports whether the shard comes from the scheduler: --shard
// auto or auto/N (N the number of tasks, for a Kubernetes Indexed Job), or
// no --shard inside a Slurm array task.
func autoShard(shard string, given bool) (spec string, count int, ok bool) {
	if !given {
		if os.Getenv("SLURM_ARRAY_TASK_ID") != "" {
			return "auto", 0, true
		}
		return "", 0, false
	}
	rest, isAuto := strings.CutPrefix(shard, "auto")
	if !isAuto {
		return "", 0, false
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(rest, "/")); err == nil && strings.HasPrefix(rest, "/") && n > 0 {
		return shard, n, true
	}
	if rest != "" {
		return shard, -1, true
	}
	return shard, 0, true
}
