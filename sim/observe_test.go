package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// actionLog is an Observer that writes each action as one line.
type actionLog []string

func (l *actionLog) Observe(a Action) {
	switch a.Kind {
	case ActionOOM:
		*l = append(*l, fmt.Sprintf("e%d %s requested=%d free=%d", a.Event, a.Kind, a.Requested, a.Free))
	case ActionSegmentAlloc, ActionSegmentFree:
		*l = append(*l, fmt.Sprintf("e%d %s +%#x size=%d", a.Event, a.Kind, a.Addr-baseAddr, a.Size))
	default:
		*l = append(*l, fmt.Sprintf("e%d %s +%#x size=%d requested=%d", a.Event, a.Kind, a.Addr-baseAddr, a.Size, a.Requested))
	}
}

// TestObserverEngine replays the hand-worked engine trace (see
// testdata/engine.txt) on the cuda policy, which makes one segment of the
// rounded size per malloc, and checks every action told, in order.
func TestObserverEngine(t *testing.T) {
	var log actionLog
	if _, err := Run(textSource(t, "testdata/engine.txt"), Config{Policy: "cuda", Capacity: 8192, Observer: &log}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"e0 segment_alloc +0x0 size=1024",
		"e0 alloc +0x0 size=1024 requested=1000",
		"e1 segment_alloc +0x200000 size=3072",
		"e1 alloc +0x200000 size=3072 requested=3000",
		"e3 free_requested +0x0 size=1024 requested=1000",
		"e3 free_completed +0x0 size=1024 requested=1000",
		"e3 segment_free +0x0 size=1024",
		"e4 segment_alloc +0x400000 size=5120",
		"e4 alloc +0x400000 size=5120 requested=5000",
		"e5 oom requested=1 free=0",
		"e8 oom requested=1024 free=0",
		"e10 free_requested +0x400000 size=5120 requested=5000",
		"e10 free_completed +0x400000 size=5120 requested=5000",
		"e10 segment_free +0x400000 size=5120",
		"e11 segment_alloc +0x600000 size=512",
		"e11 alloc +0x600000 size=512 requested=100",
		"e11 free_requested +0x600000 size=512 requested=100",
		"e11 free_completed +0x600000 size=512 requested=100",
		"e11 segment_free +0x600000 size=512",
	}
	if strings.Join(log, "\n") != strings.Join(want, "\n") {
		t.Errorf("actions:\n%s\nwant:\n%s", strings.Join(log, "\n"), strings.Join(want, "\n"))
	}
}

// stateCheck is an Observer that keeps the segments and blocks the
// actions imply and checks that they stay consistent, as PyTorch's
// memory_viz needs them: every block inside a live segment, no segment
// freed under a live block, frees of live blocks only.
type stateCheck struct {
	segs     map[uint64]uint64 // address -> size
	mapped   spans             // mapped bytes of reserved ranges
	blocks   map[uint64]Action // address -> its alloc
	pending  map[uint64]bool   // free requested, not completed
	reserved uint64
	peak     uint64
	allocs   int64
	frees    int64
	err      error
}

func newStateCheck() *stateCheck {
	return &stateCheck{segs: map[uint64]uint64{}, mapped: spans{}, blocks: map[uint64]Action{}, pending: map[uint64]bool{}}
}

func (c *stateCheck) fail(a Action, format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("event %d: %s: %s", a.Event, a.Kind, fmt.Sprintf(format, args...))
	}
}

func (c *stateCheck) Observe(a Action) {
	switch a.Kind {
	case ActionSegmentAlloc:
		if _, dup := c.segs[a.Addr]; dup {
			c.fail(a, "segment %#x is live", a.Addr)
		}
		c.segs[a.Addr] = a.Size
		c.reserved += a.Size
		c.peak = max(c.peak, c.reserved)
		c.allocs++
	case ActionSegmentFree:
		size, ok := c.segs[a.Addr]
		if !ok || size != a.Size {
			c.fail(a, "segment %#x of %d bytes is not live (live: %v, %d bytes)", a.Addr, a.Size, ok, size)
		}
		for addr := range c.blocks {
			if addr >= a.Addr && addr < a.Addr+a.Size {
				c.fail(a, "segment %#x freed with block %#x live", a.Addr, addr)
			}
		}
		delete(c.segs, a.Addr)
		c.reserved -= size
		c.frees++
	case ActionSegmentMap:
		if c.mapped.overlaps(a.Addr, a.Size) {
			c.fail(a, "%#x is mapped already", a.Addr)
			return
		}
		c.mapped.add(a.Addr, a.Size)
		c.reserved += a.Size
		c.peak = max(c.peak, c.reserved)
		c.allocs++
	case ActionSegmentUnmap:
		if !c.mapped.covers(a.Addr, a.Size) {
			c.fail(a, "%#x is not mapped", a.Addr)
			return
		}
		c.mapped.remove(a.Addr, a.Size)
		for addr, b := range c.blocks {
			if addr < a.Addr+a.Size && a.Addr < addr+b.Size {
				c.fail(a, "range %#x unmapped under block %#x", a.Addr, addr)
			}
		}
		c.reserved -= a.Size
		c.frees++
	case ActionAlloc:
		if _, dup := c.blocks[a.Addr]; dup {
			c.fail(a, "block %#x is live", a.Addr)
		}
		if a.Size < a.Requested {
			c.fail(a, "block of %d bytes for %d requested", a.Size, a.Requested)
		}
		inside := false
		for s, size := range c.segs {
			if a.Addr >= s && a.Addr+a.Size <= s+size {
				inside = true
				break
			}
		}
		if !inside && a.Size > 0 {
			inside = c.mapped.covers(a.Addr, a.Size)
		}
		if !inside {
			c.fail(a, "block %#x of %d bytes is in no live segment or mapped range", a.Addr, a.Size)
		}
		c.blocks[a.Addr] = a
	case ActionFreeRequested:
		if _, ok := c.blocks[a.Addr]; !ok || c.pending[a.Addr] {
			c.fail(a, "block %#x is not live and allocated", a.Addr)
		}
		c.pending[a.Addr] = true
	case ActionFreeCompleted:
		b, ok := c.blocks[a.Addr]
		if !ok || !c.pending[a.Addr] || b.Size != a.Size {
			c.fail(a, "block %#x is not pending free", a.Addr)
		}
		delete(c.blocks, a.Addr)
		delete(c.pending, a.Addr)
	case ActionOOM:
	default:
		c.fail(a, "unknown action")
	}
}

// spans is a set of byte ranges: start -> end.
type spans map[uint64]uint64

func (s spans) add(a, n uint64) { s[a] = a + n }

func (s spans) overlaps(a, n uint64) bool {
	for st, end := range s {
		if st < a+n && a < end {
			return true
		}
	}
	return false
}

// covers reports whether [a, a+n) is inside the union of the ranges.
func (s spans) covers(a, n uint64) bool {
	for pos := a; pos < a+n; {
		next := pos
		for st, end := range s {
			if st <= pos && pos < end {
				next = end
				break
			}
		}
		if next == pos {
			return false
		}
		pos = next
	}
	return true
}

func (s spans) remove(a, n uint64) {
	for st, end := range s {
		if st < a+n && a < end {
			delete(s, st)
			if st < a {
				s[st] = a
			}
			if a+n < end {
				s[a+n] = end
			}
		}
	}
}

// TestObserverConsistent replays the small real traces as recorded (so
// that the pytorch policy maps expandable segments where the recording
// did) against every policy and checks that the actions told keep a
// consistent state whose device figures are the result's.
func TestObserverConsistent(t *testing.T) {
	paths, _ := filepath.Glob("../testdata/pytorch/*.pickle.gz")
	if len(paths) == 0 {
		t.Skip("no traces")
	}
	sort.Strings(paths)
	for _, path := range paths {
		if st, err := os.Stat(path); err != nil || st.Size() > 64<<10 {
			continue // kept fast: the large ones are for the acceptance tests
		}
		for _, name := range policies.Names() {
			t.Run(filepath.Base(path)+"/"+name, func(t *testing.T) {
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				src, err := pytorch.Import(f, path, pytorch.Options{})
				if err != nil {
					t.Fatal(err)
				}
				c := newStateCheck()
				rs, err := Run(src, Config{Policy: name, Observer: c, AsRecorded: true})
				if err != nil {
					t.Fatal(err)
				}
				if c.err != nil {
					t.Fatal(c.err)
				}
				r := rs[0]
				// A malloc that failed in the source and succeeds here is
				// freed within its event: Result.PeakReserved, taken
				// between events, does not see its segment.
				peakOK := c.peak == r.PeakReserved || (r.SourceOOMs > 0 && c.peak > r.PeakReserved)
				if !peakOK || c.allocs != r.DeviceAllocs || c.frees != r.DeviceFrees {
					t.Errorf("actions give peak %d, %d allocs, %d frees; result %d, %d, %d",
						c.peak, c.allocs, c.frees, r.PeakReserved, r.DeviceAllocs, r.DeviceFrees)
				}
			})
		}
	}
}

func TestActionKindString(t *testing.T) {
	for k, want := range map[ActionKind]string{
		ActionInvalid: "invalid", ActionAlloc: "alloc", ActionFreeRequested: "free_requested",
		ActionFreeCompleted: "free_completed", ActionSegmentAlloc: "segment_alloc",
		ActionSegmentFree: "segment_free", ActionOOM: "oom", ActionSegmentMap: "segment_map",
		ActionSegmentUnmap: "segment_unmap", numActions: "invalid", 200: "invalid",
	} {
		if got := k.String(); got != want {
			t.Errorf("%d: %q, want %q", k, got, want)
		}
	}
}
