package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// The tests run every path of the package against a fake CUDA runtime built
// from testdata/fakecudart.c with the C compiler cgo uses.

var fakes struct {
	once              sync.Once
	dir               string
	lib, noAsync, bad string
	err               error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fakes.dir != "" {
		os.RemoveAll(fakes.dir)
	}
	os.Exit(code)
}

func cc() string {
	if c := os.Getenv("CC"); c != "" {
		return c
	}
	return "gcc"
}

func buildFakes() {
	fakes.dir, fakes.err = os.MkdirTemp("", "fakecudart")
	if fakes.err != nil {
		return
	}
	build := func(out string, src string, flags ...string) error {
		args := append([]string{"-shared", "-fPIC", "-O1", "-o", out, src}, flags...)
		if b, err := exec.Command(cc(), args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s", cc(), strings.Join(args, " "), err, b)
		}
		return nil
	}
	fakes.lib = filepath.Join(fakes.dir, "libfake.so")
	fakes.noAsync = filepath.Join(fakes.dir, "libfake_noasync.so")
	fakes.bad = filepath.Join(fakes.dir, "libbad.so")
	if fakes.err = build(fakes.lib, "testdata/fakecudart.c"); fakes.err != nil {
		return
	}
	if fakes.err = build(fakes.noAsync, "testdata/fakecudart.c", "-DFAKE_NO_ASYNC"); fakes.err != nil {
		return
	}
	bad := filepath.Join(fakes.dir, "bad.c")
	os.WriteFile(bad, []byte("int cudaFree(void *p) { return 0; }\n"), 0o644)
	fakes.err = build(fakes.bad, bad)
}

// fakeRuntime copies the fake runtime (fresh state: every copy is loaded
// apart) into the test's directory, with env as its configuration, and
// opens it.
func fakeRuntime(t *testing.T, variant string, env ...string) *Runtime {
	t.Helper()
	path := fakePath(t, variant)
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	rt, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

func fakePath(t *testing.T, variant string) string {
	t.Helper()
	if _, err := exec.LookPath(cc()); err != nil {
		t.Skipf("no C compiler to build the fake CUDA runtime: %v", err)
	}
	fakes.once.Do(buildFakes)
	if fakes.err != nil {
		t.Fatalf("building the fake CUDA runtime: %v", fakes.err)
	}
	src := map[string]string{"": fakes.lib, "noasync": fakes.noAsync, "bad": fakes.bad}[variant]
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "libcudart.so")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The fake's configuration is read at its first call: start from none.
	for _, k := range []string{"FAKECUDA_TOTAL", "FAKECUDA_LATENCY_NS", "FAKECUDA_FAIL", "FAKECUDA_WAKE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	return path
}

// live returns the fake's count of live allocations, streams, events and
// pools.
func live(t *testing.T, rt *Runtime) int {
	t.Helper()
	n, ok := rt.optionalInt("fakecuda_live")
	if !ok {
		t.Fatal("the fake runtime has no fakecuda_live")
	}
	return n
}

func textTrace(t *testing.T, text string) trace.Source {
	t.Helper()
	h, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSliceSource(h, evs)
}

func TestOpenNoRuntime(t *testing.T) {
	_, err := Open("/nonexistent/libcudart.so")
	if !errors.Is(err, ErrNoRuntime) {
		t.Fatalf("got %v, want ErrNoRuntime", err)
	}
	want := "no CUDA runtime found (tried: /nonexistent/libcudart.so: "
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	_, err = Open(fakePath(t, "bad"))
	if !errors.Is(err, ErrNoRuntime) || !strings.Contains(err.Error(), "libcudart.so: no cudaMalloc") {
		t.Errorf("library without cudaMalloc: got %v", err)
	}
}

func TestOpenNoDevice(t *testing.T) {
	path := fakePath(t, "")
	t.Setenv("FAKECUDA_FAIL", "cudaFree:1:100")
	_, err := Open(path)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != 100 || ce.Name != "cudaErrorNoDevice" || ce.Call != "cudaFree(NULL)" {
		t.Fatalf("got %v, want cudaFree(NULL): cudaErrorNoDevice (100)", err)
	}
}

func TestRuntimeCalls(t *testing.T) {
	rt := fakeRuntime(t, "", "FAKECUDA_TOTAL=1048576", "FAKECUDA_LATENCY_NS=20000")
	if rt.DeviceName != "Fake CUDA Device" || rt.Version != 13000 || rt.DriverVersion != 13000 || rt.Device != 0 {
		t.Errorf("runtime %+v", rt)
	}
	p, _, err := rt.Malloc(0)
	if p != 0 || err != nil {
		t.Errorf("cudaMalloc(0) = %#x, %v; want NULL, success", p, err)
	}
	p, ns, err := rt.Malloc(4096)
	if err != nil || p == 0 || ns < 20000 {
		t.Fatalf("cudaMalloc(4096) = %#x, %d ns, %v", p, ns, err)
	}
	free, total, err := rt.MemGetInfo()
	if free != 1048576-4096 || total != 1048576 || err != nil {
		t.Errorf("cudaMemGetInfo = %d, %d, %v", free, total, err)
	}
	_, _, err = rt.Malloc(1 << 20)
	if !errors.Is(err, policies.ErrOutOfMemory) || err.Error() != "cudaMalloc: cudaErrorMemoryAllocation (2)" {
		t.Errorf("cudaMalloc past the memory: %v", err)
	}
	if _, err := rt.Free(p); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Free(p)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeInvalidValue || errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("double cudaFree: %v", err)
	}
	if _, err := rt.Free(0); err != nil {
		t.Errorf("cudaFree(NULL): %v", err)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

func TestRuntimeWithoutAsync(t *testing.T) {
	rt := fakeRuntime(t, "noasync")
	if rt.HasAsync() {
		t.Fatal("HasAsync with no stream-ordered allocator")
	}
	_, _, err := rt.MallocAsync(1, 0)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeNotSupported || !strings.Contains(err.Error(), "not exported by") {
		t.Errorf("cudaMallocAsync: %v", err)
	}
	_, err = Replay(context.Background(), rt, textTrace(t, "malloc id=1 size=1\n"), Config{Policy: TargetCUDAAsync, MaxBytes: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "no stream-ordered allocator") {
		t.Errorf("cuda-async replay: %v", err)
	}
}

const multistream = `
malloc id=1 size=1000 stream=0
malloc id=2 size=3MiB stream=1
event_record event=9 stream=1
stream_wait_event event=9 stream=2
malloc id=3 size=0 stream=2
free id=2 stream=1
stream_sync stream=1
malloc id=4 size=1MiB stream=2 kind=async
event_sync event=9
free id=1
free id=99
device_sync
malloc id=5 size=8KiB kind=pinned
malloc id=6 size=64KiB kind=managed
free id=5
empty_cache
`

func TestReplayTargets(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		settings policies.Settings
		calls    map[string]int64 // by call, in the latency table
		reserved uint64
	}{
		{
			policy:   TargetCUDA,
			calls:    map[string]int64{"cudaMalloc": 3, "cudaFree": 2, "cudaFree(managed)": 0, "cudaStreamSynchronize": 1, "cudaDeviceSynchronize": 1, "cudaEventRecord": 1, "cudaStreamWaitEvent": 1, "cudaEventSynchronize": 1, "cudaMallocHost": 1, "cudaFreeHost": 1, "cudaMallocManaged": 1},
			reserved: 1000 + 3<<20,
		},
		{
			policy:   TargetCUDAAsync,
			settings: policies.Settings{"release_threshold": "max"},
			calls:    map[string]int64{"cudaMallocFromPoolAsync": 3, "cudaFreeAsync": 2, "cudaMemPoolTrimTo": 1, "cudaDeviceSynchronize": 2},
			reserved: 1000 + 3<<20,
		},
		{
			policy:   TargetCUDAAsync,
			settings: policies.Settings{"pool": "default", "release_threshold": "1MiB"},
			calls:    map[string]int64{"cudaMallocAsync": 3, "cudaFreeAsync": 2},
			reserved: 1000 + 3<<20,
		},
	} {
		t.Run(tc.policy+formatSettings(tc.settings), func(t *testing.T) {
			rt := fakeRuntime(t, "", "FAKECUDA_TOTAL=67108864")
			var log bytes.Buffer
			res, err := Replay(context.Background(), rt, textTrace(t, multistream), Config{
				Trace: "multistream", Policy: tc.policy, Settings: tc.settings, Margin: 1 << 20, CallLog: &log, SampleEvery: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Policy != tc.policy || res.Events != 16 || res.Mallocs != 4 || res.Frees != 2 || res.OOMs != 0 || res.Anomalies != 2 ||
				res.PeakRequested != tc.reserved || res.PeakReserved < tc.reserved || res.PeakPinned != 8192 || res.PeakManaged != 65536 {
				t.Errorf("result %+v", res.Result)
			}
			// The engine's anomalies, as replay sim counts them: the
			// malloc of 0 bytes and the free of an address never live.
			if !strings.HasPrefix(res.FirstAnomaly, "event 4: malloc of 0 bytes at 0x3") {
				t.Errorf("first anomaly %q", res.FirstAnomaly)
			}
			if res.MaxBytes != 64<<20-1<<20 || res.Driver.Total != 64<<20 || res.Driver.FreeAtStart != 64<<20 || res.Driver.FreeAtEnd != 64<<20 ||
				res.Driver.MinFree > 64<<20-tc.reserved {
				t.Errorf("limit %d, driver %+v", res.MaxBytes, res.Driver)
			}
			counts := map[string]int64{}
			for _, row := range res.Latency {
				counts[row.Call] += row.Count
			}
			for call, n := range tc.calls {
				if counts[call] != n {
					t.Errorf("%d %s calls, want %d (all: %v)", counts[call], call, n, counts)
				}
			}
			if lines := strings.Count(log.String(), "\n"); int64(lines) <= res.Calls { // the cleanup's calls are logged too
				t.Errorf("call log of %d lines for %d calls", lines, res.Calls)
			}
			if res.AllocTimeNS <= 0 || res.ReplayWallNS <= 0 || res.PolicyTimeNS <= 0 {
				t.Errorf("times: alloc %d wall %d policy %d", res.AllocTimeNS, res.ReplayWallNS, res.PolicyTimeNS)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d objects live at the end", n)
			}
		})
	}
}

func formatSettings(s policies.Settings) string {
	var b strings.Builder
	for k, v := range s {
		fmt.Fprintf(&b, ",%s=%s", k, v)
	}
	return b.String()
}

// TestReplayPolicyMatchesSim replays a real PyTorch trace with the pytorch
// policy on the fake device and on the simulated one: the device calls, and
// so the peak reserved bytes, must be the same.
func TestReplayPolicyMatchesSim(t *testing.T) {
	for _, name := range []string{"pytorch", "cuda"} {
		t.Run(name, func(t *testing.T) {
			if !contains(policies.Names(), name) {
				t.Skipf("no policy %s registered", name)
			}
			rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(64<<30)))
			f, err := tracefile.Open("../testdata/pytorch/train_gpt.pickle.gz", tracefile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			target := name
			res, err := Replay(context.Background(), rt, f, Config{Trace: "train_gpt", Policy: target, Sim: sim.DefaultCostModel(), RecordSeq: name == "cuda"})
			if err != nil {
				t.Fatal(err)
			}
			if res.SimPolicy != name || res.SimCostModel != sim.DefaultCostModelName || res.SimAllocTimeNS <= 0 || len(res.SimLatency) == 0 {
				t.Errorf("simulation: policy %q model %q time %d", res.SimPolicy, res.SimCostModel, res.SimAllocTimeNS)
			}
			// The same device calls, except that the simulated cuda
			// policy rounds requests up to 512 bytes.
			if d := int64(res.SimPeakReserved) - int64(res.PeakReserved); d != 0 && (name != "cuda" || d < 0 || d > 512*600) {
				t.Errorf("peak reserved %d on the device, %d simulated", res.PeakReserved, res.SimPeakReserved)
			}
			if res.OOMs != 0 || res.DeviceAllocs == 0 {
				t.Errorf("%d OOMs, %d device allocs", res.OOMs, res.DeviceAllocs)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d objects live at the end", n)
			}
			if name != "cuda" {
				return
			}
			size, slot := res.Seq.Calls()
			if int64(len(size)) != res.DeviceAllocs+res.DeviceFrees || res.Seq.Len() != len(size) {
				t.Fatalf("sequence of %d calls for %d allocs and %d frees", len(size), res.DeviceAllocs, res.DeviceFrees)
			}
			for _, timed := range []bool{false, true} {
				sr, err := rt.RunSeq(size, slot, timed)
				if err != nil || sr.Calls != int64(len(size)) || sr.WallNS <= 0 || (timed && sr.CallsNS <= 0) {
					t.Errorf("RunSeq(timed %v) = %+v, %v", timed, sr, err)
				}
				if n := live(t, rt); n != 0 {
					t.Errorf("%d objects live after the C loop", n)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestLimitNeverExceeded replays under a limit smaller than the trace's
// needs: the mallocs past it are OOMs, the replay goes on, and the device
// never holds more than the limit.
func TestLimitNeverExceeded(t *testing.T) {
	text := "malloc id=1 size=600KiB\nmalloc id=2 size=600KiB\nmalloc id=3 size=100KiB\nfree id=1\nmalloc id=4 size=600KiB\nfree id=2\nfree id=3\nfree id=4\n"
	for _, policy := range []string{TargetCUDA, TargetCUDAAsync} {
		t.Run(policy, func(t *testing.T) {
			rt := fakeRuntime(t, "", "FAKECUDA_TOTAL=16777216")
			res, err := Replay(context.Background(), rt, textTrace(t, text), Config{Policy: policy, MaxBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			if res.OOMs != 1 || res.FirstOOMEvent != 1 || res.FirstOOMSize != 600<<10 || res.PeakReserved > 1<<20 || res.Driver.MinFree < 15<<20 {
				t.Errorf("OOMs %d (first event %d, %d bytes), peak reserved %d, driver %+v", res.OOMs, res.FirstOOMEvent, res.FirstOOMSize, res.PeakReserved, res.Driver)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d objects live at the end", n)
			}
		})
	}
	rt := fakeRuntime(t, "", "FAKECUDA_TOTAL=16777216")
	if _, err := Replay(context.Background(), rt, textTrace(t, text), Config{Policy: TargetCUDA, MaxBytes: 32 << 20}); err == nil ||
		!strings.Contains(err.Error(), "--max-bytes 33554432 is more than the 16777216 bytes free") {
		t.Errorf("limit above the free memory: %v", err)
	}
	if _, err := Replay(context.Background(), rt, textTrace(t, text), Config{Policy: TargetCUDA, Margin: 16 << 20}); err == nil ||
		!strings.Contains(err.Error(), "not more than the margin") {
		t.Errorf("margin above the free memory: %v", err)
	}
}

// TestDeviceOOMContinues plants a cudaErrorMemoryAllocation: it is an OOM
// and the replay goes on.
func TestDeviceOOMContinues(t *testing.T) {
	rt := fakeRuntime(t, "", "FAKECUDA_FAIL=cudaMalloc:2:2")
	res, err := Replay(context.Background(), rt, textTrace(t, "malloc id=1 size=1\nmalloc id=2 size=2\nmalloc id=3 size=3\nfree id=2\nfree id=1\nfree id=3\n"), Config{Policy: TargetCUDA, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOMs != 1 || res.FirstOOMEvent != 1 || res.DeviceAllocs != 2 || res.DeviceFrees != 2 || res.Frees != 3 {
		t.Errorf("result %+v", res.Result)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

// TestErrorFreesEverything plants a failing cudaFree: the replay stops
// with an error naming the event, and everything is freed.
func TestErrorFreesEverything(t *testing.T) {
	for _, policy := range []string{TargetCUDA, TargetCUDAAsync} {
		t.Run(policy, func(t *testing.T) {
			// Open's cudaFree(NULL) is the first cudaFree.
			call, n := map[string]string{TargetCUDA: "cudaFree", TargetCUDAAsync: "cudaFreeAsync"}[policy], map[string]int{TargetCUDA: 3, TargetCUDAAsync: 2}[policy]
			rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_FAIL=%s:%d:700", call, n))
			text := "malloc id=1 size=1\nmalloc id=2 size=2 stream=3\nmalloc id=3 size=3\nfree id=1\nfree id=2\nfree id=3\n"
			_, err := Replay(context.Background(), rt, textTrace(t, text), Config{Policy: policy, MaxBytes: 1 << 20})
			if err == nil || !strings.Contains(err.Error(), "event 4: free of 0x2: ") || !strings.Contains(err.Error(), call+": cudaErrorIllegalAddress (700)") {
				t.Fatalf("got %v", err)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d objects live at the end", n)
			}
		})
	}
}

// TestInterrupt cancels the replay as on Ctrl-C: the result covers the
// events replayed (none, cancelled before the first: as when Ctrl-C comes
// while a snapshot is read; before, the first batch ran anyway and it said
// "interrupted after 256 events") and everything is freed.
func TestInterrupt(t *testing.T) {
	rt := fakeRuntime(t, "")
	var b strings.Builder
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&b, "malloc id=%d size=%d stream=%d\n", i, 100+i, i%3)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Replay(ctx, rt, textTrace(t, b.String()), Config{Policy: TargetCUDAAsync, MaxBytes: 1 << 20})
	if !errors.Is(err, context.Canceled) || res == nil || !res.Interrupted || res.Events != 0 {
		t.Fatalf("got %v, %+v", err, res)
	}
	// With the simulation alongside: it is not reported for part of a trace.
	res, err = Replay(ctx, rt, textTrace(t, b.String()), Config{Policy: "pytorch", MaxBytes: 1 << 20, Sim: sim.DefaultCostModel()})
	if !errors.Is(err, context.Canceled) || res == nil || !res.Interrupted || res.SimPolicy != "" || res.SimAllocTimeNS != 0 {
		t.Fatalf("got %v, %+v", err, res)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

// TestManagedBound checks that managed memory never goes above what is left
// under the limit, and pinned memory above its bound.
func TestManagedBound(t *testing.T) {
	rt := fakeRuntime(t, "")
	text := "malloc id=1 size=600KiB\nmalloc id=2 size=500KiB kind=managed\nmalloc id=3 size=300KiB kind=managed\nmalloc id=4 size=2KiB kind=pinned\nmalloc id=5 size=2KiB kind=pinned\nfree id=3\nfree id=5\n"
	res, err := Replay(context.Background(), rt, textTrace(t, text), Config{Policy: TargetCUDA, MaxBytes: 1 << 20, MaxPinned: 3 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.OOMs != 2 || res.FirstOOMEvent != 1 || res.PeakManaged != 300<<10 || res.PeakPinned != 2<<10 {
		t.Errorf("result %+v", res.Result)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

func TestBadSettings(t *testing.T) {
	rt := fakeRuntime(t, "")
	for _, tc := range []struct {
		policy   string
		settings policies.Settings
		want     string
	}{
		{TargetCUDA, policies.Settings{"x": "1"}, `policy cuda: unknown setting "x"`},
		{TargetCUDAAsync, policies.Settings{"pool": "mine"}, `setting pool="mine": want own or default`},
		{TargetCUDAAsync, policies.Settings{"release_threshold": "lots"}, `setting release_threshold="lots"`},
		{"no-such-policy", nil, `unknown policy "no-such-policy"`},
	} {
		_, err := Replay(context.Background(), rt, textTrace(t, "malloc id=1 size=1\n"), Config{Policy: tc.policy, Settings: tc.settings, MaxBytes: 1 << 20})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: got %v, want %q", tc.policy, tc.settings, err, tc.want)
		}
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

func TestCalibrate(t *testing.T) {
	rt := fakeRuntime(t, "", "FAKECUDA_TOTAL=1073741824", "FAKECUDA_LATENCY_NS=2000")
	var progress bytes.Buffer
	rows, err := Calibrate(context.Background(), rt, CalibrateOptions{MaxSize: 2 << 20, MaxBytes: 512 << 20, N: 5, WorkloadEvents: 3000, WakeReps: 1, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	// The workloads' replays time their large calls (calibrate_replay.go).
	timed := 0
	for _, m := range regexp.MustCompile(`(\d+) large cudaMalloc/cudaFree calls timed`).FindAllStringSubmatch(progress.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		timed += n
	}
	if timed == 0 {
		t.Errorf("no large call timed in the workloads' replays:\n%s", progress.String())
	}
	wake := map[string]int{}
	for _, r := range rows {
		if strings.HasPrefix(r.API, "wake") {
			wake[r.API]++
			if r.N != 1 || r.FirstUS != -1 || r.MedianUS < 0 || r.P90US < 0 || r.MinUS < 0 {
				t.Errorf("wake row %+v", r)
			}
		}
	}
	for _, api := range []string{sim.CostWake, sim.CostWakeNext, sim.CostWakeSuballoc, sim.CostWakeSuballocNext} {
		if wake[api] != len(sim.WakeGaps) {
			t.Errorf("%d %s rows, want %d", wake[api], api, len(sim.WakeGaps))
		}
	}
	var csv bytes.Buffer
	if err := WriteCostModel(&csv, "", rows); err != nil {
		t.Fatal(err)
	}
	m, err := sim.ParseCostModel(&csv, "calibrated")
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []string{"cudaMalloc", "cudaFree", "cudaMalloc_batch", "cudaMalloc_suballoc", "cudaFree_suballoc", "cudaMallocAsync_thr0",
		"cudaStreamSync_after_free_thrmax", "cudaMallocHost", "cudaFree_managed", "cudaDeviceSynchronize"} {
		ns, ok := m.Latency(call, 4096)
		if !ok {
			t.Errorf("no %s row", call)
			continue
		}
		spins := !strings.HasPrefix(call, "cudaStreamSync") && !strings.HasPrefix(call, "cudaDeviceSync")
		if spins && ns < 2000 {
			t.Errorf("%s: %d ns, below the fake's 2000", call, ns)
		}
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}

	// A planted failure in the middle: an error, and nothing left behind.
	rt = fakeRuntime(t, "", "FAKECUDA_FAIL=cudaFreeHost:3:1")
	if _, err := Calibrate(context.Background(), rt, CalibrateOptions{MaxSize: 64 << 10, MaxBytes: 1 << 28, N: 5, WorkloadEvents: 100}); err == nil || !strings.Contains(err.Error(), "cudaFreeHost") {
		t.Errorf("got %v", err)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

// TestCalibrateWake runs the calibration's wake-up step on a fake runtime
// with a planted wake-up of 300 us after 2 ms idle. The woken calls show it
// from 2 ms of idle on; below, only the idle times of 0.2 ms and less are
// checked for none, as on a loaded test machine a wait of 0.5 or 1 ms can
// oversleep past 2 ms. Medians of 5 (3 let two late calls on a busy
// 2-core machine wake a call that follows a woken one).
func TestCalibrateWake(t *testing.T) {
	const wakeReps = 5
	rt := fakeRuntime(t, "", "FAKECUDA_WAKE=2000000:300000")
	var progress bytes.Buffer
	rows, err := calibrate(context.Background(), rt, CalibrateOptions{MaxBytes: 512 << 20, WakeReps: wakeReps, Progress: &progress}, []string{"wake"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress:\n%s", progress.String())
	got := map[string]map[uint64]CostRow{}
	for _, r := range rows {
		if got[r.API] == nil {
			got[r.API] = map[uint64]CostRow{}
		}
		got[r.API][r.Size] = r
	}
	for _, api := range []string{sim.CostWake, sim.CostWakeNext, sim.CostWakeSuballoc, sim.CostWakeSuballocNext} {
		for _, gap := range sim.WakeGaps {
			r, ok := got[api][uint64(gap)]
			if !ok {
				t.Errorf("no %s row at %d ns", api, gap)
				continue
			}
			if r.N != wakeReps || r.FirstUS != -1 {
				t.Errorf("%+v: want n=%d, first -1", r, wakeReps)
			}
			woken := api == sim.CostWake || api == sim.CostWakeSuballoc
			switch {
			case woken && gap > 200e3 && gap < 2e6:
			case woken && gap >= 2e6:
				if r.MedianUS < 250 || r.MedianUS > 450 {
					t.Errorf("%s at %d ns: extra median %.2f us, want about 300", api, gap, r.MedianUS)
				}
			case r.MedianUS >= 100:
				t.Errorf("%s at %d ns: extra median %.2f us, want under 100", api, gap, r.MedianUS)
			}
		}
	}
	if len(rows) != 4*len(sim.WakeGaps) {
		t.Errorf("%d rows, want %d", len(rows), 4*len(sim.WakeGaps))
	}
	if n := strings.Count(progress.String(), "\n"); n != len(rows) {
		t.Errorf("%d progress lines for %d rows", n, len(rows))
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}

	// The rows written read back as a cost model (with the rows of
	// cudaMalloc and cudaFree it needs).
	var csv bytes.Buffer
	if err := WriteCostModel(&csv, "", append([]CostRow{{API: sim.CostMalloc, Size: 1, N: 1, MedianUS: 1}, {API: sim.CostFree, Size: 1, N: 1, MedianUS: 1},
		{API: sim.CostMallocSuballoc, Size: 1, N: 1, MedianUS: 1}, {API: sim.CostFreeSuballoc, Size: 1, N: 1, MedianUS: 1}}, rows...)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(csv.String(), fmt.Sprintf("\nwake,1000000,%d,-1.00,", wakeReps)) {
		t.Errorf("no wake row at 1 ms in\n%s", csv.String())
	}
	m, err := sim.ParseCostModel(&csv, "wake")
	if err != nil {
		t.Fatal(err)
	}
	if ns, ok := m.Wake(sim.CostWake, 10e6); !ok || ns < 250e3 || ns > 450e3 {
		t.Errorf("model's %s after 10 ms idle: %d ns, %v", sim.CostWake, ns, ok)
	}

	// Cancelled in the middle: an error, and nothing left behind.
	rt = fakeRuntime(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	var n int
	cancelAt := &cancelWriter{after: 15, cancel: cancel, n: &n}
	if _, err := calibrate(ctx, rt, CalibrateOptions{MaxBytes: 512 << 20, WakeReps: 1, Progress: cancelAt}, []string{"wake"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("cancelled: %d objects live at the end", n)
	}
}

// cancelWriter cancels after its after-th write.
type cancelWriter struct {
	after  int
	cancel func()
	n      *int
}

func (w *cancelWriter) Write(b []byte) (int, error) {
	if *w.n++; *w.n == w.after {
		w.cancel()
	}
	return len(b), nil
}

// sliceSource must satisfy trace.Source for the helpers above.
var _ trace.Source = trace.NewSliceSource(trace.Header{}, nil)
var _ = io.EOF

// TestRepeat repeats a replay with the C loop after each run.
func TestRepeat(t *testing.T) {
	rt := fakeRuntime(t, "", "FAKECUDA_LATENCY_NS=1000")
	var b strings.Builder
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&b, "malloc id=%d size=%d\n", i, 1000*i)
		if i > 10 {
			fmt.Fprintf(&b, "free id=%d\n", i-10)
		}
	}
	text := b.String()
	open := func() (trace.Source, io.Closer, error) {
		return textTrace(t, text), io.NopCloser(nil), nil
	}
	res, err := Repeat(context.Background(), rt, open, Config{Policy: TargetCUDA, MaxBytes: 1 << 30, Sim: sim.DefaultCostModel()}, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 3 || res.Mallocs != 300 || res.SimPolicy != "cuda" || res.SimAllocTimeNS <= 0 {
		t.Fatalf("result %+v", res)
	}
	c := res.CLoop
	if c == nil || c.Calls != 590 || c.WallNS < 590*1000 || c.TimedWallNS < 590*1000 || c.CallsNS < 590*1000 || c.HarnessWallNS <= 0 {
		t.Errorf("C loop %+v", c)
	}
	for _, r := range res.Runs {
		if r.AllocTimeNS < 590*1000 || r.CLoopWallNS < 590*1000 {
			t.Errorf("run %+v", r)
		}
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}

// TestH200Calibration reads the calibration made on an NVIDIA H200 (CUDA
// 13.0, driver 580.159) with `replay calibrate` as a cost model: its
// sub-allocation rows measured on the real snapshots hf_generate,
// hf_llama_train and multistream (--workload), not on the traces that
// `replay gpu` was compared on.
func TestH200Calibration(t *testing.T) {
	m, err := sim.LoadCostModel("testdata/h200_calibrated.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []string{sim.CostMalloc, sim.CostFree, sim.CostMallocBatch, sim.CostFreeBatch, sim.CostMallocSuballoc,
		sim.CostFreeSuballoc, sim.CostMallocNewPage, sim.CostFreeLastInPage, "cudaMallocAsync_thr0", "cudaMallocHost", "cudaDeviceSynchronize"} {
		if ns, ok := m.Latency(call, 1<<20); !ok || ns <= 0 {
			t.Errorf("%s: %d ns, %v", call, ns, ok)
		}
	}
	// The wake-up curves: a call after 50 ms idle costs far more than one
	// made back to back.
	for _, row := range []string{sim.CostWake, sim.CostWakeNext, sim.CostWakeSuballoc, sim.CostWakeSuballocNext} {
		if ns, ok := m.Wake(row, 50e6); !ok || ns < 10e3 {
			t.Errorf("%s after 50 ms: %d ns, %v", row, ns, ok)
		}
	}
}

// TestReplayEveryPolicyMatchesSim replays two real PyTorch traces with
// every registered policy on the fake device and with replay sim's engine
// on the simulated device of the same capacity: the replay on the GPU is
// that engine, so the peak reserved bytes, device calls and OOMs must be
// the same (the clairvoyant planners run from their plan, workspace resets
// at the markers, pytorch takes the recorded settings).
func TestReplayEveryPolicyMatchesSim(t *testing.T) {
	const capacity = 64 << 30
	for _, path := range []string{"../testdata/pytorch/train_gpt.pickle.gz", "../testdata/pytorch/multistream.pickle.gz"} {
		for _, name := range policies.Names() {
			t.Run(filepath.Base(path)+"/"+name, func(t *testing.T) {
				rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(capacity+DefaultMargin)))
				got, err := Replay(context.Background(), rt, openTrace(t, path), Config{Trace: path, Policy: name})
				if err != nil {
					t.Fatal(err)
				}
				want, err := sim.Run(openTrace(t, path), sim.Config{Trace: path, Policy: name, Capacity: got.MaxBytes, AsRecorded: true})
				if err != nil {
					t.Fatal(err)
				}
				w := want[0]
				if name == TargetCUDA {
					// The direct target: cudaMalloc of the requested
					// size, where the simulated policy rounds up to 512
					// bytes (TestReplayPolicyMatchesSim).
					got.PeakReserved, got.PeakAllocated = w.PeakReserved, w.PeakAllocated
				}
				if got.PeakReserved != w.PeakReserved || got.PeakAllocated != w.PeakAllocated || got.DeviceAllocs != w.DeviceAllocs ||
					got.DeviceFrees != w.DeviceFrees || got.OOMs != w.OOMs || got.Anomalies != w.Anomalies || !maps.Equal(got.Settings, w.Settings) {
					t.Errorf("on the device: reserved %d allocated %d, %d/%d device calls, %d OOMs, %d anomalies, settings %v\nsimulated:    reserved %d allocated %d, %d/%d device calls, %d OOMs, %d anomalies, settings %v",
						got.PeakReserved, got.PeakAllocated, got.DeviceAllocs, got.DeviceFrees, got.OOMs, got.Anomalies, got.Settings,
						w.PeakReserved, w.PeakAllocated, w.DeviceAllocs, w.DeviceFrees, w.OOMs, w.Anomalies, w.Settings)
				}
				if n := live(t, rt); n != 0 {
					t.Errorf("%d objects live at the end", n)
				}
			})
		}
	}
}

// TestReplayExpandableVMM replays snapshots recorded with
// expandable_segments:True with the pytorch policy on the fake device: the
// recorded settings apply, the segments are mapped through the driver's
// virtual memory calls (one cuMemMap per map of the simulation, one
// cuMemUnmap per unmap), and the figures are the simulation's.
func TestReplayExpandableVMM(t *testing.T) {
	for _, path := range []string{"../testdata/pytorch/churn_expandable.pickle.gz", "../testdata/pytorch/mlp_expandable.pickle.gz"} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(64<<30)))
			got, err := Replay(context.Background(), rt, openTrace(t, path), Config{Trace: path, Policy: "pytorch"})
			if err != nil {
				t.Fatal(err)
			}
			want, err := sim.Run(openTrace(t, path), sim.Config{Trace: path, Policy: "pytorch", Capacity: got.MaxBytes, AsRecorded: true})
			if err != nil {
				t.Fatal(err)
			}
			w := want[0]
			if got.Settings["expandable_segments"] != "true" && got.Settings["expandable_segments"] != "True" {
				t.Errorf("settings %v: the recorded expandable_segments not applied", got.Settings)
			}
			counts := map[string]int64{}
			for _, row := range got.Latency {
				counts[row.Call] += row.Count
			}
			if counts["cuMemMap"] != w.DeviceAllocs || counts["cuMemUnmap"] != w.DeviceFrees || counts["cudaMalloc"] != 0 || counts["cuMemAddressReserve"] == 0 {
				t.Errorf("calls %v; simulated %d maps, %d unmaps", counts, w.DeviceAllocs, w.DeviceFrees)
			}
			if got.PeakReserved != w.PeakReserved || got.PeakAllocated != w.PeakAllocated || got.DeviceAllocs != w.DeviceAllocs ||
				got.DeviceFrees != w.DeviceFrees || got.OOMs != w.OOMs || !maps.Equal(got.Settings, w.Settings) {
				t.Errorf("on the device: reserved %d allocated %d, %d/%d device calls, %d OOMs, settings %v\nsimulated:    reserved %d allocated %d, %d/%d, %d, %v",
					got.PeakReserved, got.PeakAllocated, got.DeviceAllocs, got.DeviceFrees, got.OOMs, got.Settings,
					w.PeakReserved, w.PeakAllocated, w.DeviceAllocs, w.DeviceFrees, w.OOMs, w.Settings)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d objects live at the end", n)
			}
		})
	}
}

// openTrace opens the trace at path, closed at the end of the test.
func openTrace(t *testing.T, path string) *tracefile.File {
	t.Helper()
	f, err := tracefile.Open(path, tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestVMMFailures plants failures of the driver's virtual memory calls in a
// replay of an expandable snapshot: a failing cuMemSetAccess ends the
// replay with an error naming that call and the event; an out-of-memory
// cuMemCreate makes the pytorch policy free its cache and retry, and the
// replay goes on; everything is freed either way.
func TestVMMFailures(t *testing.T) {
	path := "../testdata/pytorch/churn_expandable.pickle.gz"
	rt := fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(64<<30)), "FAKECUDA_FAIL=cuMemSetAccess:2:700")
	_, err := Replay(context.Background(), rt, openTrace(t, path), Config{Trace: path, Policy: "pytorch"})
	if err == nil || !strings.Contains(err.Error(), "cuMemSetAccess: ") || !strings.HasPrefix(err.Error(), "event ") {
		t.Errorf("failing cuMemSetAccess: %v", err)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live after the error", n)
	}
	rt = fakeRuntime(t, "", fmt.Sprintf("FAKECUDA_TOTAL=%d", uint64(64<<30)), "FAKECUDA_FAIL=cuMemCreate:2:2")
	res, err := Replay(context.Background(), rt, openTrace(t, path), Config{Trace: path, Policy: "pytorch"})
	if err != nil || res.AllocRetries+res.OOMs == 0 {
		t.Errorf("out-of-memory cuMemCreate: %v, %d retries, %d OOMs", err, res.AllocRetries, res.OOMs)
	}
	if n := live(t, rt); n != 0 {
		t.Errorf("%d objects live at the end", n)
	}
}
