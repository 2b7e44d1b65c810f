package plots

import (
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Drawer is a chart Render can draw: a *plot.Plot, or a Grid.
type Drawer interface {
	Draw(c draw.Canvas)
}

// Grid is a chart of small panels, one per policy, on the same axes, with
// a title above and a line of legend below. Size says how large it is
// drawn.
type Grid struct {
	Title  string
	Panels []*plot.Plot
	Cols   int
	Legend []legendEntry
	width  vg.Length
	height vg.Length
}

// Size returns the size at which Render draws the grid: the slides' width
// and height for up to 6 panels, larger for more (about 2.4 by 1.6 inches
// a panel).
func (g *Grid) Size() (width, height vg.Length) { return g.width, g.height }

// Rows returns the number of rows of panels.
func (g *Grid) Rows() int { return (len(g.Panels) + g.Cols - 1) / max(g.Cols, 1) }

// Sizer is a Drawer with a size of its own (a Grid); Render draws any
// other at Width x Height.
type Sizer interface {
	Size() (width, height vg.Length)
}

// gridTitleH and gridLegendH are the heights of a grid's title and legend
// bands.
const (
	gridTitleH  = 0.45 * vg.Inch
	gridLegendH = 0.35 * vg.Inch
)

// Draw implements Drawer.
func (g *Grid) Draw(c draw.Canvas) {
	c.SetColor(color.White)
	c.Fill(c.Rectangle.Path())
	title := text.Style{Font: font.From(sans, 14), Handler: plot.DefaultTextHandler, XAlign: draw.XCenter, YAlign: draw.YTop}
	c.FillText(title, vg.Point{X: c.Center().X, Y: c.Max.Y - vg.Points(8)}, g.Title)

	// The legend: one line of entries, centred.
	sty := text.Style{Font: font.From(sans, 10), Handler: plot.DefaultTextHandler, XAlign: draw.XLeft, YAlign: draw.YCenter}
	thumbW, gap := vg.Points(22), vg.Points(16)
	var total vg.Length
	for _, e := range g.Legend {
		total += thumbW + vg.Points(4) + sty.Rectangle(e.label).Size().X + gap
	}
	x, y := c.Center().X-(total-gap)/2, c.Min.Y+gridLegendH/2
	for _, e := range g.Legend {
		icon := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: x, Y: y - vg.Points(4)}, Max: vg.Point{X: x + thumbW, Y: y + vg.Points(4)}}}
		for _, t := range e.thumbs {
			t.Thumbnail(&icon)
		}
		c.FillText(sty, vg.Point{X: x + thumbW + vg.Points(4), Y: y}, e.label)
		x += thumbW + vg.Points(4) + sty.Rectangle(e.label).Size().X + gap
	}

	rows := g.Rows()
	if rows == 0 {
		return
	}
	body := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: c.Min.X, Y: c.Min.Y + gridLegendH},
		Max: vg.Point{X: c.Max.X, Y: c.Max.Y - gridTitleH},
	}}
	tiles := draw.Tiles{Rows: rows, Cols: g.Cols, PadX: vg.Points(6), PadY: vg.Points(6), PadTop: vg.Points(2), PadBottom: vg.Points(2), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	ps := make([][]*plot.Plot, rows)
	for r := range ps {
		ps[r] = make([]*plot.Plot, g.Cols)
		for k := range g.Cols {
			if i := r*g.Cols + k; i < len(g.Panels) {
				ps[r][k] = g.Panels[i]
			}
		}
	}
	canvases := plot.Align(ps, tiles, body)
	for r := range ps {
		for k, p := range ps[r] {
			if p != nil {
				p.Draw(canvases[r][k])
			}
		}
	}
}

// gridCols returns the columns of a grid of n panels: about 4 wide for
// every 3 high.
func gridCols(n int) int {
	if n <= 1 {
		return 1
	}
	return min(n, int(math.Ceil(math.Sqrt(float64(n)*1.3))))
}

// blankTicks keeps a ticker's ticks (and so the grid lines) without their
// labels, for the inner panels of a grid.
type blankTicks struct{ plot.Ticker }

// Ticks implements plot.Ticker.
func (b blankTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := b.Ticker.Ticks(lo, hi)
	for i := range ts {
		ts[i].Label = ""
	}
	return ts
}

// newPanel returns a small plot for a grid, in smaller fonts.
func newPanel(title string) *plot.Plot {
	p := newPlot()
	p.Title.Text = title
	p.Title.TextStyle.Font = font.From(sans, 9)
	p.Title.Padding = vg.Points(3)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 8)
		a.Tick.Label.Font = font.From(sans, 7)
		a.Tick.Length = vg.Points(3)
	}
	return p
}

// MemoryGrid returns the chart of memory over the trace of every result of
// one trace, a small panel each on the same axes (the trace's time in
// seconds, else events; bytes in MemoryOf's unit): in each, the trace's
// requested bytes, the lower bound, as a light grey area for reference,
// the policy's allocated bytes (thin, light) and reserved bytes (in its
// look), a cross at its first OOM (and "OOM" with how often in the
// panel's title) and the device capacity where MemoryOf draws it. Tick
// labels are on the outer panels only. It returns ErrNoResults for no
// results and an error if the results come from more than one trace.
func MemoryGrid(runs []results.Result) (*Grid, error) {
	trace, err := traceOf(runs)
	if err != nil {
		return nil, err
	}
	labels, _ := chartLabels(runs)
	looks := resultLooks(runs)
	ax := chooseX(runs)
	req := requestedSeries(runs)
	top, capacity, u := memoryScale(runs)
	name := baseName(trace)
	if name == "" {
		name = "(unnamed trace)"
	}
	g := &Grid{Title: "memory over the trace, every policy: " + name, Cols: gridCols(len(runs))}
	var reqXYs plotter.XYs
	if req >= 0 {
		reqXYs = seriesXYs(ax, runs[req].Series, func(pt results.Point) float64 { return u.Of(pt.Requested) })
	}
	anyOOM := false
	for i, r := range runs {
		title := labels[i]
		if failed(r) {
			title += " — OOM"
			if r.OOMs > 1 {
				title += fmt.Sprintf(" ×%d", r.OOMs)
			}
		}
		p := newPanel(title)
		if len(reqXYs) > 1 {
			l, err := plotter.NewLine(reqXYs)
			if err != nil {
				return nil, err
			}
			l.LineStyle = draw.LineStyle{Color: requestedFill, Width: vg.Points(0.5)}
			l.StepStyle = plotter.PreStep
			l.FillColor = requestedFill
			p.Add(l)
		}
		allocated := looks[i].line(vg.Points(0.75))
		allocated.Color = tint(looks[i].Color, 0.35)
		if err := addSteps(p, seriesXYs(ax, r.Series, func(pt results.Point) float64 { return u.Of(pt.Allocated) }), allocated); err != nil {
			return nil, err
		}
		if err := addSteps(p, seriesXYs(ax, r.Series, func(pt results.Point) float64 { return u.Of(pt.Reserved) }), looks[i].line(vg.Points(1.5))); err != nil {
			return nil, err
		}
		if pt, ok := oomPoint(r); ok {
			if err := addOOM(p, plotter.XY{X: ax.of(pt), Y: u.Of(pt.Reserved)}, black); err != nil {
				return nil, err
			}
			anyOOM = true
		}
		if capacity > 0 {
			p.Add(hline{Y: u.Of(capacity), Style: capacityStyle})
		}
		if len(r.Series) == 0 {
			p.Add(newNote("no series"))
		}
		xRange(p, ax, runs)
		valueRange(p, math.Max(u.Of(top), minBytesTop), formatFixed)
		col := i % g.Cols
		if col != 0 {
			p.Y.Tick.Marker = blankTicks{p.Y.Tick.Marker}
		}
		if col == 0 {
			p.Y.Label.Text = u.Name
		}
		// Only the bottom panel of each column (in the last row, or the
		// row above where the last row is short) has X labels.
		if i+g.Cols < len(runs) {
			p.X.Tick.Marker = blankTicks{p.X.Tick.Marker}
			p.X.Label.Text = ""
		}
		g.Panels = append(g.Panels, p)
	}
	g.Legend = []legendEntry{
		{label: "reserved", thumbs: []plot.Thumbnailer{lineThumb{Color: grey, Width: vg.Points(1.5)}}},
		{label: "allocated", thumbs: []plot.Thumbnailer{lineThumb{Color: tint(grey, 0.35), Width: vg.Points(0.75)}}},
		{label: "requested (lower bound)", thumbs: []plot.Thumbnailer{swatchThumb{fill: requestedFill}}},
	}
	if anyOOM {
		g.Legend = append(g.Legend, legendEntry{label: "first OOM", thumbs: []plot.Thumbnailer{glyphThumb(oomGlyph(black))}})
	}
	if capacity > 0 {
		g.Legend = append(g.Legend, legendEntry{label: "device capacity", thumbs: []plot.Thumbnailer{lineThumb(capacityStyle)}})
	}
	g.width, g.height = Width, Height
	if rows := g.Rows(); g.Cols > 3 || rows > 2 {
		g.width = max(Width, vg.Length(g.Cols)*2.4*vg.Inch)
		g.height = max(Height, vg.Length(rows)*1.6*vg.Inch+gridTitleH+gridLegendH)
	}
	return g, nil
}

// requestedFill is the colour of the requested bytes under a grid panel's
// lines.
var requestedFill = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
