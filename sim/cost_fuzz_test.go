package sim

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzCostModel: any bytes parsed as a cost model give a model whose
// latencies are between 0 and an hour at every size, or one error, one
// line, naming the file; never a panic.
func FuzzCostModel(f *testing.F) {
	f.Add([]byte(defaultCostCSV))
	f.Add([]byte("api,size_bytes,median_us\ncudaMalloc,1048576,10\ncudaMalloc,2097152,10000\ncudaFree,1,5\ncudaMalloc_suballoc,1,1\ncudaFree_suballoc,1,1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseCostModel(bytes.NewReader(b), "fuzz.csv")
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "fuzz.csv") {
				t.Fatalf("error %q: not one line naming the file", msg)
			}
			return
		}
		for _, call := range m.Calls() {
			for _, size := range []uint64{0, 1, 512, 1 << 20, 1 << 40, 1 << 63} {
				if ns, _ := m.Latency(call, size); ns < 0 || ns > maxCallNS {
					t.Fatalf("%s of %d bytes: %d ns", call, size, ns)
				}
			}
		}
	})
}
