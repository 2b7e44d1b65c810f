package sim

import (
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
	"runtime"
)

// NewReplayOn returns a replay configured by cfg whose policy is p, for the
// benchmarks of package sim_test.
func NewReplayOn(cfg Config, p policies.Policy) (*Replay, error) {
	r, err := NewReplay(cfg)
	if err != nil {
		return nil, err
	}
	r.policy = p
	return r, nil
}

// StepPtr replays event i, passed by pointer as Run passes it.
func (r *Replay) StepPtr(i int64, ev *trace.Event) error { return r.step(i, ev) }

// ResolveAll makes Run resolve the live allocations of every trace in
// memory ahead of its replays (live.go), in batches of batch events, on
// two cores at least, and returns the function that restores the
// defaults.
func ResolveAll(batch int64) (restore func()) {
	ahead, b := resolveAhead, resolveBatch
	procs := runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	resolveAhead, resolveBatch = 1, batch
	return func() {
		resolveAhead, resolveBatch = ahead, b
		runtime.GOMAXPROCS(procs)
	}
}

// SeriesPoints makes series hold at most n points (at least 2), so that a
// short trace's points cover several events each, and returns the
// function that restores MaxSeriesPoints.
func SeriesPoints(n int) (restore func()) {
	seriesPoints = max(n, 2)
	return func() { seriesPoints = MaxSeriesPoints }
}
