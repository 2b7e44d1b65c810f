package replaycli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results/tables"
)

// fidelityPending are the recordings whose replay parts from the real
// allocator's for want of a rule not modelled yet (issue 14), with the
// first difference fidelity reports: the test fails when it changes, so
// that the list follows the model.
var fidelityPending = map[string]string{}

// TestFidelity is the project's regression suite against real allocators:
// every PyTorch snapshot in testdata/pytorch and in the shared trace
// collection (../../shared/traces, or $ALLOCSIM_TRACES, when present)
// replayed as recorded under the cap it was recorded with must be
// identical to its recording, device call by device call and placement by
// placement, and give the real allocator's peaks and counters (its
// stats.json); those of fidelityPending must differ as listed there.
func TestFidelity(t *testing.T) {
	var snaps []string
	dirs := []string{filepath.Join("..", "..", "..", "testdata", "pytorch")}
	shared := os.Getenv("ALLOCSIM_TRACES")
	if shared == "" {
		shared = filepath.Join("..", "..", "..", "..", "shared", "traces")
	}
	for _, sub := range []string{"pytorch", "pytorch_cases"} {
		dirs = append(dirs, filepath.Join(shared, sub))
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, "*.pickle.gz"))
		for _, p := range m {
			if base := filepath.Base(p); !seen[base] {
				seen[base] = true
				snaps = append(snaps, p)
			}
		}
	}
	if len(snaps) == 0 {
		t.Fatal("no snapshots found")
	}
	for _, snap := range snaps {
		name := strings.TrimSuffix(filepath.Base(snap), ".pickle.gz")
		t.Run(name, func(t *testing.T) {
			if fi, err := os.Stat(snap); err == nil && fi.Size() > 1<<20 && testing.Short() {
				t.Skip("a large snapshot (seconds to import) in -short mode")
			}
			raw, err := os.ReadFile(strings.TrimSuffix(snap, ".pickle.gz") + ".stats.json")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Cap uint64 `json:"mem_cap_bytes"`
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatal(err)
			}
			out, errOut, err := runCmd(t, "fidelity", "--capacity", strconv.FormatUint(st.Cap, 10), snap)
			if want, ok := fidelityPending[name]; ok {
				if err == nil || strings.TrimSpace(out) != want {
					t.Errorf("replay fidelity: %v\n%s%s\nwant (pending, issue 14):\n%s", err, out, errOut, want)
				}
				return
			}
			if err != nil || !strings.Contains(out, ": identical (") || !strings.Contains(out, "peaks and counters as measured in "+name+".stats.json") {
				t.Errorf("replay fidelity: %v\n%s%s", err, out, errOut)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
}

// TestFidelityDiverges: a recording replayed under another cap than its
// own takes another path, and fidelity says where, and fails.
func TestFidelityDiverges(t *testing.T) {
	out, _, err := runCmd(t, "fidelity", "--capacity", "0", "../../../testdata/pytorch/churn_oom.pickle.gz")
	const want = "churn_oom.pickle.gz: diverges at event 180: real allocator: no device call; simulation: segment_alloc of 127926272 bytes at "
	if err == nil || !strings.Contains(err.Error(), "1 of 1 traces diverge") || !strings.HasPrefix(out, want) {
		t.Errorf("replay fidelity without the cap: %v\n%s\nwant %s...", err, out, want)
	}
	if _, _, err := runCmd(t, "fidelity"); err == nil {
		t.Errorf("replay fidelity without a trace: no error")
	}
	if _, _, err := runCmd(t, "fidelity", "--capacity", "lots", splitFragOOM); err == nil || !strings.Contains(err.Error(), "--capacity") {
		t.Errorf("replay fidelity --capacity lots: %v, want an error naming --capacity", err)
	}
}

// TestFidelityCounters: the same device calls with other counters than the
// real allocator's measured figures (a planted difference of one retry in
// a copy of churn_maxsplit's stats.json) fail, naming the counter and the
// events of the simulation's retries; without a stats.json beside it, a
// trace is compared by its device calls only, and says so.
func TestFidelityCounters(t *testing.T) {
	dir := t.TempDir()
	src := "../../../testdata/pytorch/churn_maxsplit"
	snap, err := os.ReadFile(src + ".pickle.gz")
	if err != nil {
		t.Fatal(err)
	}
	var stats map[string]any
	raw, err := os.ReadFile(src + ".stats.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &stats); err != nil {
		t.Fatal(err)
	}
	ms := stats["memory_stats"].(map[string]any)
	if ms["num_alloc_retries"].(float64) != 3 {
		t.Fatalf("churn_maxsplit's num_alloc_retries = %v, want 3", ms["num_alloc_retries"])
	}
	ms["num_alloc_retries"] = 4
	planted, _ := json.Marshal(stats)
	path := filepath.Join(dir, "planted.pickle.gz")
	if err := os.WriteFile(path, snap, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "planted.stats.json"), planted, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "fidelity", path)
	const want = "planted.pickle.gz: same device calls and placements, but figures differ from the real allocator's (planted.stats.json; policy pytorch):\n" +
		"planted.pickle.gz:   retries: real allocator 4, simulation 3 (at events "
	if err == nil || !strings.HasPrefix(out, want) {
		t.Errorf("replay fidelity with one retry planted: %v\n%s\nwant %s...", err, out, want)
	}
	os.Remove(filepath.Join(dir, "planted.stats.json"))
	out, _, err = runCmd(t, "fidelity", "--capacity", strconv.FormatFloat(stats["mem_cap_bytes"].(float64), 'f', 0, 64), path)
	if err != nil || !strings.Contains(out, "identical (") || !strings.Contains(out, "no measured figures beside it") {
		t.Errorf("replay fidelity without a stats.json: %v\n%s", err, out)
	}
}

// TestPrivatePoolWarning: `replay sim` on a snapshot whose mallocs went to
// private pools (a CUDA graph capture, torch.compile's cudagraph trees)
// places them in the pytorch policy's private pools, without a warning; a
// policy that keeps no private pools warns on stderr and in the JSON that
// it placed them with the others, naming the pools and counting their
// mallocs. A snapshot without private pools gets no such warning.
func TestPrivatePoolWarning(t *testing.T) {
	for _, tc := range []struct{ name, pools string }{
		{"graph_step", "(1,0): 30 mallocs"}, {"serve_graphs", "(0,1): 14 mallocs"}, {"compile_ro", "(0,1): 571 mallocs"}, {"train_gpt", ""},
	} {
		js := filepath.Join(t.TempDir(), "out.json")
		_, errOut, err := runCmd(t, "sim", "--policy", "pytorch,best-fit", "--json", js, "../../../testdata/pytorch/"+tc.name+".pickle.gz")
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, errOut)
		}
		want := "best-fit: warning: the best-fit policy keeps no private pools: the trace's mallocs into private pools (a CUDA graph capture's or a MemPool's; " + tc.pools + ") were placed with the others"
		if got := strings.Contains(errOut, want); got != (tc.pools != "") || strings.Contains(errOut, "pytorch: warning") {
			t.Errorf("%s: stderr %q, want the warning %q: %v", tc.name, errOut, want, tc.pools != "")
		}
		raw, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Results []struct {
				Policy       string   `json:"policy"`
				PrivatePools string   `json:"private_pools"`
				Warnings     []string `json:"warnings"`
			} `json:"results"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		for _, r := range doc.Results {
			want := ""
			if r.Policy == "best-fit" {
				want = tc.pools
			}
			if r.PrivatePools != want || (want != "") != (len(r.Warnings) > 0) {
				t.Errorf("%s, %s: private_pools %q, warnings %q; want pools %q", tc.name, r.Policy, r.PrivatePools, r.Warnings, want)
			}
		}
	}
}

// TestUnnamedPoolWarning: on the MemPool recording, whose pools were
// deleted before the dump (no segment_pool_id names them), the importer
// finds the three pools from the order of their release; the pytorch
// policy keeps them apart without a warning, best-fit warns that it
// placed their mallocs with the others, naming each pool by the trace
// entry it was deleted before.
func TestUnnamedPoolWarning(t *testing.T) {
	js := filepath.Join(t.TempDir(), "out.json")
	_, errOut, err := runCmd(t, "sim", "--policy", "pytorch,best-fit", "--json", js, "../../../testdata/pytorch/mempool.pickle.gz")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	const want = "mempool.pickle.gz: best-fit: warning: the best-fit policy keeps no private pools: the trace's mallocs into private pools (a CUDA graph capture's or a MemPool's; unnamed1-released-at-entry-142: 32 mallocs, unnamed2-released-at-entry-309: 32 mallocs, unnamed3-released-at-entry-477: 32 mallocs) were placed with the others\n"
	if !strings.HasSuffix(errOut, want) || strings.Count(errOut, "warning") != 1 {
		t.Errorf("stderr %q, want only %q", errOut, want)
	}
}

// TestWriteWarnings: a warning every result of a trace has is printed once
// for the trace; one of some policies once, naming them all, also when the
// text names each policy; one that names its policy keeps its name.
func TestWriteWarnings(t *testing.T) {
	rs := []*sim.Result{
		{Trace: "a", Policy: "p", Warnings: []string{"all", "some", "the p policy keeps x"}},
		{Trace: "a", Policy: "q", Warnings: []string{"all", "the q policy keeps x"}},
		{Trace: "a", Policy: "r", Warnings: []string{"some", "all", "the r policy keeps y"}},
		{Trace: "b", Policy: "p", Warnings: []string{"some", "the p policy keeps x"}},
	}
	var b strings.Builder
	if n := tables.Warnings(&b, rs); n != 6 {
		t.Errorf("%d lines", n)
	}
	const want = "a: warning: all\na: p, r: warning: some\na: p, q: warning: the p, q policies keep x\na: r: warning: the r policy keeps y\nb: warning: some\nb: p: warning: the p policy keeps x\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestFidelityAnomalies: a recording with an event the replay cannot make
// (here a free of an address no malloc gave, put into a real CuPy log) is
// not "identical": fidelity names the event and fails.
func TestFidelityAnomalies(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "cupy", "linalg.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(raw), "\n")
	bad := strings.Join(lines[:10], "") + `{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":1000000000,"pmem_id":"0x1"}` + "\n" + strings.Join(lines[10:], "")
	path := filepath.Join(t.TempDir(), "unknown_free.jsonl")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "fidelity", path)
	const want = "unknown_free.jsonl: 1 event(s) could not be replayed as recorded (first: event 10: free of unknown address 0x3b9aca00): not a whole recording of the allocator (policy cupy)\n"
	if err == nil || out != want {
		t.Errorf("fidelity: %v, output %q, want %q", err, out, want)
	}
}

// TestFidelityNoRecordedAllocator: a MiniMalloc problem or a text trace
// records no allocator's decisions; fidelity says so (it said "diverges at
// event 0: real allocator: no device call") and fails, as nothing was
// compared.
func TestFidelityNoRecordedAllocator(t *testing.T) {
	for _, path := range []string{"../../../testdata/plan/tiny.problem.csv", "../../../testdata/plan/tiny.trace"} {
		out, _, err := runCmd(t, "fidelity", path)
		var ec interface{ ExitCode() int }
		if err == nil || errors.As(err, &ec) || out != "" || !strings.Contains(err.Error(), path+": no real allocator recorded: a ") {
			t.Errorf("fidelity %s: %v output %q; want the error \"no real allocator recorded\" (exit 1)", path, err, out)
		}
	}
}
