package plots_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/sim/results"
)

// latencyRows are made-up latency summaries: small cudaMallocs that all
// take 20 µs, larger ones spread from 200 µs to 2 ms, and cudaFrees.
func latencyRows(scale float64) []results.LatencyRow {
	ns := func(us float64) int64 { return int64(us * scale * 1000) }
	return []results.LatencyRow{
		{Call: "cudaFree", SizeClass: "<=1GiB", Count: 40, MedianNS: ns(300), P90NS: ns(900), P99NS: ns(1500), MaxNS: ns(2000)},
		{Call: "cudaMalloc", SizeClass: "<=1MiB", Count: 100, MedianNS: ns(20), P90NS: ns(20), P99NS: ns(20), MaxNS: ns(20)},
		{Call: "cudaMalloc", SizeClass: "<=1GiB", Count: 60, MedianNS: ns(200), P90NS: ns(600), P99NS: ns(1200), MaxNS: ns(2000)},
	}
}

// reportResults are trainingResults with latency rows and allocator
// times, and a second trace on which the last policy runs out of memory.
func reportResults() []results.Result {
	rs := trainingResults()
	for i := range rs {
		rs[i].Latency = latencyRows(1 + 0.5*float64(i))
		rs[i].SimAllocTimeNS = int64(i+1) * 3e7
	}
	more := trainingResults()
	for i := range more {
		more[i].Trace = "runs/infer.pickle.gz"
		more[i].PeakReserved = uint64(float64(more[i].PeakRequested) * (1.1 + 2*float64(i)))
	}
	more[2].OOMs, more[2].FirstOOMEvent, more[2].FirstOOMSize = 3, 9000, 1<<30
	more[1].BuildError = "device alloc of 80 GiB refused"
	for i := range more {
		more[i].PeakOffline = more[i].PeakRequested + more[i].PeakRequested/20
	}
	return append(rs, more...)
}

func reportFits() []results.Fit {
	cards := func(fits ...bool) []results.CardFit {
		var out []results.CardFit
		for i, c := range []results.Card{{Name: "16GB", Capacity: 16e9}, {Name: "24GB", Capacity: 24e9}, {Name: "40GB", Capacity: 40e9}} {
			out = append(out, results.CardFit{Card: c, Fits: fits[i]})
		}
		return out
	}
	return []results.Fit{
		{Trace: "runs/train_gpt.pickle.gz", Policy: "caching", Fits: true, MinCapacity: 7 * gib, LowerBound: 6 * gib, UnlimitedPeakReserved: 7*gib + gib/2, Monotone: true, Cards: cards(true, true, true)},
		{Trace: "runs/train_gpt.pickle.gz", Policy: "best_fit", Fits: true, MinCapacity: 17 * gib, LowerBound: 6 * gib, UnlimitedPeakReserved: 9 * gib, Monotone: false, NonMonotone: []results.Probe{{Capacity: 18 * gib, OOM: true}}, Cards: cards(false, true, true)},
		{Trace: "runs/train_gpt.pickle.gz", Policy: "expandable", LowerBound: 6 * gib, UnlimitedPeakReserved: 8 * gib, Monotone: true, Cards: cards(false, false, false)},
		{Trace: "runs/only_fit.pickle.gz", Policy: "caching", Fits: true, MinCapacity: gib, LowerBound: gib / 2, UnlimitedPeakReserved: gib, Monotone: true, Cards: cards(true, true, true)},
	}
}

func TestLatencyDistribution(t *testing.T) {
	rows := []results.LatencyRow{
		{Count: 10, MedianNS: 100, P90NS: 100, P99NS: 100, MaxNS: 100},
		{Count: 30, MedianNS: 200, P90NS: 300, P99NS: 400, MaxNS: 1000},
		{Count: 0, MedianNS: 5},
	}
	pts, n := plots.LatencyDistribution(rows)
	want := []plots.LatencyPoint{{100, 0}, {100, 0.25}, {200, 0.25}, {200, 0.625}, {300, 0.925}, {400, 0.9925}, {1000, 1}}
	if n != 40 || len(pts) != len(want) {
		t.Fatalf("%d calls, points %v", n, pts)
	}
	for i := range pts {
		if pts[i].NS != want[i].NS || math.Abs(pts[i].Fraction-want[i].Fraction) > 1e-12 {
			t.Errorf("point %d = %v, want %v", i, pts[i], want[i])
		}
	}
	if pts, n := plots.LatencyDistribution(nil); pts != nil || n != 0 {
		t.Errorf("no rows: %v %d", pts, n)
	}
	// Percentiles out of order are taken as never falling.
	pts, _ = plots.LatencyDistribution([]results.LatencyRow{{Count: 1, MedianNS: 50, P90NS: 40, P99NS: 60, MaxNS: 60}})
	if got := fmt.Sprint(pts); got != "[{50 0} {50 0.9} {60 0.99} {60 1}]" {
		t.Errorf("out of order: %s", got)
	}
}

// TestReportHTML writes a report of two traces, one with fit answers, and
// a trace with fit answers only, and checks that the page is well-formed,
// self-contained, holds a chart element for each series chart with the
// data it draws from, and keeps the tables and notes.
func TestReportHTML(t *testing.T) {
	rs := reportResults()
	rep := &plots.Report{Title: "Review <1> & more", Inputs: []string{"a.json", "b.json"}}
	for i, r := range rs {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
		if i == 1 {
			g := plots.ReportResult{Result: r, Measured: true, Device: "NVIDIA H200", MeasuredAllocTimeNS: 5e7}
			g.Latency = latencyRows(3)
			rep.Results = append(rep.Results, g)
		}
	}
	rep.Fits = reportFits()
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	pg := checkWellFormed(t, html)
	want := []string{
		"train_gpt-memory", "train_gpt-fragmentation", "train_gpt-latency",
		"infer-memory", "infer-fragmentation", // no latency rows
	}
	var ids []string
	for _, f := range pg.charts {
		ids = append(ids, strings.TrimPrefix(f.id, "chart-"))
		if _, ok := pg.data[f.src]; !ok {
			t.Errorf("chart %s draws from %q, which the page does not hold", f.id, f.src)
		}
	}
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("charts %v\nwant %v", ids, want)
	}
	if got := strings.Join(slices.Sorted(maps.Keys(pg.data)), " "); got != "data-t-infer data-t-train_gpt" {
		t.Errorf("data blocks %s", got)
	}
	for _, s := range []string{
		"<title>Review &lt;1&gt; &amp; more</title>",              // escaped
		`<section id="t-train_gpt">`, `<section id="t-only_fit">`, // sections
		`<td class="num bad" data-v="3">3</td>`,               // the OOMs
		"best_fit (gpu)", "best_fit (gpu) ran on NVIDIA H200", // the measured result
		"measured on the GPU for the (gpu) policies",                                                     // the latency caption
		"Memory over the trace, measured on the GPU for the (gpu) policies and simulated for the others", // the memory caption
		"Memory over the trace, simulated:",
		"not monotone in capacity: it runs out of memory at 18.00 GiB although 17.00 GiB fits", // the section's unit: its figures pass 1 GiB
		`<td class="yn no">OOM</td>`, "never",
		"offline placement (clairvoyant heuristic, not the optimum)</th><td>", "1.050 × lower bound",
		"best_fit could not be built on this device (device alloc of 80 GiB refused)",
		"cards less the context (16GB, 24GB)", // the fit bars' legend
	} {
		if !strings.Contains(html, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
	// The overview matrix: a row per trace with results, a column per
	// policy label, the OOM marked (infer's policies reserve 1.1, 3.1 and
	// 5.1 times the lower bound).
	row := between(html, "<tr><th>infer.pickle.gz</th>", "</tr>")
	for _, s := range []string{`<td class="num best" style="background: #e7f3dc" data-v="1.09999`, `<td class="num bad" data-v="5.09999`, `>5.10 OOM</td>`} {
		if !strings.Contains(row, s) {
			t.Errorf("the overview's row of infer lacks %s: %s", s, row)
		}
	}
}

// between returns the text of s from the first from to the next to.
func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	j := strings.Index(s[i:], to)
	if j < 0 {
		return s[i:]
	}
	return s[i : i+j+len(to)]
}

// TestReportSelfContained: the page names no address to load (no URL of
// any scheme, no protocol-relative //cdn, no element that loads a file)
// and carries uPlot's licence.
func TestReportSelfContained(t *testing.T) {
	rep := &plots.Report{Fits: reportFits()}
	for _, r := range reportResults() {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
	}
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, s := range []string{"http:", "https:", "//cdn", "<link", "<img", "<iframe", " src=", "url(", "@import", "data:image"} {
		if i := strings.Index(page, s); i >= 0 {
			t.Errorf("the page holds %q: %s", s, page[max(i-60, 0):min(i+60, len(page))])
		}
	}
	for _, s := range []string{"uPlot 1.6.32, vendored unchanged", "Copyright (c) 2022 Leon Sorokin", "Permission is hereby granted"} {
		if !strings.Contains(page, s) {
			t.Errorf("the page lacks uPlot's licence (%q)", s)
		}
	}
}

// TestReportSortable: every table but the facts has a head row of
// sortable header cells, and numeric cells carry their exact value to
// sort by (bytes for MiB figures).
func TestReportSortable(t *testing.T) {
	rep := &plots.Report{Fits: reportFits()[:3]}
	for _, r := range trainingResults() {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
	}
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	pg := checkWellFormed(t, page)
	if len(pg.tables) != 2 {
		t.Fatalf("%d tables with a head, want 2 (policies, fit): %v", len(pg.tables), pg.tables)
	}
	for _, tb := range pg.tables {
		if tb.sortable != tb.heads || tb.heads == 0 {
			t.Errorf("table %s: %d of %d header cells sortable", tb.class, tb.sortable, tb.heads)
		}
	}
	if pg.tables[0].class != "cmp" || pg.tables[0].heads != 14 || pg.tables[1].class != "fit" || pg.tables[1].heads != 6+3 {
		t.Errorf("tables %+v", pg.tables)
	}
	// One unit for the section, its table and charts: GiB, as its peaks
	// pass 1 GiB (9458037198 bytes = 8.808 GiB).
	const th = `<th class="sortable" tabindex="0" aria-sort="none">peak reserved GiB</th>`
	if !strings.Contains(page, th) {
		t.Errorf("no %s", th)
	}
	const cell = `<td class="num" title="9458037198 bytes" data-v="9458037198">8.81</td>`
	if !strings.Contains(page, cell) {
		t.Errorf("no %s", cell)
	}
}

// TestReportSeriesData: the data a page embeds for a hand-made result of
// five points round-trips to the exact series values: bytes and X to the
// byte and nanosecond, fragmentation to 1/10000, the first OOM's point,
// the footprint only where it is above the reserved bytes, the requested
// bytes once, shared X columns and shared value columns once.
func TestReportSeriesData(t *testing.T) {
	pts := []results.Point{
		{Event: 3, Time: 5_000_000_000, Requested: 1000, Allocated: 1024, Reserved: 2 << 20, Footprint: 2 << 20, Fragmentation: 1 - 1024.0/(2<<20)},
		{Event: 7, Time: 5_000_001_500, Requested: 5000, Allocated: 5120, Reserved: 2 << 20, Footprint: 2 << 20, Fragmentation: 0.99755859375},
		{Event: 12, Time: 5_000_004_000, Requested: 3000, Allocated: 3072, Reserved: 4 << 20, Footprint: 6 << 20, Fragmentation: 0.99926757812},
		{Event: 13, Time: 5_000_004_001, Requested: 0, Allocated: 0, Reserved: 4 << 20, Footprint: 6 << 20, Fragmentation: 0},
		{Event: 20, Time: 5_000_009_000, Requested: 1 << 40, Allocated: 1 << 40, Reserved: 1<<40 + 1<<21, Footprint: 1<<40 + 1<<21, Fragmentation: 1.9073468138230965e-06},
	}
	a := results.Result{Trace: "t.trace", Policy: "pytorch", Series: pts, OOMs: 1, FirstOOMEvent: 10, Capacity: 1<<40 + 1<<30}
	b := results.Result{Trace: "t.trace", Policy: "cuda", Series: slices.Clone(pts), FirstOOMEvent: -1, Capacity: 1<<40 + 1<<30}
	for i := range b.Series {
		b.Series[i].Reserved, b.Series[i].Footprint = b.Series[i].Allocated, 0 // cuda holds what it hands out
	}
	empty := results.Result{Trace: "t.trace", Policy: "bfc", FirstOOMEvent: -1, Capacity: 1<<40 + 1<<30}
	s := reportData(t, []results.Result{a, b, empty}).Series
	if s == nil || s.XUnit != "s" || len(s.X) != 1 || len(s.Events) != 1 || len(s.Policies) != 3 {
		t.Fatalf("series data %+v", s)
	}
	col := func(i int) []int64 {
		t.Helper()
		v, err := s.Column(i)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got, want := col(s.X[0]), []int64{0, 1500, 4000, 4001, 9000}; !slices.Equal(got, want) {
		t.Errorf("x %v, want %v (ns from the first point)", got, want)
	}
	if got, want := col(s.Events[0]), []int64{3, 7, 12, 13, 20}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if got, want := col(s.Requested), []int64{1000, 5000, 3000, 0, 1 << 40}; !slices.Equal(got, want) || s.RequestedX != 0 {
		t.Errorf("requested %v on x %d, want %v on 0", got, s.RequestedX, want)
	}
	pa, pb, pe := s.Policies[0], s.Policies[1], s.Policies[2]
	if got, want := col(pa.Reserved), []int64{2 << 20, 2 << 20, 4 << 20, 4 << 20, 1<<40 + 1<<21}; !slices.Equal(got, want) {
		t.Errorf("pytorch reserved %v, want %v", got, want)
	}
	if got, want := col(pa.Footprint), []int64{2 << 20, 2 << 20, 6 << 20, 6 << 20, 1<<40 + 1<<21}; !slices.Equal(got, want) {
		t.Errorf("pytorch footprint %v, want %v", got, want)
	}
	// 1 - 1024/2 MiB = 0.99951 is 9995 ten-thousandths; 0.0000019 is 0.
	if got, want := col(pa.Fragmentation), []int64{9995, 9976, 9993, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("pytorch fragmentation %v, want %v (1/10000ths)", got, want)
	}
	// cuda's reserved bytes are its allocated bytes, which are pytorch's:
	// one column for the three; its footprint is never above them.
	if pb.Reserved != pa.Allocated || pb.Allocated != pa.Allocated || pb.Footprint != -1 || pb.X != 0 {
		t.Errorf("cuda's columns %+v, pytorch's %+v", pb, pa)
	}
	if got, want := col(pb.Allocated), []int64{1024, 5120, 3072, 0, 1 << 40}; !slices.Equal(got, want) {
		t.Errorf("allocated %v, want %v", got, want)
	}
	// The OOM at event 10 is in the point that ends at event 12.
	if pa.OOM != 2 || pb.OOM != -1 {
		t.Errorf("OOM points %d, %d; want 2, -1", pa.OOM, pb.OOM)
	}
	if pe.X != -1 || pe.Label != "bfc (no series)" || pa.Label != "pytorch" || pa.Color == pb.Color {
		t.Errorf("labels, colours: %+v %+v %+v", pa, pb, pe)
	}
	if s.Capacity != 1<<40+1<<30 {
		t.Errorf("capacity %d", s.Capacity)
	}
	// A trace without times is drawn by event: X is the event index.
	for _, r := range []*results.Result{&a, &b} {
		for i := range r.Series {
			r.Series[i].Time = 0
		}
	}
	s = reportData(t, []results.Result{a, b}).Series
	if got, want := col(s.X[0]), []int64{3, 7, 12, 13, 20}; s.XUnit != "events" || !slices.Equal(got, want) || s.Events != nil {
		t.Errorf("by event: %s %v, want %v", s.XUnit, got, want)
	}
}

// TestReportLatencyData: two policies' latency distributions on one X:
// a row of 100 calls of 20 µs (a jump from 0 to 1 there) and one of 100
// calls from 10 µs (median) to 40 µs (max): its knots at 10, 20, 30, 40
// µs; a time where either jumps is there twice.
func TestReportLatencyData(t *testing.T) {
	a := results.Result{Trace: "t", Policy: "cuda", FirstOOMEvent: -1, Latency: []results.LatencyRow{{Count: 100, MedianNS: 20000, P90NS: 20000, P99NS: 20000, MaxNS: 20000}}}
	b := results.Result{Trace: "t", Policy: "pytorch", FirstOOMEvent: -1, Latency: []results.LatencyRow{{Count: 100, MedianNS: 10000, P90NS: 20000, P99NS: 30000, MaxNS: 40000}}}
	c := results.Result{Trace: "t", Policy: "bfc", FirstOOMEvent: -1}
	d := reportData(t, []results.Result{a, b, c}).Latency
	if d == nil || d.Kind != "simulated" || len(d.Policies) != 3 {
		t.Fatalf("latency %+v", d)
	}
	if want := []int64{10000, 10000, 20000, 20000, 30000, 40000}; !slices.Equal(d.NS, want) {
		t.Fatalf("ns %v, want %v", d.NS, want)
	}
	show := func(share []*int64) string {
		var out []string
		for _, v := range share {
			if v == nil {
				out = append(out, "-")
			} else {
				out = append(out, strconv.FormatInt(*v, 10))
			}
		}
		return strings.Join(out, " ")
	}
	// cuda jumps from 0 to 100% at 20 µs; pytorch from 0 to 50% at 10 µs,
	// then 90% at 20, 99% at 30, 100% at 40.
	if got := show(d.Policies[0].Share); got != "- - 0 10000 - -" {
		t.Errorf("cuda's shares %s", got)
	}
	if got := show(d.Policies[1].Share); got != "0 5000 - 9000 9900 10000" {
		t.Errorf("pytorch's shares %s", got)
	}
	if p := d.Policies[2]; p.Calls != 0 || p.Share != nil || p.Label != "bfc (no latency data)" {
		t.Errorf("bfc %+v", p)
	}
}

// sectionData is what a page embeds for a section's charts.
type sectionData struct {
	Series  *plots.SeriesData  `json:"series"`
	Latency *plots.LatencyData `json:"latency"`
}

// reportData writes a report of rs, results of one trace, and returns the
// data of its section.
func reportData(t *testing.T, rs []results.Result) sectionData {
	t.Helper()
	rep := &plots.Report{}
	for _, r := range rs {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
	}
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	pg := checkWellFormed(t, buf.String())
	if len(pg.data) != 1 {
		t.Fatalf("%d data blocks in the page (%v), want 1", len(pg.data), slices.Collect(maps.Keys(pg.data)))
	}
	var d sectionData
	for _, raw := range pg.data {
		if err := json.Unmarshal([]byte(raw), &d); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestColumn: columns worked by hand: the step is the values' greatest
// common divisor, each delta zigzag-coded (0 -1 1 -2 as 0 1 2 3) in 5-bit
// groups, lowest first, a character each ("A".."Z" 0..25, "a".."z"
// 26..51, "0".."9" 52..61, "-" 62, "_" 63), 32 added where more follow.
func TestColumn(t *testing.T) {
	for _, tc := range []struct {
		vs   []int64
		step int64
		text string
	}{
		{[]int64{0, 512, 1536, 1024}, 512, "ACEB"}, // 0 1 3 2: deltas 0 1 2 -1, zigzag 0 2 4 1
		{[]int64{5, 2}, 1, "KF"},                   // deltas 5 -3: zigzag 10 5
		{[]int64{16, 16 + 16*16}, 16, "CgB"},       // 1 17: deltas 1 16, zigzag 2, 32 = groups 0 (more: 32, "g") and 1
		{[]int64{3, 1<<40 + 3}, 1, "GggggggggC"},   // zigzag 6, then 2^41: eight groups of 0 with more, then 2
		{[]int64{0, 0}, 1, "AA"},
		{[]int64{-7}, 7, "B"}, // -1: zigzag 1
	} {
		c := plots.EncodeColumn(tc.vs)
		if c.Step != tc.step || c.Deltas != tc.text {
			t.Errorf("%v: step %d %q, want %d %q", tc.vs, c.Step, c.Deltas, tc.step, tc.text)
		}
		if got, err := c.Values(); err != nil || !slices.Equal(got, tc.vs) {
			t.Errorf("%v: back to %v, %v", tc.vs, got, err)
		}
	}
	for _, tc := range []struct {
		c    plots.Column
		want string
	}{
		{plots.Column{Step: 1, Deltas: "AB!"}, `character 2 ('!') is not a digit`},
		{plots.Column{Step: 1, Deltas: "Ag"}, "the last number is cut short"},
	} {
		if _, err := tc.c.Values(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.c.Deltas, err, tc.want)
		}
	}
}

// TestReportSize: a report of 19 policies with 2000 series points each
// (the most a result holds) and latencies, on three traces, stays below
// 1 MB (measured: 925209 bytes, 8 bytes a policy and point, as the
// random walk's steps of up to 2 MiB take 3 characters for the allocated
// bytes and 3 for the fragmentation; a real trace's series change less:
// 11 snapshots under every policy, 209 results, give 1.7 MB against 9.4
// MB for the page of PNG charts).
func TestReportSize(t *testing.T) {
	rep := &plots.Report{}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, trace := range []string{"a.trace", "b.trace", "c.trace"} {
		for k := range 19 {
			r := results.Result{Trace: trace, Policy: fmt.Sprintf("p%d", k), Latency: latencyRows(1 + float64(k)/4), FirstOOMEvent: -1}
			var req, alloc, res uint64
			for i := range results.MaxSeriesPoints {
				req = uint64(max(int64(req)+rng.Int64N(4<<20)-2<<20, 0))
				alloc = req + req/50 + uint64(k)*512
				alloc -= alloc % 512
				res = max(res, alloc+(2<<20)-1)
				res -= res % (2 << 20)
				r.Series = append(r.Series, results.Point{Event: int64(i) * 37, Time: int64(i) * 1_000_003, Requested: req, Allocated: alloc, Reserved: res, Fragmentation: 1 - float64(alloc)/float64(max(res, 1))})
				r.PeakRequested, r.PeakReserved = max(r.PeakRequested, req), max(r.PeakReserved, res)
			}
			rep.Results = append(rep.Results, plots.ReportResult{Result: r})
		}
	}
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes", buf.Len())
	if buf.Len() > 1_000_000 {
		t.Errorf("the report is %d bytes, more than 1000000", buf.Len())
	}
}

// parsedPage is what checkWellFormed finds in a page: its chart elements
// in order, its data by script id, its tables with a head.
type parsedPage struct {
	charts []struct{ id, src string }
	data   map[string]string
	tables []parsedTable
}

type parsedTable struct {
	class           string
	heads, sortable int
}

// checkWellFormed parses page as XML, strictly, and returns its charts,
// data and tables. The page must be one html element with head and body.
func checkWellFormed(t *testing.T, page string) parsedPage {
	t.Helper()
	if !strings.HasPrefix(page, "<!DOCTYPE html>\n") {
		t.Errorf("no doctype")
	}
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = true
	pg := parsedPage{data: map[string]string{}}
	var stack []string
	roots := 0
	var dataID string
	attr := func(e xml.StartElement, name string) string {
		for _, a := range e.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if len(stack) == 0 {
				roots++
				if e.Name.Local != "html" {
					t.Errorf("root element %s", e.Name.Local)
				}
			}
			if len(stack) == 1 && e.Name.Local != "head" && e.Name.Local != "body" {
				t.Errorf("%s in html", e.Name.Local)
			}
			stack = append(stack, e.Name.Local)
			switch e.Name.Local {
			case "figure":
				if attr(e, "class") == "chart" {
					pg.charts = append(pg.charts, struct{ id, src string }{attr(e, "id"), attr(e, "data-src")})
				}
			case "script":
				if attr(e, "type") == "application/json" {
					dataID = attr(e, "id")
				}
			case "table":
				pg.tables = append(pg.tables, parsedTable{class: attr(e, "class")})
			case "th":
				if len(stack) >= 3 && stack[len(stack)-3] == "thead" {
					tb := &pg.tables[len(pg.tables)-1]
					tb.heads++
					if attr(e, "class") == "sortable" && attr(e, "tabindex") == "0" && attr(e, "aria-sort") == "none" {
						tb.sortable++
					}
				}
			}
		case xml.CharData:
			if dataID != "" {
				pg.data[dataID] += string(e)
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
			dataID = ""
		}
	}
	if roots != 1 || len(stack) != 0 {
		t.Errorf("%d root elements, %d left open", roots, len(stack))
	}
	// Tables without a head (the facts) are not sorted.
	var heads []parsedTable
	for _, tb := range pg.tables {
		if tb.heads > 0 {
			heads = append(heads, tb)
		}
	}
	pg.tables = heads
	return pg
}

func TestWriteReportCharts(t *testing.T) {
	rep := &plots.Report{Fits: reportFits()[:3]}
	for _, r := range trainingResults() {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
	}
	charts, err := rep.Charts()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	written, err := plots.WriteReportCharts(filepath.Join(dir, "slides"), charts)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 2*len(charts) || len(charts) != 5 {
		t.Fatalf("%d files for %d charts", len(written), len(charts))
	}
	for _, p := range written {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestReportChartErrors(t *testing.T) {
	if _, err := plots.Overview(nil); !errors.Is(err, plots.ErrNoResults) {
		t.Errorf("Overview: %v", err)
	}
	if _, err := plots.Fit("t", nil, nil); !errors.Is(err, plots.ErrNoResults) {
		t.Errorf("Fit: %v", err)
	}
	if _, err := plots.LatencyCDF(nil); !errors.Is(err, plots.ErrNoResults) {
		t.Errorf("LatencyCDF: %v", err)
	}
	// Results without latency rows still give a chart, which says so.
	p, err := plots.LatencyCDF(trainingResults())
	if err != nil || p == nil {
		t.Errorf("LatencyCDF without rows: %v", err)
	}
}

func ExampleLatencyCDF() {
	rs := trainingResults()
	for i := range rs {
		rs[i].Latency = latencyRows(1 + 0.5*float64(i))
	}
	p, err := plots.LatencyCDF(rs)
	if err != nil {
		log.Fatal(err)
	}
	save(p, "latency")
	fmt.Println(p.Title.Text)
	fmt.Println(p.X.Label.Text, "/", p.Y.Label.Text)
	// Output:
	// device call latency: train_gpt.pickle.gz
	// latency per call (µs, log scale) / calls at or below (%)
}

func ExampleOverview() {
	p, err := plots.Overview(reportResults())
	if err != nil {
		log.Fatal(err)
	}
	save(p, "overview")
	fmt.Println(p.Title.Text)
	fmt.Println(p.Y.Label.Text)
	// Output:
	// peak reserved ÷ lower bound, every policy on every trace
	// peak reserved ÷ peak requested
}

func ExampleFit() {
	rows := reportFits()[:3]
	cards := []results.Card{{Name: "16GB", Capacity: 16e9}, {Name: "24GB", Capacity: 24e9}}
	p, err := plots.Fit("runs/train_gpt.pickle.gz", rows, cards)
	if err != nil {
		log.Fatal(err)
	}
	save(p, "fit")
	fmt.Println(p.Title.Text)
	fmt.Println(p.Y.Label.Text)
	// Output:
	// smallest capacity without OOM: train_gpt.pickle.gz
	// capacity (GiB)
}

// TestReportSites: a result with its sites at the peak gets a row per site
// in the sites table, with the site's bytes; without sites there is no
// table.
func TestReportSites(t *testing.T) {
	rs := trainingResults()
	page := func(rs []results.Result) string {
		rep := &plots.Report{}
		for _, r := range rs {
			rep.Results = append(rep.Results, plots.ReportResult{Result: r})
		}
		var buf bytes.Buffer
		if err := plots.WriteReport(&buf, rep); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	if p := page(rs); strings.Contains(p, "Allocation sites at the peak") {
		t.Errorf("a sites table without sites")
	}
	rs[0].Sites = &results.SitesAtPeak{Event: 7, Reserved: 3 << 20, Depth: 1, Sites: []results.SiteBytes{
		{Site: "a.py:3:f", LiveBytes: 2 << 20, Count: 2, UnusedBytes: 512 << 10},
		{Site: "(no stack)", LiveBytes: 512 << 10, Count: 1},
	}}
	p := page(rs)
	pg := checkWellFormed(t, p)
	var sites *parsedTable
	for k := range pg.tables {
		if strings.Contains(pg.tables[k].class, "sites") {
			sites = &pg.tables[k]
		}
	}
	if sites == nil || sites.heads != 8 || sites.sortable != 8 {
		t.Fatalf("sites table %+v", sites)
	}
	for _, s := range []string{">a.py:3:f<", `title="2097152 bytes"`, `title="524288 bytes"`, ">(no stack)<"} {
		if !strings.Contains(p, s) {
			t.Errorf("the sites table lacks %s", s)
		}
	}
}

// TestReportSectionUnit: a trace's section shows its bytes in one unit,
// its table's and its memory chart's alike. Of two policies, one peaking
// at 900 MiB and one at 1536 MiB (above 1 GiB), the memory chart drawn
// alone shows only the lower (the lowest peak and cuda), in MiB; in the
// report it takes the section's unit, GiB, as the table does (900 MiB =
// 0.88 GiB, 1536 MiB = 1.50 GiB).
func TestReportSectionUnit(t *testing.T) {
	const mib = 1 << 20
	mk := func(policy string, peak uint64) results.Result {
		return results.Result{Trace: "t.pickle.gz", Policy: policy, FirstOOMEvent: -1, PeakReserved: peak, PeakAllocated: peak / 2, PeakRequested: peak / 2,
			Series: []results.Point{{Event: 0}, {Event: 1, Reserved: peak, Allocated: peak / 2, Requested: 400 * mib}, {Event: 2}}}
	}
	rs := []results.Result{mk("cuda", 900*mib), mk("buddy", 1536*mib)}
	alone, err := plots.MemoryOf(rs, []string{"cuda"})
	if err != nil {
		t.Fatal(err)
	}
	if got := alone.Y.Label.Text; got != "memory (MiB)" {
		t.Errorf("MemoryOf alone: %q, want memory (MiB)", got)
	}
	rep := &plots.Report{Policies: []string{"cuda"}}
	for _, r := range rs {
		rep.Results = append(rep.Results, plots.ReportResult{Result: r})
	}
	charts, err := rep.Charts()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range charts {
		if strings.HasSuffix(c.ID, "memory") {
			found = true
			if got := c.Plot.Y.Label.Text; got != "memory (GiB)" {
				t.Errorf("report chart %s: %q, want memory (GiB)", c.ID, got)
			}
		}
	}
	if !found {
		t.Fatalf("no memory chart among %d", len(charts))
	}
	var page bytes.Buffer
	if err := plots.WriteReport(&page, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{">peak reserved GiB</th>", ">0.88</td>", ">1.50</td>"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page.String(), ">peak reserved MiB</th>") {
		t.Errorf("the page has a MiB column beside the GiB chart")
	}
}

// TestReportTraceNames: two traces of one file name in different folders
// are told apart on the page by their folders (results.ShortNames), a
// trace whose file name is its own by its file name.
func TestReportTraceNames(t *testing.T) {
	rep := &plots.Report{}
	for _, tr := range []string{"/runs/a/x.pickle.gz", "/runs/b/x.pickle.gz", "/runs/b/y.pickle.gz"} {
		rep.Results = append(rep.Results, plots.ReportResult{Result: results.Result{Trace: tr, Policy: "cuda", FirstOOMEvent: -1, PeakReserved: 1 << 20, PeakRequested: 1 << 20,
			Series: []results.Point{{Event: 0}, {Event: 1, Reserved: 1 << 20, Requested: 1 << 20}}}})
	}
	var page bytes.Buffer
	if err := plots.WriteReport(&page, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<a href="#t-x">a/x.pickle.gz</a>`, `<a href="#t-x-2">b/x.pickle.gz</a>`, `<a href="#t-y">y.pickle.gz</a>`} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("the page lacks %s", want)
		}
	}
}
