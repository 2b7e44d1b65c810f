package results

// Fit is one policy's answer of replay fit for one trace: the smallest
// device capacity at which its replay has no OOM, against the trace's lower
// bound, and whether it fits each card size. Sizes are in bytes.
type Fit struct {
	Trace    string            `json:"trace"`
	Policy   string            `json:"policy"`
	Settings map[string]string `json:"settings,omitempty"`
	// MinCapacity is the smallest capacity in bytes found at which the
	// replay has no OOM; 0 when none was (Fits false).
	MinCapacity uint64 `json:"min_capacity_bytes"`
	// Fits is false when the replay runs out of memory at every capacity
	// tried, unlimited included.
	Fits bool `json:"fits"`
	// LowerBound is the trace's peak requested bytes: no policy fits below.
	LowerBound uint64 `json:"lower_bound_bytes"`
	// UnlimitedPeakReserved is the policy's peak reserved bytes on an
	// unlimited device.
	UnlimitedPeakReserved uint64 `json:"unlimited_peak_reserved_bytes"`
	// Monotone is false when a probed capacity above MinCapacity ran out
	// of memory (listed in NonMonotone).
	Monotone    bool    `json:"monotone"`
	NonMonotone []Probe `json:"non_monotone,omitempty"`
	// Cards says for each card size whether the replay at its capacity
	// has no OOM.
	Cards []CardFit `json:"cards"`
	// Replays counts the replays the search took; Probes lists every
	// capacity replayed, by capacity.
	Replays int     `json:"replays"`
	Probes  []Probe `json:"probes"`
}

// Probe is the outcome of one replay of a fit search at a capacity in
// bytes.
type Probe struct {
	Capacity uint64 `json:"capacity_bytes"`
	OOM      bool   `json:"oom"`
	// PeakReserved is the peak reserved bytes of a replay without OOM
	// (0 for one that ran out of memory: the replay stops at the first).
	PeakReserved uint64 `json:"peak_reserved_bytes,omitempty"`
	// FirstOOMEvent is the event index of the first OOM, -1 if none.
	FirstOOMEvent int64 `json:"first_oom_event"`
}

// Card is a device memory size, with its name as cards are sold ("24GB");
// Capacity is in bytes.
type Card struct {
	Name     string `json:"name"`
	Capacity uint64 `json:"capacity_bytes"`
}

// CardFit says whether a replay at a card's capacity has no OOM.
type CardFit struct {
	Card
	Fits bool `json:"fits"`
}
