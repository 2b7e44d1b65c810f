//go:build !unix

package planpolicy

import "os/exec"

// ownGroup does nothing where there are no process groups: cancellation
// kills the shell only.
func ownGroup(cmd *exec.Cmd) {}
