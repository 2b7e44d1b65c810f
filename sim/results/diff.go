package results

import (
	"io"
	"strings"
)

// Diff is replay diff's record: two runs (two traces, or one trace under
// two policies or settings) and their figures compared.
type Diff struct {
	A       Result       `json:"a"`
	B       Result       `json:"b"`
	Figures []DiffFigure `json:"figures"`
}

// DiffFigure is one figure of a Diff: A's, B's, B - A and B / A (nil when
// A's is 0). Unit is "bytes", "fraction", "calls", "count" or "ns".
type DiffFigure struct {
	Figure string   `json:"figure"`
	Unit   string   `json:"unit"`
	A      float64  `json:"a"`
	B      float64  `json:"b"`
	Delta  float64  `json:"delta"`
	Ratio  *float64 `json:"ratio,omitempty"`
}

// NewDiff compares runs a and b: peak requested, allocated and reserved
// bytes, the peak footprint, the peak fragmentation, fragmentation and
// idle share at the peak reserved bytes, device allocs and
// frees, retries, OOMs, the simulated allocator time and the mallocs.
func NewDiff(a, b *Result) *Diff {
	figures := []struct {
		name, unit string
		of         func(*Result) float64
	}{
		{"peak requested", "bytes", func(r *Result) float64 { return float64(r.PeakRequested) }},
		{"peak allocated", "bytes", func(r *Result) float64 { return float64(r.PeakAllocated) }},
		{"peak reserved", "bytes", func(r *Result) float64 { return float64(r.PeakReserved) }},
		{"peak footprint", "bytes", func(r *Result) float64 { return float64(r.PeakFootprint) }},
		{"peak fragmented bytes", "bytes", func(r *Result) float64 { return float64(r.PeakFragmentedBytes) }},
		{"peak fragmentation", "fraction", func(r *Result) float64 { return r.PeakFragmentation }},
		{"fragmentation at peak", "fraction", func(r *Result) float64 { return r.FragmentationAtPeak }},
		{"idle at peak", "fraction", func(r *Result) float64 { return r.IdleAtPeak }},
		{"device allocs", "calls", func(r *Result) float64 { return float64(r.DeviceAllocs) }},
		{"device frees", "calls", func(r *Result) float64 { return float64(r.DeviceFrees) }},
		{"retries", "count", func(r *Result) float64 { return float64(r.AllocRetries) }},
		{"OOMs", "count", func(r *Result) float64 { return float64(r.OOMs) }},
		{"simulated alloc time", "ns", func(r *Result) float64 { return float64(r.SimAllocTimeNS) }},
		{"mallocs", "count", func(r *Result) float64 { return float64(r.Mallocs) }},
	}
	d := &Diff{A: *a, B: *b}
	unknown := a.FragmentationUnknown || b.FragmentationUnknown
	for _, f := range figures {
		if unknown && strings.Contains(f.name, "fragment") {
			continue // a version 1 result's: not measured
		}
		x, y := f.of(a), f.of(b)
		fig := DiffFigure{Figure: f.name, Unit: f.unit, A: x, B: y, Delta: y - x}
		if x != 0 {
			q := y / x
			fig.Ratio = &q
		}
		d.Figures = append(d.Figures, fig)
	}
	return d
}

// WriteDiff writes replay diff's records as a results file of kind "diff".
func WriteDiff(w io.Writer, ds []*Diff) error { return write(w, KindDiff, ds, nil) }
