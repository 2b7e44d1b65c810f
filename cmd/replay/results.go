package main

import (
	"strconv"

	"github.com/gpualloc/allocsim/sim"
)

// resultKey identifies a cell of a sweep, and a result: the trace as given,
// the policy, its settings and the capacity.
func resultKey(r *sim.Result) string {
	return cellKey(r.Trace, r.Policy, r.Settings, r.Capacity)
}

func cellKey(trace, policy string, settings map[string]string, capacity uint64) string {
	return trace + "\x00" + policy + "\x00" + formatSettings(settings) + "\x00" + strconv.FormatUint(capacity, 10)
}
