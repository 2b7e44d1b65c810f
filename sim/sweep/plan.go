// Package sweep runs every (trace, policy, setting, capacity) cell of a
// plan in parallel into a directory, resumably, and joins the directories
// of a sweep's shards: replay sweep and replay merge.
//
// A sweep's directory holds plan.json (Plan: what it runs), cells/ (one
// CellFile per finished cell, so that a rerun skips it), results.csv (a
// row per cell as it finishes, then every cell in plan order) and, at the
// end, results.json (a results file of kind "sim", in plan order).
package sweep

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
)

// PlanVersion is the version of plan.json. Version 2 came with results
// version 2 (fragmentation redefined): the cells of a version 1 sweep hold
// the older figures, and are not resumed.
const PlanVersion = 2

// Cell is one cell of a sweep: a trace replayed against one policy with
// one set of settings on a device of Capacity bytes (0: unlimited).
type Cell struct {
	Index    int               `json:"index"` // in the whole plan, from 0
	Trace    string            `json:"trace"`
	Policy   string            `json:"policy"`
	Settings map[string]string `json:"settings,omitempty"`
	Capacity uint64            `json:"capacity_bytes"`
	// AsRecorded replays a recording as recorded (sim.Config.AsRecorded):
	// the result's settings are then those used, the recorded ones with
	// Settings over them.
	AsRecorded bool `json:"as_recorded"`
	// TraceID identifies the trace's content (TraceID), so that a file
	// replaced under the same path is another cell.
	TraceID string `json:"trace_id,omitempty"`
	File    string `json:"file"` // under DIR/cells
}

// Key identifies the cell: its trace (path and content), policy, settings,
// capacity and AsRecorded.
func (c *Cell) Key() string {
	return CellKey(c.Trace, c.Policy, c.Settings, c.Capacity) + "\x00" + strconv.FormatBool(c.AsRecorded) + "\x00" + c.TraceID
}

// TraceID returns an identity of the content of the file at path: its size
// and a hash of its first and last 64 KiB (where every format keeps its
// header and its end), in hex. It returns an error naming the file when it
// cannot be read.
func TraceID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	const part = 64 << 10
	h := sha256.New()
	buf := make([]byte, part)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	h.Write(buf[:n])
	if st.Size() > part {
		m, err := f.ReadAt(buf, max(st.Size()-part, part))
		if err != nil && err != io.EOF {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		h.Write(buf[:m])
	}
	return fmt.Sprintf("%d-%x", st.Size(), h.Sum(nil)[:8]), nil
}

// CellKey identifies a cell, and a result, by the trace as given, the
// policy, its settings and the capacity in bytes.
func CellKey(trace, policy string, settings map[string]string, capacity uint64) string {
	return trace + "\x00" + policy + "\x00" + policies.Settings(settings).Join(";") + "\x00" + strconv.FormatUint(capacity, 10)
}

// ResultKey is the CellKey of a result.
func ResultKey(r *sim.Result) string { return CellKey(r.Trace, r.Policy, r.Settings, r.Capacity) }

// CellFile is the content of a finished cell's file: the cell and its
// result.
type CellFile struct {
	Cell   Cell        `json:"cell"`
	Result *sim.Result `json:"result"`
}

// ReadCell reads the cell file at path. Errors name the file; a missing
// file is an fs.ErrNotExist.
func ReadCell(path string) (*CellFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cf CellFile
	if err := json.Unmarshal(data, &cf); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cf.Result == nil {
		return nil, fmt.Errorf("%s: no result", path)
	}
	return &cf, nil
}

// Plan is plan.json: what a sweep (or one shard of it) runs.
type Plan struct {
	Version int `json:"version"`
	// ID names the whole plan (every shard's cells), so that merge can
	// tell the shards of one sweep.
	ID     string `json:"plan_id"`
	Shard  int    `json:"shard"`
	Shards int    `json:"shards"`
	// Total is the number of cells of the whole plan.
	Total int    `json:"total_cells"`
	Cells []Cell `json:"cells"`
}

// NewPlan returns the plan of shard i of n of the cells of a whole plan:
// every n-th cell from the i-th.
func NewPlan(all []Cell, shard, shards int) Plan {
	p := Plan{Version: PlanVersion, ID: planID(all), Shard: shard, Shards: shards, Total: len(all)}
	for _, c := range all {
		if c.Index%shards == shard {
			p.Cells = append(p.Cells, c)
		}
	}
	return p
}

// ReadPlan reads the plan.json at path and checks its version. Errors
// name the file; a missing file is an fs.ErrNotExist.
func ReadPlan(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p Plan
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if p.Version != PlanVersion || p.Shards < 1 {
		return nil, fmt.Errorf("%s: plan version %d with %d shards, want version %d", path, p.Version, p.Shards, PlanVersion)
	}
	return &p, nil
}

func planID(cells []Cell) string {
	h := sha256.New()
	for _, c := range cells {
		io.WriteString(h, c.Key())
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ParseShard parses a shard "i/n" (0 <= i < n); "" is 0/1.
func ParseShard(s string) (i, n int, err error) {
	if s == "" {
		return 0, 1, nil
	}
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(strings.TrimSpace(a))
	n, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("%q: want i/n with 0 <= i < n (a job array's index from 0, and its size)", s)
	}
	return i, n, nil
}

// SchedulerShard returns the shard a job array's task runs, from the
// scheduler's environment (getenv). A Slurm array task's index is its
// SLURM_ARRAY_TASK_ID, the array numbered from 0 (--array=0-3), without a
// step; a Kubernetes Indexed Job pod's is its JOB_COMPLETION_INDEX. The
// number of shards is count when given (--shard auto/N; an Indexed Job's
// completions, which its pods are not told), else done when the sweep's
// directory already holds the shards of an earlier run of the array (a
// task run again, alone or not: Slurm then tells the resubmitted array's
// size, not the first one's), else the Slurm array's
// (SLURM_ARRAY_TASK_MAX + 1, which a partial array, SLURM_ARRAY_TASK_MIN
// above 0, cannot tell). found is false when neither scheduler's variables
// are set. Errors name the variable or say what to give.
func SchedulerShard(getenv func(string) string, count, done int) (i, n int, found bool, err error) {
	num := func(k string) (int, error) {
		v := getenv(k)
		if v == "" {
			return 0, fmt.Errorf("%s is not set", k)
		}
		x, err := strconv.Atoi(v)
		if err != nil || x < 0 {
			return 0, fmt.Errorf("%s=%q: not a task number", k, v)
		}
		return x, nil
	}
	if getenv("SLURM_ARRAY_TASK_ID") != "" && getenv("JOB_COMPLETION_INDEX") != "" {
		return 0, 0, true, fmt.Errorf("both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are set: a Slurm task or a Kubernetes pod, not both; give --shard i/n")
	}
	switch {
	case getenv("SLURM_ARRAY_TASK_ID") != "":
		id, err := num("SLURM_ARRAY_TASK_ID")
		if err != nil {
			return 0, 0, true, err
		}
		if st := strings.TrimSpace(getenv("SLURM_ARRAY_TASK_STEP")); st != "" && st != "1" {
			return 0, 0, true, fmt.Errorf("SLURM_ARRAY_TASK_STEP=%s: number the array's tasks 0, 1, 2, ... (--array=0-N without a step)", st)
		}
		n := count
		if n == 0 {
			n = done
		}
		if n == 0 {
			lo, err1 := num("SLURM_ARRAY_TASK_MIN")
			hi, err2 := num("SLURM_ARRAY_TASK_MAX")
			switch {
			case err1 != nil:
				return 0, 0, true, err1
			case err2 != nil:
				return 0, 0, true, err2
			case lo > hi:
				return 0, 0, true, fmt.Errorf("SLURM_ARRAY_TASK_MIN=%d is above SLURM_ARRAY_TASK_MAX=%d", lo, hi)
			case lo != 0:
				return 0, 0, true, fmt.Errorf("SLURM_ARRAY_TASK_MIN=%d: a part of an array whose size is unknown here; give it as --shard auto/N", lo)
			}
			n = hi + 1
		}
		if id >= n {
			return 0, 0, true, fmt.Errorf("SLURM_ARRAY_TASK_ID=%d: not a task of an array of %d", id, n)
		}
		return id, n, true, nil
	case getenv("JOB_COMPLETION_INDEX") != "":
		id, err := num("JOB_COMPLETION_INDEX")
		if err != nil {
			return 0, 0, true, err
		}
		n := count
		if n == 0 {
			n = done
		}
		if n == 0 {
			return 0, 0, true, fmt.Errorf("JOB_COMPLETION_INDEX=%d: give the Indexed Job's completions as --shard auto/N", id)
		}
		if id >= n {
			return 0, 0, true, fmt.Errorf("JOB_COMPLETION_INDEX=%d: not below the %d completions", id, n)
		}
		return id, n, true, nil
	}
	return 0, 0, false, nil
}

// ShardsIn returns the number of shards of the shard directories
// (ShardDir) under dir, 0 if there are none; an error names two that
// disagree.
func ShardsIn(dir string) (int, error) {
	names, _ := filepath.Glob(filepath.Join(dir, "shard-*-of-*"))
	n, first := 0, ""
	for _, name := range names {
		var i, k int
		if _, err := fmt.Sscanf(filepath.Base(name), "shard-%d-of-%d", &i, &k); err != nil || k < 1 {
			continue
		}
		if n != 0 && k != n {
			return 0, fmt.Errorf("%s holds the shards of arrays of %d (%s) and %d tasks (%s)", dir, n, first, k, name)
		}
		n, first = k, name
	}
	return n, nil
}

// ShardDir is the directory a scheduler's task writes under the sweep's
// output directory: shard-I-of-N, so that the tasks of one array write
// apart and a task run again writes where it wrote before.
func ShardDir(dir string, i, n int) string {
	return filepath.Join(dir, fmt.Sprintf("shard-%d-of-%d", i, n))
}

// Axis is a setting of a policy swept over values: one cell per value.
type Axis struct {
	Policy, Key string
	Values      []string
}

// ParseAxis parses NAME.key=v1,v2,... (values split by policies.SplitList).
func ParseAxis(s string) (Axis, error) {
	lhs, vals, ok := strings.Cut(s, "=")
	name, key, ok2 := strings.Cut(lhs, ".")
	if !ok || !ok2 || name == "" || key == "" {
		return Axis{}, fmt.Errorf("%q: want NAME.key=v1,v2 (values separated by commas)", s)
	}
	values := policies.SplitList(vals)
	if len(values) == 0 {
		return Axis{}, fmt.Errorf("%q: no values", s)
	}
	return Axis{Policy: name, Key: key, Values: values}, nil
}

// Spec is what a sweep replays: every trace on every capacity (bytes, 0
// for unlimited) against every policy, each with its Fixed settings and
// every point of the product of its Axes.
type Spec struct {
	Traces     []string
	Capacities []uint64
	Policies   []string
	Fixed      map[string]policies.Settings
	Axes       []Axis
	AsRecorded bool
}

// AxisError is the error of an axis (NAME.key) that names a policy not in
// the plan, a setting swept twice or one also among the fixed settings.
type AxisError struct {
	Axis string
	Msg  string
}

func (e *AxisError) Error() string { return e.Axis + ": " + e.Msg }

// Cells returns every cell of the spec, in plan order: by trace,
// capacity, policy and grid point. It checks each policy's settings once
// (policies.New), so that a bad value fails before any replay, and
// returns an *AxisError for an axis that names a policy not in Policies, a
// setting swept twice or one also in Fixed.
func (s Spec) Cells() ([]Cell, error) {
	seen := map[string]bool{}
	for _, ax := range s.Axes {
		lhs := ax.Policy + "." + ax.Key
		switch {
		case !slices.Contains(s.Policies, ax.Policy):
			return nil, &AxisError{lhs, fmt.Sprintf("policy %q is not among the policies (%s)", ax.Policy, strings.Join(s.Policies, ", "))}
		case seen[lhs]:
			return nil, &AxisError{lhs, "swept twice"}
		}
		if _, dup := s.Fixed[ax.Policy][ax.Key]; dup {
			return nil, &AxisError{lhs, "also a fixed setting"}
		}
		seen[lhs] = true
	}
	perPolicy := map[string][]policies.Settings{}
	for _, n := range s.Policies {
		points := []policies.Settings{copySettings(s.Fixed[n])}
		for _, ax := range s.Axes {
			if ax.Policy != n {
				continue
			}
			var next []policies.Settings
			for _, p := range points {
				for _, v := range ax.Values {
					q := copySettings(p)
					q[ax.Key] = v
					next = append(next, q)
				}
			}
			points = next
		}
		for _, p := range points {
			if _, err := policies.New(n, sim.NewDevice(0), p); err != nil {
				return nil, fmt.Errorf("policy %s with settings %q: %w", n, p.Join(";"), err)
			}
		}
		perPolicy[n] = points
	}
	var cells []Cell
	for _, t := range s.Traces {
		id, err := TraceID(t)
		if err != nil {
			return nil, err
		}
		for _, c := range s.Capacities {
			for _, n := range s.Policies {
				for _, set := range perPolicy[n] {
					if len(set) == 0 {
						set = nil
					}
					cell := Cell{Index: len(cells), Trace: t, Policy: n, Settings: set, Capacity: c, AsRecorded: s.AsRecorded, TraceID: id}
					sum := sha256.Sum256([]byte(cell.Key()))
					cell.File = results.TraceName(t) + "." + n + "." + hex.EncodeToString(sum[:6]) + ".json"
					cells = append(cells, cell)
				}
			}
		}
	}
	return cells, nil
}

// copySettings returns a copy of s, never nil.
func copySettings(s policies.Settings) policies.Settings {
	out := policies.Settings{}
	maps.Copy(out, s)
	return out
}
