package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
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
