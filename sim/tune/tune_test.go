package tune

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

func TestCandidates(t *testing.T) {
	got := Candidates([]Axis{{"a", []string{"", "1"}}, {"b", []string{"False", "True"}}})
	want := []string{"", "b:True", "a:1", "a:1,b:True"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("candidates %q, want %q", got, want)
	}
	if n := len(Candidates(PyTorchGrid)); n != 180 {
		t.Errorf("%d candidates in the pytorch grid, want 180", n)
	}
}

// TestRank: fewer OOMs first, then peak reserved, device calls, allocator
// time; the front holds those no other with as few OOMs beats in all three.
func TestRank(t *testing.T) {
	res := func(ooms int64, peak uint64, calls, ns int64) *sim.Result {
		return &sim.Result{OOMs: ooms, PeakReserved: peak, DeviceAllocs: calls, SimAllocTimeNS: ns}
	}
	cs := []Candidate{
		{Conf: "a", Result: res(1, 10, 1, 1)},  // an OOM: last, off the front
		{Conf: "b", Result: res(0, 30, 1, 1)},  // fewest calls: on the front
		{Conf: "c", Result: res(0, 20, 5, 9)},  // lowest peak: first, on the front
		{Conf: "d", Result: res(0, 30, 5, 9)},  // beaten by c in all: off
		{Conf: "ee", Result: res(0, 20, 5, 9)}, // as c, longer: after it, on the front (not beaten)
	}
	Rank(cs)
	var order []string
	var front []string
	for _, c := range cs {
		order = append(order, c.Conf)
		if c.Front {
			front = append(front, c.Conf)
		}
	}
	if strings.Join(order, " ") != "c ee b d a" || strings.Join(front, " ") != "c ee b" {
		t.Errorf("order %v, front %v; want c ee b d a, front c ee b", order, front)
	}
}

// TestRun: a candidate's result is the replay of the trace with its
// setting string, whichever group replays it; the peaks differ by setting
// (roundup_power2_divisions rounds the 10 MiB + 1 byte requests), so a
// mix-up would show.
func TestRun(t *testing.T) {
	text := "malloc id=1 size=10485761\nmalloc id=2 size=10485761\nfree id=1\nmalloc id=3 size=12MiB\nfree id=2\nfree id=3\nmalloc id=4 size=30MiB\nfree id=4\n"
	h, evs, err := trace.ParseText("t.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	confs := Candidates(PyTorchGrid)[:24]
	base := sim.Config{Trace: "t.txt", Policy: "pytorch", Capacity: 40 << 20}
	for _, jobs := range []int{1, 5} {
		cs, err := Run(h, evs, base, confs, jobs, false)
		if err != nil {
			t.Fatal(err)
		}
		peaks := map[uint64]bool{}
		for _, c := range cs {
			peaks[c.Result.PeakReserved] = true
		}
		if len(peaks) < 2 {
			t.Fatalf("every candidate peaks at the same bytes (%v): the test shows nothing", peaks)
		}
		for k, c := range cs {
			one := base
			one.Settings = map[string]string{"conf": confs[k]}
			rs, err := sim.Run(trace.NewSliceSource(h, evs), one)
			if err != nil {
				t.Fatal(err)
			}
			if c.Conf != confs[k] || c.Result.PeakReserved != rs[0].PeakReserved || c.Result.OOMs != rs[0].OOMs || c.Result.DeviceAllocs != rs[0].DeviceAllocs {
				t.Errorf("jobs %d, %q: %+v, alone %d reserved %d OOMs %d allocs", jobs, confs[k], c.Result, rs[0].PeakReserved, rs[0].OOMs, rs[0].DeviceAllocs)
			}
		}
	}
}

// tuneH200 is tune's recommendations run on the H200 (PyTorch 2.11, CUDA
// 13.0, driver 580.159; 2026-12-01): testdata/pytorch/record.py --child
// WORKLOAD LABEL CAP OUT 7 with PYTORCH_CUDA_ALLOC_CONF set to the
// recommended string, the real allocator's max_memory_reserved,
// num_device_alloc and num_ooms. exact says the prediction from the
// recorded trace must equal them: not where the run was capped and the
// workload caught an OOM and went on differently (it retries smaller and
// frees half of what it holds), which a trace of the other run cannot
// show. Where the run's recording is kept (testdata/pytorch/tuned/tuned_
// TRACE, of the first setting for a trace), the figures must be its
// stats.json's.
var tuneH200 = []struct {
	trace    string
	capacity uint64
	conf     string
	reserved uint64
	allocs   int64
	ooms     int64
	exact    bool
}{
	{"churn", 0, "roundup_power2_divisions:16,expandable_segments:True", 1746927616, 32, 0, true},
	{"churn", 0, "roundup_power2_divisions:8,expandable_segments:True", 1788870656, 31, 0, true},
	{"mlp", 0, "expandable_segments:True", 652214272, 42, 0, true},
	{"churn_gc", 1454374912, "max_split_size_mb:256,expandable_segments:True", 1369440256, 31, 1, false},
	{"churn_maxsplit", 1271922688, "max_split_size_mb:64,garbage_collection_threshold:0.6", 1222639616, 50, 1, false},
	{"churn_oom", 818937856, "expandable_segments:True", 801112064, 28, 1, false},
}

// TestTuneH200: tune's predictions for the settings run on the H200 equal
// the real allocator's figures where the workload did not react to an
// OOM; the others are logged.
func TestTuneH200(t *testing.T) {
	kept := 0
	for _, tc := range tuneH200 {
		stats := filepath.Join("..", "..", "testdata", "pytorch", "tuned", "tuned_"+tc.trace+".stats.json")
		if data, err := os.ReadFile(stats); err == nil {
			var run struct {
				Conf  string `json:"alloc_conf"`
				Stats struct {
					Reserved uint64 `json:"reserved_bytes.all.peak"`
					Allocs   int64  `json:"num_device_alloc"`
					OOMs     int64  `json:"num_ooms"`
				} `json:"memory_stats"`
			}
			if err := json.Unmarshal(data, &run); err != nil {
				t.Fatalf("%s: %v", stats, err)
			}
			if run.Conf == tc.conf {
				kept++
				if r := run.Stats; r.Reserved != tc.reserved || r.Allocs != tc.allocs || r.OOMs != tc.ooms {
					t.Errorf("%s %q: the table says %d bytes, %d allocs, %d OOMs; its recording %s has %d, %d, %d",
						tc.trace, tc.conf, tc.reserved, tc.allocs, tc.ooms, stats, r.Reserved, r.Allocs, r.OOMs)
				}
			}
		}
		path := filepath.Join("..", "..", "testdata", "pytorch", tc.trace+".pickle.gz")
		h, evs := readTrace(t, path)
		cs, err := Run(h, evs, sim.Config{Trace: path, Policy: "pytorch", AsRecorded: true, Capacity: tc.capacity}, []string{tc.conf}, 1, false)
		if err != nil {
			t.Fatal(err)
		}
		r := cs[0].Result
		t.Logf("%s %q: predicted %d bytes, %d allocs, %d OOMs; H200 %d, %d, %d", tc.trace, tc.conf, r.PeakReserved, r.DeviceAllocs, r.OOMs, tc.reserved, tc.allocs, tc.ooms)
		if tc.exact && (r.PeakReserved != tc.reserved || r.DeviceAllocs != tc.allocs || r.OOMs != tc.ooms) {
			t.Errorf("%s %q: predicted %d bytes, %d device allocations, %d OOMs; the H200 run had %d, %d, %d",
				tc.trace, tc.conf, r.PeakReserved, r.DeviceAllocs, r.OOMs, tc.reserved, tc.allocs, tc.ooms)
		}
	}
	if kept != 4 {
		t.Errorf("%d of the table's runs checked against their kept recordings, want 4 (mlp, churn, churn_maxsplit, churn_oom)", kept)
	}
}

// TestCombine: a job's candidate takes its largest rank's peak and the
// sums of the ranks' OOMs and calls; the setting best for the job is not
// the best of either rank alone.
func TestCombine(t *testing.T) {
	c := func(conf string, reserved uint64, ooms, allocs int64) Candidate {
		return Candidate{Conf: conf, Result: &sim.Result{PeakReserved: reserved, OOMs: ooms, DeviceAllocs: allocs}}
	}
	rank0 := []Candidate{c("a", 100, 0, 5), c("b", 300, 0, 1)} // a is rank 0's best
	rank1 := []Candidate{c("a", 500, 1, 5), c("b", 400, 0, 1)} // b is rank 1's best, and the job's
	job := Combine("job.rank*.trace", [][]Candidate{rank0, rank1})
	if len(job) != 2 || job[0].Result.PeakReserved != 500 || job[0].Result.OOMs != 1 || job[0].Result.DeviceAllocs != 10 ||
		job[1].Result.PeakReserved != 400 || job[1].Result.OOMs != 0 || job[1].Result.DeviceAllocs != 2 {
		t.Fatalf("combined %+v %+v", *job[0].Result, *job[1].Result)
	}
	Rank(job)
	if job[0].Conf != "b" {
		t.Errorf("the job's best is %q, want b", job[0].Conf)
	}
	if Combine("j", [][]Candidate{rank0, {c("x", 1, 0, 0), c("b", 1, 0, 0)}}) != nil {
		t.Errorf("ranks of other settings combined")
	}
}

// TestSameReplay: the candidates tune does not replay (SameReplay) have,
// in JSON, byte for byte the results of their own replays, on recordings
// where max_split_size_mb and garbage_collection_threshold act (under the
// recorded cap: churn_gc, churn_maxsplit, churn_oom) and where they do
// not (churn on its card); and on each some candidates are left unreplayed
// and some replayed after all, or the test shows nothing.
func TestSameReplay(t *testing.T) {
	for _, tc := range []struct {
		trace    string
		capacity uint64
	}{{"churn_gc", 1454374912}, {"churn_maxsplit", 1271922688}, {"churn_oom", 818937856}, {"churn", 0}} {
		path := filepath.Join("..", "..", "testdata", "pytorch", tc.trace+".pickle.gz")
		h, evs := readTrace(t, path)
		base := sim.Config{Trace: path, Policy: "pytorch", AsRecorded: true, Capacity: tc.capacity, CardCapacity: tc.capacity == 0}
		confs := Candidates(PyTorchGrid)
		same, err := Run(h, evs, base, confs, 2, false)
		if err != nil {
			t.Fatal(err)
		}
		all, err := Run(h, evs, base, confs, 2, true)
		if err != nil {
			t.Fatal(err)
		}
		skipped, retried := 0, 0
		refs := references(confs)
		for k := range confs {
			if same[k].Same != "" {
				skipped++
			} else if refs[k] >= 0 {
				retried++ // compared, and its value could act: replayed
			}
			if all[k].Same != "" {
				t.Fatalf("%s %q: not replayed under replayAll", tc.trace, confs[k])
			}
			a, _ := json.Marshal(same[k].Result)
			b, _ := json.Marshal(all[k].Result)
			if !bytes.Equal(a, b) {
				t.Errorf("%s %q (as %q): result\n%s\nreplayed\n%s", tc.trace, confs[k], same[k].Same, a, b)
			}
		}
		t.Logf("%s: %d of %d candidates not replayed, %d compared and replayed", tc.trace, skipped, len(confs), retried)
		if skipped == 0 || retried == 0 {
			t.Errorf("%s: %d candidates not replayed, %d compared and replayed: want some of each", tc.trace, skipped, retried)
		}
	}
}

func TestWithoutKey(t *testing.T) {
	for _, tc := range []struct{ in, key, out string }{
		{"max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4],garbage_collection_threshold:0.6", "garbage_collection_threshold", "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4]"},
		{"roundup_power2_divisions:[256:1,>:4],max_split_size_mb:64", "max_split_size_mb", "roundup_power2_divisions:[256:1,>:4]"},
		{"max_split_size_mb:64", "max_split_size_mb", ""},
		{"expandable_segments:True", "max_split_size_mb", "expandable_segments:True"},
	} {
		got, found := withoutKey(tc.in, tc.key)
		if got != tc.out || found != (tc.in != tc.out) {
			t.Errorf("withoutKey(%q, %q) = %q, %v; want %q", tc.in, tc.key, got, found, tc.out)
		}
	}
}

// readTrace decodes the trace at path into memory, as replay tune does.
func readTrace(tb testing.TB, path string) (trace.Header, []trace.Event) {
	tb.Helper()
	h, evs, err := tracefile.ReadAll(path, tracefile.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return h, evs
}

// TestCombineTimeSaturates: a job's allocator time is the ranks' summed
// and saturated at math.MaxInt64 (a rank of a saturated time made the sum
// wrap to a negative time).
func TestCombineTimeSaturates(t *testing.T) {
	c := func(ns int64) []Candidate {
		return []Candidate{{Conf: "a", Result: &sim.Result{SimAllocTimeNS: ns}}}
	}
	for _, tc := range []struct{ a, b, want int64 }{
		{3, 4, 7},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 5, math.MaxInt64 - 5, math.MaxInt64},
	} {
		job := Combine("j", [][]Candidate{c(tc.a), c(tc.b)})
		if got := job[0].Result.SimAllocTimeNS; got != tc.want {
			t.Errorf("ranks of %d and %d ns: job time %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
