package plots

import (
	"github.com/gpualloc/allocsim/sim/results"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// LatencyPoint is a point of a latency distribution: the fraction of calls
// (0..1) that took at most NS nanoseconds.
type LatencyPoint struct {
	NS       float64
	Fraction float64
}

// LatencyDistribution returns the distribution of the device call
// latencies summarized in rows (results.Result.Latency), every call and size
// class together, as the points of its cumulative distribution in
// ascending order of time, and the number of calls. The rows hold
// percentiles, not every call, so the distribution is rebuilt from them:
// within a row the lower half of the calls is taken at the median and the
// rest spread linearly between the median, the 90th and 99th percentiles
// and the maximum; rows are weighted by their counts. The curve is exact
// at the rows' percentiles and, for rows whose calls all took the same
// time (as the cost model's calls of one size do), everywhere. Two points
// share a time where the distribution jumps. It returns nil for rows
// without calls.
func LatencyDistribution(rows []results.LatencyRow) ([]LatencyPoint, int64) {
	type knots struct {
		x []float64 // median, p90, p99, max
		n float64
	}
	qs := []float64{0.5, 0.9, 0.99, 1}
	var ks []knots
	var total float64
	xs := map[float64]bool{}
	for _, r := range rows {
		if r.Count <= 0 {
			continue
		}
		x := []float64{float64(r.MedianNS), float64(r.P90NS), float64(r.P99NS), float64(r.MaxNS)}
		for i := 1; i < len(x); i++ {
			x[i] = math.Max(x[i], x[i-1]) // percentiles never fall
		}
		for _, v := range x {
			xs[v] = true
		}
		ks = append(ks, knots{x: x, n: float64(r.Count)})
		total += float64(r.Count)
	}
	if total == 0 {
		return nil, 0
	}
	// cdf returns a row's fraction of calls at or below v (strict: below
	// v), piecewise linear between its knots.
	cdf := func(k knots, v float64, strict bool) float64 {
		at := func(x float64) bool { return x < v || (!strict && x == v) }
		j := -1
		for i, x := range k.x {
			if at(x) {
				j = i
			}
		}
		switch {
		case j < 0:
			return 0
		case j == len(k.x)-1:
			return 1
		}
		x0, x1 := k.x[j], k.x[j+1]
		if x1 <= x0 {
			return qs[j+1]
		}
		return qs[j] + (qs[j+1]-qs[j])*(v-x0)/(x1-x0)
	}
	vals := make([]float64, 0, len(xs))
	for v := range xs {
		vals = append(vals, v)
	}
	sort.Float64s(vals)
	var pts []LatencyPoint
	for _, v := range vals {
		var below, atOrBelow float64
		for _, k := range ks {
			below += k.n * cdf(k, v, true)
			atOrBelow += k.n * cdf(k, v, false)
		}
		if below < atOrBelow {
			pts = append(pts, LatencyPoint{v, below / total})
		}
		pts = append(pts, LatencyPoint{v, atOrBelow / total})
	}
	return pts, int64(total)
}

// LatencyCDF returns the chart of the device call latencies of results of
// one trace: for each policy (a line in its look) the fraction of its
// device calls (every call its Latency rows summarize: cudaMalloc and
// cudaFree, simulated by the cost model in replay sim, measured in replay
// gpu) that took at most a time, against the time in microseconds on a
// log scale. The curves are rebuilt from the rows' percentiles
// (LatencyDistribution). Policies without latency rows are named in the
// legend with "(no latency data)". It returns ErrNoResults for no results
// and an error if the results come from more than one trace.
func LatencyCDF(runs []results.Result) (*plot.Plot, error) {
	trace, err := traceOf(runs)
	if err != nil {
		return nil, err
	}
	labels, key := chartLabels(runs)
	looks := resultLooks(runs)
	p := newPlot()
	setTitle(p, "device call latency: ", trace)
	p.X.Label.Text = "latency per call (µs, log scale)"
	p.Y.Label.Text = "calls at or below (%)"
	leg := newSideLegend()
	lo, hi := inf, -inf
	drawn := false
	for i, r := range runs {
		sty := looks[i].line(vg.Points(1.5))
		pts, n := LatencyDistribution(r.Latency)
		label := labels[i]
		if n == 0 {
			leg.add(label+" (no latency data)", lineThumb{Color: lightGrey, Width: sty.Width})
			continue
		}
		xys := make(plotter.XYs, 0, len(pts)+1)
		for _, pt := range pts {
			x := math.Log10(math.Max(pt.NS, 1) / 1000)
			if len(xys) == 0 {
				xys = append(xys, plotter.XY{X: x, Y: 0})
			}
			xys = append(xys, plotter.XY{X: x, Y: 100 * pt.Fraction})
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		if err := addCurve(p, xys, sty); err != nil {
			return nil, err
		}
		leg.add(label, lineThumb(sty))
		drawn = true
	}
	leg.addKey(key)
	p.Add(leg)
	if !drawn {
		p.Add(newNote("no latency data in these results"))
		lo, hi = 0, 3
	}
	// Whole decades around the data, at least one.
	p.X.Min, p.X.Max = math.Floor(lo), math.Ceil(hi)
	if p.X.Max-p.X.Min < 1 {
		p.X.Max = p.X.Min + 1
	}
	p.X.Tick.Marker = log10Ticker{}
	p.Y.Min, p.Y.Max = 0, 100
	p.Y.Tick.Marker = roundTicker{Step: 20, Format: formatFixed}
	return p, nil
}
