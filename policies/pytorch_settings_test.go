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

// Hand-worked replays of the pytorch policy under each setting that
// changes placement. Addresses are B (ptBase, where the simulated device
// puts its first segment or range) plus an offset; each later segment or
// range follows the previous one at the next 2 MiB boundary.

// ptSetRun is what ptDriveSettings saw.
type ptSetRun struct {
	p       policies.Policy
	dev     *sim.Device
	blocks  []policies.Block // of mallocs in order; zero for an OOM
	calls   []string         // device calls, as "alloc 20M@B+0" etc.
	ooms    int
	retries int64
}

// ptDriveSettings replays a text-form trace against the pytorch policy
// with settings s: malloc (or malloc_failed, an attempt freed at once),
// free by trace address (FreeLate when free_requested came earlier than
// right before), empty_cache, and segment events shown to the policy as a
// Follower.
func ptDriveSettings(t *testing.T, capacity uint64, s policies.Settings, text string) ptSetRun {
	t.Helper()
	_, evs, err := trace.ParseText(t.Name(), strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.NewDevice(capacity)
	r := ptSetRun{dev: dev}
	dev.OnCall(func(c sim.DeviceCall) {
		op := map[trace.Op]string{trace.OpSegmentAlloc: "alloc", trace.OpSegmentFree: "free",
			trace.OpSegmentMap: "map", trace.OpSegmentUnmap: "unmap"}[c.Op]
		r.calls = append(r.calls, fmt.Sprintf("%s %s@%s", op, ptMiBs(c.Size), ptOff(c.Addr)))
	})
	p, err := policies.New("pytorch", dev, s)
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	live := map[uint64]policies.Block{}
	requested := map[uint64]int{}
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc, trace.OpMallocFailed:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("event %d: %v", i, err)
				}
				r.ooms++
			}
			r.blocks = append(r.blocks, b)
			if err == nil && ev.Op == trace.OpMalloc {
				live[ev.Addr] = b
			} else if err == nil {
				p.Free(b.Addr, ev.Stream)
			}
		case trace.OpFreeRequested:
			requested[ev.Addr] = i
		case trace.OpFree:
			free := p.Free
			if j, ok := requested[ev.Addr]; ok && j != i-1 {
				free = p.(policies.Follower).FreeLate
			}
			if err := free(live[ev.Addr].Addr, ev.Stream); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			delete(live, ev.Addr)
		case trace.OpEmptyCache:
			if err := p.(policies.Releaser).EmptyCache(); err != nil {
				t.Fatal(err)
			}
		case trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
			p.(policies.Follower).Follow(ev)
		}
	}
	if err := p.(policies.Follower).Flush(); err != nil {
		t.Fatal(err)
	}
	r.retries = p.(policies.Counter).Retries()
	return r
}

func ptMiBs(n uint64) string {
	if n%ptMiB == 0 {
		return fmt.Sprintf("%dM", n/ptMiB)
	}
	return fmt.Sprint(n)
}

func ptOff(addr uint64) string {
	if addr < ptBase {
		return fmt.Sprintf("%#x", addr)
	}
	if d := addr - ptBase; d%ptMiB == 0 {
		return fmt.Sprintf("B+%dM", d/ptMiB)
	}
	return fmt.Sprintf("B+%#x", addr-ptBase)
}

func ptBlocks(bs []policies.Block) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		if b == (policies.Block{}) {
			out[i] = "OOM"
			continue
		}
		out[i] = fmt.Sprintf("%s@%s", ptMiBs(b.Size), ptOff(b.Addr))
	}
	return out
}

type ptSetCase struct {
	name     string
	capacity uint64
	settings policies.Settings
	trace    string

	blocks  []string // "SIZE@OFFSET" of each malloc in order, "OOM" for a failed one
	calls   []string // device calls in order
	retries int64
}

func runPtSetCases(t *testing.T, cases []ptSetCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := ptDriveSettings(t, tc.capacity, tc.settings, tc.trace)
			if got := ptBlocks(r.blocks); !slices.Equal(got, tc.blocks) {
				t.Errorf("blocks:\n got %q\nwant %q", got, tc.blocks)
			}
			if !slices.Equal(r.calls, tc.calls) {
				t.Errorf("device calls:\n got %q\nwant %q", r.calls, tc.calls)
			}
			if r.retries != tc.retries {
				t.Errorf("retries = %d, want %d", r.retries, tc.retries)
			}
		})
	}
}

func TestPyTorchMaxSplitSize(t *testing.T) {
	const M = ptMiB
	split40 := policies.Settings{"max_split_size_mb": "40"}
	runPtSetCases(t, []ptSetCase{{
		// A 50 MiB block is oversize (>= 40 MiB): the 30 MiB request may
		// not take it and gets a segment of its own. The 45 MiB request
		// may, since 50 < 45 + 20 (max_non_split_rounding), and does not
		// split it (it is oversize). The 25 MiB request takes the free
		// 30 MiB block and splits off 5 MiB (more than 1 MiB left).
		name:     "oversize blocks",
		settings: split40,
		trace: `malloc id=1 size=50MiB
free id=1
malloc id=2 size=30MiB
free id=2
malloc id=3 size=45MiB
malloc id=4 size=25MiB`,
		blocks: []string{"50M@B+0M", "30M@B+50M", "50M@B+0M", "25M@B+50M"},
		calls:  []string{"alloc 50M@B+0M", "alloc 30M@B+50M"},
	}, {
		// Without max_split_size the 30 MiB request splits the cached
		// 50 MiB block.
		name: "no max_split_size",
		trace: `malloc id=1 size=50MiB
free id=1
malloc id=2 size=30MiB`,
		blocks: []string{"50M@B+0M", "30M@B+0M"},
		calls:  []string{"alloc 50M@B+0M"},
	}, {
		// A 41 MiB request may not take a cached 70 MiB block with the
		// default rounding (70 >= 41 + 20) but may with 30 MiB of it.
		name:     "max_non_split_rounding_mb default",
		settings: split40,
		trace:    "malloc id=1 size=70MiB\nfree id=1\nmalloc id=2 size=41MiB",
		blocks:   []string{"70M@B+0M", "42M@B+70M"},
		calls:    []string{"alloc 70M@B+0M", "alloc 42M@B+70M"},
	}, {
		name:     "max_non_split_rounding_mb 30",
		settings: policies.Settings{"max_split_size_mb": "40", "max_non_split_rounding_mb": "30"},
		trace:    "malloc id=1 size=70MiB\nfree id=1\nmalloc id=2 size=41MiB",
		blocks:   []string{"70M@B+0M", "70M@B+0M"},
		calls:    []string{"alloc 70M@B+0M"},
	}, {
		// Capacity 200 MiB, cached oversize 60 and 70 MiB segments. The
		// 100 MiB request would pass the capacity (130 + 100): no single
		// cached block is 100 MiB, so the largest ones are freed until
		// 100 MiB are (70, then 60), and the allocation succeeds without
		// a retry.
		name:     "release of oversize blocks, the largest first",
		capacity: 200 * M,
		settings: split40,
		trace: `malloc id=1 size=60MiB
malloc id=2 size=70MiB
free id=1
free id=2
malloc id=3 size=100MiB`,
		blocks: []string{"60M@B+0M", "70M@B+60M", "100M@B+130M"},
		calls:  []string{"alloc 60M@B+0M", "alloc 70M@B+60M", "free 70M@B+60M", "free 60M@B+0M", "alloc 100M@B+130M"},
	}, {
		// A cached 120 MiB block is large enough for the 90 MiB request
		// (180 + 90 > 200): it alone is freed; the 60 MiB block stays.
		name:     "release of one oversize block",
		capacity: 200 * M,
		settings: split40,
		trace: `malloc id=1 size=60MiB
malloc id=2 size=120MiB
free id=1
free id=2
malloc id=3 size=90MiB`,
		blocks: []string{"60M@B+0M", "120M@B+60M", "90M@B+180M"},
		calls:  []string{"alloc 60M@B+0M", "alloc 120M@B+60M", "free 120M@B+60M", "alloc 90M@B+180M"},
	}, {
		// Without max_split_size the 90 MiB request splits the cached
		// 120 MiB block; a 130 MiB one fits in no cached block and
		// passes the capacity (180 + 130): it retries, freeing every
		// cached segment.
		name:     "without it, a split or a retry",
		capacity: 200 * M,
		trace: `malloc id=1 size=60MiB
malloc id=2 size=120MiB
free id=1
free id=2
malloc id=3 size=90MiB
free id=3
malloc id=4 size=130MiB`,
		blocks:  []string{"60M@B+0M", "120M@B+60M", "90M@B+60M", "130M@B+180M"},
		calls:   []string{"alloc 60M@B+0M", "alloc 120M@B+60M", "free 60M@B+0M", "free 120M@B+60M", "alloc 130M@B+180M"},
		retries: 1,
	}})
}

func TestPyTorchRoundupPower2Divisions(t *testing.T) {
	runPtSetCases(t, []ptSetCase{{
		// 4 divisions: 1200 B is at most 512 * 4, plain 512-byte
		// rounding (1536 B); 5000 B rounds to the next quarter of
		// [4096, 8192), 5120 B; 4096 B stays; 1200 KiB rounds to 1280 KiB
		// (a large request: its own 20 MiB segment).
		name:     "single value",
		settings: policies.Settings{"roundup_power2_divisions": "4"},
		trace: `malloc id=1 size=1200
malloc id=2 size=5000
malloc id=3 size=4096
malloc id=4 size=1200KiB`,
		blocks: []string{"1536@B+0M", "5120@B+0x600", "4096@B+0x1a00", "1310720@B+2M"},
		calls:  []string{"alloc 2M@B+0M", "alloc 20M@B+2M"},
	}, {
		// [64:8,256:4,>:1]: up to 128 MiB 8 divisions, [128 MiB, 256 MiB)
		// none (left at 0), [256 MiB, 512 MiB) 4, above 1. 1100 KiB in
		// eighths of [1, 2) MiB: 1152 KiB. 130 MiB + 1 B: 512-byte
		// rounding. 300 MiB: quarters of [256, 512) MiB, 320 MiB. 600 MiB
		// + 1 B: 512-byte rounding. Segments above 10 MiB are rounded up
		// to 2 MiB.
		name:     "bracket list",
		settings: policies.Settings{"roundup_power2_divisions": "[64:8,256:4,>:1]"},
		trace: `malloc id=1 size=1100KiB
malloc id=2 size=136314881
malloc id=3 size=300MiB
malloc id=4 size=629145601`,
		blocks: []string{"1179648@B+0M", "136315392@B+20M", "320M@B+152M", "629146112@B+472M"},
		calls:  []string{"alloc 20M@B+0M", "alloc 132M@B+20M", "alloc 320M@B+152M", "alloc 602M@B+472M"},
	}})
}

func TestPyTorchGarbageCollection(t *testing.T) {
	const M = ptMiB
	// Capacity 100 MiB, threshold 0.5: garbage collection starts when a
	// malloc finds no cached block with more than 50 MiB reserved. Each
	// search of the large pool ticks its clock; a block's age is the
	// ticks since it was cached. Mallocs 1, 2 (ticks 1, 2) take
	// segments; 1 and 2 are cached at tick 2; malloc 3 (tick 3) takes a
	// 30 MiB segment (44 MiB reserved: no collection), cached at tick 3.
	// Malloc 4 (tick 4, 74 MiB reserved) collects: ages 2, 2, 1, average
	// 5/3: the 20 and 24 MiB segments are freed (44 MiB, more than the
	// 24 MiB over the threshold), the younger 30 MiB one stays, and the
	// 40 MiB segment fits without a retry.
	const tr = `malloc id=1 size=20MiB
malloc id=2 size=24MiB
free id=1
free id=2
malloc id=3 size=30MiB
free id=3
malloc id=4 size=40MiB`
	runPtSetCases(t, []ptSetCase{{
		name:     "oldest segments first",
		capacity: 100 * M,
		settings: policies.Settings{"garbage_collection_threshold": "0.5"},
		trace:    tr,
		blocks:   []string{"20M@B+0M", "24M@B+20M", "30M@B+44M", "40M@B+74M"},
		calls:    []string{"alloc 20M@B+0M", "alloc 24M@B+20M", "alloc 30M@B+44M", "free 20M@B+0M", "free 24M@B+20M", "alloc 40M@B+74M"},
	}, {
		// Without it the 40 MiB segment passes the capacity: a retry
		// frees all three.
		name:     "without it, a retry",
		capacity: 100 * M,
		trace:    tr,
		blocks:   []string{"20M@B+0M", "24M@B+20M", "30M@B+44M", "40M@B+74M"},
		calls: []string{"alloc 20M@B+0M", "alloc 24M@B+20M", "alloc 30M@B+44M",
			"free 20M@B+0M", "free 24M@B+20M", "free 30M@B+44M", "alloc 40M@B+74M"},
		retries: 1,
	}, {
		// Without a capacity (no memory fraction) it does nothing.
		name:     "inactive without a capacity",
		settings: policies.Settings{"garbage_collection_threshold": "0.5"},
		trace:    tr,
		blocks:   []string{"20M@B+0M", "24M@B+20M", "30M@B+44M", "40M@B+74M"},
		calls:    []string{"alloc 20M@B+0M", "alloc 24M@B+20M", "alloc 30M@B+44M", "alloc 40M@B+74M"},
	}})
}

func TestPyTorchExpandableSegments(t *testing.T) {
	const M = ptMiB
	// The large pool's range is 160880 MiB (20 MiB pages for 9/8 of
	// 143000 MiB), the small pool's 160876 MiB (2 MiB pages); the first
	// range is at B.
	const smallRange = "B+160880M"
	exp := policies.Settings{"expandable_segments": "True"}
	runPtSetCases(t, []ptSetCase{{
		// 30 MiB maps two 20 MiB pages (one device call) and splits off
		// the 10 MiB rest. 25 MiB: no cached block is large enough; the
		// free 10 MiB before the unmapped space plus one more page (a
		// second call) make 30 MiB, split into 25 and 5 MiB. Freed, 1
		// leaves 30 MiB at B, which 28 MiB takes (best fit, 2 MiB split
		// off). All freed, the three pages make one free block, which
		// empty_cache unmaps in one call (and the range, wholly unmapped,
		// is given back). A small request then maps one 2 MiB page of
		// the small pool's range.
		name:     "pages mapped on demand",
		settings: exp,
		trace: `malloc id=1 size=30MiB
malloc id=2 size=25MiB
free id=1
malloc id=3 size=28MiB
free id=2
free id=3
empty_cache
malloc id=4 size=1000`,
		blocks: []string{"30M@B+0M", "25M@B+30M", "28M@B+0M", "1024@" + smallRange},
		calls:  []string{"map 40M@B+0M", "map 20M@B+40M", "unmap 60M@B+0M", "map 2M@" + smallRange},
	}, {
		// Capacity 60 MiB. 50 MiB maps three pages (60 MiB: PyTorch checks
		// the capacity against the 50 MiB segment it would allocate).
		// Freed, it is cached. 12 MiB on stream 1 (a range of its own)
		// would pass the capacity (60 + 12): the retry unmaps the cached
		// pages, and maps one page for stream 1.
		name:     "unmapped on a retry",
		capacity: 60 * M,
		settings: exp,
		trace: `malloc id=1 size=50MiB
free id=1
malloc id=2 size=12MiB stream=1`,
		blocks:  []string{"50M@B+0M", "12M@" + smallRange},
		calls:   []string{"map 60M@B+0M", "unmap 60M@B+0M", "map 20M@" + smallRange},
		retries: 1,
	}})
	_, err := policies.New("pytorch", ptFailingDevice{errors.New("no")}, exp)
	if err == nil || !strings.Contains(err.Error(), "expandable_segments") {
		t.Errorf("expandable segments on a device that cannot map: %v, want an error naming the setting", err)
	}
}

// TestPyTorchLateFrees: a block used on another stream is freed late
// (free_completed after other events than its free_requested). It becomes
// reusable at the next malloc, unless that malloc retries: then at the
// synchronization before the retry, after its search failed.
func TestPyTorchLateFrees(t *testing.T) {
	const M = ptMiB
	runPtSetCases(t, []ptSetCase{{
		// No capacity: the late free of the 24 MiB block on stream 1 is
		// taken back at the next malloc, which reuses it (20 MiB, split:
		// 4 MiB left).
		name: "taken back at the next malloc",
		trace: `malloc id=1 size=24MiB stream=1
free_requested id=1 stream=1
malloc id=2 size=3MiB
free id=1 stream=1
malloc id=3 size=20MiB stream=1`,
		blocks: []string{"24M@B+0M", "3M@B+24M", "20M@B+0M"},
		calls:  []string{"alloc 24M@B+0M", "alloc 20M@B+24M"},
	}, {
		// Capacity 48 MiB: without the late block no cached block fits 20
		// MiB on stream 1, and a new segment passes the capacity (44 +
		// 20): the malloc retries, and its synchronization takes the
		// late block back, so that it is freed with the cached segment of
		// stream 0 (20 MiB, large pool first, stream order); the new
		// segment follows.
		// The recording shows the retry's two segment frees before the
		// malloc.
		name:     "taken back at the retry's synchronization",
		capacity: 48 * M,
		trace: `malloc id=1 size=24MiB stream=1
malloc id=2 size=3MiB
free_requested id=1 stream=1
free_requested id=2
free id=2
free id=1 stream=1
segment_free addr=1 size=20MiB
segment_free addr=2 size=24MiB stream=1
malloc id=3 size=20MiB stream=1`,
		blocks:  []string{"24M@B+0M", "3M@B+24M", "20M@B+44M"},
		calls:   []string{"alloc 24M@B+0M", "alloc 20M@B+24M", "free 20M@B+24M", "free 24M@B+0M", "alloc 20M@B+44M"},
		retries: 1,
	}, {
		// The same malloc with no release recorded before it: a retry
		// would have freed the cached 20 MiB segment (and the late block's
		// 24 MiB once taken back), so the real malloc did not retry: it
		// took the late block back at its start and found it (the 24 MiB
		// block at B, split: 20 MiB of it).
		name:     "taken back at the start when no release is recorded",
		capacity: 48 * M,
		trace: `malloc id=1 size=24MiB stream=1
malloc id=2 size=3MiB
free_requested id=1 stream=1
free_requested id=2
free id=2
free id=1 stream=1
malloc id=3 size=20MiB stream=1`,
		blocks: []string{"24M@B+0M", "3M@B+24M", "20M@B+0M"},
		calls:  []string{"alloc 24M@B+0M", "alloc 20M@B+24M"},
	}})
}

// TestPyTorchExplicitEmptyCache: segment frees that the recording shows
// and that the policy's own malloc does not make were an explicit
// empty_cache, made before the next call.
func TestPyTorchExplicitEmptyCache(t *testing.T) {
	runPtSetCases(t, []ptSetCase{{
		// The cached 20 MiB segment is freed in the recording before a
		// small malloc, which needs no retry (no capacity): empty_cache.
		name: "before a malloc",
		trace: `malloc id=1 size=3MiB
free id=1
segment_free addr=1 size=20MiB
malloc id=2 size=1000`,
		blocks: []string{"3M@B+0M", "1024@B+20M"},
		calls:  []string{"alloc 20M@B+0M", "free 20M@B+0M", "alloc 2M@B+20M"},
	}, {
		// The same before a free, and at the end of the trace.
		name: "before a free and at the end",
		trace: `malloc id=1 size=3MiB
malloc id=2 size=1000
free id=1
segment_free addr=1 size=20MiB
free id=2
segment_free addr=2 size=2MiB`,
		blocks: []string{"3M@B+0M", "1024@B+20M"},
		calls:  []string{"alloc 20M@B+0M", "alloc 2M@B+20M", "free 20M@B+0M", "free 2M@B+20M"},
	}, {
		// Under a capacity, the malloc's own retry frees the segment
		// (cached for stream 1, of no use to stream 0): no empty_cache
		// before it.
		name:     "a retry's own",
		capacity: 30 * ptMiB,
		trace: `malloc id=1 size=3MiB stream=1
free id=1 stream=1
segment_free addr=1 size=20MiB
malloc id=2 size=12MiB`,
		blocks:  []string{"3M@B+0M", "12M@B+20M"},
		calls:   []string{"alloc 20M@B+0M", "free 20M@B+0M", "alloc 12M@B+20M"},
		retries: 1,
	}})
}

// TestPyTorchSettingsErrors: a bad setting is an error naming it.
func TestPyTorchSettingsErrors(t *testing.T) {
	cases := []struct {
		s    policies.Settings
		want string
	}{
		{policies.Settings{"max_split_size_mb": "10"}, `setting max_split_size_mb="10": max_split_size_mb: 10 is too small`},
		{policies.Settings{"max_split_size_mb": "64,expandable_segments:True"}, `setting max_split_size_mb="64,expandable_segments:True": max_split_size_mb: "64,expandable_segments:True" is more than one value`},
		{policies.Settings{"expandable_segments": "yes"}, `setting expandable_segments="yes": expandable_segments: want True or False`},
		{policies.Settings{"conf": "max_split_size_mb:64,foo:1"}, `setting conf="max_split_size_mb:64,foo:1": unknown key "foo"`},
		{policies.Settings{"roundup": "4"}, `unknown setting "roundup"`},
	}
	for _, tc := range cases {
		_, err := policies.New("pytorch", sim.NewDevice(0), tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.s, err, tc.want)
		}
	}
}

// TestPyTorchRecordedSettings: a PyTorch snapshot's recorded settings, as
// trace/pytorch puts them in the header, become the policy's settings;
// the user's single keys go over them, and a user's conf replaces them.
func TestPyTorchRecordedSettings(t *testing.T) {
	h := trace.Header{Source: "pytorch", Settings: map[string]string{
		"PYTORCH_CUDA_ALLOC_CONF":      "max_split_size_mb:128,max_non_split_rounding_mb:40,expandable_segments:False",
		"max_split_size":               "134217728",
		"roundup_power2_divisions":     "1:0,2:0,4:0,8:0,16:0,32:0,64:8,128:0,256:0,512:0,1024:0,2048:0,4096:0,8192:0,16384:0,32768:0",
		"garbage_collection_threshold": "0.6",
		"expandable_segments":          "false",
		"release_lock_on_cudamalloc":   "false",
	}}
	cases := []struct {
		user policies.Settings
		want policies.Settings
	}{
		{nil, policies.Settings{"max_split_size_mb": "128", "max_non_split_rounding_mb": "40", "garbage_collection_threshold": "0.6",
			"roundup_power2_divisions": "[1:0,2:0,4:0,8:0,16:0,32:0,64:8,128:0,256:0,512:0,1024:0,2048:0,4096:0,8192:0,16384:0,32768:0]"}},
		{policies.Settings{"max_split_size_mb": "64", "expandable_segments": "True"},
			policies.Settings{"max_split_size_mb": "64", "max_non_split_rounding_mb": "40", "garbage_collection_threshold": "0.6", "expandable_segments": "True",
				"roundup_power2_divisions": "[1:0,2:0,4:0,8:0,16:0,32:0,64:8,128:0,256:0,512:0,1024:0,2048:0,4096:0,8192:0,16384:0,32768:0]"}},
		{policies.Settings{"conf": "expandable_segments:True"}, policies.Settings{"conf": "expandable_segments:True"}},
	}
	for _, tc := range cases {
		got, ok, err := policies.Recorded("pytorch", h, tc.user)
		if err != nil || !ok || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("user %v: %v, %v, %v; want %v", tc.user, got, ok, err, tc.want)
		}
		if _, err := policies.New("pytorch", sim.NewDevice(0), got); err != nil {
			t.Errorf("user %v: %v", tc.user, err)
		}
	}
	// A default snapshot gives no settings; another source is not
	// recorded under PyTorch.
	if got, ok, err := policies.Recorded("pytorch", trace.Header{Source: "pytorch", Settings: map[string]string{
		"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": "-1", "expandable_segments": "false", "garbage_collection_threshold": "0",
		"roundup_power2_divisions": "1:0,2:0,4:0,8:0,16:0,32:0,64:0,128:0,256:0,512:0,1024:0,2048:0,4096:0,8192:0,16384:0,32768:0"}}, nil); !ok || err != nil || len(got) != 0 {
		t.Errorf("a default snapshot: %v, %v, %v; want no settings", got, ok, err)
	}
	if _, ok, _ := policies.Recorded("pytorch", trace.Header{Source: "rmm"}, nil); ok {
		t.Errorf("an RMM log is recorded under PyTorch")
	}
	if _, _, err := policies.Recorded("pytorch", trace.Header{Source: "pytorch", Settings: map[string]string{"max_split_size": "12x"}}, nil); err == nil ||
		!strings.Contains(err.Error(), "max_split_size") {
		t.Errorf("a bad recorded setting: %v, want an error naming it", err)
	}
}

// TestPyTorchExpandableHuge: a request larger than an expandable segment's
// address space (1 TiB, as a snapshot's failed malloc records it) is an
// OOM; it panicked walking past the segment's end.
func TestPyTorchExpandableHuge(t *testing.T) {
	p, err := policies.New("pytorch", sim.NewDevice(0), policies.Settings{"expandable_segments": "True"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Malloc(1<<40, 0); !errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("malloc of 1 TiB: %v, want an OOM", err)
	}
	if b, err := p.Malloc(1<<20, 0); err != nil || b.Size != 1<<20 {
		t.Errorf("then a malloc of 1 MiB: %+v, %v", b, err)
	}
}
