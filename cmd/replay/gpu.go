package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace"
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
	fs.Usage = func() { fmt.Fprint(stderr, gpuUsage); fs.PrintDefaults() }
	policyList := fs.String("policy", gpu.TargetCUDA, "targets, comma-separated, or all: "+strings.Join(gpu.Targets(), ", "))
	sets := fs.StringArray("set", nil, "a setting NAME.key=value (repeatable), e.g. cuda-async.release_threshold=max, cuda-async.pool=default")
	cudart := fs.String("cudart", "", "`PATH` of the CUDA runtime library (default: the first of "+strings.Join(gpu.DefaultLibraries, ", ")+")")
	maxBytes := fs.String("max-bytes", "0", "device memory the replay may hold, never exceeded (0: free memory at the start minus --margin)")
	margin := fs.String("margin", "1GiB", "memory left free when --max-bytes is 0")
	maxPinned := fs.String("max-pinned", "4GiB", "live pinned host memory the replay may hold")
	costModel := fs.String("cost-model", "", "cost model CSV (from replay calibrate) for the simulation alongside (default: the embedded H200 model)")
	noSim := fs.Bool("no-sim", false, "do not simulate alongside")
	simOnly := fs.Bool("sim-only", false, "only simulate, with the cost model (no GPU needed)")
	callsOut := fs.String("calls", "", "write every runtime call as CSV (call,size,ptr,ns) to `FILE`; with several runs, -TRACE-TARGET goes before its extension")
	cLoop := fs.Bool("c-loop", false, "after each cuda replay, run the same cudaMalloc/cudaFree sequence in a plain C loop and report the harness's overhead per call")
	unbatched := fs.Bool("unbatched", false, "make the cuda target's calls from Go one event at a time, instead of in batches of consecutive mallocs and frees made back to back in C (same results, other timings)")
	pace := fs.Bool("pace", false, "keep the trace's idle times between allocation calls (0.1 to 50 ms; shorter ones are not kept, longer ones cut), as the driver's calls are slower after it has been idle; the simulation alongside then charges the cost model's wake-up curves, which it leaves out otherwise")
	repeat := fs.Int("repeat", 1, "replay each trace and target `N` times and report the run of median allocator time (the call log and the simulation are the first run's)")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE`")
	csvOut := fs.String("csv", "", "write the results as CSV to `FILE`")
	plotDir := fs.String("plots", "", "write charts (PNG and SVG) into `DIR`")
	table := fs.Bool("table", false, "print the table also when writing --json or --csv")
	from := fs.String("from", "auto", "format of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("gpu: no trace given")
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
	names, err := targetNames(*policyList)
	if err != nil {
		return err
	}
	settings, err := targetSets(*sets)
	if err != nil {
		return err
	}
	model := sim.DefaultCostModel()
	if *costModel != "" {
		if model, err = sim.LoadCostModel(*costModel); err != nil {
			return fmt.Errorf("--cost-model: %w", err)
		}
	}
	cfg.Pace = *pace
	if *simOnly {
		for _, f := range []string{"plots", "calls", "repeat", "c-loop", "table", "unbatched", "cudart", "max-bytes", "margin", "max-pinned", "no-sim"} {
			if fs.Changed(f) {
				return fmt.Errorf("--sim-only with --%s: a simulation alone writes the table, --json and --csv", f)
			}
		}
		return simulateOnly(stdout, stderr, fs.Args(), names, settings, model, *pace, tracefile.Options{From: *from, Device: *device}, *jsonOut, *csvOut)
	}
	if !*noSim {
		cfg.Sim = model
	}
	cfg.Unbatched = *unbatched

	rt, err := gpu.Open(*cudart)
	if err != nil {
		return err
	}
	defer rt.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var results []*gpu.Result
	runs := len(fs.Args()) * len(names)
	for _, path := range fs.Args() {
		for _, name := range names {
			c := cfg
			c.Trace, c.Policy, c.Settings = path, name, settings[name]
			res, err := replayOne(ctx, rt, c, path, tracefile.Options{From: *from, Device: *device}, callsPath(*callsOut, runs, path, name), *repeat, *cLoop)
			if res != nil {
				results = append(results, res)
			}
			if err != nil {
				if ctx.Err() != nil {
					writeGPUTable(stdout, results)
					return fmt.Errorf("interrupted: everything allocated was freed (%s, %s: %v)", path, name, err)
				}
				return fmt.Errorf("%s: %s: %w", path, name, err)
			}
		}
	}
	if *jsonOut != "" {
		if err := atomicfile.WriteFile(*jsonOut, func(w io.Writer) error { return writeGPUJSON(w, results) }); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	if *csvOut != "" {
		if err := atomicfile.WriteFile(*csvOut, func(w io.Writer) error { return writeGPUCSV(w, results) }); err != nil {
			return fmt.Errorf("--csv: %w", err)
		}
	}
	if *plotDir != "" {
		flat := make([]sim.Result, len(results))
		for i, r := range results {
			flat[i] = r.Result
		}
		if _, err := plots.WriteAll(*plotDir, flat); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
	}
	if *table || (*jsonOut == "" && *csvOut == "") {
		writeGPUTable(stdout, results)
		flat := make([]*sim.Result, len(results))
		for i, r := range results {
			flat[i] = &r.Result
		}
		writeSettingsUsed(stdout, flat, settings)
	}
	return nil
}

// replayOne replays the trace at path repeat times (see gpu.Repeat).
func replayOne(ctx context.Context, rt *gpu.Runtime, cfg gpu.Config, path string, opts tracefile.Options, calls string, repeat int, cLoop bool) (*gpu.Result, error) {
	var log *atomicfile.File
	if calls != "" {
		var err error
		if log, err = atomicfile.Create(calls); err != nil {
			return nil, fmt.Errorf("--calls: %w", err)
		}
		defer log.Abort() // no partial log after an error or Ctrl-C
		cfg.CallLog = log
	}
	open := func() (trace.Source, io.Closer, error) {
		f, err := tracefile.Open(path, opts)
		if err != nil {
			return nil, nil, err
		}
		return f, f, nil
	}
	res, err := gpu.Repeat(ctx, rt, open, cfg, repeat, cLoop)
	if err != nil {
		return res, err
	}
	if log != nil {
		if err := log.Commit(); err != nil {
			return nil, fmt.Errorf("--calls: %w", err)
		}
	}
	return res, nil
}

// simulateOnly replays the traces on the simulated device alone, charged to
// model, and prints the allocator time and latencies per policy.
func simulateOnly(stdout, stderr io.Writer, paths, names []string, settings map[string]policies.Settings, model *sim.CostModel, pace bool, opts tracefile.Options, jsonOut, csvOut string) error {
	if !pace {
		model = model.WithoutWake() // the calls come back to back, as gpu.Replay simulates them unpaced
	}
	known := func(n string) bool { _, ok := policies.Lookup(n); return ok }
	for _, n := range names {
		if !known(n) {
			fmt.Fprintf(stderr, "replay gpu --sim-only: %s has no simulated policy; left out\n", n)
		}
	}
	var results []*sim.Result
	for _, path := range paths {
		var cfgs []sim.Config
		for _, n := range names {
			if !known(n) {
				continue // a direct target without a simulated policy
			}
			s := settings[n]
			if n == gpu.TargetCUDA {
				s = nil
			}
			// As replay sim replays, and as gpu.Replay simulates alongside.
			cfgs = append(cfgs, sim.Config{Trace: path, Policy: n, Settings: s, AsRecorded: true, CostModel: model})
		}
		if len(cfgs) == 0 {
			return fmt.Errorf("--sim-only: none of %s is a simulated policy", strings.Join(names, ", "))
		}
		f, err := tracefile.Open(path, opts)
		if err != nil {
			return err
		}
		res, err := sim.Run(f, cfgs...)
		f.Close()
		if err != nil {
			if strings.HasPrefix(err.Error(), path+":") {
				return err // a read error, which names the file already
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		results = append(results, res...)
	}
	if jsonOut != "" || csvOut != "" {
		if jsonOut != "" {
			if err := atomicfile.WriteFile(jsonOut, func(w io.Writer) error { return writeJSON(w, results) }); err != nil {
				return err
			}
		}
		if csvOut != "" {
			return atomicfile.WriteFile(csvOut, func(w io.Writer) error { return writeCSV(w, results) })
		}
		return nil
	}
	if pace {
		fmt.Fprintf(stdout, "paced: the trace's idle times charged as wake-ups (cost model %s)\n", model.Source)
	} else {
		fmt.Fprintf(stdout, "unpaced: calls back to back, no wake-ups (cost model %s)\n", model.Source)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpolicy\treserved MiB\tdevice allocs\tdevice frees\tsim alloc ms\tof it wake-ups\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.3f\t%.3f\t\n", filepath.Base(r.Trace), r.Policy, mib(r.PeakReserved), r.DeviceAllocs, r.DeviceFrees, ms(r.SimAllocTimeNS), ms(r.SimWakeTimeNS))
	}
	tw.Flush()
	for _, r := range results {
		fmt.Fprintf(stdout, "\n%s, %s: simulated latency by call\n", filepath.Base(r.Trace), r.Policy)
		writeLatency(stdout, r.Latency)
	}
	return nil
}

// targetNames expands a --policy value for replay gpu.
func targetNames(list string) ([]string, error) {
	all := gpu.Targets()
	if list == "all" {
		return all, nil
	}
	var names []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		if !isTarget(n) {
			return nil, fmt.Errorf("--policy: unknown target %q (known: %s)", n, strings.Join(all, ", "))
		}
		seen[n] = true
		names = append(names, n)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("--policy: no target named")
	}
	return names, nil
}

func isTarget(n string) bool {
	for _, t := range gpu.Targets() {
		if t == n {
			return true
		}
	}
	return false
}

// targetSets turns NAME.key=value flags into settings per target.
func targetSets(sets []string) (map[string]policies.Settings, error) {
	out := map[string]policies.Settings{}
	for _, s := range sets {
		lhs, val, ok := strings.Cut(s, "=")
		name, key, ok2 := strings.Cut(lhs, ".")
		if !ok || !ok2 || name == "" || key == "" {
			return nil, fmt.Errorf("--set %q: want NAME.key=value", s)
		}
		if !isTarget(name) {
			return nil, fmt.Errorf("--set %q: unknown target %q", s, name)
		}
		if out[name] == nil {
			out[name] = policies.Settings{}
		}
		out[name][key] = val
	}
	return out, nil
}

// callsPath returns the call log's path for one run: base itself for a
// single run, else base with -TRACE-TARGET before its extension.
func callsPath(base string, runs int, trace, target string) string {
	if base == "" || runs == 1 {
		return base
	}
	t := filepath.Base(trace)
	for _, ext := range []string{".gz", ".pickle", ".trace", ".txt"} {
		t = strings.TrimSuffix(t, ext)
	}
	ext := filepath.Ext(base)
	return strings.TrimSuffix(base, ext) + "-" + t + "-" + target + ext
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func writeGPUJSON(w io.Writer, rs []*gpu.Result) error { return results.WriteGPU(w, rs) }

// gpuCSVColumns are the CSV columns of replay gpu: the scalar keys of
// replay sim and the measured ones.
var gpuCSVColumns = []string{
	"trace", "policy", "settings", "max_bytes", "events", "mallocs", "frees",
	"peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "sim_peak_reserved_bytes",
	"device_allocs", "device_frees", "alloc_retries", "ooms", "first_oom_event", "first_oom_size", "anomalies",
	"paced", "alloc_time_ns", "sim_alloc_time_ns", "sim_wake_time_ns", "sync_time_ns", "calls", "policy_time_ns", "replay_wall_ns",
	"driver_free_at_start_bytes", "driver_min_free_bytes", "driver_free_at_end_bytes", "pool_reserved_high_bytes", "pool_used_high_bytes",
	"c_loop_wall_ns", "c_loop_overhead_per_call_ns",
}

func writeGPUCSV(w io.Writer, results []*gpu.Result) error {
	cw := csv.NewWriter(w)
	cw.Write(gpuCSVColumns)
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, r := range results {
		loopWall, loopOver := "", ""
		if r.CLoop != nil {
			loopWall, loopOver = i(r.CLoop.WallNS), strconv.FormatFloat(r.CLoop.OverheadPerCallNS, 'f', 1, 64)
		}
		cw.Write([]string{
			r.Trace, r.Policy, formatSettings(r.Settings), u(r.MaxBytes), i(r.Events), i(r.Mallocs), i(r.Frees),
			u(r.PeakRequested), u(r.PeakAllocated), u(r.PeakReserved), u(r.SimPeakReserved),
			i(r.DeviceAllocs), i(r.DeviceFrees), i(r.AllocRetries), i(r.OOMs), i(r.FirstOOMEvent), u(r.FirstOOMSize), i(r.Anomalies),
			strconv.FormatBool(r.Paced), i(r.AllocTimeNS), i(r.SimAllocTimeNS), i(r.SimWakeTimeNS), i(r.SyncTimeNS), i(r.Calls), i(r.PolicyTimeNS), i(r.ReplayWallNS),
			u(r.Driver.FreeAtStart), u(r.Driver.MinFree), u(r.Driver.FreeAtEnd), u(r.Driver.PoolReservedHigh), u(r.Driver.PoolUsedHigh),
			loopWall, loopOver,
		})
	}
	cw.Flush()
	return cw.Error()
}

func writeGPUTable(w io.Writer, results []*gpu.Result) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintf(w, "%s on %s\n", results[0].Runtime, results[0].Device)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\ttarget\trequested MiB\treserved MiB\tsim reserved MiB\tdevice allocs\tdevice frees\tOOMs\talloc ms\tsim alloc ms\tof it wake-ups\tsim/measured\tsync ms\twall ms\t")
	for _, r := range results {
		simRes, simMS, wakeMS, ratio := "-", "-", "-", "-"
		if r.SimPolicy != "" {
			simRes, simMS = mib(r.SimPeakReserved), strconv.FormatFloat(ms(r.SimAllocTimeNS), 'f', 3, 64)
			wakeMS = strconv.FormatFloat(ms(r.SimWakeTimeNS), 'f', 3, 64)
			if r.AllocTimeNS > 0 {
				ratio = strconv.FormatFloat(float64(r.SimAllocTimeNS)/float64(r.AllocTimeNS), 'f', 3, 64)
			}
		}
		target := r.Policy
		if r.Paced {
			target += " (paced)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.3f\t%s\t%s\t%s\t%.3f\t%.1f\t\n",
			filepath.Base(r.Trace), target, mib(r.PeakRequested), mib(r.PeakReserved), simRes,
			r.DeviceAllocs, r.DeviceFrees, r.OOMs, ms(r.AllocTimeNS), simMS, wakeMS, ratio, ms(r.SyncTimeNS), ms(r.ReplayWallNS))
	}
	tw.Flush()
	for _, r := range results {
		fmt.Fprintf(w, "\n%s, %s: measured latency by call\n", filepath.Base(r.Trace), r.Policy)
		writeLatency(w, r.Latency)
		d := r.Driver
		fmt.Fprintf(w, "driver: cudaMemGetInfo free %s MiB at the start, %s MiB at least (%s MiB used), %s MiB at the end; limit %s MiB",
			mib(d.FreeAtStart), mib(d.MinFree), mib(d.FreeAtStart-min(d.FreeAtStart, d.MinFree)), mib(d.FreeAtEnd), mib(r.MaxBytes))
		if d.PoolReservedHigh > 0 || d.PoolUsedHigh > 0 {
			fmt.Fprintf(w, "; pool reserved high %s MiB, used high %s MiB", mib(d.PoolReservedHigh), mib(d.PoolUsedHigh))
		}
		fmt.Fprintln(w)
		if len(r.Runs) > 1 {
			fmt.Fprintf(w, "%d runs, allocator ms:", len(r.Runs))
			for _, run := range r.Runs {
				fmt.Fprintf(w, " %.3f", ms(run.AllocTimeNS))
			}
			fmt.Fprintln(w, " (the median run is shown)")
		}
		if c := r.CLoop; c != nil {
			fmt.Fprintf(w, "C loop of the same %d calls: %.3f ms plain (median; %.3f ms timing each call, %.3f ms in the calls); harness %.3f ms (median): %.0f ns per call over the plain loop (median of the runs, each against its own loop); outside the calls %.0f ns per call in the harness, %.0f in the timed loop\n",
				c.Calls, ms(c.WallNS), ms(c.TimedWallNS), ms(c.CallsNS), ms(c.HarnessWallNS), c.OverheadPerCallNS, c.OutsideCallsPerCallNS, c.LoopOutsideCallsPerCallNS)
		}
		if r.Interrupted {
			fmt.Fprintf(w, "interrupted after %d events\n", r.Events)
		}
		if r.Anomalies > 0 {
			fmt.Fprintf(w, "%d events could not be replayed as recorded; first: %s\n", r.Anomalies, r.FirstAnomaly)
		}
	}
}

func writeLatency(w io.Writer, rows []sim.LatencyRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "call\tsize\tcount\tmedian us\tp90 us\tp99 us\tmax us\ttotal ms\t")
	us := func(ns int64) string { return strconv.FormatFloat(float64(ns)/1e3, 'f', 2, 64) }
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t\n", r.Call, r.SizeClass, r.Count, us(r.MedianNS), us(r.P90NS), us(r.P99NS), us(r.MaxNS), ms(r.TotalNS))
	}
	tw.Flush()
}
