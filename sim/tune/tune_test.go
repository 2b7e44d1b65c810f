package tune

import (
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
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
		cs, err := Run(h, evs, base, confs, jobs)
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
