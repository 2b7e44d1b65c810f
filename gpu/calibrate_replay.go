package gpu

import (
	"fmt"
	"io"
	"math"

	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// replayTargets are the targets whose replays of the calibration
// workloads give the large calls' rows (replays): a policy, whose calls
// come from Go between the engine's and the policy's own work, and the
// cuda target, whose calls come back to back in C.
var replayTargets = []string{"pytorch", TargetCUDA}

// minReplaySamples is the fewest calls of a kind at a size point that
// replace the row measured alone.
const minReplaySamples = 8

// replays measures the large calls (over sim.SubAllocMax) as a replay
// makes them, which is what the model predicts: each workload replayed on
// the GPU as replay gpu replays it (Replay, the driver warmed up first),
// against each of replayTargets, with its calls logged. A large cudaMalloc
// of a size freed before and not taken again reuses that mapping (the
// cudaMalloc row), any other is of fresh memory (cudaMalloc_batch), as
// the simulated device's cost meter tells them apart; a large cudaFree is
// the cudaFree row. Each call counts at the nearest size of
// CalibrationSizes (in log), and where a kind has at least
// minReplaySamples calls at a size, their mean latency replaces the row
// measured alone (isolated, batch): a replay's calls meet the driver and
// the CPU's caches as the program's work between them leaves them, which
// neither back-to-back nor cold-cache calls do (on an H200 a fresh 2 MiB
// cudaMalloc took 36-40 us back to back, 113 us after the caches were made
// cold, and 40-80 us in pytorch's replays).
func (c *calibration) replays() error {
	workloads := c.opt.Workloads
	if len(workloads) == 0 {
		workloads = syntheticWorkloads()
	}
	samples := map[subKey][]int64{}
	for _, w := range workloads {
		for _, target := range replayTargets {
			if err := c.replayWorkload(w, target, samples); err != nil {
				return err
			}
		}
	}
	for _, row := range []string{sim.CostMalloc, sim.CostMallocBatch, sim.CostFree} {
		for _, p := range c.sizes(math.MaxUint64) {
			if p <= sim.SubAllocMax {
				continue
			}
			if ns := samples[subKey{row, p}]; len(ns) >= minReplaySamples {
				c.replace(row, p, ns)
			}
		}
	}
	return nil
}

// replayWorkload replays w against target on the GPU and appends the
// latencies of its large calls to samples, by kind and size point.
func (c *calibration) replayWorkload(w Workload, target string, samples map[subKey][]int64) error {
	src, closer, err := w.Open()
	if err != nil {
		return fmt.Errorf("workload %s: %w", w.Name, err)
	}
	defer closer.Close()
	freed := map[uint64]int{} // large sizes freed and not taken again
	live := map[uint64]uint64{}
	n := 0
	onCall := func(call string, size, ptr uint64, ns int64) {
		switch call {
		case "cudaMalloc":
			live[ptr] = size
		case "cudaFree":
			if s, ok := live[ptr]; ok {
				size = s
				delete(live, ptr)
			}
		default:
			return
		}
		if size <= sim.SubAllocMax {
			return
		}
		row := sim.CostFree
		switch {
		case call == "cudaFree":
			freed[size]++
		case freed[size] > 0:
			freed[size]--
			row = sim.CostMalloc
		default:
			row = sim.CostMallocBatch
		}
		k := subKey{row, nearest(CalibrationSizes, size)}
		samples[k] = append(samples[k], ns)
		n++
	}
	cfg := Config{Trace: w.Name, Policy: target, MaxBytes: c.limit, warm: true, onCall: onCall}
	if _, err := Replay(c.ctx, c.rt, &limitSource{src: src, left: c.opt.WorkloadEvents}, cfg); err != nil {
		return fmt.Errorf("workload %s, %s: %w", w.Name, target, err)
	}
	if c.opt.Progress != nil {
		fmt.Fprintf(c.opt.Progress, "workload %s, %s: %d large cudaMalloc/cudaFree calls timed\n", w.Name, target, n)
	}
	return nil
}

// nearest returns the size of points nearest to s, in log.
func nearest(points []uint64, s uint64) uint64 {
	best := points[0]
	for _, p := range points {
		if math.Abs(math.Log(float64(s))-math.Log(float64(p))) < math.Abs(math.Log(float64(s))-math.Log(float64(best))) {
			best = p
		}
	}
	return best
}

// replace puts the row of api at size measured from ns in place of the
// one measured before, if any.
func (c *calibration) replace(api string, size uint64, ns []int64) {
	for i, r := range c.rows {
		if r.API == api && r.Size == size {
			c.rows = append(c.rows[:i], c.rows[i+1:]...)
			break
		}
	}
	c.add(api, size, ns)
}

// limitSource is src cut after left events.
type limitSource struct {
	src  trace.Source
	left int
}

func (l *limitSource) Header() trace.Header { return l.src.Header() }

func (l *limitSource) Next() (trace.Event, error) {
	if l.left <= 0 {
		return trace.Event{}, io.EOF
	}
	l.left--
	return l.src.Next()
}
