package policies

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// stDevice is a device for the hand-worked tests of stalloc: its n-th
// segment (from 1) is at n<<40, so that an address reads as a segment and
// an offset at a glance; its reserved bytes are counted exactly, under an
// optional capacity.
type stDevice struct {
	n, reserved, peak, capacity uint64
	segs                        map[uint64]uint64
}

func (d *stDevice) Alloc(size uint64) (uint64, error) {
	if d.capacity > 0 && d.reserved+size > d.capacity {
		return 0, fmt.Errorf("device alloc of %d bytes with %d of %d reserved: %w", size, d.reserved, d.capacity, ErrOutOfMemory)
	}
	if d.segs == nil {
		d.segs = map[uint64]uint64{}
	}
	d.n++
	addr := d.n << 40
	d.segs[addr] = size
	d.reserved += size
	d.peak = max(d.peak, d.reserved)
	return addr, nil
}

func (d *stDevice) Free(addr uint64) error {
	size, ok := d.segs[addr]
	if !ok {
		return fmt.Errorf("free of %#x: no segment", addr)
	}
	delete(d.segs, addr)
	d.reserved -= size
	return nil
}

func (d *stDevice) Capacity() uint64 { return d.capacity }
func (d *stDevice) Reserved() uint64 { return d.reserved }

// stRun is what a replay of a text-form trace through stalloc gave.
type stRun struct {
	p     *STAlloc
	dev   *stDevice
	addrs map[uint64]uint64 // malloc id -> address
	ooms  []int             // events of the mallocs that failed
}

// stReplay plans the text-form trace text with stalloc under settings s on
// an stDevice of capacity bytes (0: none) and replays its mallocs, frees
// and empty_caches, as the engine does.
func stReplay(t *testing.T, s Settings, capacity uint64, text string) stRun {
	t.Helper()
	_, evs, err := trace.ParseText("test", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	dev := &stDevice{capacity: capacity}
	p, err := NewSTAlloc(dev, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Plan(evs); err != nil {
		t.Fatal(err)
	}
	run := stRun{p: p, dev: dev, addrs: map[uint64]uint64{}}
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if errors.Is(err, ErrOutOfMemory) {
				run.ooms = append(run.ooms, i)
				continue
			}
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			run.addrs[ev.Addr] = b.Addr
		case trace.OpFree:
			if err := p.Free(run.addrs[ev.Addr], ev.Stream); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		case trace.OpEmptyCache:
			if err := p.EmptyCache(); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	}
	return run
}

// expect checks the address of each malloc id in want.
func (r stRun) expect(t *testing.T, want map[uint64]uint64) {
	t.Helper()
	for _, id := range slices.Sorted(func(yield func(uint64) bool) {
		for id := range want {
			if !yield(id) {
				return
			}
		}
	}) {
		if got := r.addrs[id]; got != want[id] {
			t.Errorf("malloc id=%d at %#x, want %#x", id, got, want[id])
		}
	}
}

// warned returns the warning holding all of parts, failing t if none does.
func (r stRun) warned(t *testing.T, parts ...string) string {
	t.Helper()
	for _, w := range r.p.Warnings() {
		ok := true
		for _, s := range parts {
			ok = ok && strings.Contains(w, s)
		}
		if ok {
			return w
		}
	}
	t.Errorf("no warning with %q among %q", parts, r.p.Warnings())
	return ""
}

const (
	seg1 = 1 << 40 // the first segment of an stDevice: here the region
	seg2 = 2 << 40 // the second: the online manager's first
	mib  = 1 << 20
)

// stTrainText is a training trace of four iterations, each a malloc of
// 2048 bytes and one of 1024 freed before it, after a weight of 1024
// bytes that lives on; last is the size of iteration 3's first malloc.
func stTrainText(last int) string {
	return fmt.Sprintf(`malloc id=1 size=1024
marker label="iteration 0"
malloc id=2 size=2048
malloc id=3 size=1024
free id=3
free id=2
marker label="iteration 1"
malloc id=4 size=2048
malloc id=5 size=1024
free id=5
free id=4
marker label="iteration 2"
malloc id=6 size=2048
malloc id=7 size=1024
free id=7
free id=6
marker label="iteration 3"
malloc id=8 size=%d
malloc id=9 size=1024
free id=9
free id=8
`, last)
}

// TestSTAllocPlanFromMarkers: the iterations start at the markers (events
// 1, 6, 11, 16); iterations 0 to 2 are profiled. Planned (times are event
// indices): id1 1024 B from 0 to the end (persistent: live at the end of
// the profile), id2 2048 B [2,5), id3 1024 B [3,4), and iteration 1's
// positions 0 (2048 B [7,10)) and 1 (1024 B [8,9)), static as iteration 2
// makes the same sizes freed at the same positions. Offline's greedy by
// size places: id2 at 0; position 0 at 0 (id2 is freed by then); id1,
// live with both, at 2048; id3 above id2 and id1 at 3072; position 1 above
// position 0 and id1 at 3072. The height, 4096, is the lower bound (id1 +
// id2 + id3), so the other orders are not tried. The region is 4096 bytes
// at the first segment; iterations 2 and 3 take positions 0 and 1 at 0
// and 3072, and nothing goes online.
func TestSTAllocPlanFromMarkers(t *testing.T) {
	r := stReplay(t, nil, 0, stTrainText(2048))
	r.expect(t, map[uint64]uint64{
		1: seg1 + 2048, 2: seg1, 3: seg1 + 3072,
		4: seg1, 5: seg1 + 3072,
		6: seg1, 7: seg1 + 3072,
		8: seg1, 9: seg1 + 3072,
	})
	if r.dev.peak != 4096 {
		t.Errorf("peak reserved %d, want 4096 (the region only)", r.dev.peak)
	}
	st := r.p.Stats()
	want := STAllocStats{Found: "markers", Starts: []int{1, 6, 11, 16}, Profiled: 3, Persistent: 1, Once: 2, Static: 2, Height: 4096, Planned: 9}
	if fmt.Sprint(st) != fmt.Sprint(want) {
		t.Errorf("stats\n%+v, want\n%+v", st, want)
	}
	if ws := r.p.Warnings(); len(ws) != 0 {
		t.Errorf("warnings %q, want none", ws)
	}
}

// TestSTAllocMismatchedSize: as TestSTAllocPlanFromMarkers, but iteration
// 3's first malloc (event 17, malloc #7) asks 4096 bytes where position 0
// was planned for 2048: it goes to the online manager (PyTorch: a small
// request, a 2 MiB segment, the second of the device), is counted and
// warned of; position 1 still fits the plan (3072, free). Peak reserved:
// the region's 4096 + 2 MiB.
func TestSTAllocMismatchedSize(t *testing.T) {
	r := stReplay(t, nil, 0, stTrainText(4096))
	r.expect(t, map[uint64]uint64{1: seg1 + 2048, 6: seg1, 7: seg1 + 3072, 8: seg2, 9: seg1 + 3072})
	if r.dev.peak != 4096+2*mib {
		t.Errorf("peak reserved %d, want %d", r.dev.peak, 4096+2*mib)
	}
	st := r.p.Stats()
	if st.Deviations != 1 || st.Mismatched != 1 || st.Online != 1 || st.Planned != 8 {
		t.Errorf("deviations %d (mismatched %d), online %d, planned %d; want 1 (1), 1, 8", st.Deviations, st.Mismatched, st.Online, st.Planned)
	}
	r.warned(t, "1 mallocs of iterations 2 on parted from the profile", "1 of another size", "first: event 17 (malloc #7 of 4096 bytes, position 0 of iteration 3): position 0 was planned for 2048 bytes")
}

// TestSTAllocBeyondPattern: iteration 3 makes a third malloc (event 19,
// malloc #9, 1024 bytes) where the profiled iteration 1 made two: past
// the pattern, to the online manager (a 2 MiB segment), counted and warned
// of.
func TestSTAllocBeyondPattern(t *testing.T) {
	text := strings.Replace(stTrainText(2048), "free id=9\n", "malloc id=10 size=1024\nfree id=10\nfree id=9\n", 1)
	r := stReplay(t, nil, 0, text)
	r.expect(t, map[uint64]uint64{8: seg1, 9: seg1 + 3072, 10: seg2})
	st := r.p.Stats()
	if st.Deviations != 1 || st.Beyond != 1 {
		t.Errorf("deviations %d (beyond %d), want 1 (1)", st.Deviations, st.Beyond)
	}
	r.warned(t, "1 past the profiled iteration's 2 mallocs", "first: event 19 (malloc #9 of 1024 bytes, position 2 of iteration 3): past the 2 positions")
}

// TestSTAllocOffsetTaken: each iteration frees a 2048-byte malloc before
// the next of the same size, so the plan gives both the same offset:
// planned are id1 1024 B for good, id2 [2,3), id3 [4,5), and positions 0
// [7,8) and 1 [9,10), all 2048 B; greedy by size puts the four of 2048 B at
// 0 (none live at once) and id1 at 2048: a region of 3072 bytes, the lower
// bound. Iteration 3 frees its first malloc after its second (a lifetime
// longer than profiled): the second's offset 0 is still held, so it goes
// to the online manager (a 2 MiB segment), counted and warned of (event
// 18, malloc #8).
func TestSTAllocOffsetTaken(t *testing.T) {
	r := stReplay(t, nil, 0, `malloc id=1 size=1024
marker label="iteration 0"
malloc id=2 size=2048
free id=2
malloc id=3 size=2048
free id=3
marker label="iteration 1"
malloc id=4 size=2048
free id=4
malloc id=5 size=2048
free id=5
marker label="iteration 2"
malloc id=6 size=2048
free id=6
malloc id=7 size=2048
free id=7
marker label="iteration 3"
malloc id=8 size=2048
malloc id=9 size=2048
free id=8
free id=9
`)
	r.expect(t, map[uint64]uint64{1: seg1 + 2048, 2: seg1, 3: seg1, 4: seg1, 5: seg1, 6: seg1, 7: seg1, 8: seg1, 9: seg2})
	st := r.p.Stats()
	if st.Height != 3072 || st.Deviations != 1 || st.Taken != 1 {
		t.Errorf("height %d, deviations %d (taken %d); want 3072, 1 (1)", st.Height, st.Deviations, st.Taken)
	}
	if r.dev.peak != 3072+2*mib {
		t.Errorf("peak reserved %d, want %d", r.dev.peak, 3072+2*mib)
	}
	r.warned(t, "1 at an offset still held", "first: event 18 (malloc #8 of 2048 bytes, position 1 of iteration 3): its offset 0 is held")
}

// stClassesText: four iterations of S (4096 B, freed in its iteration), D
// (of a size that grows each iteration), L (2048 B, freed before X's malloc
// in iteration 1 but after it in iteration 2) and X (8192 B, freed at the
// start of the next iteration, before its first malloc).
const stClassesText = `marker label="iteration 0"
malloc id=1 size=4096
malloc id=2 size=1024
free id=2
malloc id=3 size=2048
free id=3
free id=1
malloc id=4 size=8192
marker label="iteration 1"
free id=4
malloc id=11 size=4096
malloc id=12 size=2048
free id=12
malloc id=13 size=2048
free id=13
free id=11
malloc id=14 size=8192
marker label="iteration 2"
free id=14
malloc id=21 size=4096
malloc id=22 size=3072
free id=22
malloc id=23 size=2048
free id=21
malloc id=24 size=8192
free id=23
marker label="iteration 3"
free id=24
malloc id=31 size=4096
malloc id=32 size=4096
free id=32
malloc id=33 size=2048
free id=33
free id=31
malloc id=34 size=8192
free id=34
`

// TestSTAllocClasses: with the iterations at events 0, 8, 17 and 26,
// iteration 1's positions are: 0 (S) static, freed before position 3 in
// iterations 1 and 2; 1 (D) dynamic, 2048 B then 3072 B; 2 (L) dynamic,
// freed before position 3 in iteration 1 but after it in iteration 2; 3 (X)
// cross-iteration, freed before position 0 of the next iteration in both
// (iteration 2's free falls after the profile: compatible). Planned, in
// doubled event times: ids 1 [2,12) 4096 B, 2 [4,6) 1024 B, 3 [8,10)
// 2048 B, 4 [14,18) 8192 B, position 0 [20,30) 4096 B and position 3
// [32,36) 8192 B (freed before the next iteration's first malloc, it need
// not be clear of those). Greedy by size: id4 at 0, position 3 at 0, id1 at
// 0, position 0 at 0 (none live at once), id3 and id2 above id1 at 4096:
// height 8192, the lower bound. D and L go to the online manager in
// iterations 1 to 3, in a 2 MiB segment of its small pool where each
// takes the segment's start, the one before it freed.
func TestSTAllocClasses(t *testing.T) {
	r := stReplay(t, nil, 0, stClassesText)
	r.expect(t, map[uint64]uint64{
		1: seg1, 2: seg1 + 4096, 3: seg1 + 4096, 4: seg1,
		11: seg1, 12: seg2, 13: seg2, 14: seg1,
		21: seg1, 22: seg2, 23: seg2, 24: seg1,
		31: seg1, 32: seg2, 33: seg2, 34: seg1,
	})
	st := r.p.Stats()
	if st.Once != 4 || st.Static != 1 || st.Cross != 1 || st.Dynamic != 2 || st.Height != 8192 || st.Deviations != 0 || st.Online != 6 || st.Planned != 10 {
		t.Errorf("stats %+v: want Once 4, Static 1, Cross 1, Dynamic 2, Height 8192, Deviations 0, Online 6, Planned 10", st)
	}
	if r.dev.peak != 8192+2*mib {
		t.Errorf("peak reserved %d, want %d", r.dev.peak, 8192+2*mib)
	}
}

// TestSTAllocProfileTwo: with profile=2, iteration 1 alone is the
// pattern: S, D and L are static (nothing to compare them with), but X's
// free falls after the profile, which ends with iteration 1: the profile
// cannot tell when it is freed, so it is dynamic. Planned: ids 1 to 4 as
// before, positions 0 [20,30) 4096 B, 1 [22,24) 2048 B, 2 [26,28) 2048 B.
// Greedy by size: id4 at 0, id1 at 0, position 0 at 0, then id3 and
// positions 1 and 2 (2048 B, start order) above id1 or position 0 at 4096,
// id2 at 4096: height 8192. Iterations 2 and 3 part from it: D of 3072
// and 4096 bytes (mismatched) goes online, L of iteration 2 goes in at
// 4096 all the same (its longer lifetime meets nothing planned); X goes
// online in every iteration, at the start of the online manager's 2 MiB
// segment of small requests, the one before it freed.
func TestSTAllocProfileTwo(t *testing.T) {
	r := stReplay(t, Settings{"profile": "2"}, 0, stClassesText)
	st := r.p.Stats()
	if st.Profiled != 2 || st.Static != 3 || st.Cross != 0 || st.Dynamic != 1 || st.Height != 8192 || st.Mismatched != 2 || st.Deviations != 2 {
		t.Errorf("stats %+v: want Profiled 2, Static 3, Dynamic 1, Height 8192, 2 deviations (mismatched)", st)
	}
	r.expect(t, map[uint64]uint64{
		11: seg1, 12: seg1 + 4096, 13: seg1 + 4096, 14: seg2,
		21: seg1, 22: seg2, 23: seg1 + 4096, 24: seg2,
		31: seg1, 32: seg2, 33: seg1 + 4096, 34: seg2,
	})
}

// TestSTAllocPeriodicity: no markers. Sizes (rounded up to 512 B in the
// region): 1000 once, then 3000 and 2000 alternately, each of them at
// calls 1, 3, 5, 7 or 2, 4, 6, 8: regular gaps of 2 spanning the trace.
// Before each 3000-byte malloc 1000 bytes are live, before each 2000-byte
// one 4000: the 3000-byte mallocs start the iterations (events 1, 5, 9,
// 13). Planned: id1 1024 B for good, id2 [1,4) 3072 B, id3 [2,3) 2048 B,
// positions 0 [5,8) 3072 B and 1 [6,7) 2048 B (doubled times aside).
// Greedy by size: id2 at 0, position 0 at 0, id3 and position 1 at 3072,
// id1 at 5120: height 6144, the lower bound.
func TestSTAllocPeriodicity(t *testing.T) {
	r := stReplay(t, nil, 0, `malloc id=1 size=1000
malloc id=2 size=3000
malloc id=3 size=2000
free id=3
free id=2
malloc id=4 size=3000
malloc id=5 size=2000
free id=5
free id=4
malloc id=6 size=3000
malloc id=7 size=2000
free id=7
free id=6
malloc id=8 size=3000
malloc id=9 size=2000
free id=9
free id=8
`)
	r.expect(t, map[uint64]uint64{1: seg1 + 5120, 2: seg1, 3: seg1 + 3072, 4: seg1, 5: seg1 + 3072, 6: seg1, 7: seg1 + 3072, 8: seg1, 9: seg1 + 3072})
	st := r.p.Stats()
	if st.Found != "periodicity" || st.Anchor != "the mallocs of 3000 bytes" || !slices.Equal(st.Starts, []int{1, 5, 9, 13}) || st.Height != 6144 {
		t.Errorf("stats %+v: want iterations found by periodicity at the mallocs of 3000 bytes, events 1, 5, 9, 13; height 6144", st)
	}
	r.warned(t, "4 iterations were taken to start where the trace repeats, at the mallocs of 3000 bytes (events 1, 5, 9, 13)")
	if r.dev.peak != 6144 {
		t.Errorf("peak reserved %d, want 6144", r.dev.peak)
	}
}

// TestSTAllocNoIterations: no markers and no size that recurs: no
// profile, every malloc goes to PyTorch's caching allocator as if alone:
// the small pool's first 2 MiB segment, split in turn (1024, 2048 and
// 3072 bytes after rounding to 512), and a warning.
func TestSTAllocNoIterations(t *testing.T) {
	text := `malloc id=1 size=1000
malloc id=2 size=2000
malloc id=3 size=3000
free id=2
`
	r := stReplay(t, nil, 0, text)
	r.expect(t, map[uint64]uint64{1: seg1, 2: seg1 + 1024, 3: seg1 + 3072})
	if r.dev.peak != 2*mib {
		t.Errorf("peak reserved %d, want 2 MiB", r.dev.peak)
	}
	r.warned(t, "stalloc found no iterations", "all 3 mallocs went to the online manager")
	// The same as the pytorch policy.
	dev := &stDevice{}
	pt, _ := NewPyTorch(dev, nil)
	for id, size := range []uint64{1000, 2000, 3000} {
		b, err := pt.Malloc(size, 0)
		if err != nil || b.Addr != r.addrs[uint64(id+1)] {
			t.Errorf("pytorch places id=%d at %#x (%v), stalloc at %#x", id+1, b.Addr, err, r.addrs[uint64(id+1)])
		}
	}
	// Markers not looked at: a marker of the prefix does not count.
	r = stReplay(t, Settings{"marker": ""}, 0, `marker label="iteration 0"
`+text)
	if st := r.p.Stats(); st.Found != "" {
		t.Errorf("marker empty: iterations found by %q", st.Found)
	}
	r.warned(t, "markers not looked at")
}

// TestSTAllocRegionRefused: under a capacity of 4 MiB, a malloc of 256
// bytes (small: online) takes a 2 MiB segment of PyTorch's small pool at
// the first segment; then the plan's region (id1 + id2 + id3, 3 MiB) is
// refused: 2 + 3 > 4 MiB. Its mallocs go online: id1 in the first
// segment after the 512 bytes of the small one, id2 and id3 (1 MiB each,
// small requests) in a second 2 MiB segment, as iterations 1 and 2 do:
// peak reserved 4 MiB, no OOM, and warnings of the refusal (7 planned
// mallocs) and of the profile that took the whole trace (3 iterations).
func TestSTAllocRegionRefused(t *testing.T) {
	r := stReplay(t, nil, 4*mib, `malloc id=100 size=256
malloc id=1 size=1MiB
marker label="iteration 0"
malloc id=2 size=1MiB
malloc id=3 size=1MiB
free id=3
free id=2
marker label="iteration 1"
malloc id=4 size=1MiB
malloc id=5 size=1MiB
free id=5
free id=4
marker label="iteration 2"
malloc id=6 size=1MiB
malloc id=7 size=1MiB
free id=7
free id=6
`)
	if len(r.ooms) != 0 {
		t.Fatalf("OOMs at events %v", r.ooms)
	}
	r.expect(t, map[uint64]uint64{100: seg1, 1: seg1 + 512, 2: seg2, 3: seg2 + mib, 4: seg2, 5: seg2 + mib, 6: seg2, 7: seg2 + mib})
	if r.dev.peak != 4*mib {
		t.Errorf("peak reserved %d, want 4 MiB", r.dev.peak)
	}
	if st := r.p.Stats(); st.RegionRefused != 7 || st.Planned != 0 || st.Height != 3*mib {
		t.Errorf("stats %+v: want RegionRefused 7, Planned 0, Height 3 MiB", st)
	}
	r.warned(t, "the device refused the plan's region of 3145728 bytes at event 1 (malloc #1 of 1048576 bytes)", "its 7 planned mallocs went to the online manager")
	r.warned(t, "stalloc profiles 3 iterations and the trace has 3 (from event 2)")
}

// TestSTAllocBadSettings: a malformed setting is an error naming it,
// never a panic.
func TestSTAllocBadSettings(t *testing.T) {
	for _, tc := range []struct {
		s    Settings
		want string
	}{
		{Settings{"profile": "1"}, "profile"},
		{Settings{"profile": "x"}, "profile"},
		{Settings{"profile": "-3"}, "profile"},
		{Settings{"alignment": "3"}, "alignment"},
		{Settings{"alignment": "4MiB"}, "alignment"},
		{Settings{"small": "lots"}, "small"},
		{Settings{"nodes": "2199023255553"}, "nodes"},
		{Settings{"markers": "step"}, "markers"},
	} {
		_, err := NewSTAlloc(&stDevice{}, tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.s, err, tc.want)
		}
	}
	p, err := NewSTAlloc(&stDevice{}, Settings{"marker": "step", "profile": "4", "alignment": "256", "small": "0", "nodes": "100"})
	if err != nil || p.marker != "step" || p.profile != 4 || p.alignment != 256 || p.small != 0 || p.nodes != 100 {
		t.Errorf("good settings: %v, %+v", err, p)
	}
}

// TestSTAllocPeriod checks the search for where a trace repeats on key
// sequences, one letter a key, with the live bytes before each call.
func TestSTAllocPeriod(t *testing.T) {
	for _, tc := range []struct {
		name  string
		keys  string
		lives []uint64 // nil: all 0
		want  []int    // nil: none found
	}{
		// a at 1, 4, 7, 10: gaps 3; b too (2, 5, 8, 11), c too: a comes first.
		{"first of equals", "wabcabcabcabc", nil, []int{1, 4, 7, 10}},
		// b finds fewer live bytes (1 against 5 for a and c).
		{"fewest live bytes", "wabcabcabcabc", []uint64{0, 5, 1, 5, 5, 1, 5, 5, 1, 5, 5, 1, 5}, []int{2, 5, 8, 11}},
		// The first gap may be longer (iteration 0 makes more), to twice
		// the others: a at 0, 5, 8, 11.
		{"long first gap", "axxbcabcabcab", nil, []int{0, 5, 8, 11}},
		// Gaps 2 and 4 (4 > 5/4 * 2): irregular.
		{"irregular", "abaxxxaba", nil, nil},
		// Regular but spanning a third of the calls: a at 0, 1, 2.
		{"too short a span", "aaaxyzuvw", nil, nil},
		// Three times only: one gap after the first, nothing to compare.
		{"too few", "abcabcabc", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([]stKey, len(tc.keys))
			for k, c := range tc.keys {
				keys[k] = stKey{size: uint64(c)}
			}
			lives := tc.lives
			if lives == nil {
				lives = make([]uint64, len(keys))
			}
			got, _ := stPeriod(keys, lives)
			if !slices.Equal(got, tc.want) {
				t.Errorf("stPeriod(%q) = %v, want %v", tc.keys, got, tc.want)
			}
		})
	}
}
