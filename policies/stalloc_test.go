package policies_test

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/synth"
)

// runSTAlloc replays evs against stalloc with settings s through sim.Run
// under the invariant checker, on a device of capacity bytes, and returns
// the result and the policy.
func runSTAlloc(evs []trace.Event, s policies.Settings, capacity uint64) (*sim.Result, *policies.STAlloc, error) {
	var p *policies.STAlloc
	rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "text"}, evs), sim.Config{
		Trace: "t", Policy: policies.STAllocName, Settings: s, Capacity: capacity, Check: true,
		NewPolicy: func(dev policies.Device, s policies.Settings) (policies.Policy, error) {
			q, err := policies.NewSTAlloc(dev, s)
			p = q
			return q, err
		},
	})
	if err != nil {
		return nil, p, err
	}
	return rs[0], p, nil
}

// TestSTAllocWarningsInResult: the replay engine puts stalloc's warnings
// (policies.Warner) in the result. Three iterations of a 2048-byte malloc
// after a 1024-byte weight; the fourth asks 4096 bytes (event 11): it goes
// to PyTorch's caching allocator (a 2 MiB segment), and the result says
// so. Peak reserved: the region (weight + one 2048-byte block, 3072 bytes)
// and the segment.
func TestSTAllocWarningsInResult(t *testing.T) {
	_, evs, err := trace.ParseText("t", strings.NewReader(`malloc id=1 size=1024
marker label="iteration 0"
malloc id=2 size=2048
free id=2
marker label="iteration 1"
malloc id=3 size=2048
free id=3
marker label="iteration 2"
malloc id=4 size=2048
free id=4
marker label="iteration 3"
malloc id=5 size=4096
free id=5
`))
	if err != nil {
		t.Fatal(err)
	}
	r, p, err := runSTAlloc(evs, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.PeakReserved != 3072+2<<20 {
		t.Errorf("peak reserved %d, want %d", r.PeakReserved, 3072+2<<20)
	}
	if st := p.Stats(); st.Mismatched != 1 {
		t.Errorf("mismatched %d, want 1", st.Mismatched)
	}
	want := "first: event 11 (malloc #4 of 4096 bytes, position 0 of iteration 3): position 0 was planned for 2048 bytes"
	found := false
	for _, w := range r.Warnings {
		found = found || strings.Contains(w, want)
	}
	if !found {
		t.Errorf("result warnings %q: none with %q", r.Warnings, want)
	}
}

// TestSTAllocTrainingProperty replays random training-like traces under
// the invariant checker: a setup of weights, then iterations that repeat
// a template of mallocs and frees (some freed in the next iteration, on
// one or two streams), with markers or without, where some iterations
// part from it (a size changed, a malloc added or dropped, a free
// delayed). Each replay must end without error or OOM; one whose
// iterations (three or more, as many as the profile) all follow the
// template, with markers, must serve every malloc over the small size from
// its plan.
func TestSTAllocTrainingProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs, exact := genTraining(t)
		markers := rapid.Bool().Draw(t, "markers")
		if !markers {
			kept := evs[:0]
			for _, ev := range evs {
				if ev.Op != trace.OpMarker {
					kept = append(kept, ev)
				}
			}
			evs = kept
		}
		r, p, err := runSTAlloc(evs, nil, 0)
		if err != nil {
			t.Fatalf("%v\ntrace:\n%s", err, textOf(evs))
		}
		if r.OOMs != 0 || r.PeakReserved < r.PeakRequested {
			t.Fatalf("%d OOMs, peak reserved %d, requested %d", r.OOMs, r.PeakReserved, r.PeakRequested)
		}
		st := p.Stats()
		if n := len(st.Starts); markers && exact && n >= 3 && (st.Deviations != 0 || st.Dynamic != 0 || st.Online != int64(st.Small+st.SmallSlots*(n-1))) {
			t.Fatalf("a trace that follows its profile: %+v\ntrace:\n%s", st, textOf(evs))
		}
	})
}

func textOf(evs []trace.Event) string {
	var b strings.Builder
	for i, ev := range evs {
		fmt.Fprintf(&b, "%3d %s\n", i, trace.FormatText(ev))
	}
	return b.String()
}

// genTraining draws a training-like trace (see TestSTAllocTrainingProperty)
// and reports whether its iterations all follow the template.
func genTraining(t *rapid.T) ([]trace.Event, bool) {
	var evs []trace.Event
	next := uint64(1)
	emit := func(ev trace.Event) {
		ev.Time = int64(len(evs))
		evs = append(evs, ev)
	}
	stream := map[uint64]uint64{} // a live malloc's stream
	malloc := func(size, s uint64) uint64 {
		a := next
		next++
		stream[a] = s
		emit(trace.Event{Op: trace.OpMalloc, Addr: a, Size: size, Stream: s})
		return a
	}
	free := func(a uint64) {
		emit(trace.Event{Op: trace.OpFree, Addr: a, Stream: stream[a]})
		delete(stream, a)
	}
	for n := rapid.IntRange(0, 3).Draw(t, "weights"); n > 0; n-- {
		malloc(uint64(rapid.IntRange(1, 64).Draw(t, "weight"))<<10, 0)
	}
	// The template: mallocs of sizes, each freed after frees[k] more
	// mallocs of its iteration (or at its end, or in the next one).
	m := rapid.IntRange(1, 8).Draw(t, "mallocs")
	sizes := make([]uint64, m)
	life := make([]int, m)   // mallocs after it before its free; m-k or more: at the end
	cross := make([]bool, m) // freed at the start of the next iteration
	streams := make([]uint64, m)
	for k := range sizes {
		sizes[k] = uint64(rapid.IntRange(1, 4096).Draw(t, "size")) * 256
		life[k] = rapid.IntRange(0, m).Draw(t, "life")
		cross[k] = rapid.IntRange(0, 4).Draw(t, "cross") == 0
		streams[k] = uint64(rapid.IntRange(0, 1).Draw(t, "stream"))
	}
	exact := true
	var carried []uint64 // allocations freed at the start of the next iteration
	iters := rapid.IntRange(1, 6).Draw(t, "iterations")
	for it := range iters {
		emit(trace.Event{Op: trace.OpMarker, Label: fmt.Sprintf("iteration %d", it)})
		for _, a := range carried {
			free(a)
		}
		carried = carried[:0]
		deviate := it >= 2 && rapid.IntRange(0, 3).Draw(t, "deviate") == 0
		exact = exact && !deviate
		type pending struct {
			addr  uint64
			after int // mallocs still to come before its free
		}
		var live []pending
		step := func() {
			kept := live[:0]
			for _, l := range live {
				if l.after <= 0 {
					free(l.addr)
					continue
				}
				l.after--
				kept = append(kept, l)
			}
			live = kept
		}
		for k := range m {
			size, lifeK := sizes[k], life[k]
			if deviate {
				switch rapid.IntRange(0, 5).Draw(t, "how") {
				case 0:
					size += 256
				case 1:
					lifeK++
				case 2:
					continue // dropped
				case 3:
					malloc(size, streams[k]) // one more, never freed
				}
			}
			a := malloc(size, streams[k])
			if cross[k] {
				carried = append(carried, a)
			} else {
				live = append(live, pending{a, lifeK})
			}
			step()
		}
		for _, l := range live {
			free(l.addr)
		}
	}
	return evs, exact
}

// TestSTAllocFixedShapes: on the training loop STAlloc is made for, every
// iteration alike (trace/synth's train workload with batch and sequence
// fixed, markers at the iterations), every malloc of iterations 2 on
// follows the plan, and the peak reserved bytes come within 2 MiB (the
// online manager's segment for the requests of at most 512 bytes) of the
// offline placement's, which sees the whole trace; with batch and sequence
// drawn anew each iteration, mallocs part from the plan and go online.
func TestSTAllocFixedShapes(t *testing.T) {
	run := func(set map[string]string) (*sim.Result, *sim.Result, *policies.STAlloc) {
		h, evs := trainTrace(t, set)
		r, p, err := runSTAlloc(evs, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := sim.Run(trace.NewSliceSource(h, evs), sim.Config{Trace: "t", Policy: policies.OfflineName, Settings: policies.Settings{"nodes": "0"}})
		if err != nil {
			t.Fatal(err)
		}
		return r, rs[0], p
	}
	r, off, p := run(map[string]string{"iterations": "8", "layers": "4", "batch-min": "8", "batch-max": "8", "seq-min": "256", "seq-max": "256"})
	st := p.Stats()
	if st.Found != "markers" || len(st.Starts) != 8 || st.Deviations != 0 || st.Dynamic != 0 {
		t.Errorf("fixed shapes: %+v: want 8 iterations from markers, no deviation, no dynamic position", st)
	}
	if r.PeakReserved > off.PeakReserved+2<<20 {
		t.Errorf("fixed shapes: peak reserved %d, offline %d", r.PeakReserved, off.PeakReserved)
	}
	_, _, p = run(map[string]string{"iterations": "8", "layers": "4"})
	if st := p.Stats(); st.Deviations == 0 && st.Dynamic == 0 {
		t.Errorf("shapes drawn each iteration: %+v: want deviations or dynamic positions", st)
	}
}

// TestSTAllocPlanMemo: a plan is made once for the same events and
// settings (replay fit replays a trace at many capacities), and never
// given for other events or other settings: two training traces and a
// change of alignment, replayed in turn, each get their own plan.
func TestSTAllocPlanMemo(t *testing.T) {
	stats := func(set map[string]string, s policies.Settings) (policies.STAllocStats, uint64) {
		_, evs := trainTrace(t, set)
		r, p, err := runSTAlloc(evs, s, 0)
		if err != nil {
			t.Fatal(err)
		}
		return p.Stats(), r.PeakReserved
	}
	a := map[string]string{"iterations": "6", "layers": "4", "batch-min": "8", "batch-max": "8", "seq-min": "256", "seq-max": "256"}
	b := map[string]string{"iterations": "6", "layers": "5", "batch-min": "8", "batch-max": "8", "seq-min": "256", "seq-max": "256"}
	sa, pa := stats(a, nil)
	sb, pb := stats(b, nil)
	if sa.Height == sb.Height || pa == pb {
		t.Fatalf("traces of 4 and 5 layers planned alike: heights %d and %d, peaks %d and %d", sa.Height, sb.Height, pa, pb)
	}
	if sa2, pa2 := stats(a, nil); sa2.Height != sa.Height || pa2 != pa {
		t.Errorf("4 layers again: height %d, peak %d; first %d, %d", sa2.Height, pa2, sa.Height, pa)
	}
	if s4k, _ := stats(a, policies.Settings{"alignment": "2MiB"}); s4k.Height == sa.Height {
		t.Errorf("alignment 2MiB: height %d, as with 512 B: the plan of other settings", s4k.Height)
	}
}

// trainTrace returns the header and events of synth's "train" generator
// (seed 1) with the settings set.
func trainTrace(t *testing.T, set map[string]string) (trace.Header, []trace.Event) {
	t.Helper()
	src, err := synth.New("train", 1, set)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := trace.ReadAll(src)
	if err != nil {
		t.Fatal(err)
	}
	return src.Header(), evs
}
