// Package fidelity holds simulations to recordings, for replay
// fidelity: each trace replayed as recorded (the settings and addresses it
// records) against the policy that simulates its allocator, compared with
// the recording event by event (sim.Fidelity) and with the real
// allocator's figures beside it (sim.Measured), and the per-rank traces of
// a multi-GPU job grouped by their names (Inputs) and summed up per job
// (WriteJob). Bytes are bytes.
package fidelity

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// Input is a trace that Run replays, and what came of it.
type Input struct {
	path string
	// name names the trace in the output: its file name, and its rank
	// where the name does not say it.
	name string
	// job is the job the trace is a rank of (nil for none), rank its rank
	// there; rankShown says its file name shows the rank.
	job       *Job
	rank      int
	rankShown bool
	// mpath is where the real allocator's figures would lie, measured
	// those read there (nil for none).
	mpath    string
	measured *sim.Measured
	// After the replay: the policy and its result; differs says the
	// replay differs from the recording, stopped that it stopped at a
	// divergence (its figures are those up to it).
	policy  string
	result  *sim.Result
	differs bool
	stopped bool
}

// Job is a multi-GPU job among replay fidelity's traces.
type Job struct {
	// name names the job: the file name of its traces with the rank as
	// '*' (job.Rank), or the directory or glob that gave it.
	name string
	// ranks are its traces by ascending rank.
	ranks []*Input
}

// Inputs expands replay fidelity's arguments into the traces to
// replay, in order, and the jobs of two ranks or more among them, in the
// order of their first trace. A file is a trace; its name may make it a
// rank of a job (RankOf), with the other files that name the same job. A
// directory or a glob gives the traces in it (tracefile.Glob), which are
// the ranks of the jobs their names say when every one names its rank,
// else of one job in the order of the traces (sorted by name). Errors: a
// directory or glob that gives no trace (tracefile.Glob's, or naming the
// directory), and two traces of one rank of a job, naming both. notes are what a directory's walk
// skipped.
func Inputs(args []string) (inputs []*Input, jobs []*Job, notes []string, err error) {
	byKey := map[string]*Job{}
	var order []*Job
	seen := map[string]bool{}
	join := func(key, name string, in *Input) error {
		j := byKey[key]
		if j == nil {
			j = &Job{name: name}
			byKey[key] = j
			order = append(order, j)
		}
		for _, other := range j.ranks {
			if other.rank == in.rank {
				return fmt.Errorf("fidelity: %s and %s are both rank %d of job %s", other.path, in.path, in.rank, name)
			}
		}
		in.job = j
		j.ranks = append(j.ranks, in)
		return nil
	}
	for _, a := range args {
		if st, err := os.Stat(a); !strings.ContainsAny(a, `*?[\`) && (err != nil || !st.IsDir()) {
			// A file, opened as given (its error, if any, is Open's).
			if seen[a] {
				continue
			}
			seen[a] = true
			in := &Input{path: a}
			if pattern, rank, shown, ok := RankOf(a); ok {
				in.rank, in.rankShown = rank, shown
				if err := join("name:"+pattern, jobName(pattern, shown), in); err != nil {
					return nil, nil, nil, err
				}
			}
			inputs = append(inputs, in)
			continue
		}
		paths, skipped, err := tracefile.Glob([]string{a})
		if err != nil {
			return nil, nil, nil, err
		}
		notes = append(notes, skipped...)
		if len(paths) == 0 {
			return nil, nil, nil, fmt.Errorf("fidelity: %s: no trace in it", a)
		}
		named := true
		for _, p := range paths {
			if _, _, _, ok := RankOf(p); !ok {
				named = false
			}
		}
		var group []*Input
		for k, p := range paths {
			if seen[p] {
				continue
			}
			seen[p] = true
			in := &Input{path: p, rank: k}
			if named {
				pattern, rank, shown, _ := RankOf(p)
				in.rank, in.rankShown = rank, shown
				err = join("name:"+pattern, jobName(pattern, shown), in)
			} else {
				err = join("arg:"+a, a, in)
			}
			if err != nil {
				return nil, nil, nil, err
			}
			group = append(group, in)
		}
		// The ranks of a job one after the other, by rank.
		pos := map[*Job]int{}
		for _, in := range group {
			if _, ok := pos[in.job]; !ok {
				pos[in.job] = len(pos)
			}
		}
		slices.SortStableFunc(group, func(x, y *Input) int {
			return cmp.Or(cmp.Compare(pos[x.job], pos[y.job]), cmp.Compare(x.rank, y.rank))
		})
		inputs = append(inputs, group...)
	}
	for _, j := range order {
		slices.SortStableFunc(j.ranks, func(x, y *Input) int { return cmp.Compare(x.rank, y.rank) })
		if len(j.ranks) < 2 {
			j.ranks[0].job = nil // a job of one rank is a trace
			continue
		}
		jobs = append(jobs, j)
	}
	for _, in := range inputs {
		in.name = filepath.Base(in.path)
		if in.job != nil && !in.rankShown {
			in.name += fmt.Sprintf(" (rank %d)", in.rank)
		}
	}
	return inputs, jobs, notes, nil
}

// RankOf returns the job a trace's path names and its rank there
// (job.Rank), from its file name (job.rank1.pickle.gz), or else from the
// name of its folder (rank1/snapshot.pickle.gz, the job then
// rank*/snapshot.pickle.gz); inName says it came from the file name. It
// reports false for a path that names no rank.
func RankOf(path string) (pattern string, rank int, inName, ok bool) {
	if pattern, rank, ok := job.Rank(path); ok {
		return pattern, rank, true, true
	}
	dir, base := filepath.Split(path)
	if dir = filepath.Clean(dir); dir != "." && dir != string(filepath.Separator) {
		if pattern, rank, ok := job.Rank(dir); ok {
			return filepath.Join(pattern, base), rank, false, true
		}
	}
	return "", 0, false, false
}

// jobName names the job of a RankOf pattern in the output: by its file
// name (job.rank*.pickle.gz), with its folder where the folder says the
// rank (rank*/snapshot.pickle.gz).
func jobName(pattern string, inName bool) string {
	if inName {
		return filepath.Base(pattern)
	}
	return filepath.Join(filepath.Base(filepath.Dir(pattern)), filepath.Base(pattern))
}

// Run is what replay fidelity replays every trace with.
type Run struct {
	// Policy is the policy that simulates the recorded allocator; "" for
	// the one of the trace's source (policies.SourcePolicy).
	Policy string
	// Settings are the user's settings by policy, over the recorded ones.
	Settings map[string]policies.Settings
	// Capacity is the device capacity in bytes (0: none); unless
	// CapacityGiven, the measured figures' memory cap replaces it.
	Capacity      uint64
	CapacityGiven bool
	// Opts open the traces (format, device).
	Opts tracefile.Options
}

// Replay replays the trace of in as recorded, writes its lines to w and
// keeps its outcome in in. Errors (the trace's, the replay's) name the
// trace.
func (o Run) Replay(w io.Writer, in *Input) error {
	path, measured, mpath := in.path, in.measured, in.mpath
	capBytes := o.Capacity
	if !o.CapacityGiven && measured != nil {
		capBytes = measured.Cap
	}
	f, err := tracefile.Open(path, o.Opts)
	if err != nil {
		return err
	}
	figures, against := filepath.Base(mpath), "peaks and counters as measured in "+filepath.Base(mpath)
	noCalls := f.Header().Unrecorded(trace.UnrecordedSegments) // placements not compared
	if measured == nil {
		// The real allocator's own figures, where the trace records them.
		if measured = sim.RecordedMeasured(f.Header()); measured != nil {
			figures, against = "as the trace records them", "peak allocated bytes and mallocs as the trace records them"
		}
	}
	pol := o.Policy
	if pol == "" {
		var known bool
		if pol, known = policies.SourcePolicy(f.Header().Source); !known {
			f.Close()
			return fmt.Errorf("%s: no real allocator recorded: a %s trace holds no allocator's decisions to compare with (fidelity holds a simulation to a recording of PyTorch's, CuPy's or XLA's allocator; --policy NAME compares a policy with the device calls the trace does hold)", path, termsafe.String(f.Header().Source))
		}
	}
	run := o.Settings[pol]
	if measured != nil {
		// The settings the measured figures imply (XLA's BFC), the
		// user's over them.
		if rs := measured.RecordedSettings(pol); rs != nil {
			if _, frac := run["memory_fraction"]; frac {
				delete(rs, "memory_limit") // the user's fraction replaces it
			}
			maps.Copy(rs, run)
			run = rs
		}
	}
	rep, err := sim.Fidelity(f, sim.Config{Trace: path, Policy: pol, Settings: run, Capacity: capBytes})
	f.Close()
	if err != nil {
		return tracefile.NameError(path, err)
	}
	in.policy, in.result = pol, rep.Result
	name, pol := termsafe.String(in.name), termsafe.String(pol) // as printed
	// What the recording does not show, inferred or not, whatever
	// the verdict: a figure that agrees may rest on it.
	if iw := sim.InferredWarning(rep.Result); iw != "" {
		fmt.Fprintf(w, "%s: warning: %s\n", name, termsafe.String(iw))
	}
	if w2 := rep.Result.PoolWarning; w2 != "" {
		fmt.Fprintf(w, "%s: warning: %s\n", name, termsafe.String(w2))
	}
	if d := rep.Divergence; d != nil {
		in.differs, in.stopped = true, true
		fmt.Fprintf(w, "%s: diverges at %s (policy %s)\n", name, termsafe.String(d.String()), pol)
		if hint := sim.CapacityWarning(rep.Result); hint != "" {
			fmt.Fprintf(w, "%s: %s\n", name, termsafe.String(hint))
		}
		return nil
	}
	if measured != nil {
		if diffs := sim.CompareMeasured(rep, measured); len(diffs) > 0 {
			in.differs = true
			same := "same device calls and placements, but "
			if noCalls {
				same = ""
			}
			fmt.Fprintf(w, "%s: %sfigures differ from the real allocator's (%s; policy %s):\n", name, same, figures, pol)
			for _, d := range diffs {
				fmt.Fprintf(w, "%s:   %s\n", name, termsafe.String(d))
			}
			return nil
		}
	}
	if a := rep.Result.Anomalies; a > 0 {
		// The real allocator replays its own recording whole: events
		// that cannot be replayed are a damaged or foreign recording.
		in.differs = true
		fmt.Fprintf(w, "%s: %d event(s) could not be replayed as recorded (first: %s): not a whole recording of the allocator (policy %s)\n", name, a, termsafe.String(rep.Result.FirstAnomaly), pol)
		return nil
	}
	if measured == nil {
		against = "no measured figures beside it"
	}
	if noCalls {
		fmt.Fprintf(w, "%s: figures agree (%d mallocs, no device call recorded; %s; policy %s, settings %s)\n",
			name, rep.Mallocs, against, pol, termsafe.String(settingsText(rep.Result.Settings)))
		return nil
	}
	fmt.Fprintf(w, "%s: identical (%d device calls, %d mallocs; %s; policy %s, settings %s)\n",
		name, rep.Calls, rep.Mallocs, against, pol, termsafe.String(settingsText(rep.Result.Settings)))
	return nil
}

// WriteJob writes the line of a job replayed rank by rank: the
// largest and smallest rank's peak reserved bytes (job.Summary), their
// spread, the first rank to fail (its first OOM first in time: where the
// job fails) and the ranks whose replay differs from their recording
// (those that stopped at a divergence count their figures up to it).
func WriteJob(w io.Writer, j *Job) {
	ranks := make([]int, len(j.ranks))
	rs := make([]*sim.Result, len(j.ranks))
	var pols []string
	var differ, stopped []int
	for i, in := range j.ranks {
		ranks[i], rs[i] = in.rank, in.result
		if !slices.Contains(pols, in.policy) {
			pols = append(pols, in.policy)
		}
		if in.differs {
			differ = append(differ, in.rank)
		}
		if in.stopped {
			stopped = append(stopped, in.rank)
		}
	}
	s := job.SummaryOf(j.name, strings.Join(pols, ","), ranks, rs)
	fmt.Fprintf(w, "job %s (%d ranks, policy %s): largest peak reserved %d bytes (rank %d), smallest %d bytes (rank %d), spread %.1f%%",
		termsafe.String(s.Job), len(s.Ranks), termsafe.String(s.Policy), s.MaxReserved, s.MaxReservedRank, s.MinReserved, s.MinReservedRank, 100*s.Spread())
	switch {
	case len(s.OOMRanks) == 0:
		fmt.Fprint(w, "; no rank ran out of memory")
	case s.FirstOOMRank >= 0:
		fmt.Fprintf(w, "; first to fail: rank %d, out of memory at event %d (ranks out of memory: %s)", s.FirstOOMRank, s.FirstOOMEvent, tables.Ints(s.OOMRanks))
	default:
		fmt.Fprintf(w, "; ranks out of memory: %s, the first unknown (no times)", tables.Ints(s.OOMRanks))
	}
	switch {
	case len(differ) == 0:
		fmt.Fprint(w, "; every rank as recorded\n")
	case len(stopped) == 0:
		fmt.Fprintf(w, "; ranks that differ from their recording: %s\n", tables.Ints(differ))
	default:
		fmt.Fprintf(w, "; ranks that differ from their recording: %s (the figures of %s stop at their divergence)\n", tables.Ints(differ), tables.Ints(stopped))
	}
}

// MeasuredPath returns where the real allocator's figures for the trace at
// path lie: NAME.stats.json beside NAME.pickle.gz (or NAME.pickle,
// NAME.pt.trace.json.gz, NAME.json.gz, NAME.json, or any other file
// NAME.EXT).
//
// An XSpace's lie in NAME.json beside NAME.xplane.pb(.gz), as
// testdata/jax/record.py writes JAX's memory_stats().
func MeasuredPath(path string) string {
	if base, ok := strings.CutSuffix(strings.TrimSuffix(path, ".gz"), ".xplane.pb"); ok {
		return base + ".json"
	}
	base := path
	for _, ext := range []string{".gz", ".json", ".pickle", ".trace", ".pt"} {
		base = strings.TrimSuffix(base, ext)
	}
	if base == path {
		base = strings.TrimSuffix(path, filepath.Ext(path))
	}
	return base + ".stats.json"
}

// settingsText writes settings as key=value pairs, sorted, or "default".
func settingsText(s map[string]string) string {
	if len(s) == 0 {
		return "default"
	}
	return policies.Settings(s).Join(" ")
}

// Check replays the inputs with run and writes their lines to w, then a
// line per job (WriteJob). The real allocator's figures beside every trace
// (MeasuredPath) are read before any replay, so that a figures file that
// cannot be read stops it before anything is written. It returns how many
// traces differ from their recording, and the first error: a figures file,
// a trace or a replay that failed (named).
func Check(w io.Writer, inputs []*Input, jobs []*Job, run Run) (diverged int, err error) {
	for _, in := range inputs {
		in.mpath = MeasuredPath(in.path)
		if _, err := os.Stat(in.mpath); err == nil {
			if in.measured, err = sim.ReadMeasured(in.mpath); err != nil {
				return 0, err
			}
		}
	}
	for _, in := range inputs {
		if err := run.Replay(w, in); err != nil {
			return 0, err
		}
		if in.differs {
			diverged++
		}
	}
	for _, j := range jobs {
		WriteJob(w, j)
	}
	return diverged, nil
}
