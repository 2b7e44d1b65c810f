package replaycli

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartCPUProfile checks ALLOCSIM_CPUPROFILE's profile: written whole
// (gzip-compressed, as runtime/pprof writes it) over a replay, nothing for
// an empty path, and a one-line error naming the file it cannot create.
func TestStartCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := Run(&out, &errOut, []string{"sim", "--policy", "pytorch", trainGPT}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("profile %s: %v", path, err)
	}
	n, err := io.Copy(io.Discard, zr)
	if err != nil || n == 0 {
		t.Fatalf("profile %s: %d bytes uncompressed, %v", path, n, err)
	}

	stop, err = startCPUProfile("")
	if err != nil || stop() != nil {
		t.Errorf("empty path: %v", err)
	}

	bad := filepath.Join(t.TempDir(), "missing", "cpu.prof")
	if _, err := startCPUProfile(bad); err == nil || !strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), "\n") {
		t.Errorf("profile in a missing directory: %v, want one line naming %s", err, bad)
	}
}
