package plots

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"image/color"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// ErrNoResults is returned by the chart builders when given no results.
var ErrNoResults = errors.New("plots: no results")

// traceOf returns the trace path that all results share, or an error if
// there are none or they come from more than one trace.
func traceOf(runs []results.Result) (string, error) {
	if len(runs) == 0 {
		return "", ErrNoResults
	}
	t := runs[0].Trace
	for _, r := range runs[1:] {
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
	footprintWidth  = vg.Points(1)
	footprintDashes = []vg.Length{vg.Points(1), vg.Points(1.5)}
	// The lower bound is drawn on top, thinner than a reserved line and
	// with gaps as long as its dashes, so that a policy that reaches it
	// (the cuda baseline, a planner) still shows through: with thick
	// dashes and short gaps it hid the cuda line.
	requestedStyle = draw.LineStyle{
		Color:  black,
		Width:  vg.Points(1),
		Dashes: []vg.Length{vg.Points(5), vg.Points(5)},
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
	return addLine(p, xys, sty, plotter.NoStep)
}

// addSteps is addCurve for a series of points that each hold the largest
// value of a run of events ending at its X (results.Point): drawn as steps,
// each value level from the point before to its own, so that an instant's
// peak shows as a step at its run, not as a slope over the runs around it.
func addSteps(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle) error {
	return addLine(p, xys, sty, plotter.PreStep)
}

func addLine(p *plot.Plot, xys plotter.XYs, sty draw.LineStyle, step plotter.StepKind) error {
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
		l.StepStyle = step
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
func chooseX(runs []results.Result) xAxis {
	ax := xAxis{byTime: true}
	first, last, any := int64(0), int64(0), false
	for _, r := range runs {
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
func (ax xAxis) of(pt results.Point) float64 {
	if ax.byTime {
		return float64(pt.Time-ax.t0) / 1e9
	}
	return float64(pt.Event)
}

// seriesXYs returns the points of s as (X, f(point)).
func seriesXYs(ax xAxis, s []results.Point, f func(results.Point) float64) plotter.XYs {
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
func xRange(p *plot.Plot, ax xAxis, runs []results.Result) {
	var last float64
	for _, r := range runs {
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

// Shown is a result drawn in the memory and fragmentation charts: its
// index in the results and why it is there in the default set
// ("recorded", "lowest peak", "2nd lowest peak", ..., "baseline"; "" when
// named).
type Shown struct {
	Index int
	Role  string
}

// BestShown is how many results of the lowest peak reserved bytes the
// default set of the memory and fragmentation charts holds.
const BestShown = 3

// BaselinePolicy is the policy the default set holds as the baseline
// where it was run: no caching, a cudaMalloc and cudaFree per request.
const BaselinePolicy = "cuda"

// IsPlanner reports whether a policy is a clairvoyant planner, one that
// sees the whole trace before it places (offline, greedy-by-size), which
// the default set of ShownPolicies leaves out of the lowest peaks. Package
// plots knows no policy: the program that draws sets it (the replay
// command, from the registry's abilities); nil counts none a planner.
var IsPlanner func(policy string) bool

// ShownPolicies returns the results of one trace that the memory and
// fragmentation charts draw, in legend order. With names (policy names,
// each selecting every result of that policy, in the order named) it is
// those; it returns an error naming the first name no result has. With
// none it is the default set, a readable one: the policy that simulates
// the allocator the trace was recorded under (results.RecordedPolicy; none
// for a source that records no allocator), the BestShown other results of
// the lowest peak reserved bytes among those that served every malloc,
// clairvoyant planners and the baseline left aside, and the baseline
// (BaselinePolicy) where it was run. The requested bytes, the lower
// bound, are drawn beside them in any case.
func ShownPolicies(runs []results.Result, names []string) ([]Shown, error) {
	var out []Shown
	if len(names) > 0 {
		for _, n := range names {
			found := false
			for i, r := range runs {
				if r.Policy == n {
					out = append(out, Shown{Index: i})
					found = true
				}
			}
			if !found {
				trace := ""
				if len(runs) > 0 {
					trace = " on " + baseName(runs[0].Trace)
				}
				return nil, fmt.Errorf("plots: no result of policy %q%s", n, trace)
			}
		}
		return out, nil
	}
	taken := map[int]bool{}
	first := func(policy string) int {
		for i, r := range runs {
			if r.Policy == policy {
				return i
			}
		}
		return -1
	}
	if len(runs) > 0 {
		if name, ok := results.RecordedPolicy(runs[0].TraceSource); ok {
			if i := first(name); i >= 0 {
				out = append(out, Shown{Index: i, Role: "recorded"})
				taken[i] = true
			}
		}
	}
	base := first(BaselinePolicy)
	var cand []int
	for i, r := range runs {
		if taken[i] || i == base || failed(r) || IsPlanner != nil && IsPlanner(r.Policy) {
			continue
		}
		cand = append(cand, i)
	}
	slices.SortStableFunc(cand, func(a, b int) int { return cmp.Compare(runs[a].PeakReserved, runs[b].PeakReserved) })
	for k, i := range cand[:min(len(cand), BestShown)] {
		role := "lowest peak"
		if k > 0 {
			role = ordinal(k+1) + " lowest peak"
		}
		out = append(out, Shown{Index: i, Role: role})
	}
	if base >= 0 {
		out = append(out, Shown{Index: base, Role: "baseline"})
	}
	return out, nil
}

// ordinal returns "2nd", "3rd", "4th", ... for n > 1.
func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	}
	return fmt.Sprintf("%dth", n)
}

// shownLabel returns the legend label of a shown result: its chart label,
// with its role in parentheses.
func shownLabel(label string, s Shown, r results.Result) string {
	if s.Role != "" {
		label += " (" + s.Role + ")"
	}
	if failed(r) {
		label += " — OOM"
		if r.OOMs > 1 {
			label += fmt.Sprintf(" ×%d", r.OOMs)
		}
	}
	return label
}

// memoryScale returns what the memory charts of results draw against: the
// largest value drawn (reserved, allocated, requested, footprint, and the
// device capacity where it is drawn), the capacity to draw (0 for none),
// and the unit.
func memoryScale(runs []results.Result) (top, capacity uint64, u Unit) {
	for _, r := range runs {
		for _, pt := range r.Series {
			top = max(top, pt.Reserved, pt.Allocated, pt.Requested, pt.Footprint)
		}
	}
	capacity = runs[0].Capacity
	for _, r := range runs {
		if r.Capacity != capacity {
			capacity = 0 // not one device; draw none
		}
	}
	if !(capacity > 0 && top > 0 && float64(capacity) <= 1.5*float64(top)) {
		capacity = 0
	}
	top = max(top, capacity)
	return top, capacity, ChooseUnit(top)
}

// requestedSeries returns the index of the result whose series draws the
// trace's requested bytes (the same under every policy): the longest, -1
// where none has points.
func requestedSeries(runs []results.Result) int {
	req := -1
	for i, r := range runs {
		if len(r.Series) > 0 && (req < 0 || len(r.Series) > len(runs[req].Series)) {
			req = i
		}
	}
	return req
}

// Memory is MemoryOf the default set of policies.
func Memory(runs []results.Result) (*plot.Plot, error) { return MemoryOf(runs, nil) }

// requestedOnly returns s with only the requested bytes of each point.
func requestedOnly(s []results.Point) []results.Point {
	out := make([]results.Point, len(s))
	for i, pt := range s {
		out[i] = results.Point{Event: pt.Event, Time: pt.Time, Requested: pt.Requested}
	}
	return out
}

// MemoryOf returns the chart of memory over the trace for results of one
// trace, drawing the results ShownPolicies(results, names) picks (names
// nil: the default set): for each its reserved bytes (a thick line in the
// policy's look: colour and dash, the same in every chart), its allocated
// bytes (thin, lighter, same look), its device footprint where it is above
// the reserved bytes somewhere (the card's memory the driver's pages take,
// results.Point.Footprint: a thin dotted line of its colour), and once the
// trace's requested bytes, the lower bound for every policy (dashed
// black), against the trace's time in seconds (the event index where the
// trace has no time: xAxis). The legend names each policy with its role in
// the default set and says how many are left to MemoryGrid. Bytes are
// drawn in MiB or GiB (ChooseUnit of the largest value drawn). Where a policy ran out of memory its
// first OOM is marked with a cross, and a device capacity near the data
// is drawn as a dotted line. It returns ErrNoResults for no results, and
// an error if the results come from more than one trace or a name has no
// result.
func MemoryOf(runs []results.Result, names []string) (*plot.Plot, error) {
	return memoryOf(runs, names, nil)
}

// memoryOf is MemoryOf, in unit where it is not nil (the unit of the
// report's section), else in ChooseUnit's.
func memoryOf(runs []results.Result, names []string, unit *Unit) (*plot.Plot, error) {
	c, err := newSeriesChart(runs, names)
	if err != nil {
		return nil, err
	}
	trace, shown, labels, key, looks, ax := c.trace, c.shown, c.labels, c.key, c.looks, c.ax
	req := requestedSeries(runs)
	// The scale is the policies drawn, and the requested bytes.
	drawn := make([]results.Result, 0, len(shown)+1)
	for _, s := range shown {
		drawn = append(drawn, runs[s.Index])
	}
	if req >= 0 {
		drawn = append(drawn, results.Result{Capacity: runs[req].Capacity, Series: requestedOnly(runs[req].Series)})
	}
	top, capacity, u := memoryScale(drawn)
	if unit != nil {
		u = *unit
	}

	p := newPlot()
	setTitle(p, "memory over the trace: ", trace)
	p.Y.Label.Text = "memory (" + u.Name + ")"
	leg := newSideLegend()
	bytes := func(f func(results.Point) uint64) func(results.Point) float64 {
		return func(pt results.Point) float64 { return u.Of(f(pt)) }
	}

	for _, s := range shown {
		sty := looks[s.Index].line(allocatedWidth)
		sty.Color = tint(sty.Color.(color.RGBA), 0.35)
		if err := addSteps(p, seriesXYs(ax, runs[s.Index].Series, bytes(func(pt results.Point) uint64 { return pt.Allocated })), sty); err != nil {
			return nil, err
		}
	}
	anyFootprint := false
	for _, s := range shown {
		r := runs[s.Index]
		if !footprintAbove(r.Series) {
			continue
		}
		sty := draw.LineStyle{Color: looks[s.Index].Color, Width: footprintWidth, Dashes: footprintDashes}
		if err := addSteps(p, seriesXYs(ax, r.Series, bytes(func(pt results.Point) uint64 { return pt.Footprint })), sty); err != nil {
			return nil, err
		}
		anyFootprint = true
	}
	anyOOM := false
	// The first in the legend is drawn last, on top.
	for k := len(shown) - 1; k >= 0; k-- {
		s := shown[k]
		if err := addSteps(p, seriesXYs(ax, runs[s.Index].Series, bytes(func(pt results.Point) uint64 { return pt.Reserved })), looks[s.Index].line(reservedWidth)); err != nil {
			return nil, err
		}
	}
	for _, s := range shown {
		r := runs[s.Index]
		label := shownLabel(labels[s.Index], s, runs[s.Index])
		if len(r.Series) == 0 {
			label += " (no series)"
		}
		leg.add(label, lineThumb(looks[s.Index].line(reservedWidth)))
		if pt, ok := oomPoint(r); ok {
			if err := addOOM(p, plotter.XY{X: ax.of(pt), Y: u.Of(pt.Reserved)}, looks[s.Index].Color); err != nil {
				return nil, err
			}
			anyOOM = true
		}
	}
	// The lower bound on top, where the policies that reach it would
	// hide it.
	if req >= 0 {
		if err := addSteps(p, seriesXYs(ax, runs[req].Series, bytes(func(pt results.Point) uint64 { return pt.Requested })), requestedStyle); err != nil {
			return nil, err
		}
	}
	if capacity > 0 {
		p.Add(hline{Y: u.Of(capacity), Style: capacityStyle})
	}
	addRanked(leg, shown)
	addHidden(leg, len(runs)-len(shown))

	leg.add("")
	leg.add("reserved: thick", lineThumb{Color: grey, Width: reservedWidth})
	leg.add("allocated: thin", lineThumb{Color: tint(grey, 0.35), Width: allocatedWidth})
	if anyFootprint {
		leg.add("device footprint", lineThumb{Color: grey, Width: footprintWidth, Dashes: footprintDashes})
	}
	leg.add("requested (lower bound)", lineThumb(requestedStyle))
	if anyOOM {
		leg.add("first OOM", glyphThumb(oomGlyph(grey)))
	}
	if capacity > 0 {
		leg.add("device capacity", lineThumb(capacityStyle))
	}
	leg.addKey(key)
	p.Add(leg)
	if req < 0 {
		p.Add(newNote("no series points to draw"))
	}

	xRange(p, ax, runs)
	valueRange(p, math.Max(u.Of(top), minBytesTop), formatFixed)
	return p, nil
}

// addHidden says in the legend how many policies a chart leaves to its
// grid of every policy.
// addRanked says in the legend what the "lowest peak" roles rank, when
// one of shown has one.
func addRanked(leg *sideLegend, shown []Shown) {
	for _, s := range shown {
		if strings.Contains(s.Role, "lowest peak") {
			leg.add("")
			leg.add("lowest peaks: without OOM,")
			leg.add("not the baseline or a planner")
			return
		}
	}
}

func addHidden(leg *sideLegend, n int) {
	if n <= 0 {
		return
	}
	leg.add("")
	leg.add(fmt.Sprintf("+%d more: every policy", n))
	leg.add("in the -all chart")
}

// addOOM marks a first OOM at xy with a cross of colour c.
func addOOM(p *plot.Plot, xy plotter.XY, c color.Color) error {
	s, err := plotter.NewScatter(plotter.XYs{xy})
	if err != nil {
		return err
	}
	s.GlyphStyle = oomGlyph(c)
	p.Add(s)
	return nil
}

// footprintAbove reports whether a series' footprint is above its reserved
// bytes at some point: the driver's pages take more than the policy
// reserves (odd-sized cudaMallocs).
func footprintAbove(s []results.Point) bool {
	for _, pt := range s {
		if pt.Footprint > pt.Reserved {
			return true
		}
	}
	return false
}

// oomPoint returns the series point of r's first OOM: the first point at or
// after its event.
func oomPoint(r results.Result) (results.Point, bool) {
	if r.OOMs == 0 || r.FirstOOMEvent < 0 {
		return results.Point{}, false
	}
	for _, pt := range r.Series {
		if pt.Event >= r.FirstOOMEvent {
			return pt, true
		}
	}
	return results.Point{}, false
}

func oomGlyph(c color.Color) draw.GlyphStyle {
	return draw.GlyphStyle{Color: c, Radius: vg.Points(4.5), Shape: draw.CrossGlyph{}}
}

// seriesChart is what the charts over the trace of results of one trace
// start from: the trace, the results drawn, their labels and key, looks
// and X axis.
type seriesChart struct {
	trace       string
	shown       []Shown
	labels, key []string
	looks       []look
	ax          xAxis
}

// newSeriesChart returns the seriesChart of results drawing those that
// ShownPolicies(results, names) picks, or the error of traceOf or
// ShownPolicies.
func newSeriesChart(runs []results.Result, names []string) (seriesChart, error) {
	trace, err := traceOf(runs)
	if err != nil {
		return seriesChart{}, err
	}
	shown, err := ShownPolicies(runs, names)
	if err != nil {
		return seriesChart{}, err
	}
	labels, key := chartLabels(runs)
	return seriesChart{trace: trace, shown: shown, labels: labels, key: key, looks: resultLooks(runs), ax: chooseX(runs)}, nil
}

// Fragmentation is FragmentationOf the default set of policies.
func Fragmentation(runs []results.Result) (*plot.Plot, error) { return FragmentationOf(runs, nil) }

// FragmentationOf returns the chart of fragmentation and idle memory over
// the trace for results of one trace, drawing the results
// ShownPolicies(results, names) picks (names nil: the default set): for
// each its idle share, 1 - allocated/reserved (results.Point.Idle), in percent
// as a line in the policy's look, and its fragmentation (results.Point.
// Fragmentation: the free reserved memory that could not serve a malloc
// the policy grew for) as dots of its colour where it is above 0, against
// the trace's time in seconds (the event index where it has none), with a
// cross at its first OOM. The Y axis runs from 0 to a round percentage at
// or above the largest value drawn, at most 100.
// It returns ErrNoResults for no results, and an error if the results come
// from more than one trace or a name has no result.
func FragmentationOf(runs []results.Result, names []string) (*plot.Plot, error) {
	c, err := newSeriesChart(runs, names)
	if err != nil {
		return nil, err
	}
	trace, shown, labels, key, looks, ax := c.trace, c.shown, c.labels, c.key, c.looks, c.ax
	p := newPlot()
	setTitle(p, "fragmentation and idle memory: ", trace)
	p.Y.Label.Text = "% of the reserved bytes"
	leg := newSideLegend()

	drawn := make([]results.Result, len(shown))
	for k, s := range shown {
		drawn[k] = runs[s.Index]
	}
	top, points := fragmentationTop(ax, drawn), 0
	anyOOM, anyFrag := false, false
	for k := len(shown) - 1; k >= 0; k-- {
		s := shown[k]
		xys := seriesXYs(ax, runs[s.Index].Series, idlePercent)
		points += len(xys)
		if err := addSteps(p, xys, looks[s.Index].line(vg.Points(1.5))); err != nil {
			return nil, err
		}
	}
	for k := len(shown) - 1; k >= 0; k-- {
		s := shown[k]
		var dots plotter.XYs
		for _, xy := range seriesXYs(ax, runs[s.Index].Series, percent) {
			if xy.Y > 0 {
				dots = append(dots, xy)
			}
		}
		if len(dots) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(dots)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = fragGlyph(looks[s.Index])
		p.Add(sc)
		anyFrag = true
	}
	for _, s := range shown {
		r := runs[s.Index]
		label := shownLabel(labels[s.Index], s, runs[s.Index])
		if len(r.Series) == 0 {
			label += " (no series)"
		}
		leg.add(label, lineThumb(looks[s.Index].line(vg.Points(1.5))), glyphThumb(fragGlyph(looks[s.Index])))
		if pt, ok := oomPoint(r); ok {
			if err := addOOM(p, plotter.XY{X: ax.of(pt), Y: idlePercent(pt)}, looks[s.Index].Color); err != nil {
				return nil, err
			}
			anyOOM = true
		}
	}
	addRanked(leg, shown)
	addHidden(leg, len(runs)-len(shown))
	leg.add("")
	leg.add("line: idle, 1 − allocated / reserved", lineThumb(draw.LineStyle{Color: grey, Width: vg.Points(1.5)}))
	if anyFrag {
		leg.add("dot: fragmentation, free memory that", glyphThumb(fragGlyph(look{Color: grey})))
		leg.add("could not serve a malloc it grew for")
	} else {
		leg.add("no fragmentation: no malloc grew")
		leg.add("past free memory as large as it")
	}
	if anyOOM {
		leg.add("first OOM", glyphThumb(oomGlyph(grey)))
	}
	leg.addKey(key)
	p.Add(leg)
	if points == 0 {
		p.Add(newNote("no series points to draw"))
	}

	xRange(p, ax, runs)
	valueRange(p, top, formatFixed)
	return p, nil
}

// fragGlyph is the dot of a fragmentation in the fragmentation chart of a
// policy drawn in look l: its colour, and a shape for its line pattern, so
// that two policies of one colour differ in their dots too.
func fragGlyph(l look) draw.GlyphStyle {
	shapes := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{}, draw.RingGlyph{}}
	return draw.GlyphStyle{Color: l.Color, Radius: vg.Points(3), Shape: shapes[l.Dash%len(shapes)]}
}

// percent is a point's fragmentation in percent, held to 0..100.
func percent(pt results.Point) float64 { return 100 * math.Min(math.Max(pt.Fragmentation, 0), 1) }

// idlePercent is a point's idle share in percent, held to 0..100.
func idlePercent(pt results.Point) float64 { return 100 * math.Min(math.Max(pt.Idle, 0), 1) }

// fragmentationTop is the top of the fragmentation charts' Y axis for
// results: the largest percentage of their idle shares and
// fragmentation, at least 10, at most 100.
func fragmentationTop(ax xAxis, runs []results.Result) float64 {
	top := 0.0
	for _, r := range runs {
		for _, f := range []func(results.Point) float64{percent, idlePercent} {
			for _, xy := range seriesXYs(ax, r.Series, f) {
				top = math.Max(top, xy.Y)
			}
		}
	}
	return math.Min(math.Max(top, 10), 100)
}
