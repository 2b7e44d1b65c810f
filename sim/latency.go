package sim

import (
	"math/bits"
	"sort"
)

// sizeClassBounds are the upper bounds in bytes of the size classes, powers
// of four from 1 KiB to 4 GiB; sizes above the last fall in ">4GiB".
var sizeClassBounds = []uint64{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30}

var sizeClassNames = [numSizeClasses]string{"<=1KiB", "<=4KiB", "<=16KiB", "<=64KiB", "<=256KiB", "<=1MiB", "<=4MiB", "<=16MiB", "<=64MiB", "<=256MiB", "<=1GiB", "<=4GiB", ">4GiB"}

// numSizeClasses is the number of size classes.
const numSizeClasses = 13

// noSize is the size class index of calls without a size.
const noSize = -1

// SizeClass returns the name of the size class of size bytes; a size of 0
// means a call without a size and gives "-".
func SizeClass(size uint64) string {
	c := sizeClass(size)
	if c == noSize {
		return "-"
	}
	return sizeClassNames[c]
}

func sizeClass(size uint64) int {
	switch {
	case size == 0:
		return noSize
	case size <= sizeClassBounds[0]:
		return 0
	}
	// size <= 2^l; the bounds are 2^10, 2^12, ..., 2^32.
	l := bits.Len64(size - 1)
	return min((l-9)/2, len(sizeClassBounds))
}

// Latencies accumulates call latencies by call and size class. The zero
// value is ready to use; memory stays bounded whatever the number of calls.
type Latencies struct {
	// calls are few (a dozen names at most), so a slice searched in order
	// is faster than a map; the names are mostly constants, compared by
	// pointer first.
	calls []callLatencies
}

type callLatencies struct {
	call    string
	classes [numSizeClasses + 1]*histogram // by size class; the last for no size
}

func (c *callLatencies) hist(class int) *histogram {
	if class == noSize {
		class = numSizeClasses
	}
	h := c.classes[class]
	if h == nil {
		h = &histogram{}
		c.classes[class] = h
	}
	return h
}

// Add records one call of call on size bytes (0 for a call without a size)
// that took ns nanoseconds.
func (l *Latencies) Add(call string, size uint64, ns int64) {
	l.hist(call, sizeClass(size)).add(ns)
}

// hist returns the histogram of call in size class class (noSize for
// calls without a size), made when new. It stays valid as calls are added.
func (l *Latencies) hist(call string, class int) *histogram {
	for i := range l.calls {
		if c := &l.calls[i]; c.call == call {
			return c.hist(class)
		}
	}
	l.calls = append(l.calls, callLatencies{call: call})
	return l.calls[len(l.calls)-1].hist(class)
}

// each calls f for every histogram of the calls named in calls, or of
// every call when none is named.
func (l *Latencies) each(calls []string, f func(call string, class int, h *histogram)) {
	for i := range l.calls {
		c := &l.calls[i]
		if len(calls) > 0 && !contains(calls, c.call) {
			continue
		}
		for class, h := range c.classes {
			if h != nil {
				if class == numSizeClasses {
					class = noSize
				}
				f(c.call, class, h)
			}
		}
	}
}

// Total returns the summed nanoseconds of every call recorded, and of the
// calls named in calls alone when any are given, saturated at
// math.MaxInt64 rather than wrapped.
func (l *Latencies) Total(calls ...string) int64 {
	var t int64
	l.each(calls, func(_ string, _ int, h *histogram) { t = addNS(t, h.total) })
	return t
}

// Count returns the number of calls recorded, of the calls named in calls
// alone when any are given.
func (l *Latencies) Count(calls ...string) int64 {
	var n int64
	l.each(calls, func(_ string, _ int, h *histogram) { n += h.n })
	return n
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Rows returns one row per call and size class, sorted by call and then by
// size; nil when nothing was recorded.
func (l *Latencies) Rows() []LatencyRow {
	type keyed struct {
		class int
		row   LatencyRow
	}
	var rows []keyed
	l.each(nil, func(call string, class int, h *histogram) {
		name := "-"
		if class != noSize {
			name = sizeClassNames[class]
		}
		rows = append(rows, keyed{class, LatencyRow{
			Call: call, SizeClass: name, Count: h.n, TotalNS: h.total,
			MedianNS: h.quantile(0.5), P90NS: h.quantile(0.9), P99NS: h.quantile(0.99), MaxNS: h.max,
		}})
	})
	if len(rows) == 0 {
		return nil
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].row.Call != rows[j].row.Call {
			return rows[i].row.Call < rows[j].row.Call
		}
		return rows[i].class < rows[j].class
	})
	out := make([]LatencyRow, len(rows))
	for i, r := range rows {
		out[i] = r.row
	}
	return out
}

// histogram is a log-linear histogram of nanosecond values: exact below
// 2*subBuckets, then subBuckets buckets per power of two.
type histogram struct {
	counts []int64
	n      int64
	total  int64
	min    int64
	max    int64
}

const subBucketBits = 6
const subBuckets = 1 << subBucketBits

func bucketOf(v int64) int {
	if v < 2*subBuckets {
		return int(v)
	}
	e := bits.Len64(uint64(v)) - subBucketBits - 1 // v >> e is in [subBuckets, 2*subBuckets)
	return (e+1)*subBuckets + int(uint64(v)>>e) - subBuckets
}

// bucketMid returns a value in the middle of bucket b.
func bucketMid(b int) int64 {
	if b < 2*subBuckets {
		return int64(b)
	}
	e := b/subBuckets - 1
	m := int64(b%subBuckets + subBuckets)
	return m<<e + (int64(1)<<e)/2
}

func (h *histogram) add(v int64) {
	if v < 0 {
		v = 0
	}
	b := bucketOf(v)
	if b >= len(h.counts) {
		c := make([]int64, b+1+subBuckets)
		copy(c, h.counts)
		h.counts = c
	}
	h.counts[b]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.total = addNS(h.total, v)
}

// quantile returns the value at quantile q (0..1), clamped to the observed
// minimum and maximum.
func (h *histogram) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(q*float64(h.n-1)) + 1 // 1-based rank of the nearest-rank quantile
	var seen int64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(max(bucketMid(b), h.min), h.max)
		}
	}
	return h.max
}
