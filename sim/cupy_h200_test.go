package sim_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/cupy"
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
// other stream's arena. Both part from the recording at their 18th malloc
// (event 36, 353506 bytes on the default stream), for which the real pool
// allocated a segment, its default arena having no chunk that fits, while
// the one-stream replay has a chunk of the side stream's, a whole free
// segment: replayed as recorded, the policy infers an unlogged
// free_all_blocks() there (or a malloc from another stream's arena, which
// the log cannot tell apart: it says both, naming event 36), and the replay parts from the recording two mallocs later, at a
// placement in the other arena that it cannot know (event 38). Replayed
// plainly, churn's figures (48 device allocs, 1114100224 bytes) are what
// the real pool measured on churn_single, the same arrays all on one
// stream (recorded after this test predicted them).
func TestCuPyOneStream(t *testing.T) {
	for _, tc := range []struct {
		name       string
		divergence string
		allocs     int64
		peak       uint64
		ooms       int64
	}{
		{"churn", "event 38: real allocator: malloc of 272 bytes at 0x7f02d3e02200; simulation: placed at 0x7f02d3e00a00", 48, 1114100224, 0},
		{"churn_limit", "event 38: real allocator: malloc of 272 bytes at 0x7fbcfbe02200; simulation: placed at 0x7fbcfbe00a00", 40, 554901504, 2},
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
			const inferred = "event 36 (malloc of 353506 bytes): the log shows a device allocation where the pool held a free chunk that fits: free_all_blocks() inferred before it (2 free segments given back), which DebugPrintHook does not log (or the malloc came from another stream's arena, which it does not record either)"
			if r := rep.Result; r.Inferred != 1 || r.FirstInferred != inferred {
				t.Errorf("%d inferred, first %q; want 1, %q", r.Inferred, r.FirstInferred, inferred)
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

// cupyLog imports a DebugPrintHook log given as its lines.
func cupyLog(t *testing.T, lines ...string) trace.Source {
	t.Helper()
	src, err := cupy.Import(strings.NewReader(strings.Join(lines, "\n")+"\n"), "hand.jsonl", cupy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestCuPyInferFreeAllBlocks: a log of a program that called
// free_all_blocks() between two mallocs of 1000 bytes (a 1024-byte chunk
// each), which DebugPrintHook does not log. The first malloc's segment at
// A is whole and free when the second comes; the log shows the second
// making a device allocation of its own at B. Replayed as recorded, the
// pool gives A back before the second malloc (free_all_blocks inferred, at
// event 4: segment_alloc A, malloc A, free A, segment_alloc B, malloc B),
// so every device call and placement is the recorded one.
func TestCuPyInferFreeAllBlocks(t *testing.T) {
	src := cupyLog(t,
		`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":1048576}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":2097152}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":2097152,"pmem_id":"0x2"}`,
		`{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":2097152,"pmem_id":"0x2"}`,
	)
	rep, err := sim.Fidelity(src, sim.Config{Trace: "hand", Policy: "cupy"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence != nil {
		t.Fatalf("diverges at %v", rep.Divergence)
	}
	r := rep.Result
	const want = "event 4 (malloc of 1000 bytes): the log shows a device allocation where the pool held a free chunk that fits: free_all_blocks() inferred before it (1 free segments given back), which DebugPrintHook does not log (or the malloc came from another stream's arena, which it does not record either)"
	if r.Inferred != 1 || r.FirstInferred != want {
		t.Errorf("%d inferred, first %q; want 1, %q", r.Inferred, r.FirstInferred, want)
	}
	// One segment of 1024 bytes at a time: the peak of reserved bytes is
	// 1024, with 2 device allocations and 1 device free (the inferred one).
	if rep.Calls != 2 || r.DeviceAllocs != 2 || r.DeviceFrees != 1 || r.PeakReserved != 1024 {
		t.Errorf("%d recorded calls, %d device allocs, %d frees, peak reserved %d; want 2, 2, 1, 1024", rep.Calls, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved)
	}
	if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "1 calls the recording does not show were inferred from it; first: event 4 ") {
		t.Errorf("warnings %q", r.Warnings)
	}
}

// TestCuPyInferUnexplained: a malloc that the log shows served from the
// pool (no device allocation) while the simulated pool has no free chunk
// that fits (the second malloc at A+1024, right after the first took the
// whole 1024-byte segment at A) is noted, naming its event, and the
// replay parts from the recording there.
func TestCuPyInferUnexplained(t *testing.T) {
	src := cupyLog(t,
		`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":1048576}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1049600,"pmem_id":"0x2"}`,
	)
	rep, err := sim.Fidelity(src, sim.Config{Trace: "hand", Policy: "cupy"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence == nil {
		t.Fatal("no divergence")
	}
	const want = "event 2 (malloc of 1000 bytes): the log shows no device allocation where the pool held no free chunk that fits: the pool's state differs from the real one's here"
	if r := rep.Result; r.Inferred != 1 || r.FirstInferred != want {
		t.Errorf("%d inferred, first %q; want 1, %q", r.Inferred, r.FirstInferred, want)
	}
}
