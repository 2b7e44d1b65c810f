package gpu

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/synth"
)

// CostRow is one measured series of a calibration: the latencies of N calls
// of API on Size bytes, in microseconds (FirstUS is the first call of the
// series). The rows are those of shared/reference/h200_cuda_latency.csv and
// what sim.ParseCostModel reads. In the wake-up rows (sim.CostWake and the
// like) Size is the idle time in nanoseconds, the latencies are the extra
// over the same call made back to back, and FirstUS is -1.
type CostRow struct {
	API      string
	Size     uint64
	N        int
	FirstUS  float64
	MedianUS float64
	P90US    float64
	MinUS    float64
	// MeanUS is the mean latency of the calls but the slowest 5% (of a
	// series of 20 calls or more; see trimmedMean): what a sum of calls
	// takes divided by their number, the figure a model that sums
	// latencies charges (sim reads it before the median where a model has
	// it), without the rare calls of milliseconds a workload can meet.
	MeanUS float64
}

// CalibrateOptions bound a calibration.
type CalibrateOptions struct {
	// MaxSize is the largest size measured in bytes; 0 means 4 GiB.
	MaxSize uint64
	// MaxBytes bounds the device memory held at once; 0 means the free
	// memory at the start minus DefaultMargin.
	MaxBytes uint64
	// N is the number of calls per size up to 256 MiB; 0 means 100. Larger
	// sizes take fewer (at least 10).
	N int
	// WorkloadEvents is the number of events of each workload replayed for
	// the sub-allocation costs; 0 means 50000.
	WorkloadEvents int
	// Workloads, if not empty, are the traces replayed for the
	// sub-allocation costs in place of the synthetic workloads: the
	// driver's small calls cost from about 2.5 us to 6 us depending on the
	// program (measured on an H200), so a model for a kind of job is best
	// calibrated on traces of that kind.
	Workloads []Workload
	// WakeReps is the number of calls timed at each idle time for the
	// wake-up curves; 0 means 7.
	WakeReps int
	// Progress, if not nil, receives one line per series measured.
	Progress io.Writer
}

// A Workload is a trace for the sub-allocation costs of a calibration.
type Workload struct {
	// Name names it in errors and progress lines.
	Name string
	// Open returns the trace's events from the start.
	Open func() (trace.Source, io.Closer, error)
}

// syntheticWorkloads are calibrationWorkloads as Workloads.
func syntheticWorkloads() []Workload {
	var w []Workload
	for _, name := range calibrationWorkloads {
		w = append(w, Workload{Name: "synth " + name, Open: func() (trace.Source, io.Closer, error) {
			src, err := synth.New(name, 1, nil)
			return src, io.NopCloser(nil), err
		}})
	}
	return w
}

// CalibrationSizes are the sizes in bytes a calibration measures, up to
// its MaxSize.
var CalibrationSizes = []uint64{512, 4 << 10, 64 << 10, 1 << 20, 2 << 20, 8 << 20, 20 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30, 16 << 30}

// Calibrate measures the latency of each device call by size on rt's GPU:
// cudaMalloc and cudaFree one at a time (rows cudaMalloc, cudaFree), with up
// to 64 live at once (the _batch rows, each cudaMalloc of fresh memory after
// the CPU's caches were made cold: see coldCaches), small ones in the driver's 2 MiB
// pages (the _suballoc, _newpage and _lastinpage rows, from synthetic
// workloads, and the _suballoc_hot rows); the stream-ordered allocator on a pool
// of its own with release threshold 0 and UINT64_MAX (the _thr0 and _thrmax
// rows, with the stream synchronization after the free); cudaMallocHost and
// cudaFreeHost up to 64 MiB; cudaMallocManaged and its cudaFree up to
// 256 MiB; idle cudaDeviceSynchronize and cudaStreamSynchronize (size 0);
// and last the wake-up curves, the extra latency of a cudaMalloc of 20 MiB
// and of 4 KiB (sub-allocated) after the driver has been idle for each of
// sim.WakeGaps, and of the cudaFree right after it (the wake, wake_next,
// wake_suballoc and wake_suballoc_next rows: see wake). Everything it
// allocates is freed before it returns, also on error and when ctx is
// cancelled.
func Calibrate(ctx context.Context, rt *Runtime, opt CalibrateOptions) (rows []CostRow, err error) {
	return calibrate(ctx, rt, opt, nil)
}

// calibrate is Calibrate running only the steps named in only (all if
// only is empty), for the tests.
func calibrate(ctx context.Context, rt *Runtime, opt CalibrateOptions, only []string) (rows []CostRow, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	free, _, err := rt.MemGetInfo()
	if err != nil {
		return nil, err
	}
	limit, err := Limit(opt.MaxBytes, 0, free)
	if err != nil {
		return nil, err
	}
	if opt.MaxSize == 0 {
		opt.MaxSize = 4 << 30
	}
	if opt.N <= 0 {
		opt.N = 100
	}
	if opt.WorkloadEvents <= 0 {
		opt.WorkloadEvents = 50000
	}
	if opt.WakeReps <= 0 {
		opt.WakeReps = 7
	}
	c := &calibration{ctx: ctx, rt: rt, opt: opt, limit: limit, dev: map[uint64]bool{}, host: map[uint64]bool{}}
	defer func() {
		if cerr := c.release(); cerr != nil && err == nil {
			err = fmt.Errorf("releasing the calibration's memory: %w", cerr)
		}
	}()
	steps := []struct {
		name string
		run  func() error
	}{{"isolated", c.isolated}, {"batch", c.batch}, {"suballoc", c.suballoc}, {"replays", c.replays}, {"async", c.async},
		{"pinned", c.pinned}, {"managed", c.managed}, {"syncs", c.syncs}, {"wake", c.wake}}
	for _, step := range steps {
		if len(only) > 0 && !slices.Contains(only, step.name) {
			continue
		}
		if err := step.run(); err != nil {
			return nil, err
		}
	}
	return c.rows, nil
}

type calibration struct {
	ctx   context.Context
	rt    *Runtime
	opt   CalibrateOptions
	limit uint64
	rows  []CostRow

	dev, host map[uint64]bool // live device (and managed) and pinned pointers
	pool      uint64          // created pool, 0 if none
	asyncLive map[uint64]bool
}

// sizes returns the calibration sizes up to max and the limit.
func (c *calibration) sizes(max uint64) []uint64 {
	var out []uint64
	for _, s := range CalibrationSizes {
		if s <= max && s <= c.opt.MaxSize && s <= c.limit {
			out = append(out, s)
		}
	}
	return out
}

func (c *calibration) n(size uint64) int {
	switch {
	case size <= 256<<20:
		return c.opt.N
	case size <= 1<<30:
		return max(c.opt.N/5, 10)
	}
	return 10
}

func (c *calibration) add(api string, size uint64, ns []int64) {
	if len(ns) == 0 {
		return
	}
	row := CostRow{API: api, Size: size, N: len(ns), FirstUS: float64(ns[0]) / 1e3}
	s := append([]int64(nil), ns...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	row.MedianUS = float64(quantile(s, 0.5)) / 1e3
	row.P90US = float64(quantile(s, 0.9)) / 1e3
	row.MinUS = float64(s[0]) / 1e3
	row.MeanUS = trimmedMean(s) / 1e3
	c.rows = append(c.rows, row)
	if c.opt.Progress != nil {
		fmt.Fprintf(c.opt.Progress, "%-32s %12d B  n=%-4d median %10.2f us  p90 %10.2f us\n", api, size, row.N, row.MedianUS, row.P90US)
	}
}

// trimSlowest is the share of a series' slowest calls that its mean
// leaves out (trimmedMean).
const trimSlowest = 0.05

// trimmedMean returns the mean in nanoseconds of sorted s without its
// slowest trimSlowest (none of a series under 20 calls). A series measured
// on a workload can hold a few calls of milliseconds, the driver's own
// work, that the replays of a trace mostly do not meet: on an H200 the
// synthetic workloads' cudaMalloc calls at the 256 MiB size point took
// 74-76 us at the median and 269-407 us on average (78-81 us without the
// slowest 5%), and the model that charged that average put train_gpt's
// cudaMallocs of 64 MiB-1 GiB at 2.2x their measured 56-68 us under
// pytorch, 2.9-3.0x their 53-77 us under the cuda target.
func trimmedMean(s []int64) float64 {
	n := len(s)
	if n >= 20 {
		n = int(math.Ceil(float64(n) * (1 - trimSlowest)))
	}
	var sum float64
	for _, v := range s[:n] {
		sum += float64(v)
	}
	return sum / float64(n)
}

// quantile returns the nearest-rank quantile q of sorted s.
func quantile(s []int64, q float64) int64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (c *calibration) malloc(size uint64) (uint64, int64, error) {
	p, ns, err := c.rt.Malloc(size)
	if err == nil {
		c.dev[p] = true
	}
	return p, ns, err
}

func (c *calibration) free(p uint64) (int64, error) {
	ns, err := c.rt.Free(p)
	if err == nil {
		delete(c.dev, p)
	}
	return ns, err
}

// pairs times c.n(size) cudaMalloc/cudaFree pairs of size bytes, one
// allocation live at a time, and returns the latencies in nanoseconds.
func (c *calibration) pairs(size uint64) (malloc, free []int64, err error) {
	for k := 0; k < c.n(size); k++ {
		if err := c.ctx.Err(); err != nil {
			return nil, nil, err
		}
		p, ns, err := c.malloc(size)
		if err != nil {
			return nil, nil, fmt.Errorf("cudaMalloc of %d bytes: %w", size, err)
		}
		malloc = append(malloc, ns)
		if ns, err = c.free(p); err != nil {
			return nil, nil, err
		}
		free = append(free, ns)
	}
	return malloc, free, nil
}

func (c *calibration) isolated() error {
	for _, size := range c.sizes(math.MaxUint64) {
		m, f, err := c.pairs(size)
		if err != nil {
			return err
		}
		c.add(sim.CostMalloc, size, m)
		c.add(sim.CostFree, size, f)
	}
	return nil
}

// coldBytes is the host memory coldCaches runs through: enough to evict
// the driver's data from the CPU's caches, as a job's own work between two
// cudaMallocs does.
const coldBytes = 8 << 20

var coldBuf []byte

// coldCaches runs through coldBytes of host memory, so that the next call
// finds the CPU's caches cold. On an H200 host a cudaMalloc of fresh memory
// (2 MiB to 64 MiB, 64 live) took 36-40 us back to back and 65-77 us right
// after this, 130 us against 57 at 256 MiB: the cost of the calls of a job
// or of a policy's replay, which run between other work, and the cost the
// reference measurement (shared/reference/h200_cuda_latency.csv, 74-83 us)
// shows.
func coldCaches() {
	if coldBuf == nil {
		coldBuf = make([]byte, coldBytes)
	}
	for i := 0; i < len(coldBuf); i += 64 {
		coldBuf[i]++
	}
}

func (c *calibration) batch() error {
	for _, size := range c.sizes(math.MaxUint64) {
		count := int(min(64, c.limit/size))
		if count < 2 {
			continue
		}
		var m, f []int64
		ptrs := make([]uint64, 0, count)
		for k := 0; k < count; k++ {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			coldCaches()
			p, ns, err := c.malloc(size)
			if err != nil {
				return fmt.Errorf("cudaMalloc of %d bytes (%d live): %w", size, k, err)
			}
			m = append(m, ns)
			ptrs = append(ptrs, p)
		}
		for _, p := range ptrs {
			ns, err := c.free(p)
			if err != nil {
				return err
			}
			f = append(f, ns)
		}
		c.add(sim.CostMallocBatch, size, m)
		c.add(sim.CostFreeBatch, size, f)
	}
	return nil
}

// suballoc measures small allocations that the driver places in 2 MiB
// pages: first in a hot loop, a cudaMalloc and cudaFree of one size in a
// page kept mapped by an anchor allocation of 512 bytes (the _suballoc_hot
// rows, the best case); then as they come in programs: the synthetic
// workloads of package trace/synth (training, inference, KV cache, a
// service; the first 50000 events of each, seed 1) replayed through
// cudaMalloc and cudaFree. Each small call of those is classed by the page
// its pointer falls in: placed in a page that had live allocations
// (_suballoc), or mapping a new one (_newpage); a free that leaves its page
// live (_suballoc) or empties it (_lastinpage). Sizes are reported at the
// nearest of 512 B, 4 KiB, 64 KiB and 1 MiB.
func (c *calibration) suballoc() error {
	anchor, _, err := c.malloc(512)
	if err != nil {
		return fmt.Errorf("cudaMalloc of the anchor: %w", err)
	}
	for _, size := range c.sizes(sim.SubAllocMax) {
		m, f, err := c.pairs(size)
		if err != nil {
			return err
		}
		c.add(sim.CostMallocSuballoc+"_hot", size, m)
		c.add(sim.CostFreeSuballoc+"_hot", size, f)
	}
	if _, err := c.free(anchor); err != nil {
		return err
	}
	return c.workloads()
}

// calibrationWorkloads are the synthetic workloads the sub-allocation
// costs are measured on.
var calibrationWorkloads = []string{"train", "inference", "kvcache", "service"}

// churnPoints are the sizes the sub-allocation latencies are reported at.
var churnPoints = []uint64{512, 4 << 10, 64 << 10, 1 << 20}

func (c *calibration) workloads() error {
	point := func(s uint64) uint64 { return nearest(churnPoints, s) }
	samples := map[subKey][]int64{}
	workloads := c.opt.Workloads
	if len(workloads) == 0 {
		workloads = syntheticWorkloads()
	}
	for _, w := range workloads {
		if err := c.workload(w, point, samples); err != nil {
			return err
		}
	}
	for _, row := range []string{sim.CostMallocSuballoc, sim.CostFreeSuballoc, sim.CostMallocNewPage, sim.CostFreeLastInPage} {
		for _, p := range churnPoints {
			if p <= c.opt.MaxSize {
				c.add(row, p, samples[subKey{row, p}])
			}
		}
	}
	return nil
}

// workload replays the first WorkloadEvents events of w through cudaMalloc
// and cudaFree and appends the latencies of its small calls to samples.
func (c *calibration) workload(w Workload, point func(uint64) uint64, samples map[subKey][]int64) error {
	name := w.Name
	src, closer, err := w.Open()
	if err != nil {
		return fmt.Errorf("workload %s: %w", name, err)
	}
	defer closer.Close()
	// The calls are made as the cuda target makes them: those of up to
	// batchOps consecutive mallocs and frees back to back in C. Made one
	// at a time from Go, each small call cost 0.6-1.2 us more on an H200.
	b := &batch{}
	slots := map[uint64]int32{} // address handed to the engine -> slot of its malloc
	pages := map[uint64]int{}   // 2 MiB page -> live small allocations
	var reserved uint64
	small := 0 // small calls timed
	flush := func() error {
		done := b.call(c.rt, c.limit, &reserved, false)
		for j := 0; j < len(b.size) && j <= done; j++ {
			p, ns, rc := b.ptr[j], b.ns[j], int(b.rc[j])
			size := b.size[j]
			if j == done {
				call := "cudaFree"
				if size > 0 {
					call = "cudaMalloc"
				}
				return fmt.Errorf("workload %s: %s: %w", name, call, c.rt.errorOf(call, rc))
			}
			if size > 0 { // a cudaMalloc: refused past the limit or out of memory, it made no pointer
				if rc != 0 {
					continue
				}
				c.dev[p] = true
				if size <= sim.SubAllocMax {
					row := sim.CostMallocSuballoc
					if pages[p>>21] == 0 {
						row = sim.CostMallocNewPage
					}
					pages[p>>21]++
					k := subKey{row, point(size)}
					samples[k] = append(samples[k], ns)
					small++
				}
				continue
			}
			if p == 0 {
				continue // its malloc made no pointer: no call
			}
			delete(c.dev, p)
			if size = b.slotSize[b.slot[j]]; size <= sim.SubAllocMax {
				pages[p>>21]--
				row := sim.CostFreeSuballoc
				if pages[p>>21] == 0 {
					row = sim.CostFreeLastInPage
				}
				k := subKey{row, point(size)}
				samples[k] = append(samples[k], ns)
				small++
			}
		}
		b.spare = append(b.spare, b.freed...)
		b.freed = b.freed[:0]
		b.reset()
		return nil
	}
	// The engine of replay sim interprets the trace, with the cuda target
	// on a device that records its calls as batch operations.
	calls := &callRecorder{b: b, slots: slots}
	reps, src, err := sim.Prepare(src, sim.Config{Trace: name, Policy: TargetCUDA, Backend: calls,
		NewPolicy: func(d policies.Device, s policies.Settings) (policies.Policy, error) { return newCUDATarget(d, s) }})
	if err != nil {
		return fmt.Errorf("workload %s: %w", name, err)
	}
	for i := 0; i < c.opt.WorkloadEvents; i++ {
		ev, err := src.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("workload %s: %w", name, err)
		}
		if err := reps[0].Step(int64(i), ev); err != nil {
			return fmt.Errorf("workload %s: %w", name, err)
		}
		if len(b.size) >= batchOps {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for _, s := range slots {
		if p := b.slotPtr[s]; p != 0 {
			if _, err := c.free(p); err != nil {
				return fmt.Errorf("workload %s: %w", name, err)
			}
		}
	}
	if c.opt.Progress != nil {
		fmt.Fprintf(c.opt.Progress, "workload %s: %d small cudaMalloc/cudaFree calls timed\n", name, small)
	}
	return nil
}

// subKey names a sub-allocation series: its row and size point.
type subKey struct {
	row  string
	size uint64
}

func (c *calibration) async() error {
	if !c.rt.HasAsync() {
		if c.opt.Progress != nil {
			fmt.Fprintf(c.opt.Progress, "no stream-ordered allocator in %s: skipped\n", c.rt.Path)
		}
		return nil
	}
	pool, err := c.rt.MemPoolCreate(c.limit)
	if err != nil {
		if pool, err = c.rt.MemPoolCreate(0); err != nil {
			return err
		}
	}
	c.pool, c.asyncLive = pool, map[uint64]bool{}
	for _, th := range []struct {
		name string
		v    uint64
	}{{"thr0", 0}, {"thrmax", math.MaxUint64}} {
		if err := c.rt.SetMemPoolAttr(pool, PoolReleaseThreshold, th.v); err != nil {
			return err
		}
		for _, size := range c.sizes(math.MaxUint64) {
			var m, f, s []int64
			for k := 0; k < c.n(size); k++ {
				if err := c.ctx.Err(); err != nil {
					return err
				}
				p, ns, err := c.rt.MallocFromPoolAsync(size, pool, 0)
				if err != nil {
					return fmt.Errorf("cudaMallocFromPoolAsync of %d bytes: %w", size, err)
				}
				c.asyncLive[p] = true
				m = append(m, ns)
				if ns, err = c.rt.FreeAsync(p, 0); err != nil {
					return err
				}
				delete(c.asyncLive, p)
				f = append(f, ns)
				if ns, err = c.rt.StreamSync(0); err != nil {
					return err
				}
				s = append(s, ns)
			}
			c.add("cudaMallocAsync_"+th.name, size, m)
			c.add("cudaFreeAsync_"+th.name, size, f)
			c.add("cudaStreamSync_after_free_"+th.name, size, s)
		}
		if _, err := c.rt.MemPoolTrimTo(pool, 0); err != nil {
			return err
		}
	}
	return nil
}

func (c *calibration) pinned() error {
	for _, size := range c.sizes(64 << 20) {
		n := c.opt.N / 2
		if size > 2<<20 {
			n = 10
		}
		var m, f []int64
		for k := 0; k < max(n, 1); k++ {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			p, ns, err := c.rt.MallocHost(size)
			if err != nil {
				return fmt.Errorf("cudaMallocHost of %d bytes: %w", size, err)
			}
			c.host[p] = true
			m = append(m, ns)
			if ns, err = c.rt.FreeHost(p); err != nil {
				return err
			}
			delete(c.host, p)
			f = append(f, ns)
		}
		c.add("cudaMallocHost", size, m)
		c.add("cudaFreeHost", size, f)
	}
	return nil
}

func (c *calibration) managed() error {
	for _, size := range c.sizes(256 << 20) {
		var m, f []int64
		for k := 0; k < max(c.opt.N/5, 10); k++ {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			p, ns, err := c.rt.MallocManaged(size)
			if err != nil {
				return fmt.Errorf("cudaMallocManaged of %d bytes: %w", size, err)
			}
			c.dev[p] = true
			m = append(m, ns)
			if ns, err = c.free(p); err != nil {
				return err
			}
			f = append(f, ns)
		}
		c.add("cudaMallocManaged", size, m)
		c.add("cudaFree_managed", size, f)
	}
	return nil
}

func (c *calibration) syncs() error {
	var d, s []int64
	for k := 0; k < c.opt.N; k++ {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		ns, err := c.rt.DeviceSync()
		if err != nil {
			return err
		}
		d = append(d, ns)
		if ns, err = c.rt.StreamSync(0); err != nil {
			return err
		}
		s = append(s, ns)
	}
	c.add("cudaDeviceSynchronize", 0, d)
	c.add("cudaStreamSynchronize", 0, s)
	return nil
}

// Sizes of the wake-up series: a cudaMalloc that maps memory, and one
// placed in a 2 MiB page kept mapped by wakeAnchors live allocations of
// its size.
const (
	wakeLarge   = 20 << 20
	wakeSmall   = 4 << 10
	wakeAnchors = 8
)

// wake measures the wake-up curves: WakeReps rounds, each over 0 and the
// idle times of sim.WakeGaps in an order shuffled anew each round (from a
// fixed seed, so that runs repeat), of a cudaMalloc started that long after
// the previous cudaMalloc or cudaFree returned (the woken call) and the
// cudaFree of its pointer right after it (the next call). First with 20 MiB
// (rows wake and wake_next; skipped if 20 MiB exceeds the limit), then with
// 4 KiB while 8 allocations of 4 KiB keep their driver page mapped (rows
// wake_suballoc and wake_suballoc_next). Each row's latencies are the extra
// over the same call at idle time 0: its median, p90 and minimum less the
// median at 0, none below 0. A series that does not fit under the limit is
// left out, and the progress says so.
func (c *calibration) wake() error {
	rng := rand.New(rand.NewPCG(1, 2))
	skipped := func(size uint64) {
		if c.opt.Progress != nil {
			fmt.Fprintf(c.opt.Progress, "wake: the %d-byte series left out, over the limit of %d bytes: the model will charge no such wake-ups\n", size, c.limit)
		}
	}
	if wakeLarge > c.limit {
		skipped(wakeLarge)
	}
	if wakeLarge <= c.limit {
		woken, next, err := c.wakeSeries(wakeLarge, rng)
		if err != nil {
			return err
		}
		c.addWake(sim.CostWake, woken)
		c.addWake(sim.CostWakeNext, next)
	}
	if (wakeAnchors+1)*wakeSmall > c.limit {
		skipped(wakeSmall)
		return nil
	}
	var anchors []uint64
	for range wakeAnchors {
		p, _, err := c.malloc(wakeSmall)
		if err != nil {
			return fmt.Errorf("cudaMalloc of %d bytes (an anchor of the wake-up series): %w", wakeSmall, err)
		}
		anchors = append(anchors, p)
	}
	woken, next, err := c.wakeSeries(wakeSmall, rng)
	if err != nil {
		return err
	}
	for _, p := range anchors {
		if _, err := c.free(p); err != nil {
			return err
		}
	}
	c.addWake(sim.CostWakeSuballoc, woken)
	c.addWake(sim.CostWakeSuballocNext, next)
	return nil
}

// wakeSeries times the woken cudaMalloc of size bytes and the cudaFree
// right after it, WakeReps times at each idle time, and returns their
// latencies in nanoseconds by idle time.
func (c *calibration) wakeSeries(size uint64, rng *rand.Rand) (woken, next map[int64][]int64, err error) {
	pair := func() (m, f int64, err error) {
		if err := c.ctx.Err(); err != nil {
			return 0, 0, err
		}
		p, m, err := c.malloc(size)
		if err != nil {
			return 0, 0, fmt.Errorf("cudaMalloc of %d bytes: %w", size, err)
		}
		if err := c.ctx.Err(); err != nil {
			return 0, 0, err // p is freed by release
		}
		f, err = c.free(p)
		return m, f, err
	}
	// A first pair, not counted, so that idle time 0 follows a call of
	// the series however long ago the previous step's last call was.
	if _, _, err := pair(); err != nil {
		return nil, nil, err
	}
	woken, next = map[int64][]int64{}, map[int64][]int64{}
	gaps := append([]int64{0}, sim.WakeGaps...)
	for range c.opt.WakeReps {
		rng.Shuffle(len(gaps), func(i, j int) { gaps[i], gaps[j] = gaps[j], gaps[i] })
		for _, gap := range gaps {
			if err := c.ctx.Err(); err != nil {
				return nil, nil, err
			}
			c.rt.Pace(gap)
			m, f, err := pair()
			if err != nil {
				return nil, nil, err
			}
			woken[gap] = append(woken[gap], m)
			next[gap] = append(next[gap], f)
		}
	}
	return woken, next, nil
}

// addWake adds the rows of a wake-up curve from the latencies by idle time
// (see wake), one per idle time of sim.WakeGaps.
func (c *calibration) addWake(api string, byGap map[int64][]int64) {
	sorted := func(ns []int64) []int64 {
		s := slices.Clone(ns)
		slices.Sort(s)
		return s
	}
	base := sorted(byGap[0])
	if len(base) == 0 {
		return
	}
	baseMed := quantile(base, 0.5)
	extra := func(ns, over int64) float64 { return float64(max(ns-over, 0)) / 1e3 }
	for _, gap := range sim.WakeGaps {
		s := sorted(byGap[gap])
		if len(s) == 0 {
			continue
		}
		row := CostRow{API: api, Size: uint64(gap), N: len(s), FirstUS: -1,
			MedianUS: extra(quantile(s, 0.5), baseMed), P90US: extra(quantile(s, 0.9), baseMed), MinUS: extra(s[0], baseMed)}
		c.rows = append(c.rows, row)
		if c.opt.Progress != nil {
			fmt.Fprintf(c.opt.Progress, "%-18s  gap %5s ms  n=%-3d  extra median %8.2f us  p90 %8.2f us\n",
				api, strconv.FormatFloat(float64(gap)/1e6, 'g', -1, 64), row.N, row.MedianUS, row.P90US)
		}
	}
}

// release frees whatever the calibration still holds.
func (c *calibration) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for p := range c.dev {
		_, err := c.rt.Free(p)
		keep(err)
	}
	for p := range c.host {
		_, err := c.rt.FreeHost(p)
		keep(err)
	}
	for p := range c.asyncLive {
		_, err := c.rt.FreeAsync(p, 0)
		keep(err)
	}
	if c.pool != 0 {
		_, err := c.rt.DeviceSync()
		keep(err)
		_, err = c.rt.MemPoolTrimTo(c.pool, 0)
		keep(err)
		keep(c.rt.MemPoolDestroy(c.pool))
	}
	return first
}

// WriteCostModel writes rows as a cost model CSV, in the columns of
// shared/reference/h200_cuda_latency.csv and a mean_us column, after a
// first line "# made" (sim.CostModel.Made) unless made is "".
func WriteCostModel(w io.Writer, made string, rows []CostRow) error {
	if made != "" {
		if _, err := fmt.Fprintf(w, "# %s\n", strings.ReplaceAll(made, "\n", " ")); err != nil {
			return err
		}
	}
	cw := csv.NewWriter(w)
	cw.Write([]string{"api", "size_bytes", "n", "first_us", "median_us", "p90_us", "min_us", "mean_us"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range rows {
		mean := "" // none for a wake-up row: its median is the extra latency
		if r.MeanUS > 0 {
			mean = f(r.MeanUS)
		}
		cw.Write([]string{r.API, strconv.FormatUint(r.Size, 10), strconv.Itoa(r.N), f(r.FirstUS), f(r.MedianUS), f(r.P90US), f(r.MinUS), mean})
	}
	cw.Flush()
	return cw.Error()
}

// callRecorder is the device of a calibration workload's replay: each
// cudaMalloc and cudaFree the cuda target asks for becomes an operation of
// the batch, made later in C; the address handed back stands for the
// operation's slot.
type callRecorder struct {
	b     *batch
	slots map[uint64]int32 // address handed out -> slot
	next  uint64           // the next address to hand out
}

var _ sim.Backend = (*callRecorder)(nil)

func (r *callRecorder) Alloc(size uint64) (uint64, error) {
	s := r.b.newSlot()
	r.next += 1 << 21
	r.slots[r.next] = s
	r.b.size, r.b.slot = append(r.b.size, size), append(r.b.slot, s)
	return r.next, nil
}

func (r *callRecorder) Free(addr uint64) error {
	s, ok := r.slots[addr]
	if !ok {
		return fmt.Errorf("device free of %#x: not a live segment", addr)
	}
	delete(r.slots, addr)
	r.b.size, r.b.slot = append(r.b.size, 0), append(r.b.slot, s)
	r.b.freed = append(r.b.freed, s)
	return nil
}

func (r *callRecorder) Reserved() uint64                              { return 0 }
func (r *callRecorder) SetTime(int64)                                 {}
func (r *callRecorder) Sync(*trace.Event) error                       { return nil }
func (r *callRecorder) HostMalloc(trace.Kind, uint64) (uint64, error) { return 0, nil }
func (r *callRecorder) HostFree(trace.Kind, uint64, uint64) error     { return nil }
func (r *callRecorder) DeviceCalls() (allocs, frees int64)            { return 0, 0 }
