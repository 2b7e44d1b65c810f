package plots

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gpualloc/allocsim/sim"
)

// bar is one bar of a barSet, in data coordinates: centred on X, Width wide,
// from the set's base up to Value.
type bar struct {
	X, Width, Value float64
	Fill            color.Color
	Label           string // drawn above the bar, may have several lines
}

// barSet draws bars with per-bar colours and labels. Unlike
// plotter.BarChart its bars may differ in colour, and on a log axis they
// rise from Base rather than from 0.
type barSet struct {
	Bars  []bar
	Base  float64
	Line  draw.LineStyle
	Label text.Style
}

func newBarSet(base float64) *barSet {
	return &barSet{
		Base: base,
		Line: draw.LineStyle{Color: color.RGBA{0x30, 0x30, 0x30, 0xff}, Width: vg.Points(0.5)},
		Label: text.Style{
			Font:    font.From(sans, 9),
			Handler: plot.DefaultTextHandler,
			XAlign:  draw.XCenter,
			YAlign:  draw.YBottom,
		},
	}
}

const labelGap = 2 // points between a bar's top and its label

// Plot implements plot.Plotter.
func (b *barSet) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	base := math.Max(b.Base, p.Y.Min)
	for _, br := range b.Bars {
		x0, x1 := trX(br.X-br.Width/2), trX(br.X+br.Width/2)
		// A value at or below the base (0 on a log axis) has no bar, only
		// its label.
		top := trY(math.Max(br.Value, base))
		if br.Value > base {
			y0 := trY(base)
			pts := []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: top}, {X: x0, Y: top}}
			c.FillPolygon(br.Fill, c.ClipPolygonY(pts))
			c.StrokeLines(b.Line, c.ClipLinesY(append(pts, pts[0]))...)
		}
		if br.Label != "" {
			c.FillText(b.Label, vg.Point{X: (x0 + x1) / 2, Y: top + vg.Points(labelGap)}, br.Label)
		}
	}
}

// DataRange implements plot.DataRanger.
func (b *barSet) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = inf, -inf, b.Base, b.Base
	for _, br := range b.Bars {
		xmin = math.Min(xmin, br.X-br.Width/2)
		xmax = math.Max(xmax, br.X+br.Width/2)
		ymax = math.Max(ymax, br.Value)
	}
	return xmin, xmax, ymin, ymax
}

// GlyphBoxes implements plot.GlyphBoxer, so that the plot leaves room
// above the highest bars for their labels.
func (b *barSet) GlyphBoxes(p *plot.Plot) []plot.GlyphBox {
	var boxes []plot.GlyphBox
	for _, br := range b.Bars {
		if br.Label == "" {
			continue
		}
		v := math.Max(br.Value, math.Max(b.Base, p.Y.Min))
		r := b.Label.Rectangle(br.Label)
		r.Min.Y += vg.Points(labelGap)
		r.Max.Y += vg.Points(labelGap)
		boxes = append(boxes, plot.GlyphBox{X: p.X.Norm(br.X), Y: p.Y.Norm(v), Rectangle: r})
	}
	return boxes
}

// slotWidth returns about how wide the room for each of n policies is on
// a nominal X axis: the chart's width less the Y axis (about an inch) and a
// legend of width legendW, shared among them.
func slotWidth(n int, legendW vg.Length) vg.Length {
	return (Width - vg.Inch - legendW) / vg.Length(max(n, 1))
}

// dropWideLabels removes the labels of bars that are wider than slot, so
// that crowded charts show bars rather than overlapping text.
func (b *barSet) dropWideLabels(slot vg.Length) {
	for i, br := range b.Bars {
		if b.Label.Rectangle(br.Label).Size().X > slot*0.95 {
			b.Bars[i].Label = ""
		}
	}
}

// nominalPolicies makes p's X axis name the policies at 0, 1, ..., with
// the names turned when they would not fit side by side in the room left
// by a legend of width legendW.
func nominalPolicies(p *plot.Plot, labels []string, legendW vg.Length) {
	p.NominalX(labels...)
	// NominalX pads the Y axis for a first name centred on the data's
	// edge; here each name is centred in its own slot.
	p.Y.Padding = vg.Points(2)
	p.X.Min, p.X.Max = -0.5, float64(len(labels))-0.5
	slot := slotWidth(len(labels), legendW)
	var widest vg.Length
	for _, l := range labels {
		widest = max(widest, p.X.Tick.Label.Rectangle(l).Size().X)
	}
	if widest > slot*0.92 {
		p.X.Tick.Label.Rotation = math.Pi / 6
		p.X.Tick.Label.XAlign = draw.XRight
		p.X.Tick.Label.YAlign = draw.YCenter
	}
	p.X.Label.Text = ""
}

// Peaks returns the bar chart of peak memory per policy for results of one
// trace: for each policy (named on the X axis) a bar of its peak allocated
// bytes (light) and one of its peak reserved bytes (full colour, labelled
// with its value and its excess over the lower bound), against the lower
// bound, the trace's peak requested bytes, drawn as a dashed black line.
// Policies that ran out of memory say how often in their bar's label.
// Where a policy's peak footprint (the card's memory its segments take as
// the driver takes them, sim.Result.PeakFootprint) is above its peak
// reserved bytes, a solid black tick across the reserved bar marks it.
// Labels too wide for their policy's room are left out.
// Bytes are in MiB or GiB (ChooseUnit of the largest value). It returns
// ErrNoResults for no results and an error if the results come from more
// than one trace.
func Peaks(results []sim.Result) (*plot.Plot, error) {
	trace, err := traceOf(results)
	if err != nil {
		return nil, err
	}
	labels := policyLabels(results)
	var top, bound uint64
	sameBound := true
	ticks := false
	for _, r := range results {
		top = max(top, r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.PeakFootprint)
		ticks = ticks || r.PeakFootprint > r.PeakReserved
		if r.PeakRequested != results[0].PeakRequested {
			sameBound = false
		}
		bound = max(bound, r.PeakRequested)
	}
	u := ChooseUnit(top)

	p := newPlot()
	setTitle(p, "peak memory per policy: ", trace)
	p.Y.Label.Text = "peak memory (" + u.Name + ")"
	bars := newBarSet(0)
	const w = 0.36
	for i, r := range results {
		c := policyColor(i)
		label := "0"
		if r.PeakReserved > 0 {
			label = fmt.Sprintf("%.*f", valueDecimals(u.Of(top)), u.Of(r.PeakReserved))
		}
		if r.PeakRequested > 0 && r.PeakReserved > 0 {
			label += fmt.Sprintf("\n%+.0f%%", 100*(float64(r.PeakReserved)/float64(r.PeakRequested)-1))
		}
		if r.OOMs > 0 {
			label += fmt.Sprintf("\n%d OOM", r.OOMs)
			if r.OOMs > 1 {
				label += "s"
			}
		}
		bars.Bars = append(bars.Bars,
			bar{X: float64(i) - w/2, Width: w, Value: u.Of(r.PeakAllocated), Fill: tint(c, 0.6)},
			bar{X: float64(i) + w/2, Width: w, Value: u.Of(r.PeakReserved), Fill: c, Label: label},
		)
	}
	boundStyle := requestedStyle
	leg := newSideLegend()
	leg.add("peak reserved", swatchThumb{fill: grey, line: bars.Line.Color})
	leg.add("peak allocated", swatchThumb{fill: tint(grey, 0.6), line: bars.Line.Color})
	leg.add("lower bound:", lineThumb(boundStyle))
	leg.add("peak requested")
	if ticks {
		leg.add("peak footprint:", lineThumb(footprintStyle))
		leg.add("driver pages")
	}
	bars.dropWideLabels(slotWidth(len(results), leg.width()))
	p.Add(bars)

	if sameBound {
		p.Add(hline{Y: u.Of(bound), Style: boundStyle})
	} else {
		// Not one bound: draw each policy's across its own pair of bars.
		for i, r := range results {
			p.Add(segment{X0: float64(i) - 0.45, X1: float64(i) + 0.45, Y: u.Of(r.PeakRequested), Style: boundStyle})
		}
	}

	for i, r := range results {
		if r.PeakFootprint > r.PeakReserved {
			p.Add(segment{X0: float64(i), X1: float64(i) + w, Y: u.Of(r.PeakFootprint), Style: footprintStyle})
		}
	}
	p.Add(leg)

	nominalPolicies(p, labels, leg.width())
	valueRange(p, math.Max(u.Of(top), minBytesTop), formatFixed)
	return p, nil
}

// footprintStyle marks a peak footprint: a solid black tick.
var footprintStyle = draw.LineStyle{Color: black, Width: vg.Points(2)}

// valueDecimals returns the decimals with which to print values up to top:
// three significant digits for the top.
func valueDecimals(top float64) int {
	switch {
	case top >= 100:
		return 0
	case top >= 10:
		return 1
	default:
		return 2
	}
}

// segment is a horizontal line from X0 to X1 at Y.
type segment struct {
	X0, X1, Y float64
	Style     draw.LineStyle
}

// Plot implements plot.Plotter.
func (s segment) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	c.StrokeLines(s.Style, c.ClipLinesXY([]vg.Point{{X: trX(s.X0), Y: trY(s.Y)}, {X: trX(s.X1), Y: trY(s.Y)}})...)
}

// DataRange implements plot.DataRanger.
func (s segment) DataRange() (xmin, xmax, ymin, ymax float64) { return s.X0, s.X1, s.Y, s.Y }

// logRatio is the ratio of largest to smallest non-zero count from which
// Calls uses a log scale.
const logRatio = 100

// Calls returns the bar chart of device calls per policy for results of
// one trace: for each policy (named on the X axis) a bar in its colour of
// its device allocations plus device frees (cudaMalloc and cudaFree calls),
// labelled with the count. The Y axis is logarithmic (drawn as log10 of the
// count on a linear axis, labelled with the counts) when the non-zero
// counts span a factor of 100 or more, linear otherwise. It returns
// ErrNoResults for no results and an error if the results come from more
// than one trace.
func Calls(results []sim.Result) (*plot.Plot, error) {
	trace, err := traceOf(results)
	if err != nil {
		return nil, err
	}
	labels := policyLabels(results)
	counts := make([]float64, len(results))
	hi, lo := 0.0, inf
	for i, r := range results {
		counts[i] = float64(max(r.DeviceAllocs, 0)) + float64(max(r.DeviceFrees, 0))
		hi = math.Max(hi, counts[i])
		if counts[i] > 0 {
			lo = math.Min(lo, counts[i])
		}
	}
	logScale := hi > 0 && hi/lo >= logRatio

	p := newPlot()
	setTitle(p, "device calls per policy: ", trace)
	p.Y.Label.Text = "device calls (allocs + frees)"
	bars := newBarSet(0)
	value := func(c float64) float64 { return c }
	if logScale {
		// A log scale drawn on a linear axis of log10(count), so that the
		// axis machinery (which would centre the axis label at the
		// arithmetic mean of a log range) stays linear. Bars rise from a
		// power of ten a decade below the smallest count, so that every
		// non-zero count shows as a bar.
		bars.Base = math.Floor(math.Log10(lo)) - 1
		value = func(c float64) float64 {
			if c <= 0 {
				return bars.Base
			}
			return math.Log10(c)
		}
		p.Y.Label.Text += ", log scale"
	}
	for i := range results {
		bars.Bars = append(bars.Bars, bar{X: float64(i), Width: 0.6, Value: value(counts[i]), Fill: policyColor(i), Label: formatExact(counts[i])})
	}
	bars.dropWideLabels(slotWidth(len(results), 0))
	p.Add(bars)
	nominalPolicies(p, labels, 0)
	switch {
	case logScale:
		p.Y.Min, p.Y.Max = bars.Base, math.Ceil(math.Log10(hi)-1e-9)
		p.Y.Tick.Marker = log10Ticker{}
	case hi < 5:
		// Small counts: whole-number ticks only.
		p.Y.Min, p.Y.Max = 0, math.Max(hi, 1)
		p.Y.Tick.Marker = roundTicker{Step: 1, Format: formatFixed}
	default:
		valueRange(p, hi, formatCount)
	}
	return p, nil
}
