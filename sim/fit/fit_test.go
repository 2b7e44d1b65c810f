package fit

import (
	"reflect"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/sim/results"
)

// TestFitSearch runs the search against made-up outcomes: a capacity fits
// when fits says so, and a replay that fits reserves min(capacity, 1200)
// bytes; the lower bound is 800.
func TestFitSearch(t *testing.T) {
	cards := []results.Card{{Name: "900B", Capacity: 900}, {Name: "1GB", Capacity: 1e9}}
	for _, tc := range []struct {
		name     string
		fits     func(c uint64) bool
		min      uint64
		monotone bool
		above    []uint64 // capacities above min that run out of memory
		cards    []bool
	}{
		{"monotone", func(c uint64) bool { return c >= 1000 }, 1000, true, nil, []bool{false, true}},
		{"hole above", func(c uint64) bool { return c >= 1000 && (c < 1100 || c >= 1150) }, 1000, false, []uint64{1100, 1125}, []bool{false, true}},
		{"island below", func(c uint64) bool { return c >= 1000 || (c >= 850 && c < 900) }, 850, false, nil, []bool{false, true}},
		{"never", func(c uint64) bool { return false }, 0, true, nil, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replay := func(c uint64) (*sim.Result, error) {
				r := &sim.Result{PeakRequested: 800, FirstOOMEvent: -1}
				if c == 0 {
					c = 1200
				}
				if tc.fits(c) {
					r.PeakReserved = min(c, 1200)
				} else {
					r.OOMs, r.FirstOOMEvent = 1, 7
				}
				return r, nil
			}
			r, err := Search(sim.Config{Policy: "p"}, cards, 0, replay)
			if err != nil {
				t.Fatal(err)
			}
			if r.MinCapacity != tc.min || r.Fits != (tc.min > 0) || r.Monotone != tc.monotone {
				t.Errorf("min %d fits %v monotone %v; want %d, %v", r.MinCapacity, r.Fits, r.Monotone, tc.min, tc.monotone)
			}
			if tc.above != nil {
				var got []uint64
				for _, p := range r.NonMonotone {
					got = append(got, p.Capacity)
				}
				if !reflect.DeepEqual(got, tc.above) {
					t.Errorf("non-monotone at %v, want %v", got, tc.above)
				}
			}
			for k, c := range r.Cards {
				if c.Fits != tc.cards[k] {
					t.Errorf("card %s fits %v", c.Name, c.Fits)
				}
			}
			for _, p := range r.Probes {
				if p.OOM == tc.fits(p.Capacity) {
					t.Errorf("probe %+v", p)
				}
			}
			if r.Replays != len(r.Probes)+1 {
				t.Errorf("%d replays, %d probes", r.Replays, len(r.Probes))
			}
		})
	}
}

// TestFitContext: a card holds the context and the replay's peak
// footprint. The replay fits from 1000 bytes, reserves min(capacity, 1200)
// and takes 100 bytes more of the card than it reserves: the footprint
// fits the capacity only from 1300 on (1200 reserved, 1300 taken), so with
// a context of 100 bytes the smallest card is 1400; a card of 1350 bytes
// leaves 1250, where the footprint of 1300 does not fit, and one of 1400
// leaves 1300, where it does.
func TestFitContext(t *testing.T) {
	replay := func(c uint64) (*sim.Result, error) {
		if c == 0 {
			c = 1200
		}
		if c < 1000 {
			return &sim.Result{PeakRequested: 800, OOMs: 1, FirstOOMEvent: 7}, nil
		}
		res := min(c, 1200)
		return &sim.Result{PeakRequested: 800, PeakReserved: res, PeakFootprint: res + 100, FirstOOMEvent: -1}, nil
	}
	cards := []results.Card{{Name: "1350B", Capacity: 1350}, {Name: "1400B", Capacity: 1400}, {Name: "100B", Capacity: 100}}
	r, err := Search(sim.Config{Policy: "p"}, cards, 100, replay)
	if err != nil {
		t.Fatal(err)
	}
	if r.MinCapacity != 1000 || r.MinCard != 1400 || r.Context != 100 {
		t.Errorf("min capacity %d, min card %d, context %d; want 1000, 1400, 100", r.MinCapacity, r.MinCard, r.Context)
	}
	for k, want := range []bool{false, true, false} {
		if r.Cards[k].Fits != want {
			t.Errorf("card %s fits %v, want %v", r.Cards[k].Name, r.Cards[k].Fits, want)
		}
	}
}

func TestParseCards(t *testing.T) {
	cards, err := ParseCards(DefaultCards)
	if err != nil || len(cards) != 7 || cards[1] != (results.Card{Name: "24GB", Capacity: 24e9}) {
		t.Errorf("%v, %v", cards, err)
	}
	if _, err := ParseCards("16GB,huge"); err == nil || err.Error() != `"huge": not a size` {
		t.Errorf("err = %v", err)
	}
	if _, err := ParseCards("0"); err == nil {
		t.Error("a card of 0 bytes is accepted")
	}
}
