package pytorch

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// sliceInput is a small snapshot to cut: a small-pool segment at sA and a
// large one at sB, a block freed on another stream (its free completes
// later), a large block that takes its segment's end whole (the rest, 548352
// bytes, is under 1 MiB, which the allocator does not split off), and
// the large segment freed at the end. Times are t=100+i microseconds.
const (
	sA  = 0x10000000
	sB  = 0x20000000
	MiB = 1 << 20
)

var (
	fa = []trace.Frame{{Name: "embed", File: "model.py", Line: 10}, {Name: "main", File: "train.py", Line: 5}}
	fb = []trace.Frame{{Name: "attn", File: "model.py", Line: 20}}
	fc = []trace.Frame{{Name: "mlp", File: "model.py", Line: 30}}
	fd = []trace.Frame{{Name: "logits", File: "model.py", Line: 40}}
	fe = []trace.Frame{{Name: "loss", File: "train.py", Line: 9}}
)

func sliceInputEntries() []TraceEntry {
	es := []TraceEntry{
		{Action: "segment_alloc", Addr: sA, Size: 2 * MiB, Frames: fa},         // 0
		{Action: "alloc", Addr: sA, Size: 1000, Frames: fa},                    // 1: a 1024-byte block
		{Action: "alloc", Addr: sA + 1024, Size: 700, Frames: fb},              // 2: 1024 bytes
		{Action: "segment_alloc", Addr: sB, Size: 20 * MiB, Frames: fc},        // 3
		{Action: "alloc", Addr: sB, Size: 3 * MiB, Frames: fc},                 // 4
		{Action: "free_requested", Addr: sA, Size: 1000, Frames: fe},           // 5
		{Action: "free_completed", Addr: sA, Size: 1000, Frames: fe},           // 6
		{Action: "alloc", Addr: sB + 3*MiB, Size: 16*MiB + 500000, Frames: fd}, // 7: to the segment's end
		{Action: "free_requested", Addr: sA + 1024, Size: 700, Frames: fe},     // 8: pending
		{Action: "alloc", Addr: sA, Size: 600, Frames: fe},                     // 9
		{Action: "free_completed", Addr: sA + 1024, Size: 700, Frames: fe},     // 10
		{Action: "free_requested", Addr: sB, Size: 3 * MiB},                    // 11
		{Action: "free_completed", Addr: sB, Size: 3 * MiB},                    // 12
		{Action: "free_requested", Addr: sB + 3*MiB, Size: 16*MiB + 500000},    // 13
		{Action: "free_completed", Addr: sB + 3*MiB, Size: 16*MiB + 500000},    // 14
		{Action: "segment_free", Addr: sB, Size: 20 * MiB},                     // 15
	}
	for i := range es {
		es[i].TimeUS = 100 + int64(i)
	}
	return es
}

// sliceInputSegments are its final segments: the 600-byte block at sA.
var sliceInputSegments = []Segment{{Address: sA, TotalSize: 2 * MiB, SegmentType: "small", Blocks: []Block{
	{Size: 1024, RequestedSize: 600, State: StateActiveAllocated, Frames: fe},
	{Size: 2*MiB - 1024, State: StateInactive},
}}}

// TestSliceHandWorked cuts entries 5 to 10 out of sliceInput: the entries
// as they were (a free's frames are its block's malloc's), and the state
// after entry 10 worked by hand: at sA the 600-byte block of entry 9 (1024
// bytes) and free space; at sB the 3 MiB block of entry 4 and the block of
// entry 7 with the 548352 bytes after it. The slice is written as the
// SnapshotWriter writes those entries and segments, byte for byte.
func TestSliceHandWorked(t *testing.T) {
	settings := map[string]string{"expandable_segments": "false"}
	in := writeSnapshot(t, 0, sliceInputEntries(), sliceInputSegments, settings)
	for _, tc := range []struct {
		name     string
		from, to Bound
	}{
		{"events", Bound{BoundEntry, 5}, Bound{BoundEntry, 11}},
		{"negative", Bound{BoundEntry, -11}, Bound{BoundEntry, -5}},
		{"time_us", Bound{BoundTime, 105}, Bound{BoundTime, 111}},
		{"elapsed", Bound{BoundElapsed, 5}, Bound{BoundElapsed, 11}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			res, err := Slice(&out, bytes.NewReader(in), "in.pickle", SliceOptions{From: tc.from, To: tc.to})
			if err != nil {
				t.Fatal(err)
			}
			all := sliceInputEntries()
			want := all[5:11]
			for _, i := range []int{0, 1} { // the frees of the block of entry 1
				want[i].Frames = fa
			}
			for _, i := range []int{3, 5} { // of the block of entry 2
				want[i].Frames = fb
			}
			segs := []Segment{
				{Address: sA, TotalSize: 2 * MiB, SegmentType: "small", Frames: fa, Blocks: []Block{
					{Size: 1024, RequestedSize: 600, State: StateActiveAllocated, Frames: fe},
					{Size: 2*MiB - 1024, State: StateInactive},
				}},
				{Address: sB, TotalSize: 20 * MiB, SegmentType: "large", Frames: fc, Blocks: []Block{
					{Size: 3 * MiB, RequestedSize: 3 * MiB, State: StateActiveAllocated, Frames: fc},
					{Size: 17 * MiB, RequestedSize: 16*MiB + 500000, State: StateActiveAllocated, Frames: fd},
				}},
			}
			if wantBytes := writeSnapshot(t, 0, want, segs, settings); !bytes.Equal(out.Bytes(), wantBytes) {
				_, got, _ := drain(t, mustImport(t, out.Bytes()))
				t.Errorf("the slice differs from the hand-worked one; its events: %+v", got)
			}
			wantRes := SliceResult{Entries: 16, First: 5, End: 11, FirstUS: 105, LastUS: 110, Segments: 2,
				Reserved: 22 * MiB, Allocated: 1024 + 20*MiB}
			if !reflect.DeepEqual(res, wantRes) {
				t.Errorf("result %+v, want %+v", res, wantRes)
			}
		})
	}
}

func mustImport(t *testing.T, data []byte) trace.Source {
	t.Helper()
	src, err := Import(bytes.NewReader(data), "slice", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestSliceEmpty: a range without an entry is an error wrapping
// ErrEmptySlice that says where the entries are, and so is a time bound
// on a trace without times.
func TestSliceEmpty(t *testing.T) {
	in := writeSnapshot(t, 0, sliceInputEntries(), sliceInputSegments, nil)
	untimed := sliceInputEntries()
	for i := range untimed {
		untimed[i].TimeUS = 0
	}
	noTimes := writeSnapshot(t, 0, untimed, sliceInputSegments, nil)
	for _, tc := range []struct {
		name     string
		in       []byte
		from, to Bound
		want     string
	}{
		{"empty entries", in, Bound{BoundEntry, 5}, Bound{BoundEntry, 5}, "in.pickle: no trace entry in the range from entry 5 to entry 5: the trace has 16 entries"},
		{"past the end", in, Bound{BoundEntry, 16}, Bound{}, "in.pickle: no trace entry in the range from entry 16 to the end: the trace's 16 entries end at time_us 115 (15µs after the first entry)"},
		{"after the last", in, Bound{BoundElapsed, 16}, Bound{}, "in.pickle: no trace entry in the range from 16µs after the first entry to the end: the trace's 16 entries end at time_us 115 (15µs after the first entry)"},
		{"a gap", in, Bound{BoundTime, 50}, Bound{BoundTime, 90}, "in.pickle: no trace entry in the range from time_us 50 to time_us 90: the first entry from its start is entry 0 at time_us 100 (0s after the first entry)"},
		{"no times", noTimes, Bound{BoundElapsed, 1}, Bound{}, "in.pickle: the trace entries have no time_us: select them by index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Slice(&bytes.Buffer{}, bytes.NewReader(tc.in), "in.pickle", SliceOptions{From: tc.from, To: tc.to})
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
			if tc.name != "no times" && !errors.Is(err, ErrEmptySlice) {
				t.Errorf("%v does not wrap ErrEmptySlice", err)
			}
		})
	}
}

// entriesOf returns the events of path's device trace that are its
// entries (those Import rebuilds before a cut history's first entry, and
// its pool events, left out), as "op addr size stream time frames" lines;
// the frames are a malloc's.
func entriesOf(t *testing.T, path string) []string {
	t.Helper()
	h, evs, st, err := importStacks(t, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(h.Metadata["reconstructed_events"])
	var out []string
	for _, ev := range evs[n:] {
		if ev.Op == trace.OpPoolRelease || ev.Op == trace.OpEmptyCache {
			continue
		}
		out = append(out, fmt.Sprintf("%s %#x %d %d %d %v", ev.Op, ev.Addr, ev.Size, ev.Stream, ev.Time, st.Frames(ev.Stack)))
	}
	return out
}

// sliceFile cuts path's entries [from:to] into dir and returns the slice's
// path.
func sliceFile(t *testing.T, dir, path string, from, to int64) (string, SliceResult) {
	t.Helper()
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	res, err := Slice(&out, in, path, SliceOptions{From: Bound{BoundEntry, from}, To: Bound{BoundEntry, to}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf("%s.%d-%d.pickle", strings.TrimSuffix(filepath.Base(path), ".pickle.gz"), from, to))
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, res
}

// sliceReal are real snapshots of every kind a slice must keep: stacks
// (readme_train), mapped pages of expandable segments (churn_expandable),
// private pools (graph_step, mempool), blocks freed on another stream
// (multistream), roundup_power2_divisions (churn_roundup).
var sliceReal = []string{
	"stacks/readme_train", "stacks/churn_expandable", "stacks/graph_step", "mempool", "multistream", "churn_roundup",
}

// TestSliceReal cuts the middle third and the last half out of real
// snapshots. Imported again, a slice gives the original's entries in its
// range (action, address, size, stream, time, a malloc's frames), after
// the events that rebuild the state before them. When python3 is at hand,
// testdata/slicecheck.py reads each as PyTorch's memory viewer does: the
// keys it reads are there, its Active Memory Timeline has the blocks live
// before the range as the original had them, its Allocator State History
// undoes the slice back to the original's segments and blocks at the
// range's start, and a slice to the end has the original's final segments
// block for block.
func TestSliceReal(t *testing.T) {
	dir := t.TempDir()
	py, _ := exec.LookPath("python3")
	for _, name := range sliceReal {
		path := filepath.Join("..", "..", "testdata", "pytorch", name+".pickle.gz")
		orig := entriesOf(t, path)
		n := int64(len(orig))
		for _, r := range [][2]int64{{n / 3, 2 * n / 3}, {n / 2, n}} {
			t.Run(fmt.Sprintf("%s[%d:%d]", name, r[0], r[1]), func(t *testing.T) {
				p, res := sliceFile(t, dir, path, r[0], r[1])
				if res.First != r[0] || res.End != r[1] || res.Entries != n {
					t.Errorf("result %+v, want entries %d to %d of %d", res, r[0], r[1], n)
				}
				got := entriesOf(t, p)
				if want := orig[r[0]:r[1]]; !reflect.DeepEqual(got, want) {
					for i := range min(len(got), len(want)) {
						if got[i] != want[i] {
							t.Fatalf("entry %d: %s\nwant %s", r[0]+int64(i), got[i], want[i])
						}
					}
					t.Fatalf("%d entries, want %d", len(got), len(want))
				}
				if py == "" {
					return
				}
				out, err := exec.Command(py, filepath.Join("testdata", "slicecheck.py"), path, p, strconv.FormatInt(r[0], 10)).CombinedOutput()
				if err != nil || strings.TrimSpace(string(out)) != "ok" {
					t.Errorf("slicecheck.py: %v\n%s", err, out)
				}
			})
		}
	}
	if py == "" {
		t.Log("no python3: the slices were not read as memory_viz reads them")
	}
}

// TestSliceOfSlice cuts a slice of a slice, whose history is cut (Import
// rebuilds the state before its first entry from its segments, but for
// the pages of expandable segments): it holds the same entries and the
// same state at its end as the slice of the original over the same range,
// and slicecheck.py finds it consistent with the original.
func TestSliceOfSlice(t *testing.T) {
	dir := t.TempDir()
	py, _ := exec.LookPath("python3")
	for _, name := range []string{"stacks/readme_train", "stacks/churn_expandable", "multistream", "churn_roundup", "graph_step"} {
		path := filepath.Join("..", "..", "testdata", "pytorch", name+".pickle.gz")
		n := int64(len(entriesOf(t, path)))
		a, b := n/4, 3*n/4
		outer, _ := sliceFile(t, dir, path, a, b)
		c, d := (b-a)/3, (b-a)/2
		inner, got := sliceFile(t, dir, outer, c, d)
		direct, want := sliceFile(t, dir, path, a+c, a+d)
		if e1, e2 := entriesOf(t, inner), entriesOf(t, direct); !reflect.DeepEqual(e1, e2) {
			t.Errorf("%s: the slice of the slice has other entries than the slice", name)
		}
		got.Entries, got.First, got.End = want.Entries, want.First, want.End
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the slice of the slice ends at %+v, the slice at %+v", name, got, want)
		}
		if py == "" {
			continue
		}
		out, err := exec.Command(py, filepath.Join("testdata", "slicecheck.py"), path, inner, strconv.FormatInt(a+c, 10)).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("%s: slicecheck.py: %v\n%s", name, err, out)
		}
	}
}
