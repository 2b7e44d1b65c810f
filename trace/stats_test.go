package trace

import (
	"strings"
	"testing"
)

func TestStats(t *testing.T) {
	const text = `
malloc id=1 size=1000 t=0 thread=1
malloc id=2 size=4KiB stream=7 kind=async t=10 thread=2
malloc id=3 size=100 kind=pinned t=20 thread=1
stream_sync stream=7 t=30 thread=2
free id=1 t=1000 thread=1
malloc id=4 size=3000 t=1010 thread=1 label=site
free id=2 stream=7 t=5010 thread=2
free id=9 t=5020 thread=1
malloc_failed size=1TiB t=5030 thread=1
`
	_, evs, err := ParseText("s.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	s := NewStats()
	for _, ev := range evs {
		s.Add(ev)
	}
	if s.Events != 9 || s.Ops(OpMalloc) != 4 || s.Ops(OpFree) != 3 || s.Ops(OpMallocFailed) != 1 || s.Ops(OpStreamSync) != 1 {
		t.Errorf("counts: %d events, %d mallocs, %d frees", s.Events, s.Ops(OpMalloc), s.Ops(OpFree))
	}
	if s.Mallocs(KindDevice) != 2 || s.Mallocs(KindAsync) != 1 || s.Mallocs(KindPinned) != 1 {
		t.Errorf("mallocs by kind")
	}
	// Device bytes: 1000, +4096 (peak 5096 at event 1), -1000, +3000 (7096 at event 5).
	if s.PeakLive != 7096 || s.PeakLiveEvent != 5 || s.PeakPinned != 100 {
		t.Errorf("peak %d at %d, pinned %d", s.PeakLive, s.PeakLiveEvent, s.PeakPinned)
	}
	if s.UnknownFrees != 1 || s.FirstTime != 0 || s.LastTime != 5030 {
		t.Errorf("unknown frees %d, times %d..%d", s.UnknownFrees, s.FirstTime, s.LastTime)
	}
	if s.Lifetimes.Count != 2 || s.Lifetimes.Min != 1000 || s.Lifetimes.Max != 5000 {
		t.Errorf("lifetimes %+v", s.Lifetimes)
	}
	if s.Sizes.Count != 4 || s.Sizes.Buckets[10] != 1 || s.Sizes.Buckets[13] != 1 || s.Sizes.Buckets[12] != 1 || s.Sizes.Buckets[7] != 1 {
		t.Errorf("sizes %+v", s.Sizes.Buckets[:16])
	}
	if st := s.Streams[7]; st == nil || st.Events != 3 || st.Mallocs != 1 || st.Bytes != 4096 || s.Threads[1] != 6 || s.Threads[2] != 3 {
		t.Errorf("streams %+v threads %v", s.Streams, s.Threads)
	}
	live := s.Live()
	if n, b := s.LiveBytes(); n != 2 || b != 3100 || len(live) != 2 || live[0].Addr != 3 || live[1].Addr != 4 || live[1].Label != "site" || live[1].Event != 5 {
		t.Errorf("live %d %d %+v", n, b, live)
	}
}

func TestHistogramQuantile(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 {
		t.Error("empty")
	}
	for _, v := range []uint64{0, 1, 3, 5, 100, 1000} {
		h.Add(v)
	}
	for q, want := range map[float64]uint64{0: 0, 0.2: 1, 0.4: 3, 0.5: 7, 0.8: 127, 1: 1000} {
		if got := h.Quantile(q); got != want {
			t.Errorf("Quantile(%v) = %d, want %d", q, got, want)
		}
	}
	lo, hi := BucketRange(11)
	if lo != 1024 || hi != 2048 {
		t.Errorf("bucket 11: [%d, %d)", lo, hi)
	}
}

// TestSummary checks a summary's counts, peaks and histograms on a small
// trace.
func TestSummary(t *testing.T) {
	h, evs, err := ParseText("s.txt", strings.NewReader("malloc id=1 size=1000 t=0\nmalloc id=2 size=3000 kind=pinned t=5\nfree id=1 t=100\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := NewStats()
	for _, ev := range evs {
		s.Add(ev)
	}
	sum := s.Summary("s.txt", h)
	if sum.Trace != "s.txt" || sum.Events != 3 || sum.DurationNs != 100 || sum.Ops["malloc"] != 2 || sum.Ops["free"] != 1 ||
		sum.Mallocs["device"] != 1 || sum.Mallocs["pinned"] != 1 || sum.PeakLive != 1000 || sum.PeakPinned != 3000 ||
		sum.LiveAtEnd != 1 || sum.Sizes.Count != 2 || sum.Sizes.Min != 1000 || sum.Sizes.Max != 3000 || sum.Lifetimes.Count != 1 {
		t.Errorf("summary: %+v", sum)
	}
}

// TestStatsDirect: the device mallocs of CUDA libraries (DirectSite) are
// counted apart and left out of the peak of live requested bytes.
func TestStatsDirect(t *testing.T) {
	const text = `
malloc id=1 size=1000 label=cuMemMap@xla_cuda_plugin.so+0x10
malloc id=2 size=65536 label=cuMemAlloc@libcublas.so.13+0x5b45ee
malloc id=3 size=4 label=cuMemAlloc@libcudnn_graph.so.9+0x2a05fe
free id=3
malloc id=4 size=3000 label=cuMemAlloc@libc10_cuda.so+0x99
free id=1
`
	_, evs, err := ParseText("d.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	s := NewStats()
	for _, ev := range evs {
		s.Add(ev)
	}
	// Live requested: 1000, then +3000 at event 4 = 4000; direct: 65536+4.
	n, live := s.LiveBytes()
	if s.PeakLive != 4000 || s.PeakLiveEvent != 4 || s.DirectMallocs != 2 || s.PeakDirect != 65540 || n != 2 || live != 3000+65536 {
		t.Errorf("peak live %d at %d, direct %d peak %d, live %d allocations %d bytes", s.PeakLive, s.PeakLiveEvent, s.DirectMallocs, s.PeakDirect, n, live)
	}
	for label, want := range map[string]bool{"cuMemAlloc@libnccl.so.2+0x1": true, "cudaMalloc@libc10_cuda.so+0x2f4cb": false, "libcublas": false, "": false} {
		if DirectSite(label) != want {
			t.Errorf("DirectSite(%q) = %v", label, !want)
		}
	}
}
