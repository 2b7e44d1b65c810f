package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/trace/synth"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const synthUsage = `usage: record synth --workload NAME [--seed N] [--PARAM VALUE]... -o OUT
       record synth --list

Generates a synthetic trace of a workload (training, inference, a KV
cache, a service, RMM's random allocations) and writes it as a native
trace to OUT: the same seed and parameters give the same bytes. --list
describes each workload and its parameters with their defaults; a
parameter is a count (N), a size in bytes or with a unit (SIZE: 8MiB) or
a fraction (X).

Flags:
`

func runSynth(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("synth", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	workload := fs.String("workload", "", "the workload `NAME` to generate: "+strings.Join(synth.Names(), ", "))
	seed := fs.Uint64("seed", 1, "the random `SEED`")
	out := fs.StringP("output", "o", "", "write the native trace to `OUT`")
	list := fs.Bool("list", false, "list the workloads and their parameters")
	// Every workload parameter is a flag; defaults differ per workload.
	owners := map[string][]string{}
	kinds := map[string]string{} // the value's kind, from a default: N, SIZE or X
	for _, w := range synth.Workloads {
		for _, p := range w.Params {
			owners[p.Name] = append(owners[p.Name], w.Name)
			if _, ok := kinds[p.Name]; !ok {
				kinds[p.Name] = valueKind(p.Default)
			}
		}
	}
	names := make([]string, 0, len(owners))
	for n := range owners {
		names = append(names, n)
	}
	sort.Strings(names)
	vals := map[string]*string{}
	for _, n := range names {
		vals[n] = fs.String(n, "", "a parameter of "+strings.Join(owners[n], ", ")+" (see --list): `"+kinds[n]+"`")
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), synthUsage)
		fs.PrintDefaults()
	}
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if *list {
		listWorkloads(stdout)
		return nil
	}
	if *workload == "" {
		return cli.UsageError{Err: fmt.Errorf("synth: --workload is required (one of %s; --list describes them)", strings.Join(synth.Names(), ", "))}
	}
	if *out == "" {
		return cli.UsageError{Err: fmt.Errorf("synth: -o OUT is required")}
	}
	if fs.NArg() != 0 {
		return cli.UsageError{Err: fmt.Errorf("synth: unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]string{}
	for _, n := range names {
		if fs.Changed(n) {
			set[n] = *vals[n]
		}
	}
	src, err := synth.New(*workload, *seed, set)
	if err != nil {
		// An unknown workload or a parameter it refuses: the arguments'.
		return cli.UsageError{Err: fmt.Errorf("synth: %w", err)}
	}
	n, err := tracefile.WriteSource(*out, src)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	fmt.Fprintf(stdout, "%s: %d events (synth %s, seed %d)\n", *out, n, *workload, *seed)
	return nil
}

func listWorkloads(w io.Writer) {
	for i, wl := range synth.Workloads {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n", wrap(wl.Name+": "+wl.Doc, 100))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, p := range wl.Params {
			fmt.Fprintf(tw, "  --%s\t%s\t%s\n", p.Name, p.Default, p.Usage)
		}
		tw.Flush()
	}
}

// wrap breaks s into lines of at most width bytes at spaces; lines after
// the first are indented by two spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	line := 0
	for i, word := range strings.Fields(s) {
		if i > 0 && line+1+len(word) > width {
			b.WriteString("\n  ")
			line = 2
		} else if i > 0 {
			b.WriteByte(' ')
			line++
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}

// valueKind names the kind of a parameter's value from its default: N for
// a whole number, SIZE for bytes with a unit (64MiB), X for a fraction.
func valueKind(def string) string {
	if _, err := strconv.ParseInt(def, 10, 64); err == nil {
		return "N"
	}
	if _, err := strconv.ParseFloat(def, 64); err == nil {
		return "X"
	}
	return "SIZE"
}
