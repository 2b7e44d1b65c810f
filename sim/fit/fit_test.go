package fit

import (
	"reflect"
	"strings"
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
			replay := func(c uint64, card bool) (*sim.Result, error) {
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
// and takes 100 bytes more of the card than it reserves: on a card it fits
// only from 1300 on (1200 reserved, 1300 taken), so with a context of 100
// bytes the smallest card is 1400; a card of 1350 bytes leaves 1250, where
// the footprint of 1300 does not fit, and one of 1400 leaves 1300, where
// it does.
func TestFitContext(t *testing.T) {
	replay := func(c uint64, card bool) (*sim.Result, error) {
		if c == 0 {
			c = 1300
		}
		if c < 1000 || card && c < 1300 {
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

// TestFitCardPool: a policy that reserves its whole capacity (a pool
// sized from the device; 1200 bytes unlimited) needs 1000 bytes reserved,
// and its pages take 100 bytes more than it reserves. Held to the reserved
// bytes it fits from 1000, taking capacity + 100 of the card; on a card it
// reserves what the pages leave and fits from 1100. With a context of 100
// the smallest card is 1200, and a card of 1250 bytes (1150 left) fits,
// though the reserved-held replay at 1150 takes 1250 there.
func TestFitCardPool(t *testing.T) {
	var cardRuns int
	replay := func(c uint64, card bool) (*sim.Result, error) {
		if c == 0 {
			c = 1200
		}
		if card {
			cardRuns++
			if c < 1100 {
				return &sim.Result{PeakRequested: 800, OOMs: 1, FirstOOMEvent: 7}, nil
			}
			return &sim.Result{PeakRequested: 800, PeakReserved: c - 100, PeakFootprint: c, FirstOOMEvent: -1}, nil
		}
		if c < 1000 {
			return &sim.Result{PeakRequested: 800, OOMs: 1, FirstOOMEvent: 7}, nil
		}
		return &sim.Result{PeakRequested: 800, PeakReserved: c, PeakFootprint: c + 100, FirstOOMEvent: -1}, nil
	}
	cards := []results.Card{{Name: "1250B", Capacity: 1250}, {Name: "1150B", Capacity: 1150}}
	r, err := Search(sim.Config{Policy: "p"}, cards, 100, replay)
	if err != nil {
		t.Fatal(err)
	}
	if r.MinCapacity != 1000 || r.MinCard != 1200 {
		t.Errorf("min capacity %d, min card %d; want 1000, 1200", r.MinCapacity, r.MinCard)
	}
	for k, want := range []bool{true, false} {
		if r.Cards[k].Fits != want {
			t.Errorf("card %s fits %v, want %v", r.Cards[k].Name, r.Cards[k].Fits, want)
		}
	}
	var listed int
	for _, p := range r.Probes {
		if p.Card {
			listed++
		}
	}
	if listed != cardRuns || r.Replays != len(r.Probes)+1 {
		t.Errorf("%d card replays, %d listed; %d replays, %d probes", cardRuns, listed, r.Replays, len(r.Probes))
	}
}

func TestParseCards(t *testing.T) {
	cards, err := ParseCards(DefaultCards)
	if err != nil || len(cards) != 6 || cards[1] != (results.Card{Name: "L4-24GB", Capacity: 24e9, Nominal: true}) ||
		cards[2] != (results.Card{Name: "A100-40GB", Capacity: 42298834944}) || cards[5] != (results.Card{Name: "H200", Capacity: 150109880320}) {
		t.Errorf("%v, %v", cards, err)
	}
	if _, err := ParseCards("16GB,huge"); err == nil || err.Error() != `"huge": not a card (a size like 80GB, a name like H100-80GB, or one of A10-24GB, A100-40GB, A100-80GB, H100-80GB, H100-94GB, H200, L4-24GB, L40S-48GB, T4-16GB)` {
		t.Errorf("err = %v", err)
	}
	if _, err := ParseCards("0"); err == nil {
		t.Error("a card of 0 bytes is accepted")
	}
}

// ParseCard takes a size, a card of NamedCards by name (its measured
// memory, or its nominal size marked) or a name ending in its nominal
// size. A card's label gives its GiB, a nominal one's marked.
func TestParseCard(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    uint64
		nominal bool
		label   string
	}{
		{"80GB", 80e9, true, "80GB ~74.5GiB"}, {"H100-80GB", 80e9, true, "H100-80GB ~74.5GiB"}, {"A100-40GB", 42298834944, false, "A100-40GB 39.4GiB"},
		{"a100-40gb", 42298834944, false, "a100-40gb 39.4GiB"}, {"h200", 150109880320, false, "h200 139.8GiB"},
		{"H200", 150109880320, false, "H200 139.8GiB"}, {"24GiB", 24 << 30, true, "24GiB ~24.0GiB"}, {"RTX4090-24GB", 24e9, true, "RTX4090-24GB ~22.4GiB"},
	} {
		c, err := ParseCard(tc.in)
		if err != nil || c.Capacity != tc.want || c.Name != tc.in || c.Nominal != tc.nominal || c.Label() != tc.label {
			t.Errorf("ParseCard(%q) = %+v (%s), %v; want %d, nominal %v, %q", tc.in, c, c.Label(), err, tc.want, tc.nominal, tc.label)
		}
	}
	for _, bad := range []string{"", "H100", "0GB", "H100-", "big"} {
		if _, err := ParseCard(bad); err == nil || !strings.Contains(err.Error(), "not a card") {
			t.Errorf("ParseCard(%q): %v", bad, err)
		}
	}
}
