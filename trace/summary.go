package trace

import (
	"fmt"
	"strconv"
)

// Summary is a trace's statistics as replay stats --json writes them:
// counts by op and by memory kind, peaks and live bytes at the end in
// bytes, the distributions of malloc sizes (bytes) and lifetimes
// (nanoseconds), and the streams and threads.
type Summary struct {
	Trace         string            `json:"trace"`
	Source        string            `json:"source"`
	Device        string            `json:"device,omitempty"`
	DeviceMemory  uint64            `json:"device_memory_bytes,omitempty"`
	Events        int64             `json:"events"`
	DurationNs    int64             `json:"duration_ns"`
	Ops           map[string]int64  `json:"ops"`
	Mallocs       map[string]int64  `json:"mallocs_by_kind"`
	PoolMallocs   map[string]int64  `json:"mallocs_by_pool,omitempty"` // private pools only, by name
	PeakLive      uint64            `json:"peak_live_bytes"`
	PeakLiveEvent int64             `json:"peak_live_event"`
	PeakPinned    uint64            `json:"peak_pinned_bytes"`
	PeakManaged   uint64            `json:"peak_managed_bytes"`
	LiveAtEnd     int               `json:"live_at_end"`
	LiveBytes     uint64            `json:"live_bytes_at_end"`
	UnknownFrees  int64             `json:"unknown_frees"`
	Sizes         HistogramSummary  `json:"sizes_bytes"`
	Lifetimes     HistogramSummary  `json:"lifetimes_ns"`
	Streams       map[string]any    `json:"streams"`
	Threads       map[string]int64  `json:"threads"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// HistogramSummary is a Histogram as a Summary shows it: the quantiles are
// the upper bounds of their buckets, and Buckets counts by each bucket's
// lower bound.
type HistogramSummary struct {
	Count   int64            `json:"count"`
	Min     uint64           `json:"min"`
	Max     uint64           `json:"max"`
	Mean    float64          `json:"mean"`
	P50     uint64           `json:"p50_at_most"`
	P90     uint64           `json:"p90_at_most"`
	P99     uint64           `json:"p99_at_most"`
	Buckets map[string]int64 `json:"buckets"` // by the bucket's lower bound
}

func (h *Histogram) summary() HistogramSummary {
	out := HistogramSummary{Count: h.Count, Min: h.Min, Max: h.Max, P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), Buckets: map[string]int64{}}
	if h.Count > 0 {
		out.Mean = h.Sum / float64(h.Count)
	}
	for b, n := range h.Buckets {
		if n > 0 {
			lo, _ := BucketRange(b)
			out.Buckets[strconv.FormatUint(lo, 10)] = n
		}
	}
	return out
}

// SummaryOps lists the ops in the order summaries and tables show them.
var SummaryOps = []Op{
	OpMalloc, OpFree, OpFreeRequested, OpMallocFailed, OpStreamSync,
	OpDeviceSync, OpEventRecord, OpStreamWaitEvent, OpEventSync, OpEmptyCache,
	OpSegmentAlloc, OpSegmentFree, OpSegmentMap, OpSegmentUnmap, OpMarker, OpPoolRelease,
}

// SummaryKinds lists the memory kinds in the order summaries and tables
// show them.
var SummaryKinds = []Kind{KindDevice, KindAsync, KindPinned, KindManaged}

// Summary returns the summary of the trace at path with header h.
func (s *Stats) Summary(path string, h Header) Summary {
	n, b := s.LiveBytes()
	d := Summary{
		Trace: path, Source: h.Source, Device: h.Device, DeviceMemory: h.DeviceMemory, Events: s.Events, DurationNs: s.LastTime - s.FirstTime,
		Ops: map[string]int64{}, Mallocs: map[string]int64{},
		PeakLive: s.PeakLive, PeakLiveEvent: s.PeakLiveEvent, PeakPinned: s.PeakPinned, PeakManaged: s.PeakManaged,
		LiveAtEnd: n, LiveBytes: b, UnknownFrees: s.UnknownFrees,
		Sizes: s.Sizes.summary(), Lifetimes: s.Lifetimes.summary(),
		Streams: map[string]any{}, Threads: map[string]int64{}, Metadata: h.Metadata,
	}
	for _, op := range SummaryOps {
		if c := s.Ops(op); c > 0 {
			d.Ops[op.String()] = c
		}
	}
	for _, k := range SummaryKinds {
		if c := s.Mallocs(k); c > 0 {
			d.Mallocs[k.String()] = c
		}
	}
	names := PoolNames(h)
	for id, n := range s.PoolMallocs {
		if d.PoolMallocs == nil {
			d.PoolMallocs = map[string]int64{}
		}
		d.PoolMallocs[PoolLabel(names, id)] = n
	}
	for id, st := range s.Streams {
		d.Streams[fmt.Sprintf("%#x", id)] = st
	}
	for id, c := range s.Threads {
		d.Threads[strconv.FormatUint(id, 10)] = c
	}
	return d
}
