package sim

// SitesAtPeak is where the memory a policy reserved at its peak came
// from, by allocation site (package sim/sites computes it): the live
// allocations at the end of event Event, the one at whose end the
// reserved bytes first reached their peak, grouped by the site of their
// malloc, with the reserved bytes they do not use shared out among the
// sites of each segment. The rows' LiveBytes and UnusedBytes sum to
// Reserved.
type SitesAtPeak struct {
	// Event is the peak's event index, Time its time in nanoseconds.
	Event int64 `json:"event"`
	Time  int64 `json:"time_ns"`
	// Reserved is the reserved bytes at the peak (Result.PeakReserved).
	Reserved uint64 `json:"reserved_bytes"`
	// Depth is the number of frames of a site (--site-depth).
	Depth int `json:"depth"`
	// Sites are the rows, most bytes (live and unused) first; past the
	// top asked for, the rest are one row "(N other sites)".
	Sites []SiteBytes `json:"sites"`
}

// SiteBytes is one allocation site's memory at the peak.
type SiteBytes struct {
	// Site names the code: "FILE:LINE:FUNCTION" of the malloc's
	// innermost frame of user code (callers after " < " for a depth
	// above 1), a `record run` malloc's call site, or a row in
	// parentheses ("(no stack)", "(cached: no live block)").
	Site string `json:"site"`
	// LiveBytes are the requested bytes of the site's live allocations,
	// Count their number.
	LiveBytes uint64 `json:"live_bytes"`
	Count     int64  `json:"count"`
	// UnusedBytes are the site's share of the reserved bytes that no live
	// allocation requested (rounding, free and pending-free blocks) in
	// the segments that hold its allocations, in proportion to its live
	// bytes in each.
	UnusedBytes uint64 `json:"unused_bytes"`
}
