package replaycli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const checkUsage = `usage: replay check [--limit N] [--from FORMAT] [--device N] TRACE...

Validates each trace (double and unknown frees, mallocs of live addresses,
of 0 bytes or over 1 PiB, time going backwards, waits on events never
recorded, frees on a stream nothing orders after the malloc's) and lists
what is live at its end: leaks for a record run trace of a program that
exited (exit 1), live at the end for a snapshot taken while the job ran.

Flags:
`

// runCheck validates traces and lists the allocations live at their end.
// It returns an error, so that replay exits with 1, when a trace has a
// problem or a leak: an allocation live at the end of a trace that runs to
// the end of its job (trace.Header.JobEnded); in a snapshot taken while
// the job runs, what is live at the end is listed and is no fault.
func runCheck(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("check", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), checkUsage)
		fs.PrintDefaults()
	}
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	limit := fs.Int("limit", 20, "list at most `N` problems and N allocations live at the end per trace (0: all)")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("check: no trace given")}
	}
	var bad []string
	for _, path := range fs.Args() {
		problems, leaks, err := checkTrace(stdout, path, tracefile.Options{From: *from, Device: *device}, *limit)
		if err != nil {
			return err
		}
		switch {
		case leaks > 0:
			bad = append(bad, fmt.Sprintf("%s: %s, %s", path, count(problems, "problem"), count(leaks, "leak")))
		case problems > 0:
			bad = append(bad, fmt.Sprintf("%s: %s", path, count(problems, "problem")))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("check: %s", strings.Join(bad, "; "))
	}
	return nil
}

// count is "1 NOUN" or "N NOUNs" (plots.Plural).
func count[T int | int64](n T, noun string) string { return plots.Plural(int(n), noun) }

// checkTrace reads one trace, prints Validate's findings and the
// allocations live at its end, and returns the number of problems and of
// leaks (the allocations live at the end when the trace ran to the end of
// its job, else 0).
func checkTrace(w io.Writer, path string, opts tracefile.Options, limit int) (problems, leaks int, err error) {
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	shown := cli.Safe(path) // the name as printed
	if n := tables.TruncatedNote(f.Header()); n != "" {
		fmt.Fprintf(w, "%s: %s\n", shown, cli.Safe(n))
	}
	v := trace.NewValidator()
	s := trace.NewStats()
	err = readAll(f, path, func(i int64, ev trace.Event) {
		if verr := v.Check(i, ev); verr != nil {
			problems++
			if limit <= 0 || problems <= limit {
				fmt.Fprintf(w, "%s: %s\n", shown, cli.Safe(verr.Error()))
			}
		}
		s.Add(ev)
	})
	if err != nil {
		return 0, 0, err
	}
	if limit > 0 && problems > limit {
		fmt.Fprintf(w, "%s: ... %d more problems\n", shown, problems-limit)
	}
	live := s.Live()
	what, more := "live at the end", "more live at the end"
	if f.Header().JobEnded() {
		what, more = "leak", "more leaks"
	}
	for k, a := range live {
		if limit > 0 && k == limit {
			fmt.Fprintf(w, "%s: ... %d %s\n", shown, len(live)-limit, more)
			break
		}
		fmt.Fprintf(w, "%s: %s: %#x, %d bytes (%s) on stream %#x, malloc at event %d (t=%d ns, thread %d)", shown, what, a.Addr, a.Size, a.Kind, a.Stream, a.Event, a.Time, a.Thread)
		if a.Label != "" {
			fmt.Fprintf(w, ", call site %s", cli.Safe(a.Label))
		}
		fmt.Fprintln(w)
	}
	n, b := s.LiveBytes()
	switch {
	case problems == 0 && n == 0:
		fmt.Fprintf(w, "%s: ok: %d events, no problems, nothing live at the end\n", shown, s.Events)
	case f.Header().JobEnded():
		fmt.Fprintf(w, "%s: %d events, %s, %d allocations (%s) live at the end of the job: leaks\n", shown, s.Events, count(problems, "problem"), n, tables.HumanBytes(b))
		return problems, n, nil
	default:
		why := "the trace was taken while the job ran"
		if sig := f.Header().Metadata["signal"]; sig != "" && f.Header().Source == "record" {
			why = "a signal ended the program: " + sig
		}
		fmt.Fprintf(w, "%s: %d events, %s, %d allocations (%s) live at the end (%s)\n", shown, s.Events, count(problems, "problem"), n, tables.HumanBytes(b), cli.Safe(why))
	}
	return problems, 0, nil
}
