package sim

import (
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
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
