package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteFile writes a file in a new directory, then fails a second
// write: the first content stays and no temporary file is left.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "out.txt")
	if err := WriteFile(path, func(w io.Writer) error { _, err := io.WriteString(w, "one\n"); return err }); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("bad")
	err := WriteFile(path, func(w io.Writer) error { io.WriteString(w, "two\n"); return bad })
	if !errors.Is(err, bad) {
		t.Fatalf("err = %v, want %v", err, bad)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != "one\n" {
		t.Fatalf("content %q, %v; want \"one\\n\"", data, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("%d entries in the directory, want 1 (no temporary file left)", len(entries))
	}
}

// TestAbort aborts a file: nothing appears, and Commit after Abort does
// nothing.
func TestAbort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.txt")
	f, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("x"))
	f.Abort()
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat after Abort: %v, want not exist", err)
	}
}

// An error writing the temporary file names the output's path, not the
// hidden temporary name (a full disk said ".out.json.tmp123: no space left
// on device").
func TestWriteErrorNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	a, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Abort()
	a.f.Close() // every later write fails
	_, err = a.Write([]byte("x"))
	if err == nil || !strings.Contains(err.Error(), "cannot write "+path+": ") || strings.Contains(err.Error(), ".tmp") {
		t.Errorf("err = %v", err)
	}
}
