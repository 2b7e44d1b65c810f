package plots

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gpualloc/allocsim/sim/results"
)

// overviewTop is the highest ratio the overview draws; taller bars are cut
// there and labelled with their value. overviewBase is where its bars
// start, a little below 1 so that a policy at the lower bound shows.
const (
	overviewTop  = 3
	overviewBase = 0.9
)

// Overview returns the chart that compares every policy on every trace:
// for each trace (named on the X axis; with its capacity where results of
// one trace differ in capacity) a group of bars, one per policy in its
// colour, of the policy's peak reserved bytes divided by the trace's lower
// bound (its peak requested bytes), so that 1 is the best possible (a
// dashed line; the bars start at 0.9 so that those at 1 show). Bars above
// 3 are cut at 3 and labelled with their value; a policy whose peak
// footprint (the card's memory the driver's pages take) is above its peak
// reserved has a black tick at footprint ÷ lower bound; a policy that ran
// out of memory has a cross at the foot of its bar. Policies keep one colour
// across traces, in order of first appearance. It returns ErrNoResults for
// no results.
func Overview(rs []results.Result) (*plot.Plot, error) {
	if len(rs) == 0 {
		return nil, ErrNoResults
	}
	// Groups: (trace, capacity) in order of first appearance.
	type group struct {
		trace    string
		capacity uint64
		idx      []int
	}
	var groups []*group
	byKey := map[string]*group{}
	caps := map[string]map[uint64]bool{}
	for i, r := range rs {
		k := fmt.Sprintf("%s\x00%d", r.Trace, r.Capacity)
		g := byKey[k]
		if g == nil {
			g = &group{trace: r.Trace, capacity: r.Capacity}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		if caps[r.Trace] == nil {
			caps[r.Trace] = map[uint64]bool{}
		}
		caps[r.Trace][r.Capacity] = true
	}
	// Policies: by label across all results.
	labels, key := overviewLabels(rs)
	var order, orderPolicy []string
	color := map[string]int{}
	for i, l := range labels {
		if _, ok := color[l]; !ok {
			color[l] = len(order)
			order = append(order, l)
			orderPolicy = append(orderPolicy, rs[i].Policy)
		}
	}
	looks := chartLooks(orderPolicy)

	p := newPlot()
	p.Title.Text = "peak reserved ÷ lower bound, every policy on every trace"
	p.Y.Label.Text = "peak reserved ÷ peak requested"
	leg := newSideLegend()
	for k, l := range order {
		b := bar{}
		b.setLook(looks[k])
		leg.add(l, hatchThumb{b})
	}
	bars := newBarSet(overviewBase)
	bars.Label.Font = font.From(sans, 7)
	var ooms plotter.XYs
	var ticks []segment
	top, broken := 1.0, false
	var names []string
	for gi, g := range groups {
		name := results.TraceName(g.trace)
		if len(caps[g.trace]) > 1 {
			name += " @" + formatBytes(g.capacity)
		}
		names = append(names, name)
		w := 0.84 / float64(max(len(g.idx), 1))
		for k, i := range g.idx {
			r := rs[i]
			if r.PeakRequested == 0 {
				continue
			}
			ratio := float64(r.PeakReserved) / float64(r.PeakRequested)
			x := float64(gi) - 0.42 + w*(float64(k)+0.5)
			b := bar{X: x, Width: w, Value: math.Min(ratio, overviewTop), OOM: failed(r)}
			b.setLook(looks[color[labels[i]]])
			if ratio > overviewTop {
				// Cut at the top: a break across it, its true value above.
				b.Label = fmt.Sprintf("%.3g", ratio)
				b.Broken = true
				broken = true
			}
			bars.Bars = append(bars.Bars, b)
			top = math.Max(top, b.Value)
			if r.PeakFootprint > r.PeakReserved {
				y := math.Min(float64(r.PeakFootprint)/float64(r.PeakRequested), overviewTop)
				ticks = append(ticks, segment{X0: x - w/2, X1: x + w/2, Y: y, Style: footprintStyle})
				top = math.Max(top, y)
			}
			if b.OOM {
				// Inside the bar, below the lower bound line: clear of
				// the labels.
				ooms = append(ooms, plotter.XY{X: x, Y: (overviewBase + 1) / 2})
			}
		}
	}
	// Every cut bar keeps its value: upright where it would not fit.
	maxGroup := 1
	for _, g := range groups {
		maxGroup = max(maxGroup, len(g.idx))
	}
	barW := (overviewWidth(len(bars.Bars)) - vg.Inch - leg.width()) / vg.Length(max(len(groups), 1)) * 0.84 / vg.Length(maxGroup)
	bars.fitLabels(barW)
	p.Add(bars)
	for _, t := range ticks {
		p.Add(t)
	}
	p.Add(hline{Y: 1, Style: requestedStyle})
	if len(ooms) > 0 {
		s, err := plotter.NewScatter(ooms)
		if err != nil {
			return nil, err
		}
		s.GlyphStyle = oomGlyph(black)
		s.GlyphStyle.Radius = vg.Points(3)
		p.Add(s)
		leg.add("")
		leg.add("ran out of memory:", oomThumb{}, glyphThumb(s.GlyphStyle))
		leg.add("ratio not comparable")
	}
	if broken {
		leg.add("")
		leg.add(fmt.Sprintf("cut at %g: true", float64(overviewTop)), breakThumb{fill: lightGrey})
		leg.add("value above the bar")
	}
	leg.add("")
	leg.add("lower bound", lineThumb(requestedStyle))
	if len(ticks) > 0 {
		leg.add("peak footprint", lineThumb(footprintStyle))
	}
	leg.addKey(key)
	p.Add(bars.labels())
	p.Add(leg)
	nominalPolicies(p, names, overviewWidth(len(bars.Bars)), leg.width())
	step, _ := niceStep((top - 1) / 5)
	step = math.Max(step, 0.1)
	p.Y.Min = overviewBase
	p.Y.Max = 1 + math.Max(math.Ceil((top-1)/step-1e-6), 1)*step
	p.Y.Tick.Marker = roundTicker{Step: step, Format: formatFixed}
	return p, nil
}

// overviewWidth is the width at which to draw an Overview of n bars: the
// charts' Width up to about 60 bars, wider beyond, up to three times.
func overviewWidth(n int) vg.Length {
	return min(max(Width, 2.5*vg.Inch+vg.Length(n)*0.09*vg.Inch), 3*Width)
}

// formatBytes prints a capacity in GiB, MiB or bytes, as short as exact
// enough: "24GiB", "4000MiB", "0" for none.
func formatBytes(b uint64) string {
	switch {
	case b == 0:
		return "unlimited"
	case b%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", b>>30)
	case b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b%1e9 == 0:
		return fmt.Sprintf("%dGB", b/1e9)
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(b)/(1<<30))
	default:
		return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
	}
}

// Fit returns the chart of the smallest capacities of one trace (replay
// fit's answers, their Trace left aside): for each policy (named on the X axis) a bar in its colour of its smallest
// capacity without an OOM, labelled with its value (and "*" where
// capacities above it ran out of memory; "never" where none fits), beside
// a light bar of its peak reserved bytes on an unlimited device, against
// the lower bound (dashed black) and the capacities the cards near the bars
// leave, their memory less the context (dotted, named at the right), which
// is what a smallest capacity is to be held against. Bytes are in MiB or
// GiB. It returns ErrNoResults for no rows.
func Fit(trace string, rows []results.Fit, cards []results.Card) (*plot.Plot, error) {
	return fitChart(trace, rows, cards, nil)
}

// fitUnit is the unit of a trace's fit answers in the report, its table
// and chart alike: ChooseUnit of the largest capacity, peak or bound.
func fitUnit(rows []results.Fit) Unit {
	var top uint64
	for _, r := range rows {
		top = max(top, r.MinCapacity, r.UnlimitedPeakReserved, r.LowerBound)
	}
	return ChooseUnit(top)
}

// fitChart is Fit, in unit where it is not nil, else in ChooseUnit's.
func fitChart(trace string, rows []results.Fit, cards []results.Card, unit *Unit) (*plot.Plot, error) {
	if len(rows) == 0 {
		return nil, ErrNoResults
	}
	// A card leaves its memory less the context to the allocations.
	left := make([]results.Card, 0, len(cards))
	for _, c := range cards {
		if c.Capacity > rows[0].Context {
			left = append(left, results.Card{Name: c.Name, Capacity: c.Capacity - rows[0].Context})
		}
	}
	cards = left
	rs := make([]results.Result, len(rows))
	var top, bound uint64
	for i, r := range rows {
		rs[i] = results.Result{Trace: trace, Policy: r.Policy, Settings: r.Settings}
		top = max(top, r.MinCapacity, r.UnlimitedPeakReserved, r.LowerBound)
		bound = max(bound, r.LowerBound)
	}
	labels, key := chartLabels(rs)
	looks := resultLooks(rs)
	// The cards at or below the top, and the first above it.
	var shown []results.Card
	for _, c := range cards {
		if c.Capacity <= top {
			shown = append(shown, c)
		}
	}
	var above *results.Card
	for i := range cards {
		c := cards[i]
		if c.Capacity > top && (above == nil || c.Capacity < above.Capacity) {
			above = &c
		}
	}
	if above != nil && float64(above.Capacity) <= 1.6*float64(top) {
		shown = append(shown, *above)
	}
	drawTop := top
	for _, c := range shown {
		drawTop = max(drawTop, c.Capacity)
	}
	u := ChooseUnit(drawTop)
	if unit != nil {
		u = *unit
	}

	p := newPlot()
	setTitle(p, "smallest capacity without OOM: ", trace)
	p.Y.Label.Text = "capacity (" + u.Name + ")"
	bars := newBarSet(0)
	const w = 0.36
	for i, r := range rows {
		c := looks[i].Color
		label := "never"
		value := 0.0
		if r.Fits {
			value = u.Of(r.MinCapacity)
			label = fmt.Sprintf("%.*f", valueDecimals(u.Of(drawTop)), value)
			if !r.Monotone {
				label += "*"
			}
		}
		fit := bar{X: float64(i) + w/2, Width: w, Value: value, Label: label}
		fit.setLook(looks[i])
		unlimited := u.Of(r.UnlimitedPeakReserved)
		bars.Bars = append(bars.Bars,
			bar{X: float64(i) - w/2, Width: w, Value: unlimited, Fill: tint(c, 0.6), Label: fmt.Sprintf("%.*f", valueDecimals(u.Of(drawTop)), unlimited)},
			fit,
		)
	}
	leg := newSideLegend()
	leg.add("smallest capacity", swatchThumb{fill: grey, line: bars.Line.Color})
	leg.add("peak reserved,", swatchThumb{fill: tint(grey, 0.6), line: bars.Line.Color})
	leg.add("unlimited device")
	leg.add("lower bound", lineThumb(requestedStyle))
	if len(shown) > 0 {
		leg.add("cards less context", lineThumb(capacityStyle))
	}
	for _, r := range rows {
		if r.Fits && !r.Monotone {
			leg.add("* a larger capacity")
			leg.add("  ran out of memory")
			break
		}
	}
	leg.addKey(key)
	bars.fitLabels(slotWidth(len(rows), Width, leg.width()))
	p.Add(bars)
	if bound > 0 {
		p.Add(hline{Y: u.Of(bound), Style: requestedStyle})
	}
	for _, c := range shown {
		p.Add(namedLine{hline: hline{Y: u.Of(c.Capacity), Style: capacityStyle}, name: c.Name})
	}
	p.Add(bars.labels())
	p.Add(leg)
	nominalPolicies(p, labels, Width, leg.width())
	valueRange(p, math.Max(u.Of(drawTop), minBytesTop), formatFixed)
	return p, nil
}

// namedLine is an hline with its name written above its right end.
type namedLine struct {
	hline
	name string
}

// Plot implements plot.Plotter.
func (l namedLine) Plot(c draw.Canvas, p *plot.Plot) {
	l.hline.Plot(c, p)
	if l.Y < p.Y.Min || l.Y > p.Y.Max {
		return
	}
	_, trY := p.Transforms(&c)
	sty := text.Style{Font: font.From(sans, 8), Handler: plot.DefaultTextHandler, Color: grey, XAlign: draw.XRight, YAlign: draw.YBottom}
	c.FillText(sty, vg.Point{X: c.Max.X - vg.Points(2), Y: trY(l.Y) + vg.Points(1)}, l.name)
}

// overviewLabels returns the label of each result across traces and the
// key to the labels it abbreviates: its policy name, with its settings
// where one trace has results of that policy under different settings
// (as variantLabels, but keyed where long, never cut: keyed). Results of
// the same policy and settings share a label.
func overviewLabels(runs []results.Result) (labels, key []string) {
	names, settings := variantParts(runs)
	labels = make([]string, len(runs))
	// keyed tells repeated labels apart; here they are one policy.
	distinct := map[string]int{}
	var un, us []string
	idx := make([]int, len(runs))
	for i := range runs {
		k := names[i] + "\x00" + settings[i]
		j, ok := distinct[k]
		if !ok {
			j = len(un)
			distinct[k] = j
			un, us = append(un, names[i]), append(us, settings[i])
		}
		idx[i] = j
	}
	ul, key := keyed(un, us)
	for i := range runs {
		labels[i] = ul[idx[i]]
	}
	return labels, key
}

// variantLabels returns the label of each result across traces: its
// policy name, with its settings where one trace has results of that
// policy under different settings, shortened to maxPolicyLabel characters.
// Results of the same policy and settings share a label.
func variantLabels(runs []results.Result) []string {
	names, settings := variantParts(runs)
	labels := make([]string, len(runs))
	for i := range runs {
		l := names[i]
		if settings[i] != "" {
			l += " " + settings[i]
		}
		labels[i] = shorten(l, maxPolicyLabel)
	}
	return labels
}

// variantParts returns the policy name of each result ("(unnamed)" for
// none) and its settings joined where one trace has results of that
// policy under different settings, else "".
func variantParts(runs []results.Result) (names, settings []string) {
	// A policy is told apart by its settings only where it is replayed
	// more than once on one trace and capacity (a sweep's grid); its
	// settings may otherwise differ between traces only because each
	// trace records its own.
	repeated := map[string]bool{}
	seen := map[string]bool{}
	for _, r := range runs {
		k := fmt.Sprintf("%s\x00%d\x00%s", r.Trace, r.Capacity, r.Policy)
		if seen[k] {
			repeated[r.Policy] = true
		}
		seen[k] = true
	}
	names = make([]string, len(runs))
	settings = make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.Policy
		if names[i] == "" {
			names[i] = "(unnamed)"
		}
		if repeated[r.Policy] {
			settings[i] = results.JoinSettings(r.Settings, " ")
		}
	}
	return names, settings
}
