package replaycli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A record run trace of a program whose 1 PiB cudaMalloc the card refused,
// on an H200 (cudaMemGetInfo total 150754820096 bytes): without --capacity
// the capacity is the card less its 552402944-byte context, so the malloc
// fails at its event and no figure counts it; --capacity 0 serves it and
// says so.
const cardTrace = `header source=record device="NVIDIA H200" device_memory=150754820096
malloc id=1 size=1GiB t=0
malloc_failed size=1125899906842624 t=10
free id=1 t=20
`

func TestCardCapacity(t *testing.T) {
	path := writeTrace(t, cardTrace)
	js := filepath.Join(t.TempDir(), "r.json")
	out, _, err := runCmd(t, "sim", "--policy", "cuda", "--json", js, path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "capacity 150202417152 bytes: the recorded card's 150754820096 bytes less its 552402944-byte context") {
		t.Errorf("no note of the card's capacity:\n%s", out)
	}
	if strings.Contains(out, "failed malloc(s), which this replay without a capacity served") {
		t.Errorf("the hint to give a capacity, with the card's:\n%s", out)
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Capacity      uint64 `json:"capacity_bytes"`
			FromCard      bool   `json:"capacity_from_card"`
			PeakRequested uint64 `json:"peak_requested_bytes"`
			PeakAllocated uint64 `json:"peak_allocated_bytes"`
			PeakReserved  uint64 `json:"peak_reserved_bytes"`
			OOMs          int64  `json:"ooms"`
			FirstOOM      int64  `json:"first_oom_event"`
			Served        int64  `json:"source_ooms_served"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	r := doc.Results[0]
	if r.Capacity != 150202417152 || !r.FromCard || r.OOMs != 1 || r.FirstOOM != 1 || r.Served != 0 ||
		r.PeakRequested != 1<<30 || r.PeakAllocated != 1<<30 || r.PeakReserved != 1<<30 {
		t.Errorf("result %+v, want capacity 150202417152 from the card, the OOM at event 1, peaks of 1 GiB", r)
	}

	// --capacity 0 is unlimited: the refused malloc is served, and the
	// note says what that does to the figures and what to do.
	out, errOut, err := runCmd(t, "sim", "--policy", "cuda", "--capacity", "0", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(errOut, path+": warning: the recording has 1 failed malloc(s), which this replay without a capacity served") || strings.Contains(out, "recorded card's") {
		t.Errorf("with --capacity 0:\n%s\nstderr:\n%s", out, errOut)
	}
}

// TestLowerBoundNote: the note's lower bound is the trace's peak
// requested, from a policy that served every malloc, not the first row's
// (buddy, rounding 1 GiB + 1 byte to 2 GiB, runs out of memory under a 2
// GiB + 1 MiB capacity and requests only the first malloc's bytes).
func TestLowerBoundNote(t *testing.T) {
	path := writeTrace(t, `malloc id=1 size=1073741825
malloc id=2 size=1073741825
free id=1
free id=2
`)
	out, _, err := runCmd(t, "sim", "--policy", "buddy,cuda,offline", "--capacity", "2148532224", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "hard lower bound (peak requested, every malloc served) 2147483650 bytes") {
		t.Errorf("no lower bound of 2147483650 bytes:\n%s", out)
	}
}
