package tables

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
)

// TestTableOptimum: where the optimal policy proved its trace's least
// peak, the table's column against the best placement is ×optimum (a
// pytorch row of 900 bytes over the optimum's 600 reads 1.500) and a note
// gives the optimum; where it did not, the column stays ×offline and the
// note gives the best placement, the bound and the gap (1042432 over
// 986112 bytes: 5.7113%) and what stopped the search.
func TestTableOptimum(t *testing.T) {
	proven := []*results.Result{
		{Trace: "a.csv", Policy: "optimal", PeakReserved: 600, PeakRequested: 600, PeakOptimum: 600, Plan: &results.PlanBound{Height: 600, LowerBound: 600, Proven: true, Seconds: 0.25, Nodes: 12}},
		{Trace: "a.csv", Policy: "pytorch", PeakReserved: 900, PeakRequested: 600, PeakOptimum: 600},
	}
	var b bytes.Buffer
	Sim(&b, proven, false)
	out := b.String()
	for _, want := range []string{"×optimum", "1.500", "a.csv: optimal: least peak of any fixed-address placement 600 bytes, proven (12 search nodes)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table with a proven optimum lacks %q:\n%s", want, out)
		}
	}
	open := []*results.Result{
		{Trace: "d.csv", Policy: "optimal", PeakReserved: 1042432, PeakRequested: 986112, PeakOffline: 1080320, Plan: &results.PlanBound{Height: 1042432, LowerBound: 986112, Seconds: 60, Nodes: 5000000, Stopped: "time"}},
		{Trace: "d.csv", Policy: "offline", PeakReserved: 1080320, PeakRequested: 986112, PeakOffline: 1080320},
	}
	b.Reset()
	Sim(&b, open, true)
	out = b.String()
	for _, want := range []string{"reserved/offline", "d.csv: optimal: best placement found 1042432 bytes, proven lower bound 986112 bytes (gap 5.7113%), not proven: stopped by its time limit (60.0 s, 5000000 search nodes)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("table without an optimum lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "reserved/optimum") {
		t.Errorf("table without an optimum has a ×optimum column:\n%s", out)
	}
}
