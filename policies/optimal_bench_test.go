package policies

import (
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// BenchmarkOptimalMiniMalloc plans each of MiniMalloc's benchmarks A..K
// with the optimal policy ($OPTIMAL_TIME its time limit, 60s by default)
// and reports the plan's height, proven lower bound, whether they meet,
// nodes and seconds: the table of the policy's doc. Run it by hand:
//
//	GOMAXPROCS=1 go test ./policies -run '^$' -bench OptimalMiniMalloc -benchtime 1x
func BenchmarkOptimalMiniMalloc(b *testing.B) {
	paths, _ := filepath.Glob(filepath.Join(miniMallocDir(), "[A-K].1048576.csv"))
	if len(paths) == 0 {
		b.Skipf("no MiniMalloc benchmarks in %s", miniMallocDir())
	}
	sort.Strings(paths)
	limit := "60s"
	if v := os.Getenv("OPTIMAL_TIME"); v != "" {
		limit = v
	}
	for _, path := range paths {
		b.Run(filepath.Base(path), func(b *testing.B) {
			evs := miniMallocEvents(b, path)
			for range b.N {
				p, err := NewOptimal(nil, Settings{"time": limit})
				if err != nil {
					b.Fatal(err)
				}
				// A plan of its own, not the cache's.
				optimalCache.Lock()
				optimalCache.plans = nil
				optimalCache.Unlock()
				start := time.Now()
				if err := p.Plan(evs); err != nil {
					b.Fatal(err)
				}
				st := p.Stats()
				b.ReportMetric(float64(st.Height), "peak-bytes")
				b.ReportMetric(float64(st.LowerBound), "bound-bytes")
				b.ReportMetric(map[bool]float64{true: 1}[st.Proven], "proven")
				b.ReportMetric(float64(st.Nodes), "nodes")
				b.Logf("%s: blocks %d, peak %d, lower bound %d (load %d), proven %v, greedy %d, probes %d (%d infeasible), nodes %d, %.2f s, stopped %q",
					filepath.Base(path), st.Blocks, st.Height, st.LowerBound, st.LoadBound, st.Proven, st.Greedy, st.Probes, st.Infeasible, st.Nodes, time.Since(start).Seconds(), st.Stopped)
				if st.Height > 1048576 {
					b.Errorf("%s: peak %d > 1048576, the height MiniMalloc fits it in", filepath.Base(path), st.Height)
				}
			}
		})
	}
}
