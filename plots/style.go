package plots

import (
	"fmt"
	"image/color"
	"maps"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gpualloc/allocsim/sim"
)

// Width and Height are the size at which Render and WriteAll draw a chart
// (16:9, for slides); DPI is the resolution of PNG output, so a PNG is
// 1200x675 pixels.
const (
	Width  = 8 * vg.Inch
	Height = 4.5 * vg.Inch
	DPI    = 150
)

var inf = math.Inf(1)

// sans is the typeface of every text in the charts.
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

// palette holds the policy colours: the Okabe-Ito colours (safe for colour
// blind readers, without yellow and black, which read badly on white and
// black is the lower bound's), then darker and brighter ones, so that all
// the registered policies get a colour of their own in one chart. Colours
// repeat after the last.
var palette = []color.RGBA{
	{0x00, 0x72, 0xB2, 0xff}, // blue
	{0xD5, 0x5E, 0x00, 0xff}, // vermillion
	{0x00, 0x9E, 0x73, 0xff}, // bluish green
	{0xCC, 0x79, 0xA7, 0xff}, // reddish purple
	{0xE6, 0x9F, 0x00, 0xff}, // orange
	{0x56, 0xB4, 0xE9, 0xff}, // sky blue
	{0x8C, 0x56, 0x4B, 0xff}, // brown
	{0x59, 0x59, 0x59, 0xff}, // dark grey
	{0x9A, 0x9A, 0x00, 0xff}, // olive
	{0x1F, 0x3A, 0x93, 0xff}, // navy
	{0xA5, 0x1C, 0x30, 0xff}, // crimson
	{0x00, 0x60, 0x4A, 0xff}, // dark teal
	{0x6A, 0x3D, 0x9A, 0xff}, // purple
	{0xB1, 0x59, 0x28, 0xff}, // rust
	{0x33, 0xA0, 0x2C, 0xff}, // green
	{0xFB, 0x6A, 0x9A, 0xff}, // pink
	{0x1B, 0x9E, 0xC4, 0xff}, // cyan
	{0x7F, 0x6A, 0x00, 0xff}, // dark gold
	{0x99, 0x99, 0xCC, 0xff}, // lavender
	{0x3B, 0x3B, 0x3B, 0xff}, // charcoal
}

// policyColor returns the colour of the i'th policy of a chart.
func policyColor(i int) color.RGBA { return palette[i%len(palette)] }

// tint returns c mixed with white, f of the way to white.
func tint(c color.RGBA, f float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(float64(v) + (255-float64(v))*f + 0.5) }
	return color.RGBA{mix(c.R), mix(c.G), mix(c.B), 0xff}
}

var (
	black     = color.RGBA{A: 0xff}
	grey      = color.RGBA{0x70, 0x70, 0x70, 0xff}
	lightGrey = color.RGBA{0xc8, 0xc8, 0xc8, 0xff}
	gridGrey  = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
)

// maxPolicyLabel is the length, in characters, beyond which policy names
// are shortened in the middle (so that distinguishing suffixes such as
// settings survive).
const (
	maxPolicyLabel = 28
)

// newPlot returns a plot with the package's fonts and light horizontal
// grid lines.
func newPlot() *plot.Plot {
	p := plot.New()
	p.Title.TextStyle.Font = font.From(sans, 14)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, 12)
		a.Tick.Label.Font = font.From(sans, 10)
		a.Padding = vg.Points(2)
	}
	p.X.Label.Padding = vg.Points(4)
	p.Y.Label.Padding = vg.Points(4)
	p.Legend.TextStyle.Font = font.From(sans, 10)
	grid := plotter.NewGrid()
	grid.Vertical.Color = nil
	grid.Horizontal.Color = gridGrey
	grid.Horizontal.Width = vg.Points(0.6)
	p.Add(grid)
	return p
}

// shorten returns s, or s with its middle replaced by "…" so that it is at
// most n characters long.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n || n < 5 {
		return s
	}
	head := (n - 1) / 2
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:])
}

// policyLabels returns the name to show for each result: its policy name,
// with its settings where two results share a policy name, then a number
// where even that does not tell them apart; shortened to maxPolicyLabel
// characters.
func policyLabels(results []sim.Result) []string {
	labels := make([]string, len(results))
	count := map[string]int{}
	for i, r := range results {
		labels[i] = r.Policy
		if labels[i] == "" {
			labels[i] = "(unnamed)"
		}
		count[labels[i]]++
	}
	for i, r := range results {
		if count[labels[i]] > 1 && len(r.Settings) > 0 {
			var kv []string
			for _, k := range slices.Sorted(maps.Keys(r.Settings)) {
				kv = append(kv, k+"="+r.Settings[k])
			}
			labels[i] += " " + strings.Join(kv, ",")
		}
	}
	seen := map[string]int{}
	for i := range labels {
		labels[i] = shorten(labels[i], maxPolicyLabel)
		seen[labels[i]]++
	}
	nth := map[string]int{}
	for i, l := range labels {
		if seen[l] > 1 {
			nth[l]++
			labels[i] = fmt.Sprintf("%s #%d", shorten(l, maxPolicyLabel-3), nth[l])
		}
	}
	return labels
}

// legendEntry is one line of a sideLegend.
type legendEntry struct {
	label  string
	thumbs []plot.Thumbnailer
}

// sideLegend is a legend drawn to the right of the data area, outside it,
// so that it never covers data. As a plot.GlyphBoxer it makes the plot
// leave room for itself; the plot's own legend stays empty.
type sideLegend struct {
	entries []legendEntry
	style   text.Style
	gap     vg.Length // between the data area and the thumbnails
	thumbW  vg.Length
}

func newSideLegend() *sideLegend {
	return &sideLegend{
		style: text.Style{
			Font:    font.From(sans, 10),
			Handler: plot.DefaultTextHandler,
			XAlign:  draw.XLeft,
			YAlign:  draw.YCenter,
		},
		gap:    vg.Points(14),
		thumbW: vg.Points(22),
	}
}

// add appends an entry; an empty label with no thumbnails is a blank line.
func (l *sideLegend) add(label string, thumbs ...plot.Thumbnailer) {
	l.entries = append(l.entries, legendEntry{label: label, thumbs: thumbs})
}

func (l *sideLegend) em() vg.Length { return l.style.Rectangle("M").Max.X }

// width returns the room the legend needs right of the data area.
func (l *sideLegend) width() vg.Length {
	var w vg.Length
	for _, e := range l.entries {
		w = max(w, l.style.Rectangle(e.label).Max.X)
	}
	return l.gap + l.thumbW + l.em()/2 + w + l.em()
}

// GlyphBoxes implements plot.GlyphBoxer: one box right of the data area,
// as wide as the legend and of no height.
func (l *sideLegend) GlyphBoxes(*plot.Plot) []plot.GlyphBox {
	if len(l.entries) == 0 {
		return nil
	}
	return []plot.GlyphBox{{X: 1, Y: 0.5, Rectangle: vg.Rectangle{Max: vg.Point{X: l.width()}}}}
}

// Plot implements plot.Plotter; it draws the entries from the top right of
// c downwards, in a smaller font if they would not fit in c's height.
func (l *sideLegend) Plot(c draw.Canvas, _ *plot.Plot) {
	if len(l.entries) == 0 {
		return
	}
	sty := l.style
	lineH := sty.FontExtents().Height * 1.3
	if need := lineH * vg.Length(len(l.entries)); need > c.Size().Y && need > 0 {
		f := c.Size().Y / need
		sty.Font.Size *= f
		lineH *= f
	}
	x := c.Max.X + l.gap
	y := c.Max.Y
	for _, e := range l.entries {
		icon := draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
			Min: vg.Point{X: x, Y: y - lineH*0.85},
			Max: vg.Point{X: x + l.thumbW, Y: y - lineH*0.15},
		}}
		for _, t := range e.thumbs {
			t.Thumbnail(&icon)
		}
		c.FillText(sty, vg.Point{X: x + l.thumbW + l.em()/2, Y: y - lineH/2}, e.label)
		y -= lineH
	}
}

// lineThumb draws a short line in a style.
type lineThumb draw.LineStyle

// Thumbnail implements plot.Thumbnailer.
func (t lineThumb) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(draw.LineStyle(t), c.Min.X, y, c.Max.X, y)
}

// glyphThumb draws one glyph at the centre.
type glyphThumb draw.GlyphStyle

// Thumbnail implements plot.Thumbnailer.
func (t glyphThumb) Thumbnail(c *draw.Canvas) { c.DrawGlyph(draw.GlyphStyle(t), c.Center()) }

// swatchThumb fills the thumbnail with a colour, outlined.
type swatchThumb struct {
	fill, line color.Color
}

// Thumbnail implements plot.Thumbnailer.
func (t swatchThumb) Thumbnail(c *draw.Canvas) {
	r := c.Rectangle
	r.Min.X += c.Size().X * 0.15
	r.Max.X -= c.Size().X * 0.15
	pts := []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}}
	c.FillPolygon(t.fill, pts)
	if t.line != nil {
		c.StrokeLines(draw.LineStyle{Color: t.line, Width: vg.Points(0.5)}, append(pts, pts[0]))
	}
}

// note is a text drawn at the centre of the data area, for charts with
// nothing to show.
type note struct {
	text  string
	style text.Style
}

func newNote(s string) *note {
	return &note{text: s, style: text.Style{
		Font:    font.From(sans, 12),
		Handler: plot.DefaultTextHandler,
		Color:   grey,
		XAlign:  draw.XCenter,
		YAlign:  draw.YCenter,
	}}
}

// Plot implements plot.Plotter.
func (n *note) Plot(c draw.Canvas, _ *plot.Plot) { c.FillText(n.style, c.Center(), n.text) }

// hline is a horizontal line across the whole data area at Y.
type hline struct {
	Y     float64
	Style draw.LineStyle
}

// Plot implements plot.Plotter.
func (h hline) Plot(c draw.Canvas, p *plot.Plot) {
	if h.Y < p.Y.Min || h.Y > p.Y.Max {
		return
	}
	_, trY := p.Transforms(&c)
	y := trY(h.Y)
	c.StrokeLine2(h.Style, c.Min.X, y, c.Max.X, y)
}

// DataRange implements plot.DataRanger: the line needs its Y in range and
// says nothing about X.
func (h hline) DataRange() (xmin, xmax, ymin, ymax float64) {
	return inf, -inf, h.Y, h.Y
}
