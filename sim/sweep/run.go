package sweep

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/columnar"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// Runner runs the cells of a plan into a directory.
type Runner struct {
	// Dir is the sweep's directory; Plan what it runs; Workers the
	// number of replays at a time (at least 1); Open how the traces are
	// opened.
	Dir     string
	Plan    Plan
	Workers int
	Open    tracefile.Options
	// Log, if not nil, gets a line for each cell file found unusable
	// (run again).
	Log io.Writer
	// Progress, if not nil, is called after each job, on Run's goroutine.
	Progress func(Job)
	// Parquet makes WriteResults write results.parquet too (package
	// columnar), with the other two.
	Parquet bool

	results    []*sim.Result // by position in Plan.Cells, nil until done
	doneBefore int
	ran        int
	failed     []CellError
	csv        *results.CSVWriter
	csvFile    *os.File
	csvBuf     *bufio.Writer
	csvErr     error
	lock       *os.File // the directory's lock, held from Prepare to Close
}

// CellError is the error of a cell that failed, by its index in the plan.
type CellError struct {
	Index int
	Err   error
}

// Job is the cells of one trace that one worker replays in one pass; after
// the pass, Err is its error and Elapsed its wall time.
type Job struct {
	Trace   string
	Cells   []int // positions in Plan.Cells
	Size    int64 // the trace file's size in bytes, for ordering
	Err     error
	Elapsed time.Duration
	results []*sim.Result
}

// DoneBefore returns the number of cells Prepare found done; Ran the
// number Run ran; Failed the cells that failed, by index.
func (s *Runner) DoneBefore() int { return s.doneBefore }

// Ran returns the number of cells Run replayed.
func (s *Runner) Ran() int { return s.ran }

// Failed returns the cells that failed, by index in the plan.
func (s *Runner) Failed() []CellError {
	out := append([]CellError(nil), s.failed...)
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

func (s *Runner) logf(format string, args ...any) {
	if s.Log != nil {
		fmt.Fprintf(s.Log, format, args...)
	}
}

// Prepare creates the directory, takes it for this run (a lock that Close
// or the process's end lets go), checks and writes plan.json, loads the
// cells already done and starts results.csv with them. It returns an
// error for a directory another sweep is running in now, one that holds
// another shard of a sweep, or one that cannot be written.
func (s *Runner) Prepare() error {
	if err := os.MkdirAll(filepath.Join(s.Dir, "cells"), 0o755); err != nil {
		return err
	}
	if s.lock == nil {
		lock, err := lockDir(s.Dir)
		if err != nil {
			return err
		}
		s.lock = lock
	}
	planPath := filepath.Join(s.Dir, "plan.json")
	if data, err := os.ReadFile(planPath); err == nil {
		var old Plan
		if json.Unmarshal(data, &old) == nil && (old.Shard != s.Plan.Shard || old.Shards != s.Plan.Shards) {
			return fmt.Errorf("sweep: %s holds shard %d/%d of a sweep, this is shard %d/%d: give each shard its own directory",
				s.Dir, old.Shard, old.Shards, s.Plan.Shard, s.Plan.Shards)
		}
	}
	if err := atomicfile.WriteFile(planPath, func(w io.Writer) error { return results.WriteJSON(w, s.Plan) }); err != nil {
		return err
	}
	s.results = make([]*sim.Result, len(s.Plan.Cells))
	for i := range s.Plan.Cells {
		c := &s.Plan.Cells[i]
		cf, err := ReadCell(filepath.Join(s.Dir, "cells", c.File))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.logf("sweep: cell %d: %v; running it again\n", c.Index, err)
			}
			continue
		}
		if cf.Cell.Key() != c.Key() {
			s.logf("sweep: cell %d: %s holds another cell; running it again\n", c.Index, c.File)
			continue
		}
		s.results[i] = cf.Result
		s.doneBefore++
	}
	// results.csv grows a row per cell as cells finish: first those done.
	f, err := os.Create(filepath.Join(s.Dir, "results.csv"))
	if err != nil {
		return err
	}
	s.csvFile, s.csvBuf = f, bufio.NewWriter(f)
	s.csv = results.NewCSVWriter(s.csvBuf, s.settingKeys())
	if err := s.csv.WriteHeader(); err != nil {
		return err
	}
	for _, r := range s.results {
		if r != nil {
			if err := s.csv.Write(r); err != nil {
				return err
			}
		}
	}
	return s.csvBuf.Flush()
}

// Close lets the directory go (Prepare's lock); a Runner not prepared
// has nothing to let go.
func (s *Runner) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

// settingKeys returns the setting keys of the plan's cells, sorted.
func (s *Runner) settingKeys() []string {
	rs := make([]*sim.Result, len(s.Plan.Cells))
	for i, c := range s.Plan.Cells {
		rs[i] = &sim.Result{Settings: c.Settings}
	}
	return results.SettingKeys(rs)
}

// MaxJobCells bounds the cells of one job: a job's cells are written when
// its pass over the trace ends, so a sweep interrupted mid-run loses at
// most the cells of the jobs then running, whatever the grouping.
const MaxJobCells = 4

// jobs groups the cells to run by trace, and splits a trace's cells into
// several jobs when there are fewer traces than workers, or more cells
// than MaxJobCells (each job reads the trace again). The largest traces
// come first.
func (s *Runner) jobs() []Job {
	var order []string
	byTrace := map[string][]int{}
	for i, c := range s.Plan.Cells {
		if s.results[i] != nil {
			continue
		}
		if _, ok := byTrace[c.Trace]; !ok {
			order = append(order, c.Trace)
		}
		byTrace[c.Trace] = append(byTrace[c.Trace], i)
	}
	if len(order) == 0 {
		return nil
	}
	per := max(1, (s.Workers+len(order)-1)/len(order))
	var jobs []Job
	for _, t := range order {
		cells := byTrace[t]
		n := min(max(per, (len(cells)+MaxJobCells-1)/MaxJobCells), len(cells))
		var size int64
		if st, err := os.Stat(t); err == nil {
			size = st.Size()
		}
		for g := range n {
			var part []int
			for k := g; k < len(cells); k += n {
				part = append(part, cells[k])
			}
			jobs = append(jobs, Job{Trace: t, Cells: part, Size: size})
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Size > jobs[j].Size })
	return jobs
}

// Run replays the pending cells (after Prepare) on Workers workers,
// writing each finished cell's file and results.csv row as its job ends.
// A cell that fails is listed in Failed and the others go on. It returns
// the first error writing results.csv, naming the file.
func (s *Runner) Run() error {
	jobs := s.jobs()
	work := make(chan Job)
	done := make(chan Job)
	for range min(max(s.Workers, 1), max(len(jobs), 1)) {
		go func() {
			for j := range work {
				done <- s.runJob(j)
			}
		}()
	}
	go func() {
		for _, j := range jobs {
			work <- j
		}
		close(work)
	}()
	for range jobs {
		j := <-done
		if j.Err == nil {
			for k, i := range j.Cells {
				r := j.results[k]
				c := &s.Plan.Cells[i]
				if err := atomicfile.WriteFile(filepath.Join(s.Dir, "cells", c.File), func(w io.Writer) error {
					return json.NewEncoder(w).Encode(CellFile{Cell: *c, Result: r})
				}); err != nil {
					j.Err = err
					break
				}
				s.results[i] = r
				s.ran++
				s.csvRow(r)
			}
		}
		if j.Err != nil {
			for _, i := range j.Cells {
				if s.results[i] == nil {
					s.failed = append(s.failed, CellError{s.Plan.Cells[i].Index, j.Err})
				}
			}
		}
		if s.Progress != nil {
			s.Progress(j)
		}
	}
	if err := s.csvFile.Close(); err != nil && s.csvErr == nil {
		s.csvErr = err
	}
	if s.csvErr != nil {
		return fmt.Errorf("%s: %w", filepath.Join(s.Dir, "results.csv"), s.csvErr)
	}
	return nil
}

// csvRow writes r's row to results.csv, keeping the first error.
func (s *Runner) csvRow(r *sim.Result) {
	if s.csvErr != nil {
		return
	}
	err := s.csv.Write(r)
	if err == nil {
		err = s.csvBuf.Flush()
	}
	s.csvErr = err
}

func (s *Runner) runJob(j Job) Job {
	start := time.Now()
	cfgs := make([]sim.Config, len(j.Cells))
	for k, i := range j.Cells {
		c := s.Plan.Cells[i]
		cfgs[k] = sim.Config{Trace: c.Trace, Policy: c.Policy, Settings: c.Settings, Capacity: c.Capacity, AsRecorded: c.AsRecorded}
	}
	j.results, j.Err = RunFile(j.Trace, s.Open, cfgs...)
	for _, r := range j.results {
		// sim.Run gives it from an offline cell of the same job, which
		// depends on the grouping: FillOffline sets it from the plan.
		r.PeakOffline, r.PeakOptimum = 0, 0
	}
	j.Elapsed = time.Since(start)
	return j
}

// FillOffline sets each result's PeakOffline to the peak reserved bytes of
// the offline policy's result among rs on the same trace at the same
// capacity, where it served every malloc; a result with none keeps its
// own; and each result's PeakOptimum to the least peak that a result of
// the same trace proved (its Plan, Proven: the optimal policy's, at any
// capacity, as a plan does not depend on it). So a sweep's figures do not
// depend on how its cells were grouped into jobs or shards.
func FillOffline(rs []*sim.Result) {
	type key struct {
		trace    string
		capacity uint64
	}
	peak := map[key]uint64{}
	optimum := map[string]uint64{}
	for _, r := range rs {
		if r.Policy == policies.OfflineName && r.OOMs == 0 {
			peak[key{r.Trace, r.Capacity}] = r.PeakReserved
		}
		if p := r.Plan; p != nil && p.Proven && p.Height > 0 {
			if o, ok := optimum[r.Trace]; !ok || p.Height < o {
				optimum[r.Trace] = p.Height
			}
		}
	}
	for _, r := range rs {
		if p, ok := peak[key{r.Trace, r.Capacity}]; ok {
			r.PeakOffline = p
		}
		if o, ok := optimum[r.Trace]; ok {
			r.PeakOptimum = o
		}
	}
}

// RunFile replays the trace file at path, opened with opts, against each
// of cfgs (sim.Run) and returns one result per config, in order. Errors
// name the file (tracefile.NameError).
func RunFile(path string, opts tracefile.Options, cfgs ...sim.Config) ([]*sim.Result, error) {
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rs, err := sim.Run(f, cfgs...)
	if err != nil {
		return nil, tracefile.NameError(path, err)
	}
	return rs, nil
}

// RunFileParallel is RunFile with cfgs split into up to jobs groups that
// replay at once, each group one pass over the trace, which is decoded
// once for all of them (fanSource): the same results, in the same order.
// Each result's PeakOffline is the offline config's peak, as sim.Run gives
// it across all its configs. It returns the error of the first group (in
// config order) that failed, or the trace's read error.
func RunFileParallel(path string, opts tracefile.Options, jobs int, cfgs ...sim.Config) ([]*sim.Result, error) {
	jobs = min(jobs, len(cfgs))
	if jobs <= 1 {
		return RunFile(path, opts, cfgs...)
	}
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	chans := make([]chan []trace.Event, jobs)
	for g := range chans {
		chans[g] = make(chan []trace.Event, 8)
	}
	var readErr error
	go func() {
		// The decoder: each chunk of events to every group.
		defer func() {
			for _, c := range chans {
				close(c)
			}
		}()
		for {
			chunk := make([]trace.Event, 0, 4096)
			for len(chunk) < cap(chunk) {
				ev, err := f.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					readErr = err
					break
				}
				chunk = append(chunk, ev)
			}
			if len(chunk) > 0 {
				for _, c := range chans {
					c <- chunk
				}
			}
			if len(chunk) < cap(chunk) {
				return
			}
		}
	}()
	rs, err := sim.RunSplit(jobs, func(g int) (trace.Source, func()) {
		return &fanSource{h: f.Header(), ch: chans[g], err: &readErr}, func() {
			for range chans[g] {
				// A group that stopped early lets the decoder go on.
			}
		}
	}, cfgs...)
	if err != nil {
		return nil, tracefile.NameError(path, err)
	}
	return rs, nil
}

// fanSource is one group's view of a trace that one decoder reads for
// several: the chunks of events it sends, then the decoder's error (read
// once the channel is closed) or io.EOF.
type fanSource struct {
	h   trace.Header
	ch  <-chan []trace.Event
	cur []trace.Event
	err *error
}

func (s *fanSource) Header() trace.Header { return s.h }

func (s *fanSource) Next() (trace.Event, error) {
	for len(s.cur) == 0 {
		c, ok := <-s.ch
		if !ok {
			if *s.err != nil {
				return trace.Event{}, *s.err
			}
			return trace.Event{}, io.EOF
		}
		s.cur = c
	}
	ev := s.cur[0]
	s.cur = s.cur[1:]
	return ev, nil
}

// Results returns the results of the cells done, in plan order, with
// their PeakOffline from the plan's offline cells (FillOffline).
func (s *Runner) Results() []*sim.Result {
	var rs []*sim.Result
	for _, r := range s.results {
		if r != nil {
			rs = append(rs, r)
		}
	}
	FillOffline(rs)
	return rs
}

// WriteResults writes results.json and results.csv (and results.parquet
// with Parquet) with every finished cell of the plan, in plan order,
// atomically and together: on error no file is replaced.
func (s *Runner) WriteResults() error {
	rs := s.Results()
	// Both files appear together, or neither (the JSON was put in place
	// before the CSV was written).
	var b atomicfile.Batch
	defer b.Abort()
	if err := b.WriteFile(filepath.Join(s.Dir, "results.json"), func(w io.Writer) error { return results.WriteSim(w, rs) }); err != nil {
		return err
	}
	if err := b.WriteFile(filepath.Join(s.Dir, "results.csv"), func(w io.Writer) error {
		return results.WriteCSVKeys(w, rs, s.settingKeys())
	}); err != nil {
		return err
	}
	if s.Parquet {
		if err := b.WriteFile(filepath.Join(s.Dir, "results.parquet"), func(w io.Writer) error { return columnar.Write(w, rs) }); err != nil {
			return err
		}
	}
	return b.Commit()
}
