package sites_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/sites"
	"github.com/gpualloc/allocsim/trace"
)

// twoSites is a trace with two sites of user code (b.py:20:g under a
// frame of PyTorch's) and a `record run` call site. Under the pytorch
// policy (CUDACachingAllocator's sizes):
//
//	0 malloc 1: 1000 B, small: a 2 MiB segment A (2097152)
//	1 malloc 2: 3000 B in A
//	2 malloc 3: 4 MiB, under 10 MiB: a 20 MiB segment B (20971520)
//	3 malloc 4: 2 MiB in B's free 16 MiB
//	4 malloc 7: 512 B in A, the call site alone
//	5 free 2
//	6 malloc 5: 16 MiB, more than B's free 14: a 16 MiB segment C; the
//	  peak: 2 + 20 + 16 MiB = 39845888 bytes reserved
//	7 malloc 6: 5000 B in A, after the peak
//
// At the end of event 6: A holds 1000 (a.py:10:f) and 512 (the label)
// live, so 2097152 - 1512 = 2095640 unused: a.py 2095640*1000/1512 =
// 1386005 and the remainder 1 (most live bytes), the label
// 2095640*512/1512 = 709634. B holds 4194304 (a.py) and 2097152 (b.py),
// 14680064 unused: a.py 9786709 + 1, b.py 4893354. C holds 16777216 of
// b.py, none unused. So a.py: 4195304 live in 2, 11172716 unused; b.py:
// 18874368 live in 2, 4893354 unused; the label: 512 in 1, 709634;
// together 39845888.
const twoSites = `
stack id=1 frame=a.py:10:f
stack id=2 frame=lib/python3.12/site-packages/torch/nn/modules/module.py:5:_call_impl frame=b.py:20:g frame=b.py:30:main
malloc id=1 size=1000 stack=1
malloc id=2 size=3000 stack=2
malloc id=3 size=4MiB stack=1
malloc id=4 size=2MiB stack=2
malloc id=7 size=512 label=cudaMalloc@libfoo.so+0x10
free id=2
malloc id=5 size=16MiB stack=2
malloc id=6 size=5000
`

func atPeak(t *testing.T, policy string, opt sites.Options) (*sim.Result, *sim.SitesAtPeak) {
	t.Helper()
	h, evs, st, err := trace.ParseTextStacks("two.txt", strings.NewReader(twoSites))
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.Config{Trace: "two", Policy: policy}
	rs, err := sim.Run(trace.NewSliceSource(h, evs).WithStacks(st), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sites.AtPeak(trace.NewSliceSource(h, evs).WithStacks(st), cfg, rs[0], opt)
	if err != nil {
		t.Fatal(err)
	}
	return rs[0], s
}

func TestAtPeak(t *testing.T) {
	res, s := atPeak(t, "pytorch", sites.Options{Depth: 1})
	if res.PeakReserved != 39845888 || s.Event != 6 || s.Reserved != 39845888 {
		t.Fatalf("peak %d at event %d (%d reserved), want 39845888 at 6", res.PeakReserved, s.Event, s.Reserved)
	}
	want := []sim.SiteBytes{
		{Site: "b.py:20:g", LiveBytes: 18874368, Count: 2, UnusedBytes: 4893354},
		{Site: "a.py:10:f", LiveBytes: 4195304, Count: 2, UnusedBytes: 11172716},
		{Site: "cudaMalloc@libfoo.so+0x10", LiveBytes: 512, Count: 1, UnusedBytes: 709634},
	}
	if !reflect.DeepEqual(s.Sites, want) {
		t.Errorf("sites:\n got %+v\nwant %+v", s.Sites, want)
	}
	// Two frames of user code: b.py's caller joins it.
	_, s = atPeak(t, "pytorch", sites.Options{Depth: 2, Top: 1})
	want = []sim.SiteBytes{
		{Site: "b.py:20:g < b.py:30:main", LiveBytes: 18874368, Count: 2, UnusedBytes: 4893354},
		{Site: "(2 other sites)", LiveBytes: 4195304 + 512, Count: 3, UnusedBytes: 11172716 + 709634},
	}
	if !reflect.DeepEqual(s.Sites, want) {
		t.Errorf("depth 2, top 1:\n got %+v\nwant %+v", s.Sites, want)
	}
	// cuda: a segment per malloc, rounded up to 512 bytes, freed at the
	// free; its peak is at the last malloc, event 7: 1024 + 4 MiB + 2 MiB
	// + 512 + 16 MiB + 5120 = 23075328, each site's unused bytes its
	// rounding (1000 -> 1024, 5000 -> 5120).
	res, s = atPeak(t, "cuda", sites.Options{Depth: 1})
	want = []sim.SiteBytes{
		{Site: "b.py:20:g", LiveBytes: 18874368, Count: 2},
		{Site: "a.py:10:f", LiveBytes: 4195304, Count: 2, UnusedBytes: 24},
		{Site: sites.NoStack, LiveBytes: 5000, Count: 1, UnusedBytes: 120},
		{Site: "cudaMalloc@libfoo.so+0x10", LiveBytes: 512, Count: 1},
	}
	if res.PeakReserved != 23075328 || s.Event != 7 || !reflect.DeepEqual(s.Sites, want) {
		t.Errorf("cuda: peak %d at %d, sites %+v\nwant 23075328 at 7, %+v", res.PeakReserved, s.Event, s.Sites, want)
	}
}

func TestName(t *testing.T) {
	torch := trace.Frame{Name: "_call_impl", File: "lib/python3.12/site-packages/torch/nn/modules/module.py", Line: 1790}
	for _, tc := range []struct {
		frames []trace.Frame
		label  string
		depth  int
		want   string
	}{
		{nil, "", 1, sites.NoStack},
		{nil, "cuMemAlloc@libcublas.so.13+0x5b45ee", 1, "cuMemAlloc@libcublas.so.13+0x5b45ee"},
		{[]trace.Frame{{Name: "malloc", File: "c10/cuda/CUDACachingAllocator.cpp", Line: 1}, {Name: "??", File: "??", Line: 0}, torch, {Name: "_run_code", File: "<frozen runpy>", Line: 88},
			{Name: "__enter__", File: "/usr/lib/python3.12/contextlib.py", Line: 137}, {Name: "forward", File: "lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py", Line: 300}, {Name: "main", File: "train.py", Line: 9}}, "", 2,
			"lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py:300:forward < train.py:9:main"},
		{[]trace.Frame{torch, {Name: "step", File: "torch/optim/adam.py", Line: 3}}, "", 1, torch.String()},
		// autograd's backward pass, as PyTorch records it with stacks on:
		// C++ frames only (it was its innermost, torch::unwind::unwind()).
		{[]trace.Frame{{Name: "torch::unwind::unwind()", File: "??", Line: 0}, {Name: "torch::CapturedTraceback::gather(bool, bool, bool)", File: "??", Line: 0},
			{Name: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", File: "CUDACachingAllocator.cpp", Line: 0}}, "", 1, sites.CppOnly},
		{[]trace.Frame{{Name: "??", File: "??", Line: 0}, {Name: "malloc", File: "CUDACachingAllocator.cpp", Line: 0}, torch}, "", 2, torch.String()},
	} {
		if got := sites.Name(tc.frames, tc.label, tc.depth); got != tc.want {
			t.Errorf("Name(%v, %q, %d) = %q, want %q", tc.frames, tc.label, tc.depth, got, tc.want)
		}
	}
}

// TestAtPeakFailedMalloc: the peak at an instant within a malloc that
// failed in the recording and that the policy served and gave back at
// once. cuda: 1 MiB live (a.py), then 3000 KiB for an instant, rounded to
// 512 bytes (3072000, a segment of its own that the free gives back): the
// peak 1048576 + 3072000 = 4120576 bytes at event 1, whose end holds only
// the 1 MiB; the instant's row has the request's bytes live and none
// unused, and the rows add up to the peak (it was an error: "the segments
// at event 1 hold 1048576 bytes, the replay reserved 4120576").
func TestAtPeakFailedMalloc(t *testing.T) {
	text := "stack id=1 frame=a.py:10:f\nmalloc id=1 size=1MiB stack=1\nmalloc_failed size=3072000\nfree id=1\n"
	h, evs, st, err := trace.ParseTextStacks("failed.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.Config{Trace: "failed", Policy: "cuda"}
	rs, err := sim.Run(trace.NewSliceSource(h, evs).WithStacks(st), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sites.AtPeak(trace.NewSliceSource(h, evs).WithStacks(st), cfg, rs[0], sites.Options{Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []sim.SiteBytes{
		{Site: "a.py:10:f", LiveBytes: 1 << 20, Count: 1},
		{Site: sites.FailedMalloc, LiveBytes: 3072000, Count: 1},
	}
	if rs[0].PeakReserved != 4120576 || s.Event != 1 || !reflect.DeepEqual(s.Sites, want) {
		t.Errorf("peak %d at %d, sites %+v\nwant 4120576 at 1, %+v", rs[0].PeakReserved, s.Event, s.Sites, want)
	}
}
