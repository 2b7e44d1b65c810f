package pytorch

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// segDict is a final segment of a hand-made snapshot; blocks are
// (size, requested, state) and tile it from its address.
func segDict(addr uint64, size uint64, typ string, blocks ...[3]any) []kv {
	var bl []any
	at := addr
	for _, b := range blocks {
		bl = append(bl, []kv{{"address", int64(at)}, {"size", b[0]}, {"requested_size", b[1]}, {"state", b[2]}, {"frames", []any{}}})
		at += uint64(b[0].(int))
	}
	return []kv{{"device", 0}, {"address", int64(addr)}, {"total_size", int64(size)}, {"stream", 0},
		{"segment_type", typ}, {"is_expandable", false}, {"frames", []any{}}, {"blocks", bl}}
}

func entry(action string, addr, size uint64) []kv {
	return []kv{{"action", action}, {"addr", int64(addr)}, {"size", int64(size)}, {"stream", 0}, {"time_us", 7}}
}

// TestReconstruct imports hand-made snapshots whose history was cut and
// checks the events that rebuild the state before it, as reconstruct.go
// lays them out.
func TestReconstruct(t *testing.T) {
	const (
		S   = 0x7f0000000000 // a large segment of 20 MiB
		M   = 1 << 20
		T   = 7000           // time of the first entry, in ns
		SM  = 0x7f0002000000 // a small segment of 2 MiB, freed by the trace
		ORP = 0x100000       // a block in no known segment
	)
	at := func(evs ...trace.Event) []trace.Event {
		for i := range evs {
			evs[i].Time = T
		}
		return evs
	}
	for _, tc := range []struct {
		name     string
		segments []any
		entries  []any
		prefix   []trace.Event
	}{
		{
			name: "large",
			// Blocks: 4 MiB allocated before the history and never
			// touched; 6 MiB free; 2 MiB whose free the first entry
			// completes (requested 2 MiB - 100, known only from the
			// trace, which allocates it again); 3.5 MiB freed later by the trace (requested 3 MiB -
			// 600, rounded to 3 MiB - 512, and the 512 KiB + 512 after it
			// were too little to split off in the large pool); 4.5 MiB
			// allocated before and never touched.
			segments: []any{segDict(S, 20*M, "large",
				[3]any{4 * M, 4*M - 10, "active_allocated"},
				[3]any{6 * M, 0, "inactive"},
				[3]any{2 * M, 2 * M, "active_allocated"},
				[3]any{3*M + M/2, 0, "inactive"},
				[3]any{4*M + M/2, 4*M + M/2, "active_allocated"},
			)},
			entries: []any{
				entry("free_completed", S+10*M, 2*M-100),
				entry("alloc", S+10*M, 2*M),
				entry("free_requested", S+12*M, 3*M-600),
				entry("free_completed", S+12*M, 3*M-600),
			},
			prefix: at(
				trace.Event{Op: trace.OpMarker, Label: "reconstructed 11"},
				trace.Event{Op: trace.OpSegmentAlloc, Addr: S, Size: 20 * M},
				trace.Event{Op: trace.OpMalloc, Addr: S, Size: 20 * M},
				trace.Event{Op: trace.OpFree, Addr: S},
				trace.Event{Op: trace.OpMalloc, Addr: S, Size: 4 * M},
				trace.Event{Op: trace.OpMalloc, Addr: S + 4*M, Size: 6 * M},
				trace.Event{Op: trace.OpMalloc, Addr: S + 10*M, Size: 2 * M},
				trace.Event{Op: trace.OpMalloc, Addr: S + 12*M, Size: 3*M + M/2},
				trace.Event{Op: trace.OpMalloc, Addr: S + 15*M + M/2, Size: 4*M + M/2},
				trace.Event{Op: trace.OpFree, Addr: S + 4*M},
				trace.Event{Op: trace.OpFreeRequested, Addr: S + 10*M, Size: 2*M - 100},
			),
		},
		{
			name: "remainder",
			// A 4 MiB block (requested 4 MiB) freed by the trace, after
			// which the trace mallocs 256 KiB further on: the block had
			// taken those 256 KiB, which the allocator did not split off.
			segments: []any{segDict(S, 20*M, "large", [3]any{20 * M, 0, "inactive"})},
			entries: []any{
				entry("alloc", S+4*M+M/4, 3*M/2),
				entry("free_requested", S+4*M+M/4, 3*M/2),
				entry("free_completed", S+4*M+M/4, 3*M/2),
				entry("free_requested", S, 4*M),
				entry("free_completed", S, 4*M),
			},
			prefix: at(
				trace.Event{Op: trace.OpMarker, Label: "reconstructed 7"},
				trace.Event{Op: trace.OpSegmentAlloc, Addr: S, Size: 20 * M},
				trace.Event{Op: trace.OpMalloc, Addr: S, Size: 20 * M},
				trace.Event{Op: trace.OpFree, Addr: S},
				trace.Event{Op: trace.OpMalloc, Addr: S, Size: 4*M + M/4},
				trace.Event{Op: trace.OpMalloc, Addr: S + 4*M + M/4, Size: 16*M - M/4},
				trace.Event{Op: trace.OpFree, Addr: S + 4*M + M/4},
			),
		},
		{
			name: "small segment freed, orphan",
			// A small segment that the trace frees (so not in the final
			// segments), with two blocks the trace frees: 1 KiB at 512,
			// 4 KiB at 1.5 MiB. And a block in no segment at all.
			entries: []any{
				entry("free_requested", SM+512, 1000),
				entry("free_completed", SM+512, 1000),
				entry("free_completed", ORP, 300),
				entry("free_requested", SM+3*M/2, 4096),
				entry("free_completed", SM+3*M/2, 4096),
				entry("segment_free", SM, 2*M),
			},
			prefix: at(
				trace.Event{Op: trace.OpMarker, Label: "reconstructed 14"},
				trace.Event{Op: trace.OpSegmentAlloc, Addr: SM, Size: 2 * M},
				trace.Event{Op: trace.OpMalloc, Addr: SM, Size: 512},
				trace.Event{Op: trace.OpMalloc, Addr: SM + 512, Size: 1024},
				// 1.5 MiB - 1536 free: in pieces of at most 1 MiB.
				trace.Event{Op: trace.OpMalloc, Addr: SM + 1536, Size: M},
				trace.Event{Op: trace.OpMalloc, Addr: SM + 1536 + M, Size: M/2 - 1536},
				trace.Event{Op: trace.OpMalloc, Addr: SM + 3*M/2, Size: 4096},
				trace.Event{Op: trace.OpMalloc, Addr: SM + 3*M/2 + 4096, Size: M/2 - 4096},
				trace.Event{Op: trace.OpFree, Addr: SM},
				trace.Event{Op: trace.OpFree, Addr: SM + 1536},
				trace.Event{Op: trace.OpFree, Addr: SM + 1536 + M},
				trace.Event{Op: trace.OpFree, Addr: SM + 3*M/2 + 4096},
				trace.Event{Op: trace.OpMalloc, Addr: ORP, Size: 300},
				trace.Event{Op: trace.OpFreeRequested, Addr: ORP, Size: 300},
			),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := pickleOf([]kv{{"segments", append([]any{}, tc.segments...)}, {"device_traces", []any{tc.entries}}})
			src, err := Import(bytes.NewReader(data), "cut.pickle", Options{})
			if err != nil {
				t.Fatal(err)
			}
			h, evs, err := drain(t, src)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != len(tc.prefix)+len(tc.entries) {
				t.Fatalf("%d events, want %d reconstructed and %d entries", len(evs), len(tc.prefix), len(tc.entries))
			}
			compareEvents(t, evs[:len(tc.prefix)], tc.prefix)
			want := map[string]string{"truncated": "true", "reconstructed_events": itoa(len(tc.prefix))}
			for k, v := range want {
				if h.Metadata[k] != v {
					t.Errorf("metadata %s = %q, want %q", k, h.Metadata[k], v)
				}
			}
			if !strings.HasPrefix(evs[0].Label, "reconstructed ") {
				t.Errorf("first event %s", trace.FormatText(evs[0]))
			}
		})
	}
}

func itoa(n int) string {
	var b []byte
	for n >= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(append([]byte{byte('0' + n)}, b...))
}
