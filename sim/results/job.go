package results

// Job is what holds for a multi-GPU job replayed under one policy, each
// rank on a device of its own: a results file of kind "sim" lists one per
// job and policy under "jobs", after the results of its ranks (each with
// its Result.Rank). Bytes are bytes; times are the traces'
// nanoseconds.
type Job struct {
	// Job names the job: the path of its traces with the rank's number as
	// '*' (job.rank*.trace).
	Job    string `json:"job"`
	Policy string `json:"policy"`
	// Ranks are the job's ranks, ascending; Traces the trace of each, as
	// its result names it, in the same order.
	Ranks  []int    `json:"ranks"`
	Traces []string `json:"traces"`
	// MaxReserved and MinReserved are the largest and smallest peak
	// reserved bytes of a rank, at ranks MaxReservedRank and
	// MinReservedRank (the lowest rank on a tie); Spread is how far the
	// smallest lies below the largest, over the largest (0..1).
	MaxReserved     uint64  `json:"max_reserved_bytes"`
	MaxReservedRank int     `json:"max_reserved_rank"`
	MinReserved     uint64  `json:"min_reserved_bytes"`
	MinReservedRank int     `json:"min_reserved_rank"`
	Spread          float64 `json:"spread"`
	// MaxFootprint is the largest peak footprint of a rank in bytes, at
	// rank MaxFootprintRank.
	MaxFootprint     uint64 `json:"max_footprint_bytes"`
	MaxFootprintRank int    `json:"max_footprint_rank"`
	// OOMRanks are the ranks that ran out of memory, ascending (empty for
	// none). FirstOOMRank is the one whose first OOM came first in time,
	// where the job fails (-1 when no rank ran out of memory, or when
	// several did in traces without times); FirstOOMEvent (-1 for none)
	// and FirstOOMTime are that OOM's event index and time.
	OOMRanks      []int `json:"oom_ranks"`
	FirstOOMRank  int   `json:"first_oom_rank"`
	FirstOOMEvent int64 `json:"first_oom_event"`
	FirstOOMTime  int64 `json:"first_oom_time_ns"`
}
