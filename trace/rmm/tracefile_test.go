package rmm_test

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// TestTracefile checks that an RMM log is detected by content and imports
// to a native trace holding the same events.
func TestTracefile(t *testing.T) {
	in := "testdata/midnight.csv"
	out := filepath.Join(t.TempDir(), "log.trace")
	n, format, err := tracefile.Import(in, out, tracefile.Options{})
	if err != nil || format != "rmm" || n != 7 {
		t.Fatalf("Import: %d events, format %q, %v", n, format, err)
	}
	read := func(path string) (trace.Header, []trace.Event) {
		f, err := tracefile.Open(path, tracefile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var evs []trace.Event
		for {
			ev, err := f.Next()
			if err == io.EOF {
				return f.Header(), evs
			}
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
	}
	_, a := read(in)
	h, b := read(out)
	if h.Source != "rmm" || len(a) != len(b) {
		t.Fatalf("source %q, %d vs %d events", h.Source, len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("event %d: %s vs %s", i, trace.FormatText(a[i]), trace.FormatText(b[i]))
		}
	}
}
