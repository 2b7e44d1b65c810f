// Command record records allocation traces or imports them from other
// formats into the native trace format.
//
//	record import [--from FORMAT] [--device N] -o OUT|- INPUT
//	record run [-o OUT] [--cudart PATH] -- PROGRAM [ARGS...]
//	record synth --workload NAME [--seed N] [--PARAM VALUE]... -o OUT
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

func main() {
	// record run leaves Ctrl-C to the program it records.
	if len(os.Args) > 1 && os.Args[1] != "run" {
		atomicfile.RemoveOnInterrupt()
	}
	if err := run(os.Stdout, os.Stderr, os.Args[1:]); err != nil {
		// record run passes the program's exit status through; a usage
		// error exits 2.
		cli.Exit("record", err)
	}
}

const usage = `usage: record COMMAND [flags] ARGS...

Commands:
  import   convert a trace (PyTorch snapshot, torch.profiler trace, CuPy log, JAX XSpace, RMM log,
           MiniMalloc CSV, text form) to the native format
           record import [--from FORMAT] [--device N] -o OUT|- INPUT
  run      run a program and record its CUDA allocation calls
           record run [-o OUT] [--cudart PATH] -- PROGRAM [ARGS...]
  synth    generate a synthetic workload (record synth --list describes them)
           record synth --workload NAME [--seed N] [--PARAM VALUE]... -o OUT

'record help COMMAND' shows a command's flags; 'record --version' the version.
A usage error exits 2, any other error 1.
`

func run(stdout, stderr io.Writer, args []string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
	}()
	// What a command writes to stdout (its summary line, a trace given as
	// "-") is its output: a write that fails (a full disk, a closed pipe)
	// fails the command.
	out := &cli.CheckedWriter{W: stdout}
	defer func() { err = out.StdoutError(err) }()
	return dispatch(out, stderr, args)
}

// dispatch runs the command args name.
func dispatch(stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.UsageError{Err: fmt.Errorf("no command given")}
	}
	switch args[0] {
	case "--version", "version":
		fmt.Fprintln(stdout, cli.Version("record"))
		return nil
	case "import":
		return runImport(stdout, stderr, args[1:])
	case "run":
		return runRun(stdout, stderr, args[1:])
	case "synth":
		return runSynth(stdout, stderr, args[1:])
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			// help CMD is CMD --help.
			return run(stdout, stderr, []string{args[1], "--help"})
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return cli.UsageError{Err: cli.UnknownError("command", args[0], []string{"import", "run", "synth", "help", "version"})}
}

const importUsage = `usage: record import [--from FORMAT] [--device N] -o OUT|- INPUT

Converts a trace (a PyTorch snapshot, plain or gzipped; a torch.profiler
Chrome trace; a CuPy DebugPrintHook log; a JAX profiler XSpace; an RMM log;
a MiniMalloc CSV; the text form; a native trace) to the native format,
written atomically to OUT, or to stdout with -o -. OUT may not be the input.

Flags:
`

func runImport(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("import", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), importUsage)
		fs.PrintDefaults()
	}
	from := fs.String("from", "auto", "input `FORMAT`: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	out := fs.StringP("output", "o", "", "write the native trace to `OUT` (- for stdout)")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("import: -o OUT is required")
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("import: want exactly one INPUT, got %d", fs.NArg())
	}
	in := fs.Arg(0)
	opts := tracefile.Options{From: *from, Device: *device}
	if *out == "-" {
		// The native trace to stdout; the report to stderr.
		src, err := tracefile.Open(in, opts)
		if err != nil {
			return err
		}
		defer src.Close()
		n, err := tracefile.WriteNative(stdout, src)
		if err != nil {
			return fmt.Errorf("import: writing to stdout: %w", err)
		}
		fmt.Fprintf(stderr, "record: %d events from %s (%s) to stdout\n", n, cli.Safe(in), src.Format)
		return nil
	}
	if err := atomicfile.CheckOutput(*out, []string{in}); err != nil {
		return fmt.Errorf("import: -o: %w", err)
	}
	n, format, err := tracefile.Import(in, *out, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d events from %s (%s)\n", cli.Safe(*out), n, cli.Safe(in), format)
	return nil
}
