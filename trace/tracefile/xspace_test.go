package tracefile

import (
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/trace"
)

// TestOpenXSpace opens a JAX job's XSpace (testdata/jax/xspace), gzip-
// compressed as it is there and decompressed, detected and with --from
// xspace, and again through Reopen: the same 2754 events of GPU_0_bfc
// each time.
func TestOpenXSpace(t *testing.T) {
	gz := filepath.Join("..", "..", "testdata", "jax", "xspace", "train.bfc.xplane.pb.gz")
	raw := filepath.Join(t.TempDir(), "train.bfc.xplane.pb")
	in, err := os.Open(gz)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(raw, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, from string }{{gz, ""}, {raw, ""}, {raw, "xspace"}, {gz, "xspace"}} {
		t.Run(filepath.Base(tc.path)+" from "+tc.from, func(t *testing.T) {
			f, err := Open(tc.path, Options{From: tc.from})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Format != "xspace" || f.Header().Source != "xspace" || f.Header().Metadata["recorded_mallocs"] != "1377" {
				t.Fatalf("format %q, header %+v; want xspace, 1377 mallocs", f.Format, f.Header())
			}
			evs, err := trace.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			again, err := f.Reopen()
			if err != nil {
				t.Fatal(err)
			}
			evs2, err := trace.ReadAll(again)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 2754 || len(evs2) != len(evs) || evs2[len(evs2)-1] != evs[len(evs)-1] {
				t.Errorf("%d events, %d after Reopen; want 2754 both", len(evs), len(evs2))
			}
		})
	}
}

// TestDetectXSpace: of the test data's files, Detect calls the XSpaces
// (.xplane.pb, .xplane.pb.gz) "xspace" and no other file.
func TestDetectXSpace(t *testing.T) {
	root := filepath.Join("..", "..")
	n := 0
	for _, dir := range []string{"testdata", "trace"} {
		filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			head := make([]byte, 512)
			k, _ := io.ReadFull(f, head)
			f.Close()
			want := strings.Contains(filepath.Base(path), ".xplane.pb")
			if got := Detect(head[:k]) == "xspace"; got != want {
				t.Errorf("%s: detected as %q", path, Detect(head[:k]))
			}
			n++
			return nil
		})
	}
	if n < 100 {
		t.Errorf("only %d files looked at", n)
	}
}
