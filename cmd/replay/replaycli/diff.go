package replaycli

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const diffUsage = `usage: replay diff [--policy NAME] [--set NAME.key=value]... [--policy-b NAME] [--set-b NAME.key=value]...
                   [--capacity SIZE] [--json FILE] TRACE_A [TRACE_B]

Replays two runs and prints their figures side by side with the deltas (B - A)
and ratios (B / A): peak requested, allocated and reserved bytes, the device
footprint, fragmentation at the peak, device calls, retries, OOMs and the
simulated allocator time. A is TRACE_A under --policy with --set; B is TRACE_B
(TRACE_A when not given) under --policy-b (--policy when not given) with --set
and then --set-b over them: two recordings of one job under two settings, or
one trace under two policies or two settings. A recording is replayed as
recorded, as by replay sim. Warnings go to stderr and into the JSON.

Flags:
`

func runDiff(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("diff", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), diffUsage)
		fs.PrintDefaults()
	}
	policyA := fs.String("policy", "pytorch", "the policy `NAME` of A (and of B without --policy-b)")
	policyB := fs.String("policy-b", "", "the policy `NAME` of B (default: --policy)")
	setsA := fs.StringArray("set", nil, "a policy setting `NAME.key=value` of both runs (repeatable)")
	setsB := fs.StringArray("set-b", nil, "a policy setting `NAME.key=value` of B only, over --set (repeatable)")
	capacity := fs.String("capacity", "0", "device capacity `SIZE` of both runs: bytes or a size like 24GiB (0 = unlimited; not given: the card a record run trace names, less its context)")
	jsonOut := fs.String("json", "", "write both results and the deltas as JSON to `FILE` (- for stdout)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return cli.UsageError{Err: fmt.Errorf("diff: %d traces given, want 1 or 2", fs.NArg())}
	}
	traceA, traceB := fs.Arg(0), fs.Arg(0)
	if fs.NArg() == 2 {
		traceB = fs.Arg(1)
	}
	if *policyB == "" {
		*policyB = *policyA
	}
	for _, p := range []string{*policyA, *policyB} {
		if _, ok := policies.Lookup(p); !ok {
			return cli.UsageError{Err: fmt.Errorf("diff: unknown policy %q (replay policies lists them)", p)}
		}
	}
	capBytes, err := policies.ParseCapacity(*capacity)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
	}
	sa, err := parseSets(*setsA, []string{*policyA, *policyB})
	if err != nil {
		return err
	}
	// --set-b names B's policy only.
	if _, err := policies.ParseSets(*setsB, policies.Names(), []string{*policyB}); err != nil {
		return cli.UsageError{Err: fmt.Errorf("--set-b %w (B's policy: --policy-b, else --policy)", err)}
	}
	sb, err := parseSets(append(append([]string(nil), *setsA...), *setsB...), []string{*policyA, *policyB})
	if err != nil {
		return err
	}
	for _, path := range fs.Args() {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("diff: %v", err)
		}
	}
	if traceA == traceB && *policyA == *policyB && maps.Equal(sa[*policyA], sb[*policyB]) {
		return cli.UsageError{Err: errors.New("diff: A and B are the same run: give a second trace, --policy-b or a --set-b that changes a setting")}
	}
	if err := checkOutputs(fs.Args(), "json", *jsonOut); err != nil {
		return err
	}
	opts := tracefile.Options{From: *from, Device: *device}
	run := func(path, policy string, s policies.Settings) (*sim.Result, error) {
		rs, err := sweep.RunFile(path, opts, sim.Config{Trace: path, Policy: policy, Settings: s, Capacity: capBytes, CardCapacity: !fs.Changed("capacity"), AsRecorded: true})
		if err != nil {
			return nil, err
		}
		return rs[0], nil
	}
	a, err := run(traceA, *policyA, sa[*policyA])
	if err != nil {
		return err
	}
	b, err := run(traceB, *policyB, sb[*policyB])
	if err != nil {
		return err
	}
	tables.Warnings(stderr, []*sim.Result{a, b})
	d := results.NewDiff(a, b)
	// The JSON and the table appear together (atomicfile.Outputs).
	outs := &atomicfile.Outputs{Stdout: stdout}
	defer outs.Abort()
	if err := outs.Add("json", *jsonOut, func(w io.Writer) error { return results.WriteDiff(w, []*results.Diff{d}) }); err != nil {
		return err
	}
	if *jsonOut != "-" {
		if err := outs.Add("", "-", func(w io.Writer) error { writeDiffTable(w, d); return nil }); err != nil {
			return err
		}
	}
	return outs.Commit()
}

// writeDiffTable prints the runs and their figures side by side.
func writeDiffTable(w io.Writer, d *results.Diff) {
	fmt.Fprintf(w, "A: %s\nB: %s\n", cli.Safe(plots.RunName(&d.A)), cli.Safe(plots.RunName(&d.B)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tA\tB\tB - A\tB / A\t")
	for _, f := range d.Figures {
		c := plots.DiffCells(f)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", f.Figure, c[0], c[1], c[2], c[3])
	}
	tw.Flush()
}
