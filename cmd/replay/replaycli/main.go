// Package replaycli is the replay command as a library: Main and Run,
// with every policy registered in the program (policies.Register).
package replaycli

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// Main is the replay command: it runs the command os.Args name, prints
// its error and exits with its status. A program of another module that
// imports its own policies (policies.Register in their init functions)
// and calls Main is the whole replay CLI with them in every command,
// table, chart and report (docs/write-a-policy.md):
//
//	package main
//
//	import (
//		"github.com/gpualloc/allocsim/cmd/replay/replaycli"
//		_ "example.com/segfit" // registers the policy segfit
//	)
//
//	func main() { replaycli.Main() }
func Main() {
	// gpu and calibrate free the device's memory on Ctrl-C themselves.
	if len(os.Args) > 1 && os.Args[1] != "gpu" && os.Args[1] != "calibrate" {
		atomicfile.RemoveOnInterrupt()
	}
	stop, err := startCPUProfile(os.Getenv("ALLOCSIM_CPUPROFILE"))
	if err != nil {
		cli.Exit("replay", err)
	}
	err = Run(os.Stdout, os.Stderr, os.Args[1:])
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		cli.Exit("replay", err)
	}
}

// startCPUProfile starts Go's CPU profile of the whole command into the
// file named by path (the environment variable ALLOCSIM_CPUPROFILE), as
// `go test -cpuprofile` writes one, for `go tool pprof` and for the
// profile that `make pgo` merges into cmd/replay/default.pgo. It returns
// the function that stops the profile and closes the file, and an error
// naming the file if it cannot be created. An empty path profiles
// nothing; a command interrupted (Ctrl-C) leaves the file unfinished.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("ALLOCSIM_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("ALLOCSIM_CPUPROFILE %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("ALLOCSIM_CPUPROFILE: %w", err)
		}
		return nil
	}, nil
}

const usage = `usage: replay COMMAND [flags] ARGS...

Commands:
  sim    replay traces against simulated allocator policies
         replay sim [--policy NAME[,NAME...]|all] [--capacity SIZE] [--set NAME.key=value]
                    [--json FILE] [--csv FILE] [--plots DIR] TRACE...
  gpu    replay traces on the GPU through the CUDA runtime, simulated alongside
         replay gpu [--policy cuda|cuda-async|NAME[,...]|all] [--set NAME.key=value] [--cudart PATH]
                    [--max-bytes SIZE] [--cost-model FILE] [--calls FILE] [--c-loop] [--json FILE] TRACE...
  calibrate  measure the GPU's call latencies by size and write a cost model
         replay calibrate [-o FILE] [--cudart PATH] [--max-size SIZE] [--n N]
  stats  summarize traces: counts by op, sizes, lifetimes, peak live bytes, streams, threads
         replay stats [--json] [--top N] TRACE...
  dump   print a trace in the text form
         replay dump [--from FORMAT] [--device N] TRACE
  check  validate traces and list the allocations live at their end (exit 1 if any)
         replay check [--limit N] TRACE...
  sweep  replay every (trace, policy, setting, capacity) in parallel, resumable, into a directory
         replay sweep --traces GLOB... [--policy LIST|all] [--set NAME.key=value] [--grid NAME.key=v1,v2,...]
                      [--capacity SIZE[,SIZE...]] [--shard i/n] [-j N] -o DIR
  merge  join the results of a sweep's shards
         replay merge [--partial] -o DIR SHARD_DIR|RESULTS.json...
  fit    the smallest device capacity each policy runs a trace in without an OOM, and the cards it fits
         replay fit [--policy LIST|all] [--set NAME.key=value] [--json FILE] TRACE...
  tune   search PyTorch's allocator settings (PYTORCH_CUDA_ALLOC_CONF) for a trace under a cap or a card
         replay tune [--capacity SIZE | --card SIZE] [--grid KEY=v1,v2,...] [--json FILE] TRACE...
  report one self-contained HTML page of tables and charts from results of sim, gpu, fit or sweep
         replay report -o report.html [--plots DIR] RESULTS.json...
  fidelity  replay traces as recorded and compare with the recording event by event (exit 1 if any differs)
         replay fidelity [--policy NAME] [--capacity SIZE] [--set NAME.key=value] TRACE...
  diff   two runs side by side with the deltas: two traces, or one trace under two policies or settings
         replay diff [--policy NAME] [--policy-b NAME] [--set-b NAME.key=value] [--json FILE] TRACE_A [TRACE_B]
  policies  list the policies: the design each follows, its abilities, its settings with defaults
         replay policies [--json]
  slice  cut a time or entry range out of a PyTorch snapshot, as a snapshot PyTorch's memory_viz opens
         replay slice [--from TIME] [--to TIME] | [--events A:B] [--device N] -o OUT.pickle[.gz] SNAPSHOT

Run 'replay help COMMAND' (or 'replay COMMAND --help') for a command's flags, 'replay --version'
for the version. A usage error exits 2, an interrupt 130, any other error 1.
`

// run is the whole command: it parses args (without the program name) and
// writes results to stdout and diagnostics to stderr.
// Run runs the replay command args name (args without the program's
// name: "sim", "--policy", ...), writing to stdout and stderr, and returns
// its error: one with an ExitCode method (a usage error: 2) says the exit
// status, any other is status 1.
func Run(stdout, stderr io.Writer, args []string) error { return run(stdout, stderr, args) }

func run(stdout, stderr io.Writer, args []string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
	}()
	// What a command writes to stdout (a table, a results file given as
	// "-") is its output: a write that fails (a full disk, a closed pipe)
	// fails the command, whatever the command did with the error.
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
		fmt.Fprintln(stdout, cli.Version("replay"))
		return nil
	case "sim":
		return runSim(stdout, stderr, args[1:])
	case "fidelity":
		return runFidelity(stdout, stderr, args[1:])
	case "diff":
		return runDiff(stdout, stderr, args[1:])
	case "stats":
		return runStats(stdout, stderr, args[1:])
	case "dump":
		return runDump(stdout, stderr, args[1:])
	case "check":
		return runCheck(stdout, stderr, args[1:])
	case "gpu":
		return runGPU(stdout, stderr, args[1:])
	case "calibrate":
		return runCalibrate(stdout, stderr, args[1:])
	case "sweep":
		return runSweep(stdout, stderr, args[1:])
	case "merge":
		return runMerge(stdout, stderr, args[1:])
	case "fit":
		return runFit(stdout, stderr, args[1:])
	case "tune":
		return runTune(stdout, stderr, args[1:])
	case "report":
		return runReport(stdout, stderr, args[1:])
	case "policies":
		return runPolicies(stdout, stderr, args[1:])
	case "slice":
		return runSlice(stdout, stderr, args[1:])
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			// help CMD is CMD --help.
			return run(stdout, stderr, []string{args[1], "--help"})
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return cli.UsageError{Err: cli.UnknownError("command", args[0], commands)}
}

func init() {
	// The charts' default set leaves planners out of the lowest peaks.
	plots.IsPlanner = func(name string) bool {
		info, ok := policies.Lookup(name)
		return ok && info.Abilities.Planner
	}
}

// commands are the commands dispatch knows, for "did you mean".
var commands = []string{"sim", "fidelity", "diff", "stats", "dump", "check", "gpu", "calibrate", "sweep", "merge", "fit", "tune", "report", "policies", "slice", "help", "version"}
