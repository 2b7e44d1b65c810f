package sim_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// noFiguresText is what ReadMeasured says a file without figures lacks.
const noFiguresText = ": no figure to compare: it has none of max_memory_reserved, max_memory_allocated, " +
	"memory_stats' num_device_alloc, num_device_free, num_alloc_retries or num_ooms (PyTorch), " +
	"peak_bytes_in_use, peak_pool_bytes or num_allocs under stats or memory_stats (JAX), " +
	"peak_total_bytes or device_allocs (CuPy)"

// TestReadMeasuredNoFigures: a figures file that holds nothing
// CompareMeasured compares (no figures at all, only a cap, only JAX's
// memory limit, PyTorch's memory_stats without its counters, a CuPy file
// with only its OOM count) is an error naming the file and what it lacks,
// never figures that agree by comparing nothing; a malformed one names the
// byte offset, and JAX's figures under both keys must agree.
func TestReadMeasuredNoFigures(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, data, want string }{
		{"empty", `{}`, noFiguresText},
		{"null", `null`, noFiguresText},
		{"cap only", `{"mem_cap_bytes": 1073741824, "ooms_caught": 0}`, noFiguresText},
		{"jax limit only", `{"stats": {"bytes_limit": 112583507968, "bytes_in_use": 0}}`, noFiguresText},
		{"jax limit only, memory_stats", `{"memory_stats": {"bytes_limit": 112583507968}}`, noFiguresText},
		{"pytorch stats without counters", `{"memory_stats": {"active.all.peak": 55, "num_sync_all_streams": 0}}`, noFiguresText},
		{"cupy without pool figures", `{"limit_bytes": 0, "ooms_caught": 2}`, noFiguresText},
		{"syntax", `{"max_memory_reserved": 12,}`, ": byte offset 28: invalid character '}' looking for beginning of object key string"},
		{"type", `{"max_memory_reserved": "lots"}`, ": byte offset 30: json: cannot unmarshal string into Go struct field Measured.max_memory_reserved of type uint64"},
		{"jax keys disagree", `{"stats": {"peak_bytes_in_use": 10, "num_allocs": 3}, "memory_stats": {"peak_bytes_in_use": 10, "num_allocs": 4}}`,
			": stats.num_allocs 3 and memory_stats.num_allocs 4 differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "job.stats.json")
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := sim.ReadMeasured(path)
			if err == nil || err.Error() != path+tc.want {
				t.Fatalf("ReadMeasured = %+v, %v; want the error %q", m, err, path+tc.want)
			}
			if got := errors.Is(err, sim.ErrNoFigures); got != (tc.want == noFiguresText) {
				t.Errorf("errors.Is(%v, ErrNoFigures) = %v", err, got)
			}
		})
	}
}

// TestReadMeasuredJAXShapes: JAX's memory_stats() is read from under
// "stats" (as testdata/jax/record.py writes it), from under
// "memory_stats", or from both when they agree, with the same figures and
// the same settings inferred from them: each run's of testdata/jax/xspace,
// rewrapped, gives its peak in use, peak pool bytes, mallocs, XLA's
// memory limit and the preallocation (allow_growth=false where the pool
// peaked at the whole limit).
func TestReadMeasuredJAXShapes(t *testing.T) {
	src := filepath.Join("..", "testdata", "jax", "xspace")
	for _, tc := range []struct {
		name        string
		inUse, pool uint64
		mallocs     int64
		growth      string
	}{
		{"attn.bfc", 1275593216, 112583507968, 1963, "false"},
		{"attn.growth", 1342701824, 4829741056, 1963, "true"},
		{"train.bfc", 388236800, 112583507968, 1377, "false"},
		{"train.growth", 402654464, 807403520, 1377, "true"},
	} {
		raw, err := os.ReadFile(filepath.Join(src, tc.name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		stats := doc["stats"]
		shapes := map[string]map[string]any{
			"stats":        doc,
			"memory_stats": {"workload": doc["workload"], "memory_stats": stats},
			"both":         {"stats": stats, "memory_stats": stats},
		}
		for shape, d := range shapes {
			t.Run(tc.name+" under "+shape, func(t *testing.T) {
				data, _ := json.Marshal(d)
				path := filepath.Join(t.TempDir(), tc.name+".json")
				if err := os.WriteFile(path, data, 0o644); err != nil {
					t.Fatal(err)
				}
				m, err := sim.ReadMeasured(path)
				if err != nil {
					t.Fatal(err)
				}
				if m.Allocated == nil || *m.Allocated != tc.inUse || m.Reserved == nil || *m.Reserved != tc.pool ||
					m.Mallocs == nil || *m.Mallocs != tc.mallocs || m.Cap != 0 || m.MemoryStats.DeviceAllocs != nil {
					t.Errorf("figures %+v; want peak allocated %d, reserved %d, %d mallocs, no cap, no device allocations", m, tc.inUse, tc.pool, tc.mallocs)
				}
				want := policies.Settings{"allow_growth": tc.growth, "memory_limit": "112583507968"}
				if got := m.RecordedSettings("bfc"); got.Join(" ") != want.Join(" ") {
					t.Errorf("RecordedSettings(bfc) = %v, want %v", got, want)
				}
				if got := m.RecordedSettings("pytorch"); got != nil {
					t.Errorf("RecordedSettings(pytorch) = %v, want nil", got)
				}
			})
		}
	}
}
