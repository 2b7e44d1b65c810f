package sweep

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzReadCell: any bytes read as a sweep's cell file give a cell with a
// result or one error, one line, naming the file; never a panic.
func FuzzReadCell(f *testing.F) {
	f.Add([]byte(`{"cell":{"index":0,"trace":"t","policy":"cuda","capacity_bytes":0,"as_recorded":true,"file":"t.cuda.x.json"},"result":{"trace":"t","policy":"cuda","peak_reserved_bytes":5}}`))
	f.Add([]byte(`{"cell":{},"result":null}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "cell.json")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		cf, err := ReadCell(path)
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, path) {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
			return
		}
		if cf.Result == nil {
			t.Fatal("a cell without a result accepted")
		}
	})
}
