package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// CheckedWriter passes writes on to W and keeps the first error in Err:
// what a command writes to stdout is its output, and a write that fails
// (a full disk, a closed pipe) fails the command, whatever the command
// did with the error.
type CheckedWriter struct {
	W   io.Writer
	Err error
}

func (c *CheckedWriter) Write(p []byte) (int, error) {
	if c.Err != nil {
		return 0, c.Err
	}
	n, err := c.W.Write(p)
	if err != nil {
		c.Err = err
	}
	return n, err
}

// StdoutError returns err, or where it is nil and a write to c failed,
// that failure as "writing standard output: ...".
func (c *CheckedWriter) StdoutError(err error) error {
	if err == nil && c.Err != nil {
		return fmt.Errorf("writing standard output: %w", c.Err)
	}
	return err
}

// Exit prints err on stderr as "name: err", terminal escapes shown
// (Safe), and exits with the status err says (an ExitCode method: 2 for
// a UsageError, a recorded program's own), else 1.
func Exit(name string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", name, Safe(err.Error()))
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		os.Exit(ec.ExitCode())
	}
	os.Exit(1)
}
