package atomicfile_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/trace/atomicfile"
)

var errFull = errors.New("no space left on device")

// TestStagedOutputWriteError: an output whose writer fails is not put in
// place; the file it would replace keeps its contents (the staticcheck
// SA4006 of issue 34: the error was shadowed, and an empty file committed).
func TestStagedOutputWriteError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, []byte("the previous good results\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := &atomicfile.Outputs{Stdout: io.Discard}
	err := o.Add("json", path, func(w io.Writer) error {
		if _, err := w.Write([]byte("half")); err != nil {
			return err
		}
		return errFull
	})
	if !errors.Is(err, errFull) || len(o.Batch.Paths()) != 0 {
		t.Fatalf("Outputs.Add: %v, %q staged; want the write's error and nothing staged", err, o.Batch.Paths())
	}
	if err := o.Commit(); err != nil {
		t.Fatalf("commit of nothing: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "the previous good results\n" {
		t.Errorf("the file now holds %q", b)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(m) != 1 {
		t.Errorf("files left beside it: %q", m)
	}
}
