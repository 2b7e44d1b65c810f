package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// The temporary file of a run killed while writing (SIGKILL: nothing could
// remove it) goes at the next write of the same path; one of a process
// that still runs stays.
func TestStaleTempRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.trace")
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	dead := filepath.Join(dir, fmt.Sprintf(".out.trace.tmp-%d-123", cmd.Process.Pid))
	live := filepath.Join(dir, fmt.Sprintf(".out.trace.tmp-%d-456", os.Getppid()))
	for _, n := range []string{dead, live} {
		if err := os.WriteFile(n, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteFile(path, func(w io.Writer) error { _, err := w.Write([]byte("whole")); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead run's temporary file stays: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live process's temporary file is gone: %v", err)
	}
}

// TestBatch: the files of a batch appear at Commit, all of them; an
// aborted batch leaves the earlier files as they were and no temporary
// file; a write that fails drops its file from the batch.
func TestBatch(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "sub", "b.txt")
	if err := os.WriteFile(a, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	var bt Batch
	if err := bt.WriteFile(a, write("new a\n")); err != nil {
		t.Fatal(err)
	}
	f, err := bt.Create(b)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(f, "new b\n")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("bad")
	if err := bt.WriteFile(filepath.Join(dir, "c.txt"), func(w io.Writer) error { return bad }); !errors.Is(err, bad) {
		t.Fatalf("WriteFile of a failing write: %v", err)
	}
	if got := bt.Paths(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Paths() = %q", got)
	}
	if data, _ := os.ReadFile(a); string(data) != "old\n" {
		t.Fatalf("before Commit a holds %q", data)
	}
	if _, err := os.Stat(b); err == nil {
		t.Fatal("b exists before Commit")
	}
	bt.Abort()
	if data, _ := os.ReadFile(a); string(data) != "old\n" {
		t.Errorf("after Abort a holds %q", data)
	}
	for _, d := range []string{dir, filepath.Dir(b)} {
		if m, _ := filepath.Glob(filepath.Join(d, ".*tmp*")); len(m) > 0 {
			t.Errorf("temporary files left: %q", m)
		}
	}

	bt = Batch{}
	bt.WriteFile(a, write("new a\n"))
	bt.WriteFile(b, write("new b\n"))
	if err := bt.Commit(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{a: "new a\n", b: "new b\n"} {
		if data, _ := os.ReadFile(p); string(data) != want {
			t.Errorf("%s holds %q, want %q", p, data, want)
		}
	}
}

// TestKeptNote: the interrupt's message names what the process had put in
// place, or says that nothing was.
func TestKeptNote(t *testing.T) {
	for _, tc := range []struct {
		committed []string
		want      string
	}{
		{nil, "no output written"},
		{[]string{"r.json", "r.csv"}, "the outputs were written before it: r.json, r.csv"},
		{[]string{"1", "2", "3", "4", "5"}, "the 5 outputs were written before it: 1, 2, 3, 4, ..."},
	} {
		if got := keptNote(tc.committed); got != tc.want {
			t.Errorf("keptNote(%q) = %q, want %q", tc.committed, got, tc.want)
		}
	}
}

// TestBatchCommitFails: a batch whose second file cannot be put in place
// (a directory now holds its path) takes the first back: its earlier
// contents are at its path again, and a new path holds nothing (the first
// stayed replaced).
func TestBatchCommitFails(t *testing.T) {
	dir := t.TempDir()
	a, n, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "new.txt"), filepath.Join(dir, "b.txt")
	if err := os.WriteFile(a, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	var bt Batch
	for _, p := range []string{a, n, b} {
		if err := bt.WriteFile(p, write("new\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(b, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := bt.Commit(); err == nil || !strings.Contains(err.Error(), b) {
		t.Fatalf("Commit with %s a directory: %v, want an error naming it", b, err)
	}
	if data, _ := os.ReadFile(a); string(data) != "old\n" {
		t.Errorf("a holds %q, want its earlier contents", data)
	}
	if _, err := os.Stat(n); err == nil {
		t.Errorf("new.txt was left")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the directory holds %q, want a.txt and b.txt only (no temporary or backup file)", names)
	}
}
