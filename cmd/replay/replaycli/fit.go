package replaycli

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/internal/progress"

	"github.com/spf13/pflag"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/fit"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/results/tables"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

const fitUsage = `usage: replay fit [--policy LIST|all] [--set NAME.key=value]... [--cards SIZE,...] [--json FILE] TRACE...

For each trace and policy, the smallest device capacity in bytes at which the
replay has no OOM (the malloc that failed in the source, if any, included),
found by bisection over capacities (a capacity holds the reserved bytes, as a
per-process cap does); the smallest card, the context (--context) plus the
smallest capacity at which the replay on a card has no OOM (a card holds the
footprint: the memory the segments take as the driver takes them, whole 2 MiB
pages above 1 MiB); and the answer for common card sizes, each replayed on the
card, its capacity less the context. Results need not be monotone in capacity (a
smaller device can make a caching policy release its cache earlier): probes
above and below the answer check it, and the table says where a capacity
above the smallest one runs out of memory.

Flags:
`

func runFit(stdout, stderr io.Writer, args []string) error {
	fs := pflag.NewFlagSet("fit", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), fitUsage)
		fs.PrintDefaults()
	}
	policyList := fs.String("policy", "all", "policies, a comma-separated `LIST` of names, or all ("+strings.Join(policies.Names(), ", ")+")")
	sets := fs.StringArray("set", nil, "a policy setting `NAME.key=value` (repeatable)")
	cardList := fs.String("cards", fit.DefaultCards, "`CARDS` to answer for, comma-separated: names (H200, A100-40GB: the memory CUDA reports for them, as measured; T4-16GB, H100-80GB: nominal) or sizes (GB are 10^9 bytes)")
	contextSize := fs.String("context", strconv.FormatUint(fit.DefaultContext, 10), "`BYTES` of a card the device's context holds before the first allocation (the H200's measured; a card's memory less this holds the footprint)")
	jsonOut := fs.String("json", "", "write the results as JSON to `FILE` (- for stdout)")
	jobs := fs.IntP("jobs", "j", runtime.NumCPU(), "`N` policies searched in parallel (default: every core)")
	fs.Lookup("jobs").DefValue = "0" // every core, said in the usage: not this machine's count in the help
	from := fs.String("from", "auto", "`FORMAT` of the traces: auto, "+strings.Join(tracefile.Formats, ", "))
	device := fs.Int("device", 0, cli.DeviceDoc)
	asRecorded := fs.Bool("as-recorded", true, "replay a recording as recorded, as replay sim does: with the allocator settings it records (--set overrides them) and at its recorded addresses")
	if help, err := cli.Parse(fs, args, stdout); help || err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return cli.UsageError{Err: fmt.Errorf("fit: no trace given")}
	}
	if err := checkOutputs(fs.Args(), "json", *jsonOut); err != nil {
		return err
	}
	names, err := policyNames(*policyList)
	if err != nil {
		return err
	}
	settings, err := parseSets(*sets, names)
	if err != nil {
		return err
	}
	context, err := policies.ParseSize(*contextSize)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--context: %v", err)}
	}
	cards, err := fit.ParseCards(*cardList)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--cards %w", err)}
	}
	var answers []*results.Fit
	counter := progress.NewCounter(stderr, "fit", -1)
	defer counter.Finish()
	for _, path := range fs.Args() {
		h, evs, err := tracefile.ReadAll(path, tracefile.Options{From: *from, Device: *device})
		if err != nil {
			return err
		}
		cfgs := make([]sim.Config, len(names))
		for k, n := range names {
			cfgs[k] = sim.Config{Trace: path, Policy: n, Settings: settings[n], AsRecorded: *asRecorded, Progress: counter.Progress()}
		}
		rs, err := fit.Trace(h, evs, cfgs, cards, context, *jobs)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		answers = append(answers, rs...)
	}
	warned := map[[2]string]bool{}
	for _, a := range answers {
		for _, w := range a.Warnings {
			if k := [2]string{a.Trace, w}; !warned[k] {
				warned[k] = true
				fmt.Fprintf(stderr, "%s: warning: %s\n", cli.Safe(a.Trace), cli.Safe(w))
			}
		}
	}
	// The JSON and the table appear together (atomicfile.Outputs).
	outs := &atomicfile.Outputs{Stdout: stdout}
	defer outs.Abort()
	if err := outs.Add("json", *jsonOut, func(w io.Writer) error { return results.WriteFit(w, answers) }); err != nil {
		return err
	}
	if *jsonOut != "-" {
		if err := outs.Add("", "-", func(w io.Writer) error {
			writeFitTable(w, answers, cards)
			writeFitJobs(w, job.SummarizeFits(answers))
			return nil
		}); err != nil {
			return err
		}
	}
	return outs.Commit()
}

// writeFitJobs prints a line per job (per-rank traces, job.Rank) and
// policy: the job fits where every rank does, so its smallest capacity and
// card are those of its largest rank, named.
func writeFitJobs(w io.Writer, sums []*job.FitSummary) {
	if len(sums) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "job\tpolicy\tranks\tmin capacity MiB\t(rank)\tmin card MiB\t(rank)\t"
	for _, c := range sums[0].Cards {
		head += cli.Safe(c.Label()) + "\t"
	}
	fmt.Fprintln(tw, head)
	for _, s := range sums {
		capText, capRank, card, cardRank := "never", "-", "-", "-"
		if s.Fits {
			capText, capRank = tables.MiB(s.MinCapacity), strconv.Itoa(s.MinCapacityRank)
			card, cardRank = tables.MiB(s.MinCard), strconv.Itoa(s.MinCardRank)
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s\t%s\t", cli.Safe(filepath.Base(s.Job)), cli.Safe(s.Policy), len(s.Ranks), capText, capRank, card, cardRank)
		fmt.Fprintln(tw, line+cardCells(s.Cards))
	}
	tw.Flush()
}

func writeFitTable(w io.Writer, answers []*results.Fit, cards []results.Card) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "trace\tpolicy\tlower bound MiB\tmin capacity MiB\tmin capacity bytes\tover bound\tmin card MiB\t"
	for _, c := range cards {
		head += cli.Safe(c.Label()) + "\t"
	}
	fmt.Fprintln(tw, head+"replays\t")
	for _, r := range answers {
		minCap, bytes, over, card := "never", "-", "-", "-"
		if r.Fits {
			minCap, bytes, card = tables.MiB(r.MinCapacity), strconv.FormatUint(r.MinCapacity, 10), tables.MiB(r.MinCard)
			if r.LowerBound > 0 {
				over = fmt.Sprintf("%+.1f%%", 100*(float64(r.MinCapacity)/float64(r.LowerBound)-1))
			}
			if !r.Monotone {
				minCap += " *"
			}
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy), tables.MiB(r.LowerBound), minCap, bytes, over, card)
		line += cardCells(r.Cards)
		fmt.Fprintln(tw, line+strconv.Itoa(r.Replays)+"\t")
	}
	tw.Flush()
	if slices.ContainsFunc(cards, func(c results.Card) bool { return c.Nominal }) {
		fmt.Fprintln(w, results.NominalNote)
	}
	for _, r := range answers {
		if !r.Monotone {
			var caps []string
			for _, p := range r.NonMonotone[:min(len(r.NonMonotone), 4)] {
				caps = append(caps, tables.MiB(p.Capacity)+" MiB")
			}
			fmt.Fprintf(w, "* %s: %s: not monotone in capacity: runs out of memory at %s although %s MiB fits\n",
				cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy), strings.Join(caps, ", "), tables.MiB(r.MinCapacity))
		}
		if !r.Fits {
			fmt.Fprintf(w, "%s: %s: runs out of memory at every capacity tried, unlimited included\n", cli.Safe(filepath.Base(r.Trace)), cli.Safe(r.Policy))
		}
	}
}

// cardCells is the table cells of the cards' answers: yes or no each.
func cardCells(cards []results.CardFit) string {
	var b strings.Builder
	for _, c := range cards {
		if c.Fits {
			b.WriteString("yes\t")
		} else {
			b.WriteString("no\t")
		}
	}
	return b.String()
}
