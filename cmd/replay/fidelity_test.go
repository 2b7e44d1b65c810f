package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFidelity is the project's regression suite against real allocators:
// every PyTorch snapshot in testdata/pytorch and in the shared trace
// collection (../../shared/traces, or $ALLOCSIM_TRACES, when present)
// replayed as recorded under the cap it was recorded with must be
// identical to its recording, device call by device call and placement by
// placement.
func TestFidelity(t *testing.T) {
	var snaps []string
	dirs := []string{filepath.Join("..", "..", "testdata", "pytorch")}
	shared := os.Getenv("ALLOCSIM_TRACES")
	if shared == "" {
		shared = filepath.Join("..", "..", "..", "shared", "traces")
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
			if err != nil || !strings.Contains(out, ": identical (") {
				t.Errorf("replay fidelity: %v\n%s%s", err, out, errOut)
			}
			t.Log(strings.TrimSpace(out))
		})
	}
}

// TestFidelityDiverges: a recording replayed under another cap than its
// own takes another path, and fidelity says where, and fails.
func TestFidelityDiverges(t *testing.T) {
	out, _, err := runCmd(t, "fidelity", "../../testdata/pytorch/churn_oom.pickle.gz")
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
