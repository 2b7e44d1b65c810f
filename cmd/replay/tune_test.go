package main

import (
	"errors"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestTune: tune recommends a setting string for a snapshot, and its
// predicted peak reserved is what replay sim gives the same string; with
// --json every candidate is written.
func TestTune(t *testing.T) {
	churn := "../../testdata/pytorch/churn.pickle.gz"
	js := filepath.Join(t.TempDir(), "tune.json")
	stdout, _, err := runCmd(t, "tune", "--top", "3", "--json", js, churn)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`180 settings tried; recommended: PYTORCH_CUDA_ALLOC_CONF="([^"]*)": predicted peak reserved (\d+) bytes`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no recommendation:\n%s", stdout)
	}
	if rs := readResults(t, js); len(rs) != 180 {
		t.Errorf("--json: %d results, want 180", len(rs))
	}
	sj := filepath.Join(t.TempDir(), "sim.json")
	if _, _, err := runCmd(t, "sim", "--policy", "pytorch", "--set", "pytorch.conf="+m[1], "--json", sj, churn); err != nil {
		t.Fatal(err)
	}
	want, _ := strconv.ParseUint(m[2], 10, 64)
	if got := readResults(t, sj)[0].PeakReserved; got != want {
		t.Errorf("replay sim with %q: %d bytes, tune predicted %d", m[1], got, want)
	}
	if !strings.Contains(stdout, "recorded") || strings.Count(stdout, "\n") != 6 {
		t.Errorf("table:\n%s", stdout)
	}
	for _, args := range [][]string{{"tune"}, {"tune", "--capacity", "1GiB", "--card", "80GB", churn}, {"tune", "--grid", "nokey", churn}} {
		if _, _, err := runCmd(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestTuneFlags: bad --top and -j are usage errors (--top -1 panicked),
// --json - gives JSON alone on stdout, and the recorded replay's warnings
// go to stderr (a recording with a failed malloc said nothing).
func TestTuneFlags(t *testing.T) {
	churn := "../../testdata/pytorch/churn.pickle.gz"
	for _, args := range [][]string{{"tune", "--top", "-1", churn}, {"tune", "-j", "0", churn}} {
		_, _, err := runCmd(t, args...)
		var ec interface{ ExitCode() int }
		if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 || strings.Contains(err.Error(), "internal error") {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	stdout, _, err := runCmd(t, "tune", "--top", "1", "--json", "-", churn)
	if err != nil || !strings.HasPrefix(stdout, "{") {
		t.Errorf("--json -: %v, stdout starts %.40q", err, stdout)
	}
	_, stderr, err := runCmd(t, "tune", "--top", "1", splitFragOOM)
	if err != nil || !strings.HasPrefix(stderr, splitFragOOM+": warning: the recording has 1 failed malloc(s)") {
		t.Errorf("warnings: %v\n%s", err, stderr)
	}
}
