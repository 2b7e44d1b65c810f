package results

import (
	"encoding/csv"
	"io"
	"strconv"
)

// sitesColumns are the columns of --sites-csv: a row per (trace, policy,
// site), the site's rank from 1 in the order of the table.
var sitesColumns = []string{"trace", "policy", "peak_event", "peak_time_ns", "peak_reserved_bytes", "depth", "site_rank", "site", "live_bytes", "count", "unused_bytes"}

// WriteSitesCSV writes the sites at the peak of rs (Result.Sites) as CSV
// (sitesColumns): a row per (trace, policy, site), the text cells through
// CSVText. It returns the writer's error.
func WriteSitesCSV(w io.Writer, rs []*Result) error {
	cw := csv.NewWriter(w)
	cw.Write(sitesColumns)
	u := func(x uint64) string { return strconv.FormatUint(x, 10) }
	for _, r := range rs {
		s := r.Sites
		if s == nil {
			continue
		}
		for k, row := range s.Sites {
			cw.Write([]string{CSVText(r.Trace), CSVText(r.Policy), strconv.FormatInt(s.Event, 10), strconv.FormatInt(s.Time, 10), u(s.Reserved),
				strconv.Itoa(s.Depth), strconv.Itoa(k + 1), CSVText(row.Site), u(row.LiveBytes), strconv.FormatInt(row.Count, 10), u(row.UnusedBytes)})
		}
	}
	cw.Flush()
	return cw.Error()
}
