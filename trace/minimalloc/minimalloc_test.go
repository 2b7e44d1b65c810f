package minimalloc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// example is MiniMalloc's own example problem (benchmarks/examples), which
// fits in 12 bytes.
const example = `id,lower,upper,size
b1,0,3,4
b2,3,9,4
b3,0,9,4
b4,9,21,4
b5,0,21,4
`

func TestImportExample(t *testing.T) {
	src, err := Import(strings.NewReader(example), "examples/input.12.csv")
	if err != nil {
		t.Fatal(err)
	}
	h := src.Header()
	if h.Source != "minimalloc" || h.Metadata["capacity"] != "12" || h.Metadata["buffers"] != "5" {
		t.Errorf("header %+v", h)
	}
	var got []string
	for {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, trace.FormatText(ev))
	}
	// Frees before mallocs at equal times (b2 starts where b1 ends), each
	// group in file order.
	want := []string{
		"malloc addr=0x1 size=4 t=0",
		"malloc addr=0x3 size=4 t=0",
		"malloc addr=0x5 size=4 t=0",
		"free addr=0x1 size=4 t=3",
		"malloc addr=0x2 size=4 t=3",
		"free addr=0x2 size=4 t=9",
		"free addr=0x3 size=4 t=9",
		"malloc addr=0x4 size=4 t=9",
		"free addr=0x4 size=4 t=21",
		"free addr=0x5 size=4 t=21",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Peak live bytes: 12, the capacity the problem is posed with.
	var live, peak uint64
	src, _ = Import(strings.NewReader(example), "x.csv")
	for {
		ev, err := src.Next()
		if err != nil {
			break
		}
		if ev.Op == trace.OpMalloc {
			live += ev.Size
			peak = max(peak, live)
		} else {
			live -= ev.Size
		}
	}
	if peak != 12 {
		t.Errorf("peak live bytes %d, want 12", peak)
	}
}

func TestReadColumns(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Buffer
	}{
		{"reordered", "size,upper,lower,id\n8,5,1,a\n", []Buffer{{ID: "a", Lower: 1, Upper: 5, Size: 8, Line: 2}}},
		{"aliases", "buffer_id,start,end,size\nx,2,4,16\n", []Buffer{{ID: "x", Lower: 2, Upper: 5, Size: 16, Line: 2}}},
		{"buffer and begin", "buffer,begin,upper,size\n7,0,1,1\n", []Buffer{{ID: "7", Lower: 0, Upper: 1, Size: 1, Line: 2}}},
		{"alignment, offset and empty gaps", "id,lower,upper,size,alignment,gaps,offset\n0,0,2,64,32,,128\n",
			[]Buffer{{ID: "0", Lower: 0, Upper: 2, Size: 64, Line: 2}}},
		{"empty lines", "id,lower,upper,size\n0,0,1,1\n\n \n1,0,1,1\n", []Buffer{{ID: "0", Lower: 0, Upper: 1, Size: 1, Line: 2}, {ID: "1", Lower: 0, Upper: 1, Size: 1, Line: 5}}},
		{"CRLF and BOM", "\xef\xbb\xbfid,lower,upper,size\r\n0,0,1,1\r\n", []Buffer{{ID: "0", Lower: 0, Upper: 1, Size: 1, Line: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !Detect([]byte(tc.in)) {
				t.Errorf("Detect = false")
			}
			got, err := Read(strings.NewReader(tc.in), "p.csv")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		line     int    // the SyntaxError's line, 0 for a header error
		msg      string // a substring of the error
	}{
		{"empty", "", 0, "empty file"},
		{"no size", "id,lower,upper\n", 0, "no size column"},
		{"unknown column", "id,lower,upper,size,colour\n", 0, `unknown column "colour"`},
		{"upper and end", "id,lower,upper,end,size\n", 0, "duplicate column"},
		{"bad lower", "id,lower,upper,size\na,x,2,3\n", 2, `lower "x"`},
		{"negative size", "id,lower,upper,size\na,0,2,-3\n", 2, `size "-3"`},
		{"empty lifetime", "id,lower,upper,size\na,0,1,1\nb,4,4,1\n", 3, "empty lifetime [4, 4)"},
		{"backwards", "id,lower,upper,size\na,5,2,1\n", 2, "empty lifetime [5, 2)"},
		{"gaps", "id,lower,upper,size,gaps\na,0,9,1,2-4\n", 2, "gaps"},
		{"fields", "id,lower,upper,size\na,0,9\n", 2, "3 fields, want 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tc.in), "p.csv")
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			var se *trace.SyntaxError
			switch {
			case tc.line == 0 && !errors.Is(err, ErrNotProblem):
				t.Errorf("error %q is not ErrNotProblem", err)
			case tc.line > 0 && (!errors.As(err, &se) || se.Line != tc.line || se.File != "p.csv"):
				t.Errorf("error %q is not a SyntaxError at p.csv:%d", err, tc.line)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		head string
		want bool
	}{
		{"id,lower,upper,size\n", true},
		{"id,lower,upper,size", true},
		{"Thread,Time,Action,Pointer,Size,Stream\n", false},
		{"malloc id=1 size=4\n", false},
		{"id,lower,size\n", false},
		{"", false},
	} {
		if got := Detect([]byte(tc.head)); got != tc.want {
			t.Errorf("Detect(%q) = %v, want %v", tc.head, got, tc.want)
		}
	}
}

// TestBenchmarks reads the MiniMalloc benchmarks of the shared trace
// collection, when present: each is a valid trace whose peak live bytes
// are at most the capacity in its name.
func TestBenchmarks(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "shared", "traces", "minimalloc")
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		dir = filepath.Join(d, "minimalloc")
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.csv"))
	if len(paths) == 0 {
		t.Skipf("no MiniMalloc problems in %s", dir)
	}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		src, err := Import(f, path)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		errs, err := trace.Validate(src, 1)
		if err != nil || len(errs) > 0 {
			t.Errorf("%s: Validate: %v %v", path, errs, err)
		}
		capacity, ok := capacityFromName(path)
		if !ok {
			t.Errorf("%s: no capacity in the name", path)
		}
		src, _ = reimport(t, path)
		var live, peak uint64
		for {
			ev, err := src.Next()
			if err != nil {
				break
			}
			if ev.Op == trace.OpMalloc {
				live += ev.Size
			} else {
				live -= ev.Size
			}
			peak = max(peak, live)
		}
		if peak > capacity || peak == 0 {
			t.Errorf("%s: peak live bytes %d, capacity %d", path, peak, capacity)
		}
	}
}

func reimport(t *testing.T, path string) (*Source, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return Import(f, path)
}

// rowsReader generates a problem of n buffers, one row at a time, without
// holding it: buffer i lives over [i/3, i/3+5) (ties at every time).
type rowsReader struct {
	n, i int
	buf  []byte
}

func (r *rowsReader) Read(p []byte) (int, error) {
	for len(r.buf) < len(p) && r.i <= r.n {
		if r.i == 0 {
			r.buf = append(r.buf, "id,lower,upper,size\n"...)
		} else {
			r.buf = fmt.Appendf(r.buf, "b%d,%d,%d,%d\n", r.i, r.i/3, r.i/3+5, 512*(r.i%7+1))
		}
		r.i++
	}
	if len(r.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.buf)
	r.buf = r.buf[:copy(r.buf, r.buf[n:])]
	return n, nil
}

// Import's events are those of Events over Read's buffers, on generated
// problems with ties and on MiniMalloc's benchmarks when present; a
// Reopen starts over.
func TestImportEvents(t *testing.T) {
	check := func(name string, open func() io.Reader) {
		bufs, err := Read(open(), name)
		if err != nil {
			t.Fatal(err)
		}
		src, err := Import(open(), name)
		if err != nil {
			t.Fatal(err)
		}
		want := Events(bufs)
		for pass := 0; pass < 2; pass++ {
			got, err := trace.ReadAll(src)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: pass %d: Import's %d events differ from Events' %d", name, pass, len(got), len(want))
			}
			again, _ := src.Reopen()
			src = again.(*Source)
		}
	}
	for _, n := range []int{0, 1, 2, 10, 1000} {
		check(fmt.Sprintf("gen%d.csv", n), func() io.Reader { return &rowsReader{n: n} })
	}
	paths, _ := filepath.Glob(filepath.Join("..", "..", "..", "shared", "traces", "minimalloc", "*.csv"))
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		check(path, func() io.Reader { return bytes.NewReader(b) })
	}
}

// A problem of more than MaxBuffers rows is refused at the first row over
// the cap, naming the file, the line and the cap (issue 36: 10 million
// rows took 3.4 GB); one of MaxBuffers is read.
func TestMaxBuffers(t *testing.T) {
	if testing.Short() {
		t.Skip("reads a million rows")
	}
	_, err := Import(&rowsReader{n: MaxBuffers + 5}, "big.csv")
	var se *trace.SyntaxError
	if !errors.As(err, &se) || se.File != "big.csv" || se.Line != MaxBuffers+2 || !strings.Contains(err.Error(), "more than 1000000 buffers (the limit") {
		t.Fatalf("error %v, want a SyntaxError at big.csv:%d naming the cap", err, MaxBuffers+2)
	}
	src, err := Import(&rowsReader{n: MaxBuffers}, "cap.csv")
	if err != nil || src.Header().Metadata["buffers"] != "1000000" {
		t.Fatalf("a problem of MaxBuffers: %v", err)
	}
}

// Import holds a problem in at most 40 bytes a buffer (issue 36: 340
// bytes a row, the ids and two events each kept).
func TestImportCompact(t *testing.T) {
	const n = 200_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	src, err := Import(&rowsReader{n: n}, "mid.csv")
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(src)
	if per := held / n; per > 40 {
		t.Errorf("Import holds %d bytes a buffer (%d for %d), want at most 40", per, held, n)
	}
}
