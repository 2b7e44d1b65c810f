package plots

import (
	"math"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/sim/results"
	"gonum.org/v1/plot"
)

// Unit is a binary unit of bytes used on a chart's axis.
type Unit struct {
	// Name is the unit's symbol as shown in axis labels, "MiB" or "GiB".
	Name string
	// Bytes is the number of bytes in one unit.
	Bytes float64
}

// The units ChooseUnit picks from.
var (
	MiB = Unit{Name: "MiB", Bytes: 1 << 20}
	GiB = Unit{Name: "GiB", Bytes: 1 << 30}
)

// ChooseUnit returns the unit in which to draw byte figures whose largest
// value is maxBytes: GiB from 1 GiB up, MiB below (including zero, so that an
// all-zero chart still reads in a familiar unit).
func ChooseUnit(maxBytes uint64) Unit {
	if maxBytes >= 1<<30 {
		return GiB
	}
	return MiB
}

// Text formats b bytes in the unit, as a table of the report shows them:
// MiB with one decimal, GiB with two.
func (u Unit) Text(b uint64) string {
	d := 1
	if u.Bytes >= 1<<30 {
		d = 2
	}
	return strconv.FormatFloat(u.Of(b), 'f', d, 64)
}

// Of returns b bytes in the unit.
func (u Unit) Of(b uint64) float64 { return float64(b) / u.Bytes }

// niceStep returns the smallest step of the form m*10^k, with m in
// {1, 2, 2.5, 5}, that is at least raw, and its decimal places needed to
// print multiples of it exactly.
func niceStep(raw float64) (step float64, decimals int) {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1, 0
	}
	exp := math.Floor(math.Log10(raw))
	pow := math.Pow(10, exp)
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*pow >= raw*(1-1e-6) {
			step = m * pow
			decimals = int(-exp)
			if m == 2.5 {
				decimals++
			}
			if m == 10 {
				decimals--
			}
			return step, max(decimals, 0)
		}
	}
	return 10 * pow, max(int(-exp)-1, 0)
}

// roundTicker places labelled ticks at multiples of a round step (1, 2, 2.5
// or 5 times a power of ten), about Target of them over the axis, with an
// unlabelled minor tick halfway between. Format, if set, labels a value
// given the step and the largest absolute value labelled on the axis;
// otherwise values are printed with as many decimals as the step needs.
type roundTicker struct {
	// Step, if positive, is the step to use; otherwise one is chosen.
	Step   float64
	Target int
	Format func(v, step, top float64) string
}

var _ plot.Ticker = roundTicker{}

// Ticks implements plot.Ticker.
func (t roundTicker) Ticks(lo, hi float64) []plot.Tick {
	target := t.Target
	if target <= 0 {
		target = 5
	}
	if !(hi > lo) || math.IsInf(lo, 0) || math.IsInf(hi, 0) {
		return nil
	}
	step, _ := niceStep((hi - lo) / float64(target))
	if t.Step > 0 {
		step, _ = niceStep(t.Step)
	}
	format := t.Format
	if format == nil {
		format = formatFixed
	}
	eps := step * 1e-9
	first := math.Ceil((lo-eps)/step) * step
	var values []float64
	for i := 0; i <= 1000; i++ {
		v := first + float64(i)*step
		if v > hi+eps {
			break
		}
		if math.Abs(v) < eps {
			v = 0
		}
		values = append(values, v)
	}
	top := 0.0
	for _, v := range values {
		top = math.Max(top, math.Abs(v))
	}
	var ticks []plot.Tick
	for _, v := range values {
		ticks = append(ticks, plot.Tick{Value: v, Label: format(v, step, top)})
		if mid := v + step/2; mid < hi-eps {
			ticks = append(ticks, plot.Tick{Value: mid})
		}
	}
	if mid := first - step/2; mid > lo+eps {
		ticks = append(ticks, plot.Tick{Value: mid})
	}
	return ticks
}

// formatFixed prints v with the decimals that multiples of step need.
func formatFixed(v, step, _ float64) string {
	_, dec := niceStep(step)
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// formatCount prints a count or event index compactly, with one suffix for
// the whole axis: 0, 500, 1000 when the largest label is under 10,000; 0,
// 5k, 10k, 15k up to millions; 0, 0.5M, 1M, 1.5M beyond (G beyond
// billions), with the decimals that the step needs.
func formatCount(v, step, top float64) string {
	scale, suffix := 1.0, ""
	switch {
	case top >= 1e9 && step >= 1e8:
		scale, suffix = 1e9, "G"
	case top >= 1e6 && step >= 1e5:
		scale, suffix = 1e6, "M"
	case top >= 1e4 && step >= 1e2:
		scale, suffix = 1e3, "k"
	}
	if v == 0 {
		return "0"
	}
	_, dec := niceStep(step / scale)
	return strconv.FormatFloat(v/scale, 'f', dec, 64) + suffix
}

// formatExact prints a count with its value to three significant digits
// and a k/M/G suffix from 10,000 up, trailing zeros dropped: 125, 9876,
// 12.3k, 4.56M, 1M.
func formatExact(v float64) string {
	av := math.Abs(v)
	scale, suffix := 1.0, ""
	switch {
	case av >= 1e9:
		scale, suffix = 1e9, "G"
	case av >= 1e6:
		scale, suffix = 1e6, "M"
	case av >= 1e4:
		scale, suffix = 1e3, "k"
	}
	if scale == 1 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	s := v / scale
	dec := 2
	switch {
	case math.Abs(s) >= 100:
		dec = 0
	case math.Abs(s) >= 10:
		dec = 1
	}
	t := strconv.FormatFloat(s, 'f', dec, 64)
	if strings.Contains(t, ".") {
		t = strings.TrimRight(strings.TrimRight(t, "0"), ".")
	}
	return t + suffix
}

// log10Ticker labels an axis whose values are base-10 logarithms (a log
// scale drawn on a linear axis): labelled ticks at the whole exponents,
// printed as the powers of ten they stand for (0.1, 1, 10, 100, 1k, 10k,
// ..., 1M), and unlabelled minor ticks at 2..9 times each power.
type log10Ticker struct{}

var _ plot.Ticker = log10Ticker{}

// Ticks implements plot.Ticker.
func (log10Ticker) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) || math.IsInf(lo, 0) || math.IsInf(hi, 0) || hi-lo > 400 {
		return nil
	}
	const eps = 1e-9
	var ticks []plot.Tick
	for e := math.Floor(lo); e <= hi+eps; e++ {
		for m := 1.0; m < 10; m++ {
			v := e + math.Log10(m)
			if v < lo-eps || v > hi+eps {
				continue
			}
			tk := plot.Tick{Value: v}
			if m == 1 {
				tk.Label = formatPow10(int(e))
			}
			ticks = append(ticks, tk)
		}
	}
	return ticks
}

// formatPow10 prints 10^e: 0.01, 0.1, 1, 10, 100, 1k, 10k, 100k, 1M, ...,
// 1e+12 beyond the G range.
func formatPow10(e int) string {
	switch {
	case e < 0 || e > 11:
		return strconv.FormatFloat(math.Pow10(e), 'g', -1, 64)
	case e >= 9:
		return strconv.Itoa(int(math.Pow10(e-9))) + "G"
	case e >= 6:
		return strconv.Itoa(int(math.Pow10(e-6))) + "M"
	case e >= 3:
		return strconv.Itoa(int(math.Pow10(e-3))) + "k"
	default:
		return strconv.Itoa(int(math.Pow10(e)))
	}
}

// MiBText formats bytes as MiB with one decimal ("1536.0"), as the tables
// of the report and of replay show them.
func MiBText(b uint64) string { return results.MiBText(b) }
