package plots

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"html/template"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
)

// ReportResult is a replay's result as a report shows it.
type ReportResult struct {
	results.Result
	// Measured marks the result of a replay on a real GPU (replay gpu):
	// its figures are the device's and its latencies measured; Device
	// names the GPU and MeasuredAllocTimeNS is the time measured in the
	// allocation calls, in nanoseconds.
	Measured            bool
	Device              string
	MeasuredAllocTimeNS int64
	// Paced marks a replay on a real GPU that kept the trace's idle
	// times (replay gpu --pace).
	Paced bool
}

// Report is what a report page shows: replay results (of replay sim,
// replay gpu or a sweep) and fit answers, from the named inputs.
type Report struct {
	Title   string
	Inputs  []string
	Results []ReportResult
	Fits    []results.Fit
	Diffs   []results.Diff // replay diff's comparisons, a section each
	// Tunes are replay tune's candidates (results of kind tune), a
	// section per trace (tuneSections).
	Tunes []results.Tune
	// Policies names the policies the memory and fragmentation charts
	// draw (ShownPolicies); nil for the default set.
	Policies []string
}

// ReportChart is one chart of a report: ID is unique in the report and
// safe in a file name, Section the ID of its section, Caption what it
// shows; Width is its width when drawn, 0 for the charts' Width.
type ReportChart struct {
	ID      string
	Section string
	Caption string
	Plot    *plot.Plot
	Width   vg.Length
}

// render draws c as format at its width.
func (c ReportChart) render(w io.Writer, format string) error {
	width := c.Width
	if width == 0 {
		width = Width
	}
	return renderSize(w, c.Plot, format, width, Height)
}

// reportGroup is the results of one section: one trace on one capacity.
type reportGroup struct {
	id       string
	trace    string
	short    string // the trace as the page names it (results.ShortNames)
	capacity uint64
	multiCap bool
	results  []ReportResult
	fits     []results.Fit
}

func (g *reportGroup) sim() []results.Result {
	rs := make([]results.Result, len(g.results))
	for i, r := range g.results {
		rs[i] = r.Result
		if r.Measured {
			rs[i].Policy += " (gpu)"
		}
	}
	return rs
}

func (g *reportGroup) name() string {
	name := g.short
	if g.multiCap || g.capacity > 0 {
		name += " on " + formatBytes(g.capacity)
	}
	return name
}

// groups returns the report's sections in order of first appearance: one
// per trace and capacity, fit answers with the first section of their
// trace (or one of their own).
func (r *Report) groups() []*reportGroup {
	var out []*reportGroup
	byKey := map[string]*reportGroup{}
	caps := map[string]map[uint64]bool{}
	for _, res := range r.Results {
		if caps[res.Trace] == nil {
			caps[res.Trace] = map[uint64]bool{}
		}
		caps[res.Trace][res.Capacity] = true
	}
	used := map[string]bool{}
	// A trace is named by its file name, or as much of its path as tells
	// it from another trace of the same file name.
	var paths []string
	for _, res := range r.Results {
		paths = append(paths, res.Trace)
	}
	for _, f := range r.Fits {
		paths = append(paths, f.Trace)
	}
	short := results.ShortNames(paths)
	get := func(trace string, capacity uint64) *reportGroup {
		k := trace + "\x00" + strconv.FormatUint(capacity, 10)
		if g := byKey[k]; g != nil {
			return g
		}
		id := "t-" + results.TraceName(trace)
		if len(caps[trace]) > 1 {
			id += "-" + formatBytes(capacity)
		}
		base := id
		for n := 2; used[strings.ToLower(id)]; n++ {
			id = base + "-" + strconv.Itoa(n)
		}
		used[strings.ToLower(id)] = true
		g := &reportGroup{id: id, trace: trace, short: short[trace], capacity: capacity, multiCap: len(caps[trace]) > 1}
		byKey[k] = g
		out = append(out, g)
		return g
	}
	for _, res := range r.Results {
		g := get(res.Trace, res.Capacity)
		g.results = append(g.results, res)
	}
	for _, f := range r.Fits {
		var g *reportGroup
		for _, h := range out {
			if h.trace == f.Trace {
				g = h
				break
			}
		}
		if g == nil {
			g = get(f.Trace, 0)
		}
		g.fits = append(g.fits, f)
	}
	return out
}

// hasLatency reports whether any result has latency rows.
func hasLatency(rs []ReportResult) bool {
	for _, r := range rs {
		if len(r.Latency) > 0 {
			return true
		}
	}
	return false
}

// Charts returns the report's charts, in page order: the overview when
// there is more than one section, then for each section memory over the
// trace, fragmentation, peaks against the lower bound, device calls, the
// latency distribution (where any result has latency rows) and the
// smallest capacities (where there are fit answers).
func (r *Report) Charts() ([]ReportChart, error) {
	var out []ReportChart
	groups := r.groups()
	var withResults int
	for _, g := range groups {
		if len(g.results) > 0 {
			withResults++
		}
	}
	if withResults > 1 {
		var all []results.Result
		for _, g := range groups {
			all = append(all, g.sim()...)
		}
		p, err := Overview(all)
		if err != nil {
			return nil, err
		}
		out = append(out, ReportChart{ID: "overview", Section: "overview", Caption: "Peak reserved bytes of every policy on every trace, as a multiple of the trace's lower bound (its peak requested bytes).", Plot: p, Width: overviewWidth(len(all))})
	}
	for _, g := range groups {
		if len(g.results) > 0 {
			rs := g.sim()
			unit := g.unit()
			charts := []struct {
				suffix, caption string
				build           func([]results.Result) (*plot.Plot, error)
			}{
				{"memory", "Reserved (thick) and allocated (thin) bytes over the trace of the recorded allocator, the lowest peaks and the cuda baseline (or the policies --plot-policy names), against the requested bytes, the lower bound.", func(rs []results.Result) (*plot.Plot, error) { return memoryOf(rs, r.Policies, &unit) }},
				{"fragmentation", "Fragmentation (dots: the free reserved memory that could not serve a malloc the policy grew for) and the idle share (lines: 1 − allocated / reserved), over the trace, of the same policies.", func(rs []results.Result) (*plot.Plot, error) { return FragmentationOf(rs, r.Policies) }},
				{"peaks", "Peak reserved and allocated bytes per policy against the lower bound, the peak requested bytes.", func(rs []results.Result) (*plot.Plot, error) { return peaks(rs, &unit) }},
				{"calls", "Device allocations and frees (cudaMalloc and cudaFree calls) per policy.", Calls},
			}
			if hasLatency(g.results) {
				charts = append(charts, struct {
					suffix, caption string
					build           func([]results.Result) (*plot.Plot, error)
				}{"latency", latencyCaption(g.results), func(rs []results.Result) (*plot.Plot, error) {
					p, err := LatencyCDF(rs)
					if err == nil {
						// Said on the chart too, for the PNG on a slide.
						p.Title.Text = strings.Replace(p.Title.Text, "device call latency: ", "device call latency ("+latencyKind(g.results)+"): ", 1)
					}
					return p, err
				}})
			}
			for _, c := range charts {
				p, err := c.build(rs)
				if err != nil {
					return nil, fmt.Errorf("%s chart of %s: %w", c.suffix, g.trace, err)
				}
				out = append(out, ReportChart{ID: g.id[2:] + "-" + c.suffix, Section: g.id, Caption: c.caption, Plot: p})
			}
		}
		if len(g.fits) > 0 {
			fu := fitUnit(g.fits)
			p, err := fitChart(g.trace, g.fits, fitCards(g.fits), &fu)
			if err != nil {
				return nil, err
			}
			out = append(out, ReportChart{ID: g.id[2:] + "-fit", Section: g.id, Caption: "Smallest device capacity each policy runs the trace in without an out-of-memory error, beside its peak reserved bytes on an unlimited device, against the lower bound and card sizes.", Plot: p})
		}
	}
	return out, nil
}

// latencyKind says where the latencies of rs come from: "simulated",
// "measured", or "measured and simulated".
func latencyKind(rs []ReportResult) string {
	measured, simulated := false, false
	for _, r := range rs {
		if len(r.Latency) > 0 {
			measured = measured || r.Measured
			simulated = simulated || !r.Measured
		}
	}
	switch {
	case measured && simulated:
		return "measured and simulated"
	case measured:
		return "measured"
	}
	return "simulated"
}

func latencyCaption(rs []ReportResult) string {
	what := map[string]string{
		"simulated":              "simulated by the cost model",
		"measured":               "measured on the GPU",
		"measured and simulated": "measured on the GPU for the (gpu) policies, simulated by the cost model for the others",
	}[latencyKind(rs)]
	return "Distribution of the latency of each device allocation and free, " + what + "; rebuilt from the results' per-size-class percentiles (median, p90, p99, max)."
}

// fitCards returns the cards of fit answers, in the order of the first.
func fitCards(fits []results.Fit) []results.Card {
	var out []results.Card
	seen := map[uint64]bool{}
	for _, f := range fits {
		for _, c := range f.Cards {
			if !seen[c.Capacity] {
				seen[c.Capacity] = true
				out = append(out, c.Card)
			}
		}
	}
	return out
}

// WriteReportCharts writes each chart into dir as ID.png and ID.svg, all
// of them renamed into place together at the end (StageReportCharts, an
// atomicfile.Batch), and returns the paths written; on error none is.
func WriteReportCharts(dir string, charts []ReportChart) ([]string, error) {
	var b atomicfile.Batch
	defer b.Abort()
	if err := StageReportCharts(&b, dir, charts); err != nil {
		return nil, err
	}
	paths := b.Paths()
	if err := b.Commit(); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	return paths, nil
}

// StageReportCharts is WriteReportCharts that adds the files to b, to be
// put in place when the caller commits b with its other outputs.
func StageReportCharts(b *atomicfile.Batch, dir string, charts []ReportChart) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	for _, c := range charts {
		for _, format := range Formats {
			path := filepath.Join(dir, c.ID+"."+format)
			if err := stage(b, path, func(w io.Writer) error { return c.render(w, format) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// The page's script and styles, embedded: uPlot (plots/assets/uplot, MIT
// licence) draws the series, report.js builds the charts from the page's
// data and sorts the tables.
var (
	//go:embed assets/uplot/uPlot.iife.min.js
	uplotJS string
	//go:embed assets/uplot/uPlot.min.css
	uplotCSS string
	//go:embed assets/uplot/LICENSE
	uplotLicense string
	//go:embed assets/report.js
	reportJS string
	//go:embed assets/report.css
	reportCSS string
)

// pageScript is the page's script: uPlot with its licence, then ours, in
// a CDATA section for XML readers (its markers behind line comments for
// HTML ones; html/template drops comments of the template's own text, so
// they are part of the value). The address in uPlot's banner loses its
// scheme, so that the page names no URL at all (it loads nothing).
func pageScript() template.JS {
	lib := strings.Replace(uplotJS, "https://github.com/", "github.com/", 1)
	return template.JS("//<![CDATA[\n/* uPlot 1.6.32, vendored unchanged (plots/assets/uplot):\n" + uplotLicense + "\n*/\n" + lib + "\n" + reportJS + "\n//]]>")
}

// WriteReport writes the report as one self-contained HTML page, which
// needs no other file and no network to view: its styles, its script
// (uPlot and the page's own) and its data are inside it. The page is
// well-formed XML as well as HTML. It holds a summary, an overview table
// of every policy on every trace, and for each trace (and capacity) its
// figures, the comparison table of the policies with their peaks as bars,
// memory and fragmentation over the trace and the device call latencies
// as charts drawn in the browser (the value under the cursor; drag to
// zoom into a time range, double-click to zoom out), and the fit answers
// with their capacities as bars; then a section per job and per
// comparison of replay diff. Every table sorts by a click on a column's
// header. The series are embedded as SeriesData and LatencyData, one JSON
// object per section. Errors are those of w.
func WriteReport(w io.Writer, r *Report) error {
	pg, err := buildPage(r)
	if err != nil {
		return err
	}
	return reportTemplate.Execute(w, pg)
}

// The page's data, as the template reads it.
type (
	page struct {
		Title    string
		Inputs   []string
		Summary  string
		Nav      []navItem
		Overview *overview
		Sections []section
		CSS      template.CSS
		Script   template.JS
	}
	navItem  struct{ ID, Name string }
	overview struct {
		Head []string // "trace", then a column per policy
		Rows []row
	}
	section struct {
		ID, Name, Trace string
		Facts           []fact
		Head            []string
		Rows            []row
		Bars            []legendItem // what the comparison table's bars show
		Sites           *fitTable    // the allocation sites at each policy's peak (sitesTable)
		Charts          []chart
		Data            template.JS // sectionData as JSON
		Fit             *fitTable
		Compare         *fitTable // a replay diff's figures
		Ranks           *fitTable // a job's ranks side by side
		Tune            *fitTable // replay tune's candidates, ranked
		Notes           []string
	}
	fact struct{ Name, Value string }
	row  struct{ Cells []cell }
	cell struct {
		Text, Class, Title string
		Style              template.CSS
		// Sort is the cell's value when its column is sorted (a number),
		// "" to sort by Text.
		Sort string
		// Bar, when set, is drawn in the cell (after Text).
		Bar []barPart
	}
	// barPart is a part of a cell's bar: a bar from the left (Class "fill"
	// or "light"), or a mark ("bound", "tick", "card"), placed by Style.
	barPart struct {
		Class, Title string
		Style        template.CSS
	}
	legendItem struct {
		Class, Text string
	}
	// chart is a chart the page's script draws into an element: Kind is
	// "memory", "fragmentation" or "latency".
	chart struct {
		ID, Kind, Caption string
	}
	fitTable struct {
		Head  []string
		Rows  []row
		Bars  []legendItem
		Notes []string
	}
	// sectionData is what a section embeds for its charts.
	sectionData struct {
		Series  *SeriesData  `json:"series,omitempty"`
		Latency *LatencyData `json:"latency,omitempty"`
	}
)

func buildPage(r *Report) (page, error) {
	groups := r.groups()
	pg := page{Title: r.Title, Inputs: r.Inputs, CSS: template.CSS(uplotCSS + "\n" + reportCSS), Script: pageScript()}
	if pg.Title == "" {
		pg.Title = "Allocator policies compared"
	}
	traces, policies := map[string]bool{}, map[string]bool{}
	for _, res := range r.Results {
		traces[res.Trace] = true
		policies[res.Policy] = true
	}
	for _, f := range r.Fits {
		traces[f.Trace] = true
		policies[f.Policy] = true
	}
	if len(r.Results)+len(r.Fits) > 0 {
		pg.Summary = fmt.Sprintf("%s and %s: %s, %s.", Plural(len(r.Results), "result"), Plural(len(r.Fits), "fit answer"), Plural(len(traces), "trace"), Plural(len(policies), "policy"))
	}
	if len(r.Tunes) > 0 {
		tuned, n := map[string]bool{}, 0
		for _, t := range r.Tunes {
			tuned[t.Trace] = true
			if !t.Recorded {
				n++
			}
		}
		pg.Summary = strings.TrimSpace(pg.Summary + fmt.Sprintf(" replay tune: %s ranked, of %s.", Plural(n, "setting"), Plural(len(tuned), "trace")))
		if len(r.Results)+len(r.Fits)+len(r.Diffs) == 0 && r.Title == "" {
			pg.Title = "Allocator settings ranked"
		}
	}
	switch n := len(r.Diffs); {
	case n == 1:
		pg.Summary = strings.TrimSpace(pg.Summary + " 1 comparison of two runs.")
	case n > 1:
		pg.Summary = strings.TrimSpace(pg.Summary + fmt.Sprintf(" %d comparisons of two runs.", n))
	}

	var withResults int
	for _, g := range groups {
		if len(g.results) > 0 {
			withResults++
		}
	}
	if withResults > 1 {
		pg.Nav = append(pg.Nav, navItem{"overview", "Overview"})
		pg.Overview = overviewTable(groups)
	}
	for _, g := range groups {
		pg.Nav = append(pg.Nav, navItem{g.id, g.name()})
		s := section{ID: g.id, Name: g.name(), Trace: g.trace}
		if len(g.results) > 0 {
			s.Facts, s.Notes = traceFacts(g)
			s.Notes = append(s.Notes, resultWarnings(g.sim())...)
			s.Head, s.Rows, s.Bars = comparisonTable(g)
			s.Sites = sitesTable(g)
			rs := g.sim()
			labels := policyLabels(rs)
			var data sectionData
			data.Series = seriesData(rs, labels, r.Policies)
			if hasLatency(g.results) {
				data.Latency = latencyData(g.results, labels)
			}
			js, err := json.Marshal(data)
			if err != nil {
				return page{}, fmt.Errorf("plots: the data of %s: %w", g.trace, err)
			}
			s.Data = template.JS(js)
			kind := seriesKind(g.results)
			if data.Series != nil {
				s.Charts = append(s.Charts,
					chart{ID: "chart-" + g.id[2:] + "-memory", Kind: "memory", Caption: "Memory over the trace, " + kind + ": each policy's reserved bytes (solid), allocated bytes (dashed) and, where it is above the reserved bytes, its device footprint (dotted), against the requested bytes, the lower bound (black, dashed); a cross marks a policy's first OOM, a grey dotted line the device capacity. Each point is the largest value of its run of events."},
					chart{ID: "chart-" + g.id[2:] + "-fragmentation", Kind: "fragmentation", Caption: "Fragmentation over the trace, " + kind + ": dots where a malloc made the policy grow (or fail) although its free reserved memory added up to the request, that free memory as a share of the reserved bytes (the largest of each point's run); lines: the idle share, 1 − allocated / reserved, at the last event of each point's run (docs/results.md defines both)."})
			} else {
				s.Notes = append(s.Notes, "No result has series points: there is no memory or fragmentation over the trace to draw.")
			}
			if data.Latency != nil {
				s.Charts = append(s.Charts, chart{ID: "chart-" + g.id[2:] + "-latency", Kind: "latency", Caption: latencyCaption(g.results)})
			}
		}
		if len(g.fits) > 0 {
			s.Fit = fitRows(g.fits)
		}
		pg.Sections = append(pg.Sections, s)
	}
	for k, js := range jobSections(r) {
		id := fmt.Sprintf("job-%d", k+1)
		js.ID = id
		pg.Nav = append(pg.Nav, navItem{id, js.Name})
		pg.Sections = append(pg.Sections, js)
	}
	for k, d := range r.Diffs {
		id := fmt.Sprintf("diff-%d", k+1)
		name := fmt.Sprintf("Compare %d: %s against %s", k+1, shortRun(&d.A), shortRun(&d.B))
		pg.Nav = append(pg.Nav, navItem{id, fmt.Sprintf("Compare %d", k+1)})
		s := section{ID: id, Name: name, Facts: []fact{{"A", RunName(&d.A)}, {"B", RunName(&d.B)}}}
		t := &fitTable{Head: []string{"figure", "A", "B", "B − A", "B / A"}}
		for _, f := range d.Figures {
			c := DiffCells(f)
			ratio := ""
			if f.Ratio != nil {
				ratio = num(*f.Ratio)
			}
			t.Rows = append(t.Rows, row{Cells: []cell{{Text: f.Figure},
				{Text: c[0], Class: "num", Sort: num(f.A)}, {Text: c[1], Class: "num", Sort: num(f.B)},
				{Text: c[2], Class: "num", Sort: num(f.Delta)}, {Text: c[3], Class: "num", Sort: ratio}}})
		}
		t.Notes = append(t.Notes, d.A.Warnings...)
		t.Notes = append(t.Notes, d.B.Warnings...)
		s.Compare = t
		pg.Sections = append(pg.Sections, s)
	}
	for k, ts := range tuneSections(r.Tunes) {
		ts.ID = fmt.Sprintf("tune-%d", k+1)
		pg.Nav = append(pg.Nav, navItem{ts.ID, ts.Name})
		pg.Sections = append(pg.Sections, ts)
	}
	return pg, nil
}

// TuneBars is the number of a tune section's best candidates whose
// reserved bytes are drawn as bars; the others are rows without one, so
// that a grid of hundreds stays a table to read.
const TuneBars = 20

// tuneSections returns a section per trace of replay tune's candidates
// (results of kind tune, in their file order): the recorded setting and
// the recommendation with their figures, and every candidate by rank, the
// TuneBars best with a bar of their peak reserved bytes against the
// recorded setting's.
func tuneSections(ts []results.Tune) []section {
	var order []string
	byTrace := map[string][]results.Tune{}
	for _, t := range ts {
		if byTrace[t.Trace] == nil {
			order = append(order, t.Trace)
		}
		byTrace[t.Trace] = append(byTrace[t.Trace], t)
	}
	var out []section
	for _, trace := range order {
		cs := byTrace[trace]
		var rec, best *results.Tune
		var ranked []results.Tune
		for k := range cs {
			switch {
			case cs[k].Recorded:
				rec = &cs[k]
			default:
				ranked = append(ranked, cs[k])
			}
		}
		slices.SortStableFunc(ranked, func(a, b results.Tune) int { return cmp.Compare(a.Rank, b.Rank) })
		if len(ranked) > 0 {
			best = &ranked[0]
		}
		s := section{Name: "Tune: " + filepath.Base(trace), Trace: trace}
		conf := func(c string) string {
			if c == "" {
				return "(default)"
			}
			return c
		}
		figures := func(t *results.Tune) string {
			return fmt.Sprintf("peak reserved %s MiB (%d bytes), %d device calls, %s ms in the allocator, %d OOMs",
				MiBText(t.PeakReserved), t.PeakReserved, t.DeviceAllocs+t.DeviceFrees, msText(t.SimAllocTimeNS), t.OOMs)
		}
		s.Facts = append(s.Facts, fact{"trace", trace}, fact{"settings tried", strconv.Itoa(len(ranked))})
		if rec != nil {
			s.Facts = append(s.Facts, fact{"recorded setting", conf(rec.Conf) + ": " + figures(rec)})
		}
		if best != nil {
			s.Facts = append(s.Facts, fact{"recommended", "PYTORCH_CUDA_ALLOC_CONF=\"" + best.Conf + "\": " + figures(best)})
		}
		top := uint64(0)
		for k, t := range ranked {
			if k < TuneBars {
				top = max(top, t.PeakReserved)
			}
		}
		if rec != nil {
			top = max(top, rec.PeakReserved)
		}
		tb := &fitTable{Head: []string{"rank", "PYTORCH_CUDA_ALLOC_CONF", "reserved MiB", "peak reserved", "device calls", "alloc ms", "OOMs", "front"}}
		addRow := func(rank string, t *results.Tune, bar bool) {
			u := func(v uint64) string { return strconv.FormatUint(v, 10) }
			barCell := cell{Class: "barcell", Sort: u(t.PeakReserved), Title: MiBText(t.PeakReserved) + " MiB"}
			if bar && top > 0 {
				barCell.Bar = []barPart{{Class: "fill", Style: barStyle(t.PeakReserved, top, color.RGBA{0x00, 0x72, 0xb2, 0xff}, 0), Title: u(t.PeakReserved) + " bytes"}}
				if rec != nil {
					barCell.Bar = append(barCell.Bar, barPart{Class: "bound", Style: markStyle(rec.PeakReserved, top), Title: "the recorded setting's " + u(rec.PeakReserved) + " bytes"})
				}
			}
			front := ""
			if t.Front {
				front = "*"
			}
			tb.Rows = append(tb.Rows, row{Cells: []cell{
				{Text: rank, Class: "num", Sort: strconv.Itoa(t.Rank)},
				{Text: conf(t.Conf), Title: t.SameAs},
				{Text: MiBText(t.PeakReserved), Class: "num", Title: u(t.PeakReserved) + " bytes", Sort: u(t.PeakReserved)},
				barCell,
				{Text: strconv.FormatInt(t.DeviceAllocs+t.DeviceFrees, 10), Class: "num"},
				{Text: msText(t.SimAllocTimeNS), Class: "num", Sort: strconv.FormatInt(t.SimAllocTimeNS, 10)},
				{Text: strconv.FormatInt(t.OOMs, 10), Class: "num"},
				{Text: front},
			}})
		}
		if rec != nil {
			addRow("recorded", rec, true)
		}
		for k := range ranked {
			addRow(strconv.Itoa(ranked[k].Rank), &ranked[k], k < TuneBars)
		}
		tb.Bars = []legendItem{{Class: "fill", Text: "peak reserved"}, {Class: "bound", Text: "the recorded setting's"}}
		tb.Notes = append(tb.Notes, fmt.Sprintf("Ranked by fewer OOMs, then peak reserved bytes, then device calls, then allocator time; * marks the Pareto front of those three. Bars for the recorded setting and the %d best; every candidate is a row (click a header to sort).", min(TuneBars, len(ranked))))
		if rec != nil {
			tb.Notes = append(tb.Notes, rec.Warnings...)
		}
		s.Tune = tb
		out = append(out, s)
	}
	return out
}

// sitesTable returns the table of the allocation sites at each policy's
// peak (results.Result.Sites, replay sim --sites), nil when no result of g
// carries them: a row per policy and site with its live bytes and count,
// its share of the reserved bytes the policy did not use, and a bar of
// both against the largest peak of the table, in the policy's colour.
func sitesTable(g *reportGroup) *fitTable {
	rs := g.sim()
	un := g.unit()
	labels, looks := policyLabels(rs), resultLooks(rs)
	var top uint64
	for _, r := range rs {
		if r.Sites != nil {
			top = max(top, r.Sites.Reserved)
		}
	}
	if top == 0 {
		return nil
	}
	t := &fitTable{
		Head: []string{"policy", "peak reserved " + un.Name, "peak event", "site", "live " + un.Name, "live allocations", "unused " + un.Name, "live and unused"},
		Bars: []legendItem{{"fill", "live bytes"}, {"light", "its share of the reserved bytes no live allocation uses"}},
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for i, r := range rs {
		st := r.Sites
		if st == nil {
			continue
		}
		c := looks[i].Color
		for _, site := range st.Sites {
			t.Rows = append(t.Rows, row{Cells: []cell{
				{Text: labels[i]},
				{Text: un.Text(st.Reserved), Class: "num", Title: u(st.Reserved) + " bytes", Sort: u(st.Reserved)},
				{Text: strconv.FormatInt(st.Event, 10), Class: "num", Sort: strconv.FormatInt(st.Event, 10)},
				{Text: site.Site, Class: "set"},
				{Text: un.Text(site.LiveBytes), Class: "num", Title: u(site.LiveBytes) + " bytes", Sort: u(site.LiveBytes)},
				{Text: strconv.FormatInt(site.Count, 10), Class: "num", Sort: strconv.FormatInt(site.Count, 10)},
				{Text: un.Text(site.UnusedBytes), Class: "num", Title: u(site.UnusedBytes) + " bytes", Sort: u(site.UnusedBytes)},
				{Class: "barcell", Sort: u(site.LiveBytes + site.UnusedBytes), Title: fmt.Sprintf("%s %s live, %s %[2]s unused", un.Text(site.LiveBytes), un.Name, un.Text(site.UnusedBytes)), Bar: []barPart{
					{Class: "light", Style: barStyle(site.LiveBytes+site.UnusedBytes, top, c, 0.6)},
					{Class: "fill", Style: barStyle(site.LiveBytes, top, c, 0)},
				}},
			}})
		}
	}
	t.Notes = []string{"A site is the innermost frame of user code of the malloc (file:line:function; --site-depth gives callers), or the call site record run wrote; a segment's unused bytes go to the sites of its live allocations in proportion to their bytes (docs/results.md says how)."}
	return t
}

// num is v as a cell's sort value.
func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// seriesKind says where the series of rs come from: "simulated",
// "measured on the GPU" or both.
func seriesKind(rs []ReportResult) string {
	measured, simulated := false, false
	for _, r := range rs {
		measured = measured || r.Measured
		simulated = simulated || !r.Measured
	}
	switch {
	case measured && simulated:
		return "measured on the GPU for the (gpu) policies and simulated for the others"
	case measured:
		return "measured on the GPU (the bytes the policy held there)"
	}
	return "simulated"
}

// jobSections returns a section per job among the report's results
// (per-rank traces, job.Rank): a row per policy with each rank's peak
// reserved bytes side by side, the spread between ranks and the ranks that
// ran out of memory, the first of them in time.
func jobSections(r *Report) []section {
	rs := make([]*results.Result, len(r.Results))
	for i := range r.Results {
		rs[i] = &r.Results[i].Result
	}
	var out []section
	index := map[string]int{} // job -> its section in out
	for _, s := range job.Summarize(rs) {
		k, ok := index[s.Job]
		if !ok {
			k = len(out)
			index[s.Job] = k
			head := []string{"policy"}
			for _, rank := range s.Ranks {
				head = append(head, fmt.Sprintf("rank %d reserved MiB", rank))
			}
			head = append(head, "spread", "OOM ranks", "first OOM")
			out = append(out, section{Name: "Job " + filepath.Base(s.Job), Trace: s.Job,
				Facts: []fact{{"ranks", strconv.Itoa(len(s.Ranks))}},
				Ranks: &fitTable{Head: head, Notes: []string{"Each rank replayed on a device of its own; the job needs the largest rank's device, and fails where its first rank runs out of memory. Spread: how far the smallest rank's peak reserved lies below the largest's."}}})
		}
		cells := []cell{{Text: s.Policy}}
		for i, res := range s.Results {
			c := cell{Text: MiBText(res.PeakReserved), Class: "num", Sort: strconv.FormatUint(res.PeakReserved, 10)}
			if s.Ranks[i] == s.MaxReservedRank {
				c.Title = "the largest rank"
			}
			cells = append(cells, c)
		}
		ooms, first := "-", "-"
		if len(s.OOMRanks) > 0 {
			parts := make([]string, len(s.OOMRanks))
			for i, rank := range s.OOMRanks {
				parts[i] = strconv.Itoa(rank)
			}
			ooms, first = strings.Join(parts, ", "), "order unknown"
			if s.FirstOOMRank >= 0 {
				first = fmt.Sprintf("rank %d, event %d", s.FirstOOMRank, s.FirstOOMEvent)
			}
		}
		cells = append(cells, cell{Text: fmt.Sprintf("%.1f%%", 100*s.Spread()), Class: "num", Sort: num(s.Spread())}, cell{Text: ooms}, cell{Text: first})
		out[k].Ranks.Rows = append(out[k].Ranks.Rows, row{Cells: cells})
	}
	return out
}

// RunName names a run of a comparison: its trace, policy, settings and
// capacity ("a.trace under pytorch (expandable_segments=True), capacity N
// bytes").
func RunName(r *results.Result) string {
	s := r.Trace + " under " + r.Policy
	if len(r.Settings) > 0 {
		s += " (" + results.JoinSettings(r.Settings, ", ") + ")"
	}
	if r.Capacity > 0 {
		s += fmt.Sprintf(", capacity %d bytes", r.Capacity)
	}
	return s
}

// Plural is "1 NOUN" or "N NOUNs" ("policies" for policy).
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// shortRun names a run by its trace's file name and its policy, for a
// heading.
func shortRun(r *results.Result) string { return filepath.Base(r.Trace) + " (" + r.Policy + ")" }

// DiffCells formats a figure of a comparison for a table: A, B, B - A and
// B / A ("-" when A is 0), in MiB for bytes, percent for a fraction (the
// delta in points), ms for a time.
func DiffCells(f results.DiffFigure) [4]string {
	var out [4]string
	switch f.Unit {
	case "bytes":
		out[0], out[1] = MiBText(uint64(f.A))+" MiB", MiBText(uint64(f.B))+" MiB"
		if f.Delta < 0 {
			out[2] = "-" + MiBText(uint64(-f.Delta)) + " MiB"
		} else {
			out[2] = "+" + MiBText(uint64(f.Delta)) + " MiB"
		}
	case "fraction":
		out[0], out[1], out[2] = fmt.Sprintf("%.1f%%", 100*f.A), fmt.Sprintf("%.1f%%", 100*f.B), fmt.Sprintf("%+.1f pt", 100*f.Delta)
	case "ns":
		out[0], out[1], out[2] = fmt.Sprintf("%.1f ms", f.A/1e6), fmt.Sprintf("%.1f ms", f.B/1e6), fmt.Sprintf("%+.1f ms", f.Delta/1e6)
	default:
		out[0], out[1], out[2] = fmt.Sprintf("%.0f", f.A), fmt.Sprintf("%.0f", f.B), fmt.Sprintf("%+.0f", f.Delta)
	}
	out[3] = "-"
	if f.Ratio != nil {
		out[3] = fmt.Sprintf("%.3f", *f.Ratio)
	}
	return out
}

// lowerBound returns the group's trace's peak requested bytes: the largest
// of its results' (each counts the requests it failed too).
// unit is the unit of a trace's section, its tables and charts alike:
// ChooseUnit of the largest peak of its results.
func (g *reportGroup) unit() Unit {
	var top uint64
	for _, r := range g.results {
		top = max(top, r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.PeakFootprint)
	}
	return ChooseUnit(top)
}

func (g *reportGroup) lowerBound() uint64 {
	var lower uint64
	for _, r := range g.results {
		lower = max(lower, r.PeakRequested)
	}
	return lower
}

func traceFacts(g *reportGroup) ([]fact, []string) {
	r0 := g.results[0]
	un := g.unit()
	lower := g.lowerBound()
	var sourceOOMs, anomalies int64
	var first string
	for _, r := range g.results {
		sourceOOMs = max(sourceOOMs, r.SourceOOMs)
		if r.Anomalies > anomalies {
			anomalies, first = r.Anomalies, r.FirstAnomaly
		}
	}
	facts := []fact{
		{"trace", g.trace},
		{"events", strconv.FormatInt(r0.Events, 10)},
		{"device mallocs / frees", fmt.Sprintf("%d / %d", r0.Mallocs, r0.Frees)},
		{"lower bound (peak requested)", un.Text(lower) + " " + un.Name + " (" + strconv.FormatUint(lower, 10) + " bytes)"},
		{"device capacity", formatBytes(g.capacity)},
		{"mallocs that failed in the recording", strconv.FormatInt(sourceOOMs, 10)},
	}
	var offline uint64
	for _, r := range g.results {
		offline = max(offline, r.PeakOffline)
	}
	if offline > 0 {
		facts = append(facts, fact{"offline placement (clairvoyant heuristic, not the optimum)", un.Text(offline) + " " + un.Name + " (" + strconv.FormatFloat(float64(offline)/float64(max(lower, 1)), 'f', 3, 64) + " × lower bound)"})
	}
	if r0.PeakPinned > 0 || r0.PeakManaged > 0 {
		facts = append(facts, fact{"peak pinned / managed host memory", un.Text(r0.PeakPinned) + " / " + un.Text(r0.PeakManaged) + " " + un.Name})
	}
	var notes []string
	if anomalies > 0 {
		notes = append(notes, fmt.Sprintf("%d events could not be replayed as recorded; the first: %s.", anomalies, first))
	}
	if r0.Truncated {
		notes = append(notes, fmt.Sprintf("The recorded history starts mid-run: its first %d events rebuild the state before it, and the peaks count from there.", r0.ReconstructedEvents))
	}
	var devices []string
	measured := map[string][]string{} // device -> its policies
	for _, r := range g.results {
		if r.BuildError != "" {
			notes = append(notes, fmt.Sprintf("%s could not be built on this device (%s): every malloc counts as an OOM.", r.Policy, r.BuildError))
		}
		if r.Measured {
			if measured[r.Device] == nil {
				devices = append(devices, r.Device)
			}
			measured[r.Device] = append(measured[r.Device], r.Policy+" (gpu)")
		}
	}
	for _, d := range devices {
		if ps := measured[d]; len(ps) == 1 {
			notes = append(notes, fmt.Sprintf("%s ran on %s: its figures are the device's.", ps[0], d))
		} else {
			notes = append(notes, fmt.Sprintf("%s and %s ran on %s: their figures are the device's.", strings.Join(ps[:len(ps)-1], ", "), ps[len(ps)-1], d))
		}
	}
	return facts, notes
}

// comparisonTable returns the head and rows of a section's table of
// policies, and the legend of its bars: each policy's peak reserved bytes
// (its colour), peak allocated bytes (light) and, where it is above the
// reserved bytes, its peak footprint (a black tick), against the lower
// bound (a black line), on one scale for the section.
func comparisonTable(g *reportGroup) ([]string, []row, []legendItem) {
	un := g.unit()
	head := []string{"policy", "settings", "peak reserved " + un.Name, "÷ lower bound", "peak allocated " + un.Name, "peaks against the lower bound", "fragmentation", "idle at peak", "device allocs", "device frees", "retries", "OOMs", "first OOM (event, bytes)", "allocator time ms"}
	labels := policyLabels(g.sim())
	looks := resultLooks(g.sim())
	best := uint64(math.MaxUint64)
	lower := g.lowerBound()
	var top uint64
	ticks := false
	for _, r := range g.results {
		if r.OOMs == 0 && r.PeakReserved > 0 {
			best = min(best, r.PeakReserved)
		}
		top = max(top, r.PeakReserved, r.PeakAllocated, r.PeakRequested, r.PeakFootprint)
		ticks = ticks || r.PeakFootprint > r.PeakReserved
	}
	var rows []row
	for i, r := range g.results {
		ratio, ratioSort := "-", ""
		if lower > 0 {
			v := float64(r.PeakReserved) / float64(lower)
			ratio, ratioSort = strconv.FormatFloat(v, 'f', 3, 64), num(v)
		}
		reservedClass := "num"
		if r.PeakReserved == best {
			reservedClass = "num best"
		}
		oomClass, first, firstSort := "num", "-", ""
		if r.OOMs > 0 {
			oomClass = "num bad"
			first, firstSort = fmt.Sprintf("%d, %d", r.FirstOOMEvent, r.FirstOOMSize), strconv.FormatInt(r.FirstOOMEvent, 10)
		}
		timeText, timeTitle, timeSort := "-", "", ""
		switch {
		case r.Measured && r.MeasuredAllocTimeNS > 0:
			timeText, timeTitle, timeSort = msText(r.MeasuredAllocTimeNS), "measured", strconv.FormatInt(r.MeasuredAllocTimeNS, 10)
			if r.Paced {
				timeTitle += ", keeping the trace's idle times"
			}
		case r.SimAllocTimeNS > 0:
			timeText, timeTitle, timeSort = msText(r.SimAllocTimeNS), "simulated by the cost model, "+msText(r.SimWakeTimeNS)+" of it wake-ups after idle times", strconv.FormatInt(r.SimAllocTimeNS, 10)
		}
		settings := results.JoinSettings(r.Settings, " ")
		c := looks[i].Color
		bar := []barPart{
			{Class: "fill", Style: barStyle(r.PeakReserved, top, c, 0)},
			{Class: "light", Style: barStyle(r.PeakAllocated, top, c, 0.6)},
		}
		title := fmt.Sprintf("peak reserved %s %s, peak allocated %[3]s %[2]s, lower bound %[4]s %[2]s", un.Text(r.PeakReserved), un.Name, un.Text(r.PeakAllocated), un.Text(r.PeakRequested))
		if r.PeakRequested > 0 {
			bar = append(bar, barPart{Class: "bound", Style: markStyle(r.PeakRequested, top)})
		}
		if r.PeakFootprint > r.PeakReserved {
			bar = append(bar, barPart{Class: "tick", Style: markStyle(r.PeakFootprint, top)})
			title += ", peak footprint " + un.Text(r.PeakFootprint) + " " + un.Name
		}
		u := func(v uint64) string { return strconv.FormatUint(v, 10) }
		i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
		rows = append(rows, row{Cells: []cell{
			{Text: labels[i]}, {Text: settings, Class: "set"},
			{Text: un.Text(r.PeakReserved), Class: reservedClass, Title: u(r.PeakReserved) + " bytes", Sort: u(r.PeakReserved)},
			{Text: ratio, Class: "num", Sort: ratioSort},
			{Text: un.Text(r.PeakAllocated), Class: "num", Title: u(r.PeakAllocated) + " bytes", Sort: u(r.PeakAllocated)},
			{Class: "barcell", Title: title, Sort: u(r.PeakReserved), Bar: bar},
			fragCell(r.Result),
			{Text: strconv.FormatFloat(100*r.IdleAtPeak, 'f', 1, 64) + "%", Class: "num", Sort: num(r.IdleAtPeak)},
			{Text: i64(r.DeviceAllocs), Class: "num", Sort: i64(r.DeviceAllocs)},
			{Text: i64(r.DeviceFrees), Class: "num", Sort: i64(r.DeviceFrees)},
			{Text: i64(r.AllocRetries), Class: "num", Sort: i64(r.AllocRetries)},
			{Text: i64(r.OOMs), Class: oomClass, Sort: i64(r.OOMs)},
			{Text: first, Class: "num", Sort: firstSort},
			{Text: timeText, Class: "num", Title: timeTitle, Sort: timeSort},
		}})
	}
	legend := []legendItem{{"fill", "peak reserved"}, {"light", "peak allocated"}, {"bound", "lower bound (peak requested)"}}
	if ticks {
		legend = append(legend, legendItem{"tick", "peak footprint (driver pages)"})
	}
	return head, rows, legend
}

// barStyle places a bar of v on a scale of 0..top in colour c tinted f of
// the way to white.
func barStyle(v, top uint64, c color.RGBA, f float64) template.CSS {
	return template.CSS(fmt.Sprintf("width: %.2f%%; background: %s", share(v, top), hexColor(tint(c, f))))
}

// markStyle places a mark at v on a scale of 0..top.
func markStyle(v, top uint64) template.CSS {
	return template.CSS(fmt.Sprintf("left: %.2f%%", share(v, top)))
}

// share is v in percent of top, 0 for no top, at most 100.
func share(v, top uint64) float64 {
	if top == 0 {
		return 0
	}
	return math.Min(100*float64(v)/float64(top), 100)
}

func msText(ns int64) string { return strconv.FormatFloat(float64(ns)/1e6, 'f', 3, 64) }

// fitRows returns the table of a trace's fit answers: a row per policy
// with its smallest capacity as a bar in its colour beside its peak
// reserved bytes on an unlimited device (light), against the lower bound
// (a black line) and the capacities the cards near the bars leave (their
// memory less the context, grey lines, named in their titles), then a
// column per card saying whether it fits.
func fitRows(fits []results.Fit) *fitTable {
	cards := fitCards(fits)
	un := fitUnit(fits)
	t := &fitTable{Head: []string{"policy", "smallest capacity " + un.Name, "bytes", "over lower bound", "peak reserved, unlimited " + un.Name, "capacities against the lower bound"}}
	for _, c := range cards {
		t.Head = append(t.Head, c.Label())
	}
	rows := make([]results.Result, len(fits))
	var top uint64
	for i, f := range fits {
		rows[i] = results.Result{Policy: f.Policy, Settings: f.Settings}
		top = max(top, f.MinCapacity, f.UnlimitedPeakReserved, f.LowerBound)
	}
	// The cards (less the context) at or below the top, and the first
	// above it, where it is near, as Fit draws them.
	type mark struct {
		name     string
		capacity uint64
	}
	var shown []mark
	var above *mark
	for _, c := range cards {
		if c.Capacity <= fits[0].Context {
			continue
		}
		m := mark{c.Name, c.Capacity - fits[0].Context}
		switch {
		case m.capacity <= top:
			shown = append(shown, m)
		case above == nil || m.capacity < above.capacity:
			above = &m
		}
	}
	if above != nil && float64(above.capacity) <= 1.6*float64(top) {
		shown = append(shown, *above)
	}
	scale := top
	for _, m := range shown {
		scale = max(scale, m.capacity)
	}
	labels, looks := policyLabels(rows), resultLooks(rows)
	for i, f := range fits {
		minText, bytesText, over := "never", "-", "-"
		minSort, overSort := "", ""
		if f.Fits {
			minText, bytesText = un.Text(f.MinCapacity), strconv.FormatUint(f.MinCapacity, 10)
			minSort = bytesText
			if !f.Monotone {
				minText += " *"
			}
			if f.LowerBound > 0 {
				v := float64(f.MinCapacity)/float64(f.LowerBound) - 1
				over, overSort = fmt.Sprintf("%+.1f%%", 100*v), num(v)
			}
		}
		c := looks[i].Color
		var bar []barPart
		if f.Fits {
			bar = append(bar, barPart{Class: "fill", Style: barStyle(f.MinCapacity, scale, c, 0)})
		}
		bar = append(bar, barPart{Class: "light", Style: barStyle(f.UnlimitedPeakReserved, scale, c, 0.6)})
		if f.LowerBound > 0 {
			bar = append(bar, barPart{Class: "bound", Style: markStyle(f.LowerBound, scale)})
		}
		for _, m := range shown {
			bar = append(bar, barPart{Class: "card", Title: m.name + " less the context: " + un.Text(m.capacity) + " " + un.Name, Style: markStyle(m.capacity, scale)})
		}
		title := "smallest capacity: " + minText + " " + un.Name + ", peak reserved on an unlimited device " + un.Text(f.UnlimitedPeakReserved) + " " + un.Name + ", lower bound " + un.Text(f.LowerBound) + " " + un.Name
		if !f.Fits {
			title = "no capacity tried fits; peak reserved on an unlimited device " + un.Text(f.UnlimitedPeakReserved) + " " + un.Name + ", lower bound " + un.Text(f.LowerBound) + " " + un.Name
		}
		for _, m := range shown {
			title += "; " + m.name + " leaves " + un.Text(m.capacity) + " " + un.Name
		}
		cells := []cell{{Text: labels[i]}, {Text: minText, Class: "num", Sort: minSort}, {Text: bytesText, Class: "num", Sort: minSort}, {Text: over, Class: "num", Sort: overSort},
			{Text: un.Text(f.UnlimitedPeakReserved), Class: "num", Sort: strconv.FormatUint(f.UnlimitedPeakReserved, 10)},
			{Class: "barcell", Title: title, Sort: minSort, Bar: bar}}
		fitsOn := map[uint64]bool{}
		known := map[uint64]bool{}
		for _, c := range f.Cards {
			fitsOn[c.Capacity], known[c.Capacity] = c.Fits, true
		}
		for _, c := range cards {
			switch {
			case !known[c.Capacity]:
				cells = append(cells, cell{Text: "", Class: "yn"})
			case fitsOn[c.Capacity]:
				cells = append(cells, cell{Text: "fits", Class: "yn yes"})
			default:
				cells = append(cells, cell{Text: "OOM", Class: "yn no"})
			}
		}
		t.Rows = append(t.Rows, row{Cells: cells})
		if f.Fits && !f.Monotone {
			var caps []string
			for _, c := range f.NonMonotone[:min(len(f.NonMonotone), 4)] {
				caps = append(caps, un.Text(c.Capacity)+" "+un.Name)
			}
			t.Notes = append(t.Notes, fmt.Sprintf("* %s is not monotone in capacity: it runs out of memory at %s although %s %s fits.", labels[i], strings.Join(caps, ", "), un.Text(f.MinCapacity), un.Name))
		}
	}
	t.Bars = []legendItem{{"fill", "smallest capacity without an OOM"}, {"light", "peak reserved, unlimited device"}, {"bound", "lower bound"}}
	if len(shown) > 0 {
		var names []string
		for _, m := range shown {
			names = append(names, m.name)
		}
		t.Bars = append(t.Bars, legendItem{"card", "cards less the context (" + strings.Join(names, ", ") + ")"})
	}
	return t
}

// heat returns the background of a matrix cell of ratio: light green at
// 1 (the lower bound), through light yellow at 1.5, to light red at 3 and
// above, in steps of the ratio's logarithm.
func heat(ratio float64) template.CSS {
	type stop struct {
		at      float64
		r, g, b float64
	}
	stops := []stop{{1, 0xdf, 0xf3, 0xe4}, {1.5, 0xff, 0xf3, 0xc4}, {3, 0xf6, 0xc9, 0xc2}}
	x := math.Max(ratio, 1)
	c := stops[len(stops)-1]
	for i := 1; i < len(stops); i++ {
		if x <= stops[i].at {
			a, b := stops[i-1], stops[i]
			f := math.Log(x/a.at) / math.Log(b.at/a.at)
			c = stop{0, a.r + (b.r-a.r)*f, a.g + (b.g-a.g)*f, a.b + (b.b-a.b)*f}
			break
		}
	}
	return template.CSS(fmt.Sprintf("background: #%02x%02x%02x", int(c.r+0.5), int(c.g+0.5), int(c.b+0.5)))
}

// overviewTable is the matrix of peak reserved ÷ lower bound, a row per
// section with results and a column per policy.
func overviewTable(groups []*reportGroup) *overview {
	var all []results.Result
	for _, g := range groups {
		all = append(all, g.sim()...)
	}
	labels := variantLabels(all)
	col := map[string]int{}
	var cols []string
	for _, l := range labels {
		if _, ok := col[l]; !ok {
			col[l] = len(cols)
			cols = append(cols, l)
		}
	}
	ov := &overview{Head: append([]string{"trace"}, cols...)}
	k := 0
	for _, g := range groups {
		if len(g.results) == 0 {
			continue
		}
		cells := make([]cell, len(cols)+1)
		cells[0] = cell{Text: g.name()}
		best := math.Inf(1)
		ratios := make([]float64, len(cols))
		for i := range ratios {
			ratios[i] = math.NaN()
		}
		lower := g.lowerBound()
		for _, r := range g.results {
			l := labels[k]
			k++
			if lower == 0 {
				continue
			}
			ratio := float64(r.PeakReserved) / float64(lower)
			ratios[col[l]] = ratio
			text := strconv.FormatFloat(ratio, 'f', 2, 64)
			class := "num"
			if r.OOMs > 0 {
				text += " OOM"
				class = "num bad"
			} else {
				best = math.Min(best, ratio)
			}
			c := cell{Text: text, Class: class, Sort: num(ratio)}
			if r.OOMs == 0 {
				c.Style = heat(ratio)
			}
			cells[col[l]+1] = c
		}
		for i, ratio := range ratios {
			if ratio == best && cells[i+1].Class == "num" {
				cells[i+1].Class = "num best"
			}
		}
		ov.Rows = append(ov.Rows, row{Cells: cells})
	}
	return ov
}

// tableView is a table as the template draws it: RowHead makes the first
// cell of each row a row header.
type tableView struct {
	Class   string
	Head    []string
	Rows    []row
	RowHead bool
}

// reportTemplate writes the page as polyglot HTML: valid HTML5 that is
// also well-formed XML (void elements closed, no named entities, the
// script in a CDATA section, the data as JSON without <, > or &).
var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"table": func(class string, head []string, rows []row, rowHead bool) tableView {
		return tableView{class, head, rows, rowHead}
	},
}).Parse(`{{define "table"}}<div class="scroll"><table class="{{.Class}}">
<thead><tr>{{range .Head}}<th class="sortable" tabindex="0" aria-sort="none">{{.}}</th>{{end}}</tr></thead>
<tbody>
{{$rh := .RowHead}}{{range .Rows}}<tr>{{range $i, $c := .Cells}}{{if and $rh (not $i)}}<th>{{$c.Text}}</th>{{else}}<td{{with $c.Class}} class="{{.}}"{{end}}{{with $c.Title}} title="{{.}}"{{end}}{{with $c.Style}} style="{{.}}"{{end}}{{with $c.Sort}} data-v="{{.}}"{{end}}>{{$c.Text}}{{with $c.Bar}}<div class="bar">{{range .}}<span class="{{.Class}}" style="{{.Style}}"{{with .Title}} title="{{.}}"{{end}}></span>{{end}}</div>{{end}}</td>{{end}}{{end}}</tr>
{{end}}</tbody></table></div>
{{end}}{{define "barlegend"}}<p class="barlegend">{{range .}}<span class="key {{.Class}}"></span>{{.Text}} {{end}}</p>
{{end}}<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{{.Title}}</title>
<style>
{{.CSS}}
</style>
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<p class="meta">{{.Summary}}{{if .Inputs}} From {{range $i, $f := .Inputs}}{{if $i}}, {{end}}<code>{{$f}}</code>{{end}}.{{end}}</p>
<p class="meta">Click a column's header to sort a table by it. On a chart the values under the cursor are listed below it; drag across it to zoom into a range, double-click to zoom out; click a policy below a chart to hide or show it.</p>
<noscript><p class="note">The charts are drawn by the page's script, which is off: the tables hold every figure.</p></noscript>
<nav><ul>{{range .Nav}}<li><a href="#{{.ID}}">{{.Name}}</a></li>{{end}}</ul></nav>
</header>
{{with .Overview}}<section id="overview">
<h2>Overview: every policy on every trace</h2>
<p>Peak reserved bytes as a multiple of each trace's lower bound, its peak requested bytes (1.00 is the best any allocator can do): green near the bound, red at three times it and more. The best policy of each trace without an OOM is in bold; OOM marks a policy that ran out of memory.</p>
{{template "table" table "matrix" .Head .Rows true}}</section>
{{end}}{{range .Sections}}{{$sid := .ID}}<section id="{{.ID}}">
<h2>{{.Name}}</h2>
{{if .Facts}}<table class="facts">
{{range .Facts}}<tr><th>{{.Name}}</th><td>{{.Value}}</td></tr>
{{end}}</table>
{{end}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{if .Rows}}<h3>Policies compared</h3>
{{template "table" table "cmp" .Head .Rows false}}{{template "barlegend" .Bars}}{{end}}{{with .Sites}}<h3>Allocation sites at the peak</h3>
{{template "table" table "cmp sites" .Head .Rows false}}{{template "barlegend" .Bars}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{if .Charts}}<script type="application/json" id="data-{{.ID}}">{{.Data}}</script>
{{range .Charts}}<figure class="chart" id="{{.ID}}" data-kind="{{.Kind}}" data-src="data-{{$sid}}"><div class="plot"></div><figcaption>{{.Caption}}</figcaption></figure>
{{end}}{{end}}{{with .Fit}}<h3>Smallest device that fits</h3>
{{template "table" table "fit" .Head .Rows false}}{{template "barlegend" .Bars}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{with .Compare}}<h3>A against B</h3>
{{template "table" table "cmp" .Head .Rows false}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{with .Ranks}}<h3>Ranks side by side</h3>
{{template "table" table "cmp" .Head .Rows false}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{with .Tune}}<h3>Settings ranked</h3>
{{template "table" table "cmp" .Head .Rows false}}{{template "barlegend" .Bars}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}</section>
{{end}}<script>
{{.Script}}
</script>
</body>
</html>
`))

// fragCell is a result's peak fragmentation in a table: its percentage, its
// bytes in the title, or "-" for a version 1 result that did not measure it.
func fragCell(r results.Result) cell {
	if r.FragmentationUnknown {
		return cell{Text: "-", Class: "num", Title: "not measured: a results file of version 1"}
	}
	return cell{Text: strconv.FormatFloat(100*r.PeakFragmentation, 'f', 1, 64) + "%", Class: "num",
		Title: strconv.FormatUint(r.PeakFragmentedBytes, 10) + " bytes fragmented at most", Sort: num(r.PeakFragmentation)}
}

// resultWarnings returns the warnings of results (results.Result.Warnings), a
// line each, naming the policies a warning came with.
func resultWarnings(rs []results.Result) []string {
	var order []string
	who := map[string][]string{}
	for _, r := range rs {
		for _, w := range r.Warnings {
			if who[w] == nil {
				order = append(order, w)
			}
			who[w] = append(who[w], r.Policy)
		}
	}
	out := make([]string, len(order))
	for k, w := range order {
		out[k] = "Warning (" + strings.Join(slices.Compact(who[w]), ", ") + "): " + w
	}
	return out
}
