package main

import (
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// runFidelity is `replay fidelity`: each trace replayed as recorded (the
// settings it records, the addresses it records) against the policy that
// simulates its allocator, compared with the recording event by event
// (sim.Fidelity). It prints "identical" or the first divergence per trace,
// and returns an error when any trace diverges.
func runFidelity(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("fidelity", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	capacity := fs.String("capacity", "", "device capacity `SIZE`: bytes or a size like 4000MiB (the recording's memory cap; 0 = none; default: the mem_cap_bytes (a CuPy log's limit_bytes) of the measured figures beside the trace, else none)")
	policy := fs.String("policy", "", "the `POLICY` that simulates the recorded allocator (default: the one of the trace's source: pytorch for PyTorch snapshots and torch.profiler traces, cupy for CuPy logs, bfc for XSpaces)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	sets := fs.StringArray("set", nil, "a setting `NAME.key=value` over the recorded ones (repeatable): what the trace does not record, such as a torch.profiler trace's pytorch.expandable_segments=True")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: replay fidelity [--policy NAME] [--capacity SIZE] [--set NAME.key=value] [--from FORMAT] [--device N] TRACE...

Replays each trace as recorded and compares the simulated device calls and
placements with the recorded ones, event by event, and, where the real
allocator's figures lie beside the trace (NAME.stats.json for NAME.pickle.gz
or NAME.pt.trace.json.gz: max_memory_reserved, max_memory_allocated,
memory_stats, mem_cap_bytes; for a CuPy log NAME.jsonl: peak_total_bytes,
device_allocs, limit_bytes, ooms_caught), the peaks and counters with them:
peak reserved and allocated bytes, device allocations and frees, retries and
OOMs (exit 1 if anything differs). For an XSpace the figures are JAX's
memory_stats() in NAME.json beside NAME.xplane.pb.gz, else those its BFC
events record: peak allocated bytes and mallocs; bfc then runs with the
memory limit and the preallocation memory_stats() implies (bytes_limit;
allow_growth=false where the pool peaked at the whole limit), --set over
them.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return cli.UsageError{Err: err}
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("fidelity: no trace given")}
	}
	setNames := []string{*policy}
	if *policy == "" {
		setNames = policies.Names() // the policy is chosen per trace
	}
	settings, err := parseSets(*sets, setNames)
	if err != nil {
		return err
	}
	var capBytes uint64
	if *capacity != "" {
		c, err := policies.ParseSize(*capacity)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
		}
		capBytes = c
	}
	diverged := 0
	for _, path := range fs.Args() {
		var measured *sim.Measured
		mpath := measuredPath(path)
		if _, err := os.Stat(mpath); err == nil {
			if measured, err = sim.ReadMeasured(mpath); err != nil {
				return err
			}
		}
		capBytes := capBytes
		if *capacity == "" && measured != nil {
			capBytes = measured.Cap
		}
		f, err := tracefile.Open(path, tracefile.Options{From: *from, Device: *device})
		if err != nil {
			return err
		}
		figures, against := filepath.Base(mpath), "peaks and counters as measured in "+filepath.Base(mpath)
		noCalls := f.Header().Unrecorded(trace.UnrecordedSegments) // placements not compared
		if measured == nil {
			// The real allocator's own figures, where the trace records them.
			if measured = sim.RecordedMeasured(f.Header()); measured != nil {
				figures, against = "as the trace records them", "peak allocated bytes and mallocs as the trace records them"
			}
		}
		pol := *policy
		if pol == "" {
			pol, _ = policies.SourcePolicy(f.Header().Source)
		}
		run := settings[pol]
		if measured != nil {
			// The settings the measured figures imply (XLA's BFC), the
			// user's over them.
			if rs := measured.RecordedSettings(pol); rs != nil {
				if _, frac := run["memory_fraction"]; frac {
					delete(rs, "memory_limit") // the user's fraction replaces it
				}
				maps.Copy(rs, run)
				run = rs
			}
		}
		rep, err := sim.Fidelity(f, sim.Config{Trace: path, Policy: pol, Settings: run, Capacity: capBytes})
		f.Close()
		if err != nil {
			return tracefile.NameError(path, err)
		}
		name := filepath.Base(path)
		// What the recording does not show, inferred or not, whatever
		// the verdict: a figure that agrees may rest on it.
		if r := rep.Result; r.Inferred > 0 {
			fmt.Fprintf(stdout, "%s: warning: %d calls the recording does not show were inferred from it; first: %s\n", name, r.Inferred, r.FirstInferred)
		}
		if w := rep.Result.PoolWarning; w != "" {
			fmt.Fprintf(stdout, "%s: warning: %s\n", name, w)
		}
		if d := rep.Divergence; d != nil {
			diverged++
			fmt.Fprintf(stdout, "%s: diverges at %v (policy %s)\n", name, d, pol)
			if hint := sim.CapacityWarning(rep.Result); hint != "" {
				fmt.Fprintf(stdout, "%s: %s\n", name, hint)
			}
			continue
		}
		if measured != nil {
			if diffs := sim.CompareMeasured(rep, measured); len(diffs) > 0 {
				diverged++
				same := "same device calls and placements, but "
				if noCalls {
					same = ""
				}
				fmt.Fprintf(stdout, "%s: %sfigures differ from the real allocator's (%s; policy %s):\n", name, same, figures, pol)
				for _, d := range diffs {
					fmt.Fprintf(stdout, "%s:   %s\n", name, d)
				}
				continue
			}
		}
		if a := rep.Result.Anomalies; a > 0 {
			// The real allocator replays its own recording whole: events
			// that cannot be replayed are a damaged or foreign recording.
			diverged++
			fmt.Fprintf(stdout, "%s: %d event(s) could not be replayed as recorded (first: %s): not a whole recording of the allocator (policy %s)\n", name, a, rep.Result.FirstAnomaly, pol)
			continue
		}
		if measured == nil {
			against = "no measured figures beside it"
		}
		if noCalls {
			fmt.Fprintf(stdout, "%s: figures agree (%d mallocs, no device call recorded; %s; policy %s, settings %s)\n",
				name, rep.Mallocs, against, pol, settingsText(rep.Result.Settings))
			continue
		}
		fmt.Fprintf(stdout, "%s: identical (%d device calls, %d mallocs; %s; policy %s, settings %s)\n",
			name, rep.Calls, rep.Mallocs, against, pol, settingsText(rep.Result.Settings))
	}
	if diverged > 0 {
		return fmt.Errorf("fidelity: %d of %d traces diverge from their recording", diverged, fs.NArg())
	}
	return nil
}

// measuredPath returns where the real allocator's figures for the trace at
// path lie: NAME.stats.json beside NAME.pickle.gz (or NAME.pickle,
// NAME.pt.trace.json.gz, NAME.json.gz, NAME.json, or any other file
// NAME.EXT).
//
// An XSpace's lie in NAME.json beside NAME.xplane.pb(.gz), as
// testdata/jax/record.py writes JAX's memory_stats().
func measuredPath(path string) string {
	if base, ok := strings.CutSuffix(strings.TrimSuffix(path, ".gz"), ".xplane.pb"); ok {
		return base + ".json"
	}
	base := path
	for _, ext := range []string{".gz", ".json", ".pickle", ".trace", ".pt"} {
		base = strings.TrimSuffix(base, ext)
	}
	if base == path {
		base = strings.TrimSuffix(path, filepath.Ext(path))
	}
	return base + ".stats.json"
}

// settingsText writes settings as key=value pairs, sorted, or "default".
func settingsText(s map[string]string) string {
	if len(s) == 0 {
		return "default"
	}
	return policies.Settings(s).Join(" ")
}
