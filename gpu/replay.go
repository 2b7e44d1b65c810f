package gpu

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sort"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
	"github.com/gpualloc/allocsim/trace/atomicfile"
	"github.com/gpualloc/allocsim/trace/tracefile"
)

// DefaultMargin is the memory in bytes a replay leaves free on the device
// when no limit is given: the limit is the free memory at the start minus
// this margin.
const DefaultMargin = 1 << 30

// DefaultMaxPinned bounds the live pinned host memory of a replay in bytes
// when no bound is given.
const DefaultMaxPinned = 4 << 30

// chunkEvents is the number of events decoded ahead of the device calls
// (64 MiB of events), so that decoding and the simulation alongside stay
// out of the replay's wall time and out of the gaps between its calls: the
// driver's calls slow down after it has been idle (on an H200 a 20 MiB
// cudaMalloc took 46 us after a 0.1 ms gap, 72 us after 1 ms, 156 us after
// 10 ms), so a pause of the harness between two calls would be charged to
// the second.
const chunkEvents = 1 << 20

// Config says how to replay a trace on the GPU.
type Config struct {
	// Trace names the trace in the result (the path as given).
	Trace string
	// Policy is TargetCUDA, TargetCUDAAsync or a registered policy's name.
	Policy string
	// Settings are the policy's settings by key.
	Settings policies.Settings
	// MaxBytes bounds the device memory the replay holds (segments for a
	// policy, allocations for the direct targets); 0 means the free
	// memory at the start minus Margin. A larger value than the free
	// memory at the start is an error.
	MaxBytes uint64
	// Margin is the memory left free when MaxBytes is 0; 0 means
	// DefaultMargin.
	Margin uint64
	// MaxPinned bounds the live pinned host memory; 0 means
	// DefaultMaxPinned.
	MaxPinned uint64
	// CallLog, if not nil, receives one CSV line per runtime call.
	CallLog io.Writer
	// RecordSeq records the cudaMalloc/cudaFree sequence in Result.Seq.
	RecordSeq bool
	// Unbatched makes the cuda target call the runtime from Go one event
	// at a time; by default the calls of up to 256 consecutive mallocs
	// and frees are made back to back in C (batch.go). The results are the
	// same; only the timings differ.
	Unbatched bool
	// Pace keeps the trace's idle times between allocation calls (see
	// Device.SetPace): the driver's calls are slower after it has been
	// idle, as in the job the trace was recorded from. Then the simulation
	// alongside charges the cost model's wake-up curves from the same
	// idle times; unpaced, it charges none, as the calls come back to
	// back.
	Pace bool
	// SampleEvery is the number of events between cudaMemGetInfo samples of
	// the driver's view (untimed); 0 means 4096. A policy's replay also
	// samples after every new high of the memory it holds, so that
	// Result.Driver.MinFree is the true minimum; the direct targets sample
	// only every SampleEvery events (1 for their true minimum).
	SampleEvery int
	// warm makes the replay warm the driver up with untimed calls right
	// before the calls of each chunk of events (Repeat sets it), after
	// the decoding and the garbage collection before them: the driver's
	// first call after the harness's own pause would be slow.
	warm bool
	// onCall, if not nil, is told each runtime call as the call log has
	// it (Device.OnCall).
	onCall func(call string, size, ptr uint64, ns int64)
	// Sim, if not nil, replays the same events on the simulated device in
	// step with the real one, charged to this cost model, for the
	// comparison in Result.SimAllocTimeNS and Result.SimPeakReserved. A
	// direct target is simulated by the registered policy of the same
	// name, if there is one.
	Sim *sim.CostModel
}

// replayer is one replay of one trace on the GPU: the replay engine of
// package sim on the real device (backend), driven a chunk of events at a
// time, with the simulation alongside.
type replayer struct {
	cfg    Config
	rt     *Runtime
	dev    *Device
	back   *backend
	rep    *sim.Replay // the engine on the GPU
	shadow *sim.Replay // the same trace simulated alongside, nil for none
	// simulated is the shadow's result, once it replayed the whole trace.
	simulated *sim.Result
	res       Result

	// sampledHigh is the most memory the replay held at a sample of the
	// driver's free memory: event by event, every new high is sampled.
	sampledHigh uint64

	batch *batch               // the cuda target's batches; nil: event by event
	slots trace.AddrMap[int32] // 1 + the batch slot of each live allocation of the cuda target
}

// Replay replays src on the GPU through rt against the policy cfg names,
// and returns the result. The replay is package sim's engine, the same as
// replay sim's, on the real device: the recorded settings of a recording
// apply, a policies.Hinter gets the trace's peak, a policies.Planner its
// plan (the trace is then read into memory), a truncated snapshot is
// rebuilt. Every allocation it made is freed before it returns, whether it
// ends normally, with an error, or because ctx was cancelled (then the
// result covers the events replayed and has Interrupted set, and the error
// is ctx's). A device out-of-memory is counted as an OOM and the replay
// goes on; any other failing runtime call ends it with an error naming the
// event.
//
// The calling goroutine is locked to its OS thread for the replay.
func Replay(ctx context.Context, rt *Runtime, src trace.Source, cfg Config) (res *Result, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	free, total, err := rt.MemGetInfo()
	if err != nil {
		return nil, err
	}
	limit, err := Limit(cfg.MaxBytes, cfg.Margin, free)
	if err != nil {
		return nil, err
	}
	if cfg.MaxPinned == 0 {
		cfg.MaxPinned = DefaultMaxPinned
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = 4096
	}
	dev := NewDevice(rt, limit)
	r := &replayer{cfg: cfg, rt: rt, dev: dev, back: newBackend(dev, cfg.MaxPinned)}
	r.res = Result{
		Runtime:  fmt.Sprintf("%s (CUDA runtime %s, driver %s)", rt.Path, version(rt.Version), version(rt.DriverVersion)),
		Device:   rt.DeviceName,
		MaxBytes: limit,
		Driver:   DriverView{Total: total, FreeAtStart: free, MinFree: free},
		Paced:    cfg.Pace,
	}
	dev.SetPace(cfg.Pace)
	if cfg.CallLog != nil {
		dev.LogCalls(cfg.CallLog)
	}
	dev.onCall = cfg.onCall
	if cfg.RecordSeq {
		dev.RecordSeq()
	}
	defer func() {
		ok := err == nil || r.res.Interrupted
		if ok && r.rep != nil {
			r.finish() // before the cleanup, whose calls are not the trace's
		}
		if cerr := r.cleanup(); cerr != nil && err == nil {
			err = fmt.Errorf("releasing the replay's memory: %w", cerr)
			ok = false
		}
		if ferr := dev.Flush(); ferr != nil && err == nil {
			err = fmt.Errorf("call log: %w", ferr)
			ok = false
		}
		if !ok || r.rep == nil {
			res = nil
			return
		}
		if free, _, err := r.rt.MemGetInfo(); err == nil {
			r.res.Driver.FreeAtEnd = free
		}
		res = &r.res
	}()

	real := sim.Config{Trace: cfg.Trace, Policy: cfg.Policy, Settings: cfg.Settings, Capacity: limit, AsRecorded: true, Backend: r.back}
	switch cfg.Policy {
	case TargetCUDA:
		real.NewPolicy = func(_ policies.Device, s policies.Settings) (policies.Policy, error) { return newCUDATarget(dev, s) }
		r.back.direct = true
		if !cfg.Unbatched {
			r.batch = &batch{}
		}
	case TargetCUDAAsync:
		real.NewPolicy = func(_ policies.Device, s policies.Settings) (policies.Policy, error) {
			t, err := newAsyncTarget(dev, limit, s, r.back.stream)
			r.back.async = t
			return t, err
		}
		r.back.direct = true
	}
	cfgs := []sim.Config{real}
	if shadow, ok := ShadowConfig(cfg, limit); ok {
		cfgs = append(cfgs, shadow)
	}
	reps, src, err := sim.Prepare(src, cfgs...)
	if err != nil {
		return nil, err
	}
	r.rep = reps[0]
	if len(reps) > 1 {
		r.shadow = reps[1]
		r.res.SimPolicy, r.res.SimCostModel = r.shadow.Policy().Name(), cfg.Sim.Describe()
	}

	buf := make([]trace.Event, 0, chunkEvents)
	var i int64
	eof := false
	for !eof {
		buf = buf[:0]
		for len(buf) < chunkEvents {
			ev, rerr := src.Next()
			if rerr == io.EOF {
				eof = true
				break
			}
			if rerr != nil {
				return nil, rerr
			}
			buf = append(buf, ev)
		}
		if ctx.Err() != nil {
			// Interrupted while the trace was read (a snapshot is read
			// whole first): before this chunk's first event.
			r.res.Interrupted = true
			return nil, ctx.Err()
		}
		start := i
		// Hold the garbage collector off while the device calls run, so
		// that its assists and pauses stay out of the timings; the chunk
		// allocates little. SetGCPercent(-1) waits for a cycle under way.
		gcPercent := debug.SetGCPercent(-1)
		if cfg.warm {
			warmUp(rt)
		}
		if r.batch != nil {
			err = r.replayBatched(ctx, buf, &i)
		} else {
			err = r.replayEvents(ctx, buf, &i)
		}
		debug.SetGCPercent(gcPercent)
		if err != nil {
			return nil, err
		}
		if r.shadow != nil {
			for k := range buf {
				if err := r.shadow.Step(start+int64(k), buf[k]); err != nil {
					return nil, fmt.Errorf("simulated %s: %w", r.res.SimPolicy, err)
				}
			}
		}
	}
	if err := r.rep.End(); err != nil {
		return nil, err
	}
	if r.shadow != nil {
		if err := r.shadow.End(); err != nil {
			return nil, fmt.Errorf("simulated %s: %w", r.res.SimPolicy, err)
		}
		r.simulated = r.shadow.Finish()
	}
	r.sample()
	if r.back.async != nil {
		r.res.Driver.PoolReservedHigh, r.res.Driver.PoolUsedHigh = r.back.async.poolStats()
	}
	return nil, nil // the deferred function fills res
}

// ShadowConfig returns the config of the simulation alongside a replay
// on the GPU of cfg: the registered policy of the same name (with no
// settings for the cuda target, whose settings are not the policy's),
// replayed as recorded on a simulated device of capacity bytes, charged to
// cfg.Sim, without its wake-up curves unless cfg.Pace. It reports false
// when there is none (cfg.Sim nil, or no policy of that name).
func ShadowConfig(cfg Config, capacity uint64) (sim.Config, bool) {
	name := cfg.Policy
	if cfg.Sim == nil {
		return sim.Config{}, false
	}
	if _, ok := policies.Lookup(name); !ok {
		return sim.Config{}, false
	}
	settings := cfg.Settings
	if name == TargetCUDA {
		settings = nil
	}
	m := cfg.Sim
	if !cfg.Pace {
		m = m.WithoutWake()
	}
	return sim.Config{Trace: cfg.Trace, Policy: name, Settings: settings, Capacity: capacity, AsRecorded: true, CostModel: m}, true
}

// replayEvents replays buf, whose first event is event *i of the trace,
// one event at a time, and adds the replay's wall time (samples left out)
// to the result. It returns ctx's error, with the result marked
// interrupted, when ctx is cancelled.
func (r *replayer) replayEvents(ctx context.Context, buf []trace.Event, i *int64) error {
	t0 := time.Now()
	defer func() { r.res.ReplayWallNS += time.Since(t0).Nanoseconds() }()
	for k := range buf {
		if err := r.rep.Step(*i, buf[k]); err != nil {
			return err
		}
		*i++
		if res := r.back.Reserved(); res > r.sampledHigh && !r.back.direct {
			// A new high of the memory a policy holds: the driver's free
			// memory is at its lowest after it (untimed, out of the wall
			// time). The direct targets, whose every malloc can be a new
			// high, sample every SampleEvery events as their batches do.
			r.sampledHigh = res
			r.res.ReplayWallNS += time.Since(t0).Nanoseconds()
			r.sample()
			t0 = time.Now()
		}
		if k%256 == 255 && ctx.Err() != nil {
			r.res.Interrupted = true
			return ctx.Err()
		}
		if *i%int64(r.cfg.SampleEvery) == 0 {
			r.res.ReplayWallNS += time.Since(t0).Nanoseconds()
			r.sample()
			t0 = time.Now()
		}
	}
	return nil
}

// sample reads cudaMemGetInfo for the driver's view.
func (r *replayer) sample() {
	if free, _, err := r.rt.MemGetInfo(); err == nil {
		r.res.Driver.MinFree = min(r.res.Driver.MinFree, free)
	}
}

// policyTimeEvery is the sampling period of a simulated policy's own time.
const policyTimeEvery = 16

// clockBase is the origin of nanotime.
var clockBase = time.Now()

// nanotime returns monotonic nanoseconds since clockBase: one clock read,
// where time.Now takes two.
func nanotime() int64 { return int64(time.Since(clockBase)) }

// finish completes the result from the engine's and the device's figures.
// An interrupted replay has no simulation alongside, which covers the whole
// trace or nothing.
func (r *replayer) finish() {
	r.res.Result = *r.rep.Finish()
	if sr := r.simulated; sr != nil {
		r.res.SimAllocTimeNS, r.res.SimWakeTimeNS = sr.SimAllocTimeNS, sr.SimWakeTimeNS
		r.res.SimLatency = sr.Latency
		r.res.SimPeakReserved = sr.PeakReserved
	}
	if r.back.async != nil {
		r.res.PeakReserved = max(r.res.PeakReserved, r.res.Driver.PoolReservedHigh)
	}
	r.res.Latency = r.dev.Latencies().Rows()
	r.res.AllocTimeNS = r.dev.AllocTime()
	r.res.SyncTimeNS = r.dev.SyncTime()
	r.res.Calls = r.dev.Calls()
	r.res.PolicyTimeNS = r.back.policyTime()
	r.res.Seq = r.dev.Seq()
	r.dev.seq = nil
	if r.res.Interrupted {
		r.res.SimPolicy, r.res.SimCostModel, r.res.SimPeakReserved, r.res.SimAllocTimeNS, r.res.SimWakeTimeNS, r.res.SimLatency = "", "", 0, 0, 0, nil
	}
}

// cleanup frees every allocation the replay holds and destroys its streams
// and events, whatever state the replay is in. It returns the first error.
func (r *replayer) cleanup() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if r.back.async != nil {
		keep(r.back.async.close())
	}
	keep(r.dev.FreeAll())
	r.back.cleanup(keep)
	return first
}

// Limit returns the device memory limit in bytes for a replay: maxBytes if
// not 0, else free minus margin (DefaultMargin if 0). It returns an error
// when maxBytes is above free or nothing is left under the margin.
func Limit(maxBytes, margin, free uint64) (uint64, error) {
	if maxBytes > 0 {
		if maxBytes > free {
			return 0, fmt.Errorf("--max-bytes %d is more than the %d bytes free on the device", maxBytes, free)
		}
		return maxBytes, nil
	}
	if margin == 0 {
		margin = DefaultMargin
	}
	if free <= margin {
		return 0, fmt.Errorf("only %d bytes free on the device, not more than the margin of %d", free, margin)
	}
	return free - margin, nil
}

func version(v int) string {
	if v == 0 {
		return "?"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// Repeat replays a trace n times (at least once) on rt, each time on a
// source from open after the device has rested (settleTime), and returns
// the run of median allocator time with every run's figures in Runs. The call log and the simulation alongside, if
// asked for in cfg, are those of the first run. With cLoop, and a cuda
// target, each run is followed by a plain C loop of its
// cudaMalloc/cudaFree sequence (Runtime.RunSeq), and Result.CLoop compares
// the two. An interrupted run ends the repetition with its result and
// ctx's error.
func Repeat(ctx context.Context, rt *Runtime, open func() (trace.Source, io.Closer, error), cfg Config, n int, cLoop bool) (*Result, error) {
	n = max(n, 1)
	cLoop = cLoop && cfg.Policy == TargetCUDA
	cfg.RecordSeq = cfg.RecordSeq || cLoop
	var results []*Result
	var loops []SeqResult
	var size0 []uint64 // the first run's sequence, for the timed loop
	var slot0 []int32
	cfg.warm = true
	for k := 0; k < n; k++ {
		settle(rt)
		src, closer, err := open()
		if err != nil {
			return nil, err
		}
		res, err := Replay(ctx, rt, src, cfg)
		closer.Close()
		if err != nil {
			return res, err
		}
		results = append(results, res)
		if cLoop && res.Seq != nil {
			size, slot := res.Seq.Calls()
			sr, err := rt.RunSeq(size, slot, false)
			if err != nil {
				return nil, fmt.Errorf("the plain C loop: %w", err)
			}
			loops = append(loops, sr)
			if k == 0 {
				size0, slot0 = size, slot
			}
		}
		res.Seq = nil
		cfg.CallLog, cfg.Sim = nil, nil // the first run's only
	}
	runs := make([]Run, len(results))
	for k, r := range results {
		runs[k] = Run{AllocTimeNS: r.AllocTimeNS, SyncTimeNS: r.SyncTimeNS, ReplayWallNS: r.ReplayWallNS}
		if k < len(loops) {
			runs[k].CLoopWallNS = loops[k].WallNS
		}
	}
	byAlloc := make([]int, len(results))
	for k := range byAlloc {
		byAlloc[k] = k
	}
	sort.SliceStable(byAlloc, func(a, b int) bool { return results[byAlloc[a]].AllocTimeNS < results[byAlloc[b]].AllocTimeNS })
	res := results[byAlloc[(len(results)-1)/2]]
	if first := results[0]; res != first {
		res.SimPolicy, res.SimPeakReserved, res.SimCostModel = first.SimPolicy, first.SimPeakReserved, first.SimCostModel
		res.SimAllocTimeNS, res.SimWakeTimeNS, res.SimLatency = first.SimAllocTimeNS, first.SimWakeTimeNS, first.SimLatency
	}
	if n > 1 {
		res.Runs = runs
	}
	if len(loops) > 0 {
		c := &CLoop{Calls: loops[0].Calls}
		var harness, plain []int64
		var outside, paired []float64
		for k, l := range loops {
			harness = append(harness, results[k].ReplayWallNS)
			plain = append(plain, l.WallNS)
			outside = append(outside, float64(results[k].ReplayWallNS-results[k].AllocTimeNS)/float64(l.Calls))
			paired = append(paired, float64(results[k].ReplayWallNS-l.WallNS)/float64(l.Calls))
		}
		c.HarnessWallNS, c.WallNS = median(harness), median(plain)
		c.OverheadPerCallNS = medianFloat(paired)
		c.OutsideCallsPerCallNS = medianFloat(outside)
		// One more run of the loop, timing each call as the harness does.
		sr, err := rt.RunSeq(size0, slot0, true)
		if err != nil {
			return nil, fmt.Errorf("the timed C loop: %w", err)
		}
		c.TimedWallNS, c.CallsNS = sr.WallNS, sr.CallsNS
		c.LoopOutsideCallsPerCallNS = float64(sr.WallNS-sr.CallsNS) / float64(sr.Calls)
		res.CLoop = c
	}
	return res, nil
}

// settleTime is how long Repeat lets the device rest before each run.
const settleTime = 200 * time.Millisecond

// settle waits for the device and then rests, so that work the driver
// defers after large frees (of the run before) does not fall into the
// next run's timings. The rest leaves the driver idle, and the first call
// after an idle spell is slow (on an H200 a 20 MiB cudaMalloc took about
// 270 us after 200 ms of rest, against 46 us back to back), so the replay
// warms the driver up right before its first call (Config.warm): a run
// starts as a program's allocations do in the middle of its work, not
// after a pause of the harness's own.
func settle(rt *Runtime) {
	rt.DeviceSync()
	time.Sleep(settleTime)
}

// warmUp makes a few untimed cudaMalloc/cudaFree pairs, a small one placed
// in a driver page and a 2 MiB one mapped on its own; errors are ignored
// (the replay's own calls report them).
func warmUp(rt *Runtime) {
	for k := 0; k < 4; k++ {
		for _, size := range []uint64{512, 2 << 20} {
			if p, _, err := rt.Malloc(size); err == nil {
				rt.Free(p)
			}
		}
	}
}

// medianFloat returns the lower median of v, which it sorts.
func medianFloat(v []float64) float64 {
	sort.Float64s(v)
	return v[(len(v)-1)/2]
}

// median returns the lower median of v, which it sorts.
func median(v []int64) int64 {
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return v[(len(v)-1)/2]
}

// RepeatFile is Repeat on the trace file at path, opened with opts for
// each run. With callLog not "", the first run's runtime calls go to the
// file callLog (Config.CallLog), written atomically: an error or an
// interrupt leaves no partial log. Errors are Repeat's, and the call log's
// prefixed with "--calls: ".
func RepeatFile(ctx context.Context, rt *Runtime, path string, opts tracefile.Options, cfg Config, callLog string, n int, cLoop bool) (*Result, error) {
	var log *atomicfile.File
	if callLog != "" {
		var err error
		if log, err = atomicfile.Create(callLog); err != nil {
			return nil, fmt.Errorf("--calls: %w", err)
		}
		defer log.Abort()
		cfg.CallLog = log
	}
	open := func() (trace.Source, io.Closer, error) {
		f, err := tracefile.Open(path, opts)
		if err != nil {
			return nil, nil, err
		}
		return f, f, nil
	}
	res, err := Repeat(ctx, rt, open, cfg, n, cLoop)
	if err != nil {
		return res, err
	}
	if log != nil {
		if err := log.Commit(); err != nil {
			return nil, fmt.Errorf("--calls: %w", err)
		}
	}
	return res, nil
}
