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
