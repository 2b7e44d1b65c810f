package main

import (
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/cmd/internal/cli"
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
	capacity := fs.String("capacity", "0", "device capacity `SIZE`: bytes or a size like 4000MiB (the recording's memory cap; 0 = none)")
	policy := fs.String("policy", "pytorch", "the `POLICY` that simulates the recorded allocator")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: replay fidelity [--policy NAME] [--capacity SIZE] [--from FORMAT] [--device N] TRACE...

Replays each trace as recorded and compares the simulated device calls and
placements with the recorded ones, event by event (exit 1 if any differs).

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
	capBytes, err := policies.ParseSize(*capacity)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
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
			if hint := sim.CapacityWarning(rep.Result); hint != "" {
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
