package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim"
)

// TestFitSplitFragOOM finds the smallest capacities of split_frag_oom (it
// ran out of memory under a 4000 MiB cap) and checks each by replaying at
// it and one byte below.
func TestFitSplitFragOOM(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "fit.json")
	stdout, _, err := runCmd(t, "fit", "--policy", "pytorch,cuda", "--json", js, splitFragOOM)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Results []fitResult }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 {
		t.Fatalf("%d results", len(doc.Results))
	}
	// pytorch: a 1500 MiB malloc on top of 3000 MiB in 20 MiB-split
	// segments needs 4500 MiB; cuda's exact segments 3900 MiB.
	for k, want := range []uint64{4500 << 20, 3900 << 20} {
		r := doc.Results[k]
		if r.Trace != splitFragOOM || !r.Fits || r.MinCapacity != want || r.LowerBound != 3000<<20 || !r.Monotone {
			t.Errorf("%s: %+v", r.Policy, r)
		}
		if len(r.Cards) != 7 || r.Cards[0].Name != "16GB" || r.Cards[0].Capacity != 16e9 || !r.Cards[0].Fits {
			t.Errorf("%s: cards %+v", r.Policy, r.Cards)
		}
		for _, c := range []uint64{want, want - 1} {
			out := filepath.Join(dir, "sim.json")
			if _, _, err := runCmd(t, "sim", "--policy", r.Policy, "--capacity", strconv.FormatUint(c, 10), "--json", out, splitFragOOM); err != nil {
				t.Fatal(err)
			}
			if ooms := readResults(t, out)[0].OOMs; (ooms == 0) != (c == want) {
				t.Errorf("%s at %d bytes: %d OOMs", r.Policy, c, ooms)
			}
		}
	}
	if !strings.Contains(stdout, "4718592000") || !strings.Contains(stdout, "141GB") {
		t.Errorf("table:\n%s", stdout)
	}
}

// TestFitSearch runs the search against made-up outcomes: a capacity fits
// when fits says so, and a replay that fits reserves min(capacity, 1200)
// bytes; the lower bound is 800.
func TestFitSearch(t *testing.T) {
	cards := []card{{Name: "900B", Capacity: 900}, {Name: "1GB", Capacity: 1e9}}
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
			f := &fitter{cfg: sim.Config{Policy: "p"}, probes: map[uint64]fitProbe{}}
			f.run = func(c uint64) (*sim.Result, error) {
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
			r, err := f.fit(cards)
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

func TestFitErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fit"}, "fit: no trace given"},
		{[]string{"fit", "--cards", "16GB,huge", splitFragOOM}, `--cards "huge"`},
		{[]string{"fit", "--policy", "magic", splitFragOOM}, `unknown policy "magic"`},
		{[]string{"fit", "nope.trace"}, "no such file"},
	} {
		if _, _, err := runCmd(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}
