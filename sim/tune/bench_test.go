package tune

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpualloc/allocsim/sim"
)

// BenchmarkTune measures replay tune's search on kv_decode (from
// $ALLOCSIM_TRACES or ../shared/traces) on one core: every setting string
// of the default grid from the trace decoded once, as tune -j 1 does:
// each replayed (mode=replay-all, tune --replay-all) and as tune runs by
// default, a setting not replayed where the replay of another shows that
// it cannot act (mode=same-replay). It prints the candidates and the
// replays per second:
//
//	BENCH trace=kv_decode stage=tune mode=M candidates=180 replays=N seconds=S candidates_per_s_per_core=C replays_per_s_per_core=R
func BenchmarkTune(b *testing.B) {
	path := kvDecode(b)
	h, evs := readTrace(b, path)
	confs := Candidates(PyTorchGrid)
	base := sim.Config{Trace: path, Policy: "pytorch", AsRecorded: true, CardCapacity: true}
	for _, all := range []bool{true, false} {
		name := "same-replay"
		if all {
			name = "replay-all"
		}
		b.Run(name, func(b *testing.B) {
			var replays int
			for i := 0; i < b.N; i++ {
				cs, err := Run(h, evs, base, confs, 1, all)
				if err != nil {
					b.Fatal(err)
				}
				replays = 0
				for _, c := range cs {
					if c.Same == "" {
						replays++
					}
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			fmt.Printf("BENCH trace=kv_decode stage=tune mode=%s candidates=%d replays=%d seconds=%.3f candidates_per_s_per_core=%.1f replays_per_s_per_core=%.1f\n",
				name, len(confs), replays, sec, float64(len(confs))/sec, float64(replays)/sec)
			b.ReportMetric(float64(len(confs))/sec, "candidates/s")
		})
	}
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
