package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/sim/results"
)

// TestFitSplitFragOOM finds the smallest capacities of split_frag_oom (it
// ran out of memory under a 4000 MiB cap) and checks each by replaying at
// it and one byte below.
func TestFitSplitFragOOM(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "fit.json")
	stdout, stderr, err := runCmd(t, "fit", "--policy", "pytorch,cuda", "--json", js, splitFragOOM)
	if err != nil {
		t.Fatal(err)
	}
	// The unlimited replay served the recording's failed malloc: said once
	// on stderr, and in each answer's warnings.
	if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, splitFragOOM+": warning: the recording has 1 failed malloc(s)") {
		t.Errorf("stderr:\n%s", stderr)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Results []results.Fit }
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 {
		t.Fatalf("%d results", len(doc.Results))
	}
	// pytorch: a 1500 MiB malloc on top of 3000 MiB in 20 MiB-split
	// segments needs 4500 MiB; cuda's exact segments 3900 MiB, which is
	// the lower bound: the failed malloc, served, counts in the requested
	// bytes (2400 MiB live when it came).
	for k, want := range []uint64{4500 << 20, 3900 << 20} {
		r := doc.Results[k]
		if r.Trace != splitFragOOM || !r.Fits || r.MinCapacity != want || r.LowerBound != 3900<<20 || !r.Monotone || len(r.Warnings) != 1 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
		if len(r.Cards) != 6 || r.Cards[0].Name != "T4-16GB" || r.Cards[0].Capacity != 16e9 || !r.Cards[0].Nominal || !r.Cards[0].Fits ||
			r.Cards[5].Name != "H200" || r.Cards[5].Capacity != 150109880320 || r.Cards[5].Nominal {
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
	if !strings.Contains(stdout, "4718592000") || !strings.Contains(stdout, "H200 139.8GiB") || !strings.Contains(stdout, "H100-80GB ~74.5GiB") || !strings.Contains(stdout, "\n~ nominal: ") {
		t.Errorf("table:\n%s", stdout)
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
