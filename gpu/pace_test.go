package gpu

import (
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// pacedTrace has two idle times the pacing keeps: 100 ms before event 1
// (cut to PaceMax, 50 ms) and 2.99 ms before event 3 (since event 2); the
// others are below PaceMin.
const pacedTrace = `malloc id=1 size=4MiB t=0
malloc id=2 size=4MiB t=100000000
free id=1 t=100010000
free id=2 t=103000000
malloc id=3 size=1MiB t=103000500
free id=3 t=103001000
`

// pacedModel wakes a call after 1 ms idle for 100 us more, after 10 ms for
// 200 us: in pacedTrace, 200 us at event 1 (flat beyond 10 ms) and
// 100 + 100*log10(2.99) = 147.567 us at event 3.
const pacedModel = `api,size_bytes,median_us
cudaMalloc,512,50
cudaFree,512,40
cudaMalloc_suballoc,512,2
cudaFree_suballoc,512,3
wake,1000000,100
wake,10000000,200
`

func TestPace(t *testing.T) {
	model, err := sim.ParseCostModel(strings.NewReader(pacedModel), "paced.csv")
	if err != nil {
		t.Fatal(err)
	}
	// The fake runtime wakes a call made 2 ms or more after the previous
	// one returned 1 ms late: paced, the calls of events 1 and 3. (The
	// first call may wake too: the replay was not warmed up.)
	for _, unbatched := range []bool{false, true} {
		for _, pace := range []bool{false, true} {
			rt := fakeRuntime(t, "", "FAKECUDA_WAKE=2000000:1000000")
			var log strings.Builder
			res, err := Replay(context.Background(), rt, textTrace(t, pacedTrace), Config{
				Policy: TargetCUDA, MaxBytes: 64 << 20, Sim: model, Pace: pace, Unbatched: unbatched, CallLog: &log,
			})
			if err != nil {
				t.Fatal(err)
			}
			name := map[bool]string{false: "unpaced", true: "paced"}[pace]
			if unbatched {
				name += ", unbatched"
			}
			if res.Paced != pace {
				t.Errorf("%s: paced %v", name, res.Paced)
			}
			if pace {
				// 50 + 2.99 ms kept; two calls woken, 1 ms each.
				if res.ReplayWallNS < 52.99e6 {
					t.Errorf("%s: replay wall %d ns, want the 52.99 ms of kept idle time or more", name, res.ReplayWallNS)
				}
				if res.AllocTimeNS < 2e6 {
					t.Errorf("%s: allocator time %d ns, want 2 ms of wake-ups or more", name, res.AllocTimeNS)
				}
				if ns := callNS(t, log.String()); ns[1] < 1e6 || ns[3] < 1e6 {
					t.Errorf("%s: calls %v ns, want those of events 1 and 3 woken (1 ms or more)", name, ns)
				}
				if res.SimWakeTimeNS != 347567 {
					t.Errorf("%s: simulated wake-up time %d ns, want 347567", name, res.SimWakeTimeNS)
				}
			} else {
				// Back to back: the calls of events 1 and 3 do not wake
				// (timed one by one, so that a stall of the test machine
				// elsewhere does not count), and the simulation charges
				// none.
				if ns := callNS(t, log.String()); ns[1] >= 1e6 || ns[3] >= 1e6 {
					t.Errorf("%s: calls %v ns, want those of events 1 and 3 back to back (under 1 ms)", name, ns)
				}
				if res.SimWakeTimeNS != 0 {
					t.Errorf("%s: simulated wake-up time %d ns, want 0", name, res.SimWakeTimeNS)
				}
			}
			// Without the wake-ups: three cudaMalloc at 50 us, three
			// cudaFree at 40 us.
			if got := res.SimAllocTimeNS - res.SimWakeTimeNS; got != 270000 || res.DeviceAllocs != 3 || res.DeviceFrees != 3 {
				t.Errorf("%s: %d allocs, %d frees, simulated %d ns without wake-ups; want 3, 3, 270000", name, res.DeviceAllocs, res.DeviceFrees, got)
			}
		}
	}
}

// callNS returns the durations in nanoseconds of the calls in a call log
// (call,size,ptr,ns,pool_reserved lines after a header).
func callNS(t *testing.T, log string) []int64 {
	t.Helper()
	var ns []int64
	for _, line := range strings.Split(strings.TrimSpace(log), "\n")[1:] {
		f := strings.Split(line, ",")
		n, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			t.Fatalf("call log line %q: %v", line, err)
		}
		ns = append(ns, n)
	}
	if len(ns) < 4 {
		t.Fatalf("call log %q: %d calls", log, len(ns))
	}
	return ns
}

// TestRepeatWarmsUp checks that each run of Repeat starts with the driver
// warmed up: the harness's own pause before the first call (its rest, the
// opening and decoding of the trace, a garbage collection) must not wake
// the first call up. Opening the trace takes 100 ms here, as importing a
// snapshot does; the fake runtime plants a 2 ms wake-up after 60 ms idle
// (below the pause, above what a loaded machine puts between the trace's
// back-to-back calls: 10 ms woke a call on a busy 2-core machine, 25 ms
// did once with two test runs on it).
func TestRepeatWarmsUp(t *testing.T) {
	rt := fakeRuntime(t, "", "FAKECUDA_WAKE=60000000:2000000")
	open := func() (trace.Source, io.Closer, error) {
		time.Sleep(100 * time.Millisecond)
		return textTrace(t, pacedTrace), io.NopCloser(nil), nil
	}
	for _, policy := range []string{TargetCUDA, "pytorch"} {
		res, err := Repeat(context.Background(), rt, open, Config{Policy: policy, MaxBytes: 64 << 20, Sim: sim.DefaultCostModel()}, 3, false)
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range res.Runs {
			if r.AllocTimeNS >= 2e6 {
				t.Errorf("%s, run %d: allocator time %d ns: a call woke up", policy, k, r.AllocTimeNS)
			}
		}
	}
}
