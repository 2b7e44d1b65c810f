package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/sweep"
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

// diffRow is one figure of a diff: A's, B's, B - A and B / A (none when A
// is 0).
type diffRow struct {
	Figure string   `json:"figure"`
	Unit   string   `json:"unit"`
	A      float64  `json:"a"`
	B      float64  `json:"b"`
	Delta  float64  `json:"delta"`
	Ratio  *float64 `json:"ratio,omitempty"`
}

// diffRows returns the figures of a and b compared.
func diffRows(a, b *sim.Result) []diffRow {
	figures := []struct {
		name, unit string
		of         func(*sim.Result) float64
	}{
		{"peak requested", "bytes", func(r *sim.Result) float64 { return float64(r.PeakRequested) }},
		{"peak allocated", "bytes", func(r *sim.Result) float64 { return float64(r.PeakAllocated) }},
		{"peak reserved", "bytes", func(r *sim.Result) float64 { return float64(r.PeakReserved) }},
		{"peak footprint", "bytes", func(r *sim.Result) float64 { return float64(r.PeakFootprint) }},
		{"fragmentation at peak", "fraction", func(r *sim.Result) float64 { return r.FragmentationAtPeak }},
		{"device allocs", "calls", func(r *sim.Result) float64 { return float64(r.DeviceAllocs) }},
		{"device frees", "calls", func(r *sim.Result) float64 { return float64(r.DeviceFrees) }},
		{"retries", "count", func(r *sim.Result) float64 { return float64(r.AllocRetries) }},
		{"OOMs", "count", func(r *sim.Result) float64 { return float64(r.OOMs) }},
		{"simulated alloc time", "ns", func(r *sim.Result) float64 { return float64(r.SimAllocTimeNS) }},
		{"mallocs", "count", func(r *sim.Result) float64 { return float64(r.Mallocs) }},
	}
	rows := make([]diffRow, len(figures))
	for k, f := range figures {
		x, y := f.of(a), f.of(b)
		rows[k] = diffRow{Figure: f.name, Unit: f.unit, A: x, B: y, Delta: y - x}
		if x != 0 {
			q := y / x
			rows[k].Ratio = &q
		}
	}
	return rows
}

func runDiff(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("diff", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, diffUsage)
		fs.PrintDefaults()
	}
	policyA := fs.String("policy", "pytorch", "the policy `NAME` of A (and of B without --policy-b)")
	policyB := fs.String("policy-b", "", "the policy `NAME` of B (default: --policy)")
	setsA := fs.StringArray("set", nil, "a policy setting `NAME.key=value` of both runs (repeatable)")
	setsB := fs.StringArray("set-b", nil, "a policy setting `NAME.key=value` of B only, over --set (repeatable)")
	capacity := fs.String("capacity", "0", "device capacity `SIZE` of both runs: bytes or a size like 24GiB (0 = unlimited; not given: the card a record run trace names, less its context)")
	jsonOut := fs.String("json", "", "write both results and the deltas as JSON to `FILE` (- for stdout)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return cli.UsageError{Err: err}
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
	if traceA == traceB && *policyA == *policyB && len(*setsB) == 0 {
		return cli.UsageError{Err: errors.New("diff: A and B are the same run: give a second trace, --policy-b or --set-b")}
	}
	if err := checkOutputs(fs.Args(), "json", *jsonOut); err != nil {
		return err
	}
	capBytes, err := policies.ParseSize(*capacity)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
	}
	names := []string{*policyA, *policyB}
	sa, err := parseSets(*setsA, names)
	if err != nil {
		return err
	}
	sb, err := parseSets(append(append([]string(nil), *setsA...), *setsB...), names)
	if err != nil {
		return err
	}
	opts := tracefile.Options{From: *from, Device: *device}
	run := func(path, policy string, s policies.Settings) (*sim.Result, error) {
		rs, err := sweep.RunFileParallel(path, opts, 1, sim.Config{Trace: path, Policy: policy, Settings: s, Capacity: capBytes, CardCapacity: !fs.Changed("capacity"), AsRecorded: true})
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
	writeWarnings(stderr, []*sim.Result{a, b})
	rows := diffRows(a, b)
	if *jsonOut != "" {
		doc := struct {
			Version int         `json:"version"`
			Kind    string      `json:"kind"`
			A       *sim.Result `json:"a"`
			B       *sim.Result `json:"b"`
			Figures []diffRow   `json:"figures"`
		}{Version: results.Version, Kind: "diff", A: a, B: b, Figures: rows}
		err := writeOutput(stdout, *jsonOut, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", " ")
			return enc.Encode(doc)
		})
		if err != nil {
			return fmt.Errorf("--json: %w", err)
		}
		if *jsonOut == "-" {
			return nil
		}
	}
	writeDiffTable(stdout, a, b, rows)
	return nil
}

// describe names a run: its trace, policy and settings.
func describe(r *sim.Result) string {
	s := fmt.Sprintf("%s under %s", r.Trace, r.Policy)
	if len(r.Settings) > 0 {
		s += " (" + policies.Settings(r.Settings).Join(", ") + ")"
	}
	if r.Capacity > 0 {
		s += fmt.Sprintf(", capacity %d bytes", r.Capacity)
	}
	return s
}

// writeDiffTable prints the runs and their figures side by side.
func writeDiffTable(w io.Writer, a, b *sim.Result, rows []diffRow) {
	fmt.Fprintf(w, "A: %s\nB: %s\n", describe(a), describe(b))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tA\tB\tB - A\tB / A\t")
	for _, r := range rows {
		var x, y, d string
		switch r.Unit {
		case "bytes":
			x, y = mib(uint64(r.A))+" MiB", mib(uint64(r.B))+" MiB"
			d = signedMiB(r.Delta)
		case "fraction":
			x, y, d = fmt.Sprintf("%.1f%%", 100*r.A), fmt.Sprintf("%.1f%%", 100*r.B), fmt.Sprintf("%+.1f pt", 100*r.Delta)
		case "ns":
			x, y, d = fmt.Sprintf("%.1f ms", r.A/1e6), fmt.Sprintf("%.1f ms", r.B/1e6), fmt.Sprintf("%+.1f ms", r.Delta/1e6)
		default:
			x, y, d = fmt.Sprintf("%.0f", r.A), fmt.Sprintf("%.0f", r.B), fmt.Sprintf("%+.0f", r.Delta)
		}
		ratio := "-"
		if r.Ratio != nil {
			ratio = fmt.Sprintf("%.3f", *r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", r.Figure, x, y, d, ratio)
	}
	tw.Flush()
}

// signedMiB is a byte delta in MiB with its sign.
func signedMiB(d float64) string {
	if d < 0 {
		return "-" + mib(uint64(-d)) + " MiB"
	}
	return "+" + mib(uint64(d)) + " MiB"
}
