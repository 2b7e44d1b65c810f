package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
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
	capacity := fs.String("capacity", "0", "device capacity: bytes or a size like 4000MiB (the recording's memory cap; 0 = none)")
	policy := fs.String("policy", "pytorch", "the policy that simulates the recorded allocator")
	from := fs.String("from", "auto", "format of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: replay fidelity [--capacity SIZE] TRACE...")
		fmt.Fprintln(stderr, "Replays each trace as recorded and compares the simulated device calls and placements with the recorded ones, event by event.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("fidelity: no trace given")
	}
	capBytes, err := policies.ParseSize(*capacity)
	if err != nil {
		return fmt.Errorf("--capacity: %v", err)
	}
	diverged := 0
	for _, path := range fs.Args() {
		f, err := tracefile.Open(path, tracefile.Options{From: *from, Device: *device})
		if err != nil {
			return err
		}
		rep, err := sim.Fidelity(f, sim.Config{Trace: path, Policy: *policy, Capacity: capBytes})
		f.Close()
		if err != nil {
			return tracefile.NameError(path, err)
		}
		name := filepath.Base(path)
		if d := rep.Divergence; d != nil {
			diverged++
			fmt.Fprintf(stdout, "%s: diverges at %v\n", name, d)
			if hint := capacityHint(rep.Result); hint != "" {
				fmt.Fprintf(stdout, "%s: %s\n", name, hint)
			}
			continue
		}
		fmt.Fprintf(stdout, "%s: identical (%d device calls, %d mallocs; settings %s)\n",
			name, rep.Calls, rep.Mallocs, settingsText(rep.Result.Settings))
	}
	if diverged > 0 {
		return fmt.Errorf("fidelity: %d of %d traces diverge from their recording", diverged, fs.NArg())
	}
	return nil
}

// settingsText writes settings as key=value pairs, sorted, or "default".
func settingsText(s map[string]string) string {
	if len(s) == 0 {
		return "default"
	}
	return policies.Settings(s).Join(" ")
}

// capacityHint returns advice for a replay without a capacity of a
// recording whose mallocs failed: the job ran under a memory cap, which
// a snapshot does not record, and replays as recorded only under it.
func capacityHint(r *sim.Result) string {
	if r == nil || r.Capacity != 0 || r.SourceOOMs == 0 {
		return ""
	}
	var remedy string
	switch r.TraceSource {
	case "pytorch":
		remedy = "the job probably ran under a memory cap, which a snapshot does not record: replay with --capacity set to that cap (torch.cuda.set_per_process_memory_fraction times the device memory)"
	case "rmm":
		remedy = "the pool probably had a maximum size, which the log does not record: replay with --capacity set to it (maximum_pool_size of the pool_memory_resource), or to the card's memory"
	case "record":
		remedy = "the trace does not name its card (a record run before the card was written): replay with --capacity set to the card's memory less its context (the H200's context is 552402944 bytes)"
	default:
		remedy = "replay with --capacity set to the memory the job had"
	}
	return fmt.Sprintf("the recording has %d failed malloc(s), which this replay without a capacity served: the peaks (requested, allocated and reserved alike) count them as if the card had given them; %s", r.SourceOOMs, remedy)
}
