package plots

import (
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"image/color"
	"math"
	"slices"
	"strings"
)

// Column is a column of integers as a report page embeds it: Step, the
// greatest common divisor of the values (1 when all are 0), and Deltas,
// each value divided by Step less the one before it (the first less 0),
// each delta zigzag-encoded (0, -1, 1, -2, ... as 0, 1, 2, 3, ...) and
// written in groups of 5 bits, lowest first, one character of
// columnDigits each, plus 32 where another group follows. Values change
// little from one series point to the next and byte figures are
// multiples of a block or page size, so most deltas take one or two
// characters. The page's script rebuilds the values exactly where they are
// below 2^53.
type Column struct {
	Step   int64  `json:"q"`
	Deltas string `json:"d"`
}

// columnDigits are the 64 characters of a Column's deltas, safe in JSON,
// HTML and XML.
const columnDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// encodeColumn returns vs as a Column.
func encodeColumn(vs []int64) Column {
	var g int64
	for _, v := range vs {
		g = gcd(g, v)
	}
	if g == 0 {
		g = 1
	}
	var b strings.Builder
	var prev int64
	for _, v := range vs {
		d := v/g - prev
		prev = v / g
		z := uint64(d<<1) ^ uint64(d>>63)
		for z >= 32 {
			b.WriteByte(columnDigits[32|z&31])
			z >>= 5
		}
		b.WriteByte(columnDigits[z])
	}
	return Column{Step: g, Deltas: b.String()}
}

// Values returns the integers c encodes, or an error naming the place of
// a character that is not one of a Column's or a number cut short.
func (c Column) Values() ([]int64, error) {
	var out []int64
	var v int64
	var z uint64
	var shift uint
	for i := 0; i < len(c.Deltas); i++ {
		k := strings.IndexByte(columnDigits, c.Deltas[i])
		if k < 0 {
			return nil, fmt.Errorf("plots: column: character %d (%q) is not a digit", i, c.Deltas[i])
		}
		z |= uint64(k&31) << shift
		if k&32 != 0 {
			shift += 5
			continue
		}
		v += int64(z>>1) ^ -int64(z&1)
		out = append(out, v*c.Step)
		z, shift = 0, 0
	}
	if shift != 0 {
		return nil, fmt.Errorf("plots: column: the last number is cut short")
	}
	return out, nil
}

func gcd(a, b int64) int64 {
	if a < 0 {
		a = -a
	}
	if b < 0 {
		b = -b
	}
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// FracScale is the scale at which a page embeds fractions (fragmentation,
// a latency distribution's share of calls): an integer in 1/10000ths,
// 0.01 percent.
const FracScale = 10000

// fracInt returns f (0..1) in FracScale units, clamped to 0..1.
func fracInt(f float64) int64 {
	if math.IsNaN(f) {
		return 0
	}
	return int64(math.Round(FracScale * math.Min(math.Max(f, 0), 1)))
}

// SeriesData is what a report page embeds of one section's series, one
// JSON object in the page (a script element of type application/json),
// from which its script draws memory and fragmentation over the trace.
// Every column is in Columns once, however many policies share it (the
// allocated bytes of policies that round alike, the X of one trace's
// replays); the other fields name columns by their index there, -1 for
// none.
type SeriesData struct {
	Columns []Column `json:"columns"`
	// XUnit is "s" when the X columns hold the trace's times, in
	// nanoseconds from its first series point (the chart shows seconds),
	// "events" when they hold event indices (a trace without times, a
	// MiniMalloc problem).
	XUnit string `json:"xunit"`
	// X are the distinct X columns of the results' series; Events the
	// event index of each point of X[i] when XUnit is "s".
	X      []int `json:"x"`
	Events []int `json:"events,omitempty"`
	// Requested is the trace's requested bytes (the lower bound), from the
	// longest series, on X[RequestedX].
	Requested  int `json:"requested"`
	RequestedX int `json:"requested_x"`
	// Capacity is the device's capacity in bytes where the chart draws it
	// (it is near the data), else 0.
	Capacity uint64 `json:"capacity,omitempty"`
	// Policies are the results, in the report's order.
	Policies []PolicySeries `json:"policies"`
}

// PolicySeries is one result's series in SeriesData.
type PolicySeries struct {
	// Label is the policy's label (with its settings where two results
	// share a policy name, "(gpu)" for a replay on a GPU); Color its
	// colour in the charts, "#rrggbb".
	Label string `json:"label"`
	Color string `json:"color"`
	// Dash is the dash pattern of its reserved line in pixels (on, off,
	// ...), as the PNG charts draw it; empty for a solid line.
	Dash []float64 `json:"dash,omitempty"`
	// Hidden marks a policy the charts do not draw at first (not among
	// the PNG charts' policies); its legend entry shows it.
	Hidden bool `json:"hidden,omitempty"`
	// X is the index in SeriesData.X of the series' X column, -1 for a
	// result without series points.
	X int `json:"x"`
	// Reserved and Allocated are the columns of the largest bytes of each
	// point's run of events; Footprint that of the device footprint in
	// bytes, only where it is above the reserved bytes somewhere (else
	// -1).
	Reserved  int `json:"reserved"`
	Allocated int `json:"allocated"`
	Footprint int `json:"footprint"`
	// Fragmentation is the column of each point's fragmentation
	// (results.Point.Fragmentation), Idle that of 1 - allocated / reserved at
	// its last event, in FracScale units.
	Fragmentation int `json:"fragmentation"`
	Idle          int `json:"idle"`
	// OOM is the index of the point of the first OOM (the first at or
	// after its event), -1 for none.
	OOM int `json:"oom"`
}

// hexColor returns c as "#rrggbb".
func hexColor(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// Column returns the values of the column at index i of d.Columns, nil
// for -1, or an error for an index out of range or a column that does not
// decode.
func (d *SeriesData) Column(i int) ([]int64, error) {
	if i == -1 {
		return nil, nil
	}
	if i < 0 || i >= len(d.Columns) {
		return nil, fmt.Errorf("plots: series data: no column %d of %d", i, len(d.Columns))
	}
	return d.Columns[i].Values()
}

// seriesData returns the series of results of one trace as a page embeds
// them, nil when no result has series points.
func seriesData(runs []results.Result, labels []string, names []string) *SeriesData {
	looks := resultLooks(runs)
	// The policies drawn at first: those the PNG charts draw
	// (ShownPolicies, names nil for the default set); the page's legend
	// shows the others, hidden, a click away.
	drawn := map[int]bool{}
	if shown, err := ShownPolicies(runs, names); err == nil {
		for _, s := range shown {
			drawn[s.Index] = true
		}
	}
	ax := chooseX(runs)
	d := &SeriesData{XUnit: "events", Requested: -1, RequestedX: -1, Policies: make([]PolicySeries, len(runs))}
	if ax.byTime {
		d.XUnit = "s"
	}
	index := map[Column]int{}
	add := func(vs []int64) int {
		c := encodeColumn(vs)
		if i, ok := index[c]; ok {
			return i
		}
		index[c] = len(d.Columns)
		d.Columns = append(d.Columns, c)
		return len(d.Columns) - 1
	}
	col := func(s []results.Point, f func(results.Point) int64) int {
		vs := make([]int64, len(s))
		for i, pt := range s {
			vs[i] = f(pt)
		}
		return add(vs)
	}
	xIndex := func(s []results.Point) int {
		if len(s) == 0 {
			return -1
		}
		x := col(s, func(pt results.Point) int64 {
			if ax.byTime {
				return pt.Time - ax.t0
			}
			return pt.Event
		})
		ev := -1
		if ax.byTime {
			ev = col(s, func(pt results.Point) int64 { return pt.Event })
		}
		for i := range d.X {
			if d.X[i] == x && (!ax.byTime || d.Events[i] == ev) {
				return i
			}
		}
		d.X = append(d.X, x)
		if ax.byTime {
			d.Events = append(d.Events, ev)
		}
		return len(d.X) - 1
	}
	req := -1
	var top uint64
	for i, r := range runs {
		p := PolicySeries{Label: labels[i], Color: hexColor(looks[i].Color), Dash: looks[i].dashArray(), Hidden: len(drawn) > 0 && !drawn[i], X: xIndex(r.Series), Footprint: -1, OOM: -1}
		if len(r.Series) == 0 {
			p.Label += " (no series)"
		}
		p.Reserved = col(r.Series, func(pt results.Point) int64 { return int64(pt.Reserved) })
		p.Allocated = col(r.Series, func(pt results.Point) int64 { return int64(pt.Allocated) })
		if footprintAbove(r.Series) {
			p.Footprint = col(r.Series, func(pt results.Point) int64 { return int64(pt.Footprint) })
		}
		p.Fragmentation = col(r.Series, func(pt results.Point) int64 { return fracInt(pt.Fragmentation) })
		p.Idle = col(r.Series, func(pt results.Point) int64 { return fracInt(pt.Idle) })
		if r.OOMs > 0 && r.FirstOOMEvent >= 0 {
			for k, pt := range r.Series {
				if pt.Event >= r.FirstOOMEvent {
					p.OOM = k
					break
				}
			}
		}
		d.Policies[i] = p
		if len(r.Series) > 0 && (req < 0 || len(r.Series) > len(runs[req].Series)) {
			req = i
		}
		for _, pt := range r.Series {
			top = max(top, pt.Reserved, pt.Allocated, pt.Requested, pt.Footprint)
		}
	}
	if req < 0 {
		return nil
	}
	d.Requested = col(runs[req].Series, func(pt results.Point) int64 { return int64(pt.Requested) })
	d.RequestedX = d.Policies[req].X
	// The capacity is drawn where one device holds every result and it is
	// near the data, as Memory draws it.
	capacity := runs[0].Capacity
	for _, r := range runs {
		if r.Capacity != capacity {
			capacity = 0
		}
	}
	if capacity > 0 && top > 0 && float64(capacity) <= 1.5*float64(top) {
		d.Capacity = capacity
	}
	return d
}

// LatencyData is what a report page embeds of one section's device call
// latencies: each policy's distribution (LatencyDistribution) on one X
// column, from which its script draws the CDF on a log scale.
type LatencyData struct {
	// Kind says where the latencies come from: "simulated", "measured" or
	// "measured and simulated".
	Kind string `json:"kind"`
	// NS holds the latencies in nanoseconds at which the distributions
	// have points, ascending; a time at which a distribution jumps is
	// there twice, the share before the jump first.
	NS []int64 `json:"ns"`
	// Policies are the results, in the report's order.
	Policies []PolicyLatency `json:"policies"`
}

// PolicyLatency is one result's latency distribution in LatencyData.
type PolicyLatency struct {
	Label string `json:"label"`
	Color string `json:"color"`
	// Calls is the number of device calls its rows summarize; 0 when it
	// has none (its Share is then empty).
	Calls int64 `json:"calls"`
	// Share is, at each of NS, the share of calls that took at most that
	// long, in FracScale units, or null (-1 in Go) where the distribution
	// has no point there: the page joins its neighbours.
	Share []*int64 `json:"share"`
}

// latencyData returns the latency distributions of results of one trace,
// nil when none has latency rows.
func latencyData(runs []ReportResult, labels []string) *LatencyData {
	looks := resultLooks(reportSims(runs))
	type dist struct {
		pts []LatencyPoint
		n   int64
	}
	ds := make([]dist, len(runs))
	any := false
	// mult[ns] is the most points one distribution has at ns (2 at a
	// jump).
	mult := map[int64]int{}
	for i, r := range runs {
		pts, n := LatencyDistribution(r.Latency)
		ds[i] = dist{pts, n}
		any = any || n > 0
		count := map[int64]int{}
		for _, pt := range pts {
			ns := int64(math.Round(pt.NS))
			count[ns]++
			mult[ns] = max(mult[ns], count[ns])
		}
	}
	if !any {
		return nil
	}
	var keys []int64
	for ns := range mult {
		keys = append(keys, ns)
	}
	slices.Sort(keys)
	d := &LatencyData{Kind: latencyKind(runs)}
	row := map[int64]int{} // the first row of each time
	for _, ns := range keys {
		row[ns] = len(d.NS)
		for range mult[ns] {
			d.NS = append(d.NS, ns)
		}
	}
	for i, ds := range ds {
		p := PolicyLatency{Label: labels[i], Color: hexColor(looks[i].Color), Calls: ds.n}
		if ds.n == 0 {
			p.Label += " (no latency data)"
		} else {
			p.Share = make([]*int64, len(d.NS))
			// A distribution's points at one time fill the last rows of
			// that time, so that its share after a jump is the last.
			at := map[int64]int{}
			for _, pt := range ds.pts {
				at[int64(math.Round(pt.NS))]++
			}
			seen := map[int64]int{}
			for _, pt := range ds.pts {
				ns := int64(math.Round(pt.NS))
				k := row[ns] + mult[ns] - at[ns] + seen[ns]
				seen[ns]++
				v := fracInt(pt.Fraction)
				p.Share[k] = &v
			}
		}
		d.Policies = append(d.Policies, p)
	}
	return d
}
