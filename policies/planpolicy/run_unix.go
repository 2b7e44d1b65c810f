//go:build unix

package planpolicy

import (
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own and has its
// cancellation kill the whole group, so that a planner the shell started
// dies with the shell.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
