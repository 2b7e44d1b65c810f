package replaycli

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

func TestSweepErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "o")
	bad := filepath.Join(dir, "bad.trace")
	os.WriteFile(bad, []byte("malloc id=1 size=oops\n"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no out", []string{"sweep", "--traces", tokenLengths}, "no output directory"},
		{"no traces", []string{"sweep", "-o", out}, "no trace given"},
		{"no match", []string{"sweep", "-o", out, "--traces", filepath.Join(dir, "*.nothing")}, "no file matches"},
		{"bad shard", []string{"sweep", "-o", out, "--traces", tokenLengths, "--shard", "3/3"}, "want i/n with 0 <= i < n"},
		{"bad grid", []string{"sweep", "-o", out, "--traces", tokenLengths, "--grid", "first-fit.segment_size"}, "want NAME.key=v1,v2"},
		{"grid policy left out", []string{"sweep", "-o", out, "--traces", tokenLengths, "--policy", "cuda", "--grid", "first-fit.release=true"}, `--grid first-fit.release: policy "first-fit" is not among the policies (cuda)`},
		{"grid and set", []string{"sweep", "-o", out, "--traces", tokenLengths, "--policy", "first-fit", "--set", "first-fit.release=true", "--grid", "first-fit.release=true,false"}, "also a fixed setting"},
		{"bad setting", []string{"sweep", "-o", out, "--traces", tokenLengths, "--policy", "first-fit", "--grid", "first-fit.release=maybe"}, "policy first-fit with settings \"release=maybe\""},
		{"bad capacity", []string{"sweep", "-o", out, "--traces", tokenLengths, "--capacity", "0,lots"}, `--capacity "lots"`},
		{"bad progress", []string{"sweep", "-o", out, "--traces", tokenLengths, "--progress", "fancy"}, `--progress "fancy"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runCmd(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	// A trace that cannot be read fails its cells, not the others.
	stdout, stderr, err := runCmd(t, "sweep", "-o", out, "--traces", tokenLengths, "--traces", bad, "--policy", "cuda", "--progress", "none")
	if err == nil || !strings.Contains(err.Error(), "1 of 2 cells failed") || !strings.Contains(stdout, "1 run, 0 already done, 1 failed") {
		t.Errorf("bad trace: %v\n%s%s", err, stdout, stderr)
	}
	if rs := readResults(t, filepath.Join(out, "results.json")); len(rs) != 1 {
		t.Errorf("%d results, want the good cell's", len(rs))
	}
}

// TestSweepCost checks the simulated allocator time and latency summary of
// a sweep's cells against those of replay gpu --sim-only --pace, which
// charges its own replays to the same cost model, wake-ups included (the
// trace's idle times kept, as in the sweep).
func TestSweepCost(t *testing.T) {
	dir := t.TempDir()
	out, gpuJSON := filepath.Join(dir, "sweep"), filepath.Join(dir, "gpu.json")
	if _, _, err := runCmd(t, "sweep", "--traces", tokenLengths, "--policy", "cuda,best-fit", "--progress", "none", "-o", out); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, "gpu", "--sim-only", "--pace", "--policy", "cuda,best-fit", "--json", gpuJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	got, want := readResults(t, filepath.Join(out, "results.json")), readResults(t, gpuJSON)
	if len(got) != 2 || len(want) != 2 {
		t.Fatalf("%d and %d results", len(got), len(want))
	}
	for i := range got {
		if got[i].SimAllocTimeNS == 0 || got[i].SimAllocTimeNS != want[i].SimAllocTimeNS || !reflect.DeepEqual(got[i].Latency, want[i].Latency) {
			t.Errorf("%s: %d ns, %d latency rows; replay gpu --sim-only: %d ns, %d rows",
				got[i].Policy, got[i].SimAllocTimeNS, len(got[i].Latency), want[i].SimAllocTimeNS, len(want[i].Latency))
		}
	}
	// Unpaced, the calls come back to back: no wake-ups, the rest the same.
	if _, _, err := runCmd(t, "gpu", "--sim-only", "--policy", "cuda,best-fit", "--json", gpuJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	for i, r := range readResults(t, gpuJSON) {
		if got[i].SimWakeTimeNS == 0 || r.SimWakeTimeNS != 0 || r.SimAllocTimeNS != got[i].SimAllocTimeNS-got[i].SimWakeTimeNS {
			t.Errorf("%s: unpaced %d ns with %d of wake-ups; paced %d with %d", r.Policy, r.SimAllocTimeNS, r.SimWakeTimeNS, got[i].SimAllocTimeNS, got[i].SimWakeTimeNS)
		}
	}
}

// TestSweepWarnings: a sweep says on stderr, per trace, how many cells
// have each warning (here the recording's failed malloc, served in the
// two cells without a capacity, and pytorch's parting from the recording
// in the cell of 8 GiB, more than the job had, where it serves that
// malloc too), as replay sim does.
func TestSweepWarnings(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sweep")
	_, stderr, err := runCmd(t, "sweep", "--traces", splitFragOOM, "--policy", "cuda,pytorch", "--capacity", "0,8GiB", "--progress", "none", "-o", out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{splitFragOOM + ": warning (2 cells): the recording has 1 failed malloc(s)",
		splitFragOOM + ": warning (1 cells): the simulation of pytorch parts from the recording at event 105: real allocator: no device call; simulation: segment_alloc of 1572864000 bytes"}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) != len(want) || !strings.HasPrefix(lines[0], want[0]) || !strings.HasPrefix(lines[1], want[1]) {
		t.Errorf("stderr:\n%s\nwant lines starting %q", stderr, want)
	}
}

// TestSweepSchedulerShards: in a Slurm array task the sweep takes its
// shard from the environment (with no --shard, or --shard auto) and writes
// DIR/shard-i-of-n; a Kubernetes Indexed Job's pod with --shard auto/N;
// the merge of the tasks' directories equals the unsharded sweep, and a
// shard given twice is refused, naming both.
func TestSweepSchedulerShards(t *testing.T) {
	dir := t.TempDir()
	// offline among them: each result's offline_peak_reserved_bytes is the
	// offline cell's of its trace and capacity, however the cells are
	// grouped into jobs and shards (before, it came from the offline cell
	// of the same job, if any).
	base := []string{"sweep", "--traces", tokenLengths, "--traces", growingBatch, "--policy", "cuda,best-fit,offline", "--progress", "none"}
	whole := filepath.Join(dir, "whole")
	if _, _, err := runCmd(t, append(base, "-o", whole)...); err != nil {
		t.Fatal(err)
	}
	for _, r := range readResults(t, filepath.Join(whole, "results.json")) {
		if r.PeakOffline == 0 {
			t.Errorf("%s x %s: no offline peak", r.Trace, r.Policy)
		}
	}
	out := filepath.Join(dir, "array")
	t.Setenv("SLURM_ARRAY_TASK_MIN", "0")
	t.Setenv("SLURM_ARRAY_TASK_MAX", "1")
	t.Setenv("SLURM_ARRAY_TASK_ID", "0")
	if _, stderr, err := runCmd(t, append(base, "-o", out)...); err != nil || !strings.Contains(stderr, "sweep: shard 0/2 from the scheduler, into "+filepath.Join(out, "shard-0-of-2")) {
		t.Fatalf("task 0: %v\n%s", err, stderr)
	}
	t.Setenv("SLURM_ARRAY_TASK_ID", "1")
	if _, _, err := runCmd(t, append(base, "--shard", "auto", "-o", out)...); err != nil {
		t.Fatal(err)
	}
	// Run again alone (sbatch --array=1), as after a preemption: the
	// array's size from the shard directories, nothing to do.
	t.Setenv("SLURM_ARRAY_TASK_MIN", "1")
	stdout, _, err := runCmd(t, append(base, "--shard", "auto", "-o", out)...)
	if err != nil || !strings.Contains(stdout, "shard 1/2: 3 of 6 cells") || !strings.Contains(stdout, "0 run, 3 already done") {
		t.Errorf("task 1 again: %v\n%s", err, stdout)
	}
	for _, k := range []string{"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX"} {
		t.Setenv(k, "")
	}
	merged := filepath.Join(dir, "merged")
	if _, _, err := runCmd(t, "merge", "-o", merged, filepath.Join(out, "shard-0-of-2"), filepath.Join(out, "shard-1-of-2")); err != nil {
		t.Fatal(err)
	}
	if got, want := readResults(t, filepath.Join(merged, "results.json")), readResults(t, filepath.Join(whole, "results.json")); !reflect.DeepEqual(got, want) {
		t.Errorf("merged tasks differ from the unsharded sweep")
	}
	// A shard given twice: the same shard in a second directory.
	twice := filepath.Join(dir, "twice")
	t.Setenv("JOB_COMPLETION_INDEX", "1")
	if _, _, err := runCmd(t, append(base, "--shard", "auto/2", "-o", twice)...); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCmd(t, "merge", "-o", filepath.Join(dir, "m2"), filepath.Join(out, "shard-0-of-2"), filepath.Join(out, "shard-1-of-2"), filepath.Join(twice, "shard-1-of-2"))
	if err == nil || !strings.Contains(err.Error(), "a shard given twice") || !strings.Contains(err.Error(), filepath.Join(out, "shard-1-of-2")) {
		t.Errorf("a shard twice: %v", err)
	}
	if _, _, err := runCmd(t, append(base, "--shard", "auto", "-o", filepath.Join(dir, "fresh"))...); err == nil || !strings.Contains(err.Error(), "give the Indexed Job's completions as --shard auto/N") {
		t.Errorf("an Indexed Job without its count: %v", err)
	}
}

// TestSweepParquet: --parquet writes results.parquet beside the CSV and
// JSON, a row per cell with the JSON's figures, typed; merge --parquet of
// the sweep writes the same rows.
func TestSweepParquet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sw")
	churn := "../../../testdata/pytorch/churn.pickle.gz"
	if _, _, err := runCmd(t, "sweep", "--traces", churn, "--policy", "pytorch,cuda", "--grid", "pytorch.expandable_segments=True,False", "--parquet", "-j", "1", "-o", dir); err != nil {
		t.Fatal(err)
	}
	want := readResults(t, filepath.Join(dir, "results.json"))
	for _, path := range []string{filepath.Join(dir, "results.parquet"), "merged"} {
		if path == "merged" {
			out := filepath.Join(t.TempDir(), "m")
			if _, _, err := runCmd(t, "merge", "--parquet", "-o", out, dir); err != nil {
				t.Fatal(err)
			}
			path = filepath.Join(out, "results.parquet")
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r := parquet.NewReader(f)
		if int(r.NumRows()) != len(want) || len(want) != 3 {
			t.Fatalf("%s: %d rows, want %d (3 cells)", path, r.NumRows(), len(want))
		}
		col := map[string]int{}
		for i, p := range r.Schema().Columns() {
			col[p[0]] = i
		}
		rows := make([]parquet.Row, len(want))
		if n, err := r.ReadRows(rows); n != len(want) && err != nil {
			t.Fatalf("%s: %d rows read: %v", path, n, err)
		}
		for k, w := range want {
			row := rows[k]
			if got := row[col["policy"]].String(); got != w.Policy {
				t.Errorf("%s row %d: policy %q, want %q", path, k, got, w.Policy)
			}
			if got := uint64(row[col["peak_reserved_bytes"]].Int64()); got != w.PeakReserved {
				t.Errorf("%s row %d: peak_reserved_bytes %d, want %d", path, k, got, w.PeakReserved)
			}
			if got := row[col["device_allocs"]].Int64(); got != w.DeviceAllocs {
				t.Errorf("%s row %d: device_allocs %d, want %d", path, k, got, w.DeviceAllocs)
			}
		}
	}
}
