package kineto_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/kineto"
	"github.com/gpualloc/allocsim/trace/pytorch"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

func readFile(t *testing.T, path string, opts tracefile.Options) (string, trace.Header, []trace.Event) {
	t.Helper()
	f, err := tracefile.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := trace.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return f.Format, f.Header(), evs
}

// TestTracefile: a torch.profiler trace is told by its content, gzip'd
// (not taken for a gzip'd snapshot) or not, and imports to a native trace
// of the same events and header.
func TestTracefile(t *testing.T) {
	dir := t.TempDir()
	in := "../../testdata/profiler/prof_mlp.pt.trace.json.gz"
	gz, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "prof_mlp.json")
	if err := os.WriteFile(plain, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	format, h, want := readFile(t, in, tracefile.Options{})
	if format != "kineto" || h.Source != "kineto" || len(want) != 831+94 {
		t.Fatalf("%s: format %q, source %q, %d events", in, format, h.Source, len(want))
	}
	for _, path := range []string{plain, in} {
		for _, from := range []string{"auto", "kineto"} {
			if format, _, got := readFile(t, path, tracefile.Options{From: from}); format != "kineto" || len(got) != len(want) {
				t.Errorf("%s --from %s: format %q, %d events", path, from, format, len(got))
			}
		}
	}
	out := filepath.Join(dir, "prof_mlp.trace")
	n, format, err := tracefile.Import(in, out, tracefile.Options{})
	if err != nil || format != "kineto" || n != uint64(len(want)) {
		t.Fatalf("Import: %d events, format %q, %v", n, format, err)
	}
	_, h2, got := readFile(t, out, tracefile.Options{})
	if h2.Source != "kineto" || h2.Device != h.Device || h2.Metadata["device_calls"] != h.Metadata["device_calls"] || len(got) != len(want) {
		t.Fatalf("native copy: header %+v, %d events", h2, len(got))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("event %d: %s, want %s", i, trace.FormatText(got[i]), trace.FormatText(want[i]))
		}
	}
	// A gzip'd snapshot is still a snapshot; read as a snapshot, the trace
	// is not one.
	if format, _, _ := readFile(t, "../pytorch/testdata/tiny_proto4.pickle.gz", tracefile.Options{}); format != "pytorch" {
		t.Errorf("tiny_proto4.pickle.gz: format %q, want pytorch", format)
	}
	if _, err := tracefile.Open(in, tracefile.Options{From: "pytorch"}); !errors.Is(err, pytorch.ErrNotSnapshot) {
		t.Errorf("--from pytorch: %v, want %v", err, pytorch.ErrNotSnapshot)
	}
	if _, err := tracefile.Open("../pytorch/testdata/tiny_proto4.pickle.gz", tracefile.Options{From: "kineto"}); !errors.Is(err, kineto.ErrNotTrace) ||
		!strings.Contains(err.Error(), "tiny_proto4.pickle.gz: ") {
		t.Errorf("a snapshot --from kineto: %v, want %v naming the file", err, kineto.ErrNotTrace)
	}
	if _, err := tracefile.Open(in, tracefile.Options{Device: 1}); !errors.Is(err, kineto.ErrNoMemoryEvents) {
		t.Errorf("--device 1: %v, want %v", err, kineto.ErrNoMemoryEvents)
	}
}
