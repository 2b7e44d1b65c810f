package replaycli

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

const sliceUsage = `usage: replay slice [--from TIME] [--to TIME] | [--events A:B] [--device N] -o OUT.pickle[.gz] SNAPSHOT

Cuts a run of trace entries out of a PyTorch memory snapshot and writes it as
a snapshot of its own, which PyTorch's memory viewer opens (pytorch.org/memory_viz,
or python -m torch.cuda._memory_viz trace_plot): the entries in the range, with
their frames, and as its segments the allocator's state after the last of them,
from which the viewer draws what was live before the first.

A TIME is a time_us of the snapshot (an integer: microseconds since the Unix
epoch, as PyTorch records them) or a duration after the first entry's (1.5s,
200ms, 750us). The run goes from the first entry at or after --from up to, not
including, the first entry after it at or after --to. --events A:B keeps the
entries A to B-1 by index, as Python's snapshot['device_traces'][N][A:B] (A or
B left out: from the start, to the end; negative: from the end). The viewer's
Allocator State History numbers its events otherwise (it shows a free_requested
and the free_completed right after it as one free).

The output is written whole or not at all; OUT ending in .gz is gzip-compressed
(the viewer wants it decompressed). A free's frames are its block's malloc's, an
oom's device_free is 0, and a block's size is its request rounded as the
allocator does (docs/slice.md says what else a slice keeps and leaves out).

Flags:
`

func runSlice(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("slice", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), sliceUsage)
		fs.PrintDefaults()
	}
	from := fs.String("from", "", "keep the entries from `TIME` on (default: the first)")
	to := fs.String("to", "", "keep the entries before `TIME` (default: to the last)")
	events := fs.String("events", "", "keep the entries `A:B` by index instead, A to B-1")
	device := fs.Int("device", 0, "device `N` of the snapshot (its device_traces index)")
	out := fs.StringP("out", "o", "", "write the slice to `FILE` (required; .gz: gzip-compressed)")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cli.UsageError{Err: fmt.Errorf("slice: want one snapshot, got %d", fs.NArg())}
	}
	if *out == "" {
		return cli.UsageError{Err: fmt.Errorf("slice: no output file (-o OUT.pickle)")}
	}
	opts := pytorch.SliceOptions{Device: *device}
	var err error
	switch {
	case *events != "" && (*from != "" || *to != ""):
		return cli.UsageError{Err: fmt.Errorf("slice: --events and --from/--to select the entries two ways: give one")}
	case *events != "":
		if opts.From, opts.To, err = parseEvents(*events); err != nil {
			return cli.UsageError{Err: fmt.Errorf("--events %q: %w", *events, err)}
		}
	default:
		if opts.From, err = parseTimeBound(*from); err != nil {
			return cli.UsageError{Err: fmt.Errorf("--from %q: %w", *from, err)}
		}
		if opts.To, err = parseTimeBound(*to); err != nil {
			return cli.UsageError{Err: fmt.Errorf("--to %q: %w", *to, err)}
		}
		if opts.From.Unit == opts.To.Unit && opts.From.Unit != pytorch.BoundOpen && opts.From.N >= opts.To.N {
			return cli.UsageError{Err: fmt.Errorf("slice: --to %s is not after --from %s", *to, *from)}
		}
	}
	path := fs.Arg(0)
	if err := checkOutputs([]string{path}, "out", *out); err != nil {
		return err
	}
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	f, err := atomicfile.Create(*out)
	if err != nil {
		if !strings.Contains(err.Error(), *out) {
			err = fmt.Errorf("cannot write %s: %w", *out, err)
		}
		return err
	}
	defer f.Abort()
	var w io.Writer = f
	var zw *gzip.Writer
	if strings.HasSuffix(*out, ".gz") {
		zw = gzip.NewWriter(f)
		w = zw
	}
	res, err := pytorch.Slice(w, in, path, opts)
	if err != nil {
		return err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return err
		}
	}
	if err := f.Commit(); err != nil {
		return err
	}
	for _, warn := range res.Warnings {
		fmt.Fprintf(stderr, "%s: warning: %s\n", cli.Safe(path), cli.Safe(warn))
	}
	fmt.Fprintf(stdout, "wrote %s: entries %d to %d of %d (time_us %d to %d, %s), %d segments of %d bytes, %d bytes allocated at the end\n",
		*out, res.First, res.End-1, res.Entries, res.FirstUS, res.LastUS, time.Duration(res.LastUS-res.FirstUS)*time.Microsecond,
		res.Segments, res.Reserved, res.Allocated)
	return nil
}

// parseEvents parses A:B, either left out, into entry bounds.
func parseEvents(s string) (from, to pytorch.Bound, err error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return from, to, fmt.Errorf("want A:B (entry indexes; A:, :B)")
	}
	for _, p := range []struct {
		text  string
		bound *pytorch.Bound
	}{{a, &from}, {b, &to}} {
		if p.text == "" {
			continue
		}
		n, err := strconv.ParseInt(p.text, 10, 64)
		if err != nil {
			return from, to, fmt.Errorf("%q is not an entry index", p.text)
		}
		*p.bound = pytorch.Bound{Unit: pytorch.BoundEntry, N: n}
	}
	return from, to, nil
}

// parseTimeBound parses a time_us (an integer) or a duration after the
// first entry ("1.5s"); "" is no bound.
func parseTimeBound(s string) (pytorch.Bound, error) {
	if s == "" {
		return pytorch.Bound{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return pytorch.Bound{Unit: pytorch.BoundTime, N: n}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return pytorch.Bound{}, fmt.Errorf("want a time_us (an integer) or a duration after the first entry (1.5s, 200ms)")
	}
	if d < 0 {
		return pytorch.Bound{}, fmt.Errorf("a negative duration")
	}
	return pytorch.Bound{Unit: pytorch.BoundElapsed, N: d.Microseconds()}, nil
}
