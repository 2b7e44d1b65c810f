package execpolicy_test

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/execpolicy"
	"github.com/gpualloc/allocsim/sim"
)

// BenchmarkExec measures events per second through the protocol itself,
// with children that answer at once: testdata/instant.py (allocsim_policy's
// loop) and testdata/gochild.go (built here). An op is one event: in
// malloc+free a malloc (a round trip) and its free (written without
// waiting) by turns; in free only frees, none waited for but the last.
func BenchmarkExec(b *testing.B) {
	gochild := filepath.Join(b.TempDir(), "gochild")
	if out, err := exec.Command("go", "build", "-o", gochild, "testdata/gochild.go").CombinedOutput(); err != nil {
		b.Fatalf("go build testdata/gochild.go: %v\n%s", err, out)
	}
	children := []struct{ name, command string }{{"go", gochild}}
	if _, err := exec.LookPath("python3"); err == nil {
		children = append(children, struct{ name, command string }{"python", "python3 testdata/instant.py"})
	} else {
		b.Log("python3 is not installed: the Python child is not measured")
	}
	for _, c := range children {
		start := func(b *testing.B) *execpolicy.Policy {
			p, err := execpolicy.New(c.command, sim.NewDevice(0), execpolicy.Options{Timeout: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := p.Malloc(1, 0); err != nil { // started, not timed
				b.Fatal(err)
			}
			return p
		}
		b.Run(c.name+"/malloc+free", func(b *testing.B) {
			p := start(b)
			defer p.Close()
			var blk policies.Block
			var err error
			b.ResetTimer()
			for i := range b.N {
				if i%2 == 0 {
					blk, err = p.Malloc(4096, 0)
				} else {
					err = p.Free(blk.Addr, 0)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run(c.name+"/free", func(b *testing.B) {
			p := start(b)
			defer p.Close()
			b.ResetTimer()
			for i := range b.N {
				if err := p.Free(uint64(i)*4096, 0); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := p.Malloc(1, 0); err != nil { // the child has taken them all
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
