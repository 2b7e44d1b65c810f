package plots

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gpualloc/allocsim/sim"
)

// ErrNoResults is returned by the chart builders when given no results.
var ErrNoResults = errors.New("plots: no results")

// traceOf returns the trace path that all results share, or an error if
// there are none or they come from more than one trace.
func traceOf(results []sim.Result) (string, error) {
	if len(results) == 0 {
		return "", ErrNoResults
	}
	t := results[0].Trace
	for _, r := range results[1:] {
		if r.Trace != t {
			return "", fmt.Errorf("plots: results from more than one trace (%q and %q); group them with WriteAll", t, r.Trace)
		}
	}
	return t, nil
}

// baseName returns the last element of a trace path; paths recorded
// elsewhere may use either separator.
func baseName(trace string) string {
	name := strings.TrimRight(strings.ReplaceAll(trace, `\`, "/"), "/")
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// setTitle sets p's title to prefix and the trace's file base name,
// shortening the name in the middle where the title would be wider than
// the chart.
func setTitle(p *plot.Plot, prefix, trace string) {
	name := baseName(trace)
	if name == "" {
		name = "(unnamed trace)"
	}
	room := Width - 2*vg.Points(12)
	p.Title.Text = prefix + name
	for n := len([]rune(name)) - 1; n >= 8 && p.Title.TextStyle.Rectangle(p.Title.Text).Size().X > room; n-- {
		p.Title.Text = prefix + shorten(name, n)
	}
}

// Line styles of the memory chart.
var (
	reservedWidth   = vg.Points(2)
	allocatedWidth  = vg.Points(1)
	allocatedDashes = []vg.Length{vg.Points(3), vg.Points(2)}
	footprintWidth  = vg.Points(1)
	footprintDashes = []vg.Length{vg.Points(1), vg.Points(1.5)}
	requestedStyle  = draw.LineStyle{
		Color:  black,
		Width:  vg.Points(1.5),
		Dashes: []vg.Length{vg.Points(6), vg.Points(3)},
	}
	capacityStyle = draw.LineStyle{
		Color:  grey,
		Width:  vg.Points(1),
		Dashes: []vg.Length{vg.Points(1), vg.Points(2)},
	}
)

// addCurve adds xys to p drawn as a line in sty, or, for a single point, as
// a dot of sty's colour (a line through one point would not show).
func addCurve(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle) error {
	switch len(xys) {
	case 0:
		return nil
	case 1:
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		s.GlyphStyle = draw.GlyphStyle{Color: sty.Color, Radius: max(sty.Width*1.5, vg.Points(2.5)), Shape: draw.CircleGlyph{}}
		p.Add(s)
	default:
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.LineStyle = sty
		p.Add(l)
	}
	return nil
}

// xAxis places series points on a chart's X axis: by the trace's time in
// seconds from its first point when every series has times that go
// forward and span some time (a MiniMalloc problem's are logical steps:
// never), else by event index.
type xAxis struct {
	byTime bool
	t0     int64 // the first point's time, ns
}

// chooseX returns the X axis for the results' series.
func chooseX(results []sim.Result) xAxis {
	ax := xAxis{byTime: true}
	first, last, any := int64(0), int64(0), false
	for _, r := range results {
		if r.TraceSource == "minimalloc" {
			return xAxis{}
		}
		prev := int64(math.MinInt64)
		for _, pt := range r.Series {
			if pt.Time < prev {
				return xAxis{}
			}
			prev = pt.Time
			if !any || pt.Time < first {
				first = pt.Time
			}
			last = max(last, pt.Time)
			any = true
		}
	}
	if !any || last <= first {
		return xAxis{}
	}
	ax.t0 = first
	return ax
}

// of returns pt's X.
func (ax xAxis) of(pt sim.Point) float64 {
	if ax.byTime {
		return float64(pt.Time-ax.t0) / 1e9
	}
	return float64(pt.Event)
}

// seriesXYs returns the points of s as (X, f(point)).
func seriesXYs(ax xAxis, s []sim.Point, f func(sim.Point) float64) plotter.XYs {
	xys := make(plotter.XYs, 0, len(s))
	for _, pt := range s {
		y := f(pt)
		if math.IsNaN(y) || math.IsInf(y, 0) {
			continue
		}
		xys = append(xys, plotter.XY{X: ax.of(pt), Y: y})
	}
	return xys
}

// xRange sets p's X axis to the results' series: from 0 to the last point
// drawn, in seconds of the trace's time ("time (s)") or in events.
func xRange(p *plot.Plot, ax xAxis, results []sim.Result) {
	var last float64
	for _, r := range results {
		for _, pt := range r.Series {
			last = max(last, ax.of(pt))
		}
	}
	if ax.byTime {
		p.X.Min, p.X.Max = 0, math.Max(last, 1e-9)
		p.X.Label.Text = "time (s)"
		p.X.Tick.Marker = roundTicker{Target: 6, Format: formatFixed}
		return
	}
	p.X.Min, p.X.Max = 0, math.Max(last, 1)
	p.X.Label.Text = "events"
	p.X.Tick.Marker = roundTicker{Target: 6, Format: formatCount}
}

// minBytesTop is the lowest top of a byte axis, in its unit, so that a
// trace of a few bytes or KiB reads 0 .. 0.1 MiB rather than with six
// decimals.
const minBytesTop = 0.1

// valueRange sets p's Y axis to run from 0 to a round number at or above
// top, with round ticks.
func valueRange(p *plot.Plot, top float64, format func(v, step, top float64) string) {
	if !(top > 0) || math.IsInf(top, 0) {
		top = 1
	}
	step, _ := niceStep(top / 5)
	p.Y.Min = 0
	// A value a hair above a round number (rounding in the data) does not
	// add a step.
	p.Y.Max = math.Max(math.Ceil(top/step-1e-6), 1) * step
	p.Y.Tick.Marker = roundTicker{Step: step, Format: format}
}

// Memory returns the chart of memory over the trace for results of one
// trace: for each policy its reserved bytes (a solid line in the policy's
// colour), its allocated bytes (thin, dashed, same colour), its device
// footprint where it is above the reserved bytes somewhere (the card's
// memory the driver's pages take, sim.Point.Footprint: dotted, same
// colour), and once the
// trace's requested bytes, the lower bound for every policy (dashed black),
// against the trace's time in seconds (the event index where the trace has
// no time: xAxis). Bytes are drawn in MiB or GiB (ChooseUnit of the
// largest value). Where a policy ran out of memory its first OOM is marked
// with a cross, and a device capacity near the data is drawn as a dotted
// line. It returns ErrNoResults for no results and an error if the results
// come from more than one trace.
func Memory(results []sim.Result) (*plot.Plot, error) {
	trace, err := traceOf(results)
	if err != nil {
		return nil, err
	}
	labels := policyLabels(results)
	ax := chooseX(results)

	// The requested bytes are the trace's, the same under every policy:
	// draw them from the longest series.
	req := -1
	var top uint64
	for i, r := range results {
		if len(r.Series) > 0 && (req < 0 || len(r.Series) > len(results[req].Series)) {
			req = i
		}
		for _, pt := range r.Series {
			top = max(top, pt.Reserved, pt.Allocated, pt.Requested, pt.Footprint)
		}
	}
	capacity := results[0].Capacity
	for _, r := range results {
		if r.Capacity != capacity {
			capacity = 0 // not one device; draw none
		}
	}
	showCapacity := capacity > 0 && top > 0 && float64(capacity) <= 1.5*float64(top)
	if showCapacity {
		top = max(top, capacity)
	}
	u := ChooseUnit(top)

	p := newPlot()
	setTitle(p, "memory over the trace: ", trace)
	p.Y.Label.Text = "memory (" + u.Name + ")"
	leg := newSideLegend()
	bytes := func(f func(sim.Point) uint64) func(sim.Point) float64 {
		return func(pt sim.Point) float64 { return u.Of(f(pt)) }
	}

	for i, r := range results {
		sty := draw.LineStyle{Color: tint(policyColor(i), 0.15), Width: allocatedWidth, Dashes: allocatedDashes}
		if err := addCurve(p, seriesXYs(ax, r.Series, bytes(func(pt sim.Point) uint64 { return pt.Allocated })), sty); err != nil {
			return nil, err
		}
	}
	anyFootprint := false
	for i, r := range results {
		if !footprintAbove(r.Series) {
			continue
		}
		sty := draw.LineStyle{Color: policyColor(i), Width: footprintWidth, Dashes: footprintDashes}
		if err := addCurve(p, seriesXYs(ax, r.Series, bytes(func(pt sim.Point) uint64 { return pt.Footprint })), sty); err != nil {
			return nil, err
		}
		anyFootprint = true
	}
	anyOOM := false
	for i, r := range results {
		sty := draw.LineStyle{Color: policyColor(i), Width: reservedWidth}
		if err := addCurve(p, seriesXYs(ax, r.Series, bytes(func(pt sim.Point) uint64 { return pt.Reserved })), sty); err != nil {
			return nil, err
		}
		label := labels[i]
		if len(r.Series) == 0 {
			label += " (no series)"
		}
		leg.add(label, lineThumb(sty))
		if pt, ok := oomPoint(r); ok {
			s, err := plotter.NewScatter(plotter.XYs{{X: ax.of(pt), Y: u.Of(pt.Reserved)}})
			if err != nil {
				return nil, err
			}
			s.GlyphStyle = oomGlyph(policyColor(i))
			p.Add(s)
			anyOOM = true
		}
	}
	if req >= 0 {
		if err := addCurve(p, seriesXYs(ax, results[req].Series, bytes(func(pt sim.Point) uint64 { return pt.Requested })), requestedStyle); err != nil {
			return nil, err
		}
	}
	if showCapacity {
		p.Add(hline{Y: u.Of(capacity), Style: capacityStyle})
	}

	leg.add("")
	leg.add("reserved", lineThumb{Color: grey, Width: reservedWidth})
	leg.add("allocated", lineThumb{Color: grey, Width: allocatedWidth, Dashes: allocatedDashes})
	if anyFootprint {
		leg.add("device footprint", lineThumb{Color: grey, Width: footprintWidth, Dashes: footprintDashes})
	}
	leg.add("requested (lower bound)", lineThumb(requestedStyle))
	if anyOOM {
		leg.add("first OOM", glyphThumb(oomGlyph(grey)))
	}
	if showCapacity {
		leg.add("device capacity", lineThumb(capacityStyle))
	}
	p.Add(leg)
	if req < 0 {
		p.Add(newNote("no series points to draw"))
	}

	xRange(p, ax, results)
	valueRange(p, math.Max(u.Of(top), minBytesTop), formatFixed)
	return p, nil
}

// footprintAbove reports whether a series' footprint is above its reserved
// bytes at some point: the driver's pages take more than the policy
// reserves (odd-sized cudaMallocs).
func footprintAbove(s []sim.Point) bool {
	for _, pt := range s {
		if pt.Footprint > pt.Reserved {
			return true
		}
	}
	return false
}

// oomPoint returns the series point of r's first OOM: the first point at or
// after its event.
func oomPoint(r sim.Result) (sim.Point, bool) {
	if r.OOMs == 0 || r.FirstOOMEvent < 0 {
		return sim.Point{}, false
	}
	for _, pt := range r.Series {
		if pt.Event >= r.FirstOOMEvent {
			return pt, true
		}
	}
	return sim.Point{}, false
}

func oomGlyph(c color.Color) draw.GlyphStyle {
	return draw.GlyphStyle{Color: c, Radius: vg.Points(4.5), Shape: draw.CrossGlyph{}}
}

// Fragmentation returns the chart of fragmentation over the trace for
// results of one trace: for each policy 1 - allocated/reserved in percent
// (a line in the policy's colour) against the trace's time in seconds (the
// event index where it has none). The Y axis runs
// from 0 to a round percentage at or above the largest value, at most 100.
// It returns ErrNoResults for no results and an error if the results come
// from more than one trace.
func Fragmentation(results []sim.Result) (*plot.Plot, error) {
	trace, err := traceOf(results)
	if err != nil {
		return nil, err
	}
	labels := policyLabels(results)
	ax := chooseX(results)
	p := newPlot()
	setTitle(p, "fragmentation: ", trace)
	p.Y.Label.Text = "1 − allocated / reserved (%)"
	leg := newSideLegend()
	percent := func(pt sim.Point) float64 { return 100 * math.Min(math.Max(pt.Fragmentation, 0), 1) }

	top, points := 0.0, 0
	for i, r := range results {
		sty := draw.LineStyle{Color: policyColor(i), Width: vg.Points(1.5)}
		xys := seriesXYs(ax, r.Series, percent)
		for _, xy := range xys {
			top = math.Max(top, xy.Y)
		}
		points += len(xys)
		if err := addCurve(p, xys, sty); err != nil {
			return nil, err
		}
		label := labels[i]
		if len(r.Series) == 0 {
			label += " (no series)"
		}
		leg.add(label, lineThumb(sty))
	}
	p.Add(leg)
	if points == 0 {
		p.Add(newNote("no series points to draw"))
	}

	xRange(p, ax, results)
	valueRange(p, math.Min(math.Max(top, 10), 100), formatFixed)
	return p, nil
}
