package plots_test

import (
	"bytes"
	"encoding/xml"
	"github.com/gpualloc/allocsim/sim/results"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/plots"
)

// A trace name with ESC, or any character XML 1.0 forbids, or invalid
// UTF-8 leaves every SVG chart well-formed XML (issue 36, item 5).
func TestSVGHostileNames(t *testing.T) {
	dir := t.TempDir()
	rs := []results.Result{
		result("x\x1b[31m\x07\xff<&.trace", "pytorch", 10*mib, 20*mib),
		result("x\x1b[31m\x07\xff<&.trace", "exec:\x00evil", 12*mib, 18*mib),
	}
	written, err := plots.WriteAll(dir, rs, plots.Options{Policies: []string{"pytorch", "exec:\x00evil"}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range written {
		if filepath.Ext(path) != ".svg" {
			continue
		}
		n++
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := wellFormed(data); err != nil {
			t.Errorf("%s: %v", filepath.Base(path), err)
		}
		if filepath.Base(path) == "x__31m__-memory.svg" && !bytes.Contains(data, []byte(`x\x1b[31m\a`)) {
			t.Errorf("%s: the trace's name is not shown escaped", filepath.Base(path))
		}
	}
	if n != 5 {
		t.Errorf("%d SVG files, want 5: %q", n, written)
	}
}

// wellFormed returns the XML decoder's first error on data.
func wellFormed(data []byte) error {
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = true
	for {
		_, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
