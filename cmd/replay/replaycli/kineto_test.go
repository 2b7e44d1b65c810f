package replaycli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/fidelity"
)

// The torch.profiler recordings of testdata/profiler (a Chrome trace, the
// snapshot and stats.json of one process each).
var profilerDir = filepath.Join("..", "..", "..", "testdata", "profiler")

// TestKinetoFidelity: replay fidelity on a torch.profiler trace compares
// the device calls inferred from its Total Reserved, and the placements,
// with the simulation's, and the figures with NAME.stats.json beside
// NAME.pt.trace.json.gz: prof_mlp is identical; prof_mlp_expandable is
// under expandable_segments=True, which the trace does not record (the
// first map of the recording against a cudaMalloc of the simulation
// without it); the churn runs diverge where a side-stream malloc made a
// segment that the simulation, with every event on stream 0, did not.
func TestKinetoFidelity(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		ok   bool
	}{
		{[]string{"prof_mlp.pt.trace.json.gz"},
			"prof_mlp.pt.trace.json.gz: identical (94 device calls, 417 mallocs; peaks and counters as measured in prof_mlp.stats.json; policy pytorch, settings default)", true},
		{[]string{"--set", "pytorch.expandable_segments=True", "prof_mlp_expandable.pt.trace.json.gz"},
			"prof_mlp_expandable.pt.trace.json.gz: identical (46 device calls, 417 mallocs; peaks and counters as measured in prof_mlp_expandable.stats.json; policy pytorch, settings expandable_segments=True)", true},
		{[]string{"prof_mlp_expandable.pt.trace.json.gz"},
			"prof_mlp_expandable.pt.trace.json.gz: diverges at event 1: real allocator: segment_map of 20971520 bytes at 0x302000000 (event 0); simulation: segment_alloc of 12582912 bytes at 0x1000000000000 (policy pytorch)", false},
		{[]string{"prof_churn.pt.trace.json.gz"},
			"prof_churn.pt.trace.json.gz: warning: 1 calls the recording does not show were inferred from it; first: event 5 (malloc of 8704 bytes): the recording shows a new segment for this malloc where the simulated pool had a cached block of 8704 bytes at 0x7f73d6600000 that fits: the malloc went to a private pool the snapshot does not tell apart (a CUDA graph capture's or a MemPool's, its segments freed before the dump), or the pools' states differ here\n" +
				"prof_churn.pt.trace.json.gz: diverges at event 4: real allocator: segment_alloc of 2097152 bytes at 0x7f73d6800000; simulation: no device call by event 5 (policy pytorch)", false},
		{[]string{"prof_churn_oom.pt.trace.json.gz"},
			"prof_churn_oom.pt.trace.json.gz: warning: 1 calls the recording does not show were inferred from it; first: event 5 (malloc of 8704 bytes): the recording shows a new segment for this malloc where the simulated pool had a cached block of 8704 bytes at 0x7fa468600000 that fits: the malloc went to a private pool the snapshot does not tell apart (a CUDA graph capture's or a MemPool's, its segments freed before the dump), or the pools' states differ here\n" +
				"prof_churn_oom.pt.trace.json.gz: diverges at event 4: real allocator: segment_alloc of 2097152 bytes at 0x7fa468800000; simulation: no device call by event 5 (policy pytorch)", false},
	} {
		args := append([]string{"fidelity"}, tc.args...)
		args[len(args)-1] = filepath.Join(profilerDir, args[len(args)-1])
		out, errOut, err := runCmd(t, args...)
		if strings.TrimSpace(out) != tc.want || (err == nil) != tc.ok {
			t.Errorf("replay %s: %v\n%s%s\nwant:\n%s", strings.Join(tc.args, " "), err, out, errOut, tc.want)
		}
	}
}

// TestKinetoSim: replay sim of prof_mlp gives its stats.json: 830472192
// bytes peak reserved, 606097408 allocated, 61 cudaMalloc.
func TestKinetoSim(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	if _, errOut, err := runCmd(t, "sim", "--policy", "pytorch", "--json", js, filepath.Join(profilerDir, "prof_mlp.pt.trace.json.gz")); err != nil {
		t.Fatalf("replay sim: %v\n%s", err, errOut)
	}
	rs := readResults(t, js)
	if len(rs) != 1 || rs[0].PeakReserved != 830472192 || rs[0].PeakAllocated != 606097408 || rs[0].DeviceAllocs != 61 || rs[0].TraceSource != "kineto" {
		t.Errorf("replay sim: %+v", rs)
	}
}

func TestMeasuredPath(t *testing.T) {
	for in, want := range map[string]string{
		"d/prof_mlp.pt.trace.json.gz": "d/prof_mlp.stats.json",
		"d/prof_mlp.pt.trace.json":    "d/prof_mlp.stats.json",
		"d/job.json.gz":               "d/job.stats.json",
		"d/job.json":                  "d/job.stats.json",
		"d/churn.pickle.gz":           "d/churn.stats.json",
		"d/churn.pickle":              "d/churn.stats.json",
		"d/run.trace":                 "d/run.stats.json",
		"d/churn.jsonl":               "d/churn.stats.json",
	} {
		if got := fidelity.MeasuredPath(in); got != want {
			t.Errorf("fidelity.MeasuredPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestKinetoStats: replay stats says what a torch.profiler trace does not
// record, how its device calls were inferred, and names its card.
func TestKinetoStats(t *testing.T) {
	out, _, err := runCmd(t, "stats", filepath.Join(profilerDir, "prof_mlp.pt.trace.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		": kineto trace, 925 events over ",
		"\nnot in the recording: streams (every event is on stream 0), requested sizes (each size is the allocator's block), " +
			"when frees complete (each free is where the program asked for it: a block in use on another stream is reused only later), " +
			"the allocator settings (--set), the memory cap (--capacity)\n",
		"\ndevice calls: cudaMalloc segments, inferred from Total Reserved at every event\n",
		"\ncard: NVIDIA H200\n",
		"\n  segment_alloc  61\n  segment_free   33\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("replay stats: no %q in\n%s", want, out)
		}
	}
}
