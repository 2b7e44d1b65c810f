package results

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzReader: any bytes read as results JSON give records or one error,
// one line, naming the file; never a panic.
func FuzzReader(f *testing.F) {
	f.Add([]byte(`{"kind": "sim", "version": 1, "results": [{"trace": "t", "policy": "cuda", "peak_reserved_bytes": 5}]}`))
	f.Add([]byte(`{"kind": "fit", "version": 1, "results": [{"trace": "t", "policy": "bfc", "min_capacity_bytes": 20, "fits": true}]}`))
	f.Add([]byte(`[{"trace": "t", "policy": "cuda"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b), "fuzz.json")
		if err == nil {
			for n := 0; r.Scan() && n < 1<<16; n++ {
			}
			err = r.Err()
		}
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "fuzz.json") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
		}
	})
}
