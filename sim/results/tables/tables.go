// Package tables writes results (package results) as the text tables that
// replay's commands print: the table of a sim run with its notes, the
// results' warnings, and the jobs among per-rank traces. Sizes are in MiB
// with one decimal, ratios with three decimals, shares in percent; every
// name read from a file is escaped for the terminal (termsafe).
//
// It imports the results model and nothing of the engine, so that a
// command can print a results file it read without replaying.
package tables

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/sim/job"
	"github.com/gpualloc/allocsim/sim/results"
)

// MiB formats bytes as MiB with one decimal ("1.5").
func MiB(b uint64) string { return results.MiBText(b) }

// Ratio formats a ratio with three decimals, "-" where it is unknown
// (ok false).
func Ratio(ratio float64, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.FormatFloat(ratio, 'f', 3, 64)
}

// Ints joins integers with commas ("0,2,3").
func Ints(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// Names is results.ShortNames, each name escaped for the terminal.
func Names(paths []string) map[string]string {
	out := results.ShortNames(paths)
	for p, n := range out {
		out[p] = termsafe.String(n)
	}
	return out
}

// ResultNames is Names of the results' traces.
func ResultNames(rs []*results.Result) map[string]string {
	paths := make([]string, len(rs))
	for i, r := range rs {
		paths[i] = r.Trace
	}
	return Names(paths)
}

// Sim prints the table of a sim run, rows in the order of their figures
// (results.ByFigure), then its notes (Notes). The compact table fits 120
// columns: per trace and policy the peak reserved bytes and footprint
// (MiB), reserved against the peak requested and against offline (against
// the proven optimum instead where the optimal policy proved one:
// bestColumn), the
// peak fragmentation (Result.PeakFragmentation) and the idle share at the
// peak reserved bytes (1 - allocated/reserved), device calls (allocations
// and frees), simulated allocator time (ms) and OOMs; wide prints every
// column.
func Sim(w io.Writer, rs []*results.Result, wide bool) {
	names := ResultNames(rs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	best, vsBest := bestColumn(rs)
	if wide {
		fmt.Fprintln(tw, "trace\tpolicy\trequested MiB\tallocated MiB\treserved MiB\tfootprint MiB\treserved/requested\treserved/"+best+"\tfragmentation\tidle at peak\t1-peak allocated/peak reserved\tdevice allocs\tdevice frees\talloc ms\tretries\tOOMs\tfirst OOM (event, bytes)\t")
	} else {
		fmt.Fprintln(tw, "trace\tpolicy\treserved MiB\tfootprint MiB\t×req\t×"+best+"\tfrag\tidle\tcalls\talloc ms\tOOMs\t")
	}
	for _, r := range results.ByFigure(rs) {
		ratio, vsOffline := Ratio(r.ReservedOverRequested()), Ratio(vsBest(r))
		if !wide {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t%d\t%.1f\t%d\t\n",
				names[r.Trace], termsafe.String(r.Policy), MiB(r.PeakReserved), MiB(r.PeakFootprint), ratio, vsOffline,
				100*r.PeakFragmentation, 100*r.IdleAtPeak, r.DeviceAllocs+r.DeviceFrees, float64(r.SimAllocTimeNS)/1e6, r.OOMs)
			continue
		}
		first := "-"
		if r.OOMs > 0 {
			first = fmt.Sprintf("%d, %d", r.FirstOOMEvent, r.FirstOOMSize)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t%.1f%%\t%d\t%d\t%.1f\t%d\t%d\t%s\t\n",
			names[r.Trace], termsafe.String(r.Policy), MiB(r.PeakRequested), MiB(r.PeakAllocated), MiB(r.PeakReserved), MiB(r.PeakFootprint),
			ratio, vsOffline, 100*r.PeakFragmentation, 100*r.IdleAtPeak, 100*r.PeakUnallocatedShare(), r.DeviceAllocs, r.DeviceFrees, float64(r.SimAllocTimeNS)/1e6, r.AllocRetries, r.OOMs, first)
	}
	tw.Flush()
	Notes(w, rs)
}

// Notes prints what a table of results does not say: per trace, the hard
// lower bound (the largest peak requested of its results: a policy's
// counts the requests it failed too, the program held them) beside
// offline's peak, and the capacity taken from the recorded card. Warnings
// are not notes: Warnings prints them.
func Notes(w io.Writer, rs []*results.Result) {
	lower, served := map[string]uint64{}, map[string]bool{}
	for _, r := range rs {
		lower[r.Trace] = max(lower[r.Trace], r.PeakRequested)
		served[r.Trace] = served[r.Trace] || r.OOMs == 0
	}
	bounds := map[string]bool{}
	for _, r := range rs {
		if r.PeakOffline > 0 && !bounds[r.Trace] {
			bounds[r.Trace] = true
			how := "every malloc served"
			if !served[r.Trace] {
				how = "at least: every policy ran out of memory"
			}
			fmt.Fprintf(w, "%s: hard lower bound (peak requested, %s) %d bytes; a row with OOMs counts in its requested column the requests it failed too; offline (clairvoyant heuristic placement, not the optimum) %d bytes\n", termsafe.String(r.Trace), how, lower[r.Trace], r.PeakOffline)
		}
	}
	for _, r := range rs {
		if p := r.Plan; p != nil {
			if p.Proven {
				// (No time: the line stays the same from run to run; the
				// JSON has it.)
				fmt.Fprintf(w, "%s: %s: least peak of any fixed-address placement %d bytes, proven (%d search nodes)\n", termsafe.String(r.Trace), termsafe.String(r.Policy), p.Height, p.Nodes)
			} else {
				gap, _ := p.Gap()
				why := map[string]string{"time": "its time limit", "nodes": "its node budget", "pairs": "too many blocks live at once to search"}[p.Stopped]
				if why == "" {
					why = termsafe.String(p.Stopped)
				}
				fmt.Fprintf(w, "%s: %s: best placement found %d bytes, proven lower bound %d bytes (gap %.4f%%), not proven: stopped by %s (%.1f s, %d search nodes)\n", termsafe.String(r.Trace), termsafe.String(r.Policy), p.Height, p.LowerBound, 100*gap, why, p.Seconds, p.Nodes)
			}
		}
	}
	carded := map[string]bool{}
	for _, r := range rs {
		if r.CapacityFromCard && !carded[r.Trace] {
			carded[r.Trace] = true
			fmt.Fprintf(w, "%s: capacity %d bytes: the recorded card's %d bytes less its %d-byte context (--capacity overrides)\n", termsafe.String(r.Trace), r.Capacity, r.Capacity+results.ContextBytes, uint64(results.ContextBytes))
		}
	}
}

// bestColumn returns the name of the table's column that measures peak
// reserved bytes against the best known placement, and its figure: the
// proven optimum (Result.PeakOptimum, the optimal policy's) where some
// result has one, "-" for a trace without; else the offline heuristic's
// peak.
func bestColumn(rs []*results.Result) (string, func(*results.Result) (float64, bool)) {
	for _, r := range rs {
		if r.PeakOptimum > 0 {
			return "optimum", (*results.Result).ReservedOverOptimum
		}
	}
	return "offline", (*results.Result).ReservedOverOffline
}

// Warnings prints the results' warnings (Result.Warnings) to w, one line
// each: "TRACE: warning: TEXT" for one that every result of the trace
// has, "TRACE: POLICY: warning: TEXT" for one of some policies only; a
// warning several policies have but for their own names ("the P policy
// keeps ...") is one line naming them all ("TRACE: P, Q: warning: the P,
// Q policies keep ..."), at the first. It returns how many lines it
// printed.
func Warnings(w io.Writer, rs []*results.Result) int {
	// A warning's text with the policy's own name taken out.
	generic := func(r *results.Result, x string) string {
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
				fmt.Fprintf(w, "%s: warning: %s\n", termsafe.String(r.Trace), termsafe.String(x))
			case len(ps) == 1:
				fmt.Fprintf(w, "%s: %s: warning: %s\n", termsafe.String(r.Trace), termsafe.String(r.Policy), termsafe.String(x))
			default:
				list := strings.Join(ps, ", ")
				text := strings.ReplaceAll(k[1], "the \x00 policy keeps ", "the "+list+" policies keep ")
				text = strings.ReplaceAll(text, "the \x00 policy ", "the "+list+" policies ")
				fmt.Fprintf(w, "%s: %s: warning: %s\n", termsafe.String(r.Trace), termsafe.String(list), termsafe.String(text))
			}
			n++
		}
	}
	return n
}

// Jobs prints, for each job among the traces (per-rank traces, job.Rank)
// and each policy, the job's figures: the largest and smallest rank's
// peak reserved bytes (MiB) and their spread, the largest footprint, and
// the ranks that ran out of memory, the first of them in time. It prints
// nothing when there is no job.
func Jobs(w io.Writer, sums []*job.Summary) {
	if len(sums) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\tpolicy\tranks\tmax reserved MiB\t(rank)\tmin\t(rank)\tspread\tmax footprint MiB\t(rank)\tOOM ranks\tfirst OOM\t")
	for _, s := range sums {
		ooms, first := "-", "-"
		if len(s.OOMRanks) > 0 {
			ooms = Ints(s.OOMRanks)
			first = "order unknown"
			if s.FirstOOMRank >= 0 {
				first = fmt.Sprintf("rank %d, event %d", s.FirstOOMRank, s.FirstOOMEvent)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\t%.1f%%\t%s\t%d\t%s\t%s\t\n", termsafe.String(filepath.Base(s.Job)), termsafe.String(s.Policy), len(s.Ranks),
			MiB(s.MaxReserved), s.MaxReservedRank, MiB(s.MinReserved), s.MinReservedRank, 100*s.Spread(),
			MiB(s.MaxFootprint), s.MaxFootprintRank, ooms, first)
	}
	tw.Flush()
}

// Sites prints, after the main table of a sim run, each result's top sites at its
// peak: live MiB and count, unused MiB, and their share of the peak.
func Sites(w io.Writer, rs []*results.Result) {
	names := ResultNames(rs)
	for _, r := range rs {
		s := r.Sites
		if s == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s, %s: memory at the peak (event %d, %s MiB reserved) by site\n", names[r.Trace], termsafe.String(r.Policy), s.Event, MiB(s.Reserved))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "live MiB\tcount\tunused MiB\tshare\t\tsite\n")
		for _, row := range s.Sites {
			share := 0.0
			if s.Reserved > 0 {
				share = 100 * float64(row.LiveBytes+row.UnusedBytes) / float64(s.Reserved)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f%%\t\t%s\n", MiB(row.LiveBytes), row.Count, MiB(row.UnusedBytes), share, termsafe.String(row.Site))
		}
		tw.Flush()
	}
}

// CellWarnings prints the cells' warnings (Result.Warnings) to
// w, one line per trace and warning with the number of cells that have it.
func CellWarnings(w io.Writer, rs []*results.Result) {
	type key struct{ trace, text string }
	var order []key
	cells := map[key]int{}
	for _, r := range rs {
		for _, x := range r.Warnings {
			k := key{r.Trace, x}
			if cells[k] == 0 {
				order = append(order, k)
			}
			cells[k]++
		}
	}
	for _, k := range order {
		fmt.Fprintf(w, "%s: warning (%d cells): %s\n", termsafe.String(k.trace), cells[k], termsafe.String(k.text))
	}
}
