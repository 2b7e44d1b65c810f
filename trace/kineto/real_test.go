package kineto

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/pytorch"
)

// The recordings of testdata/profiler: a torch.profiler trace, the memory
// snapshot and the real allocator's figures of one process each (H200,
// PyTorch 2.11).
const profilerDir = "../../testdata/profiler"

func readEvents(t *testing.T, path string, open func(*os.File) (trace.Source, error)) (trace.Header, []trace.Event) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := open(f)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := trace.ReadAll(src)
	if err != nil {
		t.Fatal(err)
	}
	return src.Header(), evs
}

// TestRealTraces: on the four recordings, the importer's events are the
// snapshot's of the same process: its mallocs, frees (the snapshot's
// free_requested: when the program asked) and failed mallocs in the same
// order at the same addresses, and its device calls, inferred from Total
// Reserved, those the snapshot recorded, call for call, but for the order
// inside a release on a process of two streams (which PyTorch orders by
// stream first, and the trace does not show streams). Its peak Total
// Reserved is max_memory_reserved.
func TestRealTraces(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    int // memory events of device 0
		host      string
		calls     string // Metadata "device_calls"
		twoStream bool
	}{
		{"prof_mlp", 831, "56", "cudaMalloc segments, inferred from Total Reserved at every event", false},
		{"prof_mlp_expandable", 831, "56", "expandable segments (a setting the trace does not record: replay with --set pytorch.expandable_segments=True), inferred from Total Reserved at every event", false},
		{"prof_churn", 570, "", "cudaMalloc segments, inferred from Total Reserved at every event", true},
		{"prof_churn_oom", 588, "", "cudaMalloc segments, inferred from Total Reserved at every event", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := filepath.Join(profilerDir, tc.name)
			h, got := readEvents(t, base+".pt.trace.json.gz", func(f *os.File) (trace.Source, error) { return Import(f, tc.name, Options{}) })
			_, snap := readEvents(t, base+".pickle.gz", func(f *os.File) (trace.Source, error) { return pytorch.Import(f, tc.name, pytorch.Options{}) })
			md := h.Metadata
			if h.Source != "kineto" || h.Device != "NVIDIA H200" || md["device_memory"] != "150109880320" || md["memory_events"] != itoa(tc.events) ||
				md["host_events_skipped"] != tc.host || md["device_calls"] != tc.calls || md["unknown_frees"] != "" {
				t.Errorf("header %+v", h)
			}
			type op struct {
				op   trace.Op
				addr uint64
			}
			var mine, theirs []op
			var myCalls, theirCalls []trace.Event
			isCall := func(o trace.Op) bool { return o >= trace.OpSegmentAlloc && o <= trace.OpSegmentUnmap }
			for _, ev := range got {
				if isCall(ev.Op) {
					myCalls = append(myCalls, trace.Event{Op: ev.Op, Addr: ev.Addr, Size: ev.Size})
				} else {
					mine = append(mine, op{ev.Op, ev.Addr})
				}
			}
			for _, ev := range snap {
				switch {
				case isCall(ev.Op):
					theirCalls = append(theirCalls, trace.Event{Op: ev.Op, Addr: ev.Addr, Size: ev.Size})
				case ev.Op == trace.OpFreeRequested:
					theirs = append(theirs, op{trace.OpFree, ev.Addr})
				case ev.Op == trace.OpMalloc, ev.Op == trace.OpMallocFailed:
					theirs = append(theirs, op{ev.Op, ev.Addr})
				}
			}
			if len(mine) != tc.events || !slices.Equal(mine, theirs) {
				t.Errorf("%d mallocs, frees and failed mallocs (want %d), not the snapshot's %d", len(mine), tc.events, len(theirs))
			}
			if tc.twoStream {
				sortReleases(myCalls)
				sortReleases(theirCalls)
			}
			if !slices.Equal(myCalls, theirCalls) {
				k := 0
				for k < min(len(myCalls), len(theirCalls)) && myCalls[k] == theirCalls[k] {
					k++
				}
				t.Errorf("%d device calls, the snapshot %d; the first difference at call %d", len(myCalls), len(theirCalls), k)
			}
			raw, err := os.ReadFile(base + ".stats.json")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Reserved uint64 `json:"max_memory_reserved"`
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatal(err)
			}
			src, _ := os.Open(base + ".pt.trace.json.gz")
			defer src.Close()
			s, err := Import(src, tc.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			var peak uint64
			for _, r := range s.recs {
				peak = max(peak, r.reserved)
			}
			if peak != st.Reserved {
				t.Errorf("peak Total Reserved %d, max_memory_reserved %d", peak, st.Reserved)
			}
		})
	}
}

// sortReleases puts each run of segment frees (a release) in address
// order.
func sortReleases(calls []trace.Event) {
	for i := 0; i < len(calls); {
		j := i
		for j < len(calls) && calls[j].Op == trace.OpSegmentFree {
			j++
		}
		slices.SortFunc(calls[i:j], func(a, b trace.Event) int { return compareRelease(false, false, 0, 0, a.Addr, b.Addr) })
		i = max(j, i+1)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
