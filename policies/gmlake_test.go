package policies_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// gmCase is a hand-worked replay against the gmlake policy. Addresses are
// offsets from ptBase (the simulated device's first address; each reserve
// or cudaMalloc takes the next addresses, 2 MiB aligned, never reused);
// sizes and offsets in the calls are in MiB.
type gmCase struct {
	name     string
	settings policies.Settings
	capacity uint64 // in bytes, 0 for none
	trace    string

	blocks []policies.Block // the successful mallocs' blocks, in order
	ooms   []int            // the events whose malloc was an OOM
	// calls are the device calls in order: "reserve OFF+SIZE", "map
	// OFF+SIZE", "unmap OFF+SIZE", "release OFF", "alloc OFF+SIZE",
	// "free OFF" (cudaMalloc and cudaFree).
	calls                  []string
	peak, end              uint64 // reserved bytes: the peak, and at the end
	allocs, frees, retries int64
	freeTotal, freeLargest uint64 // FreeSpace at the end
}

// gmLogDevice is the simulated device, with its reserves and releases
// (which it does not report) logged beside its other calls.
type gmLogDevice struct {
	*sim.Device
	log *[]string
}

func (d gmLogDevice) Reserve(size uint64) (uint64, error) {
	addr, err := d.Device.Reserve(size)
	if err == nil {
		*d.log = append(*d.log, fmt.Sprintf("reserve %d+%d", (addr-ptBase)>>20, size>>20))
	}
	return addr, err
}

func (d gmLogDevice) Release(addr uint64) error {
	err := d.Device.Release(addr)
	if err == nil {
		*d.log = append(*d.log, fmt.Sprintf("release %d", (addr-ptBase)>>20))
	}
	return err
}

func runGMCase(t *testing.T, tc gmCase) {
	t.Helper()
	_, evs, err := trace.ParseText(t.Name(), strings.NewReader(tc.trace))
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	dev := sim.NewDevice(tc.capacity)
	dev.OnCall(func(c sim.DeviceCall) {
		off := (c.Addr - ptBase) >> 20
		switch c.Op {
		case trace.OpSegmentMap:
			calls = append(calls, fmt.Sprintf("map %d+%d", off, c.Size>>20))
		case trace.OpSegmentUnmap:
			calls = append(calls, fmt.Sprintf("unmap %d+%d", off, c.Size>>20))
		case trace.OpSegmentAlloc:
			calls = append(calls, fmt.Sprintf("alloc %d+%d", off, c.Size>>20))
		case trace.OpSegmentFree:
			calls = append(calls, fmt.Sprintf("free %d", off))
		}
	})
	pol, err := policies.New("gmlake", gmLogDevice{dev, &calls}, tc.settings)
	if err != nil {
		t.Fatal(err)
	}
	p := pol.(*policies.GMLake)
	var blocks []policies.Block
	var ooms []int
	live := map[uint64]policies.Block{}
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("event %d: %v", i, err)
				}
				ooms = append(ooms, i)
				continue
			}
			blocks = append(blocks, policies.Block{Addr: b.Addr - ptBase, Size: b.Size})
			live[ev.Addr] = b
		case trace.OpFree:
			if b, ok := live[ev.Addr]; ok {
				delete(live, ev.Addr)
				if err := p.Free(b.Addr, ev.Stream); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
		case trace.OpEmptyCache:
			if err := p.EmptyCache(); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	}
	if !slices.Equal(blocks, tc.blocks) {
		t.Errorf("blocks (offsets):\n got %s\nwant %s", fmtBlocks(blocks), fmtBlocks(tc.blocks))
	}
	if !slices.Equal(ooms, tc.ooms) {
		t.Errorf("OOMs at events %v, want %v", ooms, tc.ooms)
	}
	if !slices.Equal(calls, tc.calls) {
		t.Errorf("device calls:\n got %q\nwant %q", calls, tc.calls)
	}
	if dev.PeakReserved() != tc.peak || dev.Reserved() != tc.end {
		t.Errorf("reserved: peak %d, end %d; want %d, %d", dev.PeakReserved(), dev.Reserved(), tc.peak, tc.end)
	}
	if dev.Allocs() != tc.allocs || dev.Frees() != tc.frees || p.Retries() != tc.retries {
		t.Errorf("device allocs %d, frees %d, retries %d; want %d, %d, %d", dev.Allocs(), dev.Frees(), p.Retries(), tc.allocs, tc.frees, tc.retries)
	}
	if total, largest := p.FreeSpace(); total != tc.freeTotal || largest != tc.freeLargest {
		t.Errorf("FreeSpace() = %d, %d; want %d, %d", total, largest, tc.freeTotal, tc.freeLargest)
	}
}

// The two segments that most cases stitch: 12 MiB at offset 0 and 10 MiB
// at 12 (a request of 10 MiB or more gets a segment of its size), both
// freed.
const gmTwoFree = `
malloc id=1 size=12MiB
malloc id=2 size=10MiB
free id=1
free id=2
`

// gmTwoFreeCalls are the device calls of gmTwoFree: each segment a
// reserved range with all its pages mapped (one map).
var gmTwoFreeCalls = []string{"reserve 0+12", "map 0+12", "reserve 12+10", "map 12+10"}

func gmCalls(more ...string) []string { return append(slices.Clone(gmTwoFreeCalls), more...) }

func TestGMLake(t *testing.T) {
	const M = ptMiB
	type blk = policies.Block
	stitch8 := policies.Settings{"fragLimit": "8MiB"}
	cases := []gmCase{{
		// Rounding: 3 MiB is a large request (over 1 MiB), rounded up to
		// 4 MiB (the pytorch policy keeps 3 MiB), under 10 MiB: a 20 MiB
		// segment, reserved and mapped, whose rest (16 MiB) is split off
		// since 2 MiB or more is over. 1 MiB + 1 B rounds to 1 MiB + 512 B,
		// over 1 MiB, so to 2 MiB (pytorch: 1 MiB + 512 B): best fit is
		// the 16 MiB rest at 4, split again (14 MiB left at 6). 1000 B
		// rounds to 1024 B, a small request: a 2 MiB segment of
		// cudaMalloc at 20; exactly 1 MiB is still small and follows it
		// (1 MiB - 1024 B left). Free: 14 MiB + 1 MiB - 1024 B.
		name:   "rounding, segments and splits",
		trace:  "malloc id=1 size=3MiB\nmalloc id=2 size=1048577\nmalloc id=3 size=1000\nmalloc id=4 size=1MiB",
		blocks: []blk{{0, 4 * M}, {4 * M, 2 * M}, {20 * M, 1024}, {20*M + 1024, M}},
		calls:  []string{"reserve 0+20", "map 0+20", "alloc 20+2"},
		peak:   22 * M, end: 22 * M, allocs: 2,
		freeTotal: 14*M + M - 1024, freeLargest: 14 * M,
	}, {
		// Under fragLimit (512 MiB by default) no stitching: the 16 MiB
		// request fits neither free block (12, 10) and gets a segment of
		// its own at 22. Peak 38 MiB.
		name:   "below fragLimit a new segment",
		trace:  gmTwoFree + "malloc id=3 size=16MiB",
		blocks: []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:  gmCalls("reserve 22+16", "map 22+16"),
		peak:   38 * M, end: 38 * M, allocs: 3,
		freeTotal: 22 * M, freeLargest: 12 * M,
	}, {
		// fragLimit 8 MiB: the 16 MiB request stitches the stream's free
		// blocks, largest first: 12 MiB at 0, then 10 MiB at 12 (22 MiB);
		// 6 MiB over, 2 MiB or more, so the last is split: its front 4
		// MiB [12, 16) taken, [16, 22) back free. A range of 16 MiB at 22
		// gets their pages: unmapped at home (one call per block), mapped
		// there (one call). Reserved stays 22 MiB.
		name:     "stitch: largest first, the last split",
		settings: stitch8,
		trace:    gmTwoFree + "malloc id=3 size=16MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:    gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16"),
		peak:     22 * M, end: 22 * M, allocs: 3, frees: 2,
		freeTotal: 6 * M, freeLargest: 6 * M,
	}, {
		// The stitched block of the case before, freed: its blocks are
		// free again (12 at 0; 4 at 12 merged with 6 at 16), and it is
		// cached, its pages all free: the largest free run, 16 MiB. 14
		// MiB fits no free block; the stitched block (16 <= 10 x 14) is
		// taken for its first 7 pages, already mapped in it (no call):
		// 12 MiB at 0 and 2 MiB at 12 are taken out of the free blocks,
		// [14, 22) stays free. Then 6 MiB takes [14, 20) (2 MiB at 20
		// left), whose first page (12 + 2) is mapped in the stitched
		// block as its 8th (at 22 + 14 = 36): unmapped there, mapped
		// home.
		name:     "a freed stitched block reused; a page in it mapped home for an original block",
		settings: stitch8,
		trace:    gmTwoFree + "malloc id=3 size=16MiB\nfree id=3\nmalloc id=4 size=14MiB\nmalloc id=5 size=6MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}, {22 * M, 14 * M}, {14 * M, 6 * M}},
		calls:    gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16", "unmap 36+2", "map 14+2"),
		peak:     22 * M, end: 22 * M, allocs: 4, frees: 3,
		freeTotal: 2 * M, freeLargest: 2 * M,
	}, {
		// reuseLimit 1: the 16 MiB stitched block is more than 1 x 14 MiB,
		// so 14 MiB stitches anew: 12 at 0 and 10 at 12, 8 MiB over, the
		// 10 split (2 MiB taken). Their 7 pages are the first 7 of the
		// old stitched block's range [22, 36): one unmap there, one map
		// in the new range at 38.
		name:     "reuseLimit: a stitched block too large is not reused",
		settings: policies.Settings{"fragLimit": "8MiB", "reuseLimit": "1"},
		trace:    gmTwoFree + "malloc id=3 size=16MiB\nfree id=3\nmalloc id=4 size=14MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}, {38 * M, 14 * M}},
		calls:    gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16", "reserve 38+14", "unmap 22+14", "map 38+14"),
		peak:     22 * M, end: 22 * M, allocs: 4, frees: 3,
		freeTotal: 8 * M, freeLargest: 8 * M,
	}, {
		// Stitching takes only the request's stream: stream 0 has one
		// free block (12), too few (two or more are needed), so 16 MiB
		// gets a segment though stream 1's 10 would add up.
		name:     "stitching takes two blocks or more of the stream",
		settings: stitch8,
		trace:    "malloc id=1 size=12MiB\nmalloc id=2 size=10MiB stream=1\nfree id=1\nfree id=2\nmalloc id=3 size=16MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:    gmCalls("reserve 22+16", "map 22+16"),
		peak:     38 * M, end: 38 * M, allocs: 3,
		freeTotal: 22 * M, freeLargest: 12 * M,
	}, {
		// defragLevel 1 under a capacity of 24 MiB: no stitching before a
		// new segment, which would pass the capacity (22 + 16), so is
		// not asked for; then the stitch, as at level 0.
		name:     "defragLevel 1: stitched after a new segment failed",
		settings: policies.Settings{"fragLimit": "8MiB", "defragLevel": "1"},
		capacity: 24 * M,
		trace:    gmTwoFree + "malloc id=3 size=16MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:    gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16"),
		peak:     22 * M, end: 22 * M, allocs: 3, frees: 2,
		freeTotal: 6 * M, freeLargest: 6 * M,
	}, {
		// defragLevel 2: not after the failed segment either; the retry
		// gives back the cached whole segments, in (stream, size,
		// address) order: 10 at 12, then 12 at 0; the new 16 MiB segment
		// then fits (at 22).
		name:     "defragLevel 2: the retry frees the cached segments first",
		settings: policies.Settings{"fragLimit": "8MiB", "defragLevel": "2"},
		capacity: 24 * M,
		trace:    gmTwoFree + "malloc id=3 size=16MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:    gmCalls("unmap 12+10", "release 12", "unmap 0+12", "release 0", "reserve 22+16", "map 22+16"),
		peak:     22 * M, end: 16 * M, allocs: 3, frees: 2, retries: 1,
	}, {
		// An OOM: 10 MiB at 12 stays in use, so 16 MiB finds one free
		// block (12, too few to stitch); a segment would pass 24 MiB;
		// the retry gives back the 12 MiB segment, and 10 + 16 still
		// passes; nothing to stitch: the malloc fails.
		name:     "OOM after the retry",
		settings: stitch8,
		capacity: 24 * M,
		trace:    "malloc id=1 size=12MiB\nmalloc id=2 size=10MiB\nfree id=1\nmalloc id=3 size=16MiB",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}},
		ooms:     []int{3},
		calls:    gmCalls("unmap 0+12", "release 0"),
		peak:     22 * M, end: 10 * M, allocs: 2, frees: 1, retries: 1,
	}, {
		// empty_cache after the stitched block is freed: the whole free
		// segments are given back, 10 at 12 first; the stitched block
		// over its pages is collected (all 8 pages unmapped in its range
		// at 22, none mapped home: both segments are being given back;
		// its range released), then the rest of the segment, [16, 22),
		// at home. The 12 MiB segment has no page left mapped.
		name:     "empty_cache gives back segments and collects stitched blocks",
		settings: stitch8,
		trace:    gmTwoFree + "malloc id=3 size=16MiB\nfree id=3\nempty_cache",
		blocks:   []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}},
		calls:    gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16", "unmap 22+16", "release 22", "unmap 16+6", "release 12", "release 0"),
		peak:     22 * M, end: 0, allocs: 3, frees: 4,
	}, {
		// autoGC 0: past 0 GiB of stitched blocks after each stitch,
		// every stitched block not in use is collected. Stream 1
		// stitches 16 MiB at 22 and frees it; stream 2 has segments at
		// 38 (12) and 50 (10) and stitches 16 MiB at 60; then the first
		// is collected: its pages unmapped in its range and mapped home
		// (12 at 0, 4 at 12), the range released. Free: 12 + 10 on
		// stream 1, 6 on stream 2; the largest 12 (no stitched block
		// left to count).
		name:     "autoGC: stitched blocks collected, their pages mapped home",
		settings: policies.Settings{"fragLimit": "8MiB", "autoGC": "0"},
		trace: `
malloc id=1 size=12MiB stream=1
malloc id=2 size=10MiB stream=1
free id=1
free id=2
malloc id=3 size=16MiB stream=1
free id=3
malloc id=4 size=12MiB stream=2
malloc id=5 size=10MiB stream=2
free id=4
free id=5
malloc id=6 size=16MiB stream=2`,
		blocks: []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}, {38 * M, 12 * M}, {50 * M, 10 * M}, {60 * M, 16 * M}},
		calls: gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16",
			"reserve 38+12", "map 38+12", "reserve 50+10", "map 50+10",
			"reserve 60+16", "unmap 38+12", "unmap 50+4", "map 60+16",
			"unmap 22+16", "map 0+12", "map 12+4", "release 22"),
		peak: 44 * M, end: 44 * M, allocs: 8, frees: 5,
		freeTotal: 28 * M, freeLargest: 12 * M,
	}, {
		// The same with autoGC at its default: the first stitched block
		// stays cached, its pages in its range; it is the largest free
		// run.
		name:     "autoGC default: stitched blocks stay cached",
		settings: stitch8,
		trace: `
malloc id=1 size=12MiB stream=1
malloc id=2 size=10MiB stream=1
free id=1
free id=2
malloc id=3 size=16MiB stream=1
free id=3
malloc id=4 size=12MiB stream=2
malloc id=5 size=10MiB stream=2
free id=4
free id=5
malloc id=6 size=16MiB stream=2`,
		blocks: []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 16 * M}, {38 * M, 12 * M}, {50 * M, 10 * M}, {60 * M, 16 * M}},
		calls: gmCalls("reserve 22+16", "unmap 0+12", "unmap 12+4", "map 22+16",
			"reserve 38+12", "map 38+12", "reserve 50+10", "map 50+10",
			"reserve 60+16", "unmap 38+12", "unmap 50+4", "map 60+16"),
		peak: 44 * M, end: 44 * M, allocs: 6, frees: 4,
		freeTotal: 28 * M, freeLargest: 16 * M,
	}, {
		// Segments of 12 (at 0), 10 (at 12) and 10 (at 22), freed; 26 MiB
		// stitches 12 at 0, 10 at 22 (of equal sizes the higher address
		// first), then 10 at 12, split (6 MiB over): 4 MiB taken, [16,
		// 22) free. Freed and taken again for 22 MiB: its first 11 pages,
		// the 12 and the 10 at 22, whole; its last two (the 4 MiB at 12)
		// stay free, mapped in it at 32 + 22 = 54. empty_cache gives back
		// the one whole free segment, 10 at 12: its pages leave the
		// stitched block in use (unmapped at 54), then [16, 22) at home.
		// When freed, the stitched block is collected: its 11 pages
		// unmapped in its range and mapped home, its range released.
		name:     "a segment given back under a stitched block in use",
		settings: stitch8,
		trace: `
malloc id=1 size=12MiB
malloc id=2 size=10MiB
malloc id=3 size=10MiB
free id=1
free id=2
free id=3
malloc id=4 size=26MiB
free id=4
malloc id=5 size=22MiB
empty_cache
free id=5`,
		blocks: []blk{{0, 12 * M}, {12 * M, 10 * M}, {22 * M, 10 * M}, {32 * M, 26 * M}, {32 * M, 22 * M}},
		calls: gmCalls("reserve 22+10", "map 22+10",
			"reserve 32+26", "unmap 0+12", "unmap 22+10", "unmap 12+4", "map 32+26",
			"unmap 54+4", "unmap 16+6", "release 12",
			"unmap 32+22", "map 0+12", "map 22+10", "release 32"),
		peak: 32 * M, end: 22 * M, allocs: 6, frees: 6,
		freeTotal: 22 * M, freeLargest: 12 * M,
	}, {
		// 3.5 GiB fits neither free segment (3 GiB at 0, 1 GiB at 3072)
		// and stitches them (the 1 GiB split: 512 MiB taken) into a
		// range at 4096; 512 MiB left free at 3584.
		name:   "stitch at the default fragLimit",
		trace:  "malloc id=1 size=3GiB\nmalloc id=2 size=1GiB\nfree id=1\nfree id=2\nmalloc id=3 size=3584MiB",
		blocks: []blk{{0, 3072 * M}, {3072 * M, 1024 * M}, {4096 * M, 3584 * M}},
		calls: []string{"reserve 0+3072", "map 0+3072", "reserve 3072+1024", "map 3072+1024",
			"reserve 4096+3584", "unmap 0+3072", "unmap 3072+512", "map 4096+3584"},
		peak: 4096 * M, end: 4096 * M, allocs: 3, frees: 2,
		freeTotal: 512 * M, freeLargest: 512 * M,
	}, {
		// The same in TiB: a segment over 2 TiB is never stitched (its
		// pages would be tracked one by one), so 3.5 TiB gets a segment.
		name:   "no stitching over a segment past 2 TiB",
		trace:  "malloc id=1 size=3TiB\nmalloc id=2 size=1TiB\nfree id=1\nfree id=2\nmalloc id=3 size=3584GiB",
		blocks: []blk{{0, 3 << 40}, {3 << 40, 1 << 40}, {4 << 40, 3584 << 30}},
		calls:  []string{"reserve 0+3145728", "map 0+3145728", "reserve 3145728+1048576", "map 3145728+1048576", "reserve 4194304+3670016", "map 4194304+3670016"},
		peak:   7680 << 30, end: 7680 << 30, allocs: 3,
		freeTotal: 4 << 40, freeLargest: 3 << 40,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { runGMCase(t, tc) })
	}
}

// TestGMLakeSettings: each bad setting is refused with an error naming
// it, and a device that cannot map pages is refused.
func TestGMLakeSettings(t *testing.T) {
	for _, tc := range []struct {
		s    policies.Settings
		want string
	}{
		{policies.Settings{"fragLimit": "lots"}, `setting fragLimit="lots"`},
		{policies.Settings{"reuseLimit": "-1"}, `setting reuseLimit="-1": want a factor of 0 or more`},
		{policies.Settings{"reuseLimit": "NaN"}, `setting reuseLimit="NaN"`},
		{policies.Settings{"defragLevel": "3"}, `setting defragLevel="3": want 0, 1 or 2`},
		{policies.Settings{"defragLevel": "-1"}, `setting defragLevel="-1"`},
		{policies.Settings{"autoGC": "x"}, `setting autoGC="x"`},
		{policies.Settings{"autoGC": "18446744073709551615"}, `setting autoGC="18446744073709551615": GiB past 64 bits`},
		{policies.Settings{"fraglimit": "1"}, `unknown setting "fraglimit"`},
	} {
		if _, err := policies.New("gmlake", sim.NewDevice(0), tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.s, err, tc.want)
		}
	}
	if _, err := policies.New("gmlake", noMapper{sim.NewDevice(0)}, nil); err == nil || !strings.Contains(err.Error(), "cannot map pages") {
		t.Errorf("on a device that is no Mapper: error %v", err)
	}
}
