package pytorch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// shapesScript writes snapshots of many shapes with CPython's own pickler,
// each as NAME.pickle beside NAME.json, which says what Import must give:
// for each device, the events (op, addr, size, stream, time in ns, label)
// and the header's settings and metadata. The shapes are those where the
// decoder must tell from the stack what a new container becomes: lists of
// 1, 999, 1000, 1001 and 2001 entries (Python appends in batches of 1000
// under a MARK, and one item alone without), several devices, one segment
// and many, one block and two, stack frames, keys in another order,
// settings whose dicts hold one key with a list, and every protocol (0 and
// 1 behind a PROTO 2 opcode, as Import wants one).
const shapesScript = `
import json, pickle, sys
out = sys.argv[1]
OPS = {"alloc": "malloc", "free_requested": "free_requested", "free_completed": "free",
       "segment_alloc": "segment_alloc", "segment_free": "segment_free", "oom": "malloc_failed",
       "snapshot": "marker"}
T0 = 1795945664154792

def trace(n, dev, frames=False):
    seg = 0x7F0000000000 + dev * (1 << 40)
    es, segs = [], []
    es.append({"action": "segment_alloc", "addr": seg, "size": 20 << 20, "stream": 0, "time_us": T0})
    segs.append(seg)
    i = 1
    while len(es) < n:
        kind, g = i % 5, i // 5
        a = seg + (g % 7) * 512 + ((1 << 63) if g % 11 == 3 else 0)
        if kind == 0:
            e = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}
        elif kind == 4:
            e = {"action": "oom", "device_free": 5, "size": 1 << 40, "stream": -1}
        elif kind == 1:
            e = {"action": "alloc", "addr": a, "size": 100 + g, "stream": 7 if g % 2 else -1}
        elif kind == 2:  # frees on the block's stream, as PyTorch records them
            e = {"action": "free_requested", "addr": a, "size": 100 + g, "stream": 7 if g % 2 else -1}
        else:
            e = {"action": "free_completed", "addr": a, "size": 100 + g, "stream": 7 if g % 2 else -1}
        e["time_us"] = T0 + i
        e["compile_context"] = "N/A"
        e["user_metadata"] = ""
        if frames:
            e["frames"] = [{"filename": "m%d.py" % (i % 3), "line": i, "name": "f"}] * (i % 3)
        es.append(e)
        i += 1
    es = es[:n]
    live = set()
    for e in es:
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_completed":
            live.discard(e["addr"])
    return es, (segs if n > 0 else []), live

def expect(es):
    evs = []
    for e in es:
        op = OPS[e["action"]]
        if op == "marker":
            evs.append([op, 0, 0, 0, e["time_us"] * 1000, "snapshot"])
        elif op == "malloc_failed":
            evs.append([op, 0, e["size"], e["stream"] % (1 << 64), e["time_us"] * 1000, ""])
        else:
            evs.append([op, e["addr"], e["size"], e["stream"] % (1 << 64), e["time_us"] * 1000, ""])
    return evs

def segment(addr, nblocks, live=()):
    # A 512-byte block of its own, active, for each block the trace leaves
    # allocated in the segment, so that the trace and the segments agree.
    live = sorted(a for a in live if addr <= a < addr + (20 << 20))
    starts = sorted(set([addr + k * 512 for k in range(nblocks)] + live + [a + 512 for a in live]))
    starts = [a for a in starts if a < addr + (20 << 20)]
    blocks = []
    for k, a in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else addr + (20 << 20)
        blocks.append({"address": a, "size": end - a, "requested_size": 0,
                       "state": "active_allocated" if a in live else "inactive", "frames": []})
    return {"device": 0, "address": addr, "total_size": 20 << 20, "allocated_size": 0, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
            "blocks": blocks}

settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": 134217728,
            "garbage_collection_threshold": 0.6, "expandable_segments": False, "none": None,
            "one": {"x": [1, 2]}, "nest": {"y": {"z": [3]}},
            "roundup_power2_divisions": {"1": 0, "16": 2, "2": 0}}
want_settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": "134217728",
                 "garbage_collection_threshold": "0.6", "expandable_segments": "false", "none": "",
                 "one": "x:[1,2]", "nest": "y:z:[3]", "roundup_power2_divisions": "1:0,2:0,16:2"}

cases = []
for n in (1, 2, 999, 1000, 1001, 2001):
    cases.append(("len%d" % n, [n], False, False, 1))
cases.append(("devices", [0, 1001, 1], False, False, 2))
cases.append(("devices2", [1, 2, 0], False, False, 1))
cases.append(("frames", [1500], True, False, 3))
cases.append(("order", [700, 3], False, True, 1001))
for name, lens, frames, reorder, nseg in cases:
    traces, want = [], []
    segs = []
    for dev, n in enumerate(lens):
        es, s, live = trace(n, dev, frames)
        traces.append(es)
        want.append(expect(es))
        if dev == 0:
            segs = [segment(a, 1 if nseg == 1 else 2, live) for a in s]
    # More segments, allocated in the trace so that nothing is reconstructed.
    while len(segs) < nseg and traces[0]:
        a = 0x7E0000000000 + len(segs) * (20 << 20)
        segs.append(segment(a, 2))
        if True:
            traces[0].insert(1, {"action": "segment_alloc", "addr": a, "size": 20 << 20, "stream": 0, "time_us": T0})
            want[0].insert(1, ["segment_alloc", a, 20 << 20, 0, T0 * 1000, ""])
    snap = {"segments": segs, "device_traces": traces, "allocator_settings": settings, "external_annotations": [{"a": [1]}]}
    if reorder:
        snap = {"allocator_settings": settings, "external_annotations": [], "segments": segs, "device_traces": traces}
    for proto in (0, 1, 2, 3, 4, 5):
        with open("%s/%s_p%d.pickle" % (out, name, proto), "wb") as f:
            if proto < 2:
                f.write(b"\x80\x02")  # Import wants a PROTO opcode; the old opcodes follow
            pickle.dump(snap, f, protocol=proto)
        with open("%s/%s_p%d.json" % (out, name, proto), "w") as f:
            json.dump({"devices": want, "settings": want_settings, "segments": len(segs)}, f)
`

// TestImportPythonShapes imports the snapshots of shapesScript and checks
// every event, setting and metadata value.
func TestImportPythonShapes(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	if msg, err := exec.Command("python3", "-c", shapesScript, dir).CombinedOutput(); err != nil {
		t.Fatalf("python3: %v\n%s", err, msg)
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.pickle"))
	if len(paths) < 60 {
		t.Fatalf("%d pickles written", len(paths))
	}
	for _, path := range paths {
		name := filepath.Base(path)
		raw, err := os.ReadFile(strings.TrimSuffix(path, ".pickle") + ".json")
		if err != nil {
			t.Fatal(err)
		}
		var want struct {
			Devices  [][][]any
			Settings map[string]string
			Segments int
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		for dev, wantEvs := range want.Devices {
			h, evs, st, err := importStacks(t, path, Options{Device: dev})
			if err != nil {
				t.Errorf("%s device %d: %v", name, dev, err)
				continue
			}
			if !reflect.DeepEqual(h.Settings, want.Settings) {
				t.Errorf("%s: settings\n got %v\nwant %v", name, h.Settings, want.Settings)
			}
			wantMeta := map[string]string{"device": strconv.Itoa(dev), "devices": strconv.Itoa(len(want.Devices)), "entries": strconv.Itoa(len(wantEvs)), "segments": strconv.Itoa(want.Segments)}
			if !reflect.DeepEqual(h.Metadata, wantMeta) {
				t.Errorf("%s device %d: metadata %v, want %v", name, dev, h.Metadata, wantMeta)
			}
			if len(evs) != len(wantEvs) {
				t.Errorf("%s device %d: %d events, want %d", name, dev, len(evs), len(wantEvs))
				continue
			}
			for i, w := range wantEvs {
				op, _ := trace.ParseOp(w[0].(string))
				num := func(k int) uint64 {
					x, err := strconv.ParseUint(string(w[k].(json.Number)), 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					return x
				}
				we := trace.Event{Op: op, Addr: num(1), Size: num(2), Stream: num(3), Time: int64(num(4)), Label: w[5].(string)}
				// The script gives entry n (at time T0+n us) n%3
				// frames m{n%3}.py:n:f, the same dict repeated.
				var wantFrames []trace.Frame
				if n := we.Time/1000 - 1795945664154792; strings.HasPrefix(name, "frames") && (op == trace.OpMalloc || op == trace.OpMallocFailed) {
					for range n % 3 {
						wantFrames = append(wantFrames, trace.Frame{Name: "f", File: fmt.Sprintf("m%d.py", n%3), Line: n})
					}
				}
				if got := st.Frames(evs[i].Stack); !reflect.DeepEqual(got, wantFrames) {
					t.Errorf("%s device %d event %d: frames %v, want %v", name, dev, i, got, wantFrames)
					break
				}
				if evs[i].Stack = 0; evs[i] != we {
					t.Errorf("%s device %d event %d: %s, want %s", name, dev, i, trace.FormatText(evs[i]), trace.FormatText(we))
					break
				}
			}
		}
	}
}

// TestImportSharedEntry: an entry that is the same dict as an earlier one
// (which a pickle writes as a reference to the memo) is not followed, and
// says so.
func TestImportSharedEntry(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	out, err := exec.Command("python3", "-c", `
import pickle, sys
e = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1}
sys.stdout.buffer.write(pickle.dumps({"segments": [], "device_traces": [[e, e]]}, protocol=4))
`).Output()
	if err != nil {
		t.Fatal(err)
	}
	_, err = Import(bytes.NewReader(out), "shared.pickle", Options{})
	want := "shared.pickle: device_traces[0] entry 1: is a dict repeated through the pickle memo, which this importer does not follow"
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

// TestImportNotSeekable reads a snapshot through a reader that cannot seek:
// Import keeps a copy of its bytes for the second reading.
func TestImportNotSeekable(t *testing.T) {
	data := mustRead(t, "testdata/tiny_proto4.pickle.gz")
	src, err := Import(struct{ io.Reader }{bytes.NewReader(data)}, "pipe", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := drain(t, src)
	if err != nil {
		t.Fatal(err)
	}
	compareEvents(t, evs, tinyEvents)
}

// TestImportOffset imports a snapshot that starts part way into its
// reader: the second reading starts there too.
func TestImportOffset(t *testing.T) {
	data := append([]byte("junk"), mustRead(t, "testdata/tiny_proto5.pickle")...)
	r := bytes.NewReader(data)
	r.Seek(4, io.SeekStart)
	src, err := Import(r, "offset", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := drain(t, src)
	if err != nil {
		t.Fatal(err)
	}
	compareEvents(t, evs, tinyEvents)
}

// TestImportChanged: a file that changes between Import and the reading of
// its events gives, when the events were too many to keep (read again), an
// error from Next, not wrong events; when they were kept, the events of
// the file as Import read it.
func TestImportChanged(t *testing.T) {
	for _, logMax := range []int64{0, maxLog} {
		path := filepath.Join(t.TempDir(), "x.pickle")
		if err := os.WriteFile(path, mustRead(t, "testdata/tiny_proto5.pickle"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src, err := importLog(f, "x.pickle", Options{}, logMax)
		if err != nil {
			t.Fatal(err)
		}
		other := snap(alloc(), alloc(kv{"addr", 8192}))
		if err := os.WriteFile(path, other, 0o644); err != nil {
			t.Fatal(err)
		}
		if logMax > 0 {
			evs, err := trace.ReadAll(src)
			if err != nil {
				t.Fatalf("events kept: %v", err)
			}
			compareEvents(t, evs, tinyEvents)
			continue
		}
		var last error
		for range 100 {
			if _, last = src.Next(); last != nil {
				break
			}
		}
		if last == nil || last == io.EOF || !strings.HasPrefix(last.Error(), "x.pickle: ") {
			t.Errorf("Next after the file changed: %v", last)
		}
	}
}

// TestPickleOpcodes decodes values written with the opcodes that snapshots
// do not use but plain-value pickles may: the text forms of protocol 0,
// LIST, DICT and TUPLE from a mark, sets, bytes, POP and DUP.
func TestPickleOpcodes(t *testing.T) {
	// {'device_traces': [[]], 'allocator_settings': {'a': True,
	// 'b': 123456789012345678901234567890, 'c': 0.25, 'd': (1, 2, 3),
	// 'e': 'str', 'f': b'hi', 'g': {1, 2}, 'h': None,
	// 'i': frozenset({1, 2}), 'j': (5,), 'k': None, 'l': [[]]}}, as
	// Python's pickle.loads reads it.
	body := "(dp0\nVdevice_traces\np1\n((lp2\nlp3\nsVallocator_settings\n(dVa\nI01\n" +
		"sVb\nL123456789012345678901234567890L\nsVc\nF0.25\nsVd\n(I1\nI2\nI3\ntsVe\n" +
		"S'str'\nsVf\nC\x02hisVg\n\x8f(K\x01K\x02\x90sVh\nN20sVi\n(K\x01K\x02\x91s" +
		"Vj\nK\x05\x85sVk\n(K\x011NsVl\ng3\ns"
	data := []byte("\x80\x02" + body + "s.")
	src, err := Import(bytes.NewReader(data), "old.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, evs, _ := drain(t, src); len(evs) != 0 {
		t.Errorf("%d events, want none", len(evs))
	}
	got := src.Header().Settings
	want := map[string]string{
		"a": "true", "b": "123456789012345678901234567890", "c": "0.25", "d": "[1,2,3]",
		"e": "str", "f": "bytes", "g": "[1,2]", "h": "", "i": "[1,2]", "j": "[5]", "k": "",
		"l": "list", // device_traces itself, which is not kept
	}
	keys := func(m map[string]string) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("settings\n got %v (%v)\nwant %v", got, keys(got), want)
	}
}

// TestImportDeepSettings: a setting nested 60000 lists deep (which a
// pickle builds without recursion; deeper is over the decoder's limit on
// its stack, TestImportLimits) is cut off, at no cost in stack.
func TestImportDeepSettings(t *testing.T) {
	const depth = 60000
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', '('})
	pickleValue(&b, "device_traces")
	pickleValue(&b, []any{[]any{}})
	pickleValue(&b, "allocator_settings")
	b.WriteString("}(")
	pickleValue(&b, "a")
	b.WriteString(strings.Repeat("]", depth) + strings.Repeat("a", depth-1))
	b.WriteString("uu.")
	src, err := Import(&b, "deep.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("[", maxDepth) + "..." + strings.Repeat("]", maxDepth)
	if got := src.Header().Settings["a"]; got != want {
		t.Errorf("setting a = %q, want %q", got, want)
	}
}
