package results

// Tune is one candidate of replay tune on one trace: a
// PYTORCH_CUDA_ALLOC_CONF string and its replay (Result, whose keys it
// has in the JSON), its rank among the trace's candidates (1 the best, by
// fewer OOMs, then peak reserved bytes, then device calls, then allocator
// time), whether it is on the Pareto front of those three figures, and
// whether it is the recommendation. The replay of the trace as recorded
// is a record of its own, Recorded, of rank 0, that the recommendation's
// prediction is set against.
type Tune struct {
	Result
	// Conf is the setting string; "" is PyTorch's default.
	Conf string `json:"conf"`
	// Rank is the candidate's rank, from 1; 0 for the recorded setting.
	Rank int `json:"rank"`
	// Front says the candidate is on the Pareto front.
	Front bool `json:"front,omitempty"`
	// Recommended marks the candidate of rank 1, the string to set.
	Recommended bool `json:"recommended,omitempty"`
	// Recorded marks the replay of the trace as recorded; Conf is then
	// the setting the trace recorded.
	Recorded bool `json:"recorded,omitempty"`
	// SameAs is the setting string whose replay gave this candidate its
	// figures (a value that could not have acted), "" when it was
	// replayed itself.
	SameAs string `json:"same_as,omitempty"`
}
