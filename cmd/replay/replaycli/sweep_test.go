package replaycli

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/gpualloc/allocsim/sim"
)

// Small real traces for the sweep tests.
var (
	tokenLengths = "../../../testdata/pytorch/token_lengths.pickle.gz"
	growingBatch = "../../../testdata/pytorch/growing_batch.pickle.gz"
)

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func column(t *testing.T, rows [][]string, name string) []string {
	t.Helper()
	k := -1
	for i, h := range rows[0] {
		if h == name {
			k = i
		}
	}
	if k < 0 {
		t.Fatalf("no column %q in %v", name, rows[0])
	}
	var out []string
	for _, r := range rows[1:] {
		out = append(out, r[k])
	}
	return out
}

// TestSweep sweeps two traces, three policies, a grid of two settings of
// first-fit and two capacities: 2 x 2 x (2 + 4) = 24 cells, each the same
// result as replay sim gives for it, then reruns it (nothing to do).
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "sweep")
	args := []string{"sweep", "--traces", "../../../testdata/pytorch/*g_b*.pickle.gz", "--traces", tokenLengths, "--policy", "pytorch,cuda,first-fit",
		"--grid", "first-fit.segment_size=2MiB,20MiB", "--grid", "first-fit.release=true,false",
		"--capacity", "0,3GiB", "--progress", "lines", "-j", "3", "-o", out}
	stdout, stderr, err := runCmd(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "sweep: 24 cells (2 traces x 6 policies and settings x 2 capacities): 24 run, 0 already done, 0 failed") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if n := len(regexp.MustCompile(`(?m)^sweep: \d+/24 `).FindAllString(stderr, -1)); n == 0 {
		t.Errorf("no progress lines:\n%s", stderr)
	}
	rs := readResults(t, filepath.Join(out, "results.json"))
	if len(rs) != 24 {
		t.Fatalf("%d results, want 24", len(rs))
	}
	// Plan order: trace, capacity, policy, grid point.
	if rs[0].Trace != growingBatch || rs[0].Policy != "pytorch" || rs[0].Capacity != 0 ||
		rs[2].Policy != "first-fit" || rs[2].Settings["segment_size"] != "2MiB" || rs[2].Settings["release"] != "true" ||
		rs[6].Capacity != 3<<30 || rs[12].Trace != tokenLengths {
		t.Errorf("order: %+v / %+v / %+v / %+v", rs[0].Policy, rs[2].Settings, rs[6].Capacity, rs[12].Trace)
	}
	// The same figures as replay sim.
	simJSON := filepath.Join(dir, "sim.json")
	if _, _, err := runCmd(t, "sim", "--policy", "first-fit", "--set", "first-fit.segment_size=20MiB", "--set", "first-fit.release=false",
		"--capacity", "3GiB", "--json", simJSON, tokenLengths); err != nil {
		t.Fatal(err)
	}
	want := readResults(t, simJSON)[0]
	var got *sim.Result
	for i := range rs {
		r := &rs[i]
		if r.Trace == tokenLengths && r.Policy == "first-fit" && r.Capacity == 3<<30 && r.Settings["segment_size"] == "20MiB" && r.Settings["release"] == "false" {
			got = r
		}
	}
	if got == nil || !reflect.DeepEqual(*got, want) {
		t.Errorf("sweep cell %+v\nwant (replay sim) %+v", got, want)
	}
	// CSV: a row per cell, the JSON keys and a column per setting.
	rows := readCSV(t, filepath.Join(out, "results.csv"))
	if len(rows) != 25 {
		t.Fatalf("%d CSV rows, want 25", len(rows))
	}
	if got := column(t, rows, "set:segment_size")[2]; got != "2MiB" {
		t.Errorf("set:segment_size = %q", got)
	}
	if got := column(t, rows, "peak_reserved_bytes")[0]; got == "" || got == "0" {
		t.Errorf("peak_reserved_bytes = %q", got)
	}
	column(t, rows, "sim_alloc_time_ns")
	cells, _ := filepath.Glob(filepath.Join(out, "cells", "*.json"))
	if len(cells) != 24 {
		t.Errorf("%d cell files", len(cells))
	}

	// A rerun finds every cell done; a lost cell is run again.
	os.Remove(cells[5])
	stdout, _, err = runCmd(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "1 run, 23 already done") {
		t.Errorf("rerun: %s", stdout)
	}
	if again := readResults(t, filepath.Join(out, "results.json")); !reflect.DeepEqual(again, rs) {
		t.Errorf("rerun changed the results")
	}
}

// TestSweepShardsMerge runs a sweep as three shards and merges them: the
// same results as the whole sweep, in the same order.
func TestSweepShardsMerge(t *testing.T) {
	dir := t.TempDir()
	base := []string{"sweep", "--traces", tokenLengths, "--traces", growingBatch, "--policy", "cuda,best-fit,buddy", "--progress", "none"}
	whole := filepath.Join(dir, "whole")
	if _, _, err := runCmd(t, append(base, "-o", whole)...); err != nil {
		t.Fatal(err)
	}
	var shards []string
	for i := range 3 {
		d := filepath.Join(dir, "shard"+string(rune('0'+i)))
		shards = append(shards, d)
		if i == 1 {
			continue // run later
		}
		if _, _, err := runCmd(t, append(base, "--shard", string(rune('0'+i))+"/3", "-o", d)...); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(dir, "merged")
	_, stderr, err := runCmd(t, append([]string{"merge", "-o", merged}, shards[0], shards[2])...)
	if err == nil || !strings.Contains(stderr, "shard 1/3 missing") {
		t.Errorf("merge without shard 1: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(merged, "results.json")); err == nil {
		t.Error("an incomplete merge was written")
	}
	if _, _, err := runCmd(t, append([]string{"merge", "--partial", "-o", merged}, shards[0], shards[2])...); err != nil {
		t.Errorf("merge --partial: %v", err)
	}
	if got := readResults(t, filepath.Join(merged, "results.json")); len(got) != 4 {
		t.Errorf("partial merge: %d results, want 4", len(got))
	}
	if _, _, err := runCmd(t, append(base, "--shard", "1/3", "-o", shards[1])...); err != nil {
		t.Fatal(err)
	}
	// A shard's directory is its own.
	if _, _, err := runCmd(t, append(base, "--shard", "0/3", "-o", shards[1])...); err == nil || !strings.Contains(err.Error(), "own directory") {
		t.Errorf("shard 0 into shard 1's directory: %v", err)
	}
	stdout, _, err := runCmd(t, append([]string{"merge", "-o", merged, filepath.Join(whole, "results.json")}, shards...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "merge: 6 results from 4 inputs (6 duplicates dropped)") {
		t.Errorf("stdout: %s", stdout)
	}
	want := readResults(t, filepath.Join(whole, "results.json"))
	got := readResults(t, filepath.Join(merged, "results.json"))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merged shards differ from the whole sweep")
	}
	if a, b := readCSV(t, filepath.Join(merged, "results.csv")), readCSV(t, filepath.Join(whole, "results.csv")); !reflect.DeepEqual(a, b) {
		t.Errorf("merged CSV differs from the whole sweep's")
	}
}

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
