package sim_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// TestFidelityXSpace replays the XSpaces of two JAX runs (testdata/jax/xspace)
// as recorded under bfc with the run's settings: an XSpace records no
// device call (trace.UnrecordedSegments), so there is nothing to diverge
// from, and the figures agree with the run's memory_stats() in NAME.json
// (peak in use, peak pool bytes, num_allocs) and with those BFC's events
// record (peak_bytes_in_use, the count of MemoryAllocation events). Under
// allow_growth, the preallocated run's pool is not the replay's.
func TestFidelityXSpace(t *testing.T) {
	dir := filepath.Join("..", "testdata", "jax", "xspace")
	for _, tc := range []struct {
		name, growth string
		mallocs      int64
		diff         string // the first figure that differs, "" for none
	}{
		{"train.bfc", "false", 1377, ""},
		{"attn.growth", "true", 1963, ""},
		{"train.bfc", "true", 1377, "peak reserved bytes: real allocator 112583507968, simulation "},
	} {
		t.Run(tc.name+" allow_growth="+tc.growth, func(t *testing.T) {
			f, err := tracefile.Open(filepath.Join(dir, tc.name+".xplane.pb.gz"), tracefile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h := f.Header()
			settings := policies.Settings{"allow_growth": tc.growth, "memory_limit": "112583507968"}
			rep, err := sim.Fidelity(f, sim.Config{Policy: "bfc", Settings: settings})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Divergence != nil || rep.Calls != 0 || rep.Mallocs != tc.mallocs {
				t.Fatalf("divergence %v, %d device calls, %d mallocs; want none, 0, %d", rep.Divergence, rep.Calls, rep.Mallocs, tc.mallocs)
			}
			measured, err := sim.ReadMeasured(filepath.Join(dir, tc.name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			recorded := sim.RecordedMeasured(h)
			if recorded == nil || *recorded.Mallocs != tc.mallocs || *recorded.Allocated != *measured.Allocated || recorded.Reserved != nil {
				t.Fatalf("recorded figures %+v; want %d mallocs, peak allocated %d as measured, no peak reserved", recorded, tc.mallocs, *measured.Allocated)
			}
			diffs := sim.CompareMeasured(rep, measured)
			if tc.diff == "" {
				if len(diffs) > 0 || len(sim.CompareMeasured(rep, recorded)) > 0 {
					t.Errorf("figures differ: %q, %q", diffs, sim.CompareMeasured(rep, recorded))
				}
				return
			}
			if len(diffs) == 0 || !strings.HasPrefix(diffs[0], tc.diff) {
				t.Errorf("figures that differ: %q, want first %q...", diffs, tc.diff)
			}
		})
	}
}

// TestRecordedMeasured: the figures a trace's header records, and none
// from a header without them.
func TestRecordedMeasured(t *testing.T) {
	m := sim.RecordedMeasured(trace.Header{Metadata: map[string]string{"recorded_peak_allocated_bytes": "388236544", "recorded_mallocs": "1377"}})
	if m == nil || *m.Allocated != 388236544 || *m.Mallocs != 1377 || m.Reserved != nil || m.Cap != 0 {
		t.Errorf("RecordedMeasured = %+v, want peak allocated 388236544, 1377 mallocs", m)
	}
	if m := sim.RecordedMeasured(trace.Header{Metadata: map[string]string{"recorded_mallocs": "many"}}); m != nil {
		t.Errorf("RecordedMeasured of no figures = %+v, want nil", m)
	}
}
