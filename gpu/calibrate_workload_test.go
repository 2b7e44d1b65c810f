package gpu

import (
	"context"
	"io"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// workloadTrace has five small calls to time: the fake runtime puts every
// allocation on a 2 MiB boundary of its own, so each small cudaMalloc maps
// a page (ids 1, 2, 4) and each small cudaFree unmaps one (ids 1, 2); the
// 4 MiB ones are not timed, a free of an unknown address and a second
// malloc of a live one are skipped, and id 4 is freed at the end, untimed.
const workloadTrace = `malloc id=1 size=4KiB
malloc id=2 size=8KiB
free id=1
free id=9
malloc id=2 size=1KiB
malloc id=3 size=4MiB
free id=2
free id=3
malloc id=4 size=512
`

func TestCalibrationWorkload(t *testing.T) {
	for _, tc := range []struct {
		name, fail string
		want       map[string]int // samples by row
		err        string
	}{
		{"all", "", map[string]int{sim.CostMallocNewPage: 3, sim.CostFreeLastInPage: 2}, ""},
		// The second cudaFree (of id 2) fails: the error names it, and
		// what the workload holds then (ids 2 and 3) is released.
		{"failing free", "FAKECUDA_FAIL=cudaFree:2:700", nil, "workload w: cudaFree"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			if tc.fail != "" {
				env = append(env, tc.fail)
			}
			rt := fakeRuntime(t, "", env...)
			c := &calibration{ctx: context.Background(), rt: rt, opt: CalibrateOptions{WorkloadEvents: 100}, limit: 1 << 30,
				dev: map[uint64]bool{}, host: map[uint64]bool{}}
			w := Workload{Name: "w", Open: func() (trace.Source, io.Closer, error) {
				return textTrace(t, workloadTrace), io.NopCloser(nil), nil
			}}
			samples := map[subKey][]int64{}
			err := c.workload(w, func(s uint64) uint64 { return s }, samples)
			if tc.err != "" && len(c.dev) != 2 {
				t.Errorf("%d pointers held at the failure, want 2 (ids 2 and 3)", len(c.dev))
			}
			if rerr := c.release(); rerr != nil {
				t.Fatal(rerr)
			}
			if n := live(t, rt); n != 0 {
				t.Errorf("%d allocations live after the workload", n)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for k, ns := range samples {
				got[k.row] += len(ns)
			}
			for row, n := range tc.want {
				if got[row] != n {
					t.Errorf("%s: %d samples, want %d (all: %v)", row, got[row], n, got)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("samples %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTrimmedMean checks a row's mean: the slowest 5% of a series of 20
// calls or more left out, a shorter series whole.
func TestTrimmedMean(t *testing.T) {
	for _, tc := range []struct {
		name string
		ns   []int64
		want float64
	}{
		// 19 calls of 10 ns and one of 1000: ceil(0.95*20) = 19 kept.
		{"20 calls, one slow", append(slices.Repeat([]int64{10}, 19), 1000), 10},
		// 40 calls: 38 kept, the two slowest (500, 900) out: (37*10 + 30) / 38.
		{"40 calls, three slow", append(append(slices.Repeat([]int64{10}, 37), 30), 500, 900), 400.0 / 38},
		// 10 calls: all kept, (9*10 + 1000) / 10.
		{"10 calls", append(slices.Repeat([]int64{10}, 9), 1000), 109},
	} {
		c := &calibration{}
		c.add("cudaMalloc", 1<<20, tc.ns)
		if got := c.rows[0].MeanUS * 1e3; math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: mean %v ns, want %v", tc.name, got, tc.want)
		}
		if got, want := c.rows[0].MedianUS*1e3, 10.0; got != want {
			t.Errorf("%s: median %v ns, want %v", tc.name, got, want)
		}
	}
}
