package interpose

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// built holds the C pieces, compiled once per test binary: the preload
// library, a fake driver (libcuda.so.1), a fake runtime (libcudart.so.13),
// the test program linked against the runtime (dyn) and with the runtime
// compiled in, as nvcc links it by default (static).
var built struct {
	once             sync.Once
	dir, err         string
	lib, dyn, static string
}

func cc() string {
	if c := os.Getenv("CC"); c != "" {
		return c
	}
	return "gcc"
}

// build compiles the C pieces or skips the test when no C compiler is
// installed.
func build(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(cc()); err != nil {
		t.Skipf("no C compiler (%s): %v", cc(), err)
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "interpose-test-*")
		if err != nil {
			built.err = err.Error()
			return
		}
		built.dir = dir
		built.lib = filepath.Join(dir, LibraryName)
		built.dyn = filepath.Join(dir, "prog_dyn")
		built.static = filepath.Join(dir, "prog_static")
		steps := [][]string{
			{"-O2", "-Wall", "-shared", "-fPIC", "-o", built.lib, "preload/interpose.c", "-ldl", "-lpthread"},
			{"-O2", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), "testdata/fakecuda.c", "-lpthread"},
			{"-O2", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcudart.so.13"), "testdata/fakecudart.c", "-ldl", "-lpthread"},
			{"-O2", "-o", built.dyn, "testdata/prog.c", "-L" + dir, "-l:libcudart.so.13", "-Wl,-rpath," + dir, "-ldl", "-lpthread"},
			{"-O2", "-o", built.static, "testdata/prog.c", "testdata/fakecudart.c", "-ldl", "-lpthread"},
		}
		for _, s := range steps {
			out, err := exec.Command(cc(), s...).CombinedOutput()
			if err != nil || bytes.Contains(out, []byte("warning")) {
				built.err = fmt.Sprintf("%s %s: %v\n%s", cc(), strings.Join(s, " "), err, out)
				return
			}
		}
	})
	if built.err != "" {
		t.Fatal(built.err)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

type recording struct {
	res    *Result
	stdout string
	traces []recorded // as in res.Traces
}

type recorded struct {
	h   trace.Header
	evs []trace.Event
}

// recordRun runs prog under the interposer in a fresh directory and reads
// back every trace written.
func recordRun(t *testing.T, prog string, args ...string) recording {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.trace")
	var stdout bytes.Buffer
	res, err := Run(Options{
		Program: prog, Args: args, Output: out, Library: built.lib,
		Env:    append(os.Environ(), "LD_LIBRARY_PATH="+built.dir),
		Stdout: &stdout, Stderr: os.Stderr,
		Card: func() Card { return Card{Name: "Fake GPU", Memory: 80 << 30} },
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := recording{res: res, stdout: stdout.String()}
	for _, w := range res.Traces {
		f, err := tracefile.Open(w.Path, tracefile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var evs []trace.Event
		for {
			ev, err := f.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		f.Close()
		if uint64(len(evs)) != w.Events {
			t.Errorf("%s: read %d events, Run says %d", w.Path, len(evs), w.Events)
		}
		rec.traces = append(rec.traces, recorded{f.Header(), evs})
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".record-*")); len(left) > 0 {
		t.Errorf("raw files left: %v", left)
	}
	return rec
}

// normalize renders events in the text form with addresses and threads
// renumbered in order of appearance, times dropped, and the labels of
// mallocs and failures cut to what does not depend on the linkage; apis
// gets the function names those labels carried.
func normalize(evs []trace.Event) (lines, apis []string) {
	addrs, threads := map[uint64]uint64{}, map[uint64]uint64{}
	num := func(m map[uint64]uint64, v uint64) uint64 {
		if v == 0 {
			return 0
		}
		if _, ok := m[v]; !ok {
			m[v] = uint64(len(m) + 1)
		}
		return m[v]
	}
	failed := regexp.MustCompile(`^\w+ failed: `)
	for _, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc, trace.OpFree, trace.OpMallocFailed, trace.OpMarker:
			ev.Addr = num(addrs, ev.Addr)
		}
		ev.Thread = num(threads, ev.Thread)
		ev.Time = 0
		if name, _, ok := strings.Cut(ev.Label, "@"); ok {
			apis = append(apis, name)
			ev.Label = ""
		}
		if m := failed.FindString(ev.Label); m != "" {
			apis = append(apis, strings.Fields(m)[0])
			ev.Label = "failed: " + ev.Label[len(m):]
		}
		lines = append(lines, trace.FormatText(ev))
	}
	return lines, apis
}

// sameOutput runs prog with args without the interposer and checks that
// its output (its return codes) is the recording's.
func sameOutput(t *testing.T, rec recording, prog string, args ...string) {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+built.dir)
	plain, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if rec.stdout != string(plain) {
		t.Errorf("output under the interposer:\n%s\nwithout:\n%s", rec.stdout, plain)
	}
}

func checkLines(t *testing.T, got []string, want string) {
	t.Helper()
	w := strings.Split(strings.TrimSpace(want), "\n")
	for i := range w {
		w[i] = strings.TrimSpace(w[i])
	}
	if strings.Join(got, "\n") != strings.Join(w, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(w, "\n"))
	}
}

const allWant = `
malloc addr=0x1 size=1000 t=0 thread=1
malloc_failed size=1125899906842624 t=0 thread=1
malloc addr=0x2 size=2000 stream=0x5001 kind=async t=0 thread=1
malloc addr=0x3 size=3000 stream=0x5002 kind=async t=0 thread=1
malloc addr=0x4 size=4000 kind=pinned t=0 thread=1
malloc addr=0x5 size=5000 kind=pinned t=0 thread=1
malloc addr=0x6 size=6000 kind=managed t=0 thread=1
event_record event=57345 stream=0x5001 t=0 thread=1
stream_wait_event event=57345 stream=0x5002 t=0 thread=1
event_record event=57346 stream=0x5002 t=0 thread=1
event_sync event=57345 t=0 thread=1
marker t=0 thread=1 label="failed: error 400"
stream_sync stream=0x5001 t=0 thread=1
stream_sync stream=0x2 t=0 thread=1
free addr=0x2 stream=0x5001 t=0 thread=1
free addr=0x3 stream=0x5002 t=0 thread=1
device_sync t=0 thread=1
free addr=0x1 t=0 thread=1
marker addr=0x1 t=0 thread=1 label="failed: error 1"
free addr=0x4 t=0 thread=1
free addr=0x5 t=0 thread=1
free addr=0x6 t=0 thread=1
`

// TestVMM records a program mapping memory through the driver's virtual
// memory API, with the entry points from dlsym (as XLA gets them) and from
// cuGetProcAddress (as PyTorch's expandable segments get them through the
// runtime): each mapping a malloc, an unmap the frees of the mappings in
// it, a refused cuMemCreate the malloc that failed, the rest counted.
func TestVMM(t *testing.T) {
	build(t)
	const want = `
marker t=0 thread=1 label="failed: error 801"
malloc addr=0x1 size=2097152 t=0 thread=1
malloc addr=0x2 size=2097152 t=0 thread=1
malloc addr=0x3 size=4194304 t=0 thread=1
malloc_failed size=1125899906842624 t=0 thread=1
free addr=0x1 t=0 thread=1
free addr=0x2 t=0 thread=1
marker addr=0x3 t=0 thread=1 label="cuMemUnmap of 2097152 bytes: part of a mapping"
free addr=0x3 t=0 thread=1
marker t=0 thread=1 label="cuMemPoolTrimTo of pool 0x9001 to 0 bytes"
`
	for _, mode := range []string{"vmm", "vmm-proc"} {
		t.Run(mode, func(t *testing.T) {
			rec := recordRun(t, built.dyn, mode)
			if rec.res.ExitCode != 0 || len(rec.traces) != 1 {
				t.Fatalf("exit %d, %d traces", rec.res.ExitCode, len(rec.traces))
			}
			lines, apis := normalize(rec.traces[0].evs)
			checkLines(t, lines, want)
			if got, w := strings.Join(apis, " "), "cuMemCreate cuMemMap cuMemMap cuMemMap cuMemCreate"; got != w {
				t.Errorf("functions %q, want %q", got, w)
			}
			md := rec.traces[0].h.Metadata
			for k, v := range map[string]string{
				"calls.cuMemAddressReserve": "1", "calls.cuMemAddressFree": "1", "calls.cuMemCreate": "5",
				"failed.cuMemCreate": "2", "calls.cuMemRelease": "3", "calls.cuMemMap": "3", "calls.cuMemUnmap": "3",
				"calls.cuMemPoolTrimTo": "1", "calls.cuMemSetAccess": "1",
			} {
				if md[k] != v {
					t.Errorf("metadata %s = %q, want %q", k, md[k], v)
				}
			}
			sameOutput(t, rec, built.dyn, mode)
		})
	}
}

// TestAll records every intercepted call, with a failed malloc, a failed
// sync, a failed free and the no-ops (a malloc of 0 bytes, a free of NULL),
// through a dynamically linked runtime (the runtime's symbols) and a
// statically linked one (the driver's entry points): the same events, each
// once, and the program's output (its return codes) unchanged.
func TestAll(t *testing.T) {
	build(t)
	for _, tc := range []struct {
		name, prog string
		apis       string
		calls      map[string]string
	}{
		{"dynamic", built.dyn,
			"cudaMalloc cudaMalloc cudaMallocAsync cudaMallocFromPoolAsync cudaMallocHost cudaHostAlloc cudaMallocManaged cudaEventSynchronize cudaFree",
			map[string]string{"calls.cudaMalloc": "3", "failed.cudaMalloc": "1", "calls.cudaFree": "4", "calls.cudaMallocHost": "1", "calls.cuStreamSynchronize": "1"}},
		{"static", built.static,
			"cuMemAlloc cuMemAlloc cuMemAllocAsync cuMemAllocFromPoolAsync cuMemHostAlloc cuMemHostAlloc cuMemAllocManaged cuEventSynchronize cuMemFree",
			map[string]string{"calls.cuMemAlloc": "2", "failed.cuMemAlloc": "1", "calls.cuMemFree": "3", "calls.cuMemHostAlloc": "2", "calls.cuStreamSynchronize": "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := recordRun(t, tc.prog, "all")
			if rec.res.ExitCode != 0 || len(rec.traces) != 1 {
				t.Fatalf("exit %d, %d traces", rec.res.ExitCode, len(rec.traces))
			}
			lines, apis := normalize(rec.traces[0].evs)
			checkLines(t, lines, allWant)
			if got := strings.Join(apis, " "); got != tc.apis {
				t.Errorf("functions %q, want %q", got, tc.apis)
			}
			if h := rec.traces[0].h; h.Device != "Fake GPU" || h.DeviceMemory != 80<<30 {
				t.Errorf("header names the card %q of %d bytes", h.Device, h.DeviceMemory)
			}
			md := rec.traces[0].h.Metadata
			for k, v := range tc.calls {
				if md[k] != v {
					t.Errorf("metadata %s = %q, want %q", k, md[k], v)
				}
			}
			if md["exit_status"] != "0" || md["pid"] != strconv.Itoa(rec.res.Traces[0].Pid) || !strings.HasSuffix(md["command"], filepath.Base(tc.prog)+" all") {
				t.Errorf("metadata %v", md)
			}
			// Call sites name the program.
			for _, ev := range rec.traces[0].evs {
				if ev.Op == trace.OpMalloc && !strings.Contains(ev.Label, "@"+filepath.Base(tc.prog)+"+0x") {
					t.Errorf("call site %q", ev.Label)
				}
			}
			sameOutput(t, rec, tc.prog, "all")
		})
	}
}

// TestThreads records 4 threads making 200 malloc/free pairs each: every
// call once, each thread's calls in its order.
func TestThreads(t *testing.T) {
	build(t)
	for _, prog := range []string{built.dyn, built.static} {
		rec := recordRun(t, prog, "threads", "4", "200")
		evs := rec.traces[0].evs
		if len(evs) != 4*200*2 {
			t.Fatalf("%s: %d events, want 1600", prog, len(evs))
		}
		perThread := map[uint64][]trace.Event{}
		for _, ev := range evs {
			perThread[ev.Thread] = append(perThread[ev.Thread], ev)
		}
		if len(perThread) != 4 {
			t.Errorf("%d threads", len(perThread))
		}
		sizes := map[uint64]bool{}
		for th, list := range perThread {
			size := list[0].Size
			sizes[size] = true
			for i, ev := range list {
				want := trace.OpMalloc
				if i%2 == 1 {
					want = trace.OpFree
				}
				if ev.Op != want || (want == trace.OpMalloc && ev.Size != size) || (want == trace.OpFree && ev.Addr != list[i-1].Addr) {
					t.Fatalf("thread %d event %d: %s", th, i, trace.FormatText(ev))
				}
			}
		}
		if len(sizes) != 4 {
			t.Errorf("sizes %v", sizes)
		}
		problems, err := trace.Validate(trace.NewSliceSource(trace.Header{}, evs), 5)
		if err != nil || len(problems) > 0 {
			t.Errorf("validate: %v %v", err, problems)
		}
	}
}

// TestProcesses covers fork (the child gets its own trace; a child making
// no call gets none), exit() from a second thread, death by a signal, and
// exec (one trace for the pid, a marker between its images), with the exit
// status passed through.
func TestProcesses(t *testing.T) {
	build(t)
	t.Run("fork", func(t *testing.T) {
		rec := recordRun(t, built.dyn, "fork")
		if len(rec.traces) != 2 {
			t.Fatalf("%d traces, want 2", len(rec.traces))
		}
		lines, _ := normalize(rec.traces[0].evs)
		checkLines(t, lines, "malloc addr=0x1 size=100 t=0 thread=1\nfree addr=0x1 t=0 thread=1")
		lines, _ = normalize(rec.traces[1].evs)
		checkLines(t, lines, "malloc addr=0x1 size=200 t=0 thread=1\nfree addr=0x1 t=0 thread=1")
		parent, child := rec.res.Traces[0], rec.res.Traces[1]
		if child.Ppid != parent.Pid || child.Path != fmt.Sprintf("%s.%d", parent.Path, child.Pid) {
			t.Errorf("parent %+v, child %+v", parent, child)
		}
		if rec.traces[0].evs[1].Time < rec.traces[1].evs[1].Time {
			t.Errorf("parent's free at %d ns before the child's at %d ns: the clocks do not line up", rec.traces[0].evs[1].Time, rec.traces[1].evs[1].Time)
		}
	})
	t.Run("exit from a second thread", func(t *testing.T) {
		rec := recordRun(t, built.static, "exit-thread")
		if rec.res.ExitCode != 3 || rec.traces[0].h.Metadata["exit_status"] != "3" {
			t.Errorf("exit status %d", rec.res.ExitCode)
		}
		lines, _ := normalize(rec.traces[0].evs)
		checkLines(t, lines, "malloc addr=0x1 size=100 t=0 thread=1\nmalloc addr=0x2 size=200 t=0 thread=2")
	})
	t.Run("signal", func(t *testing.T) {
		rec := recordRun(t, built.dyn, "signal")
		if rec.res.ExitCode != 128+9 || rec.res.Signal != syscall.SIGKILL || rec.traces[0].h.Metadata["signal"] != "killed" {
			t.Errorf("exit %d, signal %v, metadata %v", rec.res.ExitCode, rec.res.Signal, rec.traces[0].h.Metadata)
		}
		lines, _ := normalize(rec.traces[0].evs)
		checkLines(t, lines, "malloc addr=0x1 size=100 t=0 thread=1\nmalloc addr=0x2 size=200 t=0 thread=1")
	})
	t.Run("exec", func(t *testing.T) {
		rec := recordRun(t, built.dyn, "exec")
		if len(rec.traces) != 1 {
			t.Fatalf("%d traces", len(rec.traces))
		}
		lines, _ := normalize(rec.traces[0].evs)
		checkLines(t, lines, fmt.Sprintf(`malloc addr=0x1 size=300 t=0 thread=1
			marker t=0 label="exec %s after-exec"
			malloc addr=0x2 size=400 t=0 thread=1
			free addr=0x2 t=0 thread=1`, built.dyn))
	})
	t.Run("ranks", func(t *testing.T) {
		// A launcher (here a shell, as torchrun would) starts one
		// process per GPU with RANK, LOCAL_RANK, WORLD_SIZE and
		// CUDA_VISIBLE_DEVICES set; the launcher makes no call of its own,
		// so its trace is empty, and each process's is named by its rank.
		script := fmt.Sprintf("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 CUDA_VISIBLE_DEVICES=1 %[1]s fork & RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 CUDA_VISIBLE_DEVICES=0 %[1]s fork; wait", built.dyn)
		rec := recordRun(t, "/bin/sh", "-c", script)
		byPath := map[string]*recorded{}
		for i := range rec.traces {
			byPath[filepath.Base(rec.res.Traces[i].Path)] = &rec.traces[i]
		}
		if len(rec.traces) != 5 || len(byPath["out.trace"].evs) != 0 {
			t.Fatalf("%d traces (%v), want the launcher's, empty, and two per rank", len(rec.traces), rec.res.Traces)
		}
		for r := 0; r < 2; r++ {
			name := fmt.Sprintf("out.rank%d.trace", r)
			got := byPath[name]
			if got == nil {
				t.Fatalf("no %s among %v", name, rec.res.Traces)
			}
			md := got.h.Metadata
			if md["rank"] != strconv.Itoa(r) || md["local_rank"] != strconv.Itoa(r) || md["world_size"] != "2" || md["cuda_visible_devices"] != strconv.Itoa(r) {
				t.Errorf("%s: metadata %v", name, md)
			}
			lines, _ := normalize(got.evs)
			checkLines(t, lines, "malloc addr=0x1 size=100 t=0 thread=1\nfree addr=0x1 t=0 thread=1")
		}
		// Each rank's forked child inherits RANK: the second process of a
		// rank keeps the PID name.
		forks := 0
		for _, w := range rec.res.Traces {
			if strings.HasPrefix(filepath.Base(w.Path), "out.trace.") {
				forks++
			}
		}
		if forks != 2 {
			t.Errorf("%d traces named by pid, want the two forked children: %v", forks, rec.res.Traces)
		}
	})
	t.Run("no calls", func(t *testing.T) {
		rec := recordRun(t, built.dyn, "exit", "7")
		if rec.res.ExitCode != 7 || len(rec.traces) != 1 || len(rec.traces[0].evs) != 0 || rec.traces[0].h.Metadata["exit_status"] != "7" {
			t.Errorf("exit %d, traces %+v", rec.res.ExitCode, rec.traces)
		}
	})
}

// TestOverhead times a cudaMalloc + cudaFree pair on the fake driver with
// and without the interposer. The bound is loose (CI machines are noisy);
// the figure is logged.
func TestOverhead(t *testing.T) {
	build(t)
	env := append(os.Environ(), "LD_LIBRARY_PATH="+built.dir)
	for _, prog := range []string{built.dyn, built.static} {
		bench := func(pre bool) float64 {
			cmd := exec.Command(prog, "bench", "100000")
			cmd.Env = env
			if pre {
				cmd.Env = append(env, "LD_PRELOAD="+built.lib, envDir+"="+t.TempDir())
			}
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		base, with := bench(false), bench(true)
		perCall := (with - base) / 2
		t.Logf("%s: malloc+free pair %.0f ns without, %.0f ns with the interposer: %.0f ns per call", filepath.Base(prog), base, with, perCall)
		if perCall > 2000 {
			t.Errorf("%.0f ns per call", perCall)
		}
	}
}

// TestAPINumbers checks that the api numbers of preload/interpose.c and of
// this package agree.
func TestAPINumbers(t *testing.T) {
	src, err := os.ReadFile("preload/interpose.c")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\tA_(\w+) = (\d+),$`)
	seen := 0
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "NONE" || strings.HasPrefix(m[1], "cuGetProcAddress") {
			continue
		}
		seen++
		if apis[uint32(n)].name != m[1] {
			t.Errorf("api %d is %s in C, %q in Go", n, m[1], apis[uint32(n)].name)
		}
	}
	if seen != len(apis) {
		t.Errorf("%d apis in C, %d in Go", seen, len(apis))
	}
}

func TestNotRaw(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "1.2.raw"), []byte("hello"), 0o644)
	if _, err := Scan(dir); err == nil || !strings.Contains(err.Error(), ErrNotRaw.Error()) {
		t.Errorf("err %v", err)
	}
	if _, err := Run(Options{Program: "true", Output: filepath.Join(dir, "x"), Library: filepath.Join(dir, "nope.so")}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("err %v", err)
	}
}

// TestGraphCapture records a CUDA graph capture through the runtime's
// functions (dynamic) and the driver's entry points (static): the capture's
// begin and end as markers, its stream-ordered mallocs in its private pool
// (graph memory), the graph's destruction as the pool's release, a malloc
// on another stream after the capture in the default pools, a refused
// capture of the legacy stream as a failed call.
func TestGraphCapture(t *testing.T) {
	build(t)
	for _, tc := range []struct{ name, prog, begin, end string }{
		{"dynamic", built.dyn, "cudaStreamBeginCapture", "cudaStreamEndCapture"},
		{"static", built.static, "cuStreamBeginCapture", "cuStreamEndCapture"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := recordRun(t, tc.prog, "graph")
			if rec.res.ExitCode != 0 || len(rec.traces) != 1 {
				t.Fatalf("exit %d, %d traces", rec.res.ExitCode, len(rec.traces))
			}
			lines, _ := normalize(rec.traces[0].evs)
			want := `
marker stream=0x5001 t=0 thread=1 label="BEGIN: capture 1 of stream 0x5001 (mode 0)"
malloc addr=0x1 size=4096 stream=0x5001 kind=async t=0 thread=1 pool=1
malloc addr=0x2 size=8192 stream=0x5001 kind=async t=0 thread=1 pool=1
free addr=0x1 stream=0x5001 t=0 thread=1
free addr=0x2 stream=0x5001 t=0 thread=1
marker addr=0x3 stream=0x5001 t=0 thread=1 label="END: capture 1 of stream 0x5001 ends: graph 0x6001"
malloc addr=0x4 size=100 stream=0x5002 kind=async t=0 thread=1
free addr=0x4 stream=0x5002 t=0 thread=1
pool_release t=0 thread=1 pool=1
marker t=0 thread=1 label="failed: error 900"
`
			want = strings.NewReplacer("BEGIN", tc.begin, "END", tc.end).Replace(want)
			checkLines(t, lines, want)
			sameOutput(t, rec, tc.prog, "graph")
		})
	}
}
