package sim

import (
	"strconv"

	"github.com/gpualloc/allocsim/trace"
)

// A trace whose history was cut (a PyTorch snapshot keeps only its last
// max_entries entries) starts with events that rebuild the allocator's
// state before its first recorded event; the header's metadata
// "reconstructed_events" says how many (trace/pytorch/reconstruct.go).
// The replay runs them like any others, and then counts its peaks and
// starts its series from the state they built: during the rebuild the
// requested and allocated bytes pass through values that the source never
// had (free ranges held while the blocks around them are placed).

// ReconstructedEvents returns how many events at the start of a trace with
// header h rebuild the state before its history began, 0 for a trace that
// is complete.
func ReconstructedEvents(h trace.Header) int64 {
	n, err := strconv.ParseInt(h.Metadata["reconstructed_events"], 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Reconstructed tells r that the first n events of its trace rebuild the
// state before the trace's history began: the result says the trace was
// truncated, and its peaks count from the state after event n-1. Run calls
// it from the trace's header; a caller of Step calls it before the first.
func (r *Replay) Reconstructed(n int64) {
	if n <= 0 {
		return
	}
	r.history = n
	r.res.Truncated = true
	r.res.ReconstructedEvents = n
}

// historyBegins restarts the peaks and the series from the current state,
// after the last reconstructed event.
func (r *Replay) historyBegins() {
	r.series = SeriesBuilder{}
	reserved := r.back.Reserved()
	r.res.PeakRequested = r.requested.sat()
	r.res.PeakAllocated = r.allocated
	r.res.PeakReserved = reserved
	r.res.PeakReservedEvent = r.history - 1
	if r.dev != nil {
		r.res.PeakFootprint = r.dev.Footprint()
	}
	r.series.allocAtPeak = r.allocated // the idle share at the peak (Finish)
}
