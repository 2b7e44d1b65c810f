package sim_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// cutScript writes, for each K given, the snapshot with the first K entries
// of device_traces[0] dropped: what PyTorch's ring buffer of trace entries
// keeps of a run that went on longer than max_entries. The final segments
// stay as they are.
const cutScript = `
import gzip, pickle, sys
src, out = sys.argv[1], sys.argv[2]
snap = pickle.load(gzip.open(src))
full = snap["device_traces"][0]
for k in sys.argv[3:]:
    snap["device_traces"][0] = full[int(k):]
    with open(out + "." + k + ".pickle", "wb") as f:
        pickle.dump(snap, f, protocol=4)
`

// TestTruncatedSnapshot cuts real snapshots at several points and
// replays each cut against the pytorch policy, which starts from the state
// Import rebuilt. With R(i) the bytes reserved after event i of the uncut
// replay, the cut at K (its first K entries dropped, n entries in all)
// must reach peak reserved max(R(K-1), R(K), ..., R(n-1)): the uncut
// replay's peak from the cut point on, the state at the cut included. The
// state after the reconstructed events must be the uncut state after
// event K-1 (reserved bytes, cached free bytes and largest free block), and
// no event may be an anomaly (a free of an address not live).
//
// Replayed as recorded (segments at their recorded addresses in both, so
// that best fit breaks ties between equal free blocks alike), the cut
// replay must moreover be in the uncut replay's state after every event
// from the cut on. Without it the uncut replay places segments in the
// order it makes them and the cut one in address order, and their states
// part a few thousand events after some cuts, though not their peaks.
func TestTruncatedSnapshot(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 to cut the snapshots")
	}
	for _, tc := range []struct {
		name         string
		big          bool
		cuts         []float64 // as fractions of the entries
		recordedOnly bool      // compare the replays as recorded only
	}{
		{name: "pytorch/train_gpt", cuts: []float64{0.25, 0.5, 0.77}},
		{name: "pytorch/kv_decode", big: true, cuts: []float64{0.3, 0.9}},
		{name: "pytorch/multistream", cuts: []float64{0.2, 0.5, 0.8}},
		{name: "pytorch/infer_dynbatch", cuts: []float64{0.2, 0.5, 0.8}},
		{name: "pytorch_cases/token_lengths", cuts: []float64{0.3, 0.6}},
		// Its uncut replay is the source's only with segments at their
		// recorded addresses (see the traces' README).
		{name: "pytorch/hf_llama_train", cuts: []float64{0.2, 0.5, 0.8}, recordedOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.big && testing.Short() {
				t.Skip("large trace; skipped under -short")
			}
			snap, _ := ptFind(tc.name)
			if snap == "" {
				t.Skip("snapshot not found (set ALLOCSIM_TRACES to the trace collection)")
			}
			uncut, h := replayStates(t, snap, false)
			uncutRec, _ := replayStates(t, snap, true)
			n := len(uncut)
			if h.Metadata["entries"] != strconv.Itoa(n) || h.Metadata["truncated"] != "" {
				t.Fatalf("%d events; uncut metadata %v", n, h.Metadata)
			}
			out := filepath.Join(t.TempDir(), "cut")
			args := []string{"-c", cutScript, snap, out}
			var ks []int
			for _, c := range tc.cuts {
				k := int(c * float64(n))
				ks = append(ks, k)
				args = append(args, strconv.Itoa(k))
			}
			if msg, err := exec.Command("python3", args...).CombinedOutput(); err != nil {
				t.Fatalf("cutting: %v\n%s", err, msg)
			}
			for _, k := range ks {
				path := fmt.Sprintf("%s.%d.pickle", out, k)
				for _, asRecorded := range []bool{false, true} {
					if tc.recordedOnly && !asRecorded {
						continue
					}
					u := uncut
					if asRecorded {
						u = uncutRec
					}
					var want uint64
					for _, s := range u[k-1:] {
						want = max(want, s.reserved)
					}
					r := runFile(t, path, asRecorded)
					rec := r.ReconstructedEvents
					t.Logf("cut at %d of %d, as recorded %v: %d events reconstructed; peak reserved %d, uncut from the cut %d",
						k, n, asRecorded, rec, r.PeakReserved, want)
					if !r.Truncated || rec == 0 {
						t.Errorf("cut at %d: truncated %v, %d reconstructed events", k, r.Truncated, rec)
					}
					if r.Events != int64(n-k)+rec {
						t.Errorf("cut at %d: %d events, want %d + %d", k, r.Events, n-k, rec)
					}
					if r.PeakReserved != want {
						t.Errorf("cut at %d: peak reserved %d, want %d (the uncut replay's from the cut on)", k, r.PeakReserved, want)
					}
					if len(r.Series) == 0 {
						t.Errorf("cut at %d: no series", k)
					} else if r.Series[0].Event < rec {
						t.Errorf("cut at %d: the series starts at event %d, before the history (%d)", k, r.Series[0].Event, rec)
					}
					if r.Anomalies != 0 {
						t.Errorf("cut at %d: %d anomalies, first: %s", k, r.Anomalies, r.FirstAnomaly)
					}
					cut, _ := replayStates(t, path, asRecorded)
					if len(cut) != n-k+int(rec) {
						t.Fatalf("cut at %d: %d events", k, len(cut))
					}
					// From the state after the last reconstructed event (the
					// uncut state after event K-1) on; without recorded
					// addresses that state only.
					end := len(cut)
					if !asRecorded {
						end = int(rec)
					}
					for j := int(rec) - 1; j < end; j++ {
						i := k - 1 + j - (int(rec) - 1)
						if cut[j] != u[i] {
							t.Errorf("cut at %d, as recorded %v: after event %d (uncut %d): %+v, uncut %+v", k, asRecorded, j, i, cut[j], u[i])
							break
						}
					}
				}
			}
		})
	}
}

// state is what a replay of the pytorch policy holds after an event.
type state struct {
	reserved, free, largest uint64
}

// replayStates replays the snapshot at path against the pytorch policy and
// returns the state after each event, and the trace's header; as
// recorded if asRecorded.
func replayStates(t *testing.T, path string, asRecorded bool) ([]state, trace.Header) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := pytorch.Import(f, path, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := sim.NewReplay(sim.Config{Trace: path, Policy: "pytorch", AsRecorded: asRecorded})
	if err != nil {
		t.Fatal(err)
	}
	fs := rep.Policy().(policies.FreeSpacer)
	var out []state
	for i := int64(0); ; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.Step(i, ev); err != nil {
			t.Fatal(err)
		}
		free, largest := fs.FreeSpace()
		out = append(out, state{rep.Device().Reserved(), free, largest})
	}
	return out, src.Header()
}

// runFile imports the snapshot at path and replays it with Run against
// the pytorch policy, as recorded if asRecorded.
func runFile(t *testing.T, path string, asRecorded bool) *sim.Result {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := pytorch.Import(f, path, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sim.Run(src, sim.Config{Trace: path, Policy: "pytorch", AsRecorded: asRecorded})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}
