package sweep

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const tokenLengths = "../../testdata/pytorch/token_lengths.pickle.gz"

// TestCells checks the plan order (trace, capacity, policy, grid point),
// the product of two axes and the errors of bad axes.
func TestCells(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, n := range []string{"a.trace", "b.trace"} {
		if err := os.WriteFile(n, []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{
		Traces: []string{"a.trace", "b.trace"}, Capacities: []uint64{0, 1 << 30}, Policies: []string{"cuda", "first-fit"},
		Fixed: map[string]policies.Settings{"first-fit": {"release": "true"}},
		Axes:  []Axis{{Policy: "first-fit", Key: "segment_size", Values: []string{"2MiB", "20MiB"}}},
	}
	cells, err := spec.Cells()
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 2*2*3 {
		t.Fatalf("%d cells", len(cells))
	}
	c := cells[2]
	if c.Index != 2 || c.Trace != "a.trace" || c.Capacity != 0 || c.Policy != "first-fit" ||
		!reflect.DeepEqual(c.Settings, map[string]string{"release": "true", "segment_size": "20MiB"}) ||
		cells[3].Capacity != 1<<30 || cells[6].Trace != "b.trace" || cells[0].Settings != nil {
		t.Errorf("cells: %+v", cells[:4])
	}
	if !strings.HasPrefix(c.File, "a.first-fit.") || !strings.HasSuffix(c.File, ".json") {
		t.Errorf("file %q", c.File)
	}
	if !strings.HasPrefix(c.TraceID, "7-") || cells[6].TraceID == c.TraceID {
		t.Errorf("trace ids %q, %q", c.TraceID, cells[6].TraceID)
	}
	if p := NewPlan(cells, 1, 4); len(p.Cells) != 3 || p.Cells[0].Index != 1 || p.Total != 12 || p.ID != NewPlan(cells, 0, 4).ID {
		t.Errorf("shard 1/4: %+v", p)
	}
	for _, tc := range []struct {
		name string
		axes []Axis
		want string
	}{
		{"not in plan", []Axis{{"bfc", "x", []string{"1"}}}, `bfc.x: policy "bfc" is not among the policies (cuda, first-fit)`},
		{"twice", []Axis{{"cuda", "x", []string{"1"}}, {"cuda", "x", []string{"2"}}}, "cuda.x: swept twice"},
		{"fixed", []Axis{{"first-fit", "release", []string{"false"}}}, "first-fit.release: also a fixed setting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.Axes = tc.axes
			_, err := s.Cells()
			var ae *AxisError
			if !errors.As(err, &ae) || err.Error() != tc.want {
				t.Errorf("err = %v, want an *AxisError %q", err, tc.want)
			}
		})
	}
	s := spec
	s.Axes = []Axis{{"first-fit", "segment_size", []string{"huge"}}}
	if _, err := s.Cells(); err == nil || !strings.Contains(err.Error(), `policy first-fit with settings "release=true;segment_size=huge"`) {
		t.Errorf("bad value: %v", err)
	}
}

func TestParse(t *testing.T) {
	if i, n, err := ParseShard("2/5"); i != 2 || n != 5 || err != nil {
		t.Errorf("ParseShard(2/5) = %d, %d, %v", i, n, err)
	}
	if i, n, err := ParseShard(""); i != 0 || n != 1 || err != nil {
		t.Errorf(`ParseShard("") = %d, %d, %v`, i, n, err)
	}
	for _, s := range []string{"3/3", "-1/2", "1", "a/b"} {
		if _, _, err := ParseShard(s); err == nil {
			t.Errorf("ParseShard(%q) accepted", s)
		}
	}
	ax, err := ParseAxis("pytorch.roundup_power2_divisions=[64:8,256:4],4")
	if want := (Axis{"pytorch", "roundup_power2_divisions", []string{"[64:8,256:4]", "4"}}); err != nil || !reflect.DeepEqual(ax, want) {
		t.Errorf("ParseAxis = %+v, %v", ax, err)
	}
	for _, s := range []string{"pytorch.x", "pytorch=1", "pytorch.x="} {
		if _, err := ParseAxis(s); err == nil {
			t.Errorf("ParseAxis(%q) accepted", s)
		}
	}
}

type failWriter struct{}

var errDiskFull = errors.New("disk full")

func (failWriter) Write([]byte) (int, error) { return 0, errDiskFull }

// TestRunCSVError runs a sweep whose results.csv cannot be written once it
// has started: Run returns the error, naming the file (it was dropped
// before), and the cells are done all the same.
func TestRunCSVError(t *testing.T) {
	cells, err := Spec{Traces: []string{tokenLengths}, Capacities: []uint64{0}, Policies: []string{"cuda", "best-fit"}}.Cells()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &Runner{Dir: dir, Plan: NewPlan(cells, 0, 1), Workers: 2}
	if err := r.Prepare(); err != nil {
		t.Fatal(err)
	}
	r.csvBuf = bufio.NewWriter(failWriter{})
	r.csv = results.NewCSVWriter(r.csvBuf, nil)
	err = r.Run()
	if !errors.Is(err, errDiskFull) || !strings.Contains(err.Error(), filepath.Join(dir, "results.csv")) {
		t.Errorf("Run: %v, want the CSV's error naming results.csv", err)
	}
	if r.Ran() != 2 || len(r.Failed()) != 0 {
		t.Errorf("%d ran, %d failed", r.Ran(), len(r.Failed()))
	}
	if err := r.WriteResults(); err != nil {
		t.Fatal(err)
	}
	rs, err := results.ReadSim(dir)
	if err != nil || len(rs) != 2 {
		t.Errorf("results.json: %d results, %v", len(rs), err)
	}
	r.Close()
	// A rerun finds both cells done.
	again := &Runner{Dir: dir, Plan: NewPlan(cells, 0, 1), Workers: 1}
	if err := again.Prepare(); err != nil || again.DoneBefore() != 2 {
		t.Errorf("rerun: %d done before, %v", again.DoneBefore(), err)
	}
	if err := again.Run(); err != nil || again.Ran() != 0 {
		t.Errorf("rerun: %d ran, %v", again.Ran(), err)
	}
	if _, err := os.Stat(filepath.Join(dir, "plan.json")); err != nil {
		t.Error(err)
	}
}

// A trace replaced under the same path is another cell: a rerun of the
// sweep replays it instead of taking the old file's results ("0 run, 1
// already done" with the old figures before).
func TestReplacedTrace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.pickle.gz")
	run := func(src string) *Runner {
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		cells, err := Spec{Traces: []string{path}, Capacities: []uint64{0}, Policies: []string{"cuda"}}.Cells()
		if err != nil {
			t.Fatal(err)
		}
		r := &Runner{Dir: filepath.Join(dir, "out"), Plan: NewPlan(cells, 0, 1), Workers: 1}
		if err := r.Prepare(); err != nil {
			t.Fatal(err)
		}
		if err := r.Run(); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := run(tokenLengths); r.Ran() != 1 {
		t.Fatalf("first run: %d ran", r.Ran())
	}
	if r := run(tokenLengths); r.Ran() != 0 || r.DoneBefore() != 1 {
		t.Errorf("the same file again: %d ran, %d done before", r.Ran(), r.DoneBefore())
	}
	if r := run("../../testdata/pytorch/growing_batch.pickle.gz"); r.Ran() != 1 || r.DoneBefore() != 0 {
		t.Errorf("another file at the path: %d ran, %d done before", r.Ran(), r.DoneBefore())
	}
}

// TestInterruptedKeepsCells: a sweep stopped after its first job (here by
// its progress callback, as SIGINT or SIGKILL would stop it between jobs)
// has that job's cells on disk, and a rerun runs only the others. Before,
// the 9 cells of the one trace were one job, written only when all were
// done: an interrupted sweep kept nothing.
func TestInterruptedKeepsCells(t *testing.T) {
	cells, err := Spec{Traces: []string{tokenLengths}, Capacities: []uint64{0, 1 << 30, 2 << 30},
		Policies: []string{"cuda", "best-fit", "first-fit"}}.Cells()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &Runner{Dir: dir, Plan: NewPlan(cells, 0, 1), Workers: 1}
	if err := r.Prepare(); err != nil {
		t.Fatal(err)
	}
	jobs := r.jobs()
	if len(jobs) != 3 {
		t.Fatalf("%d jobs of %d cells, want 3 of at most %d", len(jobs), len(cells), MaxJobCells)
	}
	// The first job's cells are on disk when its job ends.
	first := len(jobs[0].Cells)
	stopped := false
	r.Progress = func(j Job) {
		if stopped {
			return
		}
		stopped = true
		files, _ := filepath.Glob(filepath.Join(dir, "cells", "*.json"))
		if len(files) != first {
			t.Errorf("after the first job: %d cell files, want %d", len(files), first)
		}
		// Stop here: the cells directory is what a killed sweep leaves.
		cp := t.TempDir()
		for _, f := range files {
			data, _ := os.ReadFile(f)
			os.MkdirAll(filepath.Join(cp, "cells"), 0o755)
			os.WriteFile(filepath.Join(cp, "cells", filepath.Base(f)), data, 0o644)
		}
		again := &Runner{Dir: cp, Plan: NewPlan(cells, 0, 1), Workers: 1}
		if err := again.Prepare(); err != nil || again.DoneBefore() != first {
			t.Errorf("rerun after the stop: %d done before, want %d (%v)", again.DoneBefore(), first, err)
		}
	}
	if err := r.Run(); err != nil {
		t.Fatal(err)
	}
	if r.Ran() != len(cells) {
		t.Errorf("%d ran, want %d", r.Ran(), len(cells))
	}
}

func TestSchedulerShard(t *testing.T) {
	for _, tc := range []struct {
		env         map[string]string
		count, done int
		i, n        int
		found       bool
		err         string
	}{
		{map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, 0, 0, 2, 4, true, ""},
		// Task 2 resubmitted alone: the array's size from its shard directories.
		{map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "2"}, 0, 4, 2, 4, true, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "2"}, 0, 0, 0, 0, true, "SLURM_ARRAY_TASK_MIN=2: a part of an array whose size is unknown here; give it as --shard auto/N"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "2"}, 4, 0, 2, 4, true, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_STEP": "2"}, 0, 0, 0, 0, true, "SLURM_ARRAY_TASK_STEP=2: number the array's tasks 0, 1, 2, ... (--array=0-N without a step)"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, 0, 4, 0, 0, true, "SLURM_ARRAY_TASK_ID=5: not a task of an array of 4"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "x"}, 0, 0, 0, 0, true, `SLURM_ARRAY_TASK_ID="x": not a task number`},
		{map[string]string{"JOB_COMPLETION_INDEX": "3"}, 4, 0, 3, 4, true, ""},
		{map[string]string{"JOB_COMPLETION_INDEX": "3"}, 0, 4, 3, 4, true, ""},
		{map[string]string{"JOB_COMPLETION_INDEX": "3"}, 0, 0, 0, 0, true, "JOB_COMPLETION_INDEX=3: give the Indexed Job's completions as --shard auto/N"},
		{map[string]string{"JOB_COMPLETION_INDEX": "4"}, 4, 0, 0, 0, true, "JOB_COMPLETION_INDEX=4: not below the 4 completions"},
		{map[string]string{}, 0, 0, 0, 0, false, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "1"}, 0, 0, 0, 0, true, "SLURM_ARRAY_TASK_MIN is not set"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": " 1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, 0, 0, 0, 0, true, `SLURM_ARRAY_TASK_ID=" 1": not a task number`},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_MAX": "0"}, 0, 0, 0, 0, true, "SLURM_ARRAY_TASK_MIN=2 is above SLURM_ARRAY_TASK_MAX=0"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "1", "JOB_COMPLETION_INDEX": "1"}, 2, 0, 0, 0, true, "both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are set: a Slurm task or a Kubernetes pod, not both; give --shard i/n"},
	} {
		i, n, found, err := SchedulerShard(func(k string) string { return tc.env[k] }, tc.count, tc.done)
		if msg := fmt.Sprint(err); tc.err == "" && err != nil || tc.err != "" && msg != tc.err || i != tc.i || n != tc.n || found != tc.found {
			t.Errorf("%v, count %d, done %d: %d/%d found %v err %v; want %d/%d %v %q", tc.env, tc.count, tc.done, i, n, found, err, tc.i, tc.n, tc.found, tc.err)
		}
	}
	dir := t.TempDir()
	if n, err := ShardsIn(dir); n != 0 || err != nil {
		t.Errorf("ShardsIn of an empty directory: %d, %v", n, err)
	}
	os.MkdirAll(ShardDir(dir, 0, 4), 0o755)
	os.MkdirAll(ShardDir(dir, 3, 4), 0o755)
	if n, err := ShardsIn(dir); n != 4 || err != nil {
		t.Errorf("ShardsIn: %d, %v", n, err)
	}
	os.MkdirAll(ShardDir(dir, 1, 2), 0o755)
	if _, err := ShardsIn(dir); err == nil {
		t.Error("ShardsIn of shards of 2 and of 4: no error")
	}
}

// TestRunFileParallel: the policies split into groups that replay at once
// from one decoder give RunFile's results, byte for byte in JSON, offline's
// peak on every result included.
func TestRunFileParallel(t *testing.T) {
	names := policies.Names()
	for _, path := range []string{tokenLengths, "../../testdata/pytorch/multistream.pickle.gz", "../../testdata/pytorch/churn.pickle.gz"} {
		cfgs := make([]sim.Config, len(names))
		for k, n := range names {
			cfgs[k] = sim.Config{Trace: path, Policy: n, AsRecorded: true}
		}
		want, err := RunFile(path, tracefile.Options{}, cfgs...)
		if err != nil {
			t.Fatal(err)
		}
		wj, _ := json.Marshal(want)
		for _, jobs := range []int{2, 3, 7} {
			got, err := RunFileParallel(path, tracefile.Options{}, jobs, cfgs...)
			if err != nil {
				t.Fatal(err)
			}
			if gj, _ := json.Marshal(got); !bytes.Equal(gj, wj) {
				t.Errorf("%s, %d groups: results differ from one pass", path, jobs)
			}
		}
	}
	// A trace that cannot be read: the error, from every group alike.
	bad := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(bad, []byte("malloc id=1 size=1\nmalloc id=2 size=x\n"), 0o644)
	if _, err := RunFileParallel(bad, tracefile.Options{}, 2, sim.Config{Policy: "cuda"}, sim.Config{Policy: "best-fit"}); err == nil || !strings.Contains(err.Error(), "bad.txt") {
		t.Errorf("bad trace: %v", err)
	}
}

// TestLockedDirectory: while a sweep runs in a directory, another sweep
// there is refused, naming the lock; once the first has let go (Close, or
// its process's end), the directory can be swept again.
func TestLockedDirectory(t *testing.T) {
	cells, err := Spec{Traces: []string{tokenLengths}, Capacities: []uint64{0}, Policies: []string{"cuda"}}.Cells()
	if err != nil {
		t.Fatal(err)
	}
	other, err := Spec{Traces: []string{tokenLengths}, Capacities: []uint64{0}, Policies: []string{"best-fit"}}.Cells()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	first := &Runner{Dir: dir, Plan: NewPlan(cells, 0, 1), Workers: 1}
	if err := first.Prepare(); err != nil {
		t.Fatal(err)
	}
	second := &Runner{Dir: dir, Plan: NewPlan(other, 0, 1), Workers: 1}
	err = second.Prepare()
	if err == nil || !strings.Contains(err.Error(), "in use by another sweep running now") || !strings.Contains(err.Error(), filepath.Join(dir, ".lock")) {
		t.Fatalf("a second sweep in the directory: %v", err)
	}
	if err := first.Run(); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := second.Prepare(); err != nil {
		t.Fatalf("after the first let go: %v", err)
	}
	second.Close()
}
