package sim_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// The CuPy recordings of testdata/cupy (H200, CuPy 14.2.0, record.py):
// DebugPrintHook logs with the pool's real figures beside them. The log
// names no stream, so the importer puts every malloc on stream 0; but
// churn and churn_limit made one array in four on a side stream, and CuPy
// keeps the free chunks of each stream apart. NAME.streams (streams.py)
// gives the stream of every malloc line, recovered from the workload's
// own seeded random numbers and checked against every malloc's size and
// the order of every malloc and free in the log. With it, the cupy policy
// redoes the recording exactly: every device allocation, every placement,
// the peak total_bytes(), the device allocs and the OOMs.

// cupyRecording reads testdata/cupy/NAME.jsonl and its measured figures;
// with streams, the stream of each malloc from NAME.streams (a free on the
// stream of its malloc).
func cupyRecording(t *testing.T, name string, streams bool) (trace.Header, []trace.Event, *sim.Measured) {
	t.Helper()
	path := filepath.Join("..", "testdata", "cupy", name+".jsonl")
	h, evs, err := tracefile.ReadAll(path, tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := sim.ReadMeasured(filepath.Join("..", "testdata", "cupy", name+".stats.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !streams {
		return h, evs, m
	}
	sf, err := os.Open(filepath.Join("..", "testdata", "cupy", name+".streams"))
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	sc := bufio.NewScanner(sf)
	of := map[uint64]uint64{} // the stream of each live malloc, by address
	for i := range evs {
		ev := &evs[i]
		switch ev.Op {
		case trace.OpMalloc, trace.OpMallocFailed:
			if !sc.Scan() {
				t.Fatalf("%s.streams ends before event %d", name, i)
			}
			if strings.TrimSpace(sc.Text()) == "1" {
				ev.Stream = 1
			}
			if ev.Op == trace.OpMalloc {
				of[ev.Addr] = ev.Stream
			}
		case trace.OpFree:
			ev.Stream = of[ev.Addr]
			delete(of, ev.Addr)
		}
	}
	if sc.Scan() {
		t.Fatalf("%s.streams has more lines than the log has mallocs", name)
	}
	// The log says it has no streams; these events have them.
	h.Metadata = map[string]string{"unrecorded": strings.Join([]string{trace.UnrecordedTimes, trace.UnrecordedSegmentFrees}, ", ")}
	return h, evs, m
}

// TestCuPyRecordings replays the recordings as recorded against the cupy
// policy, with the streams of churn and churn_limit (linalg and
// churn_single are on one stream): identical event by event, and the peak reserved bytes, device allocations and OOMs equal
// the real pool's peak total_bytes(), alloc hooks and OOMs caught.
func TestCuPyRecordings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		streams bool
		calls   int64 // device allocations
		peak    uint64
		ooms    int64
	}{
		{"linalg", false, 15, 280684032, 0},
		{"churn_single", false, 48, 1114100224, 0},
		{"churn", true, 58, 1236560384, 0},
		{"churn_limit", true, 48, 554309632, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, evs, m := cupyRecording(t, tc.name, tc.streams)
			rep, err := sim.Fidelity(trace.NewSliceSource(h, evs), sim.Config{Trace: tc.name, Policy: "cupy", Capacity: m.Cap})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Divergence != nil {
				t.Fatalf("diverges at %v", rep.Divergence)
			}
			if diffs := sim.CompareMeasured(rep, m); len(diffs) > 0 {
				t.Errorf("figures differ: %s", strings.Join(diffs, "; "))
			}
			r := rep.Result
			if rep.Calls != tc.calls || r.DeviceAllocs != tc.calls || r.PeakReserved != tc.peak || r.OOMs != tc.ooms || *m.Reserved != tc.peak {
				t.Errorf("%d recorded calls, %d device allocs, peak reserved %d, %d OOMs", rep.Calls, r.DeviceAllocs, r.PeakReserved, r.OOMs)
			}
		})
	}
}

// TestCuPyOneStream replays churn and churn_limit as logged, every malloc
// on stream 0: a malloc then finds free chunks that CuPy kept in the
// other stream's arena, so the replay allocates fewer segments. Both part
// from the recording at their 18th malloc (event 36, 353506 bytes on the
// default stream), for which the real pool allocated a segment, its
// default arena having no chunk that fits, while the one-stream replay
// takes a chunk of the side stream's. churn's figures (48 device allocs,
// 1114100224 bytes) are what the real pool measured on churn_single, the
// same arrays all on one stream (recorded after this test predicted them).
func TestCuPyOneStream(t *testing.T) {
	for _, tc := range []struct {
		name       string
		divergence string
		allocs     int64
		peak       uint64
		ooms       int64
	}{
		{"churn", "event 35: real allocator: segment_alloc of 353792 bytes at 0x7f02b7200000; simulation: no device call by event 36", 48, 1114100224, 0},
		{"churn_limit", "event 35: real allocator: segment_alloc of 353792 bytes at 0x7fbcdf200000; simulation: no device call by event 36", 40, 554901504, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, evs, m := cupyRecording(t, tc.name, false)
			cfg := sim.Config{Trace: tc.name, Policy: "cupy", Capacity: m.Cap}
			rep, err := sim.Fidelity(trace.NewSliceSource(h, evs), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Divergence.String(); rep.Divergence == nil || got != tc.divergence {
				t.Errorf("divergence %v, want %s", rep.Divergence, tc.divergence)
			}
			rs, err := sim.Run(trace.NewSliceSource(h, evs), cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := rs[0]
			if r.DeviceAllocs != tc.allocs || r.PeakReserved != tc.peak || r.OOMs != tc.ooms {
				t.Errorf("%d device allocs, peak reserved %d, %d OOMs", r.DeviceAllocs, r.PeakReserved, r.OOMs)
			}
		})
	}
}
