package replaycli

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const statsUsage = `usage: replay stats [--json] [--top N] [--from FORMAT] [--device N] TRACE...

Summarizes each trace: events by op, mallocs by kind, sizes (bytes, by power
of two), lifetimes (events and ns), peak live bytes, streams and threads,
and for a record run trace its card and calls by function. A note says what
the source does not record (a CuPy log: streams, times and device frees).

Flags:
`

func runStats(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("stats", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), statsUsage)
		fs.PrintDefaults()
	}
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	jsonOut := fs.Bool("json", false, "print JSON instead of tables")
	top := fs.Int("top", 10, "list at most `N` streams and threads")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("stats: no trace given")}
	}
	var docs []trace.Summary
	for i, path := range fs.Args() {
		f, err := tracefile.Open(path, tracefile.Options{From: *from, Device: *device})
		if err != nil {
			return err
		}
		s := trace.NewStats()
		err = readAll(f, path, func(_ int64, ev trace.Event) { s.Add(ev) })
		h := f.Header()
		f.Close()
		if err != nil {
			return err
		}
		if *jsonOut {
			docs = append(docs, s.Summary(path, h))
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		tables.Stats(stdout, path, h, s, *top)
	}
	if *jsonOut {
		return results.WriteJSON(stdout, struct {
			Traces []trace.Summary `json:"traces"`
		}{docs})
	}
	return nil
}

// readAll calls fn with each event of src and its index.
func readAll(src trace.Source, path string, fn func(i int64, ev trace.Event)) error {
	for i := int64(0); ; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return tracefile.NameError(path, err)
		}
		fn(i, ev)
	}
}
