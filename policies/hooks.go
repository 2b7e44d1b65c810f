package policies

// This file declares optional abilities that a replay engine finds by type
// assertion, beside Syncer, Releaser, FreeSpacer and Counter in policy.go:
// a summary of the trace given before the first event (Hinter) and the
// trace's markers (Marker). A policy that lacks them runs unchanged on an
// engine that does not call them.

// Hinter is implemented by policies that size themselves from a figure of
// the whole trace known before its first event (the workspace policy sizes
// its region from it). An engine that can read the trace twice computes
// the figure in a first pass (trace.Stats: PeakLive) and calls Hint once,
// after building the policy and before the first Malloc; an engine that
// streams the trace once does not call it, and the policy falls back on its
// own rule.
type Hinter interface {
	// Hint gives the trace's peak of live requested bytes of device memory
	// (kinds device and async), the lower bound of any policy's peak
	// reserved bytes.
	Hint(peakRequested uint64)
}

// Marker is implemented by policies that act on the trace's markers
// (trace.OpMarker: an iteration boundary, a phase name). The engine calls
// Mark with the marker's label, in trace order with the other events.
type Marker interface {
	// Mark is a marker with text label. It returns an error only for a
	// failure of the device (a segment the policy gives back is refused).
	Mark(label string) error
}

// Inferrer is implemented by policies that, following a recording of
// their allocator (Follower), infer calls of the program that the
// recording does not show (CuPy's free_all_blocks(), which DebugPrintHook
// does not log). The engine asks after each malloc and names the event in
// the replay's warnings.
type Inferrer interface {
	// Inferred returns the number of calls inferred so far and a line
	// saying what the last one was and from what.
	Inferred() (n int64, last string)
}

// Releasable is implemented by policies that follow recordings which do
// not show the releases of their allocator (CuPy's log: no
// free_all_blocks(), no device frees): where the recording cannot tell
// whether a release was made, the engine asks what one would give back,
// to bound the figures it reports.
type Releasable interface {
	// Releasable appends to dst the device segments that a release of
	// every cached free segment would give back now, and returns it.
	Releasable(dst []Block) []Block
}
