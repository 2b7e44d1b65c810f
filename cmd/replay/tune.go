package main

import (
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/fit"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/tune"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const tuneUsage = `usage: replay tune [--capacity SIZE | --card SIZE] [--grid KEY=v1,v2,...]... [--top N]
                   [-j N] [--json FILE] TRACE...

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

What the search can miss: values between the grid's points, other keys,
and a program that would have run differently (one that caught an OOM and
retried smaller makes other requests once the OOM is gone).

Flags:
`

func runTune(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("tune", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, tuneUsage)
		fs.PrintDefaults()
	}
	capacity := fs.String("capacity", "", "hold the reserved bytes to `SIZE` (a per-process cap)")
	card := fs.String("card", "", "hold the footprint to a `CARD` less its context (552402944 bytes, the H200's): a size (80GB, GB are 10^9 bytes), H100-80GB (its nominal size) or H200 (its measured 150109880320 bytes)")
	grids := fs.StringArray("grid", nil, "a key's values, `KEY=v1,v2,...` (\"\" leaves the key out; repeatable)")
	top := fs.Int("top", 10, "candidates listed per trace")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "replays at a time")
	jsonOut := fs.String("json", "", "write every candidate's result to `FILE` (- for stdout), its setting as set:conf")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return cli.UsageError{Err: err}
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
	// As recorded: the candidates replace the recorded settings, and the
	// replay follows the program's own actions (empty_cache, late frees),
	// which is what made the H200 runs of the recommended settings match.
	base := sim.Config{Policy: "pytorch", AsRecorded: true, CardCapacity: *capacity == "" && *card == ""}
	switch {
	case *capacity != "":
		b, err := policies.ParseSize(*capacity)
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
		fmt.Fprintf(stderr, "tune: card %s: %d bytes less its %d-byte context, a capacity of %d bytes\n", c.Name, b, uint64(sim.ContextBytes), b-sim.ContextBytes)
		base.Capacity, base.Card = b-sim.ContextBytes, true
	}
	grid := append([]tune.Axis(nil), tune.PyTorchGrid...)
	for _, g := range *grids {
		key, vals, ok := strings.Cut(g, "=")
		if !ok || key == "" {
			return cli.UsageError{Err: fmt.Errorf("--grid %q: want KEY=v1,v2,...", g)}
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
	if err := checkOutputs(fs.Args(), "json", *jsonOut); err != nil {
		return err
	}
	var all []*sim.Result
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
		f, err := tracefile.Open(path, tracefile.Options{})
		if err != nil {
			return err
		}
		h := f.Header()
		evs, err := trace.ReadAll(f)
		f.Close()
		if err != nil {
			return tracefile.NameError(path, err)
		}
		cfg := base
		cfg.Trace = path
		// The recorded setting: the trace as recorded.
		rs, err := sim.Run(trace.NewSliceSource(h, evs), cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		recorded := rs[0]
		cs, err := tune.Run(h, evs, cfg, confs, *jobs)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, c := range cs {
			all = append(all, c.Result)
		}
		if name, rank, ok := job.Rank(path); ok {
			if jobRuns[name] == nil {
				jobOrder = append(jobOrder, name)
			}
			jobRuns[name] = append(jobRuns[name], rankRun{rank, append([]tune.Candidate(nil), cs...), recorded})
		}
		tune.Rank(cs)
		// The recorded replay's warnings (a failed malloc served for want
		// of a capacity...) apply to every candidate.
		writeWarnings(stderr, []*sim.Result{recorded})
		if *jsonOut != "-" {
			writeTune(stdout, path, h, recorded, cs, *top)
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
			filepath.Base(name), len(runs), cs[0].Conf, best.PeakReserved, best.OOMs, tune.Calls(best), rec[0].Result.PeakReserved, rec[0].Result.OOMs, tune.Calls(rec[0].Result))
	}
	if *jsonOut != "" {
		if err := writeOutput(stdout, *jsonOut, func(w io.Writer) error { return results.WriteSim(w, all) }); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}

// writeTune prints a trace's ranked candidates, the recorded setting's
// figures and the recommendation.
func writeTune(w io.Writer, path string, h trace.Header, recorded *sim.Result, cs []tune.Candidate, top int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\trank\tPYTORCH_CUDA_ALLOC_CONF\treserved MiB\tdevice calls\talloc ms\tOOMs\tfront\n", results.TraceName(path))
	row := func(rank, conf string, r *sim.Result, front bool) {
		mark := ""
		if front {
			mark = "*"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%d\t%.1f\t%d\t%s\n", rank, conf, mib(r.PeakReserved), tune.Calls(r), float64(r.SimAllocTimeNS)/1e6, r.OOMs, mark)
	}
	recConf := recordedConf(h)
	row("recorded", recConf, recorded, false)
	for k := range cs[:min(top, len(cs))] {
		row(fmt.Sprint(k+1), tune.Describe(cs[k].Conf), cs[k].Result, cs[k].Front)
	}
	tw.Flush()
	best := cs[0]
	fmt.Fprintf(w, "%s: %d settings tried; recommended: PYTORCH_CUDA_ALLOC_CONF=%q: predicted peak reserved %d bytes, %d device allocations (cudaMalloc or page maps), %d OOMs (recorded %s: %d bytes, %d, %d OOMs)\n",
		path, len(cs), best.Conf, best.Result.PeakReserved, best.Result.DeviceAllocs, best.Result.OOMs,
		recConf, recorded.PeakReserved, recorded.DeviceAllocs, recorded.OOMs)
}

// recordedConf is the setting string the trace was recorded with, as its
// header says.
func recordedConf(h trace.Header) string {
	if c, ok := h.Settings["PYTORCH_CUDA_ALLOC_CONF"]; ok {
		return tune.Describe(c)
	}
	return "(as recorded)"
}
