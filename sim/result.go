package sim

import "github.com/gpualloc/allocsim/sim/results"

// The results model lives in package sim/results, which imports neither
// the engine nor the policies, so that reading a results file or drawing a
// chart links neither; these are its names as the engine's API gives them.
type (
	// Result is results.Result: the outcome of one replay.
	Result = results.Result
	// Point is results.Point: one point of a Result's series.
	Point = results.Point
	// LatencyRow is results.LatencyRow: the latencies of one call and size class.
	LatencyRow = results.LatencyRow
	// SitesAtPeak is results.SitesAtPeak: a policy's peak by allocation site.
	SitesAtPeak = results.SitesAtPeak
	// SiteBytes is results.SiteBytes: one site's memory at the peak.
	SiteBytes = results.SiteBytes
	// Overflow is results.Overflow: mallocs failed where a sum would wrap.
	Overflow = results.Overflow
)

// MaxSeriesPoints bounds the length of Result.Series.
const MaxSeriesPoints = results.MaxSeriesPoints

// InferredWarning is results.InferredWarning.
func InferredWarning(r *Result) string { return results.InferredWarning(r) }

// CapacityWarning is results.CapacityWarning.
func CapacityWarning(r *Result) string { return results.CapacityWarning(r) }

// PartedWarning is results.PartedWarning.
func PartedWarning(r *Result) string { return results.PartedWarning(r) }
