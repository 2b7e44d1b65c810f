package results

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Result is the outcome of replaying one trace against one policy. Sizes are
// in bytes, times in nanoseconds; the JSON keys are those of
// `replay sim --json`.
type Result struct {
	// Trace is the trace's path as given on the command line.
	Trace string `json:"trace"`
	// Policy is the policy's registry name.
	Policy string `json:"policy"`
	// Rank is the trace's rank in the multi-GPU job it is a rank of (the
	// job's record in a results file names its traces), nil for a trace
	// of no job. It is in the JSON only where set (not in the CSV).
	Rank *int `json:"rank,omitempty"`
	// Settings are the policy settings the replay used, by key.
	Settings map[string]string `json:"settings,omitempty"`
	// Capacity is the simulated device's capacity, 0 if unlimited.
	Capacity uint64 `json:"capacity_bytes"`
	// TraceSource is the trace header's Source ("pytorch", "record", ...).
	TraceSource string `json:"trace_source,omitempty"`
	// CapacityFromCard says Capacity is the recorded card's memory less
	// its context (Config.CardCapacity), no capacity given.
	CapacityFromCard bool `json:"capacity_from_card,omitempty"`
	// Events is the number of trace events read.
	Events int64 `json:"events"`
	// Mallocs and Frees count the device-memory mallocs and frees replayed.
	Mallocs int64 `json:"mallocs"`
	Frees   int64 `json:"frees"`

	// PeakRequested is the peak of live requested bytes over the mallocs
	// that succeeded in the source: the lower bound for any policy.
	PeakRequested uint64 `json:"peak_requested_bytes"`
	// PeakAllocated is the peak of bytes in blocks handed out by the policy
	// (requested sizes after its rounding).
	PeakAllocated uint64 `json:"peak_allocated_bytes"`
	// PeakReserved is the peak of bytes held from the device.
	PeakReserved uint64 `json:"peak_reserved_bytes"`
	// PeakFootprint is the peak of the card's memory the policy's
	// segments take as the driver takes them, in bytes: whole 2 MiB pages
	// above 1 MiB, small segments packed into shared 2 MiB pages (measured
	// on an H200; Device.Footprint), the context left out. Only the
	// simulated device has it (0 on the GPU, whose driver says it:
	// results.GPU's Driver).
	PeakFootprint uint64 `json:"peak_footprint_bytes"`
	// PeakOffline is the peak reserved bytes of the offline policy (which
	// places every malloc knowing the whole trace) on the same trace: what
	// a clairvoyant heuristic reached, not the optimum (PeakRequested is
	// the hard lower bound). It is 0 when the offline policy was not
	// replayed with this result.
	PeakOffline uint64 `json:"offline_peak_reserved_bytes,omitempty"`
	// PeakOptimum is the least peak reserved bytes of any fixed-address
	// placement of the trace's mallocs (sizes rounded to the optimal
	// policy's alignment), proven by the optimal policy replayed with
	// this result (its Plan, Proven); 0 where unknown.
	PeakOptimum uint64 `json:"optimum_peak_reserved_bytes,omitempty"`
	// Plan is what a clairvoyant policy that bounds its plan (the optimal
	// policy) knows of it; nil for the other policies.
	Plan *PlanBound `json:"plan,omitempty"`
	// PeakFragmentedBytes is the most fragmented bytes of the run: at a
	// malloc of the policy that had to allocate from the device although
	// its free reserved bytes, reserved - allocated, were at least the
	// request, or that ran out of memory although they and the capacity not
	// reserved were, those free bytes. That much memory was held and idle
	// but could not serve the request that followed. 0 where no malloc
	// grew or failed past free memory that added up to the request.
	PeakFragmentedBytes uint64 `json:"peak_fragmented_bytes"`
	// PeakFragmentation is PeakFragmentedBytes over PeakReserved (0..1):
	// the run's fragmentation as a share of the memory it took at most (so
	// that a few MiB that a policy could not use while it warmed up do not
	// read as 100%).
	PeakFragmentation float64 `json:"peak_fragmentation"`
	// FragmentationAtPeak is the fragmented bytes of the malloc that took
	// the reserved bytes to their peak, over PeakReserved: 0 if its
	// policy's free bytes were fewer than the request (0..1).
	FragmentationAtPeak float64 `json:"fragmentation_at_peak"`
	// IdleAtPeak is the cached but idle share of the reserved bytes while
	// they are at their peak, at its least: 1 - allocated/reserved with
	// the most bytes allocated while the reserved bytes held their peak
	// (0..1). It counts free memory whether or not the requests after
	// could use it.
	IdleAtPeak float64 `json:"idle_at_peak"`
	// FragmentationUnknown marks a result read from a results file of
	// version 1, which did not measure fragmentation as it is defined now:
	// its fragmentation figures are 0 and mean nothing.
	FragmentationUnknown bool `json:"fragmentation_unknown,omitempty"`

	// DeviceAllocs and DeviceFrees count device segment allocations and
	// frees (cudaMalloc / cudaFree calls).
	DeviceAllocs int64 `json:"device_allocs"`
	DeviceFrees  int64 `json:"device_frees"`
	// AllocRetries counts device allocations retried after the policy
	// released cached memory.
	AllocRetries int64 `json:"alloc_retries"`
	// OOMs counts mallocs the policy could not satisfy.
	OOMs int64 `json:"ooms"`
	// FirstOOMEvent is the event index of the first failed malloc, -1 if
	// none; FirstOOMSize its requested size in bytes, 0 if none.
	FirstOOMEvent int64  `json:"first_oom_event"`
	FirstOOMSize  uint64 `json:"first_oom_size"`
	// FirstOOMTime is the trace's time of that event in nanoseconds, 0 if
	// none (or the trace has no times).
	FirstOOMTime int64 `json:"first_oom_time_ns"`
	// SourceOOMs counts the mallocs that failed in the source
	// (malloc_failed events), replayed as attempts.
	SourceOOMs int64 `json:"source_ooms"`
	// SourceOOMsServed counts those the policy served in the replay: each
	// counts in the peaks of requested, allocated and reserved bytes for
	// an instant, as if the card had given it (without a capacity, every
	// one of them is served).
	SourceOOMsServed int64 `json:"source_ooms_served"`

	// BuildError says why the policy could not be built (the device
	// refused the memory it takes up front); every malloc was then an OOM.
	BuildError string `json:"build_error,omitempty"`

	// Anomalies counts the trace's semantic problems (trace.Validator: a
	// free of an address that is not live, a double free, a malloc of a
	// live address, of 0 bytes or of more than 1 PiB, time going
	// backwards), which the replay skips or takes as they come;
	// FirstAnomaly describes the first, with its event index.
	Anomalies    int64  `json:"anomalies"`
	FirstAnomaly string `json:"first_anomaly,omitempty"`

	// Overflow, nil if none, counts the mallocs that failed as an OOM
	// because their bytes would have taken a sum past what it holds (the
	// device's 64-bit address space, a plan's arena, the live host bytes:
	// policies.ErrOverflow), where unchecked sums would have wrapped. It
	// is in the JSON and the warnings, not in the CSV's columns.
	Overflow *Overflow `json:"overflow,omitempty"`

	// Inferred counts the calls of the program that the recording does
	// not show and that the policy, replaying it as recorded, inferred
	// from what it does show (policies.Inferrer: an unlogged CuPy
	// free_all_blocks()); FirstInferred describes the first, with its
	// event index.
	Inferred      int64  `json:"inferred,omitempty"`
	FirstInferred string `json:"first_inferred,omitempty"`

	// Parted is where a replay as recorded of its own allocator's
	// recording first parted from it (a device call, a placement or an
	// OOM other than the recorded: see Fidelity), with its event index and
	// both sides in words; "" where it did not, or was not watched (a
	// replay under the user's settings, of another allocator's recording,
	// on a GPU). PartedAtOOM says the parting is at an OOM on one side
	// and not on the other.
	Parted      string `json:"parted,omitempty"`
	PartedAtOOM bool   `json:"parted_at_oom,omitempty"`
	// PeakUnshown is, for a replay as recorded of a recording that does
	// not show its allocator's releases (CuPy's log: no free_all_blocks()),
	// the bytes of wholly free segments the policy held when the reserved
	// bytes reached their peak (policies.Releasable): a release the log
	// does not show could have given them back, and the real peak been
	// that much lower. 0 when none, or not asked.
	PeakUnshown uint64 `json:"peak_unshown_release_bytes,omitempty"`

	// Truncated is set for a trace whose history was cut (a snapshot that
	// starts mid-run): its first ReconstructedEvents events rebuild the
	// state before its first recorded event, and the peaks count from
	// that state on.
	Truncated           bool  `json:"truncated,omitempty"`
	ReconstructedEvents int64 `json:"reconstructed_events,omitempty"`

	// PrivatePools describes the mallocs of the trace into private pools
	// (trace.Event.Pool: a CUDA graph capture's, a MemPool's) that the
	// policy, which keeps no private pools (no policies.Pooler), placed in
	// its default pools, by pool: "(1,0): 37 mallocs"; "" if none.
	PrivatePools string `json:"private_pools,omitempty"`
	// PoolWarning is the trace's own warning about its pools (the
	// importer's "pool_warning" metadata: a pool it could not place), ""
	// if none.
	PoolWarning string `json:"pool_warning,omitempty"`

	// Warnings says, one line each, what makes the figures other than a
	// clean replay of the whole trace: a truncated history rebuilt, events
	// that could not be replayed as recorded (Anomalies), failed mallocs of
	// the recording served for want of a capacity (CapacityWarning).
	Warnings []string `json:"warnings,omitempty"`

	// PeakPinned and PeakManaged are peak live pinned-host and managed
	// bytes, counted apart from device memory.
	PeakPinned  uint64 `json:"peak_pinned_bytes"`
	PeakManaged uint64 `json:"peak_managed_bytes"`
	// DirectMallocs counts the device mallocs that CUDA libraries made
	// straight from the driver (trace.DirectSite), replayed around the
	// policy; PeakDirect is their peak live bytes, counted apart from the
	// policy's.
	DirectMallocs int64  `json:"direct_mallocs,omitempty"`
	PeakDirect    uint64 `json:"peak_direct_bytes,omitempty"`

	// SimAllocTimeNS is the simulated time in nanoseconds spent in the
	// device's cudaMalloc and cudaFree calls under the cost model (cudaFree's
	// device synchronization included, as measured on an idle device).
	SimAllocTimeNS int64 `json:"sim_alloc_time_ns"`
	// SimWakeTimeNS is the part of SimAllocTimeNS that the calls made
	// after the driver was idle paid over the same calls back to back, by
	// the cost model's wake-up curves and the trace's times.
	SimWakeTimeNS int64 `json:"sim_wake_time_ns"`
	// Latency summarizes the device calls' latencies by call and size
	// class: simulated by the cost model in `replay sim`, measured in
	// `replay gpu`.
	Latency []LatencyRow `json:"latency,omitempty"`

	// Series is the time series over the trace, at most MaxSeriesPoints
	// points, each summarizing a run of consecutive events.
	Series []Point `json:"series"`

	// PeakReservedEvent is the index of the event at whose end the
	// reserved bytes first reached PeakReserved (not in the JSON).
	PeakReservedEvent int64 `json:"-"`
	// Sites is where the memory at the peak of reserved bytes came from,
	// by allocation site (replay sim --sites; package sim/sites); nil
	// unless asked for.
	Sites *SitesAtPeak `json:"sites_at_peak,omitempty"`
}

// Overflow counts the mallocs of a replay that failed as an OOM where a
// sum of bytes would have wrapped (Result.Overflow).
type Overflow struct {
	// Mallocs is their number; First describes the first, with its
	// event index and the error.
	Mallocs int64  `json:"mallocs"`
	First   string `json:"first"`
}

// Point summarizes a run of consecutive events: the peak byte figures and
// fragmentation over the run, and the idle share at its last event.
type Point struct {
	// Event is the index of the run's last event; Time its time in
	// nanoseconds.
	Event int64 `json:"event"`
	Time  int64 `json:"time_ns"`
	// Requested, Allocated and Reserved are the largest values in bytes
	// over the run.
	Requested uint64 `json:"requested"`
	Allocated uint64 `json:"allocated"`
	Reserved  uint64 `json:"reserved"`
	// Footprint is the largest footprint in bytes over the run: the
	// card's memory the device's segments take as the driver takes them
	// (Result.PeakFootprint's); 0 on a real GPU.
	Footprint uint64 `json:"footprint,omitempty"`
	// Fragmentation is the largest fragmentation of a malloc of the run:
	// its fragmented bytes (Result.PeakFragmentedBytes' definition) over
	// the reserved bytes before it; 0 if none grew past free memory that
	// added up to its request.
	Fragmentation float64 `json:"fragmentation"`
	// Idle is 1 - allocated/reserved at the run's last event: the cached
	// but idle share of the reserved bytes, 0 when nothing is reserved.
	Idle float64 `json:"idle"`
	// External is 1 - largest free block / total free bytes at the run's
	// last event, 0 when nothing is free or the policy cannot say.
	External float64 `json:"external_fragmentation"`
}

// MaxSeriesPoints bounds the length of Result.Series.
const MaxSeriesPoints = 2000

// WarningsOf returns the warnings the figures of r call for (the replay
// engine sets Result.Warnings to them): a rebuilt history, events not
// replayed as recorded, inferred calls, a parting from the recording, a
// peak that an unshown release may have lowered, failed mallocs served for
// want of a capacity, private pools not kept.
func WarningsOf(r *Result) []string {
	var ws []string
	if r.Truncated {
		ws = append(ws, fmt.Sprintf("truncated history (it starts mid-run): %d events at its start rebuild the state before its first entry; peaks count from there", r.ReconstructedEvents))
	}
	if r.Anomalies > 0 {
		ws = append(ws, fmt.Sprintf("%d events could not be replayed as recorded; first: %s", r.Anomalies, r.FirstAnomaly))
	}
	if o := r.Overflow; o != nil {
		ws = append(ws, fmt.Sprintf("%d mallocs failed as OOMs where a sum of bytes would have wrapped (past the 64-bit address space, a plan's 8 EiB arena or 2^64 live host bytes); first: %s", o.Mallocs, o.First))
	}
	if r.Inferred > 0 && r.SourceOOMsServed == 0 && r.OOMs == r.SourceOOMs {
		// (A replay that served the recording's failed mallocs, or failed
		// others, parted from it for its capacity: CapacityWarning, or the
		// capacity asked for, says why.)
		ws = append(ws, InferredWarning(r))
	}
	if w := PartedWarning(r); w != "" {
		ws = append(ws, w)
	}
	if r.PeakUnshown > 0 && r.Parted == "" {
		ws = append(ws, fmt.Sprintf("the peak of %d reserved bytes (event %d) counts %d bytes of segments wholly free, which a release the recording does not show (CuPy's free_all_blocks()) would have given back: the real peak may be lower, down to %d bytes", r.PeakReserved, r.PeakReservedEvent, r.PeakUnshown, r.PeakReserved-r.PeakUnshown))
	}
	if w := CapacityWarning(r); w != "" {
		ws = append(ws, w)
	}
	if r.PrivatePools != "" {
		ws = append(ws, fmt.Sprintf("the %s policy keeps no private pools: the trace's mallocs into private pools (a CUDA graph capture's or a MemPool's; %s) were placed with the others", r.Policy, r.PrivatePools))
	}
	if r.PoolWarning != "" {
		ws = append(ws, r.PoolWarning)
	}
	return ws
}

// InferredWarning returns what the policy inferred of the calls the
// recording does not show (Inferred), for a result with any; "" if none.
func InferredWarning(r *Result) string {
	if r == nil || r.Inferred == 0 {
		return ""
	}
	return fmt.Sprintf("%d calls the recording does not show were inferred from it; first: %s", r.Inferred, r.FirstInferred)
}

// CapacityWarning returns, for a replay without a capacity of a recording
// with failed mallocs, what that does to the figures and the remedy for
// the recording's source; "" otherwise.
func CapacityWarning(r *Result) string {
	if r == nil || r.Capacity != 0 || r.SourceOOMs == 0 {
		return ""
	}
	var remedy string
	switch r.TraceSource {
	case "pytorch":
		remedy = "the job probably ran under a memory cap, which a snapshot does not record: replay with --capacity set to that cap (torch.cuda.set_per_process_memory_fraction times the device memory)"
	case "kineto":
		remedy = "the job probably ran under a memory cap, which a torch.profiler trace does not record: replay with --capacity set to that cap (torch.cuda.set_per_process_memory_fraction times the device memory, the trace's Metadata device_memory)"
	case "rmm":
		remedy = "the pool probably had a maximum size, which the log does not record: replay with --capacity set to it (maximum_pool_size of the pool_memory_resource), or to the card's memory"
	case "cupy":
		remedy = "the pool probably had a limit, which the log does not record: replay with --capacity set to it (the pool's get_limit(), from set_limit or CUPY_GPU_MEMORY_LIMIT), or to the card's memory"
	case "record":
		remedy = "the trace does not name its card (a record run before the card was written): replay with --capacity set to the card's memory less its context (the H200's context is 552402944 bytes)"
	default:
		remedy = "replay with --capacity set to the memory the job had"
	}
	return fmt.Sprintf("the recording has %d failed malloc(s), which this replay without a capacity served: the peaks (requested, allocated and reserved alike) count them as if the card had given them; %s", r.SourceOOMs, remedy)
}

// LatencyRow summarizes the latencies of one device call in one size class,
// simulated by a cost model or measured on a GPU. Times are in nanoseconds;
// the percentiles come from a log-linear histogram and are exact to within
// 1.6%.
type LatencyRow struct {
	// Call is the device call: cudaMalloc, cudaFree, cudaMallocAsync,
	// cudaStreamSynchronize, ...
	Call string `json:"call"`
	// SizeClass names the range of sizes in bytes ("<=4KiB", "<=1MiB",
	// ">4GiB"), or "-" for calls without a size.
	SizeClass string `json:"size_class"`
	Count     int64  `json:"count"`
	TotalNS   int64  `json:"total_ns"`
	MedianNS  int64  `json:"median_ns"`
	P90NS     int64  `json:"p90_ns"`
	P99NS     int64  `json:"p99_ns"`
	MaxNS     int64  `json:"max_ns"`
}

// SitesAtPeak is where the memory a policy reserved at its peak came
// from, by allocation site (package sim/sites computes it): the live
// allocations at the end of event Event, the one at whose end the
// reserved bytes first reached their peak, grouped by the site of their
// malloc, with the reserved bytes they do not use shared out among the
// sites of each segment. The rows' LiveBytes and UnusedBytes sum to
// Reserved.
type SitesAtPeak struct {
	// Event is the peak's event index, Time its time in nanoseconds.
	Event int64 `json:"event"`
	Time  int64 `json:"time_ns"`
	// Reserved is the reserved bytes at the peak (Result.PeakReserved).
	Reserved uint64 `json:"reserved_bytes"`
	// Depth is the number of frames of a site (--site-depth).
	Depth int `json:"depth"`
	// Sites are the rows, most bytes (live and unused) first; past the
	// top asked for, the rest are one row "(N other sites)".
	Sites []SiteBytes `json:"sites"`
}

// SiteBytes is one allocation site's memory at the peak.
type SiteBytes struct {
	// Site names the code: "FILE:LINE:FUNCTION" of the malloc's
	// innermost frame of user code (callers after " < " for a depth
	// above 1), a `record run` malloc's call site, or a row in
	// parentheses ("(no stack)", "(cached: no live block)").
	Site string `json:"site"`
	// LiveBytes are the requested bytes of the site's live allocations,
	// Count their number.
	LiveBytes uint64 `json:"live_bytes"`
	Count     int64  `json:"count"`
	// UnusedBytes are the site's share of the reserved bytes that no live
	// allocation requested (rounding, free and pending-free blocks) in
	// the segments that hold its allocations, in proportion to its live
	// bytes in each.
	UnusedBytes uint64 `json:"unused_bytes"`
}

// PartedWarning returns the warning of a result whose replay parted from
// the recording it replays as recorded (Parted); "" if it did not, or
// parted at an OOM of a replay without a capacity (which serves every
// malloc: CapacityWarning says what that does).
func PartedWarning(r *Result) string {
	switch {
	case r == nil || r.Parted == "":
		return ""
	case r.PartedAtOOM && r.Capacity == 0:
		return ""
	case r.PartedAtOOM:
		return fmt.Sprintf("the simulation of %s parts from the recording at %s: unless the capacity of %d bytes is not the job's (which would explain an OOM where the job had none, or the reverse), the figures are the simulation's from there on, not the real allocator's", r.Policy, r.Parted, r.Capacity)
	}
	hint := ""
	if r.Capacity == 0 || r.CapacityFromCard {
		// Under a cap the caching allocator releases (and collects) where
		// it would not without one.
		hint = " (if the job ran under a memory cap, which a recording does not record, replay it with --capacity set to that cap)"
	}
	return fmt.Sprintf("the simulation of %s parts from the recording at %s: the figures are the simulation's from there on, not the real allocator's%s", r.Policy, r.Parted, hint)
}

// JoinSettings joins a policy's settings as key=value in the order of
// their keys, separated by sep: "expandable_segments=True;max_split_size_mb=64".
func JoinSettings(s map[string]string, sep string) string {
	keys := slices.Sorted(maps.Keys(s))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + s[k]
	}
	return strings.Join(parts, sep)
}

// RecordedPolicy returns the policy that simulates the allocator a trace
// of the source (trace.Header.Source) was recorded under: cupy for CuPy
// logs, bfc for XSpaces, pytorch for PyTorch snapshots, torch.profiler
// traces and record run traces; ok is false for sources that record no
// allocator's decisions (and "pytorch" is returned as the default).
func RecordedPolicy(source string) (name string, ok bool) {
	switch source {
	case "cupy":
		return "cupy", true
	case "xspace":
		return "bfc", true
	case "pytorch", "kineto", "record":
		return "pytorch", true
	}
	return "pytorch", false
}

// ReservedOverRequested is the peak reserved bytes over the peak requested
// (the lower bound), ok false where nothing was requested: ×req.
func (r *Result) ReservedOverRequested() (ratio float64, ok bool) {
	if r.PeakRequested == 0 {
		return 0, false
	}
	return float64(r.PeakReserved) / float64(r.PeakRequested), true
}

// ReservedOverOffline is the peak reserved bytes over the offline
// policy's (PeakOffline), ok false where it is unknown: ×offline.
func (r *Result) ReservedOverOffline() (ratio float64, ok bool) {
	if r.PeakOffline == 0 {
		return 0, false
	}
	return float64(r.PeakReserved) / float64(r.PeakOffline), true
}

// ReservedOverOptimum is the peak reserved bytes over the proven least
// peak (PeakOptimum), ok false where it is unknown: ×optimum.
func (r *Result) ReservedOverOptimum() (ratio float64, ok bool) {
	if r.PeakOptimum == 0 {
		return 0, false
	}
	return float64(r.PeakReserved) / float64(r.PeakOptimum), true
}

// PlanBound is what a clairvoyant policy knows of its plan
// (policies.PlanBounder), in bytes after its rounding.
type PlanBound struct {
	// Height is the plan's peak: its arena.
	Height uint64 `json:"height_bytes"`
	// LowerBound is proven: no placement of the trace's mallocs has a
	// lower peak.
	LowerBound uint64 `json:"lower_bound_bytes"`
	// Proven reports that Height is the least (Height == LowerBound).
	Proven bool `json:"proven"`
	// Seconds is the time the plan took (a time limit may have ended
	// it); Nodes the search nodes it used.
	Seconds float64 `json:"seconds"`
	Nodes   int64   `json:"nodes"`
	// Stopped says, when not Proven, what ended the search: "time",
	// "nodes" (its limits), "pairs" (too many blocks live at once to
	// search).
	Stopped string `json:"stopped,omitempty"`
}

// Gap is the plan's height over its proven lower bound, less 1 (0 when
// proven), ok false where the bound is 0.
func (b *PlanBound) Gap() (gap float64, ok bool) {
	if b.LowerBound == 0 {
		return 0, false
	}
	return float64(b.Height)/float64(b.LowerBound) - 1, true
}

// PeakUnallocatedShare is GMLake's fragmentation figure: 1 - peak
// allocated / peak reserved (the two peaks need not be at one event), 0
// where nothing was reserved or allocated reached it.
func (r *Result) PeakUnallocatedShare() float64 {
	if r.PeakReserved == 0 || r.PeakAllocated >= r.PeakReserved {
		return 0
	}
	return 1 - float64(r.PeakAllocated)/float64(r.PeakReserved)
}

// ByFigure orders results for a table: by trace in the order they first
// appear, then those without OOM before those with, then by peak reserved
// bytes, then by policy name. It sorts a copy and returns it.
func ByFigure(rs []*Result) []*Result {
	first := map[string]int{}
	for i, r := range rs {
		if _, ok := first[r.Trace]; !ok {
			first[r.Trace] = i
		}
	}
	out := slices.Clone(rs)
	slices.SortStableFunc(out, func(a, b *Result) int {
		if c := cmp.Compare(first[a.Trace], first[b.Trace]); c != 0 {
			return c
		}
		if (a.OOMs > 0) != (b.OOMs > 0) {
			if a.OOMs > 0 {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.PeakReserved, b.PeakReserved); c != 0 {
			return c
		}
		return strings.Compare(a.Policy, b.Policy)
	})
	return out
}

// ContextBytes is the memory in bytes a device's context holds before the
// first allocation, as measured on an H200 (CUDA 13.0, driver 580.159;
// ../shared/reference/CUDA_MEASURED.md, "Footprint"): a card's memory less
// it is what allocations can take.
const ContextBytes = 552402944
