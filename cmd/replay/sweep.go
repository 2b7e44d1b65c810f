package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const sweepUsage = `usage: replay sweep --traces GLOB... [--policy LIST|all] [--set NAME.key=value]...
                    [--grid NAME.key=v1,v2,...]... [--capacity SIZE[,SIZE...]] [--shard i/n]
                    [-j N] -o DIR [TRACE|GLOB|DIR...]

Replays every (trace, policy, setting, capacity) cell in parallel and streams
the results to DIR: DIR/cells/*.json (one file per finished cell, so that a
rerun skips them), DIR/results.csv (a row per cell as it finishes) and, at the
end, DIR/results.json (the shape of 'replay sim --json') and results.csv again
in plan order. --shard i/n (0 <= i < n) runs every n-th cell from the i-th,
for a job array; give each shard its own DIR and join them with
'replay merge'.

Flags:
`

// sweepPlanVersion is the version of DIR/plan.json.
const sweepPlanVersion = 1

// sweepCell is one cell of a sweep: a trace replayed against one policy
// with one set of settings on a device of one capacity.
type sweepCell struct {
	Index    int               `json:"index"` // in the whole plan, from 0
	Trace    string            `json:"trace"`
	Policy   string            `json:"policy"`
	Settings map[string]string `json:"settings,omitempty"`
	Capacity uint64            `json:"capacity_bytes"`
	// AsRecorded replays a recording as recorded (sim.Config.AsRecorded):
	// the result's settings are then those used, the recorded ones with
	// Settings over them.
	AsRecorded bool   `json:"as_recorded"`
	File       string `json:"file"` // under DIR/cells
}

func (c *sweepCell) key() string {
	return cellKey(c.Trace, c.Policy, c.Settings, c.Capacity) + "\x00" + strconv.FormatBool(c.AsRecorded)
}

// cellFile is the content of a finished cell's file: the cell and its
// result.
type cellFile struct {
	Cell   sweepCell   `json:"cell"`
	Result *sim.Result `json:"result"`
}

// sweepPlan is DIR/plan.json: what a sweep (or one shard of it) runs.
type sweepPlan struct {
	Version int `json:"version"`
	// ID names the whole plan (every shard's cells), so that merge can
	// tell the shards of one sweep.
	ID     string `json:"plan_id"`
	Shard  int    `json:"shard"`
	Shards int    `json:"shards"`
	// Total is the number of cells of the whole plan.
	Total int         `json:"total_cells"`
	Cells []sweepCell `json:"cells"`
}

// gridAxis is one --grid flag: a setting of a policy and its values.
type gridAxis struct {
	policy, key string
	values      []string
}

func runSweep(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("sweep", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, sweepUsage)
		fs.PrintDefaults()
	}
	traceGlobs := fs.StringArray("traces", nil, "traces to replay: a file, a glob (** matches any number of directories) or a directory (every trace file in it); repeatable")
	policyList := fs.String("policy", "all", "policies: a comma-separated list of names, or all ("+strings.Join(policies.Names(), ", ")+")")
	sets := fs.StringArray("set", nil, "a policy setting NAME.key=value for every cell of that policy (repeatable)")
	grids := fs.StringArray("grid", nil, "a policy setting to sweep, NAME.key=v1,v2,...: one cell per value (repeatable; several make a product)")
	capacity := fs.String("capacity", "0", "device capacities: a comma-separated list of bytes or sizes like 24GiB (0 = unlimited)")
	outDir := fs.StringP("out", "o", "", "write the results into `DIR` (required)")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "replays run in parallel")
	shard := fs.String("shard", "", "run only shard `i/n` of the cells (0 <= i < n)")
	progress := fs.String("progress", "auto", "progress display on stderr: auto (a bar on a terminal, lines otherwise), bar, lines or none")
	from := fs.String("from", "auto", "format of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, "device index to replay from multi-device traces")
	asRecorded := fs.Bool("as-recorded", true, "replay a recording as recorded, as replay sim does: with the allocator settings it records (--set and --grid override them) and at its recorded addresses")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *outDir == "" {
		return fmt.Errorf("sweep: no output directory (-o DIR)")
	}
	if *jobs < 1 {
		return fmt.Errorf("-j %d: want at least 1", *jobs)
	}
	shardI, shardN, err := parseShard(*shard)
	if err != nil {
		return err
	}
	traces, skipped, err := expandTraces(append(append([]string(nil), *traceGlobs...), fs.Args()...))
	if err != nil {
		return err
	}
	for _, s := range skipped {
		fmt.Fprintf(stderr, "sweep: %s\n", s)
	}
	if len(traces) == 0 {
		return fmt.Errorf("sweep: no trace given (--traces GLOB)")
	}
	names, err := policyNames(*policyList)
	if err != nil {
		return err
	}
	fixed, err := parseSets(*sets, names)
	if err != nil {
		return err
	}
	axes, err := parseGrids(*grids, names, fixed)
	if err != nil {
		return err
	}
	var caps []uint64
	for _, c := range splitList(*capacity) {
		b, err := policies.ParseSize(c)
		if err != nil {
			return fmt.Errorf("--capacity %q: %v", c, err)
		}
		caps = append(caps, b)
	}
	if len(caps) == 0 {
		return fmt.Errorf("--capacity: no capacity given")
	}
	all, err := sweepCells(traces, caps, names, fixed, axes, *asRecorded)
	if err != nil {
		return err
	}
	plan := sweepPlan{Version: sweepPlanVersion, ID: planID(all), Shard: shardI, Shards: shardN, Total: len(all)}
	for _, c := range all {
		if c.Index%shardN == shardI {
			plan.Cells = append(plan.Cells, c)
		}
	}

	s := &sweeper{dir: *outDir, plan: plan, jobs: *jobs, from: *from, device: *device, stderr: stderr}
	start := time.Now()
	if err := s.prepare(); err != nil {
		return err
	}
	pg, err := newProgress(*progress, stderr, len(plan.Cells), s.doneBefore)
	if err != nil {
		return err
	}
	s.run(pg)
	pg.finish()
	if err := s.writeResults(); err != nil {
		return err
	}
	elapsed := time.Since(start)
	what := fmt.Sprintf("%d cells", len(plan.Cells))
	if shardN > 1 {
		what = fmt.Sprintf("shard %d/%d: %d of %d cells", shardI, shardN, len(plan.Cells), plan.Total)
	}
	fmt.Fprintf(stdout, "sweep: %s (%d traces x %d policies and settings x %d capacities): %d run, %d already done, %d failed, in %.1f s with %d workers\n",
		what, len(traces), len(all)/max(len(traces)*len(caps), 1), len(caps), s.ran, s.doneBefore, len(s.failed), elapsed.Seconds(), *jobs)
	fmt.Fprintf(stdout, "sweep: results in %s and %s\n", filepath.Join(*outDir, "results.csv"), filepath.Join(*outDir, "results.json"))
	if len(s.failed) > 0 {
		sort.Slice(s.failed, func(i, j int) bool { return s.failed[i].index < s.failed[j].index })
		for _, f := range s.failed[:min(len(s.failed), 5)] {
			fmt.Fprintf(stderr, "sweep: cell %d: %v\n", f.index, f.err)
		}
		return fmt.Errorf("sweep: %d of %d cells failed (first: %v); a rerun retries them", len(s.failed), len(plan.Cells), s.failed[0].err)
	}
	return nil
}

// parseShard parses --shard i/n; "" is 0/1.
func parseShard(s string) (int, int, error) {
	if s == "" {
		return 0, 1, nil
	}
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(strings.TrimSpace(a))
	n, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("--shard %q: want i/n with 0 <= i < n (a job array's index from 0, and its size)", s)
	}
	return i, n, nil
}

// splitList splits a comma-separated list, keeping commas inside brackets
// ([64:8,256:4]) and dropping empty items.
func splitList(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[', '(', '{':
			depth++
		case ']', ')', '}':
			depth--
		case ',':
			if depth == 0 {
				if v := strings.TrimSpace(s[start:i]); v != "" {
					out = append(out, v)
				}
				start = i + 1
			}
		}
	}
	if v := strings.TrimSpace(s[start:]); v != "" {
		out = append(out, v)
	}
	return out
}

// parseGrids parses --grid NAME.key=v1,v2,... flags.
func parseGrids(grids []string, names []string, fixed map[string]policies.Settings) ([]gridAxis, error) {
	inPlan := map[string]bool{}
	for _, n := range names {
		inPlan[n] = true
	}
	seen := map[string]bool{}
	var axes []gridAxis
	for _, g := range grids {
		lhs, vals, ok := strings.Cut(g, "=")
		name, key, ok2 := strings.Cut(lhs, ".")
		if !ok || !ok2 || name == "" || key == "" {
			return nil, fmt.Errorf("--grid %q: want NAME.key=v1,v2,...", g)
		}
		if !inPlan[name] {
			return nil, fmt.Errorf("--grid %q: policy %q is not among --policy (%s)", g, name, strings.Join(names, ", "))
		}
		if seen[lhs] {
			return nil, fmt.Errorf("--grid %q: %s is swept twice", g, lhs)
		}
		if _, dup := fixed[name][key]; dup {
			return nil, fmt.Errorf("--grid %q: %s is also fixed by --set", g, lhs)
		}
		seen[lhs] = true
		values := splitList(vals)
		if len(values) == 0 {
			return nil, fmt.Errorf("--grid %q: no values", g)
		}
		axes = append(axes, gridAxis{policy: name, key: key, values: values})
	}
	return axes, nil
}

// sweepCells returns every cell, in plan order: by trace, capacity, policy
// and grid point. It checks each policy's settings once, so that a bad
// value fails before any replay.
func sweepCells(traces []string, caps []uint64, names []string, fixed map[string]policies.Settings, axes []gridAxis, asRecorded bool) ([]sweepCell, error) {
	perPolicy := map[string][]policies.Settings{}
	for _, n := range names {
		points := []policies.Settings{maps(fixed[n])}
		for _, ax := range axes {
			if ax.policy != n {
				continue
			}
			var next []policies.Settings
			for _, p := range points {
				for _, v := range ax.values {
					q := maps(p)
					q[ax.key] = v
					next = append(next, q)
				}
			}
			points = next
		}
		for _, p := range points {
			if _, err := policies.New(n, sim.NewDevice(0), p); err != nil {
				return nil, fmt.Errorf("policy %s with settings %q: %w", n, formatSettings(p), err)
			}
		}
		perPolicy[n] = points
	}
	var cells []sweepCell
	for _, t := range traces {
		for _, c := range caps {
			for _, n := range names {
				for _, s := range perPolicy[n] {
					if len(s) == 0 {
						s = nil
					}
					cell := sweepCell{Index: len(cells), Trace: t, Policy: n, Settings: s, Capacity: c, AsRecorded: asRecorded}
					sum := sha256.Sum256([]byte(cell.key()))
					cell.File = plots.TraceName(t) + "." + n + "." + hex.EncodeToString(sum[:6]) + ".json"
					cells = append(cells, cell)
				}
			}
		}
	}
	return cells, nil
}

// maps returns a copy of s, never nil.
func maps(s policies.Settings) policies.Settings {
	out := policies.Settings{}
	for k, v := range s {
		out[k] = v
	}
	return out
}

func planID(cells []sweepCell) string {
	h := sha256.New()
	for _, c := range cells {
		io.WriteString(h, c.key())
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// expandTraces expands trace arguments: a glob (with ** for any number of
// directories), a directory (every file in it, recursively, whose content
// is a trace), or a file. It returns the traces in order, without
// duplicates, and notes on what a directory walk skipped.
func expandTraces(args []string) ([]string, []string, error) {
	var out, notes []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, a := range args {
		if !hasMeta(a) {
			st, err := os.Stat(a)
			if err != nil {
				return nil, nil, err
			}
			if !st.IsDir() {
				add(a)
				continue
			}
			found, skipped, err := tracesIn(a)
			if err != nil {
				return nil, nil, err
			}
			if skipped > 0 {
				notes = append(notes, fmt.Sprintf("%s: %d files that are no traces skipped", a, skipped))
			}
			for _, p := range found {
				add(p)
			}
			continue
		}
		matches, err := globAll(a)
		if err != nil {
			return nil, nil, err
		}
		if len(matches) == 0 {
			return nil, nil, fmt.Errorf("--traces %q: no file matches", a)
		}
		for _, m := range matches {
			add(m)
		}
	}
	return out, notes, nil
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// tracesIn returns the files under dir whose first bytes are a trace
// format's (tracefile.Detect), sorted, and how many others it saw.
// Detected text is taken only from files named *.txt or *.trace, since
// any text file would pass.
func tracesIn(dir string) ([]string, int, error) {
	var found []string
	skipped := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		head := make([]byte, 512)
		n, _ := io.ReadFull(f, head)
		f.Close()
		switch format := tracefile.Detect(head[:n]); {
		case format == "":
			skipped++
		case format == "text" && !strings.HasSuffix(p, ".txt") && !strings.HasSuffix(p, ".trace"):
			skipped++
		default:
			found = append(found, p)
		}
		return nil
	})
	sort.Strings(found)
	return found, skipped, err
}

// globAll expands a glob pattern in which "**" as a whole path element
// matches any number of directories; other elements follow
// filepath.Match. Only regular files are returned, sorted.
func globAll(pattern string) ([]string, error) {
	if !strings.Contains(pattern, "**") {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, fmt.Errorf("--traces %q: %v", pattern, err)
		}
		var files []string
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				files = append(files, p)
			}
		}
		return files, nil
	}
	parts := strings.Split(filepath.ToSlash(pattern), "/")
	// The walk starts at the longest prefix without metacharacters.
	k := 0
	for k < len(parts) && !hasMeta(parts[k]) {
		k++
	}
	root := strings.Join(parts[:k], "/")
	switch {
	case root == "" && strings.HasPrefix(pattern, "/"):
		root = "/"
	case root == "":
		root = "."
	}
	rest := parts[k:]
	for _, p := range rest {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("--traces %q: %v", pattern, err)
		}
	}
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if matchParts(rest, strings.Split(filepath.ToSlash(rel), "/")) {
			out = append(out, p)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

func matchParts(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if matchParts(pat[1:], name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, _ := filepath.Match(pat[0], name[0])
	return ok && matchParts(pat[1:], name[1:])
}

// sweeper runs the cells of a plan.
type sweeper struct {
	dir    string
	plan   sweepPlan
	jobs   int
	from   string
	device int
	stderr io.Writer

	results    []*sim.Result // by position in plan.Cells, nil until done
	doneBefore int           // cells found done at the start
	ran        int
	failed     []cellError
	csv        *results.CSVWriter
	csvFile    *os.File
	csvBuf     *bufio.Writer
}

type cellError struct {
	index int
	err   error
}

// prepare creates DIR, checks and writes DIR/plan.json, loads the cells
// already done and starts DIR/results.csv with them.
func (s *sweeper) prepare() error {
	if err := os.MkdirAll(filepath.Join(s.dir, "cells"), 0o755); err != nil {
		return err
	}
	planPath := filepath.Join(s.dir, "plan.json")
	if data, err := os.ReadFile(planPath); err == nil {
		var old sweepPlan
		if json.Unmarshal(data, &old) == nil && (old.Shard != s.plan.Shard || old.Shards != s.plan.Shards) {
			return fmt.Errorf("sweep: %s holds shard %d/%d of a sweep, this is shard %d/%d: give each shard its own directory",
				s.dir, old.Shard, old.Shards, s.plan.Shard, s.plan.Shards)
		}
	}
	if err := atomicfile.WriteFile(planPath, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(s.plan)
	}); err != nil {
		return err
	}
	s.results = make([]*sim.Result, len(s.plan.Cells))
	for i := range s.plan.Cells {
		c := &s.plan.Cells[i]
		cf, err := readCell(filepath.Join(s.dir, "cells", c.File))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(s.stderr, "sweep: cell %d: %v; running it again\n", c.Index, err)
			}
			continue
		}
		if cf.Cell.key() != c.key() {
			fmt.Fprintf(s.stderr, "sweep: cell %d: %s holds another cell; running it again\n", c.Index, c.File)
			continue
		}
		s.results[i] = cf.Result
		s.doneBefore++
	}
	// results.csv grows a row per cell as cells finish: first those done.
	f, err := os.Create(filepath.Join(s.dir, "results.csv"))
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

// settingKeys returns the setting keys of the plan's cells, sorted.
func (s *sweeper) settingKeys() []string {
	seen := map[string]bool{}
	for _, c := range s.plan.Cells {
		for k := range c.Settings {
			seen[k] = true
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func readCell(path string) (*cellFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cf cellFile
	if err := json.Unmarshal(data, &cf); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cf.Result == nil {
		return nil, fmt.Errorf("%s: no result", path)
	}
	return &cf, nil
}

// sweepJob is the cells of one trace that one worker replays in one pass.
type sweepJob struct {
	trace string
	cells []int // positions in plan.Cells
	size  int64 // the trace file's size, for ordering
}

type jobResult struct {
	job     sweepJob
	results []*sim.Result
	err     error
	elapsed time.Duration
}

// jobs groups the cells to run by trace, and splits a trace's cells into
// several jobs when there are fewer traces than workers (each job reads
// the trace again). The largest traces come first.
func (s *sweeper) jobsToRun() []sweepJob {
	var order []string
	byTrace := map[string][]int{}
	for i, c := range s.plan.Cells {
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
	per := max(1, (s.jobs+len(order)-1)/len(order))
	var jobs []sweepJob
	for _, t := range order {
		cells := byTrace[t]
		n := min(per, len(cells))
		var size int64
		if st, err := os.Stat(t); err == nil {
			size = st.Size()
		}
		for g := range n {
			var part []int
			for k := g; k < len(cells); k += n {
				part = append(part, cells[k])
			}
			jobs = append(jobs, sweepJob{trace: t, cells: part, size: size})
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].size > jobs[j].size })
	return jobs
}

// run replays the pending cells on s.jobs workers, writing each finished
// cell's file and CSV row as its job ends.
func (s *sweeper) run(pg progress) {
	defer s.csvFile.Close()
	jobs := s.jobsToRun()
	work := make(chan sweepJob)
	done := make(chan jobResult)
	for range min(s.jobs, max(len(jobs), 1)) {
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
		jr := <-done
		if jr.err == nil {
			for k, i := range jr.job.cells {
				r := jr.results[k]
				c := &s.plan.Cells[i]
				if err := atomicfile.WriteFile(filepath.Join(s.dir, "cells", c.File), func(w io.Writer) error {
					return json.NewEncoder(w).Encode(cellFile{Cell: *c, Result: r})
				}); err != nil {
					jr.err = err
					break
				}
				s.results[i] = r
				s.ran++
				if err := s.csv.Write(r); err == nil {
					s.csvBuf.Flush()
				}
			}
		}
		if jr.err != nil {
			for _, i := range jr.job.cells {
				if s.results[i] == nil {
					s.failed = append(s.failed, cellError{s.plan.Cells[i].Index, jr.err})
				}
			}
		}
		pg.jobDone(jr)
	}
}

func (s *sweeper) runJob(j sweepJob) jobResult {
	start := time.Now()
	jr := jobResult{job: j}
	f, err := tracefile.Open(j.trace, tracefile.Options{From: s.from, Device: s.device})
	if err != nil {
		jr.err = err
		return jr
	}
	defer f.Close()
	cfgs := make([]sim.Config, len(j.cells))
	for k, i := range j.cells {
		c := s.plan.Cells[i]
		cfgs[k] = sim.Config{Trace: c.Trace, Policy: c.Policy, Settings: c.Settings, Capacity: c.Capacity, AsRecorded: c.AsRecorded}
	}
	jr.results, jr.err = sim.Run(f, cfgs...)
	if jr.err != nil && !strings.HasPrefix(jr.err.Error(), j.trace+":") {
		jr.err = fmt.Errorf("%s: %w", j.trace, jr.err)
	}
	jr.elapsed = time.Since(start)
	return jr
}

// writeResults writes DIR/results.json and DIR/results.csv with every
// finished cell of the plan, in plan order.
func (s *sweeper) writeResults() error {
	var rs []*sim.Result
	for _, r := range s.results {
		if r != nil {
			rs = append(rs, r)
		}
	}
	if err := atomicfile.WriteFile(filepath.Join(s.dir, "results.json"), func(w io.Writer) error { return results.WriteSim(w, rs) }); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.dir, "results.csv"), func(w io.Writer) error {
		c := results.NewCSVWriter(w, s.settingKeys())
		if err := c.WriteHeader(); err != nil {
			return err
		}
		for _, r := range rs {
			if err := c.Write(r); err != nil {
				return err
			}
		}
		return nil
	})
}

// progress shows a sweep's progress on stderr.
type progress interface {
	jobDone(jr jobResult)
	finish()
}

func newProgress(mode string, w io.Writer, total, done int) (progress, error) {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch mode {
	case "none":
		return noProgress{}, nil
	case "lines":
		return &lineProgress{w: w, total: total, done: done}, nil
	case "bar":
		bar := progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("sweep"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("cells"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionFullWidth(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		if done > 0 {
			bar.Add(done)
		}
		return &barProgress{bar: bar}, nil
	}
	return nil, fmt.Errorf("--progress %q: want auto, bar, lines or none", mode)
}

type noProgress struct{}

func (noProgress) jobDone(jobResult) {}
func (noProgress) finish()           {}

// lineProgress writes a line per finished job.
type lineProgress struct {
	w           io.Writer
	total, done int
}

func (p *lineProgress) jobDone(jr jobResult) {
	p.done += len(jr.job.cells)
	status := fmt.Sprintf("%d cells in %.1f s", len(jr.job.cells), jr.elapsed.Seconds())
	if jr.err != nil {
		status = "failed: " + jr.err.Error()
	}
	fmt.Fprintf(p.w, "sweep: %d/%d %s: %s\n", p.done, p.total, filepath.Base(jr.job.trace), status)
}

func (p *lineProgress) finish() {}

type barProgress struct{ bar *progressbar.ProgressBar }

func (p *barProgress) jobDone(jr jobResult) {
	p.bar.Describe("sweep " + filepath.Base(jr.job.trace))
	p.bar.Add(len(jr.job.cells))
}

func (p *barProgress) finish() { p.bar.Finish() }
