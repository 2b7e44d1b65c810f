package tracefile

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// writeGzip writes head, block n times and tail to a file of dir,
// gzip-compressed, and returns its path: each is a gzip member of its own
// (a reader takes their concatenation), so that block is compressed once.
func writeGzip(t *testing.T, dir, name, head, block string, n int, tail string) string {
	t.Helper()
	member := func(s string) []byte {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
		io.WriteString(zw, s)
		zw.Close()
		return b.Bytes()
	}
	out := member(head)
	blk := member(block)
	for range n {
		out = append(out, blk...)
	}
	out = append(out, member(tail)...)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A text trace is read as a stream: a million device_sync lines (15 KB
// gzip'd) leave no more live heap, the file open and read to its end,
// than a thousand (issue 36: read whole, 10 million lines took 2.07 GB).
func TestTextStreamed(t *testing.T) {
	dir := t.TempDir()
	live := func(n int) int64 {
		path := writeGzip(t, dir, "sync.txt.gz", "header source=text\nmalloc id=1 size=4096\n", strings.Repeat("device_sync\n", 1000), n/1000, "")
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		events := 0
		for {
			_, err := f.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			events++
		}
		if events != n+1 {
			t.Fatalf("%d events, want %d", events, n+1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(f)
		return int64(after.HeapAlloc) - int64(before.HeapAlloc)
	}
	small, big := live(1000), live(1_000_000)
	if big-small > 1<<20 {
		t.Errorf("an open text trace of 1000000 lines holds %d bytes more than one of 1000, want under 1 MiB", big-small)
	}
}

// A MiniMalloc CSV (or any text format) with a line of 64 MiB is refused
// at 16 MiB, naming the file, the line and the limit, without holding the
// line (issue 36: encoding/csv held a line whole).
func TestLongLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, head string }{
		{"p.csv.gz", "id,lower,upper,size\n1,0,2,100\n"},
		{"t.txt.gz", "header source=text\nmarker label="},
		{"r.csv.gz", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,100,0x0\n"},
	} {
		path := writeGzip(t, dir, tc.name, tc.head, strings.Repeat("7", 1<<20), 64, "\n")
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f, err := Open(path, Options{})
		if err == nil {
			for err == nil {
				_, err = f.Next()
			}
			f.Close()
		}
		runtime.ReadMemStats(&after)
		var se *trace.SyntaxError
		if !errors.As(err, &se) || !strings.HasPrefix(err.Error(), path+":") || !strings.Contains(err.Error(), "a line longer than 16777216 bytes (the limit)") {
			t.Errorf("%s: %v, want a SyntaxError naming the file and the limit", tc.name, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 160<<20 {
			t.Errorf("%s: refused after allocating %d MiB, want under 160", tc.name, alloc>>20)
		}
	}
}
