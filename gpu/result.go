package gpu

import "github.com/gpualloc/allocsim/sim/results"

// The results of a replay on the GPU are plain data in package results, so
// that reports read them without cgo; these are their names here.
type (
	// Result is the outcome of replaying one trace on the GPU (see
	// results.GPU).
	Result = results.GPU
	// DriverView is what the driver says about memory, in bytes.
	DriverView = results.DriverView
	// Run is one run of a repeated replay, in nanoseconds.
	Run = results.Run
	// CLoop compares the harness with a plain C loop of the same calls.
	CLoop = results.CLoop
)
