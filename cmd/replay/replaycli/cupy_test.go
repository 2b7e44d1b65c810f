package replaycli

import (
	"path/filepath"
	"strings"
	"testing"
)

// The CuPy recordings of testdata/cupy through the commands: stats says
// what the log lacks, sim names the remedy for failed mallocs without a
// capacity (the pool's limit), fidelity finds NAME.stats.json beside NAME.jsonl and
// holds linalg to it; churn, whose side stream the log does not show,
// parts from its recording (sim's TestCuPyRecordings replays it with its
// streams).
func TestCuPyCommands(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "testdata", "cupy")
	out, _, err := runCmd(t, "stats", filepath.Join(dir, "linalg.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"linalg.jsonl: cupy trace, 897 events\n",
		"not in the recording: streams (every event is on stream 0), times (every event is at time 0, and no lifetime is known), device frees (no segment_free)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stats: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "lifetimes") {
		t.Errorf("stats shows lifetimes:\n%s", out)
	}
	_, errOut, err := runCmd(t, "sim", "--policy", "cupy", filepath.Join(dir, "churn_limit.jsonl"))
	if err != nil || !strings.Contains(errOut, "the recording has 5 failed malloc(s)") || !strings.Contains(errOut, "get_limit()") {
		t.Errorf("sim of churn_limit without --capacity: %v\n%s", err, errOut)
	}
	out, _, err = runCmd(t, "fidelity", "--policy", "cupy", filepath.Join(dir, "linalg.jsonl"), filepath.Join(dir, "churn.jsonl"))
	want := "linalg.jsonl: identical (15 device calls, 442 mallocs; peaks and counters as measured in linalg.stats.json; policy cupy, settings default)\n" +
		"churn.jsonl: warning: 184 calls the recording does not show were inferred from it; first: event 36 (malloc of 353506 bytes): the log shows a device allocation where the pool held a free chunk that fits: the malloc came from another stream's arena, or the chunk was given back by a free_all_blocks(); the log records neither\n" +
		"churn.jsonl: identical (58 device calls, 600 mallocs; peaks and counters as measured in churn.stats.json; policy cupy, settings default)\n"
	if out != want || err != nil {
		t.Errorf("fidelity: %v\n%s", err, out)
	}
}
