package sim

import (
	"testing"

	"pgregory.net/rapid"
)

// TestSeriesExpect: a series whose width is set ahead for its number of
// events (expect) merges no points on the way, and has the same points as
// one that merges its points as they run out, for any number of events
// and points, by random values.
func TestSeriesExpect(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		points := 2 * rapid.IntRange(1, 8).Draw(t, "pointPairs")
		defer func(p int) { seriesPoints = p }(seriesPoints)
		seriesPoints = points
		n := rapid.Int64Range(0, 300).Draw(t, "events")
		var merged, ahead SeriesBuilder
		ahead.expect(n)
		width := ahead.width
		vals := rapid.SliceOfN(rapid.Uint64Range(0, 1000), int(3*n), int(3*n)).Draw(t, "values")
		for i := range n {
			req, alloc, res := vals[3*i], vals[3*i+1], vals[3*i+2]
			for _, s := range []*SeriesBuilder{&merged, &ahead} {
				s.Footprint(res / 2)
				if req%7 == 0 {
					s.Fragmented(alloc/3, res+1)
				}
				if s.Add(i, 10*i, req, alloc, res) {
					s.Close(float64(alloc)/1000, float64(req)/1000)
				}
			}
		}
		for _, s := range []*SeriesBuilder{&merged, &ahead} {
			if s.Open() {
				s.Close(0.5, 0.25)
			}
		}
		if max(ahead.width, 1) != max(width, 1) {
			t.Fatalf("%d events, %d points at most: width %d set ahead, %d at the end (merged on the way)", n, points, width, ahead.width)
		}
		a, b := merged.Points(), ahead.Points()
		if len(a) != len(b) {
			t.Fatalf("%d events, %d points at most: %d points merged, %d with the width set ahead (%d)", n, points, len(a), len(b), ahead.width)
		}
		for k := range a {
			if a[k] != b[k] {
				t.Fatalf("%d events, %d points at most: point %d merged %+v, with the width set ahead %+v", n, points, k, a[k], b[k])
			}
		}
	})
}
