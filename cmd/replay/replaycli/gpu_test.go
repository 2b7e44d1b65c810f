package replaycli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/gpu"
	"github.com/gpualloc/allocsim/sim"
)

const (
	trainGPT    = "../../../testdata/pytorch/train_gpt.pickle.gz"
	multistream = "../../../testdata/pytorch/multistream.pickle.gz"
)

// fakeCUDA builds the fake CUDA runtime of package gpu's tests into the
// test's directory, configured by env (read at its first call).
func fakeCUDA(t *testing.T, env ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler to build the fake CUDA runtime: %v", err)
	}
	lib := filepath.Join(t.TempDir(), "libcudart.so")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, "../../../gpu/testdata/fakecudart.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake CUDA runtime: %v\n%s", err, out)
	}
	for _, k := range []string{"FAKECUDA_TOTAL", "FAKECUDA_LATENCY_NS", "FAKECUDA_FAIL"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	return lib
}

func TestGPUNoRuntime(t *testing.T) {
	_, _, err := runCmd(t, "gpu", "--cudart", "/nonexistent/libcudart.so", trainGPT)
	if err == nil || !strings.HasPrefix(err.Error(), "no CUDA runtime found (tried: /nonexistent/libcudart.so: cannot open shared object file") {
		t.Errorf("got %v", err)
	}
	_, _, err = runCmd(t, "calibrate", "--cudart", "/nonexistent/libcudart.so")
	if err == nil || !strings.HasPrefix(err.Error(), "no CUDA runtime found") {
		t.Errorf("calibrate: got %v", err)
	}
}

func TestGPUFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gpu", "--policy", "nope", trainGPT}, `--policy: unknown policy "nope"`},
		{[]string{"gpu", "--set", "nope.x=1", trainGPT}, `unknown policy "nope"`},
		{[]string{"gpu", "--set", "cuda-async", trainGPT}, `want NAME.key=value`},
		{[]string{"gpu", "--max-bytes", "lots", trainGPT}, `--max-bytes`},
		{[]string{"gpu"}, `no trace given`},
		{[]string{"calibrate", "extra"}, `unexpected arguments`},
		{[]string{"gpu", "--repeat", "0", trainGPT}, `--repeat 0: must be at least 1`},
		{[]string{"calibrate", "--n", "-2"}, `--n -2: must be at least 1`},
		{[]string{"calibrate", "--workload-events", "0"}, `--workload-events 0: must be at least 1`},
		{[]string{"calibrate", "--wake-reps", "0"}, `--wake-reps 0: must be at least 1`},
		{[]string{"gpu", "--sim-only", "--plots", "x", trainGPT}, `--sim-only with --plots: a simulation alone writes the table, --json and --csv`},
		{[]string{"gpu", "--pace", "--c-loop", trainGPT}, `--pace with --c-loop`},
	} {
		if _, _, err := runCmd(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestGPUReplay replays a real trace on the fake runtime against the two
// direct targets and the pytorch policy, with the C loop and a call log.
func TestGPUReplay(t *testing.T) {
	lib := fakeCUDA(t, "FAKECUDA_TOTAL=68719476736")
	dir := t.TempDir()
	js, calls := filepath.Join(dir, "r.json"), filepath.Join(dir, "calls.csv")
	targets := "cuda,cuda-async,pytorch"
	_, _, err := runCmd(t, "gpu", "--cudart", lib, "--policy", targets, "--set", "cuda-async.release_threshold=max",
		"--c-loop", "--calls", calls, "--json", js, trainGPT)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Results []gpu.Result }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	want := strings.Split(targets, ",")
	if len(doc.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(doc.Results), len(want))
	}
	for i, r := range doc.Results {
		if r.Policy != want[i] || r.Mallocs != 8834 || r.OOMs != 0 || r.AllocTimeNS <= 0 || len(r.Latency) == 0 || r.Device != "Fake CUDA Device" {
			t.Errorf("%s: %+v", want[i], r.Result)
		}
		if r.Policy != "cuda-async" && (r.SimPolicy != r.Policy || r.SimAllocTimeNS <= 0) {
			t.Errorf("%s: simulated %q, %d ns", r.Policy, r.SimPolicy, r.SimAllocTimeNS)
		}
		if r.Policy == "pytorch" && (r.PeakReserved != r.SimPeakReserved || r.DeviceAllocs != 125) {
			t.Errorf("pytorch: peak reserved %d, simulated %d, %d device allocs", r.PeakReserved, r.SimPeakReserved, r.DeviceAllocs)
		}
		if (r.CLoop != nil) != (r.Policy == "cuda") {
			t.Errorf("%s: C loop %+v", r.Policy, r.CLoop)
		}
		if r.Driver.FreeAtEnd != r.Driver.FreeAtStart {
			t.Errorf("%s: %d bytes free at the start, %d at the end", r.Policy, r.Driver.FreeAtStart, r.Driver.FreeAtEnd)
		}
	}
	if c := doc.Results[0].CLoop; c == nil || c.Calls != 8834+8831 || c.WallNS <= 0 {
		t.Errorf("C loop %+v", c)
	}

	for _, target := range want {
		if _, err := os.Stat(filepath.Join(dir, "calls-train_gpt-"+target+".csv")); err != nil {
			t.Error(err)
		}
	}

	// A failing replay leaves no call log.
	failedLog := filepath.Join(dir, "failed.csv")
	if _, _, err := runCmd(t, "gpu", "--cudart", lib, "--calls", failedLog, filepath.Join(dir, "missing.trace")); err == nil {
		t.Error("replay of a missing trace: no error")
	}
	if _, err := os.Stat(failedLog); !os.IsNotExist(err) {
		t.Errorf("call log of a failed replay: %v", err)
	}

	// The table form, repeated.
	out, _, err := runCmd(t, "gpu", "--cudart", lib, "--policy", "cuda", "--c-loop", "--repeat", "3", multistream)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"sim/measured", "measured latency by call", "cudaMalloc", "driver: cudaMemGetInfo free", "C loop of the same", "3 runs, allocator ms:"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}

// TestCalibrateOnTraces calibrates the sub-allocation costs on a given
// trace instead of the synthetic workloads, and refuses a bad one before
// touching the GPU.
func TestCalibrateOnTraces(t *testing.T) {
	lib := fakeCUDA(t, "FAKECUDA_TOTAL=4294967296", "FAKECUDA_LATENCY_NS=3000")
	model := filepath.Join(t.TempDir(), "model.csv")
	_, stderr, err := runCmd(t, "calibrate", "--cudart", lib, "-o", model, "--max-size", "64MiB", "--n", "5", "--wake-reps", "1", "--workload", multistream)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "workload "+multistream+": ") || strings.Contains(stderr, "workload synth") {
		t.Errorf("progress does not show the trace as the only workload:\n%s", stderr)
	}
	m, err := sim.LoadCostModel(model)
	if err != nil {
		t.Fatal(err)
	}
	if ns, ok := m.Latency(sim.CostMallocSuballoc, 512); !ok || ns < 3000 {
		t.Errorf("calibrated %s of 512 B: %d ns (row present: %v)", sim.CostMallocSuballoc, ns, ok)
	}
	bad := filepath.Join(t.TempDir(), "bad.trace")
	if err := os.WriteFile(bad, []byte("not a trace"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCmd(t, "calibrate", "--cudart", lib, "-o", model, "--workload", bad)
	if err == nil || !strings.Contains(err.Error(), "--workload: "+bad) {
		t.Errorf("bad workload: %v", err)
	}
}

// TestCalibrateThenSimulate calibrates on the fake runtime and simulates
// with the cost model it wrote.
func TestCalibrateThenSimulate(t *testing.T) {
	lib := fakeCUDA(t, "FAKECUDA_TOTAL=4294967296", "FAKECUDA_LATENCY_NS=3000")
	model := filepath.Join(t.TempDir(), "model.csv")
	if _, _, err := runCmd(t, "calibrate", "--cudart", lib, "-o", model, "--max-size", "64MiB", "--n", "5", "--wake-reps", "1", "--workload-events", "2000", "--quiet"); err != nil {
		t.Fatal(err)
	}
	m, err := sim.LoadCostModel(model)
	if err != nil {
		t.Fatal(err)
	}
	if ns, _ := m.Latency("cudaMalloc", 1<<20); ns < 3000 {
		t.Errorf("calibrated cudaMalloc of 1 MiB: %d ns", ns)
	}
	out, _, err := runCmd(t, "gpu", "--sim-only", "--cost-model", model, "--policy", "cuda", trainGPT)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "no wake-ups (cost model "+model+")") || !strings.Contains(out, "simulated latency by call") {
		t.Errorf("output:\n%s", out)
	}
}

func TestSimOnlyCSV(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sim.csv")
	_, stderr, err := runCmd(t, "gpu", "--sim-only", "--pace", "--csv", out, "--policy", "cuda,cuda-async", trainGPT)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "cuda-async has no simulated policy; left out") {
		t.Errorf("stderr %q does not say cuda-async is left out", stderr)
	}
	rows := readCSV(t, out)
	if len(rows) != 2 {
		t.Fatalf("%d CSV rows, want a header and cuda's", len(rows))
	}
	col := map[string]string{}
	for i, h := range rows[0] {
		col[h] = rows[1][i]
	}
	// train_gpt on the cuda policy under the embedded model, paced: the
	// figures of replay sim.
	if col["policy"] != "cuda" || col["sim_alloc_time_ns"] != "584042900" || col["sim_wake_time_ns"] != "11620408" {
		t.Errorf("policy %s, sim_alloc_time_ns %s, sim_wake_time_ns %s; want cuda, 584042900, 11620408", col["policy"], col["sim_alloc_time_ns"], col["sim_wake_time_ns"])
	}
}

// TestSimOnlyMatchesSim: replay gpu --sim-only is replay sim's engine, so
// every policy has the same peak reserved bytes, device calls and OOMs as
// in replay sim (only the cost model's wake-ups differ, unpaced), and
// --policy all runs the clairvoyant planners too.
func TestSimOnlyMatchesSim(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{trainGPT, multistream} {
		simJSON, gpuJSON := filepath.Join(dir, "sim.json"), filepath.Join(dir, "gpu.json")
		if _, _, err := runCmd(t, "sim", "--policy", "all", "--json", simJSON, path); err != nil {
			t.Fatal(err)
		}
		if _, _, err := runCmd(t, "gpu", "--sim-only", "--policy", "all", "--json", gpuJSON, path); err != nil {
			t.Fatal(err)
		}
		want, got := readResults(t, simJSON), map[string]sim.Result{}
		for _, r := range readResults(t, gpuJSON) {
			got[r.Policy] = r
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d results from --sim-only, %d from sim", path, len(got), len(want))
		}
		for _, w := range want {
			g := got[w.Policy]
			if g.Policy != w.Policy || g.PeakReserved != w.PeakReserved || g.DeviceAllocs != w.DeviceAllocs || g.DeviceFrees != w.DeviceFrees || g.OOMs != w.OOMs {
				t.Errorf("%s: --sim-only %s: reserved %d, %d/%d device calls, %d OOMs; sim %s: %d, %d/%d, %d",
					path, g.Policy, g.PeakReserved, g.DeviceAllocs, g.DeviceFrees, g.OOMs, w.Policy, w.PeakReserved, w.DeviceAllocs, w.DeviceFrees, w.OOMs)
			}
		}
	}
}

// TestSimOnlyCapacity: --sim-only --max-bytes simulates the limit a replay
// on the GPU would hold to, as replay sim --capacity does (split_frag_oom
// under its recorded cap: pytorch's one OOM and retry); a setting the
// direct target does not take is refused as replay gpu refuses it.
func TestSimOnlyCapacity(t *testing.T) {
	dir := t.TempDir()
	simJSON, gpuJSON := filepath.Join(dir, "sim.json"), filepath.Join(dir, "gpu.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch,bfc", "--capacity", "4194304000", "--json", simJSON, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "gpu", "--sim-only", "--policy", "pytorch,bfc", "--max-bytes", "4194304000", "--pace", "--json", gpuJSON, splitFragOOM); err != nil {
		t.Fatal(err)
	}
	want, got := readResults(t, simJSON), readResults(t, gpuJSON)
	for k, w := range want {
		g := got[k]
		if g.PeakReserved != w.PeakReserved || g.OOMs != w.OOMs || g.AllocRetries != w.AllocRetries || g.Capacity != 4194304000 {
			t.Errorf("%s: --sim-only reserved %d, %d OOMs, %d retries, capacity %d; sim %d, %d, %d", w.Policy, g.PeakReserved, g.OOMs, g.AllocRetries, g.Capacity, w.PeakReserved, w.OOMs, w.AllocRetries)
		}
	}
	if w := want[0]; w.Policy != "pytorch" || w.OOMs != 1 || w.AllocRetries != 1 {
		t.Errorf("sim: %+v", w)
	}
	_, _, err := runCmd(t, "gpu", "--sim-only", "--policy", "cuda", "--set", "cuda.granularity=2MiB", trainGPT)
	if err == nil || !strings.Contains(err.Error(), `unknown setting "granularity"`) {
		t.Errorf("a setting of the cuda target: %v", err)
	}
}

// TestGPUCallLogsOfOneName: two traces of one file name get a call log
// each (the second's numbered), not one over the other.
func TestGPUCallLogsOfOneName(t *testing.T) {
	lib := fakeCUDA(t, "FAKECUDA_TOTAL=68719476736")
	dir := t.TempDir()
	data, err := os.ReadFile(multistream)
	if err != nil {
		t.Fatal(err)
	}
	var traces []string
	for _, d := range []string{"a", "b"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
		p := filepath.Join(dir, d, "multistream.pickle.gz")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		traces = append(traces, p)
	}
	calls := filepath.Join(dir, "c.csv")
	if _, _, err := runCmd(t, append([]string{"gpu", "--cudart", lib, "--policy", "cuda", "--calls", calls, "--json", filepath.Join(dir, "r.json")}, traces...)...); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"c-multistream-cuda.csv", "c-multistream-cuda-2.csv"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}
