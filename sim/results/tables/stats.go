package tables

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/trace"
)

// UnrecordedNote says what the trace's source does not record (its
// Metadata "unrecorded"), and so what the events lack; "" when it records
// all.
func UnrecordedNote(h trace.Header) string {
	var parts []string
	for _, u := range []struct{ what, lack string }{
		{trace.UnrecordedStreams, "streams (every event is on stream 0)"},
		{trace.UnrecordedTimes, "times (every event is at time 0, and no lifetime is known)"},
		{trace.UnrecordedSegmentFrees, "device frees (no segment_free)"},
		{trace.UnrecordedSegments, "device calls (no segment event)"},
		// A torch.profiler trace's (trace/kineto).
		{"requested sizes", "requested sizes (each size is the allocator's block)"},
		{"free completions", "when frees complete (each free is where the program asked for it: a block in use on another stream is reused only later)"},
		{"allocator settings", "the allocator settings (--set)"},
		{"memory cap", "the memory cap (--capacity)"},
	} {
		if h.Unrecorded(u.what) {
			parts = append(parts, u.lack)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "not in the recording: " + strings.Join(parts, ", ")
}

// HumanBytes formats a byte count with a binary unit.
func HumanBytes(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, u := float64(b), 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%d B", b)
	}
	return fmt.Sprintf("%.1f %s", v, units[u])
}

// HumanNs formats nanoseconds with a time unit.
func HumanNs(ns uint64) string {
	switch {
	case ns < 1000:
		return fmt.Sprintf("%d ns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.1f µs", float64(ns)/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
	case ns < 3600e9:
		return fmt.Sprintf("%.1f s", float64(ns)/1e9)
	}
	return fmt.Sprintf("%.1f h", float64(ns)/3600e9)
}

func hist(w io.Writer, title string, h *trace.Histogram, format func(uint64) string) {
	fmt.Fprintf(w, "%s: %d", title, h.Count)
	if h.Count == 0 {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, ", min %s, p50 <= %s, p90 <= %s, p99 <= %s, max %s\n", format(h.Min),
		format(h.Quantile(0.5)), format(h.Quantile(0.9)), format(h.Quantile(0.99)), format(h.Max))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for b, n := range h.Buckets {
		if n == 0 {
			continue
		}
		lo, hi := trace.BucketRange(b)
		bar := strings.Repeat("#", int(1+49*n/maxBucket(h)))
		fmt.Fprintf(tw, "  [%s,\t%s)\t%d\t%.1f%%\t %s\n", format(lo), format(hi), n, 100*float64(n)/float64(h.Count), bar)
	}
	tw.Flush()
}

func maxBucket(h *trace.Histogram) int64 {
	var m int64
	for _, n := range h.Buckets {
		m = max(m, n)
	}
	return max(m, 1)
}

func Stats(w io.Writer, path string, h trace.Header, s *trace.Stats, top int) {
	// A trace whose times are logical steps (a MiniMalloc problem's
	// lower and upper) shows them as steps, not as nanoseconds.
	times := HumanNs
	if h.Metadata["time"] == "logical" {
		times = func(n uint64) string { return fmt.Sprintf("%d steps", n) }
	}
	if h.Unrecorded(trace.UnrecordedTimes) {
		fmt.Fprintf(w, "%s: %s trace, %d events\n", termsafe.String(path), termsafe.String(h.Source), s.Events)
	} else {
		fmt.Fprintf(w, "%s: %s trace, %d events over %s\n", termsafe.String(path), termsafe.String(h.Source), s.Events, times(uint64(max(s.LastTime-s.FirstTime, 0))))
	}
	if n := UnrecordedNote(h); n != "" {
		fmt.Fprintln(w, n)
	}
	if c := h.Metadata["device_calls"]; c != "" {
		fmt.Fprintf(w, "device calls: %s\n", termsafe.String(c))
	}
	if n := termsafe.String(TruncatedNote(h)); n != "" {
		fmt.Fprintln(w, n)
	}
	switch {
	case h.DeviceMemory != 0:
		fmt.Fprintf(w, "card: %s, %s (%d bytes)\n", termsafe.String(cmp.Or(h.Device, "unnamed")), HumanBytes(h.DeviceMemory), h.DeviceMemory)
	case h.Device != "":
		fmt.Fprintf(w, "card: %s\n", termsafe.String(h.Device))
	}
	var calls []string
	for k, v := range h.Metadata {
		if name, ok := strings.CutPrefix(k, "calls."); ok {
			c := name + " " + v
			if f := h.Metadata["failed."+name]; f != "" {
				c += " (" + f + " failed)"
			}
			calls = append(calls, c)
		}
	}
	if len(calls) > 0 {
		slices.Sort(calls)
		fmt.Fprintf(w, "recorded calls: %s\n", termsafe.String(strings.Join(calls, ", ")))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ops:")
	for _, op := range trace.SummaryOps {
		if c := s.Ops(op); c > 0 {
			fmt.Fprintf(tw, "  %s\t%d\n", op, c)
		}
	}
	tw.Flush()
	var parts []string
	for _, k := range trace.SummaryKinds {
		if c := s.Mallocs(k); c > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, c))
		}
	}
	fmt.Fprintf(w, "mallocs by kind: %s\n", strings.Join(parts, ", "))
	if len(s.PoolMallocs) > 0 {
		names := trace.PoolNames(h)
		ids := slices.Sorted(maps.Keys(s.PoolMallocs))
		parts = parts[:0]
		for _, id := range ids {
			parts = append(parts, fmt.Sprintf("%s %d", trace.PoolLabel(names, id), s.PoolMallocs[id]))
		}
		fmt.Fprintf(w, "mallocs into private pools: %s\n", termsafe.String(strings.Join(parts, ", ")))
	}
	if s.PeakLiveEvent >= 0 {
		fmt.Fprintf(w, "peak live requested device bytes: %s (%d) at event %d\n", HumanBytes(s.PeakLive), s.PeakLive, s.PeakLiveEvent)
	}
	if s.DirectMallocs > 0 {
		fmt.Fprintf(w, "device mallocs by CUDA libraries, around the allocator: %d, peak live %s (%d)\n", s.DirectMallocs, HumanBytes(s.PeakDirect), s.PeakDirect)
	}
	if s.PeakPinned > 0 || s.PeakManaged > 0 {
		fmt.Fprintf(w, "peak live pinned: %s, managed: %s\n", HumanBytes(s.PeakPinned), HumanBytes(s.PeakManaged))
	}
	n, b := s.LiveBytes()
	fmt.Fprintf(w, "live at the end: %d allocations, %s\n", n, HumanBytes(b))
	if s.UnknownFrees > 0 {
		fmt.Fprintf(w, "frees of an address not live: %d\n", s.UnknownFrees)
	}
	hist(w, "sizes (mallocs, requested bytes)", &s.Sizes, HumanBytes)
	if !h.Unrecorded(trace.UnrecordedTimes) {
		hist(w, "lifetimes (malloc to free)", &s.Lifetimes, times)
	}

	ids := make([]uint64, 0, len(s.Streams))
	for id := range s.Streams {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := s.Streams[ids[i]], s.Streams[ids[j]]
		return a.Events > b.Events || a.Events == b.Events && ids[i] < ids[j]
	})
	fmt.Fprintf(w, "streams: %d\n", len(ids))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, id := range ids {
		if i == top {
			fmt.Fprintf(tw, "  ... %d more\t\n", len(ids)-top)
			break
		}
		st := s.Streams[id]
		fmt.Fprintf(tw, "  %#x\t%d events\t%d mallocs\t%s\t\n", id, st.Events, st.Mallocs, HumanBytes(st.Bytes))
	}
	tw.Flush()
	th := make([]uint64, 0, len(s.Threads))
	for id := range s.Threads {
		th = append(th, id)
	}
	sort.Slice(th, func(i, j int) bool {
		return s.Threads[th[i]] > s.Threads[th[j]] || s.Threads[th[i]] == s.Threads[th[j]] && th[i] < th[j]
	})
	fmt.Fprintf(w, "threads: %d\n", len(th))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, id := range th {
		if i == top {
			fmt.Fprintf(tw, "  ... %d more\t\n", len(th)-top)
			break
		}
		fmt.Fprintf(tw, "  %d\t%d events\t\n", id, s.Threads[id])
	}
	tw.Flush()
}

// TruncatedNote says that a snapshot's history was cut and rebuilt (the
// importer's truncated and reconstructed_events), "" for a whole one.
func TruncatedNote(h trace.Header) string {
	if h.Metadata["truncated"] != "true" {
		return ""
	}
	return fmt.Sprintf("truncated history (it starts mid-run): its first %s events rebuild the state before its first entry", h.Metadata["reconstructed_events"])
}
