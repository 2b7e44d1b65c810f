package sim

import (
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

func TestDefaultCostModel(t *testing.T) {
	m := DefaultCostModel()
	for _, tc := range []struct {
		call string
		size uint64
		want int64 // ns
	}{
		{CostMalloc, 512, 48710},                   // a measured point
		{CostMalloc, 1, 48710},                     // below the smallest: flat
		{CostFree, 1 << 30, 643950},                // a measured point
		{CostMallocSuballoc, 4096, 2090},           // from the batch rows
		{CostFreeSuballoc, 65536, 2300},            // from the batch rows
		{"cudaMallocAsync_thrmax", 4096, 780},      // other rows are kept
		{CostFree, 128 << 30, 47504460 * 2 * 1000}, // placeholder, checked below
	} {
		got, ok := m.Latency(tc.call, tc.size)
		if !ok {
			t.Errorf("%s: no row", tc.call)
			continue
		}
		if tc.size == 128<<30 {
			// Above the largest size: the last slope, about linear.
			if got < 80e6 || got > 110e6 {
				t.Errorf("%s(%d) = %d ns, want about twice 47.5 ms", tc.call, tc.size, got)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("%s(%d) = %d ns, want %d", tc.call, tc.size, got, tc.want)
		}
	}
	// Batch rows above 64 KiB are not sub-allocations: the 64 KiB row's
	// slope goes on.
	if got, _ := m.Latency(CostMallocSuballoc, 1<<20); got < 2180 || got > 2400 {
		t.Errorf("%s(1 MiB) = %d ns", CostMallocSuballoc, got)
	}
	// Between points: log-log, so between the neighbours.
	a, _ := m.Latency(CostFree, 1<<30)
	b, _ := m.Latency(CostFree, 2<<30)
	c, _ := m.Latency(CostFree, 4<<30)
	if !(a < b && b < c) {
		t.Errorf("cudaFree 1, 2, 4 GiB: %d %d %d ns", a, b, c)
	}
	if _, ok := m.Latency("cudaNothing", 1); ok {
		t.Error("a latency for an unknown call")
	}
}

func TestParseCostModelErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
		is               error
	}{
		{"no header", "", "x.csv:1: reading the header: EOF", nil},
		{"no median column", "api,size_bytes\n", `x.csv:1: no column "median_us"`, nil},
		{"bad size", "api,size_bytes,median_us\ncudaMalloc,lots,1\n", `x.csv:2: size_bytes "lots": not an unsigned integer`, nil},
		{"bad median", "api,size_bytes,median_us\ncudaMalloc,1,-3\n", `x.csv:2: median_us "-3": not a latency`, nil},
		{"huge median", "api,size_bytes,median_us\ncudaMalloc,1,3\ncudaMalloc,2,4e9\n", `x.csv:3: median_us "4e9": more than an hour`, nil},
		{"no free", "api,size_bytes,median_us\ncudaMalloc,1,3\n", "x.csv: cost model lacks a row: cudaFree", ErrNoCostRow},
		{"no suballoc", "api,size_bytes,median_us\ncudaMalloc,1,3\ncudaFree,1,3\n", "cudaMalloc_suballoc (or cudaMalloc_batch up to 64 KiB)", ErrNoCostRow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCostModel(strings.NewReader(tc.text), "x.csv")
			var ce *CostError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a CostError with %q", err, tc.want)
			}
			if tc.is != nil && !strings.Contains(err.Error(), tc.is.Error()) {
				t.Errorf("%v does not name %v", err, tc.is)
			}
		})
	}
}

// A steep cost curve extrapolates at most linearly in the size above its
// largest point, a call costs at most an hour, and the totals saturate:
// never a negative allocator time (a 1 PiB malloc on a curve that grows
// 1000x per doubling above 1 MiB gave -9223372036854775808 ns).
func TestCostModelBounded(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(`api,size_bytes,median_us
cudaMalloc,1048576,10
cudaMalloc,2097152,10000
cudaFree,1,5
cudaMalloc_suballoc,1,1
cudaFree_suballoc,1,1
`), "steep.csv")
	if err != nil {
		t.Fatal(err)
	}
	// Above 2 MiB at most linear: 4 MiB costs twice 2 MiB's 10 ms.
	if ns, _ := m.Latency(CostMalloc, 4<<20); ns != 20e6 {
		t.Errorf("4 MiB: %d ns, want 20000000", ns)
	}
	if ns, _ := m.Latency(CostMalloc, 1<<50); ns != maxCallNS {
		t.Errorf("1 PiB: %d ns, want an hour", ns)
	}
	var evs []trace.Event
	for i := range 4000 {
		evs = append(evs, trace.Event{Op: trace.OpMalloc, Addr: uint64(i+1) << 52, Size: 1 << 50},
			trace.Event{Op: trace.OpFree, Addr: uint64(i+1) << 52})
	}
	rs, err := Run(trace.NewSliceSource(trace.Header{}, evs), Config{Policy: "cuda", CostModel: m})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.SimAllocTimeNS <= 0 {
		t.Errorf("allocator time %d ns", r.SimAllocTimeNS)
	}
}

// TestCostMeter follows the driver's sub-allocation: small requests share
// 2 MiB pages, and only the first in a page and the free that empties it
// cost a full call.
func TestCostMeter(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(`api,size_bytes,median_us
cudaMalloc,512,50
cudaMalloc,1048576,50
cudaMalloc,4194304,100
cudaFree,512,40
cudaFree,1048576,40
cudaFree,4194304,80
cudaMalloc_suballoc,512,2
cudaFree_suballoc,512,3
`), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDevice(0)
	d.SetCostModel(m)
	a1, _ := d.Alloc(512)     // new page: 50 us
	a2, _ := d.Alloc(1 << 20) // same page: 2 us
	a3, _ := d.Alloc(1 << 20) // no room left (512 + 1 MiB + 1 MiB > 2 MiB): new page, 50 us
	a4, _ := d.Alloc(4 << 20) // its own mapping: 100 us
	d.Free(a2)                // page 1 keeps a1: 3 us
	d.Free(a1)                // page 1 empty: 40 us
	a5, _ := d.Alloc(4096)    // fits page 2: 2 us
	d.Free(a3)                // page 2 keeps a5: 3 us
	d.Free(a5)                // 40 us
	d.Free(a4)                // 80 us
	want := int64((50 + 2 + 50 + 100 + 3 + 40 + 2 + 3 + 40 + 80) * 1000)
	if got := d.AllocTime(); got != want {
		t.Errorf("allocator time %d ns, want %d", got, want)
	}
	var res Result
	d.FillCost(&res)
	if res.SimAllocTimeNS != want {
		t.Errorf("SimAllocTimeNS %d", res.SimAllocTimeNS)
	}
	rows := map[string]LatencyRow{}
	for _, r := range res.Latency {
		rows[r.Call+" "+r.SizeClass] = r
	}
	if r := rows["cudaMalloc <=1MiB"]; r.Count != 2 || r.TotalNS != 52000 || r.MaxNS != 50000 {
		t.Errorf("cudaMalloc <=1MiB: %+v", r)
	}
	if r := rows["cudaFree <=4MiB"]; r.Count != 1 || r.MedianNS != 80000 {
		t.Errorf("cudaFree <=4MiB: %+v", r)
	}
	d.SetCostModel(nil)
	d.Alloc(512)
	if d.AllocTime() != 0 || d.Latencies() != nil {
		t.Error("charged without a cost model")
	}
}

func TestLatencies(t *testing.T) {
	var l Latencies
	for i := int64(1); i <= 1000; i++ {
		l.Add("cudaMalloc", 4096, i*1000)
	}
	l.Add("cudaDeviceSynchronize", 0, 700)
	rows := l.Rows()
	if len(rows) != 2 || rows[0].Call != "cudaDeviceSynchronize" || rows[0].SizeClass != "-" || rows[1].SizeClass != "<=4KiB" {
		t.Fatalf("rows %+v", rows)
	}
	r := rows[1]
	near := func(got, want int64) bool { return got >= want*98/100 && got <= want*102/100 }
	if r.Count != 1000 || r.TotalNS != 500500000 || !near(r.MedianNS, 500000) || !near(r.P90NS, 900000) || !near(r.P99NS, 990000) || r.MaxNS != 1000000 {
		t.Errorf("row %+v", r)
	}
	if l.Total("cudaMalloc") != 500500000 || l.Count() != 1001 || l.Total() != 500500700 {
		t.Errorf("totals %d %d %d", l.Total("cudaMalloc"), l.Count(), l.Total())
	}
	for _, tc := range []struct {
		size uint64
		want string
	}{{1, "<=1KiB"}, {1024, "<=1KiB"}, {1025, "<=4KiB"}, {1 << 20, "<=1MiB"}, {4 << 30, "<=4GiB"}, {4<<30 + 1, ">4GiB"}} {
		if got := SizeClass(tc.size); got != tc.want {
			t.Errorf("SizeClass(%d) = %q, want %q", tc.size, got, tc.want)
		}
	}
}

func TestHistogramExactSmall(t *testing.T) {
	var h histogram
	for _, v := range []int64{5, 1, 3, 2, 4} {
		h.add(v)
	}
	if h.quantile(0.5) != 3 || h.quantile(0) != 1 || h.quantile(1) != 5 {
		t.Errorf("quantiles %d %d %d", h.quantile(0), h.quantile(0.5), h.quantile(1))
	}
	for v := int64(100); v < 1e9; v = v*13/10 + 1 {
		b := bucketOf(v)
		if mid := bucketMid(b); mid < v*98/100 || mid > v*102/100 {
			t.Errorf("value %d: bucket %d middle %d", v, b, mid)
		}
		if bucketOf(v+1) < b {
			t.Errorf("buckets not monotonic at %d", v)
		}
	}
}

// TestCostMeterBestFit places small requests best fit in the holes of the
// mapped pages, and charges a large cudaMalloc of a size freed before as a
// reuse.
func TestCostMeterBestFit(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(`api,size_bytes,median_us
cudaMalloc,512,30
cudaFree,512,20
cudaMalloc_batch,512,50
cudaMalloc_suballoc,512,1
cudaFree_suballoc,512,2
cudaMalloc_newpage,512,40
cudaFree_lastinpage,512,35
`), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDevice(0)
	d.SetCostModel(m)
	a, _ := d.Alloc(1 << 20)    // new page: 40 us; hole [1 MiB, 2 MiB)
	b, _ := d.Alloc(512 << 10)  // 1; hole [1.5 MiB, 2 MiB)
	c, _ := d.Alloc(512 << 10)  // 1; page full
	d.Free(b)                   // 2; hole [1 MiB, 1.5 MiB)
	e, _ := d.Alloc(600 << 10)  // no hole holds it: new page, 40
	f, _ := d.Alloc(256 << 10)  // best fit: the 512 KiB hole of page 1, not page 2's 1.4 MiB: 1
	g, _ := d.Alloc(1400 << 10) // too big for the rest: 1 MiB+ is large: a fresh mapping, 50
	d.Free(g)                   // 20
	h, _ := d.Alloc(1400 << 10) // the same size again: reuse, 30
	for _, x := range []uint64{a, c, f} {
		d.Free(x) // 2, 2, then the page empties: 35
	}
	d.Free(e) // 35
	d.Free(h) // 20
	want := int64((40 + 1 + 1 + 2 + 40 + 1 + 50 + 20 + 30 + 2 + 2 + 35 + 35 + 20) * 1000)
	if got := d.AllocTime(); got != want {
		t.Errorf("allocator time %d ns, want %d", got, want)
	}
	if n := d.cost.pages; n != 0 {
		t.Errorf("%d pages still mapped", n)
	}
}

// TestSizeClassBounds compares sizeClass with a search of the bounds, on
// every bound and its neighbours.
func TestSizeClassBounds(t *testing.T) {
	want := func(size uint64) int {
		if size == 0 {
			return noSize
		}
		for i, b := range sizeClassBounds {
			if size <= b {
				return i
			}
		}
		return len(sizeClassBounds)
	}
	sizes := []uint64{0, 1, 2, 511, 512, 1<<64 - 1, 1 << 63}
	for _, b := range sizeClassBounds {
		sizes = append(sizes, b-1, b, b+1, 2*b, 2*b+1)
	}
	for _, s := range sizes {
		if got := sizeClass(s); got != want(s) {
			t.Errorf("sizeClass(%d) = %d, want %d", s, got, want(s))
		}
	}
}

// TestCostMeterLatencyMemo checks that the meter's remembered latencies are
// the model's, for sizes in the memos and out of them, charged first and
// again, and for a row the model lacks (the call's row is charged).
func TestCostMeterLatencyMemo(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(`api,size_bytes,median_us
cudaMalloc,512,30
cudaMalloc,1048576,45.5
cudaMalloc,67108864,300
cudaFree,512,20
cudaFree,1048576,31.7
cudaMalloc_suballoc,512,1
cudaMalloc_suballoc,65536,3.3
cudaFree_suballoc,512,2
`), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	c := newCostMeter(m)
	sizes := []uint64{1, 3, 512, 1000, 1024, 4096, 65536, 100000, 1 << 20, 1<<20 + 512, 3 << 20, 5<<20 + 7, memoMaxSize, memoMaxSize + 512, 1 << 30, 5 << 40}
	for pass := 0; pass < 2; pass++ {
		for k := range numCharges {
			cr := chargeRows[k]
			for _, s := range sizes {
				want, ok := m.Latency(cr.row, s)
				if !ok {
					want, _ = m.Latency(cr.call, s)
				}
				if got := c.latency(k, &c.kinds[k], s); got != want {
					t.Errorf("pass %d: %s/%s of %d bytes: %d ns, want %d", pass, cr.call, cr.row, s, got, want)
				}
			}
		}
	}
}

// TestCostMeterHoleIndex places random small and large requests and checks
// each small one against a pass over every mapped page: the shortest hole
// that holds it, of the oldest page, at the lowest offset; or a new page
// when none does.
func TestCostMeterHoleIndex(t *testing.T) {
	c := newCostMeter(DefaultCostModel())
	rng := rand.New(rand.NewPCG(3, 4))
	pages := map[*driverPage]bool{}
	var live []uint64
	sizes := map[uint64]uint64{}
	next := uint64(1 << 40)
	for i := 0; i < 20000; i++ {
		if len(live) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(live))
			addr := live[k]
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
			if pl, ok := c.placed.Get(addr); ok && pl.page.live == 1 {
				delete(pages, pl.page)
			}
			c.free(addr, sizes[addr])
			continue
		}
		size := uint64(rng.IntN(1<<20)) + 1
		if rng.IntN(8) == 0 {
			size = uint64(rng.IntN(8<<20)) + 1
		}
		n := (size + SubAllocGranularity - 1) / SubAllocGranularity * SubAllocGranularity
		var want *driverPage
		var wantOff, wantLen uint64
		for p := range pages {
			for _, h := range p.holes {
				if h.len < n {
					continue
				}
				if want == nil || h.len < wantLen || h.len == wantLen && (p.seq < want.seq || p.seq == want.seq && h.off < wantOff) {
					want, wantOff, wantLen = p, h.off, h.len
				}
			}
		}
		addr := next
		next += 4 << 20
		c.alloc(addr, size)
		live = append(live, addr)
		sizes[addr] = size
		if size > SubAllocMax {
			continue
		}
		pl, ok := c.placed.Get(addr)
		if !ok {
			t.Fatalf("op %d: %d bytes not placed", i, size)
		}
		pages[pl.page] = true
		if want == nil {
			if pl.off != 0 || pl.page.live != 1 {
				t.Fatalf("op %d: %d bytes at %d of page %d, want a new page", i, size, pl.off, pl.page.seq)
			}
		} else if pl.page != want || pl.off != wantOff {
			t.Fatalf("op %d: %d bytes at %d of page %d, want %d of page %d", i, size, pl.off, pl.page.seq, wantOff, want.seq)
		}
	}
	if c.pages != len(pages) {
		t.Errorf("%d pages counted, %d mapped", c.pages, len(pages))
	}
}

// TestFreedSizes compares freedSizes with a Go map bounded as it is, over
// random frees and mallocs of sizes on the driver's step and off it, past
// the bound.
func TestFreedSizes(t *testing.T) {
	var f freedSizes
	ref := map[uint64]int{}
	rng := rand.New(rand.NewPCG(5, 6))
	size := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return uint64(rng.IntN(memoMaxSize/SubAllocGranularity)+1) * SubAllocGranularity
		case 1:
			return uint64(rng.IntN(1<<16)+1)*SubAllocGranularity + memoMaxSize
		}
		return uint64(rng.IntN(1<<24)) | 1
	}
	for i := 0; i < 200000; i++ {
		s := size()
		if i > 100000 && rng.IntN(2) == 0 {
			_, want := ref[s]
			if want {
				if ref[s]--; ref[s] == 0 {
					delete(ref, s)
				}
			}
			if got := f.take(s); got != want {
				t.Fatalf("op %d: take(%d) = %v, want %v", i, s, got, want)
			}
			continue
		}
		if ref[s] > 0 || len(ref) < maxFreedSizes {
			ref[s]++
		}
		f.add(s)
		if f.sizes != len(ref) {
			t.Fatalf("op %d: %d sizes, want %d", i, f.sizes, len(ref))
		}
	}
}

// wakeModel is the cost model of sim/testdata/wake.txt.
const wakeModel = `api,size_bytes,median_us
cudaMalloc,512,50
cudaMalloc,67108864,50
cudaFree,512,40
cudaFree,67108864,40
cudaMalloc_suballoc,512,2
cudaFree_suballoc,512,3
wake,10000000,200
wake,1000000,100
wake_next,1000000,20
wake_next,10000000,60
wake_suballoc,1000000,30
wake_suballoc_next,1000000,5
`

func TestWake(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(wakeModel), "wake.csv")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("testdata/wake.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, evs, err := trace.ParseText("wake.txt", f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		model       *CostModel
		evs         []trace.Event
		total, woke int64
	}{
		{"timed", m, evs, 670103, 395103},
		{"without wake-ups", m.WithoutWake(), evs, 275000, 0},
		{"untimed", m, untimed(evs), 275000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Run(trace.NewSliceSource(h, tc.evs), Config{Policy: "cuda", CostModel: tc.model})
			if err != nil {
				t.Fatal(err)
			}
			r := res[0]
			if r.SimAllocTimeNS != tc.total || r.SimWakeTimeNS != tc.woke {
				t.Errorf("sim_alloc_time_ns %d, sim_wake_time_ns %d; want %d and %d", r.SimAllocTimeNS, r.SimWakeTimeNS, tc.total, tc.woke)
			}
		})
	}
}

// untimed returns a copy of evs a nanosecond apart.
func untimed(evs []trace.Event) []trace.Event {
	out := append([]trace.Event(nil), evs...)
	for i := range out {
		out[i].Time = int64(i)
	}
	return out
}

func TestWakeCurve(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(wakeModel), "wake.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		row   string
		gap   int64
		want  int64
		woken bool
	}{
		{CostWake, 999999, 0, false},      // below the first idle time
		{CostWake, 1000000, 100000, true}, // a point
		{CostWake, 3162278, 150000, true}, // halfway in log(gap)
		{CostWake, 10000000, 200000, true},
		{CostWake, 5000000000, 200000, true}, // beyond: flat
		{CostWakeSuballocNext, 1 << 40, 5000, true},
		{"cudaMalloc", 1000000, 0, false}, // not a wake-up row
	} {
		got, ok := m.Wake(tc.row, tc.gap)
		if got != tc.want || ok != tc.woken {
			t.Errorf("Wake(%s, %d) = %d, %v; want %d, %v", tc.row, tc.gap, got, ok, tc.want, tc.woken)
		}
	}
	// A repeated idle time: the last row given counts.
	m2, err := ParseCostModel(strings.NewReader(wakeModel+"wake,1000000,150\n"), "w.csv")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := m2.Wake(CostWake, 1000000); got != 150000 {
		t.Errorf("a repeated idle time: %d ns, want the last row's 150000", got)
	}
	_, err = ParseCostModel(strings.NewReader(wakeModel+"wake,0,3\n"), "w.csv")
	if err == nil || !strings.Contains(err.Error(), "w.csv:14: wake: idle time 0") {
		t.Errorf("a wake-up row at idle time 0: %v", err)
	}
}

// TestCostModelMean: a model with a mean_us column (replay calibrate's)
// charges a row's mean where given, its median where the cell is empty,
// and names the column of a bad value.
func TestCostModelMean(t *testing.T) {
	m, err := ParseCostModel(strings.NewReader(`api,size_bytes,n,first_us,median_us,p90_us,min_us,mean_us
cudaMalloc,2097152,10,1,40.00,50,30,55.50
cudaFree,2097152,10,1,20.00,30,10,
cudaMalloc_suballoc,4096,10,1,3.00,4,2,3.50
cudaFree_suballoc,4096,10,1,3.00,4,2,
`), "m.csv")
	if err != nil {
		t.Fatal(err)
	}
	if ns, _ := m.Latency(CostMalloc, 2<<20); ns != 55500 {
		t.Errorf("cudaMalloc of 2 MiB: %d ns, want the mean 55500", ns)
	}
	if ns, _ := m.Latency(CostFree, 2<<20); ns != 20000 {
		t.Errorf("cudaFree of 2 MiB: %d ns, want the median 20000 (no mean)", ns)
	}
	_, err = ParseCostModel(strings.NewReader("api,size_bytes,median_us,mean_us\ncudaMalloc,1,2,x\n"), "bad.csv")
	if err == nil || !strings.Contains(err.Error(), `mean_us "x": not a latency`) {
		t.Errorf("a bad mean: %v", err)
	}
}

// TestCostModelMade: replay calibrate's first line says where and when
// the model was made; Describe adds it to the model's name, and errors
// count it as the file's first line.
func TestCostModelMade(t *testing.T) {
	const body = "api,size_bytes,median_us\ncudaMalloc,1,2\ncudaFree,1,2\ncudaMalloc_suballoc,1,2\ncudaFree_suballoc,1,2\n"
	m, err := ParseCostModel(strings.NewReader("# made by replay calibrate on NVIDIA H200 (CUDA runtime 13000, driver 13000), 2026-12-03T17:25:00Z\n"+body), "cal.csv")
	if err != nil {
		t.Fatal(err)
	}
	if want := "cal.csv (made by replay calibrate on NVIDIA H200 (CUDA runtime 13000, driver 13000), 2026-12-03T17:25:00Z)"; m.Describe() != want {
		t.Errorf("Describe: %q, want %q", m.Describe(), want)
	}
	if m, _ := ParseCostModel(strings.NewReader(body), "old.csv"); m.Made != "" || m.Describe() != "old.csv" {
		t.Errorf("a model without the line: made %q, described %q", m.Made, m.Describe())
	}
	_, err = ParseCostModel(strings.NewReader("# note\napi,size_bytes,median_us\ncudaMalloc,x,2\n"), "bad.csv")
	var ce *CostError
	if !errors.As(err, &ce) || ce.Line != 3 {
		t.Errorf("a bad size on the third line: %v", err)
	}
}
