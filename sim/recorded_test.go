package sim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// recording is a hand-written PyTorch recording under a 48 MiB cap, with
// the real allocator's own calls (segment events) at addresses of its own:
//
//   - events 0-3: a 24 MiB segment for stream 1, a 20 MiB one (3 MiB used)
//     for stream 0;
//   - 4-7: the stream-1 block is freed late (used on another stream); the
//     stream-0 block at once;
//   - 8-11: a 20 MiB malloc on stream 1 finds no block without the late
//     one and passes the cap (44 + 20): its retry takes the late block back,
//     frees both cached segments (large pool, stream order) and allocates
//     at 0x5000000. Had the late block come back before the search, the
//     malloc would have split it;
//   - 12-16: its block freed, the program calls empty_cache (the segment
//     free at 14, which no malloc explains), then a small malloc;
//   - 17-19: freed, and empty_cache again at the very end.
const recording = `header source=pytorch setting.PYTORCH_CUDA_ALLOC_CONF=""
segment_alloc addr=0x1000000 size=24MiB stream=1
malloc addr=0x1000000 size=24MiB stream=1
segment_alloc addr=0x3000000 size=20MiB
malloc addr=0x3000000 size=3MiB
free_requested addr=0x1000000 size=24MiB stream=1
free_requested addr=0x3000000 size=3MiB
free addr=0x3000000 size=3MiB
free addr=0x1000000 size=24MiB stream=1
segment_free addr=0x3000000 size=20MiB
segment_free addr=0x1000000 size=24MiB stream=1
segment_alloc addr=0x5000000 size=20MiB stream=1
malloc addr=0x5000000 size=20MiB stream=1
free_requested addr=0x5000000 size=20MiB stream=1
free addr=0x5000000 size=20MiB stream=1
segment_free addr=0x5000000 size=20MiB stream=1
segment_alloc addr=0x7000000 size=2MiB
malloc addr=0x7000000 size=1000
free_requested addr=0x7000000 size=1000
free addr=0x7000000 size=1000
segment_free addr=0x7000000 size=2MiB
`

func recordingSource(t *testing.T, text string) trace.Source {
	t.Helper()
	h, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSliceSource(h, evs)
}

func TestFidelityRecording(t *testing.T) {
	rep, err := sim.Fidelity(recordingSource(t, recording), sim.Config{Policy: "pytorch", Capacity: 48 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence != nil {
		t.Fatalf("diverges: %v", rep.Divergence)
	}
	r := rep.Result
	if rep.Calls != 8 || rep.Mallocs != 4 || r.DeviceAllocs != 4 || r.DeviceFrees != 4 || r.AllocRetries != 1 || r.OOMs != 0 ||
		r.PeakReserved != 44<<20 || r.Anomalies != 0 {
		t.Errorf("calls %d, mallocs %d; device allocs %d, frees %d, retries %d, OOMs %d, peak reserved %d, anomalies %d; want 8, 4; 4, 4, 1, 0, %d, 0",
			rep.Calls, rep.Mallocs, r.DeviceAllocs, r.DeviceFrees, r.AllocRetries, r.OOMs, r.PeakReserved, r.Anomalies, 44<<20)
	}

	// Without the cap the malloc at event 11 needs no retry: the late
	// block comes back first, and would do; so the releases before it
	// were an explicit empty_cache (which synchronizes first too): the
	// same calls, no retry.
	rep, err = sim.Fidelity(recordingSource(t, recording), sim.Config{Policy: "pytorch"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Divergence != nil || rep.Result.AllocRetries != 0 || rep.Result.DeviceFrees != 4 {
		t.Errorf("without the cap: %v, retries %d, device frees %d; want identical, 0, 4", rep.Divergence, rep.Result.AllocRetries, rep.Result.DeviceFrees)
	}

	// Under a 40 MiB cap the second segment does not fit at all.
	rep, err = sim.Fidelity(recordingSource(t, recording), sim.Config{Policy: "pytorch", Capacity: 40 << 20})
	if err != nil {
		t.Fatal(err)
	}
	const want = "event 2: real allocator: segment_alloc of 20971520 bytes at 0x3000000; simulation: no device call by event 3"
	if rep.Divergence == nil || rep.Divergence.String() != want {
		t.Errorf("under 40 MiB: %v\nwant %s", rep.Divergence, want)
	}
}

// TestReplayAsRecorded: Run takes the recorded settings (here
// expandable_segments, from the header) when asked, with the user's over
// them, and says which were used.
func TestReplayAsRecorded(t *testing.T) {
	const tr = `header source=pytorch setting.PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" setting.max_split_size=-1 setting.expandable_segments=true setting.garbage_collection_threshold=0
segment_map addr=0x40000000 size=20MiB
malloc addr=0x40000000 size=3MiB
malloc addr=0x40300000 size=3MiB
`
	cases := []struct {
		name     string
		cfg      sim.Config
		settings string
		allocs   int64
		reserved uint64
	}{
		{"as recorded", sim.Config{Policy: "pytorch", AsRecorded: true}, "map[expandable_segments:True]", 1, 20 << 20},
		{"a setting over them", sim.Config{Policy: "pytorch", AsRecorded: true, Settings: policies.Settings{"max_split_size_mb": "64"}},
			"map[expandable_segments:True max_split_size_mb:64]", 1, 20 << 20},
		{"conf instead", sim.Config{Policy: "pytorch", AsRecorded: true, Settings: policies.Settings{"conf": "max_split_size_mb:64"}},
			"map[conf:max_split_size_mb:64]", 1, 20 << 20},
		{"not as recorded", sim.Config{Policy: "pytorch"}, "map[]", 1, 20 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := sim.Run(recordingSource(t, tr), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := rs[0]
			if got := fmt.Sprint(r.Settings); got != tc.settings {
				t.Errorf("settings %s, want %s", got, tc.settings)
			}
			if r.DeviceAllocs != tc.allocs || r.PeakReserved != tc.reserved {
				t.Errorf("device allocs %d, peak reserved %d; want %d, %d", r.DeviceAllocs, r.PeakReserved, tc.allocs, tc.reserved)
			}
		})
	}
	_, err := sim.Run(recordingSource(t, tr), sim.Config{Policy: "pytorch", AsRecorded: true, Settings: policies.Settings{"expandable_segments": "maybe"}})
	if err == nil || !strings.Contains(err.Error(), "expandable_segments") {
		t.Errorf("a bad setting over the recorded ones: %v, want an error naming it", err)
	}
}

// TestPyTorchMemoryKinds: pinned and managed allocations pass the pytorch
// policy by (counted apart), stream-ordered device memory goes through it,
// in a replay as recorded as in any other.
func TestPyTorchMemoryKinds(t *testing.T) {
	const tr = `header source=pytorch
malloc id=1 size=1MiB kind=pinned
malloc id=2 size=3MiB kind=managed
malloc id=3 size=1000 kind=async
malloc id=4 size=1000
free id=1
free id=2
free id=3
free id=4
`
	rs, err := sim.Run(recordingSource(t, tr), sim.Config{Policy: "pytorch", AsRecorded: true})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.PeakPinned != 1<<20 || r.PeakManaged != 3<<20 || r.Mallocs != 2 || r.Frees != 2 || r.DeviceAllocs != 1 ||
		r.PeakAllocated != 2048 || r.Anomalies != 0 {
		t.Errorf("pinned %d, managed %d, mallocs %d, frees %d, device allocs %d, peak allocated %d, anomalies %d",
			r.PeakPinned, r.PeakManaged, r.Mallocs, r.Frees, r.DeviceAllocs, r.PeakAllocated, r.Anomalies)
	}
}

// TestPyTorchSnapshotsChecked replays the small snapshots (testdata) as
// recorded under the invariant checker, expandable segments included: runs
// of mapped pages count as segments.
func TestPyTorchSnapshotsChecked(t *testing.T) {
	snaps, _ := filepath.Glob(filepath.Join("..", "testdata", "pytorch", "*.pickle.gz"))
	for _, snap := range snaps {
		t.Run(filepath.Base(snap), func(t *testing.T) {
			f, err := os.Open(snap)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			src, err := pytorch.Import(f, snap, pytorch.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sim.Run(src, sim.Config{Policy: "pytorch", AsRecorded: true, Check: true}); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestLateFreeRetry: a free_completed right after its free_requested but
// 30 ms later is a free that was pending on another stream and completed
// inside the next malloc's retry (pending_retry's shape, by hand: a 1 GiB
// block, a 1.5 GiB cap, a second 1 GiB malloc that cannot get a segment
// beside the first): one retry, the segment freed and allocated again.
// The same entries 1 ms apart are an immediate free and an explicit
// empty_cache: no retry, the same device calls.
func TestLateFreeRetry(t *testing.T) {
	const tr = `header source=pytorch setting.max_split_size=-1 setting.expandable_segments=false setting.garbage_collection_threshold=0
segment_alloc addr=0x40000000 size=1GiB t=0
malloc addr=0x40000000 size=1GiB t=1000
free_requested addr=0x40000000 size=1GiB t=2000
free addr=0x40000000 size=1GiB t=%d
segment_free addr=0x40000000 size=1GiB t=%d
segment_alloc addr=0x80000000 size=1GiB t=%d
malloc addr=0x80000000 size=1GiB t=%d
`
	for _, tc := range []struct {
		name    string
		gap     int64 // ns from free_requested to free
		retries int64
	}{{"30 ms later", 30e6, 1}, {"1 ms later", 1e6, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			at := 2000 + tc.gap
			rs, err := sim.Run(recordingSource(t, fmt.Sprintf(tr, at, at+10, at+20, at+30)),
				sim.Config{Policy: "pytorch", AsRecorded: true, Capacity: 1536 << 20})
			if err != nil {
				t.Fatal(err)
			}
			r := rs[0]
			if r.AllocRetries != tc.retries || r.DeviceAllocs != 2 || r.DeviceFrees != 1 || r.PeakReserved != 1<<30 || r.OOMs != 0 {
				t.Errorf("retries %d, device allocs %d, frees %d, peak reserved %d, OOMs %d; want %d, 2, 1, %d, 0",
					r.AllocRetries, r.DeviceAllocs, r.DeviceFrees, r.PeakReserved, r.OOMs, tc.retries, 1<<30)
			}
		})
	}
}

// TestZeroByteFreeLate: a 0-byte malloc (PyTorch's null pointer) whose
// free completes late is taken back like any other: nothing to free, and
// the replay goes on (it failed with "free of 0x0: not an allocated
// block").
func TestZeroByteFreeLate(t *testing.T) {
	const text = `malloc id=1 size=0
free_requested id=1
marker label=x
free id=1
malloc id=2 size=1000
free id=2
`
	rs, err := sim.Run(recordingSource(t, text), sim.Config{Policy: "pytorch"})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.PeakReserved != 2<<20 || r.DeviceAllocs != 1 || r.OOMs != 0 {
		t.Errorf("peak reserved %d, %d device allocs, %d OOMs; want %d, 1, 0", r.PeakReserved, r.DeviceAllocs, r.OOMs, 2<<20)
	}
}

// TestRecordedSegmentPastTheEnd: a recorded segment whose range runs past
// the end of the address space is no free place to follow, so the device
// places on its own from there. Before, a second recorded segment at 0x100
// was not seen to overlap the first, two free blocks had the same size and
// address, and the replay failed with a nil pointer dereference.
func TestRecordedSegmentPastTheEnd(t *testing.T) {
	const text = `segment_alloc addr=0xffffffffffefff00 size=2097152
malloc id=1 size=1048576
malloc id=2 size=512
malloc id=3 size=512
malloc id=4 size=1047552
segment_alloc addr=0x100 size=2097152
malloc id=5 size=512
malloc id=6 size=512
free id=3
free id=5
free id=2
malloc id=7 size=512
`
	rs, err := sim.Run(recordingSource(t, text), sim.Config{Policy: "pytorch", AsRecorded: true, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.PeakReserved != 4<<20 || r.DeviceAllocs != 2 || r.OOMs != 0 {
		t.Errorf("peak reserved %d, %d device allocs, %d OOMs; want %d, 2, 0", r.PeakReserved, r.DeviceAllocs, r.OOMs, 4<<20)
	}
}

// TestRunParting: a replay as recorded of its own allocator's recording
// names the event where it parts from it, in the result and its warnings;
// one under the user's settings, or not as recorded, is not watched.
func TestRunParting(t *testing.T) {
	// The second 1000-byte malloc is recorded at 0x7001000; the caching
	// allocator puts it right after the first's 1024 bytes, at 0x7000400.
	const tr = `header source=pytorch setting.PYTORCH_CUDA_ALLOC_CONF=""
segment_alloc addr=0x7000000 size=2MiB
malloc addr=0x7000000 size=1000
malloc addr=0x7001000 size=1000
`
	run := func(text string, cfg sim.Config) *sim.Result {
		t.Helper()
		rs, err := sim.Run(recordingSource(t, text), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	r := run(tr, sim.Config{Policy: "pytorch", AsRecorded: true})
	const want = "event 2: real allocator: malloc of 1000 bytes at 0x7001000; simulation: placed at 0x7000400"
	if r.Parted != want {
		t.Errorf("parted %q, want %q", r.Parted, want)
	}
	if len(r.Warnings) != 1 || !strings.HasPrefix(r.Warnings[0], "the simulation of pytorch parts from the recording at "+want+": the figures are the simulation's") {
		t.Errorf("warnings %q", r.Warnings)
	}
	for name, cfg := range map[string]sim.Config{
		"not as recorded":    {Policy: "pytorch"},
		"the user's setting": {Policy: "pytorch", AsRecorded: true, Settings: policies.Settings{"max_split_size_mb": "64"}},
		"another allocator":  {Policy: "cuda", AsRecorded: true},
	} {
		if r := run(tr, cfg); r.Parted != "" || len(r.Warnings) != 0 {
			t.Errorf("%s: parted %q, warnings %q", name, r.Parted, r.Warnings)
		}
	}

	// recording under 40 MiB: the 3 MiB malloc of event 3 fails, where
	// the job had the cap it was recorded under (48 MiB). The warning says
	// the capacity may be why; without one the replay is not watched for
	// OOMs (CapacityWarning's business).
	r = run(recording, sim.Config{Policy: "pytorch", AsRecorded: true, Capacity: 40 << 20})
	const wantOOM = "event 2: real allocator: segment_alloc of 20971520 bytes at 0x3000000; simulation: no device call by event 3"
	if r.Parted != wantOOM || len(r.Warnings) != 1 ||
		!strings.HasSuffix(r.Warnings[0], wantOOM+": unless the capacity of 41943040 bytes is not the job's (which would explain an OOM where the job had none, or the reverse), the figures are the simulation's from there on, not the real allocator's") {
		t.Errorf("under 40 MiB: parted %q, warnings %q", r.Parted, r.Warnings)
	}
	if r := run(recording, sim.Config{Policy: "pytorch", AsRecorded: true, Capacity: 48 << 20}); r.Parted != "" || len(r.Warnings) != 0 {
		t.Errorf("under the job's 48 MiB: parted %q, warnings %q", r.Parted, r.Warnings)
	}
}
