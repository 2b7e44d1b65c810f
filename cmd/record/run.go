package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/gpu/interpose"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// card asks the CUDA runtime (the one at path, or the first of
// gpu.DefaultLibraries) for the current device's name and total memory
// (cudaMemGetInfo); a zero Card when there is none.
func card(path string) interpose.Card {
	rt, err := gpu.Open(path)
	if err != nil {
		return interpose.Card{}
	}
	defer rt.Close()
	_, total, err := rt.MemGetInfo()
	if err != nil {
		return interpose.Card{}
	}
	return interpose.Card{Name: rt.DeviceName, Memory: total}
}

// exitStatus is the error of a recorded program that did not exit with 0:
// main exits with its code, so that the program's status passes through.
type exitStatus struct {
	code int
	msg  string
}

func (e *exitStatus) Error() string { return e.msg }

// ExitCode returns the status to exit with.
func (e *exitStatus) ExitCode() int { return e.code }

const runUsage = `usage: record run [-o OUT] [--cudart PATH] [--interposer PATH] -- PROGRAM [ARGS...]

Runs PROGRAM with an LD_PRELOAD interposer (librecord-interpose.so) that
records its CUDA allocation calls and writes them as a native trace when it
exits: the runtime's and the driver's mallocs and frees (cudaMalloc,
cuMemAlloc, pinned and managed memory), stream-ordered mallocs
(cudaMallocAsync, cudaFreeAsync), the virtual memory API (a cuMemMap is a
device malloc, as PyTorch's expandable segments and XLA use it), stream
and event synchronizations, and CUDA graph capture (its private pool),
each with its size in bytes, stream, time in nanoseconds and call site.
The header names the card (cudaMemGetInfo's total memory in bytes, asked
once). Under a launcher that starts one process per GPU (torchrun), each
rank's trace is OUT with .rankN before its extension. The program's exit
status is record's.

Flags:
`

func runRun(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SetInterspersed(false)
	out := fs.StringP("output", "o", "", "write the program's trace to `OUT` (default PROGRAM.trace); a process a launcher started with RANK=N (torchrun) gets OUT with .rankN before its extension, other processes OUT.PID")
	cudart := fs.String("cudart", "", "the CUDA runtime library to forward runtime calls to when the program's own is not visible (`PATH`)")
	lib := fs.String("interposer", "", "the interposer library (`PATH`; default "+interpose.LibraryName+" next to the record binary)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("run: no program given (record run [-o OUT] -- PROGRAM [ARGS...])")
	}
	prog := fs.Arg(0)
	if *out == "" {
		*out = filepath.Base(prog) + ".trace"
	}
	// The trace goes to a file: not the program, not a directory, checked
	// before the program runs.
	if st, err := os.Stat(*out); err == nil && st.IsDir() {
		return fmt.Errorf("run: -o %s: a directory; want a file", *out)
	}
	if path, err := exec.LookPath(prog); err == nil {
		if err := atomicfile.CheckOutput(*out, []string{path}); err != nil {
			return fmt.Errorf("run: -o: %w", err)
		}
	}
	if *lib == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("run: cannot find the interposer: %v (use --interposer)", err)
		}
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		*lib = filepath.Join(filepath.Dir(exe), interpose.LibraryName)
	}
	res, err := interpose.Run(interpose.Options{
		Program: prog, Args: fs.Args()[1:], Output: *out, Library: *lib, Cudart: *cudart,
		Stdin: os.Stdin, Stdout: stdout, Stderr: stderr,
		Card: func() interpose.Card { return card(*cudart) },
	})
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	for _, w := range res.Traces {
		fmt.Fprintf(stderr, "record: %s: %d events (pid %d: %s)\n", cli.Safe(w.Path), w.Events, w.Pid, cli.Safe(w.Command))
		if w.Dropped > 0 {
			fmt.Fprintf(stderr, "record: %s: %d calls were not recorded (no space for the raw trace)\n", cli.Safe(w.Path), w.Dropped)
		}
	}
	for _, pid := range res.Running {
		fmt.Fprintf(stderr, "record: process %d still runs; its trace holds its calls up to now\n", pid)
	}
	switch {
	case res.Signal != 0:
		return &exitStatus{res.ExitCode, fmt.Sprintf("%s killed by signal %d (%v)", prog, int(res.Signal), res.Signal)}
	case res.ExitCode != 0:
		return &exitStatus{res.ExitCode, fmt.Sprintf("%s exited with status %d", prog, res.ExitCode)}
	}
	return nil
}
