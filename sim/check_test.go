package sim

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// fakeSpace is a policy that only reports a free space, for the checks of
// Step; the tests drive the Checker themselves.
type fakeSpace struct{ total, largest uint64 }

func (f *fakeSpace) Name() string                                       { return "fake" }
func (f *fakeSpace) Malloc(size, stream uint64) (policies.Block, error) { return policies.Block{}, nil }
func (f *fakeSpace) Free(addr, stream uint64) error                     { return nil }
func (f *fakeSpace) FreeSpace() (uint64, uint64)                        { return f.total, f.largest }

// checkRun is what a checker test does: its steps, each at event i.
type checkStep struct {
	i     int64
	alloc uint64          // allocate a segment of this size through the wrapped device
	free  int             // free the segment allocated by step free-1 (1-based), through the wrapper
	raw   uint64          // allocate a segment of this size behind the checker's back
	block *policies.Block // hand out this block (addresses relative to the first segment)
	size  uint64          // the malloc's requested size (block's size if 0)
	give  *policies.Block // take this block back
	space *fakeSpace      // the policy's free space from here
}

func blk(addr, size uint64) *policies.Block { return &policies.Block{Addr: addr, Size: size} }

func TestChecker(t *testing.T) {
	const seg = 2 << 20
	for _, tc := range []struct {
		name         string
		steps        []checkStep
		event        int64  // the event of the violation, -1 for none
		msg          string // a substring of the message
		block, other *policies.Block
	}{
		{
			name: "valid",
			steps: []checkStep{
				{i: 0, alloc: seg}, {i: 0, block: blk(0, 512), size: 500}, {i: 1, block: blk(512, 1024)},
				{i: 2, give: blk(0, 512)}, {i: 3, block: blk(0, 512)}, {i: 4, block: blk(seg-512, 512)},
				{i: 5, block: blk(0, 0), size: 0}, // a malloc of 0 bytes
				{i: 6, give: blk(0, 512)}, {i: 6, give: blk(512, 1024)}, {i: 6, give: blk(seg-512, 512)}, {i: 6, free: 1},
			},
			event: -1,
		},
		{
			name:  "overlap",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 3, block: blk(0, 1024)}, {i: 7, block: blk(512, 1024)}},
			event: 7, msg: "overlaps block", block: blk(512, 1024), other: blk(0, 1024),
		},
		{
			name:  "overlap from below",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 3, block: blk(4096, 1024)}, {i: 4, block: blk(2048, 4096)}},
			event: 4, msg: "live since event 3", block: blk(2048, 4096), other: blk(4096, 1024),
		},
		{
			name: "a freed block handed out twice",
			steps: []checkStep{
				{i: 0, alloc: seg}, {i: 1, block: blk(0, 512)}, {i: 2, give: blk(0, 512)},
				{i: 3, block: blk(0, 512)}, {i: 4, block: blk(0, 512)},
			},
			event: 4, msg: "handed out twice", block: blk(0, 512), other: blk(0, 512),
		},
		{
			name:  "outside any segment",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 5, block: blk(seg, 512)}},
			event: 5, msg: "not inside a live device segment", block: blk(seg, 512),
		},
		{
			name:  "past the segment's end",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 5, block: blk(seg-256, 512)}},
			event: 5, msg: "runs past the end of its device segment", block: blk(seg-256, 512), other: blk(0, seg),
		},
		{
			name:  "smaller than requested",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 2, block: blk(0, 512), size: 513}},
			event: 2, msg: "malloc of 513 bytes got block", block: blk(0, 512),
		},
		{
			name:  "empty block for a request",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 2, block: blk(0, 0), size: 8}},
			event: 2, msg: "got the empty block",
		},
		{
			name:  "segment freed under a live block",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 1, block: blk(1024, 512)}, {i: 9, free: 1}},
			event: 9, msg: "freed while block", block: blk(0, seg), other: blk(1024, 512),
		},
		{
			name:  "reserved bytes",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 4, raw: seg}},
			event: 4, msg: "device reserved bytes 4194304 != 2097152",
		},
		{
			name:  "largest free block above the free bytes",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 1, space: &fakeSpace{total: 512, largest: 1024}}},
			event: 1, msg: "largest free block of 1024 bytes > 512 free bytes",
		},
		{
			name:  "free and live bytes above the reserved",
			steps: []checkStep{{i: 0, alloc: seg}, {i: 1, block: blk(0, 1024)}, {i: 2, space: &fakeSpace{total: seg, largest: seg - 1024}}},
			event: 2, msg: "1024 bytes in live blocks + 2097152 free bytes > 2097152 reserved bytes",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := NewDevice(0)
			c := NewChecker(dev)
			wrapped := c.Wrap()
			space := &fakeSpace{}
			c.SetPolicy(space)
			var segs []uint64
			var base uint64
			var err error
			last := int64(-1)
			for _, st := range tc.steps {
				if st.i != last {
					if last >= 0 {
						if err = c.Step(); err != nil {
							break
						}
					}
					c.Begin(st.i)
					last = st.i
				}
				switch {
				case st.alloc > 0:
					a, aerr := wrapped.Alloc(st.alloc)
					if aerr != nil {
						t.Fatal(aerr)
					}
					if base == 0 {
						base = a
					}
					segs = append(segs, a)
				case st.raw > 0:
					if _, aerr := dev.Alloc(st.raw); aerr != nil {
						t.Fatal(aerr)
					}
				case st.free > 0:
					if ferr := wrapped.Free(segs[st.free-1]); ferr != nil {
						t.Fatal(ferr)
					}
				case st.block != nil:
					b := *st.block
					if b.Size > 0 {
						b.Addr += base
					}
					size := st.size
					if size == 0 && st.block.Size > 0 {
						size = b.Size
					}
					err = c.Malloc(b, size)
				case st.give != nil:
					b := *st.give
					b.Addr += base
					err = c.Free(b)
				case st.space != nil:
					*space = *st.space
				}
				if err != nil {
					break
				}
			}
			if err == nil {
				err = c.Step()
			}
			if tc.event < 0 {
				if err != nil {
					t.Fatalf("unexpected violation: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no violation, want %q at event %d", tc.msg, tc.event)
			}
			var ce *CheckError
			if !errors.Is(err, ErrInvariant) || !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *CheckError wrapping ErrInvariant", err)
			}
			if ce.Event != tc.event || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("got %q (event %d), want %q at event %d", err, ce.Event, tc.msg, tc.event)
			}
			rel := func(b *policies.Block) policies.Block {
				if b == nil {
					return policies.Block{}
				}
				return policies.Block{Addr: base + b.Addr, Size: b.Size}
			}
			if tc.block != nil && ce.Block != rel(tc.block) {
				t.Errorf("block %s, want %s", fmtBlock(ce.Block), fmtBlock(rel(tc.block)))
			}
			if ce.Other != rel(tc.other) {
				t.Errorf("other block %s, want %s", fmtBlock(ce.Other), fmtBlock(rel(tc.other)))
			}
			// Both blocks are in the message, as address ranges.
			if tc.other != nil && (!strings.Contains(err.Error(), fmtBlock(ce.Block)) || !strings.Contains(err.Error(), fmtBlock(ce.Other))) {
				t.Errorf("message %q does not name both blocks", err)
			}
		})
	}
}

// TestCheckerInReplay replays the engine's hand-worked trace with every
// policy, unlimited and under its capacity of 8192 bytes, with the
// checker on: no violation, and the checker holds the device's segments.
func TestCheckerInReplay(t *testing.T) {
	f, err := os.Open("testdata/engine.txt")
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := trace.ParseText("engine.txt", f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range policies.Names() {
		for _, capacity := range []uint64{0, 8192} {
			t.Run(fmt.Sprintf("%s/%d", name, capacity), func(t *testing.T) {
				rep, err := NewReplay(Config{Policy: name, Capacity: capacity, Check: true})
				if err != nil && capacity > 0 {
					t.Skipf("the policy does not fit in %d bytes: %v", capacity, err)
				}
				if err != nil {
					t.Fatal(err)
				}
				if rep.check == nil {
					t.Fatal("no checker")
				}
				if p, ok := rep.policy.(policies.Planner); ok {
					if err := p.Plan(evs); err != nil {
						t.Fatal(err)
					}
				}
				for i, ev := range evs {
					if err := rep.Step(int64(i), ev); err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
				}
				// Runs of mapped pages are segments to the checker, none
				// to the device.
				if segs := rep.check.segments.Len() - len(rep.check.mapped); rep.check.reserved != rep.dev.Reserved() || segs != rep.dev.live.Len() {
					t.Errorf("checker holds %d bytes in %d segments, device %d in %d",
						rep.check.reserved, segs, rep.dev.Reserved(), rep.dev.live.Len())
				}
			})
		}
	}
}

func TestCheckByDefault(t *testing.T) {
	if !checkByDefault() {
		t.Error("the checker is off by default in tests")
	}
	t.Setenv("ALLOCSIM_CHECK", "0")
	if checkByDefault() {
		t.Error("ALLOCSIM_CHECK=0 leaves the checker on")
	}
	t.Setenv("ALLOCSIM_CHECK", "1")
	if !checkByDefault() {
		t.Error("ALLOCSIM_CHECK=1 leaves the checker off")
	}
}

// fakeAlias is a policy that says which live block the last block extends
// in place (policies.Aliaser), for TestCheckerAliases.
type fakeAlias struct {
	fakeSpace
	old *policies.Block
}

func (f *fakeAlias) Aliases(b policies.Block) (policies.Block, bool) {
	if f.old == nil {
		return policies.Block{}, false
	}
	return *f.old, true
}

// TestCheckerAliases: a block that extends a live one in place (a
// growing range's top 2048 bytes over the old tensor's top 1024) may
// overlap it when the policy says so, and the old one's bytes count once
// (live 2048 of 4096 reserved with 2048 free: no violation); the old
// one's free and the new one's are then accepted. The same overlap unsaid
// is a violation, and so is an alias to a block outside the new one.
func TestCheckerAliases(t *testing.T) {
	run := func(alias *policies.Block, oldAt uint64) error {
		dev := NewDevice(0)
		c := NewChecker(dev)
		p := &fakeAlias{fakeSpace: fakeSpace{total: 2048, largest: 2048}}
		c.SetPolicy(p)
		seg, err := c.Wrap().Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		old := policies.Block{Addr: seg + oldAt, Size: 1024}
		c.Begin(0)
		if err := c.Malloc(old, 1000); err != nil {
			return err
		}
		if err := c.Step(); err != nil {
			return err
		}
		c.Begin(1)
		if alias != nil {
			a := *alias
			a.Addr += seg
			p.old = &a
		}
		grown := policies.Block{Addr: seg + 1024, Size: 2048}
		if err := c.Malloc(grown, 2000); err != nil {
			return err
		}
		if err := c.Step(); err != nil {
			return err
		}
		c.Begin(2)
		p.old = nil
		if err := c.Free(old); err != nil {
			return err
		}
		if err := c.Free(grown); err != nil {
			return err
		}
		return c.Step()
	}
	if err := run(&policies.Block{Addr: 2048, Size: 1024}, 2048); err != nil {
		t.Errorf("an overlap the policy says: %v", err)
	}
	if err := run(nil, 2048); err == nil || !strings.Contains(err.Error(), "overlaps block") {
		t.Errorf("an overlap unsaid: %v, want an overlap", err)
	}
	if err := run(&policies.Block{Addr: 0, Size: 1024}, 0); err == nil || !strings.Contains(err.Error(), "said to extend") {
		t.Errorf("an alias outside the new block: %v, want refused", err)
	}
}
