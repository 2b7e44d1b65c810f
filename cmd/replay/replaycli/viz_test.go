package replaycli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// readOps returns the events of the trace at path as "op size stream"
// lines, addresses and times left out.
func readOps(t *testing.T, path string) []string {
	t.Helper()
	f, err := tracefile.Open(path, tracefile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	for {
		ev, err := f.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %d %d", ev.Op, ev.Size, ev.Stream))
	}
}

// TestSimViz replays three real snapshots against the pytorch policy with
// --viz: the simulated allocator's snapshot holds the same entries as the
// real one (actions, sizes, streams), the OOM of split_frag_oom under its
// cap and the mapped pages of mlp_expandable's expandable segments
// included; and every policy's snapshot is written.
func TestSimViz(t *testing.T) {
	dir := t.TempDir()
	viz := filepath.Join(dir, "viz")
	for _, tc := range []struct {
		trace, capacity string
	}{
		{splitFragOOM, "4000MiB"},
		{"../../../testdata/pytorch/multistream.pickle.gz", "0"},
		{"../../../testdata/pytorch/mlp_expandable.pickle.gz", "0"}, // segment_map
	} {
		if _, stderr, err := runCmd(t, "sim", "--policy", "pytorch,cuda", "--capacity", tc.capacity, "--viz", viz, "--json", filepath.Join(dir, "r.json"), tc.trace); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		name := strings.TrimSuffix(filepath.Base(tc.trace), ".pickle.gz")
		got := readOps(t, filepath.Join(viz, name+".pytorch.pickle"))
		want := readOps(t, tc.trace)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: the simulated snapshot's %d entries differ from the real %d", name, len(got), len(want))
		}
		cuda := readOps(t, filepath.Join(viz, name+".cuda.pickle"))
		var allocs int
		for _, l := range cuda {
			if strings.HasPrefix(l, trace.OpSegmentAlloc.String()+" ") {
				allocs++
			}
		}
		if allocs == 0 {
			t.Errorf("%s: the cuda policy's snapshot has no segment allocations", name)
		}
	}
	ents, err := os.ReadDir(viz)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 6 {
		t.Errorf("%d files in the viz directory, want 6 (no temporary files left)", len(ents))
	}
}
