package planpolicy

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// runPlanner runs command by /bin/sh with the paths in and out appended as
// two arguments (the shell runs `command "$@"` with $1 = in, $2 = out), in
// the current directory, its standard output discarded, and kills it (and
// the processes it started, where the system has process groups) after
// timeout. It returns an error, in one line, quoting the last lines of
// its standard error, when it cannot start, exits non-zero, is killed, or
// runs out of time.
func runPlanner(command, in, out string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command+` "$@"`, "plan", in, out)
	var stderr tail
	cmd.Stderr = &stderr
	ownGroup(cmd)
	// A child that keeps standard error open after the shell is killed
	// does not hold Wait past this.
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err := cmd.Run()
	if err == nil {
		return nil
	}
	var what string
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		what = fmt.Sprintf("killed after %v, its time limit (the timeout setting, or %s)", time.Since(start).Round(time.Millisecond), TimeoutEnv)
	case errors.As(err, &exit) && exit.Exited():
		what = fmt.Sprintf("exited with status %d", exit.ExitCode())
	case errors.As(err, &exit):
		what = fmt.Sprintf("ended by %v", exit)
	default:
		what = fmt.Sprintf("did not run: %v", err)
	}
	if s := stderr.lines(3); s != "" {
		return fmt.Errorf("planner %q %s; stderr: %s", command, what, s)
	}
	return fmt.Errorf("planner %q %s (nothing on stderr)", command, what)
}

// tail is an io.Writer that keeps the last tailBytes bytes written.
type tail struct{ b []byte }

const tailBytes = 4096

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > tailBytes {
		t.b = append(t.b[:0], t.b[len(t.b)-tailBytes:]...)
	}
	return len(p), nil
}

// lines returns the last n non-empty lines kept, joined by " | ", at most
// 400 bytes of them (the end kept), quoted.
func (t *tail) lines(n int) string {
	var keep []string
	all := strings.Split(strings.ReplaceAll(string(t.b), "\r", ""), "\n")
	for i := len(all) - 1; i >= 0 && len(keep) < n; i-- {
		if l := strings.TrimSpace(all[i]); l != "" {
			keep = append([]string{l}, keep...)
		}
	}
	s := strings.Join(keep, " | ")
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	if s == "" {
		return ""
	}
	return fmt.Sprintf("%q", s)
}
