package tune

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// BenchmarkTune measures replay tune's search on kv_decode (from
// $ALLOCSIM_TRACES or ../shared/traces) on one core: every setting string
// of the default grid replayed from the trace decoded once, as tune -j 1
// does, and prints the candidates per second:
//
//	BENCH trace=kv_decode stage=tune candidates=180 seconds=S candidates_per_s_per_core=C
func BenchmarkTune(b *testing.B) {
	path := kvDecode(b)
	f, err := tracefile.Open(path, tracefile.Options{})
	if err != nil {
		b.Fatal(err)
	}
	h := f.Header()
	evs, err := trace.ReadAll(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	confs := Candidates(PyTorchGrid)
	base := sim.Config{Trace: path, Policy: "pytorch", AsRecorded: true, CardCapacity: true}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Run(h, evs, base, confs, 1); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	fmt.Printf("BENCH trace=kv_decode stage=tune candidates=%d seconds=%.3f candidates_per_s_per_core=%.1f\n", len(confs), sec, float64(len(confs))/sec)
	b.ReportMetric(float64(len(confs))/sec, "candidates/s")
}

// kvDecode returns the path of the kv_decode snapshot, or skips.
func kvDecode(b *testing.B) string {
	var dirs []string
	if d := os.Getenv("ALLOCSIM_TRACES"); d != "" {
		dirs = append(dirs, filepath.Join(d, "pytorch"))
	}
	dirs = append(dirs, filepath.Join("..", "..", "..", "shared", "traces", "pytorch"))
	for _, d := range dirs {
		p := filepath.Join(d, "kv_decode.pickle.gz")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	b.Skip("kv_decode.pickle.gz not found (set ALLOCSIM_TRACES to the trace collection)")
	return ""
}
