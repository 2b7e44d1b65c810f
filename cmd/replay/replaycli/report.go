package replaycli

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

const reportUsage = `usage: replay report -o report.html [--plots DIR] [--title TEXT] INPUT...

Writes one self-contained HTML page (its data, script and styles inside it;
no network or other file needed to view it) from results of replay sim --json,
replay gpu --json, replay fit --json, replay diff --json or a sweep (its
directory or its results.json): a summary, an overview table of every policy
on every trace, and for each trace its figures, the comparison table with the
peaks as bars, memory and fragmentation over the trace and the latency
distribution (simulated, or measured for replay gpu results) as charts drawn
in the browser (the values under the cursor; drag to zoom into a time range,
double-click to zoom out), and the smallest capacities found by fit; each job
and each comparison of replay diff is a section of its own. A click on a
column's header sorts a table. --plots DIR also writes each chart as PNG and
SVG, for slides.

Flags:
`

func runReport(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("report", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), reportUsage)
		fs.PrintDefaults()
	}
	out := fs.StringP("out", "o", "", "write the page to `FILE` (required; - for stdout)")
	plotDir := fs.String("plots", "", "also write every chart as PNG and SVG into `DIR`")
	plotList := fs.String("plot-policy", "", "the policies the memory and fragmentation charts draw, a comma-separated `LIST` (default: the recorded allocator, the 3 lowest peaks reserved without OOM, cuda as the baseline)")
	title := fs.String("title", "", "the page's `TITLE`")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if *out == "" {
		return cli.UsageError{Err: fmt.Errorf("report: no output file (-o report.html)")}
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("report: no results given")}
	}
	if err := checkOutputs(fs.Args(), "out", *out); err != nil {
		return err
	}
	rep := &plots.Report{Title: *title, Inputs: fs.Args()}
	shown, err := plotPolicies(*plotList, "-", nil)
	if err != nil {
		return err
	}
	rep.Policies = shown
	for _, in := range fs.Args() {
		if err := readReportInput(rep, in); err != nil {
			return err
		}
	}
	if len(rep.Results) == 0 && len(rep.Fits) == 0 && len(rep.Diffs) == 0 && len(rep.Tunes) == 0 {
		return fmt.Errorf("report: the inputs hold no results")
	}
	for _, n := range shown {
		if !slices.ContainsFunc(rep.Results, func(r plots.ReportResult) bool { return r.Policy == n }) {
			return cli.UsageError{Err: fmt.Errorf("--plot-policy: no result of policy %q in the inputs", n)}
		}
	}
	// The charts' files are known before anything is written: none may
	// be an input.
	var charts []plots.ReportChart
	if *plotDir != "" {
		var err error
		if charts, err = rep.Charts(); err != nil {
			return err
		}
		if err := atomicfile.CheckOutput(*plotDir, fs.Args()); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
		for _, c := range charts {
			for _, format := range plots.Formats {
				if err := atomicfile.CheckOutput(filepath.Join(*plotDir, c.ID+"."+format), fs.Args()); err != nil {
					return fmt.Errorf("--plots: %w", err)
				}
			}
		}
	}
	// The page and the charts appear together or not at all.
	var batch atomicfile.Batch
	defer batch.Abort()
	var size int64
	say := stdout
	var page bytes.Buffer
	if *out == "-" {
		if err := plots.WriteReport(&page, rep); err != nil {
			return err
		}
		size, say = int64(page.Len()), stderr
	} else {
		if err := batch.WriteFile(*out, func(w io.Writer) error {
			c := &countingWriter{w: w}
			err := plots.WriteReport(c, rep)
			size = c.n
			return err
		}); err != nil {
			return fmt.Errorf("-o: %w", err)
		}
	}
	if *plotDir != "" {
		if err := plots.StageReportCharts(&batch, *plotDir, charts); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
	}
	if *out == "-" {
		if _, err := stdout.Write(page.Bytes()); err != nil {
			return fmt.Errorf("-o -: %w", err)
		}
	}
	if err := batch.Commit(); err != nil {
		return err
	}
	tuned := ""
	if len(rep.Tunes) > 0 {
		tuned = ", " + count(len(rep.Tunes), "tune candidate")
	}
	fmt.Fprintf(say, "report: %s, %s, %s%s: %s (%.1f MB)\n", count(len(rep.Results), "result"), count(len(rep.Fits), "fit answer"), count(len(rep.Diffs), "comparison"), tuned, *out, float64(size)/1e6)
	if *plotDir != "" {
		fmt.Fprintf(stdout, "report: %d chart files in %s\n", len(plots.Formats)*len(charts), *plotDir)
	}
	return nil
}

// countingWriter passes writes on to w and counts the bytes written.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// readReportInput adds the results in the file at path (or, for a
// directory, in its results.json) to rep, by their kind (results.Reader).
func readReportInput(rep *plots.Report, path string) error {
	r, err := results.Open(path)
	if err != nil {
		return err
	}
	defer r.Close()
	for r.Scan() {
		switch rec := r.Record(); rec.Kind {
		case results.KindFit:
			rep.Fits = append(rep.Fits, *rec.Fit)
		case results.KindDiff:
			rep.Diffs = append(rep.Diffs, *rec.Diff)
		case results.KindTune:
			rep.Tunes = append(rep.Tunes, *rec.Tune)
		case results.KindGPU:
			g := rec.GPU
			rep.Results = append(rep.Results, plots.ReportResult{Result: g.Result, Measured: true, Device: g.Device, MeasuredAllocTimeNS: g.AllocTimeNS, Paced: g.Paced})
		default:
			rep.Results = append(rep.Results, plots.ReportResult{Result: *rec.Sim})
		}
	}
	return r.Err()
}
