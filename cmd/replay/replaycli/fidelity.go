package replaycli

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// runFidelity is `replay fidelity`: each trace replayed as recorded (the
// settings it records, the addresses it records) against the policy that
// simulates its allocator, compared with the recording event by event
// (sim.Fidelity). It prints "identical" or the first divergence per trace,
// then a line per multi-GPU job among the traces (fidelityJob), and
// returns an error when any trace diverges. The output is printed whole
// or, on an error other than a divergence, not at all.
func runFidelity(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("fidelity", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	capacity := fs.String("capacity", "", "device capacity `SIZE`: bytes or a size like 4000MiB (the recording's memory cap; 0 = none; default: the mem_cap_bytes (a CuPy log's limit_bytes) of the measured figures beside the trace, else none)")
	policy := fs.String("policy", "", "the `POLICY` that simulates the recorded allocator (default: the one of the trace's source: pytorch for PyTorch snapshots and torch.profiler traces, cupy for CuPy logs, bfc for XSpaces)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	sets := fs.StringArray("set", nil, "a setting `NAME.key=value` over the recorded ones (repeatable): what the trace does not record, such as a torch.profiler trace's pytorch.expandable_segments=True")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: replay fidelity [--policy NAME] [--capacity SIZE] [--set NAME.key=value] [--from FORMAT] [--device N] TRACE|DIR|GLOB...

Replays each trace as recorded and compares the simulated device calls and
placements with the recorded ones, event by event, and, where the real
allocator's figures lie beside the trace (NAME.stats.json for NAME.pickle.gz
or NAME.pt.trace.json.gz: max_memory_reserved, max_memory_allocated,
memory_stats, mem_cap_bytes; for a CuPy log NAME.jsonl: peak_total_bytes,
device_allocs, limit_bytes, ooms_caught), the peaks and counters with them:
peak reserved and allocated bytes, device allocations and frees, retries and
OOMs (exit 1 if anything differs). For an XSpace the figures are JAX's
memory_stats() in NAME.json beside NAME.xplane.pb.gz (under "stats" or
"memory_stats"), else those its BFC events record: peak allocated bytes and
mallocs; bfc then runs with the memory limit and the preallocation
memory_stats() implies (bytes_limit; allow_growth=false where the pool
peaked at the whole limit), --set over them. A figures file beside a trace
that holds none of these figures is an error.

A multi-GPU job is replayed rank by rank, each rank on a device of its own:
a directory (the traces in it) or a glob (quote it) of per-rank traces is a
job, the rank of each trace taken from its name (rank0.pickle.gz,
job_rank_1.pickle.gz, snap-rank3.pickle.gz, or a folder rank2/) when every
trace names one, several jobs where the names say so, else from the order
of the traces (sorted by name); traces given one by one form a job when
their names say their ranks. After the traces, a line per job of two ranks
or more: the largest and smallest rank's peak reserved bytes and their
spread, the first rank to fail (out of memory first in time), and the ranks
whose replay differs from their recording.

Flags:
`)
		fs.PrintDefaults()
	}
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("fidelity: no trace given")}
	}
	setNames := []string{*policy}
	if *policy == "" {
		setNames = policies.Names() // the policy is chosen per trace
	}
	settings, err := parseSets(*sets, setNames)
	if err != nil {
		return err
	}
	var capBytes uint64
	if *capacity != "" {
		c, err := policies.ParseCapacity(*capacity)
		if err != nil {
			return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
		}
		capBytes = c
	}
	inputs, jobs, notes, err := fidelityInputs(fs.Args())
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(stderr, "fidelity: %s\n", cli.Safe(n))
	}
	// The figures beside every trace are read before any replay: a file
	// that cannot be compared stops the command with nothing printed.
	for _, in := range inputs {
		in.mpath = measuredPath(in.path)
		if _, err := os.Stat(in.mpath); err == nil {
			if in.measured, err = sim.ReadMeasured(in.mpath); err != nil {
				return err
			}
		}
	}
	var out bytes.Buffer
	diverged := 0
	run := fidelityRun{policy: *policy, settings: settings, capacity: capBytes, capacityGiven: *capacity != "", opts: tracefile.Options{From: *from, Device: *device}}
	for _, in := range inputs {
		if err := run.replay(&out, in); err != nil {
			return err
		}
		if in.differs {
			diverged++
		}
	}
	for _, j := range jobs {
		writeFidelityJob(&out, j)
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		return err
	}
	if diverged > 0 {
		return fmt.Errorf("fidelity: %d of %d traces diverge from their recording", diverged, len(inputs))
	}
	return nil
}

// fidelityInput is a trace replay fidelity replays, and what came of it.
type fidelityInput struct {
	path string
	// name names the trace in the output: its file name, and its rank
	// where the name does not say it.
	name string
	// job is the job the trace is a rank of (nil for none), rank its rank
	// there; rankShown says its file name shows the rank.
	job       *fidelityJob
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

// fidelityJob is a multi-GPU job among replay fidelity's traces.
type fidelityJob struct {
	// name names the job: the file name of its traces with the rank as
	// '*' (job.Rank), or the directory or glob that gave it.
	name string
	// ranks are its traces by ascending rank.
	ranks []*fidelityInput
}

// fidelityInputs expands replay fidelity's arguments into the traces to
// replay, in order, and the jobs of two ranks or more among them, in the
// order of their first trace. A file is a trace; its name may make it a
// rank of a job (rankOf), with the other files that name the same job. A
// directory or a glob gives the traces in it (tracefile.Glob), which are
// the ranks of the jobs their names say when every one names its rank,
// else of one job in the order of the traces (sorted by name). Errors: a
// directory or glob that gives no trace (tracefile.Glob's, or naming the
// directory), and two traces of one rank of a job, naming both. notes are what a directory's walk
// skipped.
func fidelityInputs(args []string) (inputs []*fidelityInput, jobs []*fidelityJob, notes []string, err error) {
	byKey := map[string]*fidelityJob{}
	var order []*fidelityJob
	seen := map[string]bool{}
	join := func(key, name string, in *fidelityInput) error {
		j := byKey[key]
		if j == nil {
			j = &fidelityJob{name: name}
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
			in := &fidelityInput{path: a}
			if pattern, rank, shown, ok := rankOf(a); ok {
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
			if _, _, _, ok := rankOf(p); !ok {
				named = false
			}
		}
		var group []*fidelityInput
		for k, p := range paths {
			if seen[p] {
				continue
			}
			seen[p] = true
			in := &fidelityInput{path: p, rank: k}
			if named {
				pattern, rank, shown, _ := rankOf(p)
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
		pos := map[*fidelityJob]int{}
		for _, in := range group {
			if _, ok := pos[in.job]; !ok {
				pos[in.job] = len(pos)
			}
		}
		slices.SortStableFunc(group, func(x, y *fidelityInput) int {
			return cmp.Or(cmp.Compare(pos[x.job], pos[y.job]), cmp.Compare(x.rank, y.rank))
		})
		inputs = append(inputs, group...)
	}
	for _, j := range order {
		slices.SortStableFunc(j.ranks, func(x, y *fidelityInput) int { return cmp.Compare(x.rank, y.rank) })
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

// rankOf returns the job a trace's path names and its rank there
// (job.Rank), from its file name (job.rank1.pickle.gz), or else from the
// name of its folder (rank1/snapshot.pickle.gz, the job then
// rank*/snapshot.pickle.gz); inName says it came from the file name. It
// reports false for a path that names no rank.
func rankOf(path string) (pattern string, rank int, inName, ok bool) {
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

// jobName names the job of a rankOf pattern in the output: by its file
// name (job.rank*.pickle.gz), with its folder where the folder says the
// rank (rank*/snapshot.pickle.gz).
func jobName(pattern string, inName bool) string {
	if inName {
		return filepath.Base(pattern)
	}
	return filepath.Join(filepath.Base(filepath.Dir(pattern)), filepath.Base(pattern))
}

// fidelityRun is what replay fidelity replays every trace with.
type fidelityRun struct {
	policy        string // "" for the one of the trace's source
	settings      map[string]policies.Settings
	capacity      uint64
	capacityGiven bool
	opts          tracefile.Options
}

// replay replays the trace of in as recorded, writes its lines to w and
// keeps its outcome in in. Errors (the trace's, the replay's) name the
// trace.
func (o fidelityRun) replay(w io.Writer, in *fidelityInput) error {
	path, measured, mpath := in.path, in.measured, in.mpath
	capBytes := o.capacity
	if !o.capacityGiven && measured != nil {
		capBytes = measured.Cap
	}
	f, err := tracefile.Open(path, o.opts)
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
	pol := o.policy
	if pol == "" {
		var known bool
		if pol, known = policies.SourcePolicy(f.Header().Source); !known {
			f.Close()
			return fmt.Errorf("%s: no real allocator recorded: a %s trace holds no allocator's decisions to compare with (fidelity holds a simulation to a recording of PyTorch's, CuPy's or XLA's allocator; --policy NAME compares a policy with the device calls the trace does hold)", path, cli.Safe(f.Header().Source))
		}
	}
	run := o.settings[pol]
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
	name, pol := cli.Safe(in.name), cli.Safe(pol) // as printed
	// What the recording does not show, inferred or not, whatever
	// the verdict: a figure that agrees may rest on it.
	if iw := sim.InferredWarning(rep.Result); iw != "" {
		fmt.Fprintf(w, "%s: warning: %s\n", name, cli.Safe(iw))
	}
	if w2 := rep.Result.PoolWarning; w2 != "" {
		fmt.Fprintf(w, "%s: warning: %s\n", name, cli.Safe(w2))
	}
	if d := rep.Divergence; d != nil {
		in.differs, in.stopped = true, true
		fmt.Fprintf(w, "%s: diverges at %s (policy %s)\n", name, cli.Safe(d.String()), pol)
		if hint := sim.CapacityWarning(rep.Result); hint != "" {
			fmt.Fprintf(w, "%s: %s\n", name, cli.Safe(hint))
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
				fmt.Fprintf(w, "%s:   %s\n", name, cli.Safe(d))
			}
			return nil
		}
	}
	if a := rep.Result.Anomalies; a > 0 {
		// The real allocator replays its own recording whole: events
		// that cannot be replayed are a damaged or foreign recording.
		in.differs = true
		fmt.Fprintf(w, "%s: %d event(s) could not be replayed as recorded (first: %s): not a whole recording of the allocator (policy %s)\n", name, a, cli.Safe(rep.Result.FirstAnomaly), pol)
		return nil
	}
	if measured == nil {
		against = "no measured figures beside it"
	}
	if noCalls {
		fmt.Fprintf(w, "%s: figures agree (%d mallocs, no device call recorded; %s; policy %s, settings %s)\n",
			name, rep.Mallocs, against, pol, cli.Safe(settingsText(rep.Result.Settings)))
		return nil
	}
	fmt.Fprintf(w, "%s: identical (%d device calls, %d mallocs; %s; policy %s, settings %s)\n",
		name, rep.Calls, rep.Mallocs, against, pol, cli.Safe(settingsText(rep.Result.Settings)))
	return nil
}

// writeFidelityJob writes the line of a job replayed rank by rank: the
// largest and smallest rank's peak reserved bytes (job.Summary), their
// spread, the first rank to fail (its first OOM first in time: where the
// job fails) and the ranks whose replay differs from their recording
// (those that stopped at a divergence count their figures up to it).
func writeFidelityJob(w io.Writer, j *fidelityJob) {
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
		cli.Safe(s.Job), len(s.Ranks), cli.Safe(s.Policy), s.MaxReserved, s.MaxReservedRank, s.MinReserved, s.MinReservedRank, 100*s.Spread())
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

// measuredPath returns where the real allocator's figures for the trace at
// path lie: NAME.stats.json beside NAME.pickle.gz (or NAME.pickle,
// NAME.pt.trace.json.gz, NAME.json.gz, NAME.json, or any other file
// NAME.EXT).
//
// An XSpace's lie in NAME.json beside NAME.xplane.pb(.gz), as
// testdata/jax/record.py writes JAX's memory_stats().
func measuredPath(path string) string {
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
