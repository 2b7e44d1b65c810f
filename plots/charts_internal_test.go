package plots

import (
	"github.com/gpualloc/allocsim/sim/results"
	"math"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/gpualloc/allocsim/policies"
)

// TestPolicyLooks: the looks policyLooks gives are all different, a
// policy without one (a new one, another module's) gets one derived from
// its name that is none of them, and no chart gives two series one look,
// neither every policy at once nor 30 series (policies under several
// settings, unknown names); a policy keeps its look whatever else the
// chart draws.
func TestPolicyLooks(t *testing.T) {
	names := policies.Names()
	if len(names) < 18 {
		t.Fatalf("%d registered policies, want at least 18", len(names))
	}
	given := map[look]string{}
	for n, l := range policyLooks {
		if other, dup := given[l]; dup {
			t.Errorf("%s and %s are given one look", n, other)
		}
		given[l] = n
	}
	for _, n := range []string{"segfit", "exec:python3 my_policy.py", "plan:minimalloc"} {
		l := lookFor(n)
		if other, ok := given[l]; ok || l.Thin {
			t.Errorf("%s drawn %+v, the look given to %s (or thin)", n, l, other)
		}
		if lookFor(n) != l || chartLooks([]string{n})[0] != l {
			t.Errorf("%s drawn %+v, then %+v", n, l, chartLooks([]string{n})[0])
		}
	}
	distinct := func(what string, ls []look) {
		t.Helper()
		seen := map[look]int{}
		for i, l := range ls {
			if j, dup := seen[l]; dup {
				t.Errorf("%s: series %d and %d share colour %v, dash %d, thin %v", what, j, i, l.Color, l.Dash, l.Thin)
			}
			seen[l] = i
		}
	}
	all := chartLooks(names)
	distinct("every policy", all)
	many := []string{"pytorch", "pytorch", "pytorch", "cuda", "cuda", "unknown-a", "unknown-b"}
	many = append(many, names...)
	many = append(many, "bfc", "best-fit", "tlsf", "slab")
	if len(many) < 30 {
		t.Fatalf("only %d series", len(many))
	}
	ml := chartLooks(many)
	distinct("30 series", ml)
	// A second pytorch keeps pytorch's colour, with another pattern (a
	// dash, or thin once every dash of the colour is taken).
	if ml[1].Color != policyLooks["pytorch"].Color || ml[1] == policyLooks["pytorch"] {
		t.Errorf("second pytorch drawn %+v, want pytorch's colour %v with another dash or thin", ml[1], policyLooks["pytorch"].Color)
	}
	for i, n := range names {
		if one := chartLooks([]string{n})[0]; one != all[i] || one != lookFor(n) {
			t.Errorf("%s alone drawn %+v, among all %+v, want %+v", n, one, all[i], lookFor(n))
		}
	}
	// The near-duplicates of the old palette differ now.
	for _, pair := range [][2]string{{"best-fit", "rmm-binning"}, {"bfc", "rmm-pool"}, {"first-fit", "tlsf"}} {
		a, b := policyLooks[pair[0]], policyLooks[pair[1]]
		if a.Color == b.Color {
			t.Errorf("%s and %s share colour %v", pair[0], pair[1], a.Color)
		}
	}
}

// shownResult is a result of policy with peak reserved MiB and ooms.
func shownResult(policy string, reservedMiB uint64, ooms int64) results.Result {
	return results.Result{Trace: "t.pickle.gz", TraceSource: "pytorch", Policy: policy, PeakReserved: reservedMiB << 20, OOMs: ooms, FirstOOMEvent: -1}
}

func TestShownPolicies(t *testing.T) {
	rs := []results.Result{
		shownResult("async-pool", 640, 0), // 0
		shownResult("best-fit", 500, 2),   // 1: lowest, but ran out of memory
		shownResult("bfc", 1024, 0),       // 2
		shownResult("buddy", 704, 0),      // 3
		shownResult("cuda", 609, 0),       // 4: the baseline, not a "best"
		shownResult("offline", 609, 0),    // 5: a planner
		shownResult("pytorch", 784, 0),    // 6: recorded
		shownResult("slab", 616, 0),       // 7
		shownResult("tlsf", 704, 0),       // 8: ties with buddy, later
	}
	type want struct {
		idx  int
		role string
	}
	check := func(name string, got []Shown, w []want) {
		t.Helper()
		var g []want
		for _, s := range got {
			g = append(g, want{s.Index, s.Role})
		}
		if !slices.Equal(g, w) {
			t.Errorf("%s: shown %v, want %v", name, g, w)
		}
	}
	got, err := ShownPolicies(rs, nil)
	if err != nil {
		t.Fatal(err)
	}
	check("default", got, []want{{6, "recorded"}, {7, "lowest peak"}, {0, "2nd lowest peak"}, {3, "3rd lowest peak"}, {4, "baseline"}})

	// A synthetic trace records no allocator; without cuda, no baseline.
	synth := slices.Clone(rs[:4])
	for i := range synth {
		synth[i].TraceSource = "synth"
	}
	got, err = ShownPolicies(synth, nil)
	if err != nil {
		t.Fatal(err)
	}
	check("synth", got, []want{{0, "lowest peak"}, {3, "2nd lowest peak"}, {2, "3rd lowest peak"}})

	// A CuPy log's recorded allocator is cupy.
	cupy := []results.Result{shownResult("pytorch", 10, 0), shownResult("cupy", 20, 0)}
	cupy[0].TraceSource, cupy[1].TraceSource = "cupy", "cupy"
	got, _ = ShownPolicies(cupy, nil)
	check("cupy", got, []want{{1, "recorded"}, {0, "lowest peak"}})

	got, err = ShownPolicies(rs, []string{"bfc", "best-fit"})
	if err != nil {
		t.Fatal(err)
	}
	check("named", got, []want{{2, ""}, {1, ""}})
	if _, err := ShownPolicies(rs, []string{"bfc", "nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "t.pickle.gz") {
		t.Errorf("ShownPolicies(unknown name) = %v, want an error naming nope and the trace", err)
	}
}

// TestPeakLabel: an OOM bar says OOM and how often in place of its excess
// over the lower bound.
func TestPeakLabel(t *testing.T) {
	r := results.Result{PeakReserved: 2000 << 20, PeakRequested: 4089446400, OOMs: 16}
	if got := peakLabel(r, GiB, 4<<30); got != "1.95\nOOM ×16" {
		t.Errorf("OOM label %q, want %q", got, "1.95\nOOM ×16")
	}
	r.OOMs = 0
	r.PeakReserved = 4152360960
	if got := peakLabel(r, GiB, 4<<30); got != "3.87\n+2%" {
		t.Errorf("label %q, want %q", got, "3.87\n+2%")
	}
}

func TestChartLabels(t *testing.T) {
	rs := []results.Result{
		{Policy: "pytorch", Settings: map[string]string{"roundup_power2_divisions": "8", "garbage_collection_threshold": "0.6"}},
		{Policy: "pytorch", Settings: map[string]string{"roundup_power2_divisions": "4"}},
		{Policy: "pytorch", Settings: map[string]string{"x": "1"}},
		{Policy: "cuda"},
		{Policy: "twin"},
		{Policy: "twin"},
	}
	labels, key := chartLabels(rs)
	want := []string{"pytorch [1]", "pytorch [2]", "pytorch x=1", "cuda", "twin #1", "twin #2"}
	if !slices.Equal(labels, want) {
		t.Errorf("labels %q, want %q", labels, want)
	}
	wantKey := []string{"[1] garbage_collection_threshold=0.6,roundup_power2_divisions=8", "[2] roundup_power2_divisions=4"}
	if !slices.Equal(key, wantKey) {
		t.Errorf("key %q, want %q", key, wantKey)
	}
	// Wrapped at commas and spaces, never inside a word.
	if got, want := wrapWords(key[0], keyWidth), "[1]\ngarbage_collection_threshold=0.6,\nroundup_power2_divisions=8"; got != want {
		t.Errorf("wrapWords = %q, want %q", got, want)
	}
	if got, want := wrapWords("a b c dd", 3), "a b\nc\ndd"; got != want {
		t.Errorf("wrapWords = %q, want %q", got, want)
	}
}

// TestNominalNoOverlap: the names of 19 policies are whole and turned so
// that neighbours do not overlap: their distance across the slant is at
// least a line's height.
func TestNominalNoOverlap(t *testing.T) {
	names := policies.Names()
	p := plot.New()
	p.X.Tick.Label.Font.Size = 10
	nominalPolicies(p, names, Width, 0)
	rot := p.X.Tick.Label.Rotation
	if rot == 0 {
		t.Fatalf("%d names level in %v", len(names), Width)
	}
	slot := slotWidth(len(names), Width, 0)
	h := p.X.Tick.Label.FontExtents().Height
	if apart := slot * vg.Length(math.Sin(rot)); apart < h {
		t.Errorf("names turned %.0f degrees are %v apart, less than their height %v", rot*180/math.Pi, apart, h)
	}
}
