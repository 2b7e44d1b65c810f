package replaycli

import (
	"bytes"
	"fmt"
	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/sites"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const simUsage = `usage: replay sim [--policy NAME[,NAME...]|all] [--capacity SIZE] [--set NAME.key=value]...
                  [--json FILE] [--csv FILE] [--plots DIR [--plot-policy LIST]] [--viz DIR] [-j N] TRACE...

Replays each trace against the policies on a simulated device and prints,
per trace and policy, the peak requested, allocated and reserved bytes and
the device footprint (MiB), reserved against requested and against offline,
fragmentation (the free reserved memory that could not serve a request
the policy grew for, at its worst) and the idle share at the peak (1 -
allocated/reserved), device calls, simulated allocator time (ms, the H200
cost model), retries and OOMs (docs/results.md defines each). A recording is replayed as recorded
(its allocator settings, its addresses); --set overrides one setting. The
capacity holds the reserved bytes (a per-process cap); without --capacity a
trace that names its card (record run, an XSpace) is replayed on it, less
the context. Warnings go to stderr and into the JSON.

The per-rank traces of a multi-GPU job (names with "rank" and a number:
job.rank0.trace, as record run names a launcher's processes, or
rank0_memory_snapshot.pickle; a directory or a glob gives the traces in
it) are each replayed on a device of their own,
and a line per job and policy follows the table: the largest and smallest
rank's peak reserved bytes and their spread, the largest footprint, the
ranks that ran out of memory and the first of them in time (the job fails
there).

Flags:
`

func runSim(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), simUsage)
		fs.PrintDefaults()
	}
	policyList := fs.String("policy", "all", "policies to replay, a comma-separated `LIST` of names, or all ("+strings.Join(policies.Names(), ", ")+")")
	capacity := fs.String("capacity", "0", "device capacity `SIZE`: bytes or a size like 4000MiB, 24GiB (0 = unlimited; not given: the card a record run trace names, less its context)")
	sets := fs.StringArray("set", nil, "a policy setting `NAME.key=value` (repeatable)")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE` (- for stdout)")
	csvOut := fs.String("csv", "", "write the results as CSV to `FILE` (- for stdout)")
	plotDir := fs.String("plots", "", "write charts (PNG and SVG) into `DIR`")
	plotList := fs.String("plot-policy", "", plotPolicyDoc)
	vizOut := fs.String("viz", "", "write each replay's allocator history as a PyTorch memory snapshot `DIR`/TRACE.POLICY.pickle (for torch.cuda._memory_viz)")
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.String("device", "0", "device `N` of a trace that holds several (a PyTorch snapshot's device, a torch.profiler trace's Device Id, a CuPy log's device_id, an XSpace's GPU_N_bfc), or all: every device of a multi-device PyTorch snapshot, each as a rank of a job (TRACE#rankN)")
	check := fs.Bool("check", false, "check the placement invariants after each event (no overlapping blocks, every block in a live segment, reserved bytes, no block handed out twice); stop at the first violation")
	wide := fs.Bool("wide", false, "print every column of the table (requested, allocated, retries, the first OOM...), not the compact one that fits 120 columns")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "replay the policies in `N` groups at once, each group one pass over the trace (the results are the same; default: every core)")
	fs.Lookup("jobs").DefValue = "0" // every core, said in the usage: not this machine's count in the help
	strict := fs.Bool("strict", false, "stop at the trace's first semantic problem (free of an unknown address, double free, malloc of a live address, of 0 bytes or over 1 PiB, time going backwards) instead of counting it, and exit non-zero with nothing written on any warning")
	costModel := fs.String("cost-model", "", "charge the device calls to the cost model in `FILE` (from replay calibrate) instead of the embedded H200 one")
	sitesN := fs.Int("sites", 0, "after the table, the top `N` allocation sites of each policy at its peak of reserved bytes: live bytes and count, and their share of the unused reserved bytes (a second replay up to the peak; sites_at_peak in the JSON)")
	siteDepth := fs.Int("site-depth", 1, "`N` frames of user code name a site (see --sites)")
	sitesCSV := fs.String("sites-csv", "", "write the --sites rows as CSV to `FILE` (- for stdout)")
	asRecorded := fs.Bool("as-recorded", true, "replay a recording as recorded: with the allocator settings it records (--set overrides them) and at its recorded addresses")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("sim: no trace given")}
	}
	allDevices, dev := *device == "all", 0
	if !allDevices {
		var err error
		if dev, err = strconv.Atoi(*device); err != nil {
			return cli.UsageError{Err: fmt.Errorf("--device %q: want a device index or all", *device)}
		}
	}
	// A directory or a glob stands for the traces in it (a job's ranks).
	inputs, notes, err := tracefile.Glob(fs.Args())
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(stderr, "sim: %s\n", cli.Safe(n))
	}
	if err := checkOutputs(inputs, "json", *jsonOut, "csv", *csvOut, "sites-csv", *sitesCSV); err != nil {
		return err
	}
	if *sitesN < 0 || *siteDepth < 1 || (*sitesCSV != "" || fs.Changed("site-depth")) && *sitesN == 0 {
		return cli.UsageError{Err: fmt.Errorf("--sites %d --site-depth %d: want --sites of at least 1 (with --sites-csv or --site-depth) and a depth of at least 1", *sitesN, *siteDepth)}
	}
	capBytes, err := policies.ParseCapacity(*capacity)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--capacity: %v", err)}
	}
	if *jobs < 1 {
		return cli.UsageError{Err: fmt.Errorf("-j %d: want at least 1", *jobs)}
	}
	names, err := policyNames(*policyList)
	if err != nil {
		return err
	}
	settings, err := parseSets(*sets, names)
	if err != nil {
		return err
	}
	// The charts and snapshots go into directories, under names made of
	// the traces' and the policies': no input may be one of them.
	if err := checkDirOutput(inputs, "plots", *plotDir, plots.FileSuffixes()); err != nil {
		return err
	}
	vizSuffixes := make([]string, len(names))
	for k, n := range names {
		vizSuffixes[k] = "." + n + ".pickle"
	}
	if err := checkDirOutput(inputs, "viz", *vizOut, vizSuffixes); err != nil {
		return err
	}
	shown, err := plotPolicies(*plotList, *plotDir, names)
	if err != nil {
		return err
	}
	var model *sim.CostModel
	if *costModel != "" {
		if model, err = sim.LoadCostModel(*costModel); err != nil {
			return fmt.Errorf("--cost-model: %w", err)
		}
	}
	var results []*sim.Result
	// Every output (the files of --json, --csv, --sites-csv, --plots and
	// --viz) is staged and put in place at the end, all together or none.
	outs := &outputSet{out: stdout}
	defer outs.abort()
	vd := newVizDir(*vizOut, &outs.batch)
	for _, path := range inputs {
		devs := []int{dev}
		if allDevices {
			n, err := deviceCount(path, *from)
			if err != nil {
				return err
			}
			devs = devs[:0]
			for d := range n {
				devs = append(devs, d)
			}
		}
		for _, d := range devs {
			// Each device of a multi-device snapshot is a rank of a job.
			name := path
			if len(devs) > 1 {
				name = fmt.Sprintf("%s#rank%d", path, d)
			}
			cfgs := make([]sim.Config, len(names))
			for k, n := range names {
				cfgs[k] = sim.Config{Trace: name, Policy: n, Settings: settings[n], Capacity: capBytes, CardCapacity: !fs.Changed("capacity"), AsRecorded: *asRecorded, Check: *check, Strict: *strict, CostModel: model}
			}
			vr, err := vd.start(name, cfgs)
			if err != nil {
				return err
			}
			j := *jobs
			if *vizOut != "" {
				j = 1 // one history recorder for the trace's policies
			}
			res, err := sweep.RunFileParallel(path, tracefile.Options{From: *from, Device: d}, j, cfgs...)
			if err == nil {
				err = tracefile.NameError(path, vr.finish())
			} else {
				vr.abort()
			}
			if err == nil && *sitesN > 0 {
				err = addSites(path, tracefile.Options{From: *from, Device: d}, cfgs, res, sites.Options{Depth: *siteDepth, Top: *sitesN})
			}
			if err != nil {
				return err
			}
			results = append(results, res...)
		}
	}
	if w := vd.warning(); w != "" {
		fmt.Fprintf(stderr, "sim: %s\n", w)
	}
	if n := writeWarnings(stderr, results); n > 0 && *strict {
		return fmt.Errorf("--strict: %d warning(s); nothing written", n)
	}
	// The jobs among the traces: each rank's result says its rank, and
	// the JSON lists the jobs after the results.
	jobSums := job.Summarize(results)
	job.MarkRanks(jobSums)
	// The outputs are all written or none: the files are staged, the
	// charts drawn, the table made, and the files committed only then.
	for _, o := range []struct {
		flag, path string
		write      func(io.Writer) error
	}{
		{"json", *jsonOut, func(w io.Writer) error { return writeJobsJSON(w, results, jobSums) }},
		{"csv", *csvOut, func(w io.Writer) error { return writeCSV(w, results) }},
		{"sites-csv", *sitesCSV, func(w io.Writer) error { return writeSitesCSV(w, results) }},
	} {
		if err := outs.add(o.flag, o.path, o.write); err != nil {
			return err
		}
	}
	if *plotDir != "" {
		flat := make([]sim.Result, len(results))
		for i, r := range results {
			flat[i] = *r
		}
		if err := plots.StageAll(&outs.batch, *plotDir, flat, plots.Options{Policies: shown}); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
	}
	// The table goes to stdout unless the JSON or CSV does.
	if *jsonOut != "-" && *csvOut != "-" && *sitesCSV != "-" {
		if err := outs.add("", "-", func(w io.Writer) error {
			writeTable(w, results, *wide)
			writeSites(w, results)
			writeSettingsUsed(w, results, settings)
			writeJobs(w, jobSums)
			return nil
		}); err != nil {
			return err
		}
	}
	return outs.commit()
}

// deviceCount returns the number of devices the trace at path holds: a
// PyTorch snapshot's device traces (its Metadata "devices"), 1 for the
// other formats.
func deviceCount(path, from string) (int, error) {
	f, err := tracefile.Open(path, tracefile.Options{From: from})
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if n, err := strconv.Atoi(f.Header().Metadata["devices"]); err == nil && n > 0 {
		return n, nil
	}
	return 1, nil
}

// writeJobs prints, for each job among the traces (per-rank traces,
// job.Rank) and each policy, the job's figures: the largest and smallest
// rank's peak reserved bytes and their spread, the largest footprint, and
// the ranks that ran out of memory, the first of them in time.
func writeJobs(w io.Writer, sums []*job.Summary) {
	if len(sums) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\tpolicy\tranks\tmax reserved MiB\t(rank)\tmin\t(rank)\tspread\tmax footprint MiB\t(rank)\tOOM ranks\tfirst OOM\t")
	for _, s := range sums {
		ooms, first := "-", "-"
		if len(s.OOMRanks) > 0 {
			ooms = joinInts(s.OOMRanks)
			first = "order unknown"
			if s.FirstOOMRank >= 0 {
				first = fmt.Sprintf("rank %d, event %d", s.FirstOOMRank, s.FirstOOMEvent)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\t%.1f%%\t%s\t%d\t%s\t%s\t\n", cli.Safe(filepath.Base(s.Job)), cli.Safe(s.Policy), len(s.Ranks),
			mib(s.MaxReserved), s.MaxReservedRank, mib(s.MinReserved), s.MinReservedRank, 100*s.Spread(),
			mib(s.MaxFootprint), s.MaxFootprintRank, ooms, first)
	}
	tw.Flush()
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// checkOutputs returns an error naming the flag when one of the output
// files (pairs of flag name and path) is one of the inputs
// (atomicfile.CheckOutput), before any work is done.
func checkOutputs(inputs []string, flagPaths ...string) error {
	seen := map[string]string{} // a cleaned output path, or "-", -> its flag
	for i := 0; i+1 < len(flagPaths); i += 2 {
		flag, path := flagPaths[i], flagPaths[i+1]
		if err := atomicfile.CheckOutput(path, inputs); err != nil {
			return fmt.Errorf("--%s: %w", flag, err)
		}
		if path == "" {
			continue
		}
		if path == "-" {
			if other, ok := seen["-"]; ok {
				return cli.UsageError{Err: fmt.Errorf("--%s -: the --%s output goes to stdout already", flag, other)}
			}
			seen["-"] = flag
			continue
		}
		if other, ok := seen[filepath.Clean(path)]; ok {
			return cli.UsageError{Err: fmt.Errorf("--%s %s: also the --%s output", flag, path, other)}
		}
		seen[filepath.Clean(path)] = flag
	}
	return nil
}

// checkDirOutput returns an error naming the flag when dir, a directory
// an option writes files into, is one of the inputs, or holds an input
// whose name ends with one of suffixes (the endings of the names of the
// files it writes there, compared without regard to case, as on a file
// system that ignores it): an input that a file written there could
// replace. It is called before any work is done; "" (no directory) and a
// directory that does not exist yet hold no input.
func checkDirOutput(inputs []string, flag, dir string, suffixes []string) error {
	if dir == "" {
		return nil
	}
	if err := atomicfile.CheckOutput(dir, inputs); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	di, err := os.Stat(dir)
	if err != nil || !di.IsDir() {
		return nil
	}
	for _, in := range inputs {
		pi, err := os.Stat(filepath.Dir(in))
		if err != nil || !os.SameFile(di, pi) {
			continue
		}
		base := strings.ToLower(filepath.Base(in))
		for _, s := range suffixes {
			if strings.HasSuffix(base, strings.ToLower(s)) {
				return fmt.Errorf("--%s %s: its file %s %w", flag, dir, filepath.Base(in), atomicfile.ErrInput)
			}
		}
	}
	return nil
}

// outputSet is a command's outputs, staged and put in place together:
// files in a batch (atomicfile.Batch) and the bytes for stdout ("-" or the
// table) in memory, written to out before the files are put in place (a
// full disk or a closed pipe there leaves the files as they were).
type outputSet struct {
	out    io.Writer // stdout
	batch  atomicfile.Batch
	stdout []stdoutPart
}

// stdoutPart is an output for stdout: its flag ("" for the table) and its
// bytes.
type stdoutPart struct {
	flag string
	buf  *bytes.Buffer
}

// add stages the output of --flag: the bytes write produces, for a file at
// path or for stdout when path is "-"; "" is no output. It returns write's
// error or the file's, naming the flag; the file is then not staged.
func (o *outputSet) add(flag, path string, write func(io.Writer) error) error {
	switch path {
	case "":
		return nil
	case "-":
		b := new(bytes.Buffer)
		if err := write(b); err != nil {
			return flagError(flag, err)
		}
		o.stdout = append(o.stdout, stdoutPart{flag: flag, buf: b})
		return nil
	}
	if err := o.batch.WriteFile(path, write); err != nil {
		return flagError(flag, err)
	}
	return nil
}

func flagError(flag string, err error) error {
	if flag == "" {
		return err
	}
	return fmt.Errorf("--%s: %w", flag, err)
}

// commit writes the stdout parts in order to out, then puts the staged
// files in place, all of them or none. It returns the first error, naming
// the flag of a stdout part that could not be written; the files are then
// not put in place.
func (o *outputSet) commit() error {
	for _, p := range o.stdout {
		if _, err := o.out.Write(p.buf.Bytes()); err != nil {
			if p.flag == "" {
				return fmt.Errorf("writing standard output: %w", err)
			}
			return fmt.Errorf("--%s -: %w", p.flag, err)
		}
	}
	o.stdout = nil
	return o.batch.Commit()
}

// abort drops the outputs not committed. It is safe to defer.
func (o *outputSet) abort() {
	o.batch.Abort()
	o.stdout = nil
}

// writeOutput writes an output file atomically, or to stdout when path is
// "-".
func writeOutput(stdout io.Writer, path string, write func(io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	return atomicfile.WriteFile(path, write)
}

// policyNames expands a --policy value (policies.ParseList).
func policyNames(list string) ([]string, error) {
	names, err := policies.ParseList(list, policies.Names())
	if err != nil {
		return nil, cli.UsageError{Err: fmt.Errorf("--policy: %w", err)}
	}
	return names, nil
}

// parseSets turns --set values into settings by policy (policies.ParseSets).
func parseSets(sets []string, names []string) (map[string]policies.Settings, error) {
	out, err := policies.ParseSets(sets, policies.Names(), names)
	if err != nil {
		return nil, cli.UsageError{Err: fmt.Errorf("--set %w", err)}
	}
	return out, nil
}

// writeJSON writes sim results as a results file of kind "sim".
func writeJSON(w io.Writer, rs []*sim.Result) error { return results.WriteSim(w, rs) }

// writeJobsJSON writes sim results and the jobs among them (job.Summary)
// as a results file of kind "sim", the jobs listed after the results.
func writeJobsJSON(w io.Writer, rs []*sim.Result, sums []*job.Summary) error {
	jobs := make([]*results.Job, len(sums))
	for i, s := range sums {
		jobs[i] = s.Record()
	}
	return results.WriteSimJobs(w, rs, jobs)
}

// writeCSV writes sim results as CSV, with the columns of every command.
func writeCSV(w io.Writer, rs []*sim.Result) error { return results.WriteCSV(w, rs) }

// mib formats bytes as MiB with one decimal (plots.MiBText).
func mib(b uint64) string { return plots.MiBText(b) }

// ratioText formats a ratio with three decimals, "-" where it is unknown.
func ratioText(ratio float64, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.FormatFloat(ratio, 'f', 3, 64)
}

// writeTable prints the table of results, rows in the order of their
// figures (results.ByFigure), every column with wide.
func writeTable(w io.Writer, rs []*sim.Result, wide bool) {
	if !wide {
		writeCompactTable(w, rs)
		return
	}
	names := resultNames(rs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	best, vsBest := bestColumn(rs)
	fmt.Fprintln(tw, "trace\tpolicy\trequested MiB\tallocated MiB\treserved MiB\tfootprint MiB\treserved/requested\treserved/"+best+"\tfragmentation\tidle at peak\t1-peak allocated/peak reserved\tdevice allocs\tdevice frees\talloc ms\tretries\tOOMs\tfirst OOM (event, bytes)\t")
	for _, r := range results.ByFigure(rs) {
		ratio, vsOffline := ratioText(r.ReservedOverRequested()), ratioText(vsBest(r))
		first := "-"
		if r.OOMs > 0 {
			first = fmt.Sprintf("%d, %d", r.FirstOOMEvent, r.FirstOOMSize)
		}
		frag := r.PeakUnallocatedShare()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t%.1f%%\t%d\t%d\t%.1f\t%d\t%d\t%s\t\n",
			names[r.Trace], cli.Safe(r.Policy), mib(r.PeakRequested), mib(r.PeakAllocated), mib(r.PeakReserved), mib(r.PeakFootprint),
			ratio, vsOffline, 100*r.PeakFragmentation, 100*r.IdleAtPeak, 100*frag, r.DeviceAllocs, r.DeviceFrees, float64(r.SimAllocTimeNS)/1e6, r.AllocRetries, r.OOMs, first)
	}
	tw.Flush()
	writeNotes(w, rs)
}

// writeCompactTable prints the table that fits 120 columns: per trace and
// policy the peak reserved bytes and footprint (MiB), reserved against
// the peak requested and against offline (against the proven optimum
// instead where the optimal policy proved one: bestColumn), the peak
// fragmentation
// (Result.PeakFragmentation) and the idle share at the peak reserved
// bytes (1 - allocated/reserved), device calls (allocations and frees),
// simulated allocator time (ms) and OOMs; --wide prints every column.
func writeCompactTable(w io.Writer, rs []*sim.Result) {
	names := resultNames(rs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	best, vsBest := bestColumn(rs)
	fmt.Fprintln(tw, "trace\tpolicy\treserved MiB\tfootprint MiB\t×req\t×"+best+"\tfrag\tidle\tcalls\talloc ms\tOOMs\t")
	for _, r := range results.ByFigure(rs) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t%d\t%.1f\t%d\t\n",
			names[r.Trace], cli.Safe(r.Policy), mib(r.PeakReserved), mib(r.PeakFootprint), ratioText(r.ReservedOverRequested()), ratioText(vsBest(r)),
			100*r.PeakFragmentation, 100*r.IdleAtPeak, r.DeviceAllocs+r.DeviceFrees, float64(r.SimAllocTimeNS)/1e6, r.OOMs)
	}
	tw.Flush()
	writeNotes(w, rs)
}

// bestColumn returns the name of the table's column that measures peak
// reserved bytes against the best known placement, and its figure: the
// proven optimum (Result.PeakOptimum, the optimal policy's) where some
// result has one, "-" for a trace without; else the offline heuristic's
// peak.
func bestColumn(rs []*sim.Result) (string, func(*sim.Result) (float64, bool)) {
	for _, r := range rs {
		if r.PeakOptimum > 0 {
			return "optimum", (*sim.Result).ReservedOverOptimum
		}
	}
	return "offline", (*sim.Result).ReservedOverOffline
}

// writeNotes prints what a table of results does not say: the bounds and
// the capacity taken from the card (warnings go to stderr: writeWarnings).
func writeNotes(w io.Writer, results []*sim.Result) {
	// The trace's peak requested is the largest of its results' (a
	// policy's counts the requests it failed too: the program held them).
	lower, served := map[string]uint64{}, map[string]bool{}
	for _, r := range results {
		lower[r.Trace] = max(lower[r.Trace], r.PeakRequested)
		served[r.Trace] = served[r.Trace] || r.OOMs == 0
	}
	bounds := map[string]bool{}
	for _, r := range results {
		if r.PeakOffline > 0 && !bounds[r.Trace] {
			bounds[r.Trace] = true
			how := "every malloc served"
			if !served[r.Trace] {
				how = "at least: every policy ran out of memory"
			}
			fmt.Fprintf(w, "%s: hard lower bound (peak requested, %s) %d bytes; a row with OOMs counts in its requested column the requests it failed too; offline (clairvoyant heuristic placement, not the optimum) %d bytes\n", cli.Safe(r.Trace), how, lower[r.Trace], r.PeakOffline)
		}
	}
	for _, r := range results {
		if p := r.Plan; p != nil {
			if p.Proven {
				// (No time: the line stays the same from run to run; the
				// JSON has it.)
				fmt.Fprintf(w, "%s: %s: least peak of any fixed-address placement %d bytes, proven (%d search nodes)\n", cli.Safe(r.Trace), cli.Safe(r.Policy), p.Height, p.Nodes)
			} else {
				gap, _ := p.Gap()
				why := map[string]string{"time": "its time limit", "nodes": "its node budget", "pairs": "too many blocks live at once to search"}[p.Stopped]
				if why == "" {
					why = cli.Safe(p.Stopped)
				}
				fmt.Fprintf(w, "%s: %s: best placement found %d bytes, proven lower bound %d bytes (gap %.4f%%), not proven: stopped by %s (%.1f s, %d search nodes)\n", cli.Safe(r.Trace), cli.Safe(r.Policy), p.Height, p.LowerBound, 100*gap, why, p.Seconds, p.Nodes)
			}
		}
	}
	carded := map[string]bool{}
	for _, r := range results {
		if r.CapacityFromCard && !carded[r.Trace] {
			carded[r.Trace] = true
			fmt.Fprintf(w, "%s: capacity %d bytes: the recorded card's %d bytes less its %d-byte context (--capacity overrides)\n", cli.Safe(r.Trace), r.Capacity, r.Capacity+sim.ContextBytes, uint64(sim.ContextBytes))
		}
	}

}

// writeWarnings prints the results' warnings (sim.Result.Warnings) to w,
// one line each: "TRACE: warning: TEXT" for one that every result of the
// trace has, "TRACE: POLICY: warning: TEXT" for one of some policies only;
// a warning several policies have but for their own names ("the P policy
// keeps ...") is one line naming them all ("TRACE: P, Q: warning: the P,
// Q policies keep ..."), at the first. It returns how many lines it
// printed.
func writeWarnings(w io.Writer, rs []*sim.Result) int {
	// A warning's text with the policy's own name taken out.
	generic := func(r *sim.Result, x string) string {
		return strings.ReplaceAll(x, "the "+r.Policy+" policy ", "the \x00 policy ")
	}
	perTrace := map[string]int{}
	has := map[[2]string][]string{} // the policies with the warning
	for _, r := range rs {
		perTrace[r.Trace]++
		for _, x := range r.Warnings {
			k := [2]string{r.Trace, generic(r, x)}
			has[k] = append(has[k], r.Policy)
		}
	}
	n := 0
	done := map[[2]string]bool{}
	for _, r := range rs {
		for _, x := range r.Warnings {
			k := [2]string{r.Trace, generic(r, x)}
			if done[k] {
				continue
			}
			done[k] = true
			switch ps := has[k]; {
			case len(ps) == perTrace[r.Trace] && k[1] == x:
				fmt.Fprintf(w, "%s: warning: %s\n", cli.Safe(r.Trace), cli.Safe(x))
			case len(ps) == 1:
				fmt.Fprintf(w, "%s: %s: warning: %s\n", cli.Safe(r.Trace), cli.Safe(r.Policy), cli.Safe(x))
			default:
				list := strings.Join(ps, ", ")
				text := strings.ReplaceAll(k[1], "the \x00 policy keeps ", "the "+list+" policies keep ")
				text = strings.ReplaceAll(text, "the \x00 policy ", "the "+list+" policies ")
				fmt.Fprintf(w, "%s: %s: warning: %s\n", cli.Safe(r.Trace), cli.Safe(list), cli.Safe(text))
			}
			n++
		}
	}
	return n
}
