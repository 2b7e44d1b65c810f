package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// TestPyTorchSameReplay, by hand on a 100 MiB device: a malloc of 30 MiB
// (a 30 MiB segment; 0 bytes reserved where a collection would run), one
// of 30 MiB + 1 byte while the first is live (rounded to 30 MiB + 512, a
// 32 MiB segment split; 30 MiB reserved there), both freed, then one of
// 8 MiB, which finds the 30 MiB cached block (no collection point). The
// largest size a max_split_size_mb would have met is the rounded 30 MiB +
// 512: 31 MiB or more makes the same replay, 30 does not (the second malloc
// would be oversize, its segment not split). The reserved bytes at a
// collection point were at most 30 MiB: a threshold of 0.31 of the 100 MiB
// or more is the same, 0.29 is not.
func TestPyTorchSameReplay(t *testing.T) {
	dev := sim.NewDevice(100 * ptMiB)
	p, err := policies.NewPyTorch(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Malloc(30*ptMiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Malloc(30*ptMiB+1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []policies.Block{a, b} {
		if err := p.Free(x.Addr, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Malloc(8*ptMiB, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		conf string
		same bool
	}{
		{"", true},
		{"max_split_size_mb:1024", true},
		{"max_split_size_mb:31", true},
		{"max_split_size_mb:30", false}, // the 30 MiB block found for the 8 MiB malloc
		{"max_split_size_mb:20", false},
		{"garbage_collection_threshold:0.31", true},
		{"garbage_collection_threshold:0.8", true},
		{"garbage_collection_threshold:0.29", false},
		{"max_split_size_mb:64,garbage_collection_threshold:0.6", true},
		{"max_split_size_mb:30,garbage_collection_threshold:0.6", false},
		{"roundup_power2_divisions:4", false},
		{"expandable_segments:True", false},
		{"max_non_split_rounding_mb:40", false},
	} {
		same, err := p.SameReplay(policies.Settings{"conf": tc.conf})
		if err != nil {
			t.Fatal(err)
		}
		if same != tc.same {
			t.Errorf("SameReplay(%q) = %v, want %v", tc.conf, same, tc.same)
		}
	}
	if _, err := p.SameReplay(policies.Settings{"conf": "max_split_size_mb:x"}); err == nil {
		t.Error("SameReplay of a bad setting: no error")
	}
	// A replay with a threshold set is compared with nothing else.
	q, _ := policies.NewPyTorch(sim.NewDevice(100*ptMiB), policies.Settings{"conf": "garbage_collection_threshold:0.5"})
	if same, _ := q.SameReplay(policies.Settings{"conf": "garbage_collection_threshold:0.6"}); same {
		t.Error("SameReplay from a replay with a threshold: true")
	}
}
