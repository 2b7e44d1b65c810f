package pytorch

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// TestEventLogRoundTrip: every field of seeded random events (times not
// in whole microseconds, deltas of either sign and of any size, labels,
// stacks and the fields PyTorch entries never set) comes back from the
// log as it went in, across chunks; and a log that would go over its
// bound lets go of everything.
func TestEventLogRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 1))
	pick := func(xs ...uint64) uint64 { return xs[rng.IntN(len(xs))] }
	var in []trace.Event
	var at int64
	for range 20000 {
		ev := trace.Event{Op: trace.Op(1 + rng.IntN(int(trace.OpPoolRelease)))}
		switch rng.IntN(4) {
		case 0:
			at += int64(rng.IntN(5000)) * 1000
		case 1:
			at -= int64(rng.IntN(5000)) // back, and not in microseconds
		case 2:
			at = int64(rng.Uint64()) // anywhere, overflowing deltas
		}
		ev.Time = at
		ev.Addr = pick(0, 0x7f0000000000+uint64(rng.IntN(1<<30)), math.MaxUint64, rng.Uint64())
		ev.Size = pick(0, uint64(rng.IntN(1<<20)), math.MaxUint64)
		ev.Stream = pick(0, 7, math.MaxUint64)
		if rng.IntN(8) == 0 {
			ev.Label = []string{"snapshot", trace.ReleaseByEmptyCache, "x"}[rng.IntN(3)]
		}
		if rng.IntN(4) == 0 {
			ev.Stack = uint32(rng.IntN(1 << 20))
		}
		if rng.IntN(16) == 0 {
			ev.Kind = trace.Kind(rng.IntN(3))
			ev.Thread = rng.Uint64()
			ev.Pool = uint32(rng.IntN(5))
			ev.Restore = rng.IntN(2) == 0
		}
		in = append(in, ev)
	}
	l := newEventLog(maxLog)
	for i := range in {
		l.append(&in[i])
	}
	if l.over || l.n != int64(len(in)) || len(l.chunks) < 2 {
		t.Fatalf("log of %d events: over %v, n %d, %d chunks", len(in), l.over, l.n, len(l.chunks))
	}
	l.rewind()
	for i, want := range in {
		var got trace.Event
		if err := l.next(&got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got != want {
			t.Fatalf("event %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	var ev trace.Event
	if err := l.next(&ev); err != errLogEnd {
		t.Fatalf("after the last event: %v, want errLogEnd", err)
	}

	small := newEventLog(2 * logChunk)
	for i := range in {
		small.append(&in[i])
	}
	if !small.over || small.chunks != nil {
		t.Errorf("a log over its bound of 2 chunks: over %v, %d chunks held", small.over, len(small.chunks))
	}
}

// TestImportOneReading: the events and the stack table that Import gives
// from the events of its first reading are those it gives by reading the
// snapshot again, on every real snapshot at hand (the repository's, with
// and without stacks, and those of ../shared/traces when present).
func TestImportOneReading(t *testing.T) {
	var files []string
	for _, pat := range []string{
		"testdata/*.pickle*",
		"../../testdata/pytorch/*.pickle.gz",
		"../../testdata/pytorch/ddp/*.pickle.gz",
		filepath.Join(tracesDir, "*", "*.pickle.gz"),
	} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 20 {
		t.Fatalf("only %d snapshots found", len(files))
	}
	stacks := 0
	defer func() {
		if stacks == 0 && !t.Failed() {
			t.Errorf("no snapshot with stacks among %d", len(files))
		}
	}()
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			read := func(logMax int64) ([]trace.Event, *trace.Stacks, error) {
				src, err := importLog(bytes.NewReader(data), file, Options{}, logMax)
				if err != nil {
					return nil, nil, err
				}
				if kept := src.(*source).log != nil; kept != (logMax > 0) {
					t.Fatalf("log of %d bytes at most: events kept %v", logMax, kept)
				}
				evs, err := trace.ReadAll(src)
				return evs, src.(trace.StackSource).Stacks(), err
			}
			again, st0, err0 := read(0)
			kept, st1, err1 := read(maxLog)
			if (err0 == nil) != (err1 == nil) || (err0 != nil && err0.Error() != err1.Error()) {
				t.Fatalf("error read again %v, kept %v", err0, err1)
			}
			if err0 != nil {
				return
			}
			if len(kept) != len(again) {
				t.Fatalf("%d events kept, %d read again", len(kept), len(again))
			}
			for i := range kept {
				if kept[i] != again[i] {
					t.Fatalf("event %d:\n kept %+v\nagain %+v", i, kept[i], again[i])
				}
			}
			stacks += st0.Len()
			if st0.Len() != st1.Len() {
				t.Fatalf("%d stacks kept, %d read again", st1.Len(), st0.Len())
			}
			for id := 1; id <= st0.Len(); id++ {
				if a, b := st1.Frames(uint32(id)), st0.Frames(uint32(id)); !reflect.DeepEqual(a, b) {
					t.Fatalf("stack %d: kept %v, read again %v", id, a, b)
				}
			}
		})
	}
}
