package replaycli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
)

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
