package replaycli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// failAfter is a writer that takes n bytes, then fails as a full disk does.
type failAfter struct{ n int }

var errFull = errors.New("no space left on device")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errFull
	}
	f.n -= len(p)
	return len(p), nil
}

// TestStageOutputWriteError: an output whose writer fails is not put in
// place; the file it would replace keeps its contents (the staticcheck
// SA4006 of issue 34: the error was shadowed, and an empty file committed).
func TestStageOutputWriteError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, []byte("the previous good results\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := stageOutput(io.Discard, path, func(w io.Writer) error {
		if _, err := w.Write([]byte("half")); err != nil {
			return err
		}
		return errFull
	})
	if !errors.Is(err, errFull) || o != nil {
		t.Fatalf("stageOutput: %v, %v; want the write's error and nothing staged", o, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "the previous good results\n" {
		t.Errorf("the file now holds %q", b)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(m) != 1 {
		t.Errorf("files left beside it: %q", m)
	}
}

// TestStdoutWriteError: a command whose table cannot be written to stdout
// (replay sim > /dev/full) fails, naming standard output.
func TestStdoutWriteError(t *testing.T) {
	var errb strings.Builder
	err := run(&failAfter{n: 10}, &errb, []string{"sim", "--policy", "cuda", tokenLengths})
	if err == nil || !errors.Is(err, errFull) || !strings.Contains(err.Error(), "writing standard output") {
		t.Fatalf("replay sim to a full stdout: %v", err)
	}
	if err := run(&failAfter{n: 1 << 20}, &errb, []string{"sim", "--policy", "cuda", tokenLengths}); err != nil {
		t.Fatalf("replay sim with room for its table: %v", err)
	}
}
