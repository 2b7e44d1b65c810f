package plots_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/gpualloc/allocsim/plots"
)

const mib = 1 << 20

// builders are the chart builders, by name.
var builders = []struct {
	name  string
	build func([]results.Result) (*plot.Plot, error)
}{
	{"memory", plots.Memory},
	{"fragmentation", plots.Fragmentation},
	{"peaks", plots.Peaks},
	{"calls", plots.Calls},
}

// result returns a result of trace under policy whose series has one point
// per reserved value, with allocated and requested at 90% and 80% of it.
func result(trace, policy string, reserved ...uint64) results.Result {
	r := results.Result{Trace: trace, Policy: policy, FirstOOMEvent: -1, DeviceAllocs: 10, DeviceFrees: 4}
	for i, res := range reserved {
		pt := results.Point{
			Event:     int64(i) * 10,
			Reserved:  res,
			Allocated: res / 10 * 9,
			Requested: res / 10 * 8,
		}
		if res > 0 {
			pt.Fragmentation = 1 - float64(pt.Allocated)/float64(res)
		}
		r.Series = append(r.Series, pt)
		r.PeakReserved = max(r.PeakReserved, pt.Reserved)
		r.PeakAllocated = max(r.PeakAllocated, pt.Allocated)
		r.PeakRequested = max(r.PeakRequested, pt.Requested)
	}
	r.Events = int64(len(reserved)) * 10
	return r
}

// checkPNG checks that data is a PNG of the slide size.
func checkPNG(t *testing.T, name string, data []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", name, err)
	}
	wantW := int(math.Round(float64(plots.Width/vg.Inch) * plots.DPI))
	wantH := int(math.Round(float64(plots.Height/vg.Inch) * plots.DPI))
	if b := img.Bounds(); b.Dx() != wantW || b.Dy() != wantH {
		t.Errorf("%s: %dx%d pixels, want %dx%d", name, b.Dx(), b.Dy(), wantW, wantH)
	}
}

// checkSVG checks that data looks like an SVG document.
func checkSVG(t *testing.T, name string, data []byte) {
	t.Helper()
	s := strings.TrimSpace(string(data))
	if !strings.HasPrefix(s, "<?xml") && !strings.HasPrefix(s, "<svg") {
		t.Errorf("%s: does not start like an SVG document: %.40q", name, s)
	}
	if !strings.Contains(s, "</svg>") {
		t.Errorf("%s: no closing </svg>", name)
	}
}

func TestChartsRender(t *testing.T) {
	for _, b := range builders {
		t.Run(b.name, func(t *testing.T) {
			p, err := b.build(trainingResults())
			if err != nil {
				t.Fatal(err)
			}
			var pngBuf, svgBuf bytes.Buffer
			if err := plots.Render(&pngBuf, p, "png"); err != nil {
				t.Fatal(err)
			}
			checkPNG(t, b.name, pngBuf.Bytes())
			if err := plots.Render(&svgBuf, p, "svg"); err != nil {
				t.Fatal(err)
			}
			checkSVG(t, b.name, svgBuf.Bytes())
		})
	}
}

func TestRenderUnknownFormat(t *testing.T) {
	p, err := plots.Calls(trainingResults())
	if err != nil {
		t.Fatal(err)
	}
	err = plots.Render(io.Discard, p, "pdf")
	if err == nil || !strings.Contains(err.Error(), `unknown format "pdf"`) {
		t.Errorf("Render(pdf) = %v, want an unknown format error", err)
	}
}

func TestChooseUnit(t *testing.T) {
	for _, tc := range []struct {
		max  uint64
		want plots.Unit
	}{
		{0, plots.MiB},
		{1, plots.MiB},
		{512 * mib, plots.MiB},
		{1<<30 - 1, plots.MiB},
		{1 << 30, plots.GiB},
		{141 << 30, plots.GiB},
		{math.MaxUint64, plots.GiB},
	} {
		if got := plots.ChooseUnit(tc.max); got != tc.want {
			t.Errorf("ChooseUnit(%d) = %s, want %s", tc.max, got.Name, tc.want.Name)
		}
	}
	if got := plots.GiB.Of(3 << 29); got != 1.5 {
		t.Errorf("GiB.Of(1.5 GiB) = %v, want 1.5", got)
	}
}

// TestAxisUnit checks that the byte charts label their Y axis in GiB when
// the values reach a GiB and in MiB otherwise.
func TestAxisUnit(t *testing.T) {
	small := []results.Result{result("s.trace", "a", 100*mib, 300*mib), result("s.trace", "b", 200*mib, 900*mib)}
	large := []results.Result{result("l.trace", "a", 100*mib, 3<<30), result("l.trace", "b", 200*mib, 900*mib)}
	for _, b := range builders[:3] {
		if b.name == "fragmentation" {
			continue
		}
		for _, tc := range []struct {
			runs []results.Result
			unit string
		}{{small, "(MiB)"}, {large, "(GiB)"}} {
			p, err := b.build(tc.runs)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(p.Y.Label.Text, tc.unit) {
				t.Errorf("%s of %s: Y label %q, want it to end in %q", b.name, tc.runs[0].Trace, p.Y.Label.Text, tc.unit)
			}
		}
	}
}

// TestEdgeCases renders every chart of awkward result sets, which must
// neither panic nor fail.
func TestEdgeCases(t *testing.T) {
	long := strings.Repeat("very_long_policy_name_", 6)
	oom := result("oom.trace", "capped", 1<<30, 3<<30, 3<<30)
	oom.OOMs, oom.FirstOOMEvent, oom.Capacity = 2, 15, 7<<29
	oom2 := result("oom.trace", "roomy", 1<<30, 2<<30, 2<<30)
	oom2.Capacity = 7 << 29
	var many []results.Result
	for i := range 14 {
		many = append(many, result("many.trace", "policy_"+string(rune('a'+i)), uint64(i+1)*mib, uint64(i+2)*100*mib))
	}
	wide := []results.Result{result("w.trace", "few", 1), result("w.trace", "lots", 1)}
	wide[0].DeviceAllocs, wide[0].DeviceFrees = 3, 0
	wide[1].DeviceAllocs, wide[1].DeviceFrees = 2_000_000, 1_500_000
	zeroCalls := result("z.trace", "none", 5*mib)
	zeroCalls.DeviceAllocs, zeroCalls.DeviceFrees = 0, 0
	withZero := append([]results.Result{zeroCalls}, wide...)
	for i := range withZero {
		withZero[i].Trace = "z.trace"
	}
	same := []results.Result{result("d.trace", "best_fit", 5*mib), result("d.trace", "best_fit", 6*mib), result("d.trace", "best_fit", 7*mib)}
	same[0].Settings = map[string]string{"round": "512"}
	same[1].Settings = map[string]string{"round": "4096"}

	for _, tc := range []struct {
		name string
		runs []results.Result
	}{
		{"single policy", []results.Result{result("one.trace", "only", 10*mib, 20*mib, 15*mib)}},
		{"empty series", []results.Result{{Trace: "e.trace", Policy: "a"}, {Trace: "e.trace", Policy: "b"}}},
		{"one empty series", []results.Result{result("e.trace", "a", 3<<30, 4<<30), {Trace: "e.trace", Policy: "b"}}},
		{"all zero", []results.Result{result("z.trace", "a", 0, 0, 0), result("z.trace", "b", 0, 0)}},
		{"one point", []results.Result{result("p.trace", "a", 2<<30), result("p.trace", "b", 1<<30)}},
		{"long names", []results.Result{result("/some/where/"+long+".pickle.gz", long+"A", 10*mib, 20*mib), result("/some/where/"+long+".pickle.gz", long+"B", 30*mib)}},
		{"unnamed", []results.Result{result("", "", 1*mib, 2*mib)}},
		{"oom and capacity", []results.Result{oom, oom2}},
		{"many policies", many},
		{"wide call range", wide},
		{"zero calls", withZero},
		{"same policy twice", same},
		{"fragmentation out of range", []results.Result{{Trace: "f.trace", Policy: "a", Series: []results.Point{{Event: 1, Fragmentation: -3}, {Event: 2, Fragmentation: math.NaN()}, {Event: 3, Fragmentation: 7}}}}},
		{"tiny values", []results.Result{result("t.trace", "a", 1, 2, 3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, b := range builders {
				p, err := b.build(tc.runs)
				if err != nil {
					t.Fatalf("%s: %v", b.name, err)
				}
				for _, format := range plots.Formats {
					var buf bytes.Buffer
					if err := plots.Render(&buf, p, format); err != nil {
						t.Fatalf("%s as %s: %v", b.name, format, err)
					}
					if format == "png" {
						checkPNG(t, b.name, buf.Bytes())
						if *update && *edges {
							os.WriteFile(filepath.Join(os.TempDir(), "plots-edge-"+strings.ReplaceAll(tc.name, " ", "_")+"-"+b.name+".png"), buf.Bytes(), 0o644)
						}
					}
				}
			}
		})
	}
}

func TestCallsScale(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts []int64
		log    bool
	}{
		{"narrow", []int64{125, 700, 5970}, false},
		{"wide", []int64{3, 3_500_000}, true},
		{"wide with zero", []int64{0, 10, 1000}, true},
		{"all zero", []int64{0, 0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs []results.Result
			for i, c := range tc.counts {
				r := result("c.trace", string(rune('a'+i)), mib)
				r.DeviceAllocs, r.DeviceFrees = c, 0
				rs = append(rs, r)
			}
			p, err := plots.Calls(rs)
			if err != nil {
				t.Fatal(err)
			}
			isLog := strings.HasSuffix(p.Y.Label.Text, "log scale")
			if isLog != tc.log {
				t.Errorf("log scale = %v, want %v", isLog, tc.log)
			}
		})
	}
}

func TestBuilderErrors(t *testing.T) {
	mixed := []results.Result{result("a.trace", "x", mib), result("b.trace", "x", mib)}
	for _, b := range builders {
		if _, err := b.build(nil); !errors.Is(err, plots.ErrNoResults) {
			t.Errorf("%s(nil) = %v, want ErrNoResults", b.name, err)
		}
		if _, err := b.build(mixed); err == nil || !strings.Contains(err.Error(), "more than one trace") {
			t.Errorf("%s(two traces) = %v, want a 'more than one trace' error", b.name, err)
		}
	}
}

func TestWriteAll(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out") // created by WriteAll
	runs := append(trainingResults(),
		result("other/small.csv", "caching", 10*mib, 40*mib),
		result("other/small.csv", "best_fit", 10*mib, 30*mib),
		result("elsewhere/train_gpt.pickle.gz", "caching", 2<<30),
	)
	paths, err := plots.WriteAll(dir, runs, plots.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"train_gpt", "small", "train_gpt-2"} {
		for _, chart := range []string{"memory", "memory-all", "fragmentation", "peaks", "calls"} {
			for _, ext := range []string{"png", "svg"} {
				want = append(want, filepath.Join(dir, name+"-"+chart+"."+ext))
			}
		}
	}
	if strings.Join(paths, "\n") != strings.Join(want, "\n") {
		t.Fatalf("WriteAll wrote\n%s\nwant\n%s", strings.Join(paths, "\n"), strings.Join(want, "\n"))
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p, ".png") {
			checkPNG(t, p, data)
		} else {
			checkSVG(t, p, data)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %d files, want %d (no temporary files left): %v", len(entries), len(want), names)
	}
	small, err := os.ReadFile(filepath.Join(dir, "small-memory.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(small, []byte("memory (MiB)")) {
		t.Errorf("small-memory.svg does not label its axis in MiB")
	}
}

func TestWriteAllErrors(t *testing.T) {
	if _, err := plots.WriteAll(t.TempDir(), nil, plots.Options{}); !errors.Is(err, plots.ErrNoResults) {
		t.Errorf("WriteAll(no results) = %v, want ErrNoResults", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	paths, err := plots.WriteAll(filepath.Join(file, "sub"), trainingResults(), plots.Options{})
	if err == nil || len(paths) != 0 {
		t.Errorf("WriteAll into a path under a file = %v, %v; want no paths and an error", paths, err)
	}
}

// TestFootprintShown: the memory chart draws a policy's device footprint
// and names it in the legend only where the footprint is above the
// reserved bytes somewhere, and the overview ticks a peak footprint above
// the peak reserved.
func TestFootprintShown(t *testing.T) {
	odd := result("fp.trace", "cuda", 10*mib, 20*mib)
	even := result("fp.trace", "pytorch", 10*mib, 20*mib)
	for i := range odd.Series {
		odd.Series[i].Footprint = odd.Series[i].Reserved + 2*mib
		even.Series[i].Footprint = even.Series[i].Reserved
	}
	odd.PeakFootprint, even.PeakFootprint = 22*mib, 20*mib
	svg := func(build func([]results.Result) (*plot.Plot, error), rs ...results.Result) string {
		t.Helper()
		p, err := build(rs)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := plots.Render(&buf, p, "svg"); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	for _, tc := range []struct {
		build func([]results.Result) (*plot.Plot, error)
		label string
	}{{plots.Memory, "device footprint"}, {plots.Overview, "peak footprint"}} {
		if s := svg(tc.build, odd, even); !strings.Contains(s, tc.label) {
			t.Errorf("no %q with a footprint above the reserved bytes", tc.label)
		}
		if s := svg(tc.build, even); strings.Contains(s, tc.label) {
			t.Errorf("%q with the footprint equal to the reserved bytes", tc.label)
		}
	}
}

// svgText renders d as SVG and returns it.
func svgText(t *testing.T, d plots.Drawer) string {
	t.Helper()
	var buf bytes.Buffer
	if err := plots.Render(&buf, d, "svg"); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// hasText reports whether the SVG s draws the text txt (as a whole text
// element).
func hasText(s, txt string) bool {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
	return strings.Contains(s, ">"+r.Replace(txt)+"</text>")
}

// review returns the results of a PyTorch snapshot under six policies:
// pytorch (recorded), cuda (baseline), bfc the worst, rmm-arena the
// lowest but out of memory, and slab, buddy, best-fit the three best.
func review() []results.Result {
	var rs []results.Result
	for _, p := range []struct {
		name     string
		reserved uint64
	}{{"bfc", 1000}, {"best-fit", 700}, {"buddy", 650}, {"cuda", 600}, {"pytorch", 780}, {"rmm-arena", 400}, {"slab", 610}} {
		r := result("kv.pickle.gz", p.name, 100*mib, p.reserved*mib, 300*mib)
		r.TraceSource = "pytorch"
		r.PeakRequested = 590 * mib
		if p.name == "rmm-arena" {
			r.OOMs, r.FirstOOMEvent = 16, 10
		}
		rs = append(rs, r)
	}
	return rs
}

// TestMemoryShown: the memory and fragmentation charts draw the default
// set (named with their roles) or the named policies, and the grid draws
// every policy, each in a panel of its own.
func TestMemoryShown(t *testing.T) {
	rs := review()
	for _, build := range []func([]results.Result, []string) (*plot.Plot, error){plots.MemoryOf, plots.FragmentationOf} {
		p, err := build(rs, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := svgText(t, p)
		for _, want := range []string{"pytorch (recorded)", "slab (lowest peak)", "buddy (2nd lowest peak)", "best-fit (3rd lowest peak)", "cuda (baseline)", "+2 more: every policy"} {
			if !hasText(s, want) {
				t.Errorf("%s: no legend entry %q", p.Title.Text, want)
			}
		}
		for _, absent := range []string{"bfc", "rmm-arena"} {
			if strings.Contains(s, ">"+absent) {
				t.Errorf("%s: draws %s, not in the default set", p.Title.Text, absent)
			}
		}
		p, err = build(rs, []string{"rmm-arena", "bfc"})
		if err != nil {
			t.Fatal(err)
		}
		s = svgText(t, p)
		if !hasText(s, "rmm-arena — OOM ×16") || !hasText(s, "bfc") || strings.Contains(s, ">pytorch") || !hasText(s, "first OOM") {
			t.Errorf("%s of rmm-arena,bfc: want those two, rmm-arena marked OOM in the key, the first OOM, no pytorch", p.Title.Text)
		}
		if _, err := build(rs, []string{"tlsf"}); err == nil || !strings.Contains(err.Error(), `"tlsf"`) {
			t.Errorf("%s of tlsf = %v, want an error naming tlsf", p.Title.Text, err)
		}
	}
	g, err := plots.MemoryGrid(rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Panels) != len(rs) || g.Cols != 4 || g.Rows() != 2 {
		t.Errorf("grid of %d panels in %d columns, %d rows; want %d in 4 x 2", len(g.Panels), g.Cols, g.Rows(), len(rs))
	}
	s := svgText(t, g)
	for _, r := range rs {
		want := r.Policy
		if r.OOMs > 0 {
			want += " — OOM ×16"
		}
		if !hasText(s, want) {
			t.Errorf("grid has no panel %q", want)
		}
	}
	if !hasText(s, "requested (lower bound)") {
		t.Errorf("grid's legend names no requested bytes")
	}
	if w, h := g.Size(); w <= plots.Width || h < plots.Height {
		t.Errorf("grid of 4 x 2 drawn %v x %v, want wider than a slide's chart", w, h)
	}
}

// TestPeaksLabels: every reserved bar carries its value and excess, in
// the chart of 19 policies too; an OOM bar says OOM, and the legend says
// what that means.
func TestPeaksLabels(t *testing.T) {
	var rs []results.Result
	for i := range 19 {
		r := result("many.trace", fmt.Sprintf("policy-number-%02d", i), 100*mib, uint64(600+20*i)*mib)
		r.PeakRequested = 600 * mib
		rs = append(rs, r)
	}
	rs[3].OOMs, rs[3].FirstOOMEvent = 2, 10
	p, err := plots.Peaks(rs)
	if err != nil {
		t.Fatal(err)
	}
	s := svgText(t, p)
	for i, r := range rs {
		want := fmt.Sprintf("%.0f +%d%%", float64(r.PeakReserved)/mib, int(math.Round(100*float64(20*i)/600)))
		if i == 3 {
			want = fmt.Sprintf("%.0f OOM ×2", float64(r.PeakReserved)/mib)
		}
		if !hasText(s, want) {
			t.Errorf("bar %d: no label %q", i, want)
		}
		if !hasText(s, r.Policy) {
			t.Errorf("bar %d: no name %q on the axis", i, r.Policy)
		}
	}
	if !hasText(s, "ran out of memory:") {
		t.Errorf("no legend entry for the OOM bar")
	}
	rs[3].OOMs = 0
	if p, _ = plots.Peaks(rs); strings.Contains(svgText(t, p), "OOM") {
		t.Errorf("OOM drawn with no run out of memory")
	}
}

// TestOverviewCut: a bar above the overview's top is cut there with a
// break and keeps its true value, among 19 policies on 4 traces.
func TestOverviewCut(t *testing.T) {
	var rs []results.Result
	for tr := range 4 {
		for i := range 19 {
			r := result(fmt.Sprintf("t%d.trace", tr), fmt.Sprintf("p%02d", i), 100*mib, uint64(100+i)*mib)
			r.PeakRequested = 100 * mib
			rs = append(rs, r)
		}
	}
	rs[5].PeakReserved = 2640 * mib // 26.4 times the bound
	rs[40].PeakReserved = 301 * mib // 3.01
	p, err := plots.Overview(rs)
	if err != nil {
		t.Fatal(err)
	}
	s := svgText(t, p)
	for _, want := range []string{"26.4", "3.01", "cut at 3: true"} {
		if !hasText(s, want) {
			t.Errorf("overview has no %q", want)
		}
	}
	if p.Y.Max != 3 {
		t.Errorf("overview's top %v, want 3", p.Y.Max)
	}
}
