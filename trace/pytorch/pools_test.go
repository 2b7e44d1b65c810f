package pytorch

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// poolsSnapshot returns the snapshot of TestImportPools and its number
// of entries.
func poolsSnapshot() ([]byte, int) {
	const (
		C = 0x55
		M = 1 << 20
		D = 0x7f0000000000
		L = 0x7f0000200000
		P = 0x7f0001600000
		E = 0x7f0001800000
	)
	entries := []any{
		onStream(entry("segment_alloc", D, 2*M), C),
		onStream(entry("alloc", D, 8), C),
		onStream(entry("alloc", D+512, 8), C),
		onStream(entry("segment_alloc", L, 20*M), C),
		onStream(entry("alloc", L, 4*M), C),
		onStream(entry("segment_alloc", P, 2*M), C),
		onStream(entry("alloc", P, M), C),
		onStream(entry("alloc", L+4*M, 4*M), C),
		onStream(entry("alloc", P+M, 512), C),
		onStream(entry("free_requested", L, 4*M), C),
		onStream(entry("free_completed", L, 4*M), C),
		onStream(entry("free_requested", L+4*M, 4*M), C),
		onStream(entry("free_completed", L+4*M, 4*M), C),
		onStream(entry("free_requested", P+M, 512), C),
		onStream(entry("free_completed", P+M, 512), C),
		entry("segment_alloc", E, 20*M),
		entry("alloc", E, 3*M),
		onStream(entry("free_requested", D, 8), C),
		onStream(entry("free_completed", D, 8), C),
		onStream(entry("free_requested", D+512, 8), C),
		onStream(entry("free_completed", D+512, 8), C),
		onStream(entry("segment_free", D, 2*M), C),
		onStream(entry("segment_free", L, 20*M), C),
	}
	segments := []any{
		poolSeg(P, 2*M, C, "small", tuple{1, 0}, "active_allocated", M),
		segDict(E, 20*M, "large", [3]any{3 * M, 3 * M, "active_allocated"}, [3]any{17 * M, 0, "inactive"}),
	}
	return pickleOf([]kv{{"segments", segments}, {"device_traces", []any{entries}}}), len(entries)
}

// poolSeg is a final segment of pool id on stream, one block of state.
func poolSeg(addr, size, stream uint64, typ string, pool tuple, state string, requested int) []kv {
	return []kv{{"device", 0}, {"address", int64(addr)}, {"total_size", int64(size)}, {"stream", int64(stream)},
		{"segment_type", typ}, {"segment_pool_id", pool}, {"is_expandable", false}, {"frames", []any{}},
		{"blocks", []any{[]kv{{"address", int64(addr)}, {"size", int64(size)}, {"requested_size", requested}, {"state", state}, {"frames", []any{}}}}}}
}

func onStream(e []kv, stream uint64) []kv {
	for i := range e {
		if e[i].k == "stream" {
			e[i].v = int64(stream)
		}
	}
	return e
}

// TestImportPools: the pool of each malloc, inferred as pools.go says, on
// a hand-made capture in the shape of torch.cuda.graph's. On the capture
// stream C: a small default segment D with the generator's two 8-byte
// mallocs (before the capture), then the capture: a 20 MiB segment L
// (freed by the end: no pool id), a small segment P that survives in pool
// (1,0), and mallocs in L between mallocs in P. After the capture, on
// stream 0, a default segment E. At the end an empty_cache frees D, then
// L: the pool's release goes before that run.
func TestImportPools(t *testing.T) {
	data, n := poolsSnapshot()
	// Through a reader that cannot seek too: Import keeps its bytes for
	// the inference's reading and the events'.
	for _, r := range []io.Reader{bytes.NewReader(data), struct{ io.Reader }{bytes.NewReader(data)}} {
		src, err := Import(r, "pools.pickle", Options{})
		if err != nil {
			t.Fatal(err)
		}
		h, evs, err := drain(t, src)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Metadata["pools"]; got != "1=(1,0)" {
			t.Errorf(`Metadata["pools"] = %q, want "1=(1,0)"`, got)
		}
		var pools []uint32
		release := -1
		for i, ev := range evs {
			switch ev.Op {
			case trace.OpMalloc:
				pools = append(pools, ev.Pool)
			case trace.OpPoolRelease:
				if ev.Pool != 1 || release >= 0 {
					t.Errorf("event %d: %+v", i, ev)
				}
				release = i
			}
		}
		// D's two, L's, P's, L's second, P's second, E's.
		want := []uint32{0, 0, 1, 1, 1, 1, 0}
		if !slices.Equal(pools, want) {
			t.Errorf("malloc pools %v, want %v", pools, want)
		}
		if release != 21 || len(evs) != n+1 || evs[22].Op != trace.OpSegmentFree || evs[22].Addr != 0x7f0000000000 {
			t.Errorf("pool_release at event %d of %d, want 21, before the run of segment frees", release, len(evs))
		}
	}
}

// TestImportRestore: a run of mallocs that tiles a private pool's segment
// with no live block, from its start to its end in whole block sizes, is a
// checkpoint restore (setCheckpointPoolState); the malloc right after the
// segment's segment_alloc is not, nor is a run that stops short, nor one
// in a default segment.
func TestImportRestore(t *testing.T) {
	const (
		C = 0x55
		K = 1 << 10
		M = 1 << 20
		R = 0x7f0000000000 // pool (0,1), small
		D = 0x7f0000200000 // default, small
	)
	entries := []any{
		onStream(entry("segment_alloc", R, 2*M), C),
		onStream(entry("alloc", R, 32*K), C), // its segment's first malloc
		onStream(entry("free_requested", R, 32*K), C),
		onStream(entry("free_completed", R, 32*K), C),
		onStream(entry("alloc", R, 32*K), C), // a restore: R whole
		onStream(entry("alloc", R+32*K, 2*M-32*K), C),
		onStream(entry("free_requested", R+32*K, 2*M-32*K), C),
		onStream(entry("free_completed", R+32*K, 2*M-32*K), C),
		onStream(entry("free_requested", R, 32*K), C),
		onStream(entry("free_completed", R, 32*K), C),
		onStream(entry("alloc", R, 64*K), C), // stops short: a malloc
		onStream(entry("free_requested", R, 64*K), C),
		onStream(entry("free_completed", R, 64*K), C),
		entry("segment_alloc", D, 2*M),
		entry("alloc", D, 2*M),
		entry("free_requested", D, 2*M),
		entry("free_completed", D, 2*M),
		entry("alloc", D, 2*M),              // a default segment's: no restore
		onStream(entry("alloc", R, 2*M), C), // R whole again: a restore
	}
	segments := []any{
		poolSeg(R, 2*M, C, "small", tuple{0, 1}, "active_allocated", 2*M),
		segDict(D, 2*M, "small", [3]any{2 * M, 2 * M, "active_allocated"}),
	}
	data := pickleOf([]kv{{"segments", segments}, {"device_traces", []any{entries}}})
	src, err := Import(bytes.NewReader(data), "restore.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, evs, err := drain(t, src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		if ev.Op == trace.OpMalloc {
			got = append(got, fmt.Sprintf("%d/%v", ev.Pool, ev.Restore))
		}
	}
	want := []string{"1/false", "1/true", "1/true", "1/false", "0/false", "0/false", "1/true"}
	if !slices.Equal(got, want) {
		t.Errorf("mallocs (pool/restore) %v, want %v", got, want)
	}
}

// TestImportUnnamedPool: a malloc that gets a new segment while a segment
// of its stream and size class has a free block that fits it (with 1 MiB
// to spare in the large pool) went to another pool than that segment's:
// Import says so in Metadata "pool_warning". A free block too small by
// that measure, one on another stream, or one freed right before the
// malloc (a retry's synchronization) is no such sign.
func TestImportUnnamedPool(t *testing.T) {
	const (
		M = 1 << 20
		A = 0x7f0000000000
		B = 0x7f0001400000
	)
	for _, tc := range []struct {
		name    string
		entries []any
		want    string
	}{
		{"a free block fits", []any{
			entry("segment_alloc", A, 20*M), entry("alloc", A, 4*M),
			entry("segment_alloc", B, 20*M), entry("alloc", B, 4*M),
		}, "trace entry 3: a malloc of 4194304 bytes on stream 0x0 got a new segment of its own while the segment at 0x7f0000000000 of that stream had 16777216 bytes free at 0x7f0000400000 that fit it"},
		{"too small with the slack", []any{
			entry("segment_alloc", A, 20*M), entry("alloc", A, 15*M+512),
			entry("segment_alloc", B, 20*M), entry("alloc", B, 4*M),
		}, ""},
		{"another stream", []any{
			entry("segment_alloc", A, 20*M), entry("alloc", A, 4*M),
			onStream(entry("segment_alloc", B, 20*M), 7), onStream(entry("alloc", B, 4*M), 7),
		}, ""},
		{"freed since the malloc before", []any{
			entry("segment_alloc", A, 20*M), entry("alloc", A, 4*M), entry("alloc", A+4*M, 14*M),
			entry("free_requested", A+4*M, 14*M), entry("free_completed", A+4*M, 14*M),
			entry("segment_alloc", B, 20*M), entry("alloc", B, 4*M),
		}, ""},
	} {
		data := pickleOf([]kv{{"segments", []any{}}, {"device_traces", []any{tc.entries}}})
		src, err := Import(bytes.NewReader(data), "w.pickle", Options{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := src.Header().Metadata["pool_warning"]
		if tc.want == "" && got != "" || tc.want != "" && !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: pool_warning %q, want %q...", tc.name, got, tc.want)
		}
	}
}

// TestImportDeletedPool: a MemPool deleted before the dump, told by the
// order of the release (pools.go, decideUnnamed). In the pool: a large
// segment P and a small one S; then a default malloc of 12 MiB gets
// segment D although P has 16 MiB free (the sign of an unnamed pool).
// Everything is freed, the pool deleted (its emptyCache frees S, then P:
// small before large) and empty_cache frees D (smaller than P: the order
// breaks). The pool's release goes before the run, its empty_cache right
// after P's free.
func TestImportDeletedPool(t *testing.T) {
	const (
		M = 1 << 20
		P = 0x7f0000000000
		S = 0x7f0001400000
		D = 0x7f0001600000
	)
	entries := []any{
		entry("segment_alloc", P, 20*M), entry("alloc", P, 4*M),
		entry("segment_alloc", S, 2*M), entry("alloc", S, 4096),
		entry("segment_alloc", D, 12*M), entry("alloc", D, 12*M),
		entry("free_requested", P, 4*M), entry("free_completed", P, 4*M),
		entry("free_requested", S, 4096), entry("free_completed", S, 4096),
		entry("free_requested", D, 12*M), entry("free_completed", D, 12*M),
		entry("segment_free", S, 2*M), entry("segment_free", P, 20*M), // the pool's deletion
		entry("segment_free", D, 12*M), // empty_cache
	}
	data := pickleOf([]kv{{"segments", []any{}}, {"device_traces", []any{entries}}})
	src, err := Import(bytes.NewReader(data), "deleted.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, evs, err := drain(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["pools"] != "1=unnamed1-released-at-entry-12" || h.Metadata["pool_warning"] != "" {
		t.Errorf("metadata %v", h.Metadata)
	}
	var got []string
	for _, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			got = append(got, fmt.Sprintf("malloc:%d", ev.Pool))
		case trace.OpPoolRelease, trace.OpEmptyCache, trace.OpSegmentFree:
			got = append(got, fmt.Sprintf("%s:%d", ev.Op, ev.Pool))
		}
	}
	want := []string{"malloc:1", "malloc:1", "malloc:0", "pool_release:1", "segment_free:0", "segment_free:0", "empty_cache:1", "segment_free:0"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v,\nwant %v", got, want)
	}
}

// TestImportBadPoolID: a segment_pool_id that is not a pair of
// non-negative ints is refused, naming the segment; final segments with
// no segment_pool_id at all (PyTorch before 2.1) leave the pools unlooked
// for, with a warning where a malloc shows one.
func TestImportBadPoolID(t *testing.T) {
	const M = 1 << 20
	seg := func(pool any) []kv {
		s := poolSeg(0x7f0000000000, 2*M, 0, "small", tuple{0, 1}, "active_allocated", 512)
		for i := range s {
			if s[i].k == "segment_pool_id" {
				s[i].v = pool
			}
		}
		return s
	}
	entries := []any{entry("segment_alloc", 0x7f0000000000, 2*M), entry("alloc", 0x7f0000000000, 512)}
	for _, bad := range []any{[]any{1, 0}, tuple{1, 0, 0}, tuple{-1, 0}, "1,0", nil, tuple{1.0, 0}} {
		data := pickleOf([]kv{{"segments", []any{seg(bad)}}, {"device_traces", []any{entries}}})
		_, err := Import(bytes.NewReader(data), "bad.pickle", Options{})
		if err == nil || !strings.HasPrefix(err.Error(), "bad.pickle: segments: the final segment at 0x7f0000000000: its segment_pool_id is a ") {
			t.Errorf("segment_pool_id %v: %v", bad, err)
		}
	}
	// No key at all, and a malloc that shows a pool: a warning.
	const A, B = 0x7f0000000000, 0x7f0001400000
	keyless := func(addr uint64, used int) []kv {
		s := segDict(addr, 20*M, "large", [3]any{used, used, "active_allocated"}, [3]any{20*M - used, 0, "inactive"})
		return s
	}
	entries = []any{
		entry("segment_alloc", A, 20*M), entry("alloc", A, 4*M),
		entry("segment_alloc", B, 20*M), entry("alloc", B, 4*M),
	}
	data := pickleOf([]kv{{"segments", []any{keyless(A, 4*M), keyless(B, 4*M)}}, {"device_traces", []any{entries}}})
	src, err := Import(bytes.NewReader(data), "old.pickle", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w := src.Header().Metadata["pool_warning"]; !strings.HasSuffix(w, "(its final segments carry no segment_pool_id, as before PyTorch 2.1: the pools are not looked for)") || src.Header().Metadata["pools"] != "" {
		t.Errorf("metadata %v", src.Header().Metadata)
	}
}
