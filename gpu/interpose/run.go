package interpose

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// LibraryName is the file name of the preload library, which `make build`
// puts next to the record binary.
const LibraryName = "librecord-interpose.so"

// Environment variables the preload library reads.
const (
	envDir    = "ALLOCSIM_RECORD_DIR"
	envCudart = "ALLOCSIM_RECORD_CUDART"
)

// Options say what to run and where to write its traces.
type Options struct {
	// Program and Args are the command to run; Program is looked up in
	// PATH when it has no slash.
	Program string
	Args    []string
	// Output is the trace of the program's own process. Every other
	// process that made a recorded call (a forked child, a program it
	// started) gets Output.PID, but the first of each rank that a launcher
	// started (RANK set, as torchrun sets it for its one process per GPU)
	// gets RankPath(Output, rank); the trace's Metadata holds rank,
	// local_rank, world_size and cuda_visible_devices where they were set.
	Output string
	// Library is the preload library (LibraryName).
	Library string
	// Cudart is the CUDA runtime library the preload library forwards
	// runtime calls to when the program's own runtime is not visible to it
	// (loaded with RTLD_LOCAL under another name); "" to find it.
	Cudart string
	// Env is the program's environment; nil means this process's.
	Env []string
	// Stdin, Stdout and Stderr are the program's; nil means /dev/null.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Linger bounds how long to wait, after the program exits, for its
	// recorded descendants that still run (0: 2 seconds). Their traces
	// hold the events up to then.
	Linger time.Duration
	// Card, if not nil, is asked once the program has exited (so that it
	// takes no memory from the program) for the GPU the program ran on:
	// its name and total memory in bytes (cudaMemGetInfo), written into
	// every trace's header (Device, DeviceMemory); a zero Card when it
	// cannot tell.
	Card func() Card
}

// Card is a GPU as a trace header names it.
type Card struct {
	Name   string
	Memory uint64 // total memory in bytes
}

// Result is what a recording produced.
type Result struct {
	// ExitCode is the program's exit status, or 128 + the signal number
	// when a signal killed it.
	ExitCode int
	// Signal is the signal that killed the program, 0 if none.
	Signal syscall.Signal
	// Traces are the traces written, the program's own first.
	Traces []Written
	// Running lists recorded processes still running when the traces were
	// written.
	Running []int
}

// Written describes one trace file.
type Written struct {
	Path    string
	Pid     int
	Ppid    int
	Command string
	Events  uint64
	Dropped uint64
}

// Run runs the program under the preload library, waits for it, and writes
// the traces. The program's exit status is in the Result; an error is
// returned only when recording failed (the program could not be started,
// a trace could not be written). While the program runs, Run passes
// SIGTERM and SIGHUP on to it and outlives SIGINT and SIGQUIT, which the
// terminal sends to the program as well.
func Run(opts Options) (*Result, error) {
	if opts.Output == "" {
		return nil, errors.New("no output path")
	}
	lib, err := filepath.Abs(opts.Library)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(lib); err != nil || st.IsDir() {
		return nil, fmt.Errorf("interposer library %s not found (make build puts %s next to the record binary)", lib, LibraryName)
	}
	prog := opts.Program
	if !strings.Contains(prog, "/") {
		if prog, err = exec.LookPath(prog); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(filepath.Dir(opts.Output), ".record-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	env = setenv(env, "LD_PRELOAD", lib+prefixed(getenv(env, "LD_PRELOAD"), ":"))
	env = setenv(env, envDir, dir)
	if opts.Cudart != "" {
		c, err := filepath.Abs(opts.Cudart)
		if err != nil {
			return nil, err
		}
		env = setenv(env, envCudart, c)
	}
	cmd := exec.Command(prog, opts.Args...)
	cmd.Args[0] = opts.Program
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				// The terminal sends SIGINT and SIGQUIT to the program too
				// (it is in our process group): survive them to write the
				// traces. SIGTERM and SIGHUP come to us alone: pass them on.
				if s == syscall.SIGTERM || s == syscall.SIGHUP {
					cmd.Process.Signal(s)
				}
			case <-done:
				return
			}
		}
	}()
	werr := cmd.Wait()
	close(done)
	res := &Result{}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return nil, werr
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		res.Signal = ws.Signal()
		res.ExitCode = 128 + int(res.Signal)
	default:
		res.ExitCode = ws.ExitStatus()
	}
	root := cmd.Process.Pid

	procs, err := Scan(dir)
	if err != nil {
		return nil, err
	}
	linger := opts.Linger
	if linger == 0 {
		linger = 2 * time.Second
	}
	if res.Running = waitOthers(procs, root, linger); len(res.Running) > 0 {
		// Processes may have started meanwhile: scan again.
		if procs, err = Scan(dir); err != nil {
			return nil, err
		}
	}

	var t0 int64
	for i, p := range procs {
		if i == 0 || p.start() < t0 {
			t0 = p.start()
		}
	}
	rootMeta := map[string]string{"exit_status": strconv.Itoa(res.ExitCode)}
	if res.Signal != 0 {
		rootMeta["signal"] = res.Signal.String()
	}
	if s := getenv(env, "PYTORCH_CUDA_ALLOC_CONF"); s != "" {
		rootMeta["PYTORCH_CUDA_ALLOC_CONF"] = s
	}
	var card Card
	if opts.Card != nil {
		card = opts.Card()
	}
	var rootProc *Process
	for _, p := range procs {
		if p.Pid == root {
			rootProc = p
		}
	}
	if rootProc == nil {
		// No recorded call: an empty trace says so.
		h := trace.Header{Source: "record", Device: card.Name, DeviceMemory: card.Memory, Metadata: map[string]string{
			"pid": strconv.Itoa(root), "command": commandLine(opts.Program, append([]string{opts.Program}, opts.Args...)),
		}}
		for k, v := range rootMeta {
			h.Metadata[k] = v
		}
		w, err := writeTrace(opts.Output, trace.NewSliceSource(h, nil))
		if err != nil {
			return nil, err
		}
		w.Pid, w.Command = root, h.Metadata["command"]
		res.Traces = append(res.Traces, w)
	}
	ranked := map[int]bool{} // the ranks named so far
	for _, p := range procs {
		path, meta := fmt.Sprintf("%s.%d", opts.Output, p.Pid), map[string]string{}
		if r := p.Rank(); r >= 0 && !ranked[r] && p != rootProc {
			// One process per GPU under a launcher: named by its rank.
			ranked[r] = true
			path = RankPath(opts.Output, r)
		}
		if p == rootProc {
			path, meta = opts.Output, rootMeta
		} else if slices.Contains(res.Running, p.Pid) {
			meta["running"] = "true" // its trace ends while it runs
		}
		src, err := p.Source(t0, meta, card)
		if err != nil {
			return nil, err
		}
		w, err := writeTrace(path, src)
		if err != nil {
			return nil, err
		}
		w.Pid, w.Ppid, w.Command = p.Pid, p.Ppid, p.Command()
		for _, im := range p.images {
			w.Dropped += im.hdr.Dropped
		}
		if p == rootProc {
			res.Traces = append([]Written{w}, res.Traces...)
		} else {
			res.Traces = append(res.Traces, w)
		}
	}
	return res, nil
}

// RankPath is the path of the trace of the process of rank r of a job
// whose trace is out: ".rankR" before out's extension ("job.trace" gives
// "job.rank0.trace"), or after out when it has none.
func RankPath(out string, r int) string {
	ext := filepath.Ext(out)
	if ext == "" || strings.ContainsRune(ext, filepath.Separator) {
		return fmt.Sprintf("%s.rank%d", out, r)
	}
	return fmt.Sprintf("%s.rank%d%s", strings.TrimSuffix(out, ext), r, ext)
}

func writeTrace(path string, src trace.Source) (Written, error) {
	n, err := tracefile.WriteSource(path, src)
	return Written{Path: path, Events: n}, err
}

// waitOthers waits up to linger for the recorded processes other than root
// to exit and returns those still running.
func waitOthers(procs []*Process, root int, linger time.Duration) []int {
	deadline := time.Now().Add(linger)
	for {
		var running []int
		for _, p := range procs {
			if p.Pid != root && alive(p.Pid) {
				running = append(running, p.Pid)
			}
		}
		if len(running) == 0 || time.Now().After(deadline) {
			return running
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func setenv(env []string, key, val string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+val)
}

func prefixed(s, sep string) string {
	if s == "" {
		return ""
	}
	return sep + s
}
