package viz_test

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/viz"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// framesText has mallocs with stacks, one with a call site alone, into a
// private pool named (1,0) by the source, under recorded settings.
const framesText = `header source=pytorch setting.PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64 meta.pools=1=(1,0)
stack id=1 frame=a.py:10:f frame=a.py:30:main
stack id=2 frame=b.py:20:g
malloc id=1 size=1000 stack=1
malloc id=2 size=4MiB stack=2 pool=1
malloc id=3 size=512 label=cudaMalloc@libfoo.so+0x10
free id=1
malloc id=4 size=2000 stack=2
`

// TestRecordFrames: the snapshot of a replay keeps each malloc's frames in
// its trace entries and in the final blocks, a call site as a frame
// ??:0:LABEL, the source's pool id as segment_pool_id and the recorded
// settings; imported again, the mallocs have their stacks back.
func TestRecordFrames(t *testing.T) {
	h, evs, st, err := trace.ParseTextStacks("frames.txt", strings.NewReader(framesText))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rec := viz.NewRecorder(&buf, map[string]string{"policy": "pytorch"})
	if _, err := sim.Run(trace.NewSliceSource(h, evs).WithStacks(st), sim.Config{Policy: "pytorch", Observer: rec}); err != nil {
		t.Fatal(err)
	}
	segs, err := rec.Segments()
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	a := []trace.Frame{{Name: "f", File: "a.py", Line: 10}, {Name: "main", File: "a.py", Line: 30}}
	b := []trace.Frame{{Name: "g", File: "b.py", Line: 20}}
	label := []trace.Frame{{Name: "cudaMalloc@libfoo.so+0x10", File: "??"}}
	// The final blocks, allocated ones with their malloc's frames; the
	// segments with the frames of the malloc that made them.
	got := map[string][]trace.Frame{}
	var pools [][2]uint64
	for _, s := range segs {
		pools = append(pools, s.PoolID)
		for _, bl := range s.Blocks {
			if bl.State == pytorch.StateActiveAllocated {
				got[bl.Frames[0].Name] = bl.Frames
			}
		}
	}
	if want := map[string][]trace.Frame{"g": b, "cudaMalloc@libfoo.so+0x10": label}; !reflect.DeepEqual(got, want) {
		t.Errorf("final blocks' frames %v, want %v", got, want)
	}
	if !reflect.DeepEqual(pools, [][2]uint64{{0, 0}, {1, 0}}) && !reflect.DeepEqual(pools, [][2]uint64{{1, 0}, {0, 0}}) {
		t.Errorf("segment_pool_ids %v, want (0,0) and (1,0)", pools)
	}
	src, err := pytorch.Import(bytes.NewReader(buf.Bytes()), "frames.pickle", pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s := src.Header().Settings; s["PYTORCH_CUDA_ALLOC_CONF"] != "max_split_size_mb:64" || s["policy"] != "pytorch" {
		t.Errorf("allocator_settings %v, want the recorded PYTORCH_CUDA_ALLOC_CONF and the policy", s)
	}
	var mallocs [][]trace.Frame
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Op == trace.OpMalloc {
			mallocs = append(mallocs, trace.StacksOf(src).Frames(ev.Stack))
		}
	}
	if want := [][]trace.Frame{a, b, label, b}; !reflect.DeepEqual(mallocs, want) {
		t.Errorf("imported mallocs' frames %v, want %v", mallocs, want)
	}
}
