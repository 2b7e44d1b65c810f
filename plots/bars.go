package plots

import (
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"image/color"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// bar is one bar of a barSet, in data coordinates: centred on X, Width wide,
// from the set's base up to Value.
type bar struct {
	X, Width, Value float64
	Fill            color.Color
	// Hatch is the pattern over the fill: 0 none, 1 rising, 2 falling, 3
	// level lines (a look's Dash); Dense draws it twice as dense.
	Hatch int
	Dense bool
	// OOM marks a run that ran out of memory: the fill washed out and
	// crossed with black hatching, so that its low bar does not read as
	// the best.
	OOM bool
	// Broken marks a bar cut at Value, lower than its true value (which
	// its label should say): a break drawn across it near the top.
	Broken bool
	Label  string // drawn above the bar, may have several lines
	// LabelAt is where the label starts when above Value (a mark over
	// the bar's top: a footprint tick).
	LabelAt float64
}

// labelY returns the value above which br's label starts.
func (br bar) labelY() float64 { return math.Max(br.Value, br.LabelAt) }

// setLook fills the bar in a policy's look: its colour and hatch.
func (b *bar) setLook(l look) { b.Fill, b.Hatch, b.Dense = l.Color, l.Dash, l.Thin }

// barSet draws bars with per-bar colours, hatches and labels. Unlike
// plotter.BarChart its bars may differ in colour, and on a log axis they
// rise from Base rather than from 0. Labels are drawn level above their
// bars, or, with Rotate, on one line reading upwards from the bar's top.
type barSet struct {
	Bars   []bar
	Base   float64
	Line   draw.LineStyle
	Label  text.Style
	Rotate bool
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

// labelStyle returns the style the labels are drawn in.
func (b *barSet) labelStyle() text.Style {
	sty := b.Label
	if b.Rotate {
		sty.Rotation = math.Pi / 2
		sty.XAlign = draw.XLeft
		sty.YAlign = draw.YCenter
	}
	return sty
}

// label returns br's label as drawn: on one line when rotated.
func (b *barSet) label(br bar) string {
	if b.Rotate {
		return strings.ReplaceAll(br.Label, "\n", " ")
	}
	return br.Label
}

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
			r := vg.Rectangle{Min: vg.Point{X: x0, Y: max(y0, c.Min.Y)}, Max: vg.Point{X: x1, Y: min(top, c.Max.Y)}}
			fillBar(c, r, br, b.Line)
			if br.Broken {
				breakMark(c, x0, x1, top-vg.Points(7))
			}
		}
	}
}

// barLabels draws a barSet's labels; a chart adds it after its lines, so
// that no bar or line covers a label.
type barLabels struct{ *barSet }

// labels returns the plotter of b's labels.
func (b *barSet) labels() barLabels { return barLabels{b} }

// Plot implements plot.Plotter.
func (l barLabels) Plot(c draw.Canvas, p *plot.Plot) {
	b := l.barSet
	trX, trY := p.Transforms(&c)
	base := math.Max(b.Base, p.Y.Min)
	sty := b.labelStyle()
	for _, br := range b.Bars {
		x0, x1 := trX(br.X-br.Width/2), trX(br.X+br.Width/2)
		if br.Label != "" {
			// On a white ground, so that lines across (the lower bound,
			// the grid) do not run through the text.
			y := trY(math.Max(br.labelY(), base))
			at := vg.Point{X: (x0 + x1) / 2, Y: y + vg.Points(labelGap)}
			r := sty.Rectangle(b.label(br))
			r.Min, r.Max = r.Min.Add(at), r.Max.Add(at)
			c.FillPolygon(color.White, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
			c.FillText(sty, at, b.label(br))
		}
	}
}

// fillBar fills r as br is drawn: its fill, washed out and crossed with
// black for a run out of memory, else hatched in white by its look; then
// outlined in line.
func fillBar(c draw.Canvas, r vg.Rectangle, br bar, line draw.LineStyle) {
	pts := []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}}
	fill := br.Fill
	if br.OOM {
		fill = tint(toRGBA(br.Fill), 0.7)
	}
	c.FillPolygon(fill, pts)
	switch {
	case br.OOM:
		cross := draw.LineStyle{Color: black, Width: vg.Points(0.6)}
		hatch(c, r, 1, vg.Points(3.5), cross)
		hatch(c, r, 2, vg.Points(3.5), cross)
	case br.Hatch > 0:
		gap := vg.Points(4)
		if br.Dense {
			gap /= 2
		}
		hatch(c, r, br.Hatch, gap, draw.LineStyle{Color: color.White, Width: vg.Points(1)})
	}
	c.StrokeLines(line, append(pts, pts[0]))
}

// thumbRect is the rectangle of a legend thumbnail a bar is drawn in.
func thumbRect(c *draw.Canvas) vg.Rectangle {
	r := c.Rectangle
	r.Min.X += c.Size().X * 0.15
	r.Max.X -= c.Size().X * 0.15
	return r
}

// toRGBA converts c to color.RGBA (opaque colours only are used here).
func toRGBA(c color.Color) color.RGBA {
	if c == nil {
		return grey
	}
	r, g, b, a := c.RGBA()
	return color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), uint8(a >> 8)}
}

// hatch draws parallel lines gap apart across r: kind 1 rising, 2 falling,
// 3 level.
func hatch(c draw.Canvas, r vg.Rectangle, kind int, gap vg.Length, sty draw.LineStyle) {
	w, h := r.Max.X-r.Min.X, r.Max.Y-r.Min.Y
	if w <= 0 || h <= 0 {
		return
	}
	if kind == 3 {
		for y := r.Min.Y + gap/2; y < r.Max.Y; y += gap {
			c.StrokeLine2(sty, r.Min.X, y, r.Max.X, y)
		}
		return
	}
	// Lines at 45 degrees: y - x = k (rising) or y + x = k (falling),
	// clipped to r; k steps by gap·√2 so that the lines are gap apart.
	step := gap * math.Sqrt2
	for k := -w; k < h; k += step {
		// In r's own coordinates (u, v from its lower left corner) a
		// rising line is v = u + k, a falling one v = w - u + k.
		u0, u1 := max(0, -k), min(w, h-k)
		if u1 <= u0 {
			continue
		}
		if kind == 1 {
			c.StrokeLine2(sty, r.Min.X+u0, r.Min.Y+u0+k, r.Min.X+u1, r.Min.Y+u1+k)
		} else {
			c.StrokeLine2(sty, r.Max.X-u0, r.Min.Y+u0+k, r.Max.X-u1, r.Min.Y+u1+k)
		}
	}
}

// breakMark draws the mark of a cut bar across x0..x1 at y: a white gap
// between two slanted lines, as an axis break is drawn.
func breakMark(c draw.Canvas, x0, x1, y vg.Length) {
	d := (x1 - x0) * 0.35
	gap := vg.Points(3)
	x0, x1 = x0-vg.Points(1.5), x1+vg.Points(1.5)
	c.FillPolygon(color.White, []vg.Point{{X: x0, Y: y - d}, {X: x1, Y: y + d}, {X: x1, Y: y + d + gap}, {X: x0, Y: y - d + gap}})
	edge := draw.LineStyle{Color: black, Width: vg.Points(0.7)}
	c.StrokeLine2(edge, x0, y-d, x1, y+d)
	c.StrokeLine2(edge, x0, y-d+gap, x1, y+d+gap)
}

// breakThumb is the legend's picture of a cut bar.
type breakThumb struct{ fill color.Color }

// Thumbnail implements plot.Thumbnailer.
func (t breakThumb) Thumbnail(c *draw.Canvas) {
	swatchThumb{fill: t.fill, line: black}.Thumbnail(c)
	r := c.Rectangle
	breakMark(*c, r.Min.X+c.Size().X*0.15, r.Max.X-c.Size().X*0.15, r.Min.Y+c.Size().Y*0.3)
}

// hatchThumb is the legend's picture of a bar in a look.
type hatchThumb struct{ b bar }

// Thumbnail implements plot.Thumbnailer.
func (t hatchThumb) Thumbnail(c *draw.Canvas) {
	fillBar(*c, thumbRect(c), t.b, draw.LineStyle{Color: black, Width: vg.Points(0.5)})
}

// oomThumb is the legend's picture of a bar of a run that ran out of
// memory.
type oomThumb struct{}

// Thumbnail implements plot.Thumbnailer.
func (oomThumb) Thumbnail(c *draw.Canvas) {
	fillBar(*c, thumbRect(c), bar{Fill: grey, OOM: true}, draw.LineStyle{Color: black, Width: vg.Points(0.5)})
}

// DataRange implements plot.DataRanger.
func (b *barSet) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax, ymin, ymax = inf, -inf, b.Base, b.Base
	for _, br := range b.Bars {
		xmin = math.Min(xmin, br.X-br.Width/2)
		xmax = math.Max(xmax, br.X+br.Width/2)
		ymax = math.Max(ymax, br.labelY())
	}
	return xmin, xmax, ymin, ymax
}

// GlyphBoxes implements plot.GlyphBoxer, so that the plot leaves room
// above the highest bars for their labels.
func (b *barSet) GlyphBoxes(p *plot.Plot) []plot.GlyphBox {
	var boxes []plot.GlyphBox
	sty := b.labelStyle()
	for _, br := range b.Bars {
		if br.Label == "" {
			continue
		}
		v := math.Max(br.labelY(), math.Max(b.Base, p.Y.Min))
		r := sty.Rectangle(b.label(br))
		r.Min.Y += vg.Points(labelGap)
		r.Max.Y += vg.Points(labelGap)
		boxes = append(boxes, plot.GlyphBox{X: p.X.Norm(br.X), Y: p.Y.Norm(v), Rectangle: r})
	}
	return boxes
}

// slotWidth returns about how wide the room for each of n policies is on
// a nominal X axis of a chart width wide: the width less the Y axis
// (about an inch) and a legend of width legendW, shared among them.
func slotWidth(n int, width, legendW vg.Length) vg.Length {
	return (width - vg.Inch - legendW) / vg.Length(max(n, 1))
}

// fitLabels keeps every label and makes them fit bars room apart (the
// distance between neighbouring labelled bars): level where each fits in
// its room, else turned upright on one line, in a smaller font where even
// a line's height would not fit, so that no two labels overlap.
func (b *barSet) fitLabels(room vg.Length) {
	b.Rotate = false
	for _, br := range b.Bars {
		if b.Label.Rectangle(br.Label).Size().X > room*0.95 {
			b.Rotate = true
			break
		}
	}
	if !b.Rotate {
		return
	}
	if h := b.Label.FontExtents().Height; h > room*0.9 {
		b.Label.Font.Size = max(b.Label.Font.Size*room*0.9/h, vg.Points(4))
	}
}

// nominalPolicies makes p's X axis name the policies at 0, 1, ..., each
// name whole: level where the names fit side by side in the room left by
// a legend of width legendW in a chart width wide, else turned by 45
// degrees where neighbours do not overlap so, else upright (in a smaller
// font where even that would not fit).
func nominalPolicies(p *plot.Plot, labels []string, width, legendW vg.Length) {
	p.NominalX(labels...)
	// NominalX pads the Y axis for a first name centred on the data's
	// edge; here each name is centred in its own slot.
	p.Y.Padding = vg.Points(2)
	p.X.Min, p.X.Max = -0.5, float64(len(labels))-0.5
	slot := slotWidth(len(labels), width, legendW)
	var widest vg.Length
	for _, l := range labels {
		widest = max(widest, p.X.Tick.Label.Rectangle(l).Size().X)
	}
	p.X.Label.Text = ""
	if widest <= slot*0.92 {
		return
	}
	h := p.X.Tick.Label.FontExtents().Height
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	// Neighbouring names turned by an angle a are slot·sin(a) apart.
	if h*1.1 <= slot*vg.Length(math.Sin(math.Pi/4)) {
		p.X.Tick.Label.Rotation = math.Pi / 4
		return
	}
	p.X.Tick.Label.Rotation = math.Pi / 2
	if h*1.05 > slot {
		p.X.Tick.Label.Font.Size = max(p.X.Tick.Label.Font.Size*slot/(h*1.05), vg.Points(4))
	}
}

// Peaks returns the bar chart of peak memory per policy for results of one
// trace: for each policy (named on the X axis) a bar of its peak allocated
// bytes (light) and one of its peak reserved bytes (in the policy's look,
// labelled with its value and its excess over the lower bound), against
// the lower bound, the trace's peak requested bytes, drawn as a dashed
// black line. The reserved bar of a policy that ran out of memory is
// washed out and crossed with black hatching, labelled "OOM" (with how
// often) in place of its excess, and the legend says so: it served less
// than the trace asked, so its low peak is no sign of a good policy.
// Where a policy's peak footprint (the card's memory its segments take as
// the driver takes them, results.Result.PeakFootprint) is above its peak
// reserved bytes, a solid black tick across the reserved bar marks it.
// Every bar is labelled; labels turn upright where they would not fit
// side by side, and long names with settings are keyed in the legend
// (chartLabels). Bytes are in MiB or GiB (ChooseUnit of the largest
// value). It returns ErrNoResults for no results and an error if the
// results come from more than one trace.
// The bars are in the order of their figures (byFigure).
func Peaks(runs []results.Result) (*plot.Plot, error) { return peaks(runs, nil) }

// peaks is Peaks, in unit where it is not nil (the unit of the report's
// section), else in ChooseUnit's.
func peaks(runs []results.Result, unit *Unit) (*plot.Plot, error) {
	runs = byFigure(runs)
	trace, err := traceOf(runs)
	if err != nil {
		return nil, err
	}
	labels, key := chartLabels(runs)
	looks := resultLooks(runs)
	var top, bound uint64
	ticks, anyOOM := false, false
	for _, r := range runs {
		top = max(top, r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.PeakFootprint)
		ticks = ticks || r.PeakFootprint > r.PeakReserved
		anyOOM = anyOOM || failed(r)
		bound = max(bound, r.PeakRequested)
	}
	u := ChooseUnit(top)
	if unit != nil {
		u = *unit
	}

	p := newPlot()
	setTitle(p, "peak memory per policy: ", trace)
	p.Y.Label.Text = "peak memory (" + u.Name + ")"
	bars := newBarSet(0)
	const w = 0.36
	for i, r := range runs {
		reserved := bar{X: float64(i) + w/2, Width: w, Value: u.Of(r.PeakReserved), Label: peakLabel(r, u, top), OOM: failed(r)}
		if r.PeakFootprint > r.PeakReserved {
			reserved.LabelAt = u.Of(r.PeakFootprint)
		}
		reserved.setLook(looks[i])
		bars.Bars = append(bars.Bars,
			bar{X: float64(i) - w/2, Width: w, Value: u.Of(r.PeakAllocated), Fill: tint(looks[i].Color, 0.6)},
			reserved,
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
	if anyOOM {
		leg.add("ran out of memory:", oomThumb{})
		leg.add("peak not comparable")
	}
	leg.add("")
	leg.add("labels: peak reserved,")
	leg.add("% over the lower bound")
	leg.addKey(key)
	bars.fitLabels(slotWidth(len(runs), Width, leg.width()))
	p.Add(bars)

	// The trace's lower bound is the largest peak requested of its
	// results (one that ran out of memory did not count the requests its
	// failed mallocs would have held after): one line across every bar.
	p.Add(hline{Y: u.Of(bound), Style: boundStyle})

	for i, r := range runs {
		if r.PeakFootprint > r.PeakReserved {
			p.Add(segment{X0: float64(i), X1: float64(i) + w, Y: u.Of(r.PeakFootprint), Style: footprintStyle})
		}
	}
	p.Add(bars.labels())
	p.Add(leg)

	nominalPolicies(p, labels, Width, leg.width())
	valueRange(p, math.Max(u.Of(top), minBytesTop), formatFixed)
	return p, nil
}

// failed reports whether r's replay ran out of memory (or its policy
// could not be built, so that every malloc was one): its peaks are those
// of the part it served, not comparable with a run that served all.
func failed(r results.Result) bool { return r.OOMs > 0 || r.BuildError != "" }

// peakLabel returns the label of r's peak reserved bar in unit u, for
// values up to top bytes: the value, then its excess over the lower bound
// ("+27%"), or, for a run that ran out of memory, "OOM" and how often.
func peakLabel(r results.Result, u Unit, top uint64) string {
	label := "0"
	if r.PeakReserved > 0 {
		label = fmt.Sprintf("%.*f", valueDecimals(u.Of(top)), u.Of(r.PeakReserved))
	}
	switch {
	case failed(r):
		label += "\nOOM"
		if r.OOMs > 1 {
			label += fmt.Sprintf(" ×%d", r.OOMs)
		}
	case r.PeakRequested > 0 && r.PeakReserved > 0:
		ratio, _ := r.ReservedOverRequested()
		label += fmt.Sprintf("\n%+.0f%%", 100*(ratio-1))
	}
	return label
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
func Calls(runs []results.Result) (*plot.Plot, error) {
	trace, err := traceOf(runs)
	if err != nil {
		return nil, err
	}
	labels, key := chartLabels(runs)
	looks := resultLooks(runs)
	counts := make([]float64, len(runs))
	hi, lo := 0.0, inf
	for i, r := range runs {
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
	anyOOM := false
	for i, r := range runs {
		b := bar{X: float64(i), Width: 0.6, Value: value(counts[i]), Label: formatExact(counts[i]), OOM: failed(r)}
		b.setLook(looks[i])
		bars.Bars = append(bars.Bars, b)
		anyOOM = anyOOM || b.OOM
	}
	leg := newSideLegend()
	if anyOOM {
		leg.add("ran out of memory", oomThumb{})
	}
	leg.addKey(key)
	if len(leg.entries) > 0 {
		p.Add(leg)
	}
	bars.fitLabels(slotWidth(len(runs), Width, leg.width()))
	p.Add(bars, bars.labels())
	nominalPolicies(p, labels, Width, leg.width())
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

// byFigure returns runs in the order of their figures (results.ByFigure):
// those without OOM first, by peak reserved bytes.
func byFigure(runs []results.Result) []results.Result {
	ps := make([]*results.Result, len(runs))
	for i := range runs {
		ps[i] = &runs[i]
	}
	out := make([]results.Result, len(runs))
	for i, p := range results.ByFigure(ps) {
		out[i] = *p
	}
	return out
}
