package plots_test

import (
	"bytes"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
)

// latencyRows are made-up latency summaries: small cudaMallocs that all
// take 20 µs, larger ones spread from 200 µs to 2 ms, and cudaFrees.
func latencyRows(scale float64) []sim.LatencyRow {
	ns := func(us float64) int64 { return int64(us * scale * 1000) }
	return []sim.LatencyRow{
		{Call: "cudaFree", SizeClass: "<=1GiB", Count: 40, MedianNS: ns(300), P90NS: ns(900), P99NS: ns(1500), MaxNS: ns(2000)},
		{Call: "cudaMalloc", SizeClass: "<=1MiB", Count: 100, MedianNS: ns(20), P90NS: ns(20), P99NS: ns(20), MaxNS: ns(20)},
		{Call: "cudaMalloc", SizeClass: "<=1GiB", Count: 60, MedianNS: ns(200), P90NS: ns(600), P99NS: ns(1200), MaxNS: ns(2000)},
	}
}

// reportResults are trainingResults with latency rows and allocator
// times, and a second trace on which the last policy runs out of memory.
func reportResults() []sim.Result {
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
	rows := []sim.LatencyRow{
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
	pts, _ = plots.LatencyDistribution([]sim.LatencyRow{{Count: 1, MedianNS: 50, P90NS: 40, P99NS: 60, MaxNS: 60}})
	if got := fmt.Sprint(pts); got != "[{50 0} {50 0.9} {60 0.99} {60 1}]" {
		t.Errorf("out of order: %s", got)
	}
}

// TestReportHTML writes a report of two traces, one with fit answers, and
// a trace with fit answers only, and checks that the page is well-formed,
// self-contained and holds every chart as a PNG of the charts' size.
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
	charts, err := rep.Charts()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range charts {
		ids = append(ids, c.ID)
	}
	want := []string{
		"overview",
		"train_gpt-memory", "train_gpt-fragmentation", "train_gpt-peaks", "train_gpt-calls", "train_gpt-latency", "train_gpt-fit",
		"infer-memory", "infer-fragmentation", "infer-peaks", "infer-calls", // no latency rows
		"only_fit-fit",
	}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("charts %v\nwant %v", ids, want)
	}
	var buf bytes.Buffer
	if err := plots.WriteReport(&buf, rep, charts); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	imgs := checkWellFormed(t, html)
	for _, id := range want {
		src, ok := imgs["chart-"+id]
		if !ok {
			t.Errorf("chart %s is not in the page", id)
			continue
		}
		data, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(src, "data:image/png;base64,"))
		if err != nil || !strings.HasPrefix(src, "data:image/png;base64,") {
			t.Errorf("chart %s: not an inline PNG (%v)", id, err)
			continue
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(data))
		if err != nil || cfg.Width != 1200 || cfg.Height != 675 {
			t.Errorf("chart %s: %v, %dx%d", id, err, cfg.Width, cfg.Height)
		}
	}
	if len(imgs) != len(want) {
		t.Errorf("%d images, want %d", len(imgs), len(want))
	}
	for _, s := range []string{
		"<title>Review &lt;1&gt; &amp; more</title>",              // escaped
		`<section id="t-train_gpt">`, `<section id="t-only_fit">`, // sections
		`<td class="num bad">3</td>`,           // the OOMs
		"best_fit (gpu)", "ran on NVIDIA H200", // the measured result
		"measured on the GPU for the (gpu) policies", // the latency caption
		"not monotone in capacity: it runs out of memory at 18432.0 MiB although 17408.0 MiB fits",
		`<td class="yn no">OOM</td>`, "never",
		"offline placement (clairvoyant heuristic, not the optimum)</th><td>", "1.050 × lower bound",
		"best_fit could not be built on this device (device alloc of 80 GiB refused)",
	} {
		if !strings.Contains(html, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
	for _, s := range []string{"http://", "https://", "<script", "<link"} {
		if strings.Contains(html, s) {
			t.Errorf("the page is not self-contained: it holds %q", s)
		}
	}
}

// checkWellFormed parses page as XML, strictly, and returns the src of
// each img by id. The page must be one html element with head and body.
func checkWellFormed(t *testing.T, page string) map[string]string {
	t.Helper()
	if !strings.HasPrefix(page, "<!DOCTYPE html>\n") {
		t.Errorf("no doctype")
	}
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = true
	imgs := map[string]string{}
	var stack []string
	roots := 0
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
			if e.Name.Local == "img" {
				var id, src, alt string
				for _, a := range e.Attr {
					switch a.Name.Local {
					case "id":
						id = a.Value
					case "src":
						src = a.Value
					case "alt":
						alt = a.Value
					}
				}
				if _, dup := imgs[id]; dup || id == "" || alt == "" {
					t.Errorf("img %q: duplicate or without id or alt", id)
				}
				imgs[id] = src
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if roots != 1 || len(stack) != 0 {
		t.Errorf("%d root elements, %d left open", roots, len(stack))
	}
	return imgs
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
