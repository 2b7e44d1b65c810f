package plots

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
)

// ReportResult is a replay's result as a report shows it.
type ReportResult struct {
	sim.Result
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
	capacity uint64
	multiCap bool
	results  []ReportResult
	fits     []results.Fit
}

func (g *reportGroup) sim() []sim.Result {
	rs := make([]sim.Result, len(g.results))
	for i, r := range g.results {
		rs[i] = r.Result
		if r.Measured {
			rs[i].Policy += " (gpu)"
		}
	}
	return rs
}

func (g *reportGroup) name() string {
	name := baseName(g.trace)
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
		g := &reportGroup{id: id, trace: trace, capacity: capacity, multiCap: len(caps[trace]) > 1}
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
		var all []sim.Result
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
			charts := []struct {
				suffix, caption string
				build           func([]sim.Result) (*plot.Plot, error)
			}{
				{"memory", "Reserved (thick) and allocated (thin) bytes over the trace of the recorded allocator, the lowest peaks and the cuda baseline (or the policies --plot-policy names), against the requested bytes, the lower bound.", func(rs []sim.Result) (*plot.Plot, error) { return MemoryOf(rs, r.Policies) }},
				{"fragmentation", "Fragmentation (dots: the free reserved memory that could not serve a malloc the policy grew for) and the idle share (lines: 1 − allocated / reserved), over the trace, of the same policies.", func(rs []sim.Result) (*plot.Plot, error) { return FragmentationOf(rs, r.Policies) }},
				{"peaks", "Peak reserved and allocated bytes per policy against the lower bound, the peak requested bytes.", Peaks},
				{"calls", "Device allocations and frees (cudaMalloc and cudaFree calls) per policy.", Calls},
			}
			if hasLatency(g.results) {
				charts = append(charts, struct {
					suffix, caption string
					build           func([]sim.Result) (*plot.Plot, error)
				}{"latency", latencyCaption(g.results), func(rs []sim.Result) (*plot.Plot, error) {
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
			p, err := Fit(g.trace, g.fits, fitCards(g.fits))
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

// WriteReportCharts writes each chart into dir as ID.png and ID.svg, each
// file atomically, and returns the paths written.
func WriteReportCharts(dir string, charts []ReportChart) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	var written []string
	for _, c := range charts {
		for _, format := range Formats {
			path := filepath.Join(dir, c.ID+"."+format)
			if err := writeAtomic(path, func(w io.Writer) error { return c.render(w, format) }); err != nil {
				return written, err
			}
			written = append(written, path)
		}
	}
	return written, nil
}

// WriteReport writes the report as one self-contained HTML page: the
// charts are PNG images inside it, so that it needs no other file and no
// network to view. The page is well-formed XML as well as HTML. It holds
// a summary, an overview of every policy on every trace when there is
// more than one trace, and for each trace (and capacity) its figures, the
// comparison table of the policies, the charts of Charts, and the fit
// answers.
func WriteReport(w io.Writer, r *Report, charts []ReportChart) error {
	imgs, err := renderPNGs(charts)
	if err != nil {
		return err
	}
	page := buildPage(r, charts, imgs)
	return reportTemplate.Execute(w, page)
}

// renderPNGs renders the charts as PNG in parallel.
func renderPNGs(charts []ReportChart) ([][]byte, error) {
	out := make([][]byte, len(charts))
	errs := make([]error, len(charts))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, c := range charts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var buf bytes.Buffer
			errs[i] = c.render(&buf, "png")
			out[i] = buf.Bytes()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("plots: chart %s: %w", charts[i].ID, err)
		}
	}
	return out, nil
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
	}
	navItem  struct{ ID, Name string }
	overview struct {
		Chart    *image
		Policies []string
		Rows     []row
	}
	section struct {
		ID, Name, Trace string
		Facts           []fact
		Head            []string
		Rows            []row
		Charts          []image
		Fit             *fitTable
		Compare         *fitTable // a replay diff's figures
		Ranks           *fitTable // a job's ranks side by side
		Notes           []string
	}
	fact struct{ Name, Value string }
	row  struct{ Cells []cell }
	cell struct {
		Text, Class, Title string
		Style              template.CSS
	}
	image struct {
		ID, Caption string
		Src         template.URL
		// Style sets the width of a chart wider than the others (100 CSS
		// pixels an inch); empty for the others.
		Style template.CSS
	}
	fitTable struct {
		Head  []string
		Rows  []row
		Notes []string
	}
)

func buildPage(r *Report, charts []ReportChart, pngs [][]byte) page {
	imgOf := map[string][]image{}
	for i, c := range charts {
		img := image{
			ID:      "chart-" + c.ID,
			Caption: c.Caption,
			Src:     template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(pngs[i])),
		}
		if c.Width > Width {
			img.Style = template.CSS(fmt.Sprintf("width: %dpx; max-width: none", int(c.Width/vg.Inch*100)))
		}
		imgOf[c.Section] = append(imgOf[c.Section], img)
	}
	groups := r.groups()
	pg := page{Title: r.Title, Inputs: r.Inputs}
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
	switch n := len(r.Diffs); {
	case n == 1:
		pg.Summary = strings.TrimSpace(pg.Summary + " 1 comparison of two runs.")
	case n > 1:
		pg.Summary = strings.TrimSpace(pg.Summary + fmt.Sprintf(" %d comparisons of two runs.", n))
	}

	if imgs := imgOf["overview"]; len(imgs) > 0 {
		pg.Nav = append(pg.Nav, navItem{"overview", "Overview"})
		pg.Overview = overviewTable(groups)
		pg.Overview.Chart = &imgs[0]
	}
	for _, g := range groups {
		pg.Nav = append(pg.Nav, navItem{g.id, g.name()})
		s := section{ID: g.id, Name: g.name(), Trace: g.trace, Charts: imgOf[g.id]}
		if len(g.results) > 0 {
			s.Facts, s.Notes = traceFacts(g)
			s.Head, s.Rows = comparisonTable(g)
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
			t.Rows = append(t.Rows, row{Cells: []cell{{Text: f.Figure}, {Text: c[0], Class: "num"}, {Text: c[1], Class: "num"}, {Text: c[2], Class: "num"}, {Text: c[3], Class: "num"}}})
		}
		t.Notes = append(t.Notes, d.A.Warnings...)
		t.Notes = append(t.Notes, d.B.Warnings...)
		s.Compare = t
		pg.Sections = append(pg.Sections, s)
	}
	return pg
}

// jobSections returns a section per job among the report's results
// (per-rank traces, job.Rank): a row per policy with each rank's peak
// reserved bytes side by side, the spread between ranks and the ranks that
// ran out of memory, the first of them in time.
func jobSections(r *Report) []section {
	rs := make([]*sim.Result, len(r.Results))
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
			c := cell{Text: MiBText(res.PeakReserved), Class: "num"}
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
		cells = append(cells, cell{Text: fmt.Sprintf("%.1f%%", 100*s.Spread()), Class: "num"}, cell{Text: ooms}, cell{Text: first})
		out[k].Ranks.Rows = append(out[k].Ranks.Rows, row{Cells: cells})
	}
	return out
}

// RunName names a run of a comparison: its trace, policy, settings and
// capacity ("a.trace under pytorch (expandable_segments=True), capacity N
// bytes").
func RunName(r *sim.Result) string {
	s := r.Trace + " under " + r.Policy
	if len(r.Settings) > 0 {
		s += " (" + policies.Settings(r.Settings).Join(", ") + ")"
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
func shortRun(r *sim.Result) string { return filepath.Base(r.Trace) + " (" + r.Policy + ")" }

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
func (g *reportGroup) lowerBound() uint64 {
	var lower uint64
	for _, r := range g.results {
		lower = max(lower, r.PeakRequested)
	}
	return lower
}

func traceFacts(g *reportGroup) ([]fact, []string) {
	r0 := g.results[0]
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
		{"lower bound (peak requested)", MiBText(lower) + " MiB (" + strconv.FormatUint(lower, 10) + " bytes)"},
		{"device capacity", formatBytes(g.capacity)},
		{"mallocs that failed in the recording", strconv.FormatInt(sourceOOMs, 10)},
	}
	var offline uint64
	for _, r := range g.results {
		offline = max(offline, r.PeakOffline)
	}
	if offline > 0 {
		facts = append(facts, fact{"offline placement (clairvoyant heuristic, not the optimum)", MiBText(offline) + " MiB (" + strconv.FormatFloat(float64(offline)/float64(max(lower, 1)), 'f', 3, 64) + " × lower bound)"})
	}
	if r0.PeakPinned > 0 || r0.PeakManaged > 0 {
		facts = append(facts, fact{"peak pinned / managed host memory", MiBText(r0.PeakPinned) + " / " + MiBText(r0.PeakManaged) + " MiB"})
	}
	var notes []string
	if anomalies > 0 {
		notes = append(notes, fmt.Sprintf("%d events could not be replayed as recorded; the first: %s.", anomalies, first))
	}
	if r0.Truncated {
		notes = append(notes, fmt.Sprintf("The recorded history starts mid-run: its first %d events rebuild the state before it, and the peaks count from there.", r0.ReconstructedEvents))
	}
	for _, r := range g.results {
		if r.BuildError != "" {
			notes = append(notes, fmt.Sprintf("%s could not be built on this device (%s): every malloc counts as an OOM.", r.Policy, r.BuildError))
		}
		if r.Measured {
			notes = append(notes, fmt.Sprintf("%s (gpu) ran on %s: its figures are the device's.", r.Policy, r.Device))
		}
	}
	return facts, notes
}

func comparisonTable(g *reportGroup) ([]string, []row) {
	head := []string{"policy", "settings", "peak reserved MiB", "÷ lower bound", "peak allocated MiB", "fragmentation at peak", "device allocs", "device frees", "retries", "OOMs", "first OOM (event, bytes)", "allocator time ms"}
	labels := policyLabels(g.sim())
	best := uint64(math.MaxUint64)
	lower := g.lowerBound()
	for _, r := range g.results {
		if r.OOMs == 0 && r.PeakReserved > 0 {
			best = min(best, r.PeakReserved)
		}
	}
	var rows []row
	for i, r := range g.results {
		ratio := "-"
		if lower > 0 {
			ratio = strconv.FormatFloat(float64(r.PeakReserved)/float64(lower), 'f', 3, 64)
		}
		reservedClass := "num"
		if r.PeakReserved == best {
			reservedClass = "num best"
		}
		oomClass, first := "num", "-"
		if r.OOMs > 0 {
			oomClass = "num bad"
			first = fmt.Sprintf("%d, %d", r.FirstOOMEvent, r.FirstOOMSize)
		}
		timeText, timeTitle := "-", ""
		switch {
		case r.Measured && r.MeasuredAllocTimeNS > 0:
			timeText, timeTitle = msText(r.MeasuredAllocTimeNS), "measured"
			if r.Paced {
				timeTitle += ", keeping the trace's idle times"
			}
		case r.SimAllocTimeNS > 0:
			timeText, timeTitle = msText(r.SimAllocTimeNS), "simulated by the cost model, "+msText(r.SimWakeTimeNS)+" of it wake-ups after idle times"
		}
		settings := policies.Settings(r.Settings).Join(" ")
		rows = append(rows, row{Cells: []cell{
			{Text: labels[i]}, {Text: settings, Class: "set"},
			{Text: MiBText(r.PeakReserved), Class: reservedClass, Title: strconv.FormatUint(r.PeakReserved, 10) + " bytes"},
			{Text: ratio, Class: "num"},
			{Text: MiBText(r.PeakAllocated), Class: "num"},
			{Text: strconv.FormatFloat(100*r.FragmentationAtPeak, 'f', 1, 64) + "%", Class: "num"},
			{Text: strconv.FormatInt(r.DeviceAllocs, 10), Class: "num"},
			{Text: strconv.FormatInt(r.DeviceFrees, 10), Class: "num"},
			{Text: strconv.FormatInt(r.AllocRetries, 10), Class: "num"},
			{Text: strconv.FormatInt(r.OOMs, 10), Class: oomClass},
			{Text: first, Class: "num"},
			{Text: timeText, Class: "num", Title: timeTitle},
		}})
	}
	return head, rows
}

func msText(ns int64) string { return strconv.FormatFloat(float64(ns)/1e6, 'f', 3, 64) }

func fitRows(fits []results.Fit) *fitTable {
	cards := fitCards(fits)
	t := &fitTable{Head: []string{"policy", "smallest capacity MiB", "bytes", "over lower bound", "peak reserved, unlimited MiB"}}
	for _, c := range cards {
		t.Head = append(t.Head, c.Name)
	}
	rows := make([]sim.Result, len(fits))
	for i, f := range fits {
		rows[i] = sim.Result{Policy: f.Policy, Settings: f.Settings}
	}
	labels := policyLabels(rows)
	for i, f := range fits {
		minText, bytesText, over := "never", "-", "-"
		if f.Fits {
			minText, bytesText = MiBText(f.MinCapacity), strconv.FormatUint(f.MinCapacity, 10)
			if !f.Monotone {
				minText += " *"
			}
			if f.LowerBound > 0 {
				over = fmt.Sprintf("%+.1f%%", 100*(float64(f.MinCapacity)/float64(f.LowerBound)-1))
			}
		}
		cells := []cell{{Text: labels[i]}, {Text: minText, Class: "num"}, {Text: bytesText, Class: "num"}, {Text: over, Class: "num"}, {Text: MiBText(f.UnlimitedPeakReserved), Class: "num"}}
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
				caps = append(caps, MiBText(c.Capacity)+" MiB")
			}
			t.Notes = append(t.Notes, fmt.Sprintf("* %s is not monotone in capacity: it runs out of memory at %s although %s MiB fits.", labels[i], strings.Join(caps, ", "), MiBText(f.MinCapacity)))
		}
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
	var all []sim.Result
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
	ov := &overview{Policies: cols}
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
			c := cell{Text: text, Class: class}
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

// reportTemplate writes the page as polyglot HTML: valid HTML5 that is
// also well-formed XML (void elements closed, no named entities).
var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{{.Title}}</title>
<style>
body { font-family: "Liberation Sans", Arimo, Arial, Helvetica, sans-serif; margin: 0 auto; max-width: 1500px; padding: 0 24px 48px; color: #1a1a1a; }
h1 { font-size: 26px; margin: 24px 0 4px; }
h2 { font-size: 21px; margin: 36px 0 8px; padding-top: 12px; border-top: 2px solid #d0d0d0; }
h3 { font-size: 16px; margin: 20px 0 6px; }
p, li { font-size: 14px; line-height: 1.45; }
.meta { color: #555; }
nav ul { display: flex; flex-wrap: wrap; gap: 6px 16px; padding: 0; list-style: none; }
nav a { color: #0a58a8; text-decoration: none; font-size: 14px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0 12px; }
th, td { border: 1px solid #d6d6d6; padding: 3px 7px; }
th { background: #f0f0f0; font-weight: 600; text-align: left; vertical-align: bottom; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.set { color: #555; font-size: 12px; }
td.best { background: #dff3e4; font-weight: 600; }
table.matrix td.best { outline: 2px solid #17693a; outline-offset: -2px; }
td.bad { background: #fbe1de; }
td.yn { text-align: center; }
td.yes { color: #17693a; }
td.no { color: #a3261a; font-weight: 600; }
table.facts th { background: none; border: none; font-weight: normal; color: #555; padding-left: 0; }
table.facts td { border: none; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 14px; }
.wide { max-width: 1200px; }
.scroll { overflow-x: auto; }
figure { margin: 0; }
figure img { width: 100%; height: auto; border: 1px solid #e2e2e2; }
figcaption { font-size: 12px; color: #444; margin-top: 3px; }
.note { font-size: 13px; color: #7a4a00; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="meta">{{.Summary}}{{if .Inputs}} From {{range $i, $f := .Inputs}}{{if $i}}, {{end}}<code>{{$f}}</code>{{end}}.{{end}}</p>
<nav><ul>{{range .Nav}}<li><a href="#{{.ID}}">{{.Name}}</a></li>{{end}}</ul></nav>
{{with .Overview}}<section id="overview">
<h2>Overview: every policy on every trace</h2>
<p>Peak reserved bytes as a multiple of each trace's lower bound, its peak requested bytes (1.00 is the best any allocator can do): green near the bound, red at three times it and more. The best policy of each trace without an OOM is in bold; OOM marks a policy that ran out of memory.</p>
<div class="wide">{{with .Chart}}<figure><div class="scroll"><img id="{{.ID}}" src="{{.Src}}" alt="{{.Caption}}"{{with .Style}} style="{{.}}"{{end}}/></div><figcaption>{{.Caption}}</figcaption></figure>{{end}}</div>
<div class="scroll"><table class="matrix">
<tr><th>trace</th>{{range .Policies}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range $i, $c := .Cells}}{{if $i}}<td class="{{$c.Class}}"{{with $c.Style}} style="{{.}}"{{end}}>{{$c.Text}}</td>{{else}}<th>{{$c.Text}}</th>{{end}}{{end}}</tr>
{{end}}</table></div>
</section>
{{end}}{{range .Sections}}<section id="{{.ID}}">
<h2>{{.Name}}</h2>
{{if .Facts}}<table class="facts">
{{range .Facts}}<tr><th>{{.Name}}</th><td>{{.Value}}</td></tr>
{{end}}</table>
{{end}}{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{if .Rows}}<h3>Policies compared</h3>
<div class="scroll"><table class="cmp">
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .Cells}}<td{{if .Class}} class="{{.Class}}"{{end}}{{if .Title}} title="{{.Title}}"{{end}}>{{.Text}}</td>{{end}}</tr>
{{end}}</table></div>
{{end}}{{with .Fit}}<h3>Smallest device that fits</h3>
<div class="scroll"><table class="fit">
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .Cells}}<td{{if .Class}} class="{{.Class}}"{{end}}>{{.Text}}</td>{{end}}</tr>
{{end}}</table></div>
{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{with .Compare}}<h3>A against B</h3>
<div class="scroll"><table class="cmp">
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .Cells}}<td{{if .Class}} class="{{.Class}}"{{end}}>{{.Text}}</td>{{end}}</tr>
{{end}}</table></div>
{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{with .Ranks}}<h3>Ranks side by side</h3>
<div class="scroll"><table class="cmp">
<tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .Cells}}<td{{if .Class}} class="{{.Class}}"{{end}}>{{.Text}}</td>{{end}}</tr>
{{end}}</table></div>
{{range .Notes}}<p class="note">{{.}}</p>
{{end}}{{end}}{{if .Charts}}<div class="charts">
{{range .Charts}}<figure><img id="{{.ID}}" src="{{.Src}}" alt="{{.Caption}}"/><figcaption>{{.Caption}}</figcaption></figure>
{{end}}</div>
{{end}}</section>
{{end}}</body>
</html>
`))
