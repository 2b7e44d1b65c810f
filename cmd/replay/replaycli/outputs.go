package replaycli

import (
	"errors"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/trace/atomicfile"
)

// checkOutputs is atomicfile.CheckOutputs, its *DuplicateError a usage
// error (exit 2).
func checkOutputs(inputs []string, flagPaths ...string) error {
	err := atomicfile.CheckOutputs(inputs, flagPaths...)
	if _, ok := errors.AsType[*atomicfile.DuplicateError](err); ok {
		return cli.UsageError{Err: err}
	}
	return err
}
