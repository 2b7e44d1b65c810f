package results

// CallSeq is a recorded sequence of device calls, as package gpu's Runtime
// replays it in a plain C loop: call i is a cudaMalloc of size[i] bytes
// into slot[i] when size[i] > 0, else a cudaFree of the pointer in slot[i].
type CallSeq interface {
	Len() int
	Calls() (size []uint64, slot []int32)
}

// GPU is the outcome of replaying one trace on the GPU (package gpu's
// Result): the keys of
// `replay sim` (with the real device's figures) and the measured ones.
// Times are in nanoseconds, sizes in bytes.
type GPU struct {
	Result
	// Runtime is the CUDA runtime loaded and its version; Device the GPU's
	// name.
	Runtime string `json:"runtime"`
	Device  string `json:"device"`
	// MaxBytes is the limit the replay held to.
	MaxBytes uint64 `json:"max_bytes"`
	// AllocTimeNS is the measured time in device-memory allocation and free
	// calls (cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync,
	// cudaMemPoolTrimTo), each timed in C around the call;
	// SyncTimeNS likewise for the synchronizations.
	AllocTimeNS int64 `json:"alloc_time_ns"`
	SyncTimeNS  int64 `json:"sync_time_ns"`
	// Calls counts the timed runtime calls.
	Calls int64 `json:"calls"`
	// PolicyTimeNS is the wall time spent in a simulated policy's Malloc
	// and Free, its device calls included: their time as timed in C, plus
	// the policy's own time estimated from one call in 16 (for a direct
	// target, its device calls' time).
	PolicyTimeNS int64 `json:"policy_time_ns"`
	// ReplayWallNS is the wall time of the replay of the events, decoding
	// and sampling left out.
	ReplayWallNS int64 `json:"replay_wall_ns"`
	// Driver is the driver's own view of the memory.
	Driver DriverView `json:"driver"`
	// SimPolicy names the policy simulated for the comparison ("" for
	// none); SimPeakReserved is its peak reserved bytes, SimCostModel the
	// cost model, and SimAllocTimeNS its simulated allocator time.
	SimPolicy       string `json:"sim_policy,omitempty"`
	SimPeakReserved uint64 `json:"sim_peak_reserved_bytes,omitempty"`
	SimCostModel    string `json:"sim_cost_model,omitempty"`
	// SimLatency is the simulated latency summary.
	SimLatency []LatencyRow `json:"sim_latency,omitempty"`
	// Paced is set when the replay kept the trace's idle times
	// (package gpu's Config.Pace).
	Paced bool `json:"paced,omitempty"`
	// Interrupted is set when the replay stopped early (Ctrl-C); the
	// figures cover the events replayed.
	Interrupted bool `json:"interrupted,omitempty"`
	// CLoop is the plain C loop of the same calls, when run.
	CLoop *CLoop `json:"c_loop,omitempty"`
	// Runs are the figures of every run when the replay was repeated
	// (package gpu's Repeat); the result is the run of median allocator time.
	Runs []Run `json:"runs,omitempty"`

	// Seq is the recorded cudaMalloc/cudaFree sequence (package gpu's
	// *Seq, when its Config.RecordSeq is set); it is not written.
	Seq CallSeq `json:"-"`
}

// DriverView is what the driver says about memory, in bytes:
// cudaMemGetInfo's free memory at the start, at the end (after everything
// was freed) and the least seen in samples during the replay, and for the
// stream-ordered allocator the pool's reserved and used high-water marks.
type DriverView struct {
	Total            uint64 `json:"total_bytes"`
	FreeAtStart      uint64 `json:"free_at_start_bytes"`
	FreeAtEnd        uint64 `json:"free_at_end_bytes"`
	MinFree          uint64 `json:"min_free_bytes"`
	PoolReservedHigh uint64 `json:"pool_reserved_high_bytes,omitempty"`
	PoolUsedHigh     uint64 `json:"pool_used_high_bytes,omitempty"`
}

// Run is one run of a repeated replay, in nanoseconds.
type Run struct {
	AllocTimeNS  int64 `json:"alloc_time_ns"`
	SyncTimeNS   int64 `json:"sync_time_ns"`
	ReplayWallNS int64 `json:"replay_wall_ns"`
	// CLoopWallNS is the wall time of the plain C loop of the run's
	// cudaMalloc/cudaFree sequence, run right after it.
	CLoopWallNS int64 `json:"c_loop_wall_ns,omitempty"`
}

// CLoop compares the harness with a plain C loop of the same cudaMalloc and
// cudaFree sequence: each run of the replay is followed by the C loop, so
// that both see the driver in the same state, and the medians over the
// runs are compared.
type CLoop struct {
	Calls int64 `json:"calls"`
	// WallNS is the median wall time of the plain loop; TimedWallNS that of
	// one more loop timing each call as the harness does, and CallsNS the
	// sum of those calls' times.
	WallNS      int64 `json:"wall_ns"`
	TimedWallNS int64 `json:"timed_wall_ns"`
	CallsNS     int64 `json:"calls_ns"`
	// HarnessWallNS is the median of the harness's wall time for the same
	// calls (GPU.ReplayWallNS). OverheadPerCallNS is the median over
	// the runs of (harness wall - the plain loop's wall right after it) /
	// Calls: paired run by run, as the driver's own speed drifts between
	// runs (by 20% or more on an H200) far more than the harness costs.
	HarnessWallNS     int64   `json:"harness_wall_ns"`
	OverheadPerCallNS float64 `json:"overhead_per_call_ns"`
	// OutsideCallsPerCallNS is the median over the runs of the harness's
	// wall time outside the timed calls, per call, and
	// LoopOutsideCallsPerCallNS the same for the timed C loop: their
	// difference is what the harness adds over the raw calls, whatever
	// state the driver is in.
	OutsideCallsPerCallNS     float64 `json:"outside_calls_per_call_ns"`
	LoopOutsideCallsPerCallNS float64 `json:"loop_outside_calls_per_call_ns"`
}
