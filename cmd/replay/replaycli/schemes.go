package replaycli

// The schemes of policies named SCHEME:ARG, registered by their packages'
// init functions, so that every program built on replaycli has them:
// exec:COMMAND, a child process speaking a line protocol
// (docs/exec-protocol.md), plan:COMMAND, an offline planner's offsets by
// file (docs/plan-policy.md), and so:LIB.so, a CUDAPluggableAllocator
// library run against the simulated device (docs/so-policy.md).
import (
	_ "github.com/gpualloc/allocsim/policies/execpolicy"
	_ "github.com/gpualloc/allocsim/policies/planpolicy"
	_ "github.com/gpualloc/allocsim/policies/sopolicy"
)
