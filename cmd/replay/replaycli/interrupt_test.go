package replaycli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/policies"
)

// TestMain runs Main in a child of the test binary when asked, so that a
// test can signal a whole command.
func TestMain(m *testing.M) {
	if os.Getenv("ALLOCSIM_REPLAY_MAIN") == "1" {
		os.Args = append([]string{"replay"}, os.Args[1:]...)
		Main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// An interrupted replay gpu exits as the shell reports a command the
// signal killed: 130 for SIGINT, 143 for SIGTERM (it exited 1), after
// freeing what it allocated, and says what it left.
func TestGPUInterruptExitStatus(t *testing.T) {
	lib := fakeCUDA(t, "FAKECUDA_TOTAL=4294967296", "FAKECUDA_LATENCY_NS=600000")
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "gpu", "--cudart", lib, "--policy", "cuda", "--no-sim", trainGPT)
			cmd.Env = append(os.Environ(), "ALLOCSIM_REPLAY_MAIN=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			cmd.Process.Signal(tc.sig)
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit %v, want status %d; stderr:\n%s", err, tc.code, stderr.String())
			}
			// It says what it left: nothing (no run finished, no --calls).
			if s := stderr.String(); !strings.Contains(s, "interrupted: everything allocated was freed") || !strings.Contains(s, "; no output written\n") {
				t.Errorf("stderr:\n%s", s)
			}
		})
	}
}

// An interrupted sweep says how many cells it kept and how to resume (it
// said "no output written" while it had kept them). The child waits for
// its first cell files before it is signalled.
func TestSweepInterruptSaysWhatItKept(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command(os.Args[0], "sweep", "--traces", trainGPT, "--policy", "all", "--capacity", "0,8GiB,9GiB,10GiB,11GiB,12GiB", "-j", "1", "--progress", "none", "-o", out)
	cmd.Env = append(os.Environ(), "ALLOCSIM_REPLAY_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for range 600 {
		if cells, _ := os.ReadDir(out + "/cells"); len(cells) >= 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("exit %v, want 130; stderr:\n%s", err, stderr.String())
	}
	all, _ := policies.ParseList("all", policies.Names()) // without optimal
	if s := stderr.String(); !strings.Contains(s, "interrupted (interrupt): ") || !strings.Contains(s, fmt.Sprintf(" of the %d cells kept in ", 6*len(all))) || !strings.Contains(s, "run the same sweep again to resume") {
		t.Errorf("stderr:\n%s", s)
	}
}

// An interrupted replay sim --plots --viz of two traces, signalled while
// the second is replayed, leaves no new file and says so: the first
// trace's snapshots were put in place as it finished (19 pickles left,
// while the message said "no output written").
func TestSimInterruptLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	vizDir, plotDir := filepath.Join(dir, "viz"), filepath.Join(dir, "plots")
	const mlp = "../../../testdata/pytorch/mlp.pickle.gz"
	cmd := exec.Command(os.Args[0], "sim", "--plots", plotDir, "--viz", vizDir, mlp, trainGPT)
	cmd.Env = append(os.Environ(), "ALLOCSIM_REPLAY_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The second trace's snapshots are being written: the first's are done.
	for range 1200 {
		if m, _ := filepath.Glob(filepath.Join(vizDir, ".train_gpt.*")); len(m) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("exit %v, want 130; stderr:\n%s", err, stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "interrupted (interrupt): no output written") {
		t.Errorf("stderr:\n%s", s)
	}
	for _, d := range []string{vizDir, plotDir} {
		if left, _ := os.ReadDir(d); len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("%s holds %d files after the interrupt: %q", filepath.Base(d), len(names), names)
		}
	}
}

// An interrupted replay ends its exec policy's child, which runs in a
// process group of its own that the terminal's Ctrl-C does not reach: it
// was left running, an orphan. The child writes its pid and hangs before
// its handshake.
func TestExecInterruptEndsTheChild(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(os.Args[0], "sim", "--policy", "exec:sh -c 'echo $$ > "+pidFile+"; exec sleep 1000'", trainGPT)
	cmd.Env = append(os.Environ(), "ALLOCSIM_REPLAY_MAIN=1", "ALLOCSIM_EXEC_TIMEOUT=60s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	for range 600 {
		if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			fmt.Sscan(string(b), &pid)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		cmd.Process.Kill()
		t.Fatalf("the child wrote no pid; stderr:\n%s", stderr.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("exit %v, want 130; stderr:\n%s", err, stderr.String())
	}
	for range 200 {
		if syscall.Kill(pid, 0) != nil {
			return // gone
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("the exec child %d still runs after the interrupt", pid)
}
