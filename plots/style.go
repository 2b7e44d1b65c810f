package plots

import (
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"hash/fnv"
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

// okabeIto are the six hues of Okabe and Ito's colour-blind-safe palette
// (Color Universal Design, 2008): their black is the lower bound's and
// their yellow reads badly as a line on white, so neither is a policy's.
var okabeIto = []color.RGBA{
	{0x00, 0x72, 0xB2, 0xff}, // blue
	{0xD5, 0x5E, 0x00, 0xff}, // vermillion
	{0x00, 0x9E, 0x73, 0xff}, // bluish green
	{0xE6, 0x9F, 0x00, 0xff}, // orange
	{0x56, 0xB4, 0xE9, 0xff}, // sky blue
	{0xCC, 0x79, 0xA7, 0xff}, // reddish purple
}

// Line patterns of a look, by its Dash: solid, dashed, dotted, dash-dot
// (the order in which they tell lines apart best). A bar of the look is
// filled plain, hatched with rising, with falling or with level lines.
var dashPatterns = [][]vg.Length{
	nil,
	{vg.Points(7), vg.Points(3.5)},
	{vg.Points(1.2), vg.Points(2.4)},
	{vg.Points(9), vg.Points(3), vg.Points(1.5), vg.Points(3)},
}

// look is how one policy is drawn: a colour of okabeIto and a line
// pattern (dashPatterns, and the matching bar hatch). Thin doubles the
// combinations for charts of more than 24 series: a thinner line, a
// denser hatch.
type look struct {
	Color color.RGBA
	Dash  int
	Thin  bool
}

// lookOf returns the k'th of all looks: every colour solid first, then
// dashed, dotted, dash-dot, then all of them thin.
func lookOf(k int) look {
	n := len(okabeIto) * len(dashPatterns)
	k %= 2 * n
	return look{Color: okabeIto[k%len(okabeIto)], Dash: (k / len(okabeIto)) % len(dashPatterns), Thin: k >= n}
}

// policyLooks gives the built-in policies that are often compared their
// look in every chart: colour and pattern, no two alike. Any other policy
// (one registered by another module, an exec: or plan: policy) has a look
// derived from its name (lookFor); a chart that draws a policy twice
// (under two settings), or two policies of one look, gives the later the
// first look not yet taken in that chart (chartLooks).
var policyLooks = map[string]look{
	// solid
	"pytorch":    {Color: okabeIto[0], Dash: 0},
	"cuda":       {Color: okabeIto[1], Dash: 0},
	"slab":       {Color: okabeIto[2], Dash: 0},
	"cupy":       {Color: okabeIto[3], Dash: 0},
	"async-pool": {Color: okabeIto[4], Dash: 0},
	"bfc":        {Color: okabeIto[5], Dash: 0},
	// dashed
	"best-fit": {Color: okabeIto[0], Dash: 1},
	"rmm-pool": {Color: okabeIto[1], Dash: 1},
	"offline":  {Color: okabeIto[2], Dash: 1},
	"buddy":    {Color: okabeIto[3], Dash: 1},
	"paddle":   {Color: okabeIto[4], Dash: 1},
	"tlsf":     {Color: okabeIto[5], Dash: 1},
	// dotted
	"first-fit":      {Color: okabeIto[0], Dash: 2},
	"rmm-binning":    {Color: okabeIto[1], Dash: 2},
	"greedy-by-size": {Color: okabeIto[2], Dash: 2},
	"fixed-block":    {Color: okabeIto[3], Dash: 2},
	"rmm-arena":      {Color: okabeIto[4], Dash: 2},
	"workspace":      {Color: okabeIto[5], Dash: 2},
	// dash-dot
	"greedy-by-lifetime": {Color: okabeIto[2], Dash: 3},
	"gmlake":             {Color: okabeIto[5], Dash: 3},
	"vattention":         {Color: okabeIto[1], Dash: 3},
	"stalloc":            {Color: okabeIto[3], Dash: 3},
	"optimal":            {Color: okabeIto[4], Dash: 3},
}

// chartLooks returns the look of each policy name of a chart (names may
// repeat: a policy under two settings): its policyLooks entry, or, where
// that is taken in the chart already or the policy has none, the first
// look not taken, of the same colour if one is left. No two entries are
// alike for up to 48 names.
func chartLooks(names []string) []look {
	out := make([]look, len(names))
	taken := map[look]bool{}
	var later []int
	for i, n := range names {
		l := lookFor(n)
		if taken[l] {
			later = append(later, i)
			continue
		}
		out[i] = l
		taken[l] = true
	}
	total := 2 * len(okabeIto) * len(dashPatterns)
	for _, i := range later {
		want, known := lookFor(names[i]), true
		pick := -1
		for k := range total {
			l := lookOf(k)
			if taken[l] {
				continue
			}
			if pick < 0 {
				pick = k
			}
			if known && l.Color == want.Color {
				pick = k
				break
			}
		}
		if pick < 0 {
			pick = i // more than 48: they repeat
		}
		out[i] = lookOf(pick)
		taken[out[i]] = true
	}
	return out
}

// lookFor returns the look of the policy called name: its policyLooks
// entry, else one of the looks no entry has (the thin ones last), chosen
// by a hash of the name, so that a policy keeps its look from chart to
// chart and run to run.
func lookFor(name string) look {
	if l, ok := policyLooks[name]; ok {
		return l
	}
	given := map[look]bool{}
	for _, l := range policyLooks {
		given[l] = true
	}
	var free []look
	for k := range 2 * len(okabeIto) * len(dashPatterns) {
		if l := lookOf(k); !given[l] && !l.Thin {
			free = append(free, l)
		}
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return free[h.Sum32()%uint32(len(free))]
}

// dashArray returns the look's dash pattern in points (on, off, ...),
// nil for a solid line: for the report's charts, drawn in the browser.
func (l look) dashArray() []float64 {
	var out []float64
	for _, d := range dashPatterns[l.Dash] {
		out = append(out, float64(d/vg.Points(1)))
	}
	return out
}

// reportSims returns the sim results of rs.
func reportSims(rs []ReportResult) []results.Result {
	out := make([]results.Result, len(rs))
	for i, r := range rs {
		out[i] = r.Result
	}
	return out
}

// resultLooks returns chartLooks of the results' policy names.
func resultLooks(runs []results.Result) []look {
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.Policy
	}
	return chartLooks(names)
}

// line returns the look's line at width (half as wide for a thin look).
func (l look) line(width vg.Length) draw.LineStyle {
	if l.Thin {
		width /= 2
	}
	return draw.LineStyle{Color: l.Color, Width: width, Dashes: dashPatterns[l.Dash]}
}

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
func policyLabels(runs []results.Result) []string {
	labels := make([]string, len(runs))
	count := map[string]int{}
	for i, r := range runs {
		labels[i] = r.Policy
		if labels[i] == "" {
			labels[i] = "(unnamed)"
		}
		count[labels[i]]++
	}
	for i, r := range runs {
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

// chartLabels returns the name to show for each result in a chart and the
// key to the names it abbreviates: its policy name, with its settings
// where two results share a policy name, then " #2", " #3" where even
// that does not tell them apart. Names are never cut: a name with
// settings longer than maxPolicyLabel characters shows as the policy name
// and a mark, "pytorch [1]", and the key has a line "[1] the settings"
// for it.
func chartLabels(runs []results.Result) (labels, key []string) {
	full := make([]string, len(runs))
	count := map[string]int{}
	for i, r := range runs {
		full[i] = r.Policy
		if full[i] == "" {
			full[i] = "(unnamed)"
		}
		count[full[i]]++
	}
	settings := make([]string, len(runs))
	for i, r := range runs {
		if count[full[i]] > 1 && len(r.Settings) > 0 {
			settings[i] = results.JoinSettings(r.Settings, ",")
		}
	}
	return keyed(full, settings)
}

// keyed returns, for names and their settings ("" for none), the labels
// "name settings", "name [k]" where that is longer than maxPolicyLabel
// characters, and " #n" after labels that would repeat; and the key lines
// "[k] settings".
func keyed(names, settings []string) (labels, key []string) {
	labels = make([]string, len(names))
	marks := map[string]int{}
	for i, n := range names {
		labels[i] = n
		if settings[i] == "" {
			continue
		}
		if l := n + " " + settings[i]; len([]rune(l)) <= maxPolicyLabel {
			labels[i] = l
			continue
		}
		k, ok := marks[settings[i]]
		if !ok {
			k = len(marks) + 1
			marks[settings[i]] = k
			key = append(key, fmt.Sprintf("[%d] %s", k, settings[i]))
		}
		labels[i] = fmt.Sprintf("%s [%d]", n, k)
	}
	seen := map[string]int{}
	for _, l := range labels {
		seen[l]++
	}
	nth := map[string]int{}
	for i, l := range labels {
		if seen[l] > 1 {
			nth[l]++
			labels[i] = fmt.Sprintf("%s #%d", l, nth[l])
		}
	}
	return labels, key
}

// wrapWords breaks s into lines of at most n characters at spaces and
// after commas, never inside a word (a longer word has a line of its
// own).
func wrapWords(s string, n int) string {
	type word struct {
		text  string
		space bool // a space before it in s
	}
	var words []word
	for _, f := range strings.Fields(s) {
		for j, p := range strings.SplitAfter(f, ",") {
			if p != "" {
				words = append(words, word{p, j == 0})
			}
		}
	}
	var b strings.Builder
	line := 0
	for i, w := range words {
		l := len([]rune(w.text))
		sep := 0
		if w.space {
			sep = 1
		}
		switch {
		case i == 0:
		case line+sep+l > n:
			b.WriteString("\n")
			line = 0
		case w.space:
			b.WriteByte(' ')
			line++
		}
		b.WriteString(w.text)
		line += l
	}
	return b.String()
}

// addKey adds the key lines to the legend, each wrapped to keyWidth
// characters.
func (l *sideLegend) addKey(key []string) {
	if len(key) == 0 {
		return
	}
	l.add("")
	for _, k := range key {
		for _, line := range strings.Split(wrapWords(k, keyWidth), "\n") {
			l.add(line)
		}
	}
}

// keyWidth is the width, in characters, of the lines of a chart's key.
const keyWidth = 26

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
	if len(l.entries) == 0 {
		return 0
	}
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
