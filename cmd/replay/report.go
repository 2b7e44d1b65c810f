package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

const reportUsage = `usage: replay report -o report.html [--plots DIR] [--title TEXT] INPUT...

Writes one self-contained HTML page (the charts inside it as images; no
network or other file needed to view it) from results of replay sim --json,
replay gpu --json, replay fit --json or a sweep (its directory or its
results.json): a summary, an overview of every policy on every trace, and
for each trace its figures, the comparison table, memory and fragmentation
over the trace, peaks against the lower bound, device calls, the latency
distribution (simulated, or measured for replay gpu results) and the
smallest capacities found by fit. --plots DIR also writes each chart as PNG
and SVG, for slides.

Flags:
`

func runReport(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("report", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, reportUsage)
		fs.PrintDefaults()
	}
	out := fs.StringP("out", "o", "", "write the page to `FILE` (required)")
	plotDir := fs.String("plots", "", "also write every chart as PNG and SVG into `DIR`")
	title := fs.String("title", "", "the page's title")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *out == "" {
		return fmt.Errorf("report: no output file (-o report.html)")
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("report: no results given")
	}
	rep := &plots.Report{Title: *title, Inputs: fs.Args()}
	for _, in := range fs.Args() {
		if err := readReportInput(rep, in); err != nil {
			return err
		}
	}
	if len(rep.Results) == 0 && len(rep.Fits) == 0 {
		return fmt.Errorf("report: the inputs hold no results")
	}
	charts, err := rep.Charts()
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(*out, func(w io.Writer) error { return plots.WriteReport(w, rep, charts) }); err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	var size int64
	if st, err := os.Stat(*out); err == nil {
		size = st.Size()
	}
	fmt.Fprintf(stdout, "report: %d results, %d fit answers, %d charts: %s (%.1f MB)\n", len(rep.Results), len(rep.Fits), len(charts), *out, float64(size)/1e6)
	if *plotDir != "" {
		written, err := plots.WriteReportCharts(*plotDir, charts)
		if err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
		fmt.Fprintf(stdout, "report: %d chart files in %s\n", len(written), *plotDir)
	}
	return nil
}

// gpuFields are the keys of a replay gpu result that tell it apart.
type gpuFields struct {
	Runtime     string `json:"runtime"`
	Device      string `json:"device"`
	AllocTimeNS int64  `json:"alloc_time_ns"`
	Paced       bool   `json:"paced"`
}

// readReportInput adds the results in the file at path (or, for a
// directory, in its results.json) to rep: fit answers by their
// min_capacity_bytes key, replay gpu results by their runtime key, replay
// sim and sweep results otherwise.
func readReportInput(rep *plots.Report, path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "results.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if doc.Results == nil {
		return fmt.Errorf(`%s: no "results" list: not the JSON of replay sim, gpu, fit or sweep`, path)
	}
	for i, raw := range doc.Results {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return fmt.Errorf("%s: result %d: %w", path, i, err)
		}
		if _, ok := keys["min_capacity_bytes"]; ok {
			var f fitResult
			if err := json.Unmarshal(raw, &f); err != nil {
				return fmt.Errorf("%s: result %d: %w", path, i, err)
			}
			rf := plots.ReportFit{Trace: f.Trace, FitRow: plots.FitRow{
				Policy: f.Policy, Settings: f.Settings, Fits: f.Fits, MinCapacity: f.MinCapacity,
				LowerBound: f.LowerBound, UnlimitedPeakReserved: f.UnlimitedPeakReserved, Monotone: f.Monotone,
			}}
			for _, p := range f.NonMonotone {
				rf.NonMonotone = append(rf.NonMonotone, p.Capacity)
			}
			for _, c := range f.Cards {
				rf.Cards = append(rf.Cards, plots.ReportCard{Card: plots.Card{Name: c.Name, Capacity: c.Capacity}, Fits: c.Fits})
			}
			rep.Fits = append(rep.Fits, rf)
			continue
		}
		var r sim.Result
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s: result %d: %w", path, i, err)
		}
		if r.Trace == "" || r.Policy == "" {
			return fmt.Errorf("%s: result %d: no trace or policy: not a result of replay sim, gpu, fit or sweep", path, i)
		}
		rr := plots.ReportResult{Result: r}
		if _, ok := keys["runtime"]; ok {
			var g gpuFields
			if err := json.Unmarshal(raw, &g); err != nil {
				return fmt.Errorf("%s: result %d: %w", path, i, err)
			}
			rr.Measured, rr.Device, rr.MeasuredAllocTimeNS, rr.Paced = true, g.Device, g.AllocTimeNS, g.Paced
		}
		rep.Results = append(rep.Results, rr)
	}
	return nil
}
