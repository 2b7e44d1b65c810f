package pytorch

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// stacksByPython returns, for each alloc and oom entry of device 0 of the
// snapshot at path (gzip'd or not), its frames as CPython's pickle.load
// reads them, innermost first.
func stacksByPython(t *testing.T, path string) [][]trace.Frame {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	out, err := exec.Command("python3", "-c", `
import gzip, pickle, sys
p = sys.argv[1]
f = gzip.open(p) if p.endswith(".gz") else open(p, "rb")
d = pickle.load(f)
w = sys.stdout.write
for e in d["device_traces"][0]:
    if e["action"] in ("alloc", "oom"):
        w("\x1e".join("%s\x1f%d\x1f%s" % (fr["filename"], fr["line"], fr["name"]) for fr in e.get("frames", [])) + "\n")
`, path).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var stacks [][]trace.Frame
	for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
		var st []trace.Frame
		if line != "" {
			for _, f := range strings.Split(line, "\x1e") {
				p := strings.Split(f, "\x1f")
				var fr trace.Frame
				fr.File, fr.Name = p[0], p[2]
				for _, c := range p[1] {
					fr.Line = fr.Line*10 + int64(c-'0')
				}
				st = append(st, fr)
			}
		}
		stacks = append(stacks, st)
	}
	return stacks
}

// mallocStacks returns the frames of each malloc and failed malloc of evs.
func mallocStacks(evs []trace.Event, st *trace.Stacks) [][]trace.Frame {
	var got [][]trace.Frame
	for _, ev := range evs {
		if ev.Op == trace.OpMalloc || ev.Op == trace.OpMallocFailed {
			got = append(got, st.Frames(ev.Stack))
		}
	}
	return got
}

// TestImportStacksReal: the snapshot recorded as the README tells users to
// (PyTorch's defaults: context "all", stacks "all", Python and C++ frames),
// whose frame dicts and frames lists are shared between segments, blocks
// and entries through the pickle memo, imports with every malloc's stack
// as CPython reads it.
func TestImportStacksReal(t *testing.T) {
	path := filepath.Join(tracesDir, "pytorch_stacks", "readme_job.pickle.gz")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no real traces: %v", err)
	}
	_, evs, st, err := importStacks(t, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := stacksByPython(t, path)
	got := mallocStacks(evs, st)
	if len(got) != len(want) || len(got) != 3158 {
		t.Fatalf("%d mallocs, CPython %d, want 3158", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("malloc %d: frames\n%v\nwant\n%v", i, got[i], want[i])
		}
	}
	// 61 distinct stacks among the mallocs, 392 distinct frames in them;
	// the frees' own frames are read but not kept.
	if st.Len() != 61 || st.NumFrames() != 392 {
		t.Errorf("%d stacks, %d frames; want 61, 392", st.Len(), st.NumFrames())
	}
}

// TestImportSharedFrames: a pickle that shares frame dicts and frames
// lists the way _dump_snapshot does with stacks on (a segment's frames
// list again in its block and in the segment_alloc and alloc entries that
// follow in one batch, a frame dict first met in a free's frames and then
// in an alloc's, the empty list shared by every entry without context),
// for every protocol from 2 to 5.
func TestImportSharedFrames(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	for _, proto := range []string{"2", "3", "4", "5"} {
		out, err := exec.Command("python3", "-c", `
import pickle, sys
fa = {"name": "f", "filename": "a.py", "line": 1}
fb = {"name": "g", "filename": "b.py", "line": 2}
fc = {"name": "h", "filename": "c.py", "line": 3}
s1 = [fa, fb]           # segment 1 (its block, its segment_alloc, its alloc)
free = [fc, fa]         # the free's own stack
s2 = [fc, fb, fc]       # a later alloc: fc first met in the free's frames
empty = []
A = 0x7f0000000000
seg = {"device": 0, "address": A, "total_size": 2097152, "allocated_size": 0,
       "requested_size": 0, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": s1,
       "blocks": [{"address": A, "size": 2097152, "requested_size": 0,
                   "state": "inactive", "frames": s1}]}
def e(action, addr, size, frames, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": t, "compile_context": "N/A", "user_metadata": "",
            "frames": frames}
tr = [e("segment_alloc", A, 2097152, s1, 1), e("alloc", A, 1024, s1, 2),
      e("free_requested", A, 1024, free, 3), e("free_completed", A, 1024, free, 4),
      e("alloc", A, 512, s2, 5), e("alloc", A + 512, 512, empty, 6),
      e("free_requested", A, 512, empty, 7), e("free_completed", A, 512, empty, 8),
      e("free_requested", A + 512, 512, s2, 9), e("free_completed", A + 512, 512, s2, 10)]
sys.stdout.buffer.write(pickle.dumps({"segments": [seg], "device_traces": [tr],
    "allocator_settings": {}}, protocol=int(sys.argv[1])))
`, proto).Output()
		if err != nil {
			t.Fatal(err)
		}
		src, err := Import(bytes.NewReader(out), "shared.pickle", Options{})
		if err != nil {
			t.Fatalf("protocol %s: %v", proto, err)
		}
		_, evs, err := drain(t, src)
		if err != nil {
			t.Fatalf("protocol %s: %v", proto, err)
		}
		fa := trace.Frame{Name: "f", File: "a.py", Line: 1}
		fb := trace.Frame{Name: "g", File: "b.py", Line: 2}
		fc := trace.Frame{Name: "h", File: "c.py", Line: 3}
		want := [][]trace.Frame{{fa, fb}, {fc, fb, fc}, nil}
		st := trace.StacksOf(src)
		if got := mallocStacks(evs, st); !reflect.DeepEqual(got, want) {
			t.Errorf("protocol %s: malloc stacks %v, want %v", proto, got, want)
		}
		// The table keeps the mallocs' stacks only: not the free's [fc, fa].
		if st.Len() != 2 || st.NumFrames() != 3 {
			t.Errorf("protocol %s: %d stacks, %d frames; want 2, 3", proto, st.Len(), st.NumFrames())
		}
	}
}
