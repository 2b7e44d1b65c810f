package replaycli

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const gpuUsage = `usage: replay gpu [flags] TRACE...

Replays each trace on the GPU against each target: cuda (every malloc a
cudaMalloc, every free a cudaFree), cuda-async (cudaMallocAsync and
cudaFreeAsync on the trace's streams), or any simulated policy on real
cudaMalloc/cudaFree. Every call is timed in C around the call. The same
trace is simulated alongside with the cost model, for the comparison.
Everything allocated is freed at the end, on error and on Ctrl-C.

Flags:
`

func runGPU(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("gpu", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), gpuUsage); fs.PrintDefaults() }
	policyList := fs.String("policy", gpu.TargetCUDA, "targets, a comma-separated `LIST`, or all: "+strings.Join(gpu.Targets(), ", "))
	sets := fs.StringArray("set", nil, "a setting `NAME.key=value` (repeatable), e.g. cuda-async.release_threshold=max, cuda-async.pool=default")
	cudart := fs.String("cudart", "", "`PATH` of the CUDA runtime library (default: the first of "+strings.Join(gpu.DefaultLibraries, ", ")+")")
	maxBytes := fs.String("max-bytes", "0", "device memory `SIZE` the replay may hold, never exceeded (0: free memory at the start minus --margin)")
	margin := fs.String("margin", "1GiB", "`SIZE` of memory left free when --max-bytes is 0")
	maxPinned := fs.String("max-pinned", "4GiB", "live pinned host memory `SIZE` the replay may hold")
	costModel := fs.String("cost-model", "", "cost model CSV `FILE` (from replay calibrate) for the simulation alongside (default: the embedded H200 model)")
	noSim := fs.Bool("no-sim", false, "do not simulate alongside")
	simOnly := fs.Bool("sim-only", false, "only simulate, with the cost model (no GPU needed)")
	callsOut := fs.String("calls", "", "write every runtime call as CSV (call,size,ptr,ns,pool_reserved; the last for cuda-async) to `FILE`; with several runs, -TRACE-TARGET goes before its extension")
	cLoop := fs.Bool("c-loop", false, "after each cuda replay, run the same cudaMalloc/cudaFree sequence in a plain C loop and report the harness's overhead per call")
	unbatched := fs.Bool("unbatched", false, "make the cuda target's calls from Go one event at a time, instead of in batches of consecutive mallocs and frees made back to back in C (same results, other timings)")
	pace := fs.Bool("pace", false, "keep the trace's idle times between allocation calls (0.1 to 50 ms; shorter ones are not kept, longer ones cut), as the driver's calls are slower after it has been idle; the simulation alongside then charges the cost model's wake-up curves, which it leaves out otherwise")
	sampleEvery := fs.Int("sample-every", 4096, "sample the driver's free memory (cudaMemGetInfo, untimed) every `N` events; a policy's replay also samples at every new high of the memory it holds, the cuda and cuda-async targets only every N events (1: their true minimum)")
	repeat := fs.Int("repeat", 1, "replay each trace and target `N` times and report the run of median allocator time (the call log and the simulation are the first run's)")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE`")
	csvOut := fs.String("csv", "", "write the results as CSV to `FILE`")
	plotDir := fs.String("plots", "", "write charts (PNG and SVG) into `DIR`")
	plotList := fs.String("plot-policy", "", plotPolicyDoc)
	table := fs.Bool("table", false, "print the table also when writing --json or --csv")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("gpu: no trace given")}
	}
	if err := checkOutputs(fs.Args(), "json", *jsonOut, "csv", *csvOut, "calls", *callsOut); err != nil {
		return err
	}
	if *repeat < 1 {
		return fmt.Errorf("--repeat %d: must be at least 1", *repeat)
	}
	if *pace && *cLoop {
		return fmt.Errorf("--pace with --c-loop: the C loop makes the calls back to back, so it cannot measure a paced harness's overhead")
	}
	var cfg gpu.Config
	var err error
	if cfg.MaxBytes, err = policies.ParseSize(*maxBytes); err != nil {
		return fmt.Errorf("--max-bytes: %v", err)
	}
	if cfg.Margin, err = policies.ParseSize(*margin); err != nil {
		return fmt.Errorf("--margin: %v", err)
	}
	if cfg.MaxPinned, err = policies.ParseSize(*maxPinned); err != nil {
		return fmt.Errorf("--max-pinned: %v", err)
	}
	names, err := policies.ParseList(*policyList, gpu.Targets())
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--policy: %w", err)}
	}
	settings, err := policies.ParseSets(*sets, gpu.Targets(), names)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--set %w", err)}
	}
	shown, err := plotPolicies(*plotList, *plotDir, names)
	if err != nil {
		return err
	}
	// The charts' directory and the call logs of each run (--calls with
	// several runs: one log per trace and target) are no input either.
	if err := atomicfile.CheckDir(fs.Args(), "plots", *plotDir, plots.FileSuffixes()); err != nil {
		return err
	}
	if runs := fs.NArg() * len(names); *callsOut != "" && runs > 1 {
		for _, path := range fs.Args() {
			for _, n := range names {
				if err := checkOutputs(fs.Args(), "calls", gpu.CallsPath(*callsOut, runs, path, n)); err != nil {
					return err
				}
			}
		}
	}
	for _, n := range names {
		if err := gpu.CheckSettings(n, settings[n]); err != nil {
			return cli.UsageError{Err: fmt.Errorf("--set: %w", err)}
		}
	}
	model := sim.DefaultCostModel()
	if *costModel != "" {
		if model, err = sim.LoadCostModel(*costModel); err != nil {
			return fmt.Errorf("--cost-model: %w", err)
		}
	}
	cfg.Pace = *pace
	opts := tracefile.Options{From: *from, Device: *device}
	if *simOnly {
		for _, f := range []string{"plots", "plot-policy", "calls", "repeat", "c-loop", "table", "unbatched", "cudart", "margin", "max-pinned", "no-sim", "sample-every"} {
			if fs.Changed(f) {
				return fmt.Errorf("--sim-only with --%s: a simulation alone writes the table, --json and --csv", f)
			}
		}
		return simulateOnly(stdout, stderr, fs.Args(), opts, cfg, names, settings, model, *jsonOut, *csvOut)
	}
	if !*noSim {
		cfg.Sim = model
	}
	cfg.Unbatched = *unbatched
	if *sampleEvery < 1 {
		return fmt.Errorf("--sample-every %d: must be at least 1", *sampleEvery)
	}
	cfg.SampleEvery = *sampleEvery

	rt, err := gpu.Open(*cudart)
	if err != nil {
		return err
	}
	defer rt.Close()
	ctx, stop, interrupted := interruptible()
	defer stop()

	var rs []*gpu.Result
	runs := len(fs.Args()) * len(names)
	logs := gpu.CallLogs{Base: *callsOut, Runs: runs}
	var logsDone []string // those of the runs finished, in order
	for _, path := range fs.Args() {
		for _, name := range names {
			c := cfg
			c.Trace, c.Policy, c.Settings = path, name, settings[name]
			log := logs.Next(path, name)
			res, err := gpu.RepeatFile(ctx, rt, path, opts, c, log, *repeat, *cLoop)
			if res != nil {
				rs = append(rs, res)
			}
			if err != nil {
				if ctx.Err() != nil {
					writeGPUTable(stdout, rs)
					// Each finished run's call log was put in place; the
					// other outputs come at the end.
					kept := "no output written"
					if len(logsDone) > 0 {
						kept = "kept the call logs of the finished runs: " + strings.Join(logsDone, ", ")
					}
					return interrupted(fmt.Sprintf("interrupted: everything allocated was freed (%s, %s: %v); %s", path, name, err, kept))
				}
				return fmt.Errorf("%s: %s: %w", path, name, err)
			}
			if log != "" {
				logsDone = append(logsDone, log)
			}
		}
	}
	// The outputs appear together or not at all (atomicfile.Outputs).
	outs := &atomicfile.Outputs{Stdout: stdout}
	defer outs.Abort()
	if err := outs.Add("json", *jsonOut, func(w io.Writer) error { return results.WriteGPU(w, rs) }); err != nil {
		return err
	}
	if err := outs.Add("csv", *csvOut, func(w io.Writer) error { return results.WriteGPUCSV(w, rs) }); err != nil {
		return err
	}
	if *plotDir != "" {
		flat := make([]sim.Result, len(rs))
		for i, r := range rs {
			flat[i] = r.Result
		}
		if err := plots.StageAll(&outs.Batch, *plotDir, flat, plots.Options{Policies: shown}); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
	}
	if *table || (*jsonOut == "" && *csvOut == "") {
		if err := outs.Add("", "-", func(w io.Writer) error {
			writeGPUTable(w, rs)
			flat := make([]*sim.Result, len(rs))
			for i, r := range rs {
				flat[i] = &r.Result
			}
			writeSettingsUsed(w, flat, settings)
			return nil
		}); err != nil {
			return err
		}
	}
	return outs.Commit()
}

// simulateOnly replays the traces on the simulated device alone, as the
// simulation alongside a replay on the GPU would (gpu.ShadowConfig, on a
// device of --max-bytes, unlimited by default as in replay sim), and
// writes the results.
func simulateOnly(stdout, stderr io.Writer, paths []string, opts tracefile.Options, cfg gpu.Config, names []string, settings map[string]policies.Settings, model *sim.CostModel, jsonOut, csvOut string) error {
	cfg.Sim = model
	rs, err := gpu.SimulateFiles(paths, opts, cfg, names, settings, func(n string) {
		fmt.Fprintf(stderr, "replay gpu --sim-only: %s has no simulated policy; left out\n", n)
	})
	if err != nil {
		return err
	}
	tables.Warnings(stderr, rs)
	outs := &atomicfile.Outputs{Stdout: stdout}
	defer outs.Abort()
	if err := outs.Add("json", jsonOut, func(w io.Writer) error { return results.WriteSim(w, rs) }); err != nil {
		return err
	}
	if err := outs.Add("csv", csvOut, func(w io.Writer) error { return results.WriteCSV(w, rs) }); err != nil {
		return err
	}
	if jsonOut == "" && csvOut == "" {
		if err := outs.Add("", "-", func(w io.Writer) error {
			writeSimOnlyTable(w, rs, cfg.Pace, model.Source)
			writeSettingsUsed(w, rs, settings)
			tables.Notes(w, rs)
			return nil
		}); err != nil {
			return err
		}
	}
	return outs.Commit()
}
