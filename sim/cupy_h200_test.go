package sim_test

import (
	"bufio"
	"fmt"
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
// other stream's arena. The first is their 18th malloc (event 36, 353506
// bytes on the default stream), for which the real pool allocated a
// segment, its default arena having no chunk that fits, while the
// one-stream replay has a chunk of the side stream's. Replayed as
// recorded, the policy follows the log there and wherever else it parts
// from the rule (a new segment where the log shows one, the recorded
// chunk where the log takes another), naming event 36 as the first of
// what it inferred: churn then replays identical, with 184 inferences;
// churn_limit, with 61, until a malloc that the real pool failed (event
// 290) while the replay, whose arenas are not the real ones, placed it.
// Replayed plainly, churn's figures (48 device allocs, 1114100224 bytes)
// are what the real pool measured on churn_single, the same arrays all
// on one stream (recorded after this test predicted them).
func TestCuPyOneStream(t *testing.T) {
	const first = "event 36 (malloc of 353506 bytes): the log shows a device allocation where the pool held a free chunk that fits: the malloc came from another stream's arena, or the chunk was given back by a free_all_blocks(); the log records neither"
	for _, tc := range []struct {
		name       string
		divergence string
		inferred   int64
		allocs     int64
		peak       uint64
		ooms       int64
	}{
		{"churn", "", 184, 48, 1114100224, 0},
		{"churn_limit", "event 290: real allocator: out of memory for 21667731 bytes; simulation: placed it at 0x7fbcccf0be00", 61, 40, 554901504, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, evs, m := cupyRecording(t, tc.name, false)
			cfg := sim.Config{Trace: tc.name, Policy: "cupy", Capacity: m.Cap}
			rep, err := sim.Fidelity(trace.NewSliceSource(h, evs), cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if rep.Divergence != nil {
				got = rep.Divergence.String()
			}
			if got != tc.divergence {
				t.Errorf("divergence %q, want %q", got, tc.divergence)
			}
			if r := rep.Result; r.Inferred != tc.inferred || r.FirstInferred != first {
				t.Errorf("%d inferred, first %q; want %d, %q", r.Inferred, r.FirstInferred, tc.inferred, first)
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
// making a device allocation of its own, which the device gave A's
// address again. Replayed as recorded, the pool gives A back before the
// second malloc (free_all_blocks inferred, at event 4: segment_alloc A,
// malloc A, free A, segment_alloc A, malloc A), so every device call and
// placement is the recorded one: 2 device allocations, 1 device free, a
// peak of 1024 reserved bytes. Had the device given another address (B),
// nothing would show that A was given back: the replay takes a new
// segment, as logged, keeps A, and says it cannot tell (peak 2048).
func TestCuPyInferFreeAllBlocks(t *testing.T) {
	for _, tc := range []struct {
		second          int
		frees           int64
		peak            uint64
		inferred, warns string
		bound           string // the second warning, "" for none
	}{
		{1048576, 1, 1024,
			"event 4 (malloc of 1000 bytes): the device gave the malloc's new segment an address in the segment at 0x100000, which the pool held free: free_all_blocks() inferred before it (1 free segments given back), which DebugPrintHook does not log",
			"1 calls the recording does not show were inferred from it; first: event 4 ", ""},
		{2097152, 0, 2048,
			"event 4 (malloc of 1000 bytes): the log shows a device allocation where the pool held a free chunk that fits: the malloc came from another stream's arena, or the chunk was given back by a free_all_blocks(); the log records neither",
			"1 calls the recording does not show were inferred from it; first: event 4 ",
			// The first segment, free at the peak and not used after it:
			// the log cannot show whether it was given back before.
			"the peak of 2048 reserved bytes (event 4) counts 1024 bytes of segments wholly free, which a release the recording does not show (CuPy's free_all_blocks()) would have given back: the real peak may be lower, down to 1024 bytes"},
	} {
		src := cupyLog(t,
			`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":1048576}`,
			`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
			`{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
			fmt.Sprintf(`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":%d}`, tc.second),
			fmt.Sprintf(`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":%d,"pmem_id":"0x2"}`, tc.second),
			fmt.Sprintf(`{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":%d,"pmem_id":"0x2"}`, tc.second),
		)
		rep, err := sim.Fidelity(src, sim.Config{Trace: "hand", Policy: "cupy"})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Divergence != nil {
			t.Fatalf("second at %#x: diverges at %v", tc.second, rep.Divergence)
		}
		r := rep.Result
		if r.Inferred != 1 || r.FirstInferred != tc.inferred {
			t.Errorf("second at %#x: %d inferred, first %q; want 1, %q", tc.second, r.Inferred, r.FirstInferred, tc.inferred)
		}
		if rep.Calls != 2 || r.DeviceAllocs != 2 || r.DeviceFrees != tc.frees || r.PeakReserved != tc.peak {
			t.Errorf("second at %#x: %d recorded calls, %d device allocs, %d frees, peak reserved %d; want 2, 2, %d, %d", tc.second, rep.Calls, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved, tc.frees, tc.peak)
		}
		want := 1
		if tc.bound != "" {
			want = 2
		}
		if len(r.Warnings) != want || !strings.Contains(r.Warnings[0], tc.warns) || tc.bound != "" && r.Warnings[1] != tc.bound {
			t.Errorf("second at %#x: warnings %q", tc.second, r.Warnings)
		}
	}
}

// TestCuPyInferChunk: the log shows a malloc of 16 bytes served from the
// rest of a large chunk (at A+1024) where the pool's rule takes the
// smallest free chunk that holds it, a whole 512-byte segment at B: B was
// given back (or is another stream's). Replayed as recorded, the malloc
// takes the recorded chunk, noted at event 6.
func TestCuPyInferChunk(t *testing.T) {
	src := cupyLog(t,
		`{"hook":"alloc","device_id":0,"mem_size":4096,"mem_ptr":1048576}`,
		`{"hook":"malloc","device_id":0,"size":4000,"mem_size":4096,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":2097152}`,
		`{"hook":"malloc","device_id":0,"size":310,"mem_size":512,"mem_ptr":2097152,"pmem_id":"0x2"}`,
		`{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":2097152,"pmem_id":"0x2"}`,
		`{"hook":"free","device_id":0,"mem_size":4096,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x3"}`,
		`{"hook":"malloc","device_id":0,"size":16,"mem_size":512,"mem_ptr":1049600,"pmem_id":"0x4"}`,
	)
	rep, err := sim.Fidelity(src, sim.Config{Trace: "hand", Policy: "cupy"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence != nil {
		t.Fatalf("diverges at %v", rep.Divergence)
	}
	const want = "event 7 (malloc of 16 bytes): the log shows the malloc served from the free chunk at 0x100400 (3072 bytes) where the pool's rule takes the one at 0x200000 (512 bytes): that one was in another stream's arena, or given back by a free_all_blocks(); the log records neither"
	if r := rep.Result; r.Inferred != 1 || r.FirstInferred != want {
		t.Errorf("%d inferred, first %q; want 1, %q", r.Inferred, r.FirstInferred, want)
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
	const want = "event 2 (malloc of 1000 bytes): the log shows the malloc served from the pool where the simulated pool holds no free chunk that fits: the pool's state differs from the real one's here"
	if r := rep.Result; r.Inferred != 1 || r.FirstInferred != want {
		t.Errorf("%d inferred, first %q; want 1, %q", r.Inferred, r.FirstInferred, want)
	}
}

// TestFollowOwnOnly: replayed as recorded (as replay sim does by
// default), the cupy policy does not follow a PyTorch snapshot's device
// calls (another allocator's): its figures on churn are what they were
// before cupy followed its own logs, 2292261888 bytes peak reserved
// (2186.1 MiB), as a plain replay's, with nothing inferred.
func TestFollowOwnOnly(t *testing.T) {
	h, evs, err := tracefile.ReadAll(filepath.Join("..", "testdata", "pytorch", "churn.pickle.gz"), tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		asRecorded bool
		peak       uint64
	}{{false, 2292261888}, {true, 2292261888}} {
		rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Trace: "churn", Policy: "cupy", AsRecorded: tc.asRecorded})
		if err != nil {
			t.Fatal(err)
		}
		if r := rs[0]; r.Inferred != 0 || r.PeakReserved != tc.peak {
			t.Errorf("as recorded %v: %d inferred (%s), peak reserved %d; want 0, %d", tc.asRecorded, r.Inferred, r.FirstInferred, r.PeakReserved, tc.peak)
		}
	}
}

// TestCuPyPeakUnshown: a segment free at the peak is one an unlogged
// free_all_blocks() may have given back (the bound of the warning), unless
// the log shows it held after the peak: a later malloc placed in it with
// no device allocation of its own.
func TestCuPyPeakUnshown(t *testing.T) {
	lines := []string{
		`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":1048576}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x1"}`,
		`{"hook":"alloc","device_id":0,"mem_size":1024,"mem_ptr":2097152}`,
		`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":2097152,"pmem_id":"0x2"}`,
	}
	for _, tc := range []struct {
		name    string
		more    []string
		unshown uint64
	}{
		{"not used after the peak", nil, 1024},
		{"used after the peak", []string{
			`{"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":1048576,"pmem_id":"0x3"}`,
		}, 0},
	} {
		rs, err := sim.Run(cupyLog(t, append(append([]string(nil), lines...), tc.more...)...),
			sim.Config{Trace: "hand", Policy: "cupy", AsRecorded: true})
		if err != nil {
			t.Fatal(err)
		}
		if r := rs[0]; r.PeakReserved != 2048 || r.PeakUnshown != tc.unshown {
			t.Errorf("%s: peak reserved %d, unshown %d; want 2048, %d", tc.name, r.PeakReserved, r.PeakUnshown, tc.unshown)
		}
	}
}
