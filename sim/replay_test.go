package sim

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

func textSource(t *testing.T, path string) trace.Source {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, evs, err := trace.ParseText(path, f)
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSliceSource(h, evs)
}

func TestReplayEngine(t *testing.T) {
	rs, err := Run(textSource(t, "testdata/engine.txt"), Config{Trace: "engine.txt", Policy: "cuda", Capacity: 8192})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	check := func(name string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("events", r.Events, int64(13))
	check("mallocs", r.Mallocs, int64(4))
	check("frees", r.Frees, int64(3))
	check("peak requested", r.PeakRequested, uint64(8001))
	check("peak allocated", r.PeakAllocated, uint64(8192))
	check("peak reserved", r.PeakReserved, uint64(8192))
	check("device allocs", r.DeviceAllocs, int64(4))
	check("device frees", r.DeviceFrees, int64(3))
	check("ooms", r.OOMs, int64(2))
	check("first oom event", r.FirstOOMEvent, int64(5))
	check("first oom size", r.FirstOOMSize, uint64(1))
	check("source ooms", r.SourceOOMs, int64(2))
	check("anomalies", r.Anomalies, int64(1))
	check("first anomaly", r.FirstAnomaly, "event 7: free of unknown address 0x9")
	check("peak pinned", r.PeakPinned, uint64(4096))
	check("peak managed", r.PeakManaged, uint64(1))
	check("fragmentation at peak", r.FragmentationAtPeak, 0.0)
	if len(r.Series) != 13 {
		t.Fatalf("series of %d points, want one per event", len(r.Series))
	}
	p := r.Series[4]
	if p.Event != 4 || p.Requested != 8000 || p.Allocated != 8192 || p.Reserved != 8192 {
		t.Errorf("point 4 = %+v", p)
	}
	if last := r.Series[12]; last.Requested != 3000 || last.Allocated != 3072 || last.Reserved != 3072 {
		t.Errorf("last point = %+v", last)
	}
}

// TestSeriesDownsampling replays more events than MaxSeriesPoints: the
// series is bounded, covers the whole trace, and keeps the peak.
func TestSeriesDownsampling(t *testing.T) {
	var evs []trace.Event
	const n = 5001
	for i := 0; i < n; i++ {
		size := uint64(512)
		if i == 3333 {
			size = 1 << 20
		}
		evs = append(evs, trace.Event{Op: trace.OpMalloc, Addr: uint64(i + 1), Size: size, Time: int64(i)})
		evs = append(evs, trace.Event{Op: trace.OpFree, Addr: uint64(i + 1), Time: int64(i)})
	}
	rs, err := Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	s := rs[0].Series
	if len(s) > MaxSeriesPoints || len(s) < MaxSeriesPoints/4 {
		t.Fatalf("series of %d points", len(s))
	}
	if s[len(s)-1].Event != 2*n-1 {
		t.Errorf("last point at event %d, want %d", s[len(s)-1].Event, 2*n-1)
	}
	var peak uint64
	for k, p := range s {
		peak = max(peak, p.Reserved)
		if k > 0 && p.Event <= s[k-1].Event {
			t.Fatalf("points out of order at %d", k)
		}
	}
	if peak != 1<<20 || rs[0].PeakReserved != 1<<20 {
		t.Errorf("series peak %d, result peak %d, want %d", peak, rs[0].PeakReserved, 1<<20)
	}
}

func TestRunUnknownPolicy(t *testing.T) {
	_, err := Run(trace.NewSliceSource(trace.Header{}, nil), Config{Policy: "nope"})
	if err == nil || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Errorf("got %v", err)
	}
}

// TestFreeRequested checks PyTorch's accounting of a free that completes
// late: the bytes leave allocated at the free request (allocated_bytes),
// requested only at the free (requested_bytes), when the block returns to
// the policy (and the device, for cuda).
func TestFreeRequested(t *testing.T) {
	const text = `
malloc id=1 size=1000 stream=7
malloc id=2 size=2048
free_requested id=1 stream=7
malloc id=3 size=4096
free id=1 stream=7
free_requested id=9
`
	_, evs, err := trace.ParseText("fr.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	// requested: 1000, 3048, 3048 (request), 7144 (peak), 6144.
	// allocated: 1024, 3072, 2048 (request), 6144 (peak), 6144.
	// reserved: 1024, 3072, 3072, 7168 (peak: block 1 is still held), 6144.
	// The free request of 0x9, never allocated, is the one anomaly.
	if r.PeakRequested != 7144 || r.PeakAllocated != 6144 || r.PeakReserved != 7168 || r.DeviceFrees != 1 || r.Anomalies != 1 {
		t.Errorf("requested %d allocated %d reserved %d device frees %d anomalies %d",
			r.PeakRequested, r.PeakAllocated, r.PeakReserved, r.DeviceFrees, r.Anomalies)
	}
	if p := r.Series[4]; p.Requested != 6144 || p.Reserved != 6144 {
		t.Errorf("after the free: %+v", p)
	}
}

// TestStrictAndHooks checks --strict (the first semantic problem stops the
// run), the workspace policy's hint (its region is 1.2 x the peak requested,
// rounded up to 2 MiB, from a first pass) and the simulated allocator time.
func TestStrictAndHooks(t *testing.T) {
	const text = `
malloc id=1 size=1MiB
malloc id=2 size=3MiB
free id=1
free id=1
free id=2
`
	_, evs, err := trace.ParseText("s.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "cuda", Strict: true})
	if err == nil || err.Error() != "event 3: double free of 0x1: freed at event 2 (--strict)" {
		t.Errorf("strict: %v", err)
	}
	rs, err := Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "workspace"}, Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	// Peak requested 4 MiB; 1.2 x 4 MiB = 4.8 MiB, rounded up to 6 MiB:
	// one device alloc holds both mallocs.
	if w := rs[0]; w.PeakReserved != 6<<20 || w.DeviceAllocs != 1 || w.Anomalies != 1 {
		t.Errorf("workspace: reserved %d, device allocs %d, anomalies %d", w.PeakReserved, w.DeviceAllocs, w.Anomalies)
	}
	if c := rs[1]; c.SimAllocTimeNS <= 0 || len(c.Latency) == 0 {
		t.Errorf("cuda: simulated allocator time %d ns, %d latency rows", c.SimAllocTimeNS, len(c.Latency))
	}
}

// TestExpandableCost: the pages that expandable segments map are charged to
// the cost model, one cudaMalloc of the mapped size per map call.
func TestExpandableCost(t *testing.T) {
	_, evs, err := trace.ParseText("x.txt", strings.NewReader("malloc id=1 size=30MiB\nfree id=1\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "pytorch", Settings: map[string]string{"conf": "expandable_segments:True"}})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	want, _ := DefaultCostModel().Latency(CostMallocBatch, 40<<20) // two 20 MiB pages, fresh memory
	if r.DeviceAllocs != 1 || r.SimAllocTimeNS != want {
		t.Errorf("device allocs %d, allocator time %d ns; want 1 and %d", r.DeviceAllocs, r.SimAllocTimeNS, want)
	}
}

// TestClairvoyantUnderCapacity: under a capacity below the plan's height,
// a clairvoyant policy takes an arena of what the capacity leaves and
// fails only the blocks planned above it. Blocks of 50, 100 and 150 bytes
// live at once stack to 300 bytes (alignment 1); under 260 bytes the one
// on top, which ends at 300, is the only one that does not fit (the one
// below it ends at 300 - 50 or lower), so there is one OOM, and the arena
// holds 260 bytes.
func TestClairvoyantUnderCapacity(t *testing.T) {
	text := "malloc id=1 size=50\nmalloc id=2 size=100\nmalloc id=3 size=150\nfree id=1\nfree id=2\nfree id=3\n"
	h, evs, err := trace.ParseText("cap.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"offline", "greedy-by-size", "greedy-by-lifetime"} {
		rs, err := Run(trace.NewSliceSource(h, evs), Config{Policy: p, Capacity: 260, Settings: policies.Settings{"alignment": "1"}})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		r := rs[0]
		if r.OOMs != 1 || r.PeakReserved != 260 || r.PeakRequested != 300 || r.DeviceAllocs != 1 {
			t.Errorf("%s under 260 bytes: %d OOMs (first at event %d), reserved %d, requested %d, %d device allocs; want 1 OOM, 260, 300, 1",
				p, r.OOMs, r.FirstOOMEvent, r.PeakReserved, r.PeakRequested, r.DeviceAllocs)
		}
		rs, err = Run(trace.NewSliceSource(h, evs), Config{Policy: p, Capacity: 300, Settings: policies.Settings{"alignment": "1"}})
		if err != nil || rs[0].OOMs != 0 || rs[0].PeakReserved != 300 {
			t.Errorf("%s under 300 bytes: %v, %+v", p, err, rs[0])
		}
	}
	// A block that does not fit leaves room that a later one takes: 100,
	// 99 and 50 KiB live at once under 150 KiB; the 100 KiB block goes
	// first, the 99 KiB one finds no gap of its size (50 KiB are left),
	// the 50 KiB one fits there, as cuda's would.
	text = "malloc id=1 size=100KiB\nmalloc id=2 size=99KiB\nmalloc id=3 size=50KiB\nfree id=1\nfree id=2\nfree id=3\n"
	if h, evs, err = trace.ParseText("cap2.txt", strings.NewReader(text)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"offline", "greedy-by-size", "greedy-by-lifetime", "cuda"} {
		rs, err := Run(trace.NewSliceSource(h, evs), Config{Policy: p, Capacity: 150 << 10, Check: true, Settings: policies.Settings{"alignment": "512"}})
		if p == "cuda" {
			rs, err = Run(trace.NewSliceSource(h, evs), Config{Policy: p, Capacity: 150 << 10, Check: true})
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if r := rs[0]; r.OOMs != 1 || r.FirstOOMEvent != 1 || r.PeakAllocated != 150<<10 {
			t.Errorf("%s under 150 KiB: %d OOMs (first at event %d), %d allocated; want 1 OOM at event 1, %d", p, r.OOMs, r.FirstOOMEvent, r.PeakAllocated, 150<<10)
		}
	}
}

// TestFootprint: the card's memory as the driver takes it (H200, CUDA
// 13.0): the cuda policy's 20 MiB + 512 B segment takes 22 MiB of whole
// pages; its two 512 B segments and the 1 MiB one share one 2 MiB page
// (1 MiB + 1 KiB of it); 24 MiB in all at the peak, 2 MiB after the large
// one is freed.
func TestFootprint(t *testing.T) {
	text := "malloc id=1 size=20971521\nmalloc id=2 size=100\nmalloc id=3 size=100\nmalloc id=4 size=1048576\nfree id=1\n"
	_, evs, err := trace.ParseText("fp.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := NewReplay(Config{Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	for k, ev := range evs {
		if err := rep.Step(int64(k), ev); err != nil {
			t.Fatal(err)
		}
	}
	r := rep.Finish()
	if r.PeakFootprint != 24<<20 || rep.Device().Footprint() != 2<<20 || r.PeakReserved != 20<<20+512+1024+1<<20 {
		t.Errorf("peak footprint %d, footprint at the end %d, peak reserved %d; want %d, %d, %d",
			r.PeakFootprint, rep.Device().Footprint(), r.PeakReserved, 24<<20, 2<<20, 20<<20+512+1024+1<<20)
	}
}

// TestCardHoldsFootprint: on a card (Config.Card) the capacity holds the
// driver's pages, not the reserved bytes. Under 10 MiB, cuda's two 3 MiB +
// 512 B segments take 4 MiB of pages each and its 1 MiB + 512 B one 2 MiB:
// 10 MiB with 7341568 bytes reserved, so the 512 B segment after them,
// which needs a page of its own, is refused at event 3; once the first is
// freed (6 MiB) the next one gets its page. Under a 10 MiB capacity that
// holds the reserved bytes every malloc fits and the pages reach 12 MiB.
func TestCardHoldsFootprint(t *testing.T) {
	text := "malloc id=1 size=3145729\nmalloc id=2 size=3145729\nmalloc id=3 size=1048577\nmalloc id=4 size=100\nfree id=1\nmalloc id=5 size=100\n"
	h, evs, err := trace.ParseText("card.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		card           bool
		ooms, firstOOM int64
		footprint      uint64
		reserved       uint64
	}{{true, 1, 3, 10 << 20, 7341568}, {false, 0, -1, 12 << 20, 7341568 + 512}} {
		rs, err := Run(trace.NewSliceSource(h, evs), Config{Policy: "cuda", Capacity: 10 << 20, Card: tc.card, Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if r := rs[0]; r.OOMs != tc.ooms || r.FirstOOMEvent != tc.firstOOM || r.PeakFootprint != tc.footprint || r.PeakReserved != tc.reserved {
			t.Errorf("card %v: %d OOMs (first at event %d), peak footprint %d, peak reserved %d; want %d at %d, %d, %d",
				tc.card, r.OOMs, r.FirstOOMEvent, r.PeakFootprint, r.PeakReserved, tc.ooms, tc.firstOOM, tc.footprint, tc.reserved)
		}
	}

	// A map is held to a card, as cuMemCreate is: 2 MiB and then 4 MiB
	// more do not fit 4 MiB.
	d := NewDevice(4 << 20)
	d.HoldFootprint()
	base, err := d.Reserve(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(base, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(base+2<<20, 4<<20); !errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("a map past the card: %v, want an OOM", err)
	}
}

// TestDirectMallocs replays the device mallocs of CUDA libraries around the
// policy (trace.DirectSite), counted apart: figures worked out in
// testdata/direct.txt.
func TestDirectMallocs(t *testing.T) {
	rs, err := Run(textSource(t, "testdata/direct.txt"), Config{Trace: "direct.txt", Policy: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	got := [...]any{r.Mallocs, r.Frees, r.PeakRequested, r.PeakAllocated, r.PeakReserved, r.DeviceAllocs, r.DirectMallocs, r.PeakDirect, r.PeakFootprint, r.Anomalies}
	want := [...]any{int64(2), int64(2), uint64(4000), uint64(4096), uint64(4096), int64(2), int64(2), uint64(67108868), uint64(69206016), int64(0)}
	if got != want {
		t.Errorf("mallocs, frees, peak requested, allocated, reserved, device allocs, direct mallocs, peak direct, footprint, anomalies = %v, want %v", got, want)
	}
	// On a card of 64 MiB (the footprint held to it), cuBLAS's 64 MiB
	// workspace and the first 2 MiB page do not both fit: the card refuses
	// the workspace, an OOM of the job; a per-process cap of the same
	// bytes holds the policy's reserved bytes only, and all fits.
	rs, err = Run(textSource(t, "testdata/direct.txt"), Config{Trace: "direct.txt", Policy: "cuda", Capacity: 64 << 20, Card: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.OOMs != 1 || r.FirstOOMEvent != 1 || r.DirectMallocs != 2 || r.PeakDirect != 4 {
		t.Errorf("on a 64 MiB card: OOMs %d at event %d, direct %d, peak direct %d", r.OOMs, r.FirstOOMEvent, r.DirectMallocs, r.PeakDirect)
	}
	rs, err = Run(textSource(t, "testdata/direct.txt"), Config{Trace: "direct.txt", Policy: "cuda", Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.OOMs != 0 {
		t.Errorf("under a 64 MiB cap: %d OOMs", r.OOMs)
	}
	// A Planner plans the policy's mallocs only: offline places the two
	// of XLA, live together, in 4000 bytes.
	rs, err = Run(textSource(t, "testdata/direct.txt"), Config{Trace: "direct.txt", Policy: "offline"})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.Mallocs != 2 || r.DirectMallocs != 2 || r.PeakRequested != 4000 || r.OOMs != 0 {
		t.Errorf("offline: mallocs %d, direct %d, peak requested %d, OOMs %d", r.Mallocs, r.DirectMallocs, r.PeakRequested, r.OOMs)
	}
}

// failingPolicy fails its n-th malloc (from 1) with an error that is not
// an OOM, and serves each other one with a device segment of its own.
type failingPolicy struct {
	dev      policies.Device
	n, count int
}

func (f *failingPolicy) Name() string { return "failing" }

func (f *failingPolicy) Malloc(size, stream uint64) (policies.Block, error) {
	f.count++
	if f.count == f.n {
		return policies.Block{}, errors.New("broken")
	}
	addr, err := f.dev.Alloc(size)
	return policies.Block{Addr: addr, Size: size}, err
}

func (f *failingPolicy) Free(addr, stream uint64) error { return f.dev.Free(addr) }

// TestRunFirstError: of two replays that fail, Run returns the error a
// single pass over the events meets first, the one at the earlier event
// (the second config's malloc at event 2, not the first's at event 4),
// whether the events are in memory (a pass per replay) or streamed.
func TestRunFirstError(t *testing.T) {
	text := "malloc id=1 size=1KiB\nfree id=1\nmalloc id=2 size=1KiB\nfree id=2\nmalloc id=3 size=1KiB\nfree id=3\n"
	h, evs, err := trace.ParseText("t.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	failing := func(n int) Config {
		return Config{Policy: "failing", NewPolicy: func(dev policies.Device, _ policies.Settings) (policies.Policy, error) {
			return &failingPolicy{dev: dev, n: n}, nil
		}}
	}
	for name, src := range map[string]func() trace.Source{
		"in memory": func() trace.Source { return trace.NewSliceSource(h, evs) },
		"streamed":  func() trace.Source { return streamOnly{trace.NewSliceSource(h, evs)} },
	} {
		_, err := Run(src(), failing(3), failing(2))
		if err == nil || err.Error() != "policy failing: event 2: malloc of 1024 bytes: broken" {
			t.Errorf("%s: error %v, want the one at event 2", name, err)
		}
	}
}

// streamOnly hides a SliceSource's type, so that Run reads it as a stream.
type streamOnly struct{ trace.Source }

// TestProgress: Config.Progress is called once per replay, from an
// in-memory trace (a pass per replay) and from a stream (one pass).
func TestProgress(t *testing.T) {
	h, evs, err := trace.ParseText("p.txt", strings.NewReader("malloc id=1 size=4096\nfree id=1\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []func() trace.Source{
		func() trace.Source { return trace.NewSliceSource(h, evs) },
		func() trace.Source { return onlyNext{trace.NewSliceSource(h, evs)} },
	} {
		var n atomic.Int32
		done := func() { n.Add(1) }
		if _, err := Run(src(), Config{Policy: "cuda", Progress: done}, Config{Policy: "best-fit", Progress: done}, Config{Policy: "pytorch"}); err != nil {
			t.Fatal(err)
		}
		if n.Load() != 2 {
			t.Errorf("%T: Progress called %d times, want 2", src(), n.Load())
		}
	}
}

// onlyNext hides a source's type, so that Run streams it.
type onlyNext struct{ trace.Source }
