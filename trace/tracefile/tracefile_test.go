package tracefile

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// writeNative writes a native trace of n mallocs at path.
func writeNative(t *testing.T, path string, n int) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := trace.NewWriter(f, trace.Header{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := w.Write(trace.Event{Op: trace.OpMalloc, Kind: trace.KindDevice, Addr: uint64(i+1) << 12, Size: 4096}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReadError reads a native trace cut short: the error of Next is a
// *ReadError that names the file once and wraps the format's error, and
// NameError leaves it as it is but names the file of any other error.
func TestReadError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cut.trace")
	writeNative(t, path, 5000)
	data, _ := os.ReadFile(path)
	os.WriteFile(path, data[:len(data)/2], 0o644)
	f, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for err == nil {
		_, err = f.Next()
	}
	var re *ReadError
	var fe *trace.FormatError
	if !errors.As(err, &re) || re.Path != path || !errors.As(err, &fe) {
		t.Fatalf("err = %v (%T), want a *ReadError wrapping a *trace.FormatError", err, err)
	}
	if !strings.HasPrefix(err.Error(), path+": ") || strings.Count(err.Error(), path) != 1 {
		t.Errorf("err = %q, want it to name %s once, first", err, path)
	}
	if got := NameError(path, err); got != err {
		t.Errorf("NameError(read error) = %v", got)
	}
	other := fmt.Errorf("policy bfc: out of slots")
	if got := NameError(path, other); got.Error() != path+": policy bfc: out of slots" || !errors.Is(got, other) {
		t.Errorf("NameError(other) = %v", got)
	}
	if NameError(path, nil) != nil {
		t.Error("NameError(nil) != nil")
	}
}

func TestGlobFiles(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"a/x.gz", "a/b/y.gz", "a/b/c/z.gz", "a/b/c/z.txt", "d.gz"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), nil, 0o644)
	}
	for _, tc := range []struct {
		pattern string
		want    []string
	}{
		{"**/*.gz", []string{"a/b/c/z.gz", "a/b/y.gz", "a/x.gz", "d.gz"}},
		{"a/**/*.gz", []string{"a/b/c/z.gz", "a/b/y.gz", "a/x.gz"}},
		{"a/**/c/*", []string{"a/b/c/z.gz", "a/b/c/z.txt"}},
		{"a/*/*.gz", []string{"a/b/y.gz"}},
		{"*/x.?z", []string{"a/x.gz"}},
	} {
		got, err := globFiles(filepath.Join(dir, tc.pattern))
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			got[i], _ = filepath.Rel(dir, got[i])
			got[i] = filepath.ToSlash(got[i])
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.pattern, got, tc.want)
		}
	}
}

// TestGlob expands a file, a directory (only its traces, with a note on
// the others) and a glob, each path once, and names a pattern that matches
// nothing.
func TestGlob(t *testing.T) {
	dir := t.TempDir()
	writeNative(t, filepath.Join(dir, "d", "b.trace"), 1)
	writeNative(t, filepath.Join(dir, "d", "a.bin"), 1)
	os.WriteFile(filepath.Join(dir, "d", "notes.md"), []byte("# notes\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "d", "c.txt"), []byte("malloc addr=0x1000 size=4096 stream=0\n"), 0o644)
	first := filepath.Join(dir, "d", "b.trace")
	paths, notes, err := Glob([]string{first, filepath.Join(dir, "d"), filepath.Join(dir, "**", "*.txt")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range paths {
		paths[i], _ = filepath.Rel(dir, paths[i])
	}
	if want := []string{"d/b.trace", "d/a.bin", "d/c.txt"}; !reflect.DeepEqual(paths, want) {
		t.Errorf("paths %v, want %v", paths, want)
	}
	if len(notes) != 1 || !strings.HasSuffix(notes[0], "d: 1 files that are no traces skipped") {
		t.Errorf("notes %q", notes)
	}
	pattern := filepath.Join(dir, "*.nothing")
	if _, _, err := Glob([]string{pattern}); err == nil || err.Error() != fmt.Sprintf("%q: no file matches", pattern) {
		t.Errorf("err = %v", err)
	}
	if _, _, err := Glob([]string{filepath.Join(dir, "missing.trace")}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want not exist", err)
	}
}

// A binary file read as one of the text formats is refused in one plain
// line that says what it is, not with its bytes quoted.
func TestBinaryAsText(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "pytorch", "mlp.pickle.gz")
	for _, from := range []string{"minimalloc", "rmm", "cupy", "text"} {
		_, err := Open(path, Options{From: from})
		if err == nil {
			t.Fatalf("--from %s: opened", from)
		}
		msg := err.Error()
		if !strings.Contains(msg, "gzip-compressed data (from byte 0), not ") || !strings.Contains(msg, "it looks like a pytorch trace") || strings.Contains(msg, `\x`) || strings.Contains(msg, "\n") {
			t.Errorf("--from %s: %q", from, msg)
		}
	}
}

// A text file cut inside its last line is refused with its line and byte
// offset (a number cut short is still a number: a MiniMalloc CSV or a
// text trace cut so read with other figures before), and so is a NUL byte.
func TestTextCutShort(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, text, want string }{
		{"t.txt", "malloc id=1 size=1MiB\nfree id=1\nmalloc id=2 size=10", "t.txt:3: the last line has no newline: the file ends inside it at byte offset 51"},
		{"p.csv", "id,lower,upper,size\n1,0,2,100\n2,1,3,25", "p.csv:3: the last line has no newline: the file ends inside it at byte offset 38"},
		{"r.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,100,0x0\n1,00:00:00.000002,free,0x1000,100,0x0", "r.csv:3: the last line has no newline"},
		{"d.jsonl", `{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":1}` + "\n" + `{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":2}`, "d.jsonl:2: the last line has no newline"},
		{"z.txt", strings.Repeat("malloc id=1 size=1\nfree id=1\n", 30) + "free id=1\x00\n", "z.txt:61: a NUL byte at byte offset 879"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path, Options{})
		if err == nil {
			for err == nil {
				_, err = f.Next()
			}
			f.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		// The same file with its last line whole reads to the end.
		if !strings.HasSuffix(tc.text, "\n") {
			if err := os.WriteFile(path, []byte(tc.text+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("%s whole: %v", tc.name, err)
			}
			for err == nil {
				_, err = f.Next()
			}
			f.Close()
			if !errors.Is(err, io.EOF) {
				t.Errorf("%s whole: %v", tc.name, err)
			}
		}
	}
}

// TestCuPy opens the CuPy recordings by their content, as --from cupy
// would, with the device asked for.
func TestCuPy(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "cupy", "linalg.jsonl")
	f, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Format != "cupy" || f.Header().Source != "cupy" {
		t.Fatalf("format %q, header %+v", f.Format, f.Header())
	}
	n := 0
	for err == nil {
		_, err = f.Next()
		n++
	}
	if err != io.EOF || n != 898 {
		t.Errorf("%d events, then %v", n-1, err)
	}
	g, err := Open(path, Options{From: "cupy", Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Next(); err == nil || !strings.Contains(err.Error(), "no line of device 1; the log has device_id 0") {
		t.Errorf("device 1: %v", err)
	}
}

func TestNegativeDevice(t *testing.T) {
	_, err := Open(filepath.Join("..", "testdata", "small.txt"), Options{Device: -1})
	if err == nil || !strings.Contains(err.Error(), "small.txt: device -1: a device index is 0 or more") {
		t.Errorf("Open with device -1: %v", err)
	}
}

// TestGzipText: the text formats read gzip-compressed too (a CuPy log, the
// text form), detected by the content under the compression; a cut stream
// is refused with the place.
func TestGzipText(t *testing.T) {
	dir := t.TempDir()
	for _, in := range []string{filepath.Join("..", "..", "testdata", "cupy", "linalg.jsonl"), filepath.Join("..", "testdata", "small.txt")} {
		raw, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(raw)
		zw.Close()
		gz := filepath.Join(dir, filepath.Base(in)+".gz")
		if err := os.WriteFile(gz, z.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		count := func(path string) (int, string) {
			f, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			evs, err := trace.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			return len(evs), f.Format
		}
		n, format := count(in)
		if zn, zformat := count(gz); zn != n || zformat != format {
			t.Errorf("%s: %d events as %s gzip'd, %d as %s plain", in, zn, zformat, n, format)
		}
		cut := filepath.Join(dir, "cut_"+filepath.Base(gz))
		os.WriteFile(cut, z.Bytes()[:z.Len()*3/4], 0o644)
		f, err := Open(cut, Options{})
		if err == nil {
			_, err = trace.ReadAll(f)
			f.Close()
		}
		// The cut is named where the data ends, or where the partial last
		// line it leaves fails to parse first (file:line), as for a plain
		// file cut short.
		if err == nil || !strings.Contains(err.Error(), "gzip-compressed data damaged or cut short by byte") && !strings.Contains(err.Error(), "cut_small.txt.gz:") {
			t.Errorf("%s cut: %v", in, err)
		}
	}
}
