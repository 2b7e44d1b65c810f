package replaycli

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/gpualloc/allocsim/cmd/internal/cli"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
	"github.com/gpualloc/allocsim/sim/sites"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// addSites gives each of rs, the results of cfgs on the trace at path,
// its memory at the peak by allocation site (sim/sites): a second replay
// of each up to its peak event, all in one pass over the trace.
func addSites(path string, opts tracefile.Options, cfgs []sim.Config, rs []*sim.Result, opt sites.Options) error {
	f, err := tracefile.Open(path, opts)
	if err != nil {
		return err
	}
	defer f.Close()
	ss, err := sites.AtPeaks(f, cfgs, rs, opt)
	if err != nil {
		return tracefile.NameError(path, fmt.Errorf("--sites: %w", err))
	}
	for k, r := range rs {
		r.Sites = ss[k]
	}
	return nil
}

// writeSites prints, after the main table, each result's top sites at its
// peak: live MiB and count, unused MiB, and their share of the peak.
func writeSites(w io.Writer, rs []*sim.Result) {
	names := resultNames(rs)
	for _, r := range rs {
		s := r.Sites
		if s == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s, %s: memory at the peak (event %d, %s MiB reserved) by site\n", names[r.Trace], cli.Safe(r.Policy), s.Event, mib(s.Reserved))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "live MiB\tcount\tunused MiB\tshare\t\tsite\n")
		for _, row := range s.Sites {
			share := 0.0
			if s.Reserved > 0 {
				share = 100 * float64(row.LiveBytes+row.UnusedBytes) / float64(s.Reserved)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f%%\t\t%s\n", mib(row.LiveBytes), row.Count, mib(row.UnusedBytes), share, cli.Safe(row.Site))
		}
		tw.Flush()
	}
}

// sitesColumns are the columns of --sites-csv: a row per (trace, policy,
// site), the site's rank from 1 in the order of the table.
var sitesColumns = []string{"trace", "policy", "peak_event", "peak_time_ns", "peak_reserved_bytes", "depth", "site_rank", "site", "live_bytes", "count", "unused_bytes"}

// writeSitesCSV writes the sites of rs as CSV (sitesColumns), the text
// cells through results.CSVText.
func writeSitesCSV(w io.Writer, rs []*sim.Result) error {
	cw := csv.NewWriter(w)
	cw.Write(sitesColumns)
	u := func(x uint64) string { return strconv.FormatUint(x, 10) }
	for _, r := range rs {
		s := r.Sites
		if s == nil {
			continue
		}
		for k, row := range s.Sites {
			cw.Write([]string{results.CSVText(r.Trace), results.CSVText(r.Policy), strconv.FormatInt(s.Event, 10), strconv.FormatInt(s.Time, 10), u(s.Reserved),
				strconv.Itoa(s.Depth), strconv.Itoa(k + 1), results.CSVText(row.Site), u(row.LiveBytes), strconv.FormatInt(row.Count, 10), u(row.UnusedBytes)})
		}
	}
	cw.Flush()
	return cw.Error()
}
