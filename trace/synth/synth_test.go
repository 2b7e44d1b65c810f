package synth

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func drain(t *testing.T, src trace.Source) []trace.Event {
	t.Helper()
	var evs []trace.Event
	for {
		ev, err := src.Next()
		if err == io.EOF {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// small are parameters that give short traces for the golden files.
var small = map[string]map[string]string{
	"train":     {"iterations": "2", "layers": "2", "hidden": "128", "vocab": "1000", "batch-max": "8", "seq-max": "256"},
	"inference": {"requests": "20", "max-batch": "8", "layers": "2", "hidden": "256", "vocab": "1000", "hold": "2"},
	"kvcache":   {"sequences": "3", "concurrency": "2", "layers": "2", "gen-min": "2", "gen-max": "5", "block": "2", "hidden": "256", "kv-hidden": "64", "vocab": "1000"},
	"service":   {"requests": "12", "concurrency": "3", "keep": "0.3", "keep-requests": "4", "threads": "2", "streams": "2"},
	"random":    {"allocations": "20", "max-size": "1MiB", "max-usage": "4MiB", "streams": "2"},
}

// TestGolden compares each workload's events, for seed 1 and small
// parameters, with testdata/NAME.txt (go test -update rewrites them).
func TestGolden(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			src, err := New(name, 1, small[name])
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := trace.WriteText(&buf, src.Header(), drain(t, src)); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", name+".txt")
			if *update {
				os.MkdirAll("testdata", 0o755)
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("events differ from %s (go test -update rewrites it)", path)
			}
			// The golden file reads back as the same trace.
			h, evs, err := trace.ParseText(path, bytes.NewReader(want))
			if err != nil || h.Metadata["workload"] != name || len(evs) == 0 {
				t.Errorf("parse: %v, %d events, header %+v", err, len(evs), h)
			}
		})
	}
}

// TestDefaults generates each workload with its defaults: the trace is
// valid (no double free, no free of an unknown address, time never going
// back), frees everything it allocates, has several streams where the
// scenario has them, and depends on the seed alone.
func TestDefaults(t *testing.T) {
	wantStreams := map[string]int{"train": 2, "inference": 3, "kvcache": 1, "service": 4, "random": 1}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			src, err := New(name, 7, nil)
			if err != nil {
				t.Fatal(err)
			}
			v := trace.NewValidator()
			streams := map[uint64]bool{}
			var n, mallocs int64
			var first []trace.Event
			for ; ; n++ {
				ev, err := src.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := v.Check(n, ev); err != nil {
					t.Fatalf("%v: %s", err, trace.FormatText(ev))
				}
				if ev.Op == trace.OpMalloc {
					mallocs++
					streams[ev.Stream] = true
				}
				if n < 100 {
					first = append(first, ev)
				}
			}
			t.Logf("%s: %d events, %d mallocs", name, n, mallocs)
			if v.Live() != 0 {
				t.Errorf("%d allocations live at the end", v.Live())
			}
			if mallocs < 1000 {
				t.Errorf("only %d mallocs", mallocs)
			}
			if len(streams) != wantStreams[name] {
				t.Errorf("%d streams, want %d", len(streams), wantStreams[name])
			}
			again, _ := New(name, 7, nil)
			a := drainN(again, len(first))
			for i := range first {
				if a[i] != first[i] {
					t.Fatalf("seed 7 twice: event %d differs", i)
				}
			}
		})
	}
}

func drainN(src trace.Source, n int) []trace.Event {
	var out []trace.Event
	for len(out) < n {
		ev, err := src.Next()
		if err != nil {
			break
		}
		out = append(out, ev)
	}
	return out
}

// TestSeedMatters checks that another seed gives other events.
func TestSeedMatters(t *testing.T) {
	for _, name := range Names() {
		a, _ := New(name, 1, small[name])
		b, _ := New(name, 2, small[name])
		ea, eb := drain(t, a), drain(t, b)
		same := len(ea) == len(eb)
		for i := 0; same && i < len(ea); i++ {
			same = ea[i] == eb[i]
		}
		if same {
			t.Errorf("%s: seeds 1 and 2 give the same trace", name)
		}
	}
}

// TestStreaming generates a long trace of each workload and checks that the
// heap does not grow with the number of events.
func TestStreaming(t *testing.T) {
	if testing.Short() {
		t.Skip("long traces")
	}
	long := map[string]map[string]string{
		"train":     {"iterations": "100000", "layers": "4"},
		"inference": {"requests": "10000000"},
		"kvcache":   {"sequences": "1000000"},
		"service":   {"requests": "100000000"},
		"random":    {"allocations": "100000000", "max-size": "1MiB", "max-usage": "64MiB"},
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, name := range Names() {
		src, err := New(name, 3, long[name])
		if err != nil {
			t.Fatal(err)
		}
		var at100k uint64
		for i := 0; i < 1_000_000; i++ {
			if _, err := src.Next(); err != nil {
				t.Fatalf("%s: event %d: %v", name, i, err)
			}
			if i == 100_000 {
				at100k = heap()
			}
		}
		if grown := int64(heap()) - int64(at100k); grown > 1<<20 {
			t.Errorf("%s: heap grew by %d bytes from event 100k to 1M", name, grown)
		}
	}
}

func TestBadParams(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string
	}{
		{"training", nil, `unknown workload "training"`},
		{"train", map[string]string{"epochs": "3"}, `workload train has no parameter "epochs"`},
		{"train", map[string]string{"layers": "many"}, "train: --layers=many: not an integer"},
		{"train", map[string]string{"layers": "0"}, "train: --layers=0: must be at least 1"},
		{"train", map[string]string{"seq-min": "600"}, "train: --seq-min=600: is above --seq-max=512"},
		{"random", map[string]string{"p": "1.5"}, "random: --p=1.5: not a probability"},
		{"service", map[string]string{"max-size": "lots"}, "service: --max-size=lots: not a size"},
		{"service", map[string]string{"min-size": "1GiB"}, "service: --min-size=1GiB: is above --max-size"},
	} {
		_, err := New(tc.name, 1, tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: error %v, want %q", tc.name, tc.set, err, tc.want)
		}
	}
}
