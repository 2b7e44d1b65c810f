package execpolicy_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/internal/benchline"
	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/policies/execpolicy"
	"github.com/gpualloc/allocsim/sim"
)

// BenchmarkExec measures events per second through the protocol itself,
// with children that answer at once: testdata/instant.py (allocsim_policy's
// loop) and testdata/gochild.go (built here). An op is one event: in
// malloc+free a malloc (a round trip) and its free (written without
// waiting) by turns; in malloc+free-ahead the same told ahead (Ahead) in
// windows of 256 mallocs as the engine tells them, so that a child that
// asked for the hook pipeline answers them without a round trip each; in
// free only frees, none waited for but the last. In
// pipe an op is one round trip of a line over the same kind of pipes to a
// child that echoes it and speaks no protocol (gochild.go echo,
// testdata/echo.py): the machine's floor, whose events/s (two events per
// round trip) is the ceiling of malloc+free by turns.
//
// Besides Go's benchmark output, `make bench` prints after the run one line
// per sub-benchmark (the last b.N round's figures):
//
//	BENCH trace=synthetic stage=exec child=C pattern=P events_per_s=N ns_per_event=T ns_per_roundtrip=R
//
// where C is go or python, P is malloc+free, malloc+free-ahead, free or
// pipe, and R (for
// malloc+free and pipe) is the wall-clock nanoseconds per round trip.
func BenchmarkExec(b *testing.B) {
	gochild := filepath.Join(b.TempDir(), "gochild")
	if out, err := exec.Command("go", "build", "-o", gochild, "testdata/gochild.go").CombinedOutput(); err != nil {
		b.Fatalf("go build testdata/gochild.go: %v\n%s", err, out)
	}
	type child struct{ name, command, echo string }
	children := []child{{"go", gochild, gochild + " echo"}}
	if _, err := exec.LookPath("python3"); err == nil {
		children = append(children, child{"python", "python3 testdata/instant.py", "python3 testdata/echo.py"})
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
			reportExec(b, c.name, "malloc+free", 2)
		})
		b.Run(c.name+"/malloc+free-ahead", func(b *testing.B) {
			p := start(b)
			defer p.Close()
			// Windows as the engine tells them (sim's ahead.go): 256
			// mallocs, each freed by the next call.
			const window = 512
			calls := make([]policies.Call, window)
			for k := range calls {
				calls[k] = policies.Call{Size: 4096}
				if k%2 == 1 {
					calls[k] = policies.Call{Free: true, Of: k - 1}
				}
			}
			var blk policies.Block
			var err error
			b.ResetTimer()
			for i := range b.N {
				k := i % window
				if k == 0 {
					n := min(window, b.N-i)
					err = p.Ahead(calls[:n])
				}
				if err == nil {
					if k%2 == 0 {
						blk, err = p.Malloc(4096, 0)
					} else {
						err = p.Free(blk.Addr, 0)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			reportExec(b, c.name, "malloc+free-ahead", 0)
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
			reportExec(b, c.name, "free", 0)
		})
		b.Run(c.name+"/pipe", func(b *testing.B) {
			argv, err := execpolicy.Split(c.echo)
			if err != nil {
				b.Fatal(err)
			}
			e := startEcho(b, argv)
			defer e.close()
			e.roundTrip(b) // started, not timed
			b.ResetTimer()
			for range b.N {
				e.roundTrip(b)
			}
			b.StopTimer()
			reportExec(b, c.name, "pipe", 1)
		})
	}
}

// reportExec reports the events per second of b and records its BENCH
// line; perTrip is the number of ops per round trip, 0 for none.
func reportExec(b *testing.B, child, pattern string, perTrip int) {
	sec := b.Elapsed().Seconds()
	ns := sec * 1e9 / float64(b.N)
	eps := float64(b.N) / sec
	line := fmt.Sprintf("BENCH trace=synthetic stage=exec child=%s pattern=%s", child, pattern)
	if pattern == "pipe" {
		eps *= 2 // two events, a malloc and its free, per round trip
	}
	b.ReportMetric(eps, "events/s")
	line += fmt.Sprintf(" events_per_s=%.0f ns_per_event=%.1f", eps, 1e9/eps)
	if perTrip > 0 {
		b.ReportMetric(ns*float64(perTrip), "ns/roundtrip")
		line += fmt.Sprintf(" ns_per_roundtrip=%.0f", ns*float64(perTrip))
	}
	benchReport("exec "+child+" "+pattern, line)
}

// echo is a child that echoes lines, over blocking pipes as the engine's.
type echo struct {
	cmd     *exec.Cmd
	in, raw *os.File // the engine's ends of the child's stdin and stdout
	out     *bufio.Reader
}

func startEcho(b *testing.B, argv []string) *echo {
	var in, out [2]int
	if err := syscall.Pipe2(in[:], syscall.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	if err := syscall.Pipe2(out[:], syscall.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	inR, inW := os.NewFile(uintptr(in[0]), "|0"), os.NewFile(uintptr(in[1]), "|1")
	outR, outW := os.NewFile(uintptr(out[0]), "|0"), os.NewFile(uintptr(out[1]), "|1")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	err := cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		b.Fatal(err)
	}
	return &echo{cmd: cmd, in: inW, raw: outR, out: bufio.NewReaderSize(outR, 64<<10)}
}

var echoLine = []byte("malloc 4096 0\n")

func (e *echo) roundTrip(b *testing.B) {
	if _, err := e.in.Write(echoLine); err != nil {
		b.Fatal(err)
	}
	if _, err := e.out.ReadSlice('\n'); err != nil {
		b.Fatal(err)
	}
}

func (e *echo) close() {
	e.in.Close()
	e.cmd.Wait()
	e.raw.Close()
}

// benchReport keeps a BENCH line, printed by TestMain after the run.
func benchReport(key, line string) { benchline.Report(key, line) }

func TestMain(m *testing.M) {
	code := m.Run()
	benchline.Print(os.Stdout)
	os.Exit(code)
}
