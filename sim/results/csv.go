package results

import (
	"encoding/csv"
	"io"
	"sort"
	"strconv"
	"strings"
)

// column is a CSV column: a scalar JSON key of Result and its value.
type column struct {
	name  string
	value func(r *Result) string
}

func u(v uint64) string  { return strconv.FormatUint(v, 10) }
func i(v int64) string   { return strconv.FormatInt(v, 10) }
func f(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// columns are the CSV columns of sim results: every scalar JSON key of
// Result, in the order of the struct (the settings as one column,
// key=value pairs sorted by key and joined by ";"); the lists (latency,
// series) are left out.
var columns = []column{
	{"trace", func(r *Result) string { return CSVText(r.Trace) }},
	{"policy", func(r *Result) string { return CSVText(r.Policy) }},
	{"settings", func(r *Result) string { return CSVText(JoinSettings(r.Settings, ";")) }},
	{"capacity_bytes", func(r *Result) string { return u(r.Capacity) }},
	{"trace_source", func(r *Result) string { return CSVText(r.TraceSource) }},
	{"capacity_from_card", func(r *Result) string { return strconv.FormatBool(r.CapacityFromCard) }},
	{"events", func(r *Result) string { return i(r.Events) }},
	{"mallocs", func(r *Result) string { return i(r.Mallocs) }},
	{"frees", func(r *Result) string { return i(r.Frees) }},
	{"peak_requested_bytes", func(r *Result) string { return u(r.PeakRequested) }},
	{"peak_allocated_bytes", func(r *Result) string { return u(r.PeakAllocated) }},
	{"peak_reserved_bytes", func(r *Result) string { return u(r.PeakReserved) }},
	{"peak_footprint_bytes", func(r *Result) string { return u(r.PeakFootprint) }},
	{"offline_peak_reserved_bytes", func(r *Result) string { return u(r.PeakOffline) }},
	{"optimum_peak_reserved_bytes", func(r *Result) string { return u(r.PeakOptimum) }},
	{"peak_fragmented_bytes", func(r *Result) string { return unknownIf(r.FragmentationUnknown, u(r.PeakFragmentedBytes)) }},
	{"peak_fragmentation", func(r *Result) string { return unknownIf(r.FragmentationUnknown, f(r.PeakFragmentation)) }},
	{"fragmentation_at_peak", func(r *Result) string { return unknownIf(r.FragmentationUnknown, f(r.FragmentationAtPeak)) }},
	{"idle_at_peak", func(r *Result) string { return f(r.IdleAtPeak) }},
	{"fragmentation_unknown", func(r *Result) string { return strconv.FormatBool(r.FragmentationUnknown) }},
	{"device_allocs", func(r *Result) string { return i(r.DeviceAllocs) }},
	{"device_frees", func(r *Result) string { return i(r.DeviceFrees) }},
	{"alloc_retries", func(r *Result) string { return i(r.AllocRetries) }},
	{"ooms", func(r *Result) string { return i(r.OOMs) }},
	{"first_oom_event", func(r *Result) string { return i(r.FirstOOMEvent) }},
	{"first_oom_size", func(r *Result) string { return u(r.FirstOOMSize) }},
	{"first_oom_time_ns", func(r *Result) string { return strconv.FormatInt(r.FirstOOMTime, 10) }},
	{"source_ooms", func(r *Result) string { return i(r.SourceOOMs) }},
	{"source_ooms_served", func(r *Result) string { return i(r.SourceOOMsServed) }},
	{"build_error", func(r *Result) string { return CSVText(r.BuildError) }},
	{"anomalies", func(r *Result) string { return i(r.Anomalies) }},
	{"first_anomaly", func(r *Result) string { return CSVText(r.FirstAnomaly) }},
	{"inferred", func(r *Result) string { return i(r.Inferred) }},
	{"first_inferred", func(r *Result) string { return CSVText(r.FirstInferred) }},
	{"parted", func(r *Result) string { return CSVText(r.Parted) }},
	{"parted_at_oom", func(r *Result) string { return strconv.FormatBool(r.PartedAtOOM) }},
	{"peak_unshown_release_bytes", func(r *Result) string { return u(r.PeakUnshown) }},
	{"truncated", func(r *Result) string { return strconv.FormatBool(r.Truncated) }},
	{"reconstructed_events", func(r *Result) string { return i(r.ReconstructedEvents) }},
	{"private_pools", func(r *Result) string { return CSVText(r.PrivatePools) }},
	{"pool_warning", func(r *Result) string { return CSVText(r.PoolWarning) }},
	{"peak_pinned_bytes", func(r *Result) string { return u(r.PeakPinned) }},
	{"peak_managed_bytes", func(r *Result) string { return u(r.PeakManaged) }},
	{"direct_mallocs", func(r *Result) string { return strconv.FormatInt(r.DirectMallocs, 10) }},
	{"peak_direct_bytes", func(r *Result) string { return u(r.PeakDirect) }},
	{"sim_alloc_time_ns", func(r *Result) string { return i(r.SimAllocTimeNS) }},
	{"sim_wake_time_ns", func(r *Result) string { return i(r.SimWakeTimeNS) }},
}

// Columns returns the names of the CSV columns before the settings' own:
// the scalar JSON keys of Result in the order of the struct.
func Columns() []string {
	out := make([]string, len(columns))
	for k, c := range columns {
		out[k] = c.name
	}
	return out
}

// CSVWriter writes sim results as CSV, the same columns for replay sim,
// replay gpu --sim-only, sweep and merge: Columns, then a column "set:KEY"
// per setting key it was given (empty where a result lacks the key), so
// that grid values are columns of their own. Each row is flushed as it is
// written, so that a sweep's file grows as cells finish. The text cells
// (trace, policy, settings, the warnings and anomalies, the setting
// values) are written through CSVText, so that none is a formula to a
// spreadsheet.
type CSVWriter struct {
	w    *csv.Writer
	keys []string
}

// NewCSVWriter returns a writer of rows to w with the setting columns of
// settingKeys, in that order.
func NewCSVWriter(w io.Writer, settingKeys []string) *CSVWriter {
	return &CSVWriter{w: csv.NewWriter(w), keys: settingKeys}
}

// WriteHeader writes the header row; it returns the write's error.
func (c *CSVWriter) WriteHeader() error { return c.flush(c.header()) }

// Write writes r's row; it returns the write's error.
func (c *CSVWriter) Write(r *Result) error { return c.flush(c.row(r)) }

// header returns the header row: Columns, then the setting columns.
func (c *CSVWriter) header() []string {
	head := Columns()
	for _, k := range c.keys {
		head = append(head, "set:"+k)
	}
	return head
}

// row returns r's row under header.
func (c *CSVWriter) row(r *Result) []string {
	row := make([]string, 0, len(columns)+len(c.keys))
	for _, col := range columns {
		row = append(row, col.value(r))
	}
	for _, k := range c.keys {
		row = append(row, CSVText(r.Settings[k]))
	}
	return row
}

func (c *CSVWriter) flush(record []string) error {
	c.w.Write(record)
	c.w.Flush()
	return c.w.Error()
}

// WriteCSV writes rs as CSV with a header, with a setting column for each
// key any of them has (SettingKeys).
func WriteCSV(w io.Writer, rs []*Result) error { return WriteCSVKeys(w, rs, SettingKeys(rs)) }

// WriteCSVKeys writes rs as CSV with a header and the setting columns of
// settingKeys, in that order (a sweep's, from its plan); it returns the
// first write error.
func WriteCSVKeys(w io.Writer, rs []*Result, settingKeys []string) error {
	c := NewCSVWriter(w, settingKeys)
	if err := c.WriteHeader(); err != nil {
		return err
	}
	for _, r := range rs {
		if err := c.Write(r); err != nil {
			return err
		}
	}
	return nil
}

// SettingKeys returns the setting keys of rs, sorted.
func SettingKeys(rs []*Result) []string {
	seen := map[string]bool{}
	for _, r := range rs {
		for k := range r.Settings {
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

// gpuColumns are the CSV columns a replay on the GPU adds to the sim
// columns: its limit, the simulation alongside, the measured times and the
// driver's view.
var gpuColumns = []struct {
	name  string
	value func(r *GPU) string
}{
	{"max_bytes", func(r *GPU) string { return u(r.MaxBytes) }},
	{"sim_peak_reserved_bytes", func(r *GPU) string { return u(r.SimPeakReserved) }},
	{"paced", func(r *GPU) string { return strconv.FormatBool(r.Paced) }},
	{"alloc_time_ns", func(r *GPU) string { return i(r.AllocTimeNS) }},
	{"sync_time_ns", func(r *GPU) string { return i(r.SyncTimeNS) }},
	{"calls", func(r *GPU) string { return i(r.Calls) }},
	{"policy_time_ns", func(r *GPU) string { return i(r.PolicyTimeNS) }},
	{"replay_wall_ns", func(r *GPU) string { return i(r.ReplayWallNS) }},
	{"driver_free_at_start_bytes", func(r *GPU) string { return u(r.Driver.FreeAtStart) }},
	{"driver_min_free_bytes", func(r *GPU) string { return u(r.Driver.MinFree) }},
	{"driver_free_at_end_bytes", func(r *GPU) string { return u(r.Driver.FreeAtEnd) }},
	{"pool_reserved_high_bytes", func(r *GPU) string { return u(r.Driver.PoolReservedHigh) }},
	{"pool_used_high_bytes", func(r *GPU) string { return u(r.Driver.PoolUsedHigh) }},
	{"c_loop_wall_ns", func(r *GPU) string {
		if r.CLoop == nil {
			return ""
		}
		return i(r.CLoop.WallNS)
	}},
	{"c_loop_overhead_per_call_ns", func(r *GPU) string {
		if r.CLoop == nil {
			return ""
		}
		return strconv.FormatFloat(r.CLoop.OverheadPerCallNS, 'f', 1, 64)
	}},
}

// WriteGPUCSV writes the results of replays on the GPU as CSV with a
// header: the columns of sim results as replay sim --csv writes them
// (Columns, sim_alloc_time_ns being the simulation alongside's, then a
// "set:KEY" column per setting key), then the columns the GPU adds
// (max_bytes, sim_peak_reserved_bytes, paced, the measured times in
// nanoseconds, the driver's view in bytes, the C loop's). It returns the first write error.
func WriteGPUCSV(w io.Writer, rs []*GPU) error {
	flat := make([]*Result, len(rs))
	for k, r := range rs {
		flat[k] = &r.Result
	}
	c := NewCSVWriter(w, SettingKeys(flat))
	c.w.Write(append(c.header(), gpuColumnNames()...))
	for _, r := range rs {
		row := c.row(&r.Result)
		for _, col := range gpuColumns {
			row = append(row, col.value(r))
		}
		c.w.Write(row)
	}
	c.w.Flush()
	return c.w.Error()
}

func gpuColumnNames() []string {
	names := make([]string, len(gpuColumns))
	for k, c := range gpuColumns {
		names[k] = c.name
	}
	return names
}

// CSVText returns the cell a spreadsheet reads as the text s: s with a
// single quote ' before it when it starts with =, +, -, @, a tab or a
// carriage return, which a spreadsheet would take for a formula (OWASP's
// rule against CSV injection), unless s is a number ("-1", "+2.5e3"),
// which stays a number. Every CSV of results and of sites goes through
// it for its text cells; the CSV a tool reads back as data (a MiniMalloc
// problem, a cost model) does not.
func CSVText(s string) string {
	if s == "" || !strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return s
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return s
	}
	return "'" + s
}

// unknownIf returns v, or "" (unknown) when unknown is set: a version 1
// result's fragmentation (Result.FragmentationUnknown).
func unknownIf(unknown bool, v string) string {
	if unknown {
		return ""
	}
	return v
}
