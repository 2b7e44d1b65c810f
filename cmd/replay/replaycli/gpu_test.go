package replaycli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/gpu"
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
	for _, s := range []string{"sim/measured", "measured latency by call", "cudaMalloc", "driver: cudaMemGetInfo free", "C loop of the same", "3 runs, allocator ms:", "over the runs"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}

// TestSimOverRuns checks the spread of simulated over measured that the
// table prints beside the runs: 100 ns simulated against runs of 80, 125
// and 100 ns is 0.80 to 1.25.
func TestSimOverRuns(t *testing.T) {
	r := &gpu.Result{Runs: []gpu.Run{{AllocTimeNS: 80}, {AllocTimeNS: 125}, {AllocTimeNS: 100}}}
	r.SimAllocTimeNS = 100
	lo, hi, ok := simOverRuns(r)
	if !ok || lo != 0.8 || hi != 1.25 {
		t.Errorf("simOverRuns = %v, %v, %v; want 0.8, 1.25, true", lo, hi, ok)
	}
	r.Runs[1].AllocTimeNS = 0
	if _, _, ok := simOverRuns(r); ok {
		t.Error("a run that measured no allocator time: ok")
	}
	r.Runs[1].AllocTimeNS, r.SimAllocTimeNS = 125, 0
	if _, _, ok := simOverRuns(r); ok {
		t.Error("not simulated alongside: ok")
	}
}
