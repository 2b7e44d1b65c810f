package cli

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestThinCommands: every Go file under cmd/ is at most 250 lines, so
// that a command stays flags in, one library call, output out; what a
// command grows goes into a library package (issue 34).
func TestThinCommands(t *testing.T) {
	const limit = 250
	n := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		if lines := bytes.Count(b, []byte("\n")); lines > limit {
			t.Errorf("%s: %d lines, over %d: move what it computes into a library package", path, lines, limit)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("only %d Go files under cmd/: the walk missed them", n)
	}
}
