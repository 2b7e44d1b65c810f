package viz_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/viz"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

func importSnapshot(t *testing.T, data []byte, name string) trace.Source {
	t.Helper()
	src, err := pytorch.Import(bytes.NewReader(data), name, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func record(t *testing.T, src trace.Source, cfg sim.Config) (*sim.Result, snapshot, []byte) {
	t.Helper()
	var buf bytes.Buffer
	rec := viz.NewRecorder(&buf, map[string]string{"policy": cfg.Policy})
	cfg.Observer = rec
	rs, err := sim.Run(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	segs, err := rec.Segments()
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	return rs[0], decode(t, buf.Bytes(), segs), buf.Bytes()
}

// TestRecordText records the replay of a small text trace on first-fit and
// checks the snapshot entry by entry and its final segments.
func TestRecordText(t *testing.T) {
	const text = `header source=text
malloc id=1 size=1000 t=1000
malloc id=2 size=3000 stream=7 t=2000
free_requested id=2 stream=7 t=3000
free id=1 t=4000
`
	h, evs, err := trace.ParseText("t.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	_, snap, _ := record(t, trace.NewSliceSource(h, evs), sim.Config{Policy: "first-fit"})
	var got []string
	for _, e := range snap.entries {
		got = append(got, fmt.Sprintf("%s %d %d", e.action, e.size, e.stream))
	}
	// first-fit takes a 2 MiB segment for the first malloc and places
	// both in it.
	want := []string{
		"segment_alloc 2097152 0",
		"alloc 1000 0",
		"alloc 3000 7",
		"free_requested 3000 7",
		"free_requested 1000 0",
		"free_completed 1000 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(snap.segments) != 1 {
		t.Fatalf("%d segments, want 1", len(snap.segments))
	}
	s := snap.segments[0]
	var states []string
	for _, b := range s.Blocks {
		states = append(states, fmt.Sprintf("%s %d", b.State, b.Size))
	}
	if s.TotalSize != 2<<20 || s.Address != snap.entries[0].addr {
		t.Errorf("segment %#x of %d bytes", s.Address, s.TotalSize)
	}
	wantStates := fmt.Sprintf("inactive %d,active_pending_free %d,inactive %d", snap.entries[2].addr-s.Address, 3072, s.Address+s.TotalSize-snap.entries[2].addr-3072)
	if strings.Join(states, ",") != wantStates {
		t.Errorf("blocks %s, want %s", strings.Join(states, ","), wantStates)
	}
}

// TestRecordReal records the small real traces on every policy, as
// recorded and not, and checks that each snapshot holds together as
// memory_viz walks it, and that replaying it again gives the same figures.
func TestRecordReal(t *testing.T) {
	paths, _ := filepath.Glob("../../testdata/pytorch/*.pickle.gz")
	if len(paths) == 0 {
		t.Skip("no traces")
	}
	sort.Strings(paths)
	for _, path := range paths {
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(orig) > 64<<10 {
			continue // kept fast: train_gpt is for the acceptance tests
		}
		for _, name := range policies.Names() {
			t.Run(filepath.Base(path)+"/"+name, func(t *testing.T) {
				// As recorded: the pytorch policy maps expandable
				// segments where the recording did.
				_, snap, _ := record(t, importSnapshot(t, orig, path), sim.Config{Policy: name, AsRecorded: true})
				if err := snap.walkBack(); err != nil {
					t.Fatalf("as recorded: %v", err)
				}
				r1, snap, data := record(t, importSnapshot(t, orig, path), sim.Config{Policy: name})
				if err := snap.walkBack(); err != nil {
					t.Fatal(err)
				}
				if r1.SourceOOMs > 0 || r1.Anomalies > 0 {
					return // the snapshot holds a different trace: see Observer
				}
				rs, err := sim.Run(importSnapshot(t, data, "viz"), sim.Config{Policy: name})
				if err != nil {
					t.Fatal(err)
				}
				r2 := rs[0]
				if r2.PeakRequested != r1.PeakRequested || r2.Mallocs != r1.Mallocs {
					t.Errorf("replay of the snapshot: requested %d mallocs %d; first replay %d %d", r2.PeakRequested, r2.Mallocs, r1.PeakRequested, r1.Mallocs)
				}
				if planner(t, name) {
					return // places by the whole trace, whose addresses differ now
				}
				if r2.PeakAllocated != r1.PeakAllocated || r2.PeakReserved != r1.PeakReserved || r2.DeviceAllocs != r1.DeviceAllocs {
					t.Errorf("replay of the snapshot: requested %d allocated %d reserved %d allocs %d mallocs %d; first replay %d %d %d %d %d",
						r2.PeakRequested, r2.PeakAllocated, r2.PeakReserved, r2.DeviceAllocs, r2.Mallocs,
						r1.PeakRequested, r1.PeakAllocated, r1.PeakReserved, r1.DeviceAllocs, r1.Mallocs)
				}
			})
		}
	}
}

// planner reports whether the policy called name plans its placements
// from the whole trace (an offline policy).
func planner(t *testing.T, name string) bool {
	in, ok := policies.Lookup(name)
	if !ok {
		t.Fatalf("no policy %q", name)
	}
	return in.Abilities.Planner
}

// TestRecordOOM records a replay under a capacity that runs out: an oom
// entry with the device's free bytes, and no entries for the failed
// malloc's free.
func TestRecordOOM(t *testing.T) {
	const text = `header source=text
malloc id=1 size=3000
malloc id=2 size=3000
free id=2
free id=1
`
	h, evs, err := trace.ParseText("t.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	_, snap, data := record(t, trace.NewSliceSource(h, evs), sim.Config{Policy: "cuda", Capacity: 4096})
	var got []string
	for _, e := range snap.entries {
		got = append(got, fmt.Sprintf("%s %d", e.action, e.size))
	}
	want := []string{"segment_alloc 3072", "alloc 3000", "oom 3000", "free_requested 3000", "free_completed 3000", "segment_free 3072"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(snap.segments) != 0 {
		t.Errorf("%d segments left", len(snap.segments))
	}
	// The oom entry holds the device's free bytes, 4096 - 3072, as a
	// BININT2 after its memoized key.
	if !bytes.Contains(data, append([]byte("\x8c\x0bdevice_free\x94M"), 0x00, 0x04)) {
		t.Errorf("no device_free of 1024 in the snapshot")
	}
}

func TestRecorderErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		actions []sim.Action
		want    string
	}{
		{"free of no block", []sim.Action{{Kind: sim.ActionFreeRequested, Addr: 0x10}}, "block 0x10 is not allocated"},
		{"completed before requested", []sim.Action{
			{Kind: sim.ActionSegmentAlloc, Addr: 0, Size: 4096},
			{Kind: sim.ActionAlloc, Addr: 0, Size: 512},
			{Kind: sim.ActionFreeCompleted, Addr: 0, Event: 3},
		}, "event 3: free_completed: block 0x0 is not pending free"},
		{"segment twice", []sim.Action{{Kind: sim.ActionSegmentAlloc, Addr: 0x1000, Size: 1}, {Kind: sim.ActionSegmentAlloc, Addr: 0x1000, Size: 1}}, "already live"},
		{"segment free", []sim.Action{{Kind: sim.ActionSegmentFree, Addr: 0x1000}}, "segment 0x1000 is not live"},
		{"outside", []sim.Action{{Kind: sim.ActionSegmentAlloc, Addr: 0x1000, Size: 4096}, {Kind: sim.ActionAlloc, Addr: 0x100, Size: 512}}, "block 0x100 lies in no live segment"},
		{"past the end", []sim.Action{{Kind: sim.ActionSegmentAlloc, Addr: 0x1000, Size: 4096}, {Kind: sim.ActionAlloc, Addr: 0x1e00, Size: 1024}}, "runs past the end"},
		{"overlap", []sim.Action{
			{Kind: sim.ActionSegmentAlloc, Addr: 0x1000, Size: 4096},
			{Kind: sim.ActionAlloc, Addr: 0x1000, Size: 1024},
			{Kind: sim.ActionAlloc, Addr: 0x1200, Size: 512},
		}, "overlaps"},
		{"unknown", []sim.Action{{Kind: sim.ActionInvalid}}, "unknown action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := viz.NewRecorder(&bytes.Buffer{}, nil)
			for _, a := range tc.actions {
				rec.Observe(a)
			}
			err := rec.Close()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// snapshot is what memory_viz walks of a recorded snapshot: its entries,
// read back with the importer, and its final segments, as the recorder
// wrote them.
type snapshot struct {
	entries  []entry
	segments []pytorch.Segment
}

type entry struct {
	action             string
	addr, size, stream uint64
}

// actionOf names the snapshot action an imported event came from.
var actionOf = map[trace.Op]string{
	trace.OpMalloc: "alloc", trace.OpFreeRequested: "free_requested", trace.OpFree: "free_completed",
	trace.OpMallocFailed: "oom", trace.OpSegmentAlloc: "segment_alloc", trace.OpSegmentFree: "segment_free",
	trace.OpSegmentMap: "segment_map", trace.OpSegmentUnmap: "segment_unmap",
}

func decode(t *testing.T, data []byte, segs []pytorch.Segment) snapshot {
	t.Helper()
	src := importSnapshot(t, data, "viz")
	s := snapshot{segments: segs}
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return s
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Op == trace.OpPoolRelease || ev.Op == trace.OpEmptyCache && ev.Pool != 0 {
			continue // inferred by the importer: no entry of its own
		}
		a, ok := actionOf[ev.Op]
		if !ok {
			t.Fatalf("unexpected event %v", ev)
		}
		s.entries = append(s.entries, entry{action: a, addr: ev.Addr, size: ev.Size, stream: ev.Stream})
	}
}

// walkBack walks the entries from the last to the first, from the final
// segments, as memory_viz's segment view does to draw the state at any
// entry: every block it brings back must lie in a segment live at that
// point, and every segment it takes away must be live.
func (s snapshot) walkBack() error {
	segs := map[uint64]uint64{}
	mapped := map[uint64]uint64{} // start -> end
	blocks := map[uint64]uint64{}
	for _, sg := range s.segments {
		if sg.IsExpandable {
			mapped[sg.Address] = sg.Address + sg.TotalSize
		} else {
			segs[sg.Address] = sg.TotalSize
		}
		at := sg.Address
		for _, b := range sg.Blocks {
			if b.State != pytorch.StateInactive {
				blocks[at] = b.Size
			}
			at += b.Size
		}
		if at != sg.Address+sg.TotalSize {
			return fmt.Errorf("segment %#x: blocks end at %#x", sg.Address, at)
		}
	}
	inside := func(addr uint64) bool {
		for a, n := range segs {
			if addr >= a && addr < a+n {
				return true
			}
		}
		for a, end := range mapped {
			if addr >= a && addr < end {
				return true
			}
		}
		return false
	}
	for i := len(s.entries) - 1; i >= 0; i-- {
		e := s.entries[i]
		switch e.action {
		case "alloc":
			if _, ok := blocks[e.addr]; !ok {
				return fmt.Errorf("entry %d: alloc of %#x, which is not live after it", i, e.addr)
			}
			delete(blocks, e.addr)
		case "free_completed":
			if !inside(e.addr) {
				return fmt.Errorf("entry %d: block %#x freed outside every live segment", i, e.addr)
			}
			blocks[e.addr] = e.size
		case "segment_free":
			segs[e.addr] = e.size
		case "segment_alloc":
			if _, ok := segs[e.addr]; !ok {
				return fmt.Errorf("entry %d: segment_alloc of %#x, which is not live after it", i, e.addr)
			}
			for b := range blocks {
				if b >= e.addr && b < e.addr+e.size {
					return fmt.Errorf("entry %d: segment %#x taken away under block %#x", i, e.addr, b)
				}
			}
			delete(segs, e.addr)
		case "segment_unmap":
			mapped[e.addr] = e.addr + e.size
		case "segment_map":
			// Take [addr, addr+size) out of the mapped ranges, which
			// must hold it, with no block in it.
			end, covered := e.addr+e.size, uint64(0)
			for a, b := range mapped {
				if a < end && e.addr < b {
					delete(mapped, a)
					covered += min(b, end) - max(a, e.addr)
					if a < e.addr {
						mapped[a] = e.addr
					}
					if end < b {
						mapped[end] = b
					}
				}
			}
			if covered != e.size {
				return fmt.Errorf("entry %d: segment_map of [%#x, %#x), not all mapped after it", i, e.addr, end)
			}
			for b := range blocks {
				if b >= e.addr && b < end {
					return fmt.Errorf("entry %d: range %#x unmapped under block %#x", i, e.addr, b)
				}
			}
		}
	}
	if len(segs) != 0 || len(mapped) != 0 || len(blocks) != 0 {
		return fmt.Errorf("before the first entry: %d segments, %d mapped ranges and %d blocks live", len(segs), len(mapped), len(blocks))
	}
	return nil
}
