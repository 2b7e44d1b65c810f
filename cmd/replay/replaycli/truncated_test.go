package replaycli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace/pytorch"
)

// TestSimTruncated replays a snapshot whose history was cut: a 20 MiB
// segment and a 4 MiB block in it existed before the first entry, which
// frees the block. The table and the JSON say the trace was truncated and
// how many events rebuilt its start.
func TestSimTruncated(t *testing.T) {
	const seg = 0x7f0000000000
	dir := t.TempDir()
	path := filepath.Join(dir, "cut.pickle")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := pytorch.NewSnapshotWriter(f, 0)
	for _, e := range []pytorch.TraceEntry{
		{Action: "alloc", Addr: seg + 4<<20, Size: 2 << 20, TimeUS: 1},
		{Action: "free_requested", Addr: seg + 4<<20, Size: 2 << 20, TimeUS: 2},
		{Action: "free_completed", Addr: seg + 4<<20, Size: 2 << 20, TimeUS: 3},
		{Action: "free_requested", Addr: seg, Size: 4 << 20, TimeUS: 4},
		{Action: "free_completed", Addr: seg, Size: 4 << 20, TimeUS: 5},
	} {
		if err := w.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	segs := []pytorch.Segment{{Address: seg, TotalSize: 20 << 20, Blocks: []pytorch.Block{{Size: 20 << 20, State: pytorch.StateInactive}}}}
	if err := w.Close(segs, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()

	jsonPath := filepath.Join(dir, "out.json")
	stdout, stderr, err := runCmd(t, "sim", "--policy", "pytorch", "--json", jsonPath, path)
	if err != nil {
		t.Fatal(err)
	}
	// marker, segment_alloc, malloc and free of the segment, the block,
	// the free 16 MiB after it and its free.
	warning := "truncated history (it starts mid-run): 7 events at its start rebuild the state before its first entry; peaks count from there"
	if want := path + ": warning: " + warning + "\n"; stderr != want || strings.Contains(stdout, "truncated") {
		t.Errorf("table:\n%s\nstderr:\n%s\nwant on stderr %q", stdout, stderr, want)
	}
	rs := readResults(t, jsonPath)
	if len(rs) != 1 || !rs[0].Truncated || rs[0].ReconstructedEvents != 7 || rs[0].Events != 12 ||
		rs[0].PeakReserved != 20<<20 || rs[0].Anomalies != 0 || len(rs[0].Warnings) != 1 || rs[0].Warnings[0] != warning {
		t.Errorf("results %+v", rs)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"truncated": true`) || !strings.Contains(string(raw), `"reconstructed_events": 7`) {
		t.Errorf("JSON lacks truncated or reconstructed_events:\n%s", raw)
	}
	// check and stats say it too (they were silent where sim warned).
	for _, cmd := range []string{"check", "stats"} {
		out, _, _ := runCmd(t, cmd, path)
		if !strings.Contains(out, "truncated history (it starts mid-run): its first 7 events rebuild the state before its first entry") {
			t.Errorf("%s:\n%s", cmd, out)
		}
	}
}
