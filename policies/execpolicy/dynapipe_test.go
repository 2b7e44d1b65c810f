package execpolicy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// TestDynaPipe replays kv_decode (../shared/traces, or $ALLOCSIM_TRACES)
// through DynaPipe's Python port of PyTorch's caching allocator, run from
// the checkout $DYNAPIPE names by python/examples/dynapipe_torch.py, and
// holds it to the pytorch policy: peak reserved 822083584 bytes and 29
// device mallocs, as measured of the real allocator. DynaPipe is not part
// of allocsim: without $DYNAPIPE (as in CI) the test says so and skips, as
// make bench's DynaPipe loop does.
func TestDynaPipe(t *testing.T) {
	needPython(t)
	root := os.Getenv("DYNAPIPE")
	if root == "" {
		t.Skip("set DYNAPIPE to a checkout of github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines")
	}
	traces := os.Getenv("ALLOCSIM_TRACES")
	if traces == "" {
		traces = filepath.Join("..", "..", "..", "shared", "traces")
	}
	f, err := tracefile.Open(filepath.Join(traces, "pytorch", "kv_decode.pickle.gz"), tracefile.Options{})
	if err != nil {
		t.Skipf("no kv_decode: %v", err)
	}
	defer f.Close()
	evs, err := trace.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sim.Run(trace.NewSliceSource(f.Header(), evs),
		sim.Config{Policy: "exec:python3 ../../python/examples/dynapipe_torch.py"},
		sim.Config{Policy: "pytorch"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.PeakReserved != 822083584 || r.DeviceAllocs != 29 || r.OOMs != 0 {
			t.Errorf("%s: peak reserved %d, %d device mallocs, %d OOMs; want 822083584, 29, 0", r.Policy, r.PeakReserved, r.DeviceAllocs, r.OOMs)
		}
	}
}
