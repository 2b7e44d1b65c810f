package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
