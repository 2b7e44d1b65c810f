package trace

import (
	"math/bits"
	"sort"
)

// Histogram counts values in power-of-two buckets: bucket 0 holds 0 and
// bucket b >= 1 holds [2^(b-1), 2^b).
type Histogram struct {
	Buckets [65]int64
	Count   int64
	Sum     float64
	Min     uint64
	Max     uint64
}

// Add counts v.
func (h *Histogram) Add(v uint64) {
	if h.Count == 0 || v < h.Min {
		h.Min = v
	}
	h.Max = max(h.Max, v)
	h.Count++
	h.Sum += float64(v)
	h.Buckets[bits.Len64(v)]++
}

// BucketRange returns the values of bucket b: [lo, hi).
func BucketRange(b int) (lo, hi uint64) {
	if b == 0 {
		return 0, 1
	}
	if b == 64 {
		return 1 << 63, ^uint64(0)
	}
	return 1 << (b - 1), 1 << b
}

// Quantile returns an upper bound of the q-quantile (0 <= q <= 1) of the
// values: the top of the bucket that holds it, or Max when that is lower.
// It returns 0 when the histogram is empty.
func (h *Histogram) Quantile(q float64) uint64 {
	if h.Count == 0 {
		return 0
	}
	rank := int64(q * float64(h.Count))
	if rank >= h.Count {
		rank = h.Count - 1
	}
	var seen int64
	for b, n := range h.Buckets {
		seen += n
		if seen > rank {
			_, hi := BucketRange(b)
			if b < 64 {
				hi-- // the largest value of the bucket
			}
			return min(hi, h.Max)
		}
	}
	return h.Max
}

// LiveAlloc is an allocation live at some point of a trace.
type LiveAlloc struct {
	Addr   uint64
	Size   uint64 // requested bytes
	Stream uint64
	Kind   Kind
	Thread uint64
	Event  int64 // index of its malloc
	Time   int64 // time of its malloc, ns
	Label  string
}

// StreamStats counts the events of one stream.
type StreamStats struct {
	Events  int64  // events issued on the stream
	Mallocs int64  // successful mallocs
	Bytes   uint64 // bytes those mallocs requested
}

// Stats summarizes a trace, one event at a time: counts by op and memory
// kind, the distribution of requested sizes and of lifetimes, the peak of
// live requested bytes, streams and threads, and the allocations live at
// the end. Its memory grows with the live allocations, the streams and the
// threads, never with the trace's length.
type Stats struct {
	// Events is the number of events added.
	Events int64
	// FirstTime and LastTime are the times of the first and last events, ns.
	FirstTime, LastTime int64
	// Sizes are the requested sizes of successful mallocs, bytes.
	Sizes Histogram
	// Lifetimes are the times from a malloc to its free, ns.
	Lifetimes Histogram
	// PeakLive is the peak of live requested bytes of device memory (kinds
	// device and async), reached first at event PeakLiveEvent (-1: none).
	PeakLive      uint64
	PeakLiveEvent int64
	// PeakPinned and PeakManaged are the peaks of live pinned host and
	// managed bytes.
	PeakPinned, PeakManaged uint64
	// DirectMallocs counts the device mallocs that CUDA libraries made
	// around the allocator (DirectSite), which PeakLive leaves out;
	// PeakDirect is their peak live bytes.
	DirectMallocs int64
	PeakDirect    uint64
	// UnknownFrees counts frees of an address that was not live.
	UnknownFrees int64
	// PoolMallocs counts the successful mallocs into each private pool
	// (Event.Pool; the default pools are not counted).
	PoolMallocs map[uint32]int64
	// Streams and Threads count events by stream and by host thread (0:
	// unknown thread).
	Streams map[uint64]*StreamStats
	Threads map[uint64]int64

	ops     [numOps]int64
	mallocs [numKinds]int64
	live    AddrMap[LiveAlloc]
	cur     [numKinds]uint64
	direct  uint64 // live bytes of direct mallocs
}

// NewStats returns an empty Stats.
func NewStats() *Stats {
	return &Stats{
		PeakLiveEvent: -1,
		Streams:       map[uint64]*StreamStats{},
		Threads:       map[uint64]int64{},
		PoolMallocs:   map[uint32]int64{},
	}
}

// Ops returns the number of events of op.
func (s *Stats) Ops(op Op) int64 {
	if op.Valid() {
		return s.ops[op]
	}
	return 0
}

// Mallocs returns the number of successful mallocs of memory kind k.
func (s *Stats) Mallocs(k Kind) int64 {
	if k < numKinds {
		return s.mallocs[k]
	}
	return 0
}

// hasStream reports whether op is issued on a stream.
func hasStream(op Op) bool {
	switch op {
	case OpMalloc, OpMallocFailed, OpFree, OpFreeRequested, OpStreamSync, OpEventRecord, OpStreamWaitEvent:
		return true
	}
	return false
}

// Add accounts for ev, the next event.
func (s *Stats) Add(ev Event) {
	i := s.Events
	if i == 0 {
		s.FirstTime = ev.Time
	}
	s.Events++
	s.LastTime = ev.Time
	if ev.Op.Valid() {
		s.ops[ev.Op]++
	}
	s.Threads[ev.Thread]++
	if hasStream(ev.Op) {
		st := s.Streams[ev.Stream]
		if st == nil {
			st = &StreamStats{}
			s.Streams[ev.Stream] = st
		}
		st.Events++
		if ev.Op == OpMalloc {
			st.Mallocs++
			st.Bytes += ev.Size
		}
	}
	switch ev.Op {
	case OpMalloc:
		if ev.Kind >= numKinds {
			return
		}
		s.mallocs[ev.Kind]++
		if ev.Pool != 0 {
			s.PoolMallocs[ev.Pool]++
		}
		s.Sizes.Add(ev.Size)
		p, had := s.live.Ref(ev.Addr)
		if had {
			// A malloc over a live address: the old one is gone.
			s.take(*p)
		}
		*p = LiveAlloc{ev.Addr, ev.Size, ev.Stream, ev.Kind, ev.Thread, i, ev.Time, ev.Label}
		if IsDirect(ev.Kind, ev.Label) {
			s.DirectMallocs++
			s.direct += ev.Size
			s.PeakDirect = max(s.PeakDirect, s.direct)
			return
		}
		s.cur[ev.Kind] += ev.Size
		switch ev.Kind {
		case KindPinned:
			s.PeakPinned = max(s.PeakPinned, s.cur[KindPinned])
		case KindManaged:
			s.PeakManaged = max(s.PeakManaged, s.cur[KindManaged])
		default:
			if d := s.cur[KindDevice] + s.cur[KindAsync]; d > s.PeakLive {
				s.PeakLive, s.PeakLiveEvent = d, i
			}
		}
	case OpFree:
		a, ok := s.live.Take(ev.Addr)
		if !ok {
			s.UnknownFrees++
			return
		}
		s.take(a)
		s.Lifetimes.Add(uint64(max(ev.Time-a.Time, 0)))
	}
}

// IsDirect reports whether a malloc of kind k from call site label is one
// a CUDA library made around the allocator: device memory (k.OnDevice)
// from a DirectSite.
func IsDirect(k Kind, label string) bool {
	return k.OnDevice() && label != "" && DirectSite(label)
}

// take takes the live allocation a out of the live bytes.
func (s *Stats) take(a LiveAlloc) {
	if IsDirect(a.Kind, a.Label) {
		s.direct -= a.Size
		return
	}
	s.cur[a.Kind] -= a.Size
}

// LiveBytes returns the number of allocations live after the events added
// and their requested bytes.
func (s *Stats) LiveBytes() (n int, bytes uint64) {
	for _, c := range s.cur {
		bytes += c
	}
	return s.live.Len(), bytes + s.direct
}

// Live returns the allocations live after the events added, in the order
// of their mallocs.
func (s *Stats) Live() []LiveAlloc {
	out := make([]LiveAlloc, 0, s.live.Len())
	for _, a := range s.live.All() {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Event < out[j].Event })
	return out
}
