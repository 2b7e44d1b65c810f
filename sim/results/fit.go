package results

import "fmt"

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
	// MinCard is the smallest card in bytes found that the policy runs the
	// trace on: the context plus the smallest capacity at which the replay
	// on a card has no OOM (the device holds the card's memory the
	// segments take as the driver takes them, whole 2 MiB pages above 1
	// MiB, to the capacity, not the reserved bytes); 0 when none fits.
	// Cards above it need not all fit (a policy that fills its capacity
	// can take more pages there). Context is the bytes the device's context
	// holds before the first allocation.
	MinCard uint64 `json:"min_card_bytes"`
	Context uint64 `json:"context_bytes"`
	// Cards says for each card size whether the trace runs on it: the
	// replay on the card, its capacity less the context held to the
	// footprint, has no OOM.
	Cards []CardFit `json:"cards"`
	// Warnings are those of the replay on an unlimited device
	// (Result.Warnings): what makes its figures other than a clean
	// replay of the whole trace.
	Warnings []string `json:"warnings,omitempty"`
	// Replays counts the replays the search took; Probes lists every
	// capacity replayed, by capacity (a capacity replayed both ways, the
	// reserved bytes held first).
	Replays int     `json:"replays"`
	Probes  []Probe `json:"probes"`
}

// Probe is the outcome of one replay of a fit search at a capacity in
// bytes.
type Probe struct {
	Capacity uint64 `json:"capacity_bytes"`
	// Card says the replay was on a card: the device held its footprint
	// to Capacity (a card's memory less its context), not its reserved
	// bytes.
	Card bool `json:"card,omitempty"`
	OOM  bool `json:"oom"`
	// PeakReserved is the peak reserved bytes of a replay without OOM
	// (0 for one that ran out of memory: the replay stops at the first).
	PeakReserved uint64 `json:"peak_reserved_bytes,omitempty"`
	// PeakFootprint is its peak footprint in bytes (Result's), 0 for
	// one that ran out of memory.
	PeakFootprint uint64 `json:"peak_footprint_bytes,omitempty"`
	// FirstOOMEvent is the event index of the first OOM, -1 if none.
	FirstOOMEvent int64 `json:"first_oom_event"`
}

// Card is a device memory size, with its name as given ("H200", "24GB");
// Capacity is in bytes: what CUDA reports for the card where it was
// measured, else its nominal size as sold (Nominal), GB of 10^9 bytes,
// which need not be what its driver reports (for the cards measured, it
// reports more: 150109880320 bytes for the H200 sold as 141 GB).
type Card struct {
	Name     string `json:"name"`
	Capacity uint64 `json:"capacity_bytes"`
	Nominal  bool   `json:"nominal,omitempty"`
}

// Label is the card's name with its memory in GiB, a nominal one's marked
// with a '~': "H200 139.8GiB", "H100-80GB ~74.5GiB".
func (c Card) Label() string {
	mark := ""
	if c.Nominal {
		mark = "~"
	}
	return fmt.Sprintf("%s %s%.1fGiB", c.Name, mark, float64(c.Capacity)/(1<<30))
}

// NominalNote is the note under a table or chart that shows a nominal card.
const NominalNote = "~ nominal: the size the card is sold as, GB of 10^9 bytes, not a measurement of what CUDA reports for it (for the H200, sold as 141 GB, it reports 150109880320 bytes)"

// CardFit says whether the trace runs on a card (Fit.Cards).
type CardFit struct {
	Card
	Fits bool `json:"fits"`
}
