package fit

import (
	"fmt"

	"github.com/gpualloc/allocsim/internal/termsafe"
	"github.com/gpualloc/allocsim/sim/results"
)

// CardFootprint parses a card (ParseCard) and returns what a replay on it
// may hold: its memory less the context (results.ContextBytes), in bytes,
// and a line that says so ("card H200: 150109880320 bytes, less its
// 552402944-byte context: the footprint held to 149557477376 bytes"). It
// returns an error for no card, or one not above the context.
func CardFootprint(spec string) (footprint uint64, line string, err error) {
	c, err := ParseCard(spec)
	if err != nil {
		return 0, "", err
	}
	b := c.Capacity
	if b <= results.ContextBytes {
		return 0, "", fmt.Errorf("%q: not above the %d-byte context", spec, uint64(results.ContextBytes))
	}
	footprint = b - results.ContextBytes
	line = fmt.Sprintf("card %s: %d bytes%s, less its %d-byte context: the footprint held to %d bytes", termsafe.String(c.Label()), b, NominalNote(c), uint64(results.ContextBytes), footprint)
	return footprint, line, nil
}

// NominalNote is what a line naming a card adds for a nominal one
// (Card.Nominal): "" for a measured one.
func NominalNote(c results.Card) string {
	if c.Nominal {
		return " (nominal: as sold, not what CUDA reports for it)"
	}
	return ""
}
