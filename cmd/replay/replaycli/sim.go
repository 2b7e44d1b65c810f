package replaycli

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/cmd/internal/cli"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/plots"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/sim/sites"
	"github.com/gpualloc/allocsim/sim/sweep"
	"github.com/gpualloc/allocsim/sim/viz"
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
	if err := atomicfile.CheckDir(inputs, "plots", *plotDir, plots.FileSuffixes()); err != nil {
		return err
	}
	vizSuffixes := make([]string, len(names))
	for k, n := range names {
		vizSuffixes[k] = "." + n + ".pickle"
	}
	if err := atomicfile.CheckDir(inputs, "viz", *vizOut, vizSuffixes); err != nil {
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
		made := model.Made
		if made == "" {
			made = "no note of where or when it was measured (replay calibrate writes one)"
		}
		fmt.Fprintf(stderr, "sim: cost model %s: %s\n", cli.Safe(*costModel), cli.Safe(made))
	}
	// Every output (the files of --json, --csv, --sites-csv, --plots and
	// --viz) is staged and put in place at the end, all together or none.
	outs := &atomicfile.Outputs{Stdout: stdout}
	defer outs.Abort()
	vd := viz.NewDir(*vizOut, &outs.Batch)
	in := sweep.Inputs{Paths: inputs, From: *from, Device: dev, AllDevices: allDevices, Jobs: *jobs, Viz: vd,
		Configs: func(name string) []sim.Config {
			cfgs := make([]sim.Config, len(names))
			for k, n := range names {
				cfgs[k] = sim.Config{Trace: name, Policy: n, Settings: settings[n], Capacity: capBytes, CardCapacity: !fs.Changed("capacity"), AsRecorded: *asRecorded, Check: *check, Strict: *strict, CostModel: model}
			}
			return cfgs
		}}
	if *sitesN > 0 {
		in.Sites = &sites.Options{Depth: *siteDepth, Top: *sitesN}
	}
	rs, err := sweep.RunInputs(in)
	if err != nil {
		return err
	}
	if w := vd.Warning(); w != "" {
		fmt.Fprintf(stderr, "sim: %s\n", w)
	}
	if n := tables.Warnings(stderr, rs); n > 0 && *strict {
		return fmt.Errorf("--strict: %d warning(s); nothing written", n)
	}
	// The jobs among the traces: each rank's result says its rank, and
	// the JSON lists the jobs after the results.
	jobSums := job.Summarize(rs)
	job.MarkRanks(jobSums)
	// The outputs are all written or none: the files are staged, the
	// charts drawn, the table made, and the files committed only then.
	for _, o := range []struct {
		flag, path string
		write      func(io.Writer) error
	}{
		{"json", *jsonOut, func(w io.Writer) error { return writeJobsJSON(w, rs, jobSums) }},
		{"csv", *csvOut, func(w io.Writer) error { return results.WriteCSV(w, rs) }},
		{"sites-csv", *sitesCSV, func(w io.Writer) error { return results.WriteSitesCSV(w, rs) }},
	} {
		if err := outs.Add(o.flag, o.path, o.write); err != nil {
			return err
		}
	}
	if *plotDir != "" {
		flat := make([]sim.Result, len(rs))
		for i, r := range rs {
			flat[i] = *r
		}
		if err := plots.StageAll(&outs.Batch, *plotDir, flat, plots.Options{Policies: shown}); err != nil {
			return fmt.Errorf("--plots: %w", err)
		}
	}
	// The table goes to stdout unless the JSON or CSV does.
	if *jsonOut != "-" && *csvOut != "-" && *sitesCSV != "-" {
		if err := outs.Add("", "-", func(w io.Writer) error {
			tables.Sim(w, rs, *wide)
			tables.Sites(w, rs)
			writeSettingsUsed(w, rs, settings)
			tables.Jobs(w, jobSums)
			return nil
		}); err != nil {
			return err
		}
	}
	return outs.Commit()
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

// writeJobsJSON writes sim results and the jobs among them (job.Summary)
// as a results file of kind "sim", the jobs listed after the results.
func writeJobsJSON(w io.Writer, rs []*sim.Result, sums []*job.Summary) error {
	jobs := make([]*results.Job, len(sums))
	for i, s := range sums {
		jobs[i] = s.Record()
	}
	return results.WriteSimJobs(w, rs, jobs)
}
