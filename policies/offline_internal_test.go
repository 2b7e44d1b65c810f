package policies

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/minimalloc"
)

// miniMallocDir is where the MiniMalloc benchmarks are looked for:
// $ALLOCSIM_TRACES/minimalloc, else the shared trace collection.
func miniMallocDir() string {
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		return filepath.Join(d, "minimalloc")
	}
	return filepath.Join("..", "..", "shared", "traces", "minimalloc")
}

// miniMallocEvents reads a MiniMalloc problem as trace events.
func miniMallocEvents(t testing.TB, path string) []trace.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bufs, err := minimalloc.Read(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return minimalloc.Events(bufs)
}

// TestMiniMallocBenchmarks plans the eleven challenging MiniMalloc
// benchmarks A..K with offline and the two greedy baselines: offline must
// be at least as low as every greedy placement on every benchmark, and
// within 1.30x of 1048576 bytes, the height MiniMalloc proved feasible.
// $OFFLINE_NODES sets offline's search budget (to see what a longer search
// reaches); the bounds are checked at the default.
func TestMiniMallocBenchmarks(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(miniMallocDir(), "[A-K].1048576.csv"))
	if len(paths) == 0 {
		t.Skipf("no MiniMalloc benchmarks in %s (set ALLOCSIM_TRACES to the trace collection)", miniMallocDir())
	}
	sort.Strings(paths)
	const proven = 1048576
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			evs := miniMallocEvents(t, path)
			start := time.Now()
			var set Settings
			if n := os.Getenv("OFFLINE_NODES"); n != "" {
				set = Settings{"nodes": n}
			}
			off, err := NewOffline(nil, set)
			if err != nil {
				t.Fatal(err)
			}
			if err := off.Plan(evs); err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			st := off.Stats()
			heights := map[string]uint64{}
			for _, name := range []string{"greedy-by-size", "greedy-by-lifetime"} {
				g, err := New(name, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.(Planner).Plan(evs); err != nil {
					t.Fatal(err)
				}
				heights[name] = g.(*Offline).Stats().Height
			}
			t.Logf("%s: lower bound %d, offline %d (%.3fx of %d; best greedy %s %d = %.3fx; nodes %d, %v), greedy-by-size %.3fx, greedy-by-lifetime %.3fx",
				filepath.Base(path), st.LowerBound, st.Height, float64(st.Height)/proven, proven, st.GreedyBy, st.Greedy, float64(st.Greedy)/proven,
				st.Nodes, elapsed.Round(time.Millisecond),
				float64(heights["greedy-by-size"])/proven, float64(heights["greedy-by-lifetime"])/proven)
			for name, h := range st.Heights {
				if st.Height > h {
					t.Errorf("offline %d > greedy by %s %d", st.Height, name, h)
				}
			}
			for name, h := range heights {
				if st.Height > h {
					t.Errorf("offline %d > %s %d", st.Height, name, h)
				}
			}
			if st.Height > proven*13/10 {
				t.Errorf("offline %d > 1.30 x %d", st.Height, proven)
			}
			if st.Height < st.LowerBound {
				t.Errorf("offline %d < lower bound %d", st.Height, st.LowerBound)
			}
		})
	}
}

// TestPackingProperty checks the placements of the greedy orders and of
// the search on random problems: blocks live at the same time never
// overlap, the height is the highest end, and it is at least the lower
// bound. (The replay's checker sees only the placement a trace ends up
// with; this sees the search's own on problems where it beats the greedy
// orders.)
func TestPackingProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "blocks")
		horizon := rapid.IntRange(2, 60).Draw(t, "horizon")
		bufs := make([]packBuf, n)
		for i := range bufs {
			start := rapid.IntRange(0, horizon-1).Draw(t, "start")
			end := rapid.IntRange(start+1, horizon).Draw(t, "end")
			size := uint64(rapid.IntRange(1, 16).Draw(t, "size")) * 256
			bufs[i] = packBuf{start: int64(start), end: int64(end), size: size, call: i}
		}
		check := func(what string, offs []uint64, height uint64, lb uint64) {
			var top uint64
			for i, a := range bufs {
				top = max(top, offs[i]+a.size)
				for j := i + 1; j < len(bufs); j++ {
					b := bufs[j]
					if a.start < b.end && b.start < a.end && offs[i] < offs[j]+b.size && offs[j] < offs[i]+a.size {
						t.Fatalf("%s: blocks %d [%d, %d) at %d+%d and %d [%d, %d) at %d+%d overlap", what, i, a.start, a.end, offs[i], a.size, j, b.start, b.end, offs[j], b.size)
					}
				}
			}
			if top != height || height < lb {
				t.Fatalf("%s: height %d, highest end %d, lower bound %d", what, height, top, lb)
			}
		}
		pp := newPackProblem(bufs)
		for _, o := range greedyOrders {
			offs, h := pp.greedy(pp.sortedBy(o))
			check("greedy by "+o.name, offs, h, pp.lb)
		}
		res := solvePacking(bufs, greedyOrders, 5000)
		check("offline", res.offsets, res.height, pp.lb)
		if res.height > res.stats.Greedy {
			t.Fatalf("offline %d above the best greedy %d", res.height, res.stats.Greedy)
		}
		// The search alone, from a height above the lower bound.
		s := newSearch(pp)
		if offs, h, _ := s.minimize(res.stats.Greedy+256, 5000); offs != nil {
			check("search", offs, h, pp.lb)
		}
	})
}

// TestSortByLo checks sortByLo against a comparison sort: the same
// intervals in an order of ascending lo, and bestFit's answer on it the
// same for every size, on lists of random length (both sides of the
// radix sort's threshold) whose los share some high bytes, repeat, and
// are aligned as a planner's offsets are.
func TestSortByLo(t *testing.T) {
	var scratch []interval
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(t, "n")
		base := rapid.Uint64Range(0, 1<<40).Draw(t, "base")
		spread := rapid.Uint64Range(1, 1<<rapid.IntRange(0, 63).Draw(t, "spreadLog2")).Draw(t, "spread")
		align := uint64(1) << rapid.IntRange(0, 12).Draw(t, "alignLog2")
		ivs := make([]interval, n)
		for k := range ivs {
			lo := (base + rapid.Uint64Range(0, spread).Draw(t, "lo")) &^ (align - 1)
			if k > 0 && rapid.IntRange(0, 4).Draw(t, "repeat") == 0 {
				lo = ivs[rapid.IntRange(0, k-1).Draw(t, "of")].lo
			}
			ivs[k] = interval{lo, lo + rapid.Uint64Range(0, 1<<30).Draw(t, "size")}
		}
		want := slices.Clone(ivs)
		slices.SortFunc(want, func(a, b interval) int { return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.hi, b.hi)) })
		got := slices.Clone(ivs)
		scratch = sortByLo(got, scratch)
		for k := 1; k < len(got); k++ {
			if got[k].lo < got[k-1].lo {
				t.Fatalf("sortByLo: lo %#x at %d after %#x", got[k].lo, k, got[k-1].lo)
			}
		}
		same := slices.Clone(got)
		slices.SortStableFunc(same, func(a, b interval) int { return cmp.Compare(a.hi, b.hi) })
		slices.SortStableFunc(same, func(a, b interval) int { return cmp.Compare(a.lo, b.lo) })
		if !slices.Equal(same, want) {
			t.Fatalf("sortByLo changed the intervals: got %v, want %v", got, want)
		}
		for _, size := range []uint64{0, 1, 512, 1 << 20, rapid.Uint64Range(0, 1<<34).Draw(t, "size")} {
			if g, w := bestFit(got, size), bestFit(want, size); g != w {
				t.Fatalf("bestFit(%d) = %#x after sortByLo, %#x after a comparison sort", size, g, w)
			}
		}
	})
}
