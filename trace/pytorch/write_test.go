package pytorch

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// tinyEntries are tinyEvents as snapshot entries.
var tinyEntries = []TraceEntry{
	{Action: "segment_alloc", Addr: seg, Size: 2 << 20, TimeUS: t0 / 1000},
	{Action: "alloc", Addr: seg, Size: 1000, TimeUS: t0/1000 + 1, Frames: []trace.Frame{{Name: "forward", File: "model.py", Line: 42}}},
	{Action: "alloc", Addr: 1<<63 + 0x200, Size: 512, Stream: 7, TimeUS: t0/1000 + 2},
	{Action: "free_requested", Addr: seg, Size: 1000, TimeUS: t0/1000 + 3},
	{Action: "free_completed", Addr: seg, Size: 1000, TimeUS: t0/1000 + 4},
	{Action: "oom", DeviceFree: 12345, Size: 1 << 40, TimeUS: t0/1000 + 5},
	{Action: "snapshot", TimeUS: t0/1000 + 6},
	{Action: "segment_map", Addr: seg + 2<<20, Size: 2 << 20, TimeUS: t0/1000 + 7},
	{Action: "segment_unmap", Addr: seg + 2<<20, Size: 2 << 20, TimeUS: t0/1000 + 8},
	{Action: "segment_free", Addr: seg, Size: 2 << 20, TimeUS: t0/1000 + 9},
	{Action: "alloc", Addr: math.MaxUint64, Size: 1, Stream: math.MaxUint64, TimeUS: t0/1000 + 10},
}

func writeSnapshot(t *testing.T, device int, entries []TraceEntry, segs []Segment, settings map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewSnapshotWriter(&buf, device)
	for _, e := range entries {
		if err := w.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(segs, settings); err != nil {
		t.Fatal(err)
	}
	if w.Entries() != int64(len(entries)) {
		t.Errorf("Entries() = %d, want %d", w.Entries(), len(entries))
	}
	return buf.Bytes()
}

// TestSnapshotWriterRoundTrip writes the tiny trace and reads it back with
// Import: the same events and settings.
func TestSnapshotWriterRoundTrip(t *testing.T) {
	// The trace frees its block at seg: the final segment holds it free.
	segs := []Segment{{Address: seg, TotalSize: 2 << 20, Blocks: []Block{
		{Size: 1024, State: StateInactive},
		{Size: 2<<20 - 1024, State: StateInactive},
	}}}
	settings := map[string]string{"policy": "pytorch", "max_split_size_mb": "128"}
	data := writeSnapshot(t, 0, tinyEntries, segs, settings)
	src, err := Import(bytes.NewReader(data), "tiny", Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, evs, _ := drain(t, src)
	want := make([]trace.Event, len(tinyEvents))
	copy(want, tinyEvents)
	for i := range want {
		want[i].Time = want[i].Time / 1000 * 1000
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
	for k, v := range settings {
		if h.Settings[k] != v {
			t.Errorf("setting %s = %q, want %q", k, h.Settings[k], v)
		}
	}
}

// TestSnapshotWriterDevice puts the trace at device 2: devices 0 and 1
// have empty traces.
func TestSnapshotWriterDevice(t *testing.T) {
	data := writeSnapshot(t, 2, tinyEntries[:2], nil, nil)
	for dev, n := range []int{0, 0, 2} {
		src, err := Import(bytes.NewReader(data), "dev", Options{Device: dev})
		if err != nil {
			t.Fatalf("device %d: %v", dev, err)
		}
		_, evs, _ := drain(t, src)
		if len(evs) != n {
			t.Errorf("device %d: %d events, want %d", dev, len(evs), n)
		}
	}
}

// TestSnapshotWriterLarge writes more entries than one APPENDS batch and
// more distinct short strings than a BINGET reaches.
func TestSnapshotWriterLarge(t *testing.T) {
	var entries []TraceEntry
	for i := range 2500 {
		entries = append(entries, TraceEntry{Action: "alloc", Addr: uint64(i) * 512, Size: uint64(i), Stream: uint64(i % 3)})
	}
	settings := map[string]string{}
	for i := range 300 {
		settings[fmt.Sprintf("k%03d", i)] = fmt.Sprintf("v%d", i)
	}
	data := writeSnapshot(t, 0, entries, nil, settings)
	src, err := Import(bytes.NewReader(data), "large", Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, evs, _ := drain(t, src)
	if len(evs) != len(entries) {
		t.Fatalf("%d events, want %d", len(evs), len(entries))
	}
	for i, ev := range evs {
		if ev.Op != trace.OpMalloc || ev.Addr != uint64(i)*512 || ev.Size != uint64(i) || ev.Stream != uint64(i%3) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	for k, v := range settings {
		if h.Settings[k] != v {
			t.Fatalf("setting %s = %q, want %q", k, h.Settings[k], v)
		}
	}
}

func TestSnapshotWriterErrors(t *testing.T) {
	w := NewSnapshotWriter(&bytes.Buffer{}, 0)
	if err := w.Add(TraceEntry{Action: "malloc"}); !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), `"malloc"`) {
		t.Errorf("unknown action: %v", err)
	}
	for _, tc := range []struct {
		name string
		seg  Segment
		want string
	}{
		{"short", Segment{Address: 0x1000, TotalSize: 4096, Blocks: []Block{{Size: 1024, State: StateInactive}}}, "cover 1024 bytes"},
		{"state", Segment{Address: 0x1000, TotalSize: 4096, Blocks: []Block{{Size: 4096, State: "free"}}}, `"free"`},
		{"empty block", Segment{Address: 0x1000, TotalSize: 4096, Blocks: []Block{{Size: 4096, State: StateInactive}, {State: StateInactive}}}, "0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewSnapshotWriter(&bytes.Buffer{}, 0)
			err := w.Close([]Segment{tc.seg}, nil)
			if !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want ErrBadSnapshot with %q", err, tc.want)
			}
		})
	}
}

// TestSnapshotWriterPython loads the snapshot with Python's own pickle
// module, when a python3 is at hand, and checks the values memory_viz
// reads.
func TestSnapshotWriterPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	segs := []Segment{{Address: seg, TotalSize: 2 << 20, Stream: math.MaxUint64, SegmentType: "small", Blocks: []Block{
		{Size: 1024, RequestedSize: 1000, State: StateActiveAllocated},
		{Size: 512, RequestedSize: 512, State: StateActivePendingFree},
		{Size: 2<<20 - 1536, State: StateInactive},
	}}}
	path := filepath.Join(t.TempDir(), "s.pickle")
	if err := os.WriteFile(path, writeSnapshot(t, 0, tinyEntries, segs, map[string]string{"a": "b"}), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `
import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
t = d['device_traces'][0]
assert list(d) == ['device_traces', 'segments', 'allocator_settings', 'external_annotations'], list(d)
assert len(t) == 11, len(t)
assert t[2]['addr'] == 2**63 + 0x200, t[2]
assert t[5] == {'action': 'oom', 'device_free': 12345, 'size': 2**40, 'stream': 0, 'time_us': 1795945664154797}, t[5]
assert t[10]['stream'] == -1 and t[10]['addr'] == 2**64 - 1, t[10]
s = d['segments'][0]
assert s['address'] == 0x7f0000000000 and s['total_size'] == 2 << 20 and s['stream'] == -1, s
assert (s['allocated_size'], s['active_size'], s['requested_size']) == (1024, 1536, 1512), s
b = s['blocks']
assert [x['address'] for x in b] == [0x7f0000000000, 0x7f0000000400, 0x7f0000000600], b
assert [x['state'] for x in b] == ['active_allocated', 'active_pending_free', 'inactive'], b
assert d['allocator_settings'] == {'a': 'b'} and d['external_annotations'] == []
print('ok')
`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python3: %v\n%s", err, out)
	}
}
