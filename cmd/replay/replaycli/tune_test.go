package replaycli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
)

// TestTune: tune recommends a setting string for a snapshot, and its
// predicted peak reserved is what replay sim gives the same string; with
// --json every candidate is written.
func TestTune(t *testing.T) {
	churn := "../../../testdata/pytorch/churn.pickle.gz"
	js := filepath.Join(t.TempDir(), "tune.json")
	stdout, _, err := runCmd(t, "tune", "--top", "3", "--json", js, churn)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`180 settings tried; recommended: PYTORCH_CUDA_ALLOC_CONF="([^"]*)": predicted peak reserved (\d+) bytes`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no recommendation:\n%s", stdout)
	}
	// --json: kind tune, the recorded setting's replay (rank 0), then the
	// 180 candidates by rank, the first the recommendation.
	rd, err := results.Open(js)
	if err != nil {
		t.Fatal(err)
	}
	var ts []*results.Tune
	for rd.Scan() {
		ts = append(ts, rd.Record().Tune)
	}
	rd.Close()
	if err := rd.Err(); err != nil || rd.Kind() != results.KindTune || len(ts) != 181 {
		t.Fatalf("--json: kind %v, %d records, %v; want kind tune, 181", rd.Kind(), len(ts), err)
	}
	if !ts[0].Recorded || ts[0].Rank != 0 || ts[0].PeakReserved != 1818230784 || ts[1].Rank != 1 || !ts[1].Recommended || ts[1].Conf != m[1] || !ts[1].Front ||
		ts[180].Rank != 180 || ts[2].Recommended {
		for _, k := range []int{0, 1, 2, 180} {
			tc := ts[k]
			t.Errorf("--json record %d: conf %q rank %d front %v recommended %v recorded %v, %d bytes", k, tc.Conf, tc.Rank, tc.Front, tc.Recommended, tc.Recorded, tc.PeakReserved)
		}
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
	churn := "../../../testdata/pytorch/churn.pickle.gz"
	for _, args := range [][]string{
		{"tune", "--top", "-1", churn}, {"tune", "-j", "0", churn},
		// A value the allocator refuses, with or without --replay-all.
		{"tune", "--grid", "max_split_size_mb=,19", churn},
		{"tune", "--replay-all", "--grid", "garbage_collection_threshold=0.5,1.5", churn},
		{"tune", "--replay-all", "--from-results", churn},
	} {
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

// TestTuneShards: three shards of a 12-string grid, ranked together with
// --from-results, print what one unsharded run prints; a missing shard or
// one given twice is refused, naming the setting; a Slurm array task's
// shard (--shard auto) writes the same file as --shard 1/3.
func TestTuneShards(t *testing.T) {
	churn := "../../../testdata/pytorch/churn.pickle.gz"
	dir := t.TempDir()
	grid := []string{"--grid", "max_split_size_mb=,64,256", "--grid", "roundup_power2_divisions=,4", "--grid", "garbage_collection_threshold="}
	wholeJSON := filepath.Join(dir, "whole.json")
	whole, _, err := runCmd(t, append(append([]string{"tune"}, grid...), "--json", wholeJSON, churn)...)
	if err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(dir, "tune.json")
	var files []string
	for i := range 3 {
		out, _, err := runCmd(t, append(append([]string{"tune"}, grid...), "--shard", strconv.Itoa(i)+"/3", "--json", js, churn)...)
		if err != nil || !strings.Contains(out, "4 of 12 settings tried") {
			t.Fatalf("shard %d: %v\n%s", i, err, out)
		}
		files = append(files, filepath.Join(dir, "tune.shard-"+strconv.Itoa(i)+"-of-3.json"))
	}
	if rs := readResults(t, files[1]); len(rs) != 5 { // 4 candidates and the recorded setting
		t.Errorf("shard 1: %d results, want 5", len(rs))
	}
	mergedJSON := filepath.Join(dir, "merged.json")
	merged, _, err := runCmd(t, append(append(append([]string{"tune"}, grid...), "--from-results", "--json", mergedJSON), files...)...)
	if err != nil {
		t.Fatal(err)
	}
	if merged != whole || !strings.Contains(merged, "12 settings tried; recommended") {
		t.Errorf("the shards ranked together:\n%s\nwant, as one run:\n%s", merged, whole)
	}
	a, errA := os.ReadFile(mergedJSON)
	w, errW := os.ReadFile(wholeJSON)
	if errA != nil || errW != nil || string(a) != string(w) {
		t.Errorf("--from-results --json differs from one run's --json (%v, %v)", errA, errW)
	}
	_, _, err = runCmd(t, append(append(append([]string{"tune"}, grid...), "--from-results"), files[0], files[1])...)
	if err == nil || !strings.Contains(err.Error(), `setting "roundup_power2_divisions:4" of the grid is in none of the results: a shard missing`) {
		t.Errorf("a missing shard: %v", err)
	}
	_, _, err = runCmd(t, append(append(append([]string{"tune"}, grid...), "--from-results"), files[0], files[1], files[2], files[1])...)
	if err == nil || !strings.Contains(err.Error(), "a shard given twice") {
		t.Errorf("a shard twice: %v", err)
	}
	t.Setenv("SLURM_ARRAY_TASK_ID", "1")
	t.Setenv("SLURM_ARRAY_TASK_MIN", "0")
	t.Setenv("SLURM_ARRAY_TASK_MAX", "2")
	auto := filepath.Join(dir, "auto.json")
	if _, _, err := runCmd(t, append(append([]string{"tune"}, grid...), "--json", auto, churn)...); err != nil {
		t.Fatal(err)
	}
	a, errA = os.ReadFile(filepath.Join(dir, "auto.shard-1-of-3.json"))
	b, errB := os.ReadFile(files[1])
	if errA != nil || errB != nil || string(a) != string(b) {
		t.Errorf("the Slurm array task's shard differs from --shard 1/3")
	}
}

// failWriter fails every write, as a full disk or a closed pipe does.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestTuneStdoutFullKeepsJSON: when the tables cannot be written to
// stdout, tune fails and leaves the --json file as it was (it replaced it
// with the new results and then failed).
func TestTuneStdoutFullKeepsJSON(t *testing.T) {
	js := filepath.Join(t.TempDir(), "tune.json")
	if err := os.WriteFile(js, []byte("good\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(failWriter{}, io.Discard, []string{"tune", "--grid", "max_split_size_mb=", "--grid", "roundup_power2_divisions=", "--grid", "garbage_collection_threshold=", "--json", js, "../../../testdata/pytorch/churn.pickle.gz"})
	if err == nil || !strings.Contains(err.Error(), "writing standard output") {
		t.Errorf("tune with stdout full: %v, want an error writing standard output", err)
	}
	if data, _ := os.ReadFile(js); string(data) != "good\n" {
		t.Errorf("--json file replaced: %.60q", data)
	}
}
