package policies

// Warner is implemented by policies whose figures call for a caution that
// only the policy can give: where the trace could not tell it what it
// needed (a plan made from a profile of the trace that later events part
// from, boundaries it had to guess). The engine asks once, when the replay
// ends, and adds the lines to the result's warnings; each line names the
// event it is about.
type Warner interface {
	// Warnings returns the policy's warnings, one line each, nil if none.
	Warnings() []string
}
