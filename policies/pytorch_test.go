package policies_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// Sizes and addresses of the pytorch policy's tests.
const (
	ptKiB = 1 << 10
	ptMiB = 1 << 20
	// ptBase is the address of the simulated device's first segment; each
	// later segment follows the previous one at the next 2 MiB boundary,
	// and addresses are never reused.
	ptBase = 0x7f0000000000
)

// ptCase is a hand-worked replay against the pytorch policy.
type ptCase struct {
	name     string
	capacity uint64 // device capacity in bytes, 0 for unlimited
	trace    string // text form

	// blocks are the results of the mallocs and malloc_failed attempts in
	// order; the zero Block for an OOM.
	blocks []policies.Block
	ooms   int

	peakReserved  uint64
	peakAllocated uint64 // of the blocks' sizes
	reservedEnd   uint64
	allocs, frees int64 // device calls
	retries       int64

	freeTotal, freeLargest uint64 // FreeSpace at the end

	// frees lists the device frees in order, as B+offset:size, when set.
	freeCalls string
}

// ptRun is what ptDrive saw.
type ptRun struct {
	dev           *sim.Device
	p             policies.Policy
	freeCalls     []policies.Block // the device frees, in order
	blocks        []policies.Block
	ooms          int
	peakAllocated uint64
}

// ptDrive replays a text-form trace against the pytorch policy: malloc
// and free by trace address (into its pool: MallocPool when it names
// one), malloc_failed as an attempt freed at once, empty_cache,
// pool_release. Errors other than OOMs fail the test.
func ptDrive(t testing.TB, capacity uint64, text string) ptRun {
	t.Helper()
	_, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.NewDevice(capacity)
	p, err := policies.New("pytorch", dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := ptRun{dev: dev, p: p}
	dev.OnCall(func(c sim.DeviceCall) {
		if c.Op == trace.OpSegmentFree {
			r.freeCalls = append(r.freeCalls, policies.Block{Addr: c.Addr, Size: c.Size})
		}
	})
	live := map[uint64]policies.Block{}
	var allocated uint64
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc, trace.OpMallocFailed:
			var b policies.Block
			if ev.Restore {
				b, err = p.(policies.Pooler).RestoreBlock(ev.Size, ev.Stream, ev.Pool)
			} else if ev.Pool != 0 {
				b, err = p.(policies.Pooler).MallocPool(ev.Size, ev.Stream, ev.Pool)
			} else {
				b, err = p.Malloc(ev.Size, ev.Stream)
			}
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("event %d: malloc of %d: %v", i, ev.Size, err)
				}
				r.ooms++
			}
			r.blocks = append(r.blocks, b)
			allocated += b.Size
			r.peakAllocated = max(r.peakAllocated, allocated)
			if err != nil {
				continue
			}
			if ev.Op == trace.OpMalloc {
				live[ev.Addr] = b
				continue
			}
			allocated -= b.Size
			if err := p.Free(b.Addr, ev.Stream); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		case trace.OpFree:
			b, ok := live[ev.Addr]
			if !ok {
				continue
			}
			delete(live, ev.Addr)
			allocated -= b.Size
			if err := p.Free(b.Addr, ev.Stream); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		case trace.OpEmptyCache:
			if err := p.(policies.Releaser).EmptyCache(); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		case trace.OpPoolRelease:
			if err := p.(policies.Pooler).ReleasePool(ev.Pool); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	}
	return r
}

func TestPyTorch(t *testing.T) {
	const (
		M = ptMiB
		K = ptKiB
		B = ptBase
	)
	type blk = policies.Block
	cases := []ptCase{{
		// 1000 B rounds up to 1024 B, a small request: both share one 2 MiB
		// small segment, the second right after the first. The rest of the
		// segment, 2 MiB - 2048 B, stays free as one block.
		name:  "small mallocs share a 2 MiB segment",
		trace: "malloc id=1 size=1000\nmalloc id=2 size=1000",
		blocks: []blk{
			{B, 1024},
			{B + 1024, 1024},
		},
		peakReserved: 2 * M, peakAllocated: 2048, reservedEnd: 2 * M, allocs: 1,
		freeTotal: 2*M - 2048, freeLargest: 2*M - 2048,
	}, {
		// Sizes under 512 B round up to 512 B; 513 B to 1024 B; exactly
		// 1 MiB is still a small request.
		name:  "rounding to 512 bytes",
		trace: "malloc id=1 size=1\nmalloc id=2 size=513\nmalloc id=3 size=1MiB",
		blocks: []blk{
			{B, 512},
			{B + 512, 1024},
			{B + 1536, M},
		},
		peakReserved: 2 * M, peakAllocated: 512 + 1024 + M, reservedEnd: 2 * M, allocs: 1,
		freeTotal: 2*M - 1536 - M, freeLargest: M - 1536,
	}, {
		// 3 MiB is a large request under 10 MiB: a 20 MiB segment, of which
		// the rest (17 MiB) is split off and takes the 5 MiB request next.
		// 1 MiB + 1 B rounds to 1 MiB + 512 B, a large request too.
		name:  "mid-size requests carve up a 20 MiB segment",
		trace: "malloc id=1 size=3MiB\nmalloc id=2 size=5MiB\nmalloc id=3 size=1048577",
		blocks: []blk{
			{B, 3 * M},
			{B + 3*M, 5 * M},
			{B + 8*M, M + 512},
		},
		peakReserved: 20 * M, peakAllocated: 9*M + 512, reservedEnd: 20 * M, allocs: 1,
		freeTotal: 11*M - 512, freeLargest: 11*M - 512,
	}, {
		// 12 MiB gets a segment of exactly 12 MiB. 11 MiB + 1 B rounds to
		// 11 MiB + 512 B and gets a 12 MiB segment (rounded up to 2 MiB);
		// the rest, 1 MiB - 512 B, is not over 1 MiB, so it is not split
		// off and the block counts 12 MiB as allocated.
		name:  "large requests get segments rounded up to 2 MiB",
		trace: "malloc id=1 size=12MiB\nmalloc id=2 size=11534337",
		blocks: []blk{
			{B, 12 * M},
			{B + 12*M, 12 * M},
		},
		peakReserved: 24 * M, peakAllocated: 24 * M, reservedEnd: 24 * M, allocs: 2,
	}, {
		// A large block is split only if more than 1 MiB remains: 19 MiB in
		// a 20 MiB segment leaves exactly 1 MiB (kept in the block), 19 MiB
		// - 512 B leaves 1 MiB + 512 B (split off, and free).
		name:  "large split needs more than 1 MiB left",
		trace: "malloc id=1 size=19MiB\nmalloc id=2 size=19922432",
		blocks: []blk{
			{B, 20 * M},
			{B + 20*M, 19*M - 512},
		},
		peakReserved: 40 * M, peakAllocated: 39*M - 512, reservedEnd: 40 * M, allocs: 2,
		freeTotal: M + 512, freeLargest: M + 512,
	}, {
		// Three 512 KiB blocks at B, B+512K, B+1M and the free rest (512 KiB
		// at B+1536K). Freeing 1 leaves it alone (its neighbour 2 is live);
		// freeing 3 merges it with the rest (1 MiB at B+1M); freeing 2
		// merges both sides: the whole 2 MiB segment is one free block. So
		// the 1 MiB malloc lands at B; without the merges it would take
		// the 1 MiB block at B+1M.
		name: "a free merges with its free neighbours",
		trace: `malloc id=1 size=512KiB
malloc id=2 size=512KiB
malloc id=3 size=512KiB
free id=1
free id=3
free id=2
malloc id=4 size=1MiB`,
		blocks: []blk{
			{B, 512 * K},
			{B + 512*K, 512 * K},
			{B + 1024*K, 512 * K},
			{B, M},
		},
		peakReserved: 2 * M, peakAllocated: 1536 * K, reservedEnd: 2 * M, allocs: 1,
		freeTotal: M, freeLargest: M,
	}, {
		// Layout of the 2 MiB small segment: a 256K at B, 4K at B+256K,
		// c 128K at B+260K, 4K at B+388K, e 128K at B+392K, 4K at B+520K,
		// and the rest (1524 KiB) free at B+524K. Freed: a, c, e. 100 KiB
		// fits best in a 128 KiB block; c and e tie, c has the lower
		// address. Then 128 KiB takes e exactly (c's rest, 28 KiB at
		// B+360K, is too small) and 200 KiB takes a, the smallest that fits.
		name: "best fit, ties to the lowest address",
		trace: `malloc id=1 size=256KiB
malloc id=2 size=4KiB
malloc id=3 size=128KiB
malloc id=4 size=4KiB
malloc id=5 size=128KiB
malloc id=6 size=4KiB
free id=1
free id=3
free id=5
malloc id=7 size=100KiB
malloc id=8 size=128KiB
malloc id=9 size=200KiB`,
		blocks: []blk{
			{B, 256 * K}, {B + 256*K, 4 * K},
			{B + 260*K, 128 * K}, {B + 388*K, 4 * K},
			{B + 392*K, 128 * K}, {B + 520*K, 4 * K},
			{B + 260*K, 100 * K},
			{B + 392*K, 128 * K},
			{B, 200 * K},
		},
		peakReserved: 2 * M, peakAllocated: 524 * K, reservedEnd: 2 * M, allocs: 1,
		// free: 28K at B+360K, 56K at B+200K, 1524K at B+524K
		freeTotal: (28 + 56 + 1524) * K, freeLargest: 1524 * K,
	}, {
		// The block freed on stream 0 is cached for stream 0 only: the
		// stream 1 malloc gets a segment of its own (at the next 2 MiB
		// boundary), the next stream 0 malloc takes the cached block. A
		// block freed on another stream than its own (free id=3 on stream
		// 0) goes back to its own stream's cache.
		name: "streams do not share blocks",
		trace: `malloc id=1 size=1000 stream=0
free id=1 stream=0
malloc id=2 size=1000 stream=1
malloc id=3 size=1000 stream=0
free id=3 stream=1
free id=2 stream=0
malloc id=4 size=1000 stream=1
malloc id=5 size=1000 stream=0`,
		blocks: []blk{
			{B, 1024},
			{B + 2*M, 1024},
			{B, 1024},
			{B + 2*M, 1024},
			{B, 1024},
		},
		peakReserved: 4 * M, peakAllocated: 2048, reservedEnd: 4 * M, allocs: 2,
		freeTotal: 4*M - 2048, freeLargest: 2*M - 1024,
	}, {
		// Capacity 40 MiB. a (12 MiB segment at B) is freed and cached; b
		// (16 MiB) does not fit in it and gets a segment at B+12M
		// (reserved 28 MiB). c (14 MiB) needs a new segment: 28 + 14 > 40,
		// refused; the cached 12 MiB segment is freed (reserved 16 MiB) and
		// the retry succeeds at B+28M (reserved 30 MiB).
		name:     "a refused segment frees the cache and retries",
		capacity: 40 * M,
		trace: `malloc id=1 size=12MiB
free id=1
malloc id=2 size=16MiB
malloc id=3 size=14MiB`,
		blocks: []blk{
			{B, 12 * M},
			{B + 12*M, 16 * M},
			{B + 28*M, 14 * M},
		},
		peakReserved: 30 * M, peakAllocated: 30 * M, reservedEnd: 30 * M,
		allocs: 3, frees: 1, retries: 1,
	}, {
		// Capacity 40 MiB, filled by two live 20 MiB segments. The 1000 B
		// malloc needs a 2 MiB small segment: refused, nothing cached to
		// free, the retry is refused too: an OOM (one retry). After a is
		// freed, the next small malloc is refused once more, frees a's
		// segment and succeeds on the retry at B+40M (reserved 22 MiB).
		// The malloc_failed attempt of 30 MiB is refused twice (22 + 30 >
		// 40), a retry and an OOM: the only cached free block lies in the
		// small segment, which stays split.
		name:     "an OOM after the retry",
		capacity: 40 * M,
		trace: `malloc id=1 size=20MiB
malloc id=2 size=20MiB
malloc id=3 size=1000
free id=1
malloc id=4 size=1000
malloc_failed size=30MiB`,
		blocks: []blk{
			{B, 20 * M},
			{B + 20*M, 20 * M},
			{},
			{B + 40*M, 1024},
			{},
		},
		ooms:         2,
		peakReserved: 40 * M, peakAllocated: 40 * M, reservedEnd: 22 * M,
		allocs: 3, frees: 1, retries: 3,
		freeTotal: 2*M - 1024, freeLargest: 2*M - 1024,
	}, {
		// A malloc_failed that succeeds in the replay is freed at once.
		name:  "a failed malloc is an attempt",
		trace: "malloc_failed size=1000\nmalloc id=1 size=1000",
		blocks: []blk{
			{B, 1024},
			{B, 1024},
		},
		peakReserved: 2 * M, peakAllocated: 1024, reservedEnd: 2 * M, allocs: 1,
		freeTotal: 2*M - 1024, freeLargest: 2*M - 1024,
	}, {
		// empty_cache frees only whole free segments: the 20 MiB segment
		// of a (free, unsplit), not the small segment that b keeps split.
		// The next 3 MiB malloc needs a new 20 MiB segment.
		name: "empty_cache frees unsplit segments",
		trace: `malloc id=1 size=3MiB
malloc id=2 size=1000
malloc id=3 size=1000
free id=1
free id=2
empty_cache
malloc id=4 size=3MiB`,
		blocks: []blk{
			{B, 3 * M},
			{B + 20*M, 1024},
			{B + 20*M + 1024, 1024},
			{B + 22*M, 3 * M},
		},
		peakReserved: 22 * M, peakAllocated: 3*M + 2048, reservedEnd: 22 * M,
		allocs: 3, frees: 1,
		freeTotal: 2*M - 1024 + 17*M, freeLargest: 17 * M,
	}, {
		// Private pools (pytorch_pools.go). A capture's mallocs (pool=1)
		// get a small and a large segment of their own although the
		// default pools' segments have room: B small default, B+2M small
		// of pool 1, B+4M a 20 MiB segment of pool 1, B+24M the default
		// pools' 20 MiB one.
		name: "a private pool's mallocs get segments of their own",
		trace: `malloc id=1 size=1000
malloc id=2 size=1000 pool=1
malloc id=3 size=3MiB pool=1
malloc id=4 size=3MiB`,
		blocks:       []blk{{B, 1024}, {B + 2*M, 1024}, {B + 4*M, 3 * M}, {B + 24*M, 3 * M}},
		peakReserved: 44 * M, peakAllocated: 2048 + 6*M, reservedEnd: 44 * M, allocs: 4,
		freeTotal: 2*(2*M-1024) + 2*17*M, freeLargest: 17 * M,
	}, {
		// A block freed goes back to its own pool: the default malloc of
		// 4 MiB does not take pool 1's free 20 MiB block (a segment of
		// its own at B+20M), pool 1's next malloc does (at B again).
		name: "no reuse across pools",
		trace: `malloc id=1 size=4MiB pool=1
free id=1
malloc id=2 size=4MiB
malloc id=3 size=4MiB pool=1`,
		blocks:       []blk{{B, 4 * M}, {B + 20*M, 4 * M}, {B, 4 * M}},
		peakReserved: 40 * M, peakAllocated: 8 * M, reservedEnd: 40 * M, allocs: 2,
		freeTotal: 32 * M, freeLargest: 16 * M,
	}, {
		// Two pools keep apart from each other as from the default ones:
		// pool 2's malloc gets its own small segment at B+2M, pool 1's
		// second one follows its first at B+1024.
		name: "two private pools",
		trace: `malloc id=1 size=1000 pool=1
malloc id=2 size=1000 pool=2
malloc id=3 size=1000 pool=1`,
		blocks:       []blk{{B, 1024}, {B + 2*M, 1024}, {B + 1024, 1024}},
		peakReserved: 4 * M, peakAllocated: 3072, reservedEnd: 4 * M, allocs: 2,
		freeTotal: 2*M - 2048 + 2*M - 1024, freeLargest: 2*M - 1024,
	}, {
		// Pool 1's segments, all free, stay through an empty_cache while a
		// graph uses the pool. After pool_release the next empty_cache
		// frees them, the small pool's (B+20M) before the large one's (B);
		// the default 20 MiB segment at B+22M holds a live block, so it
		// stays.
		name: "a private pool is freed only after its release",
		trace: `malloc id=1 size=4MiB pool=1
malloc id=2 size=1000 pool=1
free id=1
free id=2
empty_cache
pool_release pool=1
malloc id=3 size=4MiB
empty_cache`,
		blocks:       []blk{{B, 4 * M}, {B + 20*M, 1024}, {B + 22*M, 4 * M}},
		peakReserved: 42 * M, peakAllocated: 4*M + 1024, reservedEnd: 20 * M, allocs: 3, frees: 2,
		freeTotal: 16 * M, freeLargest: 16 * M,
		freeCalls: "[B+0x1400000:2097152 B+0x0:20971520]",
	}, {
		// A released pool keeps a segment with a live block; once the
		// block is freed the next empty_cache frees the segment.
		name: "a released pool keeps its live blocks",
		trace: `malloc id=1 size=4MiB pool=1
malloc id=2 size=4MiB pool=1
pool_release pool=1
free id=1
empty_cache
free id=2
empty_cache`,
		blocks:       []blk{{B, 4 * M}, {B + 4*M, 4 * M}},
		peakReserved: 20 * M, peakAllocated: 8 * M, reservedEnd: 0, allocs: 1, frees: 1,
		freeCalls: "[B+0x0:20971520]",
	}, {
		// Under a 40 MiB capacity, with pool 1 holding 12 MiB and the
		// default pools a free 20 MiB segment: pool 1's second 12 MiB
		// malloc would pass the capacity, and a capture's malloc frees no
		// cached segment and does not retry, so it fails (an OOM, no
		// retry). A default malloc of 22 MiB in the same state frees the
		// free default segment and retries: 12 + 22 MiB fit.
		name: "a checkpoint restore sets blocks back in place",
		// Pool 1 has a small segment at B and a 32 MiB one at B+2M, all
		// free. A restore (setCheckpointPoolState) takes the smallest
		// whole free segment for its first block (B, not the 32 MiB one),
		// the rest of that segment for the next (2064384 bytes, a large
		// size, in the small segment), then the 32 MiB segment whole.
		trace: `malloc id=1 size=32KiB pool=1
malloc id=2 size=32MiB pool=1
free id=1
free id=2
malloc id=3 size=32768 pool=1 restore=1
malloc id=4 size=2064384 pool=1 restore=1
malloc id=5 size=32MiB pool=1 restore=1
free id=4
free id=5`,
		blocks:       []blk{{B, 32 * K}, {B + 2*M, 32 * M}, {B, 32 * K}, {B + 32*K, 2*M - 32*K}, {B + 2*M, 32 * M}},
		peakReserved: 34 * M, peakAllocated: 34 * M, reservedEnd: 34 * M, allocs: 2,
		freeTotal: 2*M - 32*K + 32*M, freeLargest: 32 * M,
	}, {
		name:     "a private pool's malloc does not retry",
		capacity: 40 * M,
		trace: `malloc id=1 size=4MiB
free id=1
malloc id=2 size=12MiB pool=1
malloc_failed size=12MiB pool=1
malloc id=3 size=22MiB`,
		blocks:       []blk{{B, 4 * M}, {B + 20*M, 12 * M}, {}, {B + 32*M, 22 * M}},
		ooms:         1,
		peakReserved: 34 * M, peakAllocated: 34 * M, reservedEnd: 34 * M, allocs: 3, frees: 1, retries: 1,
		freeCalls: "[B+0x0:20971520]",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := ptDrive(t, tc.capacity, tc.trace)
			if !slices.Equal(r.blocks, tc.blocks) {
				t.Errorf("blocks:\n got %s\nwant %s", ptFmtBlocks(r.blocks), ptFmtBlocks(tc.blocks))
			}
			if r.ooms != tc.ooms {
				t.Errorf("OOMs = %d, want %d", r.ooms, tc.ooms)
			}
			if got := r.dev.PeakReserved(); got != tc.peakReserved {
				t.Errorf("peak reserved = %d, want %d", got, tc.peakReserved)
			}
			if got := r.dev.Reserved(); got != tc.reservedEnd {
				t.Errorf("reserved at the end = %d, want %d", got, tc.reservedEnd)
			}
			if r.peakAllocated != tc.peakAllocated {
				t.Errorf("peak allocated = %d, want %d", r.peakAllocated, tc.peakAllocated)
			}
			if got := r.dev.Allocs(); got != tc.allocs {
				t.Errorf("device allocs = %d, want %d", got, tc.allocs)
			}
			if got := r.dev.Frees(); got != tc.frees {
				t.Errorf("device frees = %d, want %d", got, tc.frees)
			}
			if got := r.p.(policies.Counter).Retries(); got != tc.retries {
				t.Errorf("retries = %d, want %d", got, tc.retries)
			}
			total, largest := r.p.(policies.FreeSpacer).FreeSpace()
			if total != tc.freeTotal || largest != tc.freeLargest {
				t.Errorf("FreeSpace() = %d, %d; want %d, %d", total, largest, tc.freeTotal, tc.freeLargest)
			}
			if got := ptFmtBlocks(r.freeCalls); tc.freeCalls != "" && got != tc.freeCalls {
				t.Errorf("device frees %s, want %s", got, tc.freeCalls)
			}
		})
	}
}

func ptFmtBlocks(bs []policies.Block) string {
	var b strings.Builder
	for i, x := range bs {
		if i > 0 {
			b.WriteString(" ")
		}
		if x.Addr >= ptBase {
			fmt.Fprintf(&b, "B+%#x:%d", x.Addr-ptBase, x.Size)
		} else {
			fmt.Fprintf(&b, "%#x:%d", x.Addr, x.Size)
		}
	}
	return "[" + b.String() + "]"
}

func TestPyTorchErrors(t *testing.T) {
	_, err := policies.New("pytorch", sim.NewDevice(0), policies.Settings{"max_split_size": "128"})
	if err == nil || !strings.Contains(err.Error(), `unknown setting "max_split_size"`) {
		t.Errorf("New with max_split_size: error %v, want it to name the setting", err)
	}
	p, err := policies.New("pytorch", sim.NewDevice(0), policies.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "pytorch" {
		t.Errorf("Name() = %q", p.Name())
	}
	if err := p.Free(ptBase, 0); err == nil || !strings.Contains(err.Error(), "not an allocated block") {
		t.Errorf("free of an unknown address: %v, want not an allocated block", err)
	}
	b, err := p.Malloc(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b.Addr, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b.Addr, 0); err == nil {
		t.Errorf("double free succeeded")
	}
	// A device error other than an OOM is passed on, not retried.
	boom := errors.New("device lost")
	p, _ = policies.New("pytorch", ptFailingDevice{boom}, nil)
	if _, err := p.Malloc(4096, 0); !errors.Is(err, boom) || errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("malloc on a failing device: %v, want it to wrap %v", err, boom)
	}
	if got := p.(policies.Counter).Retries(); got != 0 {
		t.Errorf("retries = %d after a device error, want 0", got)
	}
	// An OOM wraps ErrOutOfMemory.
	p, _ = policies.New("pytorch", sim.NewDevice(ptMiB), nil)
	if _, err := p.Malloc(1000, 0); !errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("malloc on a 1 MiB device: %v, want ErrOutOfMemory", err)
	}
}

type ptFailingDevice struct{ err error }

func (d ptFailingDevice) Alloc(uint64) (uint64, error) { return 0, d.err }
func (d ptFailingDevice) Free(uint64) error            { return d.err }

// TestPyTorchModel replays long random traces (several streams, all size
// classes, a capacity that forces retries and OOMs, empty_cache calls)
// against the policy and against ptModel, a plain restatement of the
// caching allocator's rules with linear searches, and demands the same
// block for every malloc and the same device figures after every event.
func TestPyTorchModel(t *testing.T) {
	tiny := func(rng *rand.Rand) uint64 { return uint64(1+rng.Intn(16))*512 - uint64(rng.Intn(512)) }
	cases := []struct {
		name     string
		capacity uint64
		streams  int
		size     func(*rand.Rand) uint64
		events   int
	}{
		{"all sizes", 0, 3, ptRandSize, 40000},
		{"all sizes under 4 GiB", 4 << 30, 3, ptRandSize, 40000},
		{"all sizes under 400 MiB", 400 * ptMiB, 3, ptRandSize, 20000},
		// Thousands of free blocks in one pool of one stream: deep trees.
		{"tiny sizes", 0, 1, tiny, 60000},
	}
	for _, tc := range cases {
		for seed := int64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprint(tc.name, "/seed", seed), func(t *testing.T) {
				rng := rand.New(rand.NewSource(seed))
				dev, mdev := sim.NewDevice(tc.capacity), sim.NewDevice(tc.capacity)
				p, err := policies.New("pytorch", dev, nil)
				if err != nil {
					t.Fatal(err)
				}
				m := &ptModel{dev: mdev}
				var live []policies.Block
				for i := range tc.events {
					// Waves of mostly mallocs, then mostly frees, so that
					// thousands of blocks are live, then free, at times.
					mallocPct := 75
					if (i/(tc.events/8))%2 == 1 {
						mallocPct = 30
					}
					switch r := rng.Intn(1000); {
					case r < 3:
						if err := p.(policies.Releaser).EmptyCache(); err != nil {
							t.Fatal(err)
						}
						m.emptyCache()
					case r < 10*mallocPct || len(live) == 0:
						size := tc.size(rng)
						stream := uint64(rng.Intn(tc.streams))
						b, err := p.Malloc(size, stream)
						mb, merr := m.malloc(size, stream)
						if (err != nil) != (merr != nil) || b != mb {
							t.Fatalf("event %d: malloc of %d on stream %d: %+v, %v; model %+v, %v", i, size, stream, b, err, mb, merr)
						}
						if err == nil {
							live = append(live, b)
						} else if !errors.Is(err, policies.ErrOutOfMemory) {
							t.Fatal(err)
						}
					default:
						k := rng.Intn(len(live))
						b := live[k]
						live[k] = live[len(live)-1]
						live = live[:len(live)-1]
						// The stream of the free plays no part.
						if err := p.Free(b.Addr, uint64(rng.Intn(tc.streams))); err != nil {
							t.Fatalf("event %d: %v", i, err)
						}
						m.free(b.Addr)
					}
					if dev.Reserved() != mdev.Reserved() || dev.Allocs() != mdev.Allocs() || dev.Frees() != mdev.Frees() {
						t.Fatalf("event %d: device reserved/allocs/frees %d/%d/%d, model %d/%d/%d", i,
							dev.Reserved(), dev.Allocs(), dev.Frees(), mdev.Reserved(), mdev.Allocs(), mdev.Frees())
					}
					total, largest := p.(policies.FreeSpacer).FreeSpace()
					if mt, ml := m.freeSpace(); total != mt || largest != ml {
						t.Fatalf("event %d: FreeSpace %d, %d; model %d, %d", i, total, largest, mt, ml)
					}
				}
				if got := p.(policies.Counter).Retries(); got != m.retries {
					t.Errorf("retries %d, model %d", got, m.retries)
				}
				t.Logf("device allocs %d, frees %d, retries %d, OOMs %d", dev.Allocs(), dev.Frees(), m.retries, m.ooms)
			})
		}
	}
}

// ptRandSize draws request sizes of every class: tiny, small, around the
// 1 MiB boundary, mid-size (20 MiB segments), large, and repeats of a few
// fixed sizes (so that ties between equal free blocks occur).
func ptRandSize(rng *rand.Rand) uint64 {
	switch rng.Intn(6) {
	case 0:
		return uint64(rng.Intn(2048))
	case 1:
		return uint64(rng.Intn(ptMiB)) + 1
	case 2:
		return ptMiB - 1024 + uint64(rng.Intn(2048))
	case 3:
		return uint64(rng.Intn(10*ptMiB)) + ptMiB
	case 4:
		return uint64(rng.Intn(60*ptMiB)) + 10*ptMiB
	default:
		return []uint64{4096, 65536, 3 * ptMiB, 12 * ptMiB}[rng.Intn(4)]
	}
}

// ptModel restates the caching allocator's rules as plainly as possible:
// segments hold address-ordered block lists, searches are linear.
type ptModel struct {
	dev     *sim.Device
	segs    []*ptModelSeg
	retries int64
	ooms    int64
}

type ptModelSeg struct {
	addr   uint64
	stream uint64
	small  bool
	blocks []ptModelBlock // in address order
}

type ptModelBlock struct {
	addr, size uint64
	used       bool
}

func (m *ptModel) malloc(req, stream uint64) (policies.Block, error) {
	if req == 0 {
		return policies.Block{}, nil // a null pointer, nothing allocated
	}
	size := max((req+511)/512*512, 512)
	small := size <= ptMiB
	// Best fit: smallest, then lowest address, same pool and stream.
	var bs *ptModelSeg
	bi := -1
	for _, s := range m.segs {
		if s.small != small || s.stream != stream {
			continue
		}
		for i, b := range s.blocks {
			if b.used || b.size < size {
				continue
			}
			if bi < 0 || b.size < bs.blocks[bi].size || b.size == bs.blocks[bi].size && b.addr < bs.blocks[bi].addr {
				bs, bi = s, i
			}
		}
	}
	if bi < 0 {
		segSize := uint64(2 * ptMiB)
		switch {
		case small:
		case size < 10*ptMiB:
			segSize = 20 * ptMiB
		default:
			segSize = (size + 2*ptMiB - 1) / (2 * ptMiB) * (2 * ptMiB)
		}
		addr, err := m.dev.Alloc(segSize)
		if err != nil {
			m.emptyCache()
			m.retries++
			addr, err = m.dev.Alloc(segSize)
			if err != nil {
				m.ooms++
				return policies.Block{}, err
			}
		}
		bs = &ptModelSeg{addr: addr, stream: stream, small: small, blocks: []ptModelBlock{{addr, segSize, false}}}
		m.segs = append(m.segs, bs)
		bi = 0
	}
	b := &bs.blocks[bi]
	rest := b.size - size
	if small && rest >= 512 || !small && rest > ptMiB {
		bs.blocks = slices.Insert(bs.blocks, bi+1, ptModelBlock{b.addr + size, rest, false})
		b = &bs.blocks[bi]
		b.size = size
	}
	b.used = true
	return policies.Block{Addr: b.addr, Size: b.size}, nil
}

func (m *ptModel) free(addr uint64) {
	if addr == 0 {
		return // the null pointer of a 0-byte malloc
	}
	for _, s := range m.segs {
		for i := range s.blocks {
			if s.blocks[i].addr != addr || !s.blocks[i].used {
				continue
			}
			s.blocks[i].used = false
			if i+1 < len(s.blocks) && !s.blocks[i+1].used {
				s.blocks[i].size += s.blocks[i+1].size
				s.blocks = slices.Delete(s.blocks, i+1, i+2)
			}
			if i > 0 && !s.blocks[i-1].used {
				s.blocks[i-1].size += s.blocks[i].size
				s.blocks = slices.Delete(s.blocks, i, i+1)
			}
			return
		}
	}
	panic("model: free of an unknown block")
}

func (m *ptModel) emptyCache() {
	m.segs = slices.DeleteFunc(m.segs, func(s *ptModelSeg) bool {
		if len(s.blocks) == 1 && !s.blocks[0].used {
			if err := m.dev.Free(s.addr); err != nil {
				panic(err)
			}
			return true
		}
		return false
	})
}

func (m *ptModel) freeSpace() (total, largest uint64) {
	for _, s := range m.segs {
		for _, b := range s.blocks {
			if !b.used {
				total += b.size
				largest = max(largest, b.size)
			}
		}
	}
	return total, largest
}

// The tests below replay the real PyTorch snapshots: the small ones in
// the repository (testdata/pytorch), the large ones from the shared trace
// collection in $ALLOCSIM_TRACES (or ../../shared/traces), skipped when
// absent. sim's TestPyTorchSnapshots compares the replay's figures with
// those the real allocator measured; these go further.

var ptSnapshots = []string{
	"pytorch/train_gpt", "pytorch/infer_dynbatch", "pytorch/infer_dynbatch_expandable", "pytorch/kv_decode",
	"pytorch/hf_generate", "pytorch/multistream", "pytorch/hf_llama_train",
	"pytorch_cases/conv_forward", "pytorch_cases/growing_batch", "pytorch_cases/split_frag_oom", "pytorch_cases/token_lengths",
	"pytorch/churn", "pytorch/churn_maxsplit", "pytorch/churn_roundup", "pytorch/churn_mixed", "pytorch/churn_gc",
	"pytorch/churn_oom", "pytorch/churn_expandable", "pytorch/churn_expandable_capped", "pytorch/mlp", "pytorch/mlp_expandable",
	// tuned_churn_oom: a late free taken back at the start of a malloc
	// that, without it, would retry (see PyTorch.retryReleases).
	"pytorch/tuned/tuned_mlp", "pytorch/tuned/tuned_churn", "pytorch/tuned/tuned_churn_maxsplit", "pytorch/tuned/tuned_churn_oom",
}

// ptSnapshot imports the snapshot name (a path in the trace collection
// without .pickle.gz) and returns its events, its memory cap in bytes and
// the settings it was recorded with.
func ptSnapshot(t testing.TB, name string) ([]trace.Event, uint64, policies.Settings) {
	t.Helper()
	var dirs []string
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		dirs = append(dirs, filepath.Join(d, filepath.Dir(name)))
	}
	dirs = append(dirs, filepath.Join("..", "testdata", filepath.Dir(name)), filepath.Join("..", "testdata", "pytorch"), filepath.Join("..", "..", "shared", "traces", filepath.Dir(name)))
	path := ""
	for _, d := range dirs {
		p := filepath.Join(d, filepath.Base(name))
		if _, err := os.Stat(p + ".pickle.gz"); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skipf("%s.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)", name)
	}
	if fi, err := os.Stat(path + ".pickle.gz"); err == nil && fi.Size() > 1<<20 && testing.Short() {
		t.Skip("a large snapshot (seconds to import) in -short mode")
	}
	raw, err := os.ReadFile(path + ".stats.json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Cap uint64 `json:"mem_cap_bytes"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path + ".pickle.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := pytorch.Import(f, name, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			settings, _, err := policies.Recorded("pytorch", src.Header(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return evs, st.Cap, settings
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// TestPyTorchRecordedAddresses replays each snapshot on a simulated
// device that follows the recording (segments placed at the recorded
// addresses, sim.Device.FollowRecording), with the recorded device calls
// shown to the policy (policies.Follower) and late frees given as such,
// and demands that every malloc of the trace lands at the address it had
// in the source and that the device calls are the recorded ones, in
// order. So the replay is the real allocator's, block for block
// (hf_llama_train included, whose best-fit ties need the real addresses).
func TestPyTorchRecordedAddresses(t *testing.T) {
	for _, name := range ptSnapshots {
		t.Run(filepath.Base(name), func(t *testing.T) {
			evs, capacity, settings := ptSnapshot(t, name)
			dev := sim.NewDevice(capacity)
			dev.FollowRecording()
			var calls []sim.DeviceCall
			dev.OnCall(func(c sim.DeviceCall) { calls = append(calls, c) })
			p, err := policies.New("pytorch", dev, settings)
			if err != nil {
				t.Fatal(err)
			}
			f := p.(policies.Follower)
			var recorded []sim.DeviceCall
			requested := map[uint64]int{} // address -> event of its free_requested
			mallocs := 0
			for i, ev := range evs {
				switch ev.Op {
				case trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
					recorded = append(recorded, sim.DeviceCall{Op: ev.Op, Addr: ev.Addr, Size: ev.Size})
					dev.Observe(ev)
					f.Follow(ev)
				case trace.OpMalloc:
					mallocs++
					b, err := p.Malloc(ev.Size, ev.Stream)
					if err != nil {
						t.Fatalf("event %d: malloc of %d: %v", i, ev.Size, err)
					}
					if b.Addr != ev.Addr {
						t.Fatalf("event %d: malloc of %d on stream %#x at %#x, recorded at %#x", i, ev.Size, ev.Stream, b.Addr, ev.Addr)
					}
				case trace.OpFreeRequested:
					requested[ev.Addr] = i
				case trace.OpFree:
					free := p.Free
					if j, ok := requested[ev.Addr]; ok && j != i-1 {
						free = f.FreeLate
					}
					delete(requested, ev.Addr)
					if err := free(ev.Addr, ev.Stream); err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
				case trace.OpMallocFailed:
					if b, err := p.Malloc(ev.Size, ev.Stream); err == nil {
						t.Errorf("event %d: malloc of %d failed in the source, succeeded in the replay", i, ev.Size)
						p.Free(b.Addr, ev.Stream)
					}
				}
			}
			if err := f.Flush(); err != nil {
				t.Fatal(err)
			}
			if dev.Diverged() {
				t.Errorf("the device stopped following the recording")
			}
			if !slices.Equal(calls, recorded) {
				n := 0
				for n < len(calls) && n < len(recorded) && calls[n] == recorded[n] {
					n++
				}
				var got, want sim.DeviceCall
				if n < len(calls) {
					got = calls[n]
				}
				if n < len(recorded) {
					want = recorded[n]
				}
				t.Errorf("device calls: %d, recorded %d; the first %d agree, then %v, recorded %v", len(calls), len(recorded), n, got, want)
			}
			t.Logf("%d mallocs at their recorded addresses; %d device calls as recorded; peak reserved %d", mallocs, len(calls), dev.PeakReserved())
		})
	}
}

// BenchmarkPyTorchKVDecode measures the policy alone on kv_decode's 482k
// mallocs and frees.
func BenchmarkPyTorchKVDecode(b *testing.B) {
	evs, _, _ := ptSnapshot(b, "pytorch/kv_decode")
	type op struct {
		malloc       bool
		slot         int
		size, stream uint64
	}
	slots := map[uint64]int{} // trace address -> slot of its malloc
	var ops []op
	for _, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			slots[ev.Addr] = len(ops)
			ops = append(ops, op{true, len(ops), ev.Size, ev.Stream})
		case trace.OpFree:
			ops = append(ops, op{false, slots[ev.Addr], 0, ev.Stream})
		}
	}
	blocks := make([]policies.Block, len(ops))
	b.ResetTimer()
	for range b.N {
		p, _ := policies.New("pytorch", sim.NewDevice(0), nil)
		for _, o := range ops {
			if o.malloc {
				blocks[o.slot], _ = p.Malloc(o.size, o.stream)
			} else {
				p.Free(blocks[o.slot].Addr, o.stream)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ops)), "ns/op")
}
