package policies

import (
	"slices"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// TestPlanCache: a second plan of the same events with the same settings
// is the first one's, taken from the cache; events that differ in one
// size, or other settings, are planned anew.
func TestPlanCache(t *testing.T) {
	evs := []trace.Event{
		{Op: trace.OpMalloc, Addr: 1, Size: 4096},
		{Op: trace.OpMalloc, Addr: 2, Size: 8192},
		{Op: trace.OpFree, Addr: 1},
		{Op: trace.OpMalloc, Addr: 3, Size: 2048},
	}
	plan := func(name string, evs []trace.Event) (*Offline, bool) {
		t.Helper()
		p, err := New(name, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := p.(*Offline)
		hit := cachedPlanOf(o.planKeyOf(evs)) != nil
		if err := o.Plan(evs); err != nil {
			t.Fatal(err)
		}
		return o, hit
	}
	a, hit := plan(OfflineName, evs)
	if hit {
		t.Fatal("a plan in the cache before the first")
	}
	b, hit := plan(OfflineName, evs)
	if !hit || !slices.Equal(a.mallocs, b.mallocs) || a.height != b.height || a.height != 8192+4096 {
		t.Errorf("second plan: from the cache %v, mallocs %v against %v, height %d against %d (want 12288)", hit, b.mallocs, a.mallocs, b.height, a.height)
	}
	other := slices.Clone(evs)
	other[3].Size = 4096
	if _, hit := plan(OfflineName, other); hit {
		t.Error("events with another size took the cached plan")
	}
	if _, hit := plan("greedy-by-size", evs); hit {
		t.Error("another planner took offline's plan")
	}
}
