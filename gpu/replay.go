package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sort"
	"time"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
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
	// the driver's view (untimed); 0 means 4096.
	SampleEvery int
	// warm makes the replay warm the driver up with untimed calls right
	// before the calls of each chunk of events (Repeat sets it), after
	// the decoding and the garbage collection before them: the driver's
	// first call after the harness's own pause would be slow.
	warm bool
	// Sim, if not nil, replays the same events on the simulated device in
	// step with the real one, charged to this cost model, for the
	// comparison in Result.SimAllocTimeNS and Result.SimPeakReserved. A
	// direct target is simulated by the registered policy of the same
	// name, if there is one.
	Sim *sim.CostModel
}

// liveAlloc is a malloc of the trace that is live in the replay.
type liveAlloc struct {
	block     policies.Block // placement (the host pointer for host kinds)
	requested uint64
	kind      trace.Kind
	failed    bool  // the malloc failed in the replay
	batchSlot int32 // 1 + its slot in the cuda target's batches (batch.go), 0 if not batched
}

// replayer is one replay of one trace on the GPU.
type replayer struct {
	cfg    Config
	rt     *Runtime
	dev    *Device
	policy policies.Policy
	async  *asyncTarget
	direct bool // policy is a direct target: its time is the device's
	res    Result

	live    trace.AddrMap[liveAlloc]
	streams map[uint64]uint64 // trace stream -> CUDA stream
	events  map[uint64]uint64 // trace event -> CUDA event

	batch *batch // the cuda target's batches; nil: event by event

	policyCalls int64 // simulated policy's Malloc and Free calls so far
	policyOwnNS int64 // their sampled time outside the device calls

	requested, allocated uint64
	pinned, managed      uint64

	series sim.SeriesBuilder
}

// Replay replays src on the GPU through rt against the policy cfg names,
// and returns the result. Every allocation it made is freed before it
// returns, whether it ends normally, with an error, or because ctx was
// cancelled (then the result covers the events replayed and has
// Interrupted set, and the error is ctx's). A device out-of-memory is
// counted as an OOM and the replay goes on; any other failing runtime call
// ends it with an error naming the event.
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
	r := &replayer{
		cfg: cfg, rt: rt, dev: NewDevice(rt, limit),
		streams: map[uint64]uint64{}, events: map[uint64]uint64{},
	}
	r.res = Result{
		Result: sim.Result{
			Trace: cfg.Trace, Settings: cfg.Settings, Capacity: limit, FirstOOMEvent: -1,
		},
		Runtime:  fmt.Sprintf("%s (CUDA runtime %s, driver %s)", rt.Path, version(rt.Version), version(rt.DriverVersion)),
		Device:   rt.DeviceName,
		MaxBytes: limit,
		Driver:   DriverView{Total: total, FreeAtStart: free, MinFree: free},
		Paced:    cfg.Pace,
	}
	r.dev.SetPace(cfg.Pace)
	if cfg.CallLog != nil {
		r.dev.LogCalls(cfg.CallLog)
	}
	if cfg.RecordSeq {
		r.dev.RecordSeq()
	}
	switch cfg.Policy {
	case TargetCUDA:
		r.policy, err = newCUDATarget(r.dev, cfg.Settings)
	case TargetCUDAAsync:
		r.async, err = newAsyncTarget(r.dev, limit, cfg.Settings, r.stream)
		r.policy = r.async
	default:
		r.policy, err = policies.New(cfg.Policy, r.dev, cfg.Settings)
	}
	if err != nil {
		return nil, err
	}
	r.res.Policy = r.policy.Name()
	r.direct = cfg.Policy == TargetCUDA || cfg.Policy == TargetCUDAAsync
	if cfg.Policy == TargetCUDA && !cfg.Unbatched {
		r.batch = &batch{}
	}
	defer func() {
		ok := err == nil || r.res.Interrupted
		if ok {
			r.finish() // before the cleanup, whose calls are not the trace's
		}
		if r.res.Interrupted {
			// The simulation alongside covers the whole trace or nothing.
			r.res.SimPolicy, r.res.SimCostModel, r.res.SimPeakReserved, r.res.SimAllocTimeNS, r.res.SimWakeTimeNS, r.res.SimLatency = "", "", 0, 0, 0, nil
		}
		if cerr := r.cleanup(); cerr != nil && err == nil {
			err = fmt.Errorf("releasing the replay's memory: %w", cerr)
			ok = false
		}
		if ferr := r.dev.Flush(); ferr != nil && err == nil {
			err = fmt.Errorf("call log: %w", ferr)
			ok = false
		}
		if !ok {
			res = nil
			return
		}
		if free, _, err := r.rt.MemGetInfo(); err == nil {
			r.res.Driver.FreeAtEnd = free
		}
		res = &r.res
	}()

	var shadow *sim.Replay
	if cfg.Sim != nil {
		if shadow, err = r.simReplay(limit); err != nil {
			return nil, err
		}
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
		if shadow != nil {
			for k, ev := range buf {
				if err := shadow.Step(start+int64(k), ev); err != nil {
					return nil, fmt.Errorf("simulated %s: %w", r.res.SimPolicy, err)
				}
			}
		}
	}
	if shadow != nil {
		sr := shadow.Finish()
		shadow.Device().FillCost(sr)
		r.res.SimAllocTimeNS, r.res.SimWakeTimeNS = sr.SimAllocTimeNS, sr.SimWakeTimeNS
		r.res.SimLatency = sr.Latency
		r.res.SimPeakReserved = sr.PeakReserved
		r.res.SimCostModel = cfg.Sim.Source
	}
	r.sample()
	if r.async != nil {
		r.res.Driver.PoolReservedHigh, r.res.Driver.PoolUsedHigh = r.async.poolStats()
	}
	return nil, nil // the deferred function fills res
}

// simReplay builds the simulated replay of the same policy for the
// comparison, or nil when no policy of that name is registered.
func (r *replayer) simReplay(limit uint64) (*sim.Replay, error) {
	name := r.cfg.Policy
	known := false
	for _, n := range policies.Names() {
		known = known || n == name
	}
	if !known {
		return nil, nil
	}
	settings := r.cfg.Settings
	if name == TargetCUDA {
		settings = nil // the direct target's settings are not the policy's
	}
	rep, err := sim.NewReplay(sim.Config{Trace: r.cfg.Trace, Policy: name, Settings: settings, Capacity: limit})
	if err != nil {
		return nil, fmt.Errorf("simulated %s: %w", name, err)
	}
	m := r.cfg.Sim
	if !r.cfg.Pace {
		m = m.WithoutWake()
	}
	rep.Device().SetCostModel(m)
	r.res.SimPolicy = name
	return rep, nil
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

// replayEvents replays buf, whose first event is event *i of the trace,
// one event at a time, and adds the replay's wall time (samples left out)
// to the result. It returns ctx's error, with the result marked
// interrupted, when ctx is cancelled.
func (r *replayer) replayEvents(ctx context.Context, buf []trace.Event, i *int64) error {
	t0 := time.Now()
	defer func() { r.res.ReplayWallNS += time.Since(t0).Nanoseconds() }()
	for k, ev := range buf {
		r.dev.SetTime(ev.Time)
		if err := r.step(*i, ev); err != nil {
			return err
		}
		*i++
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

// stream returns the CUDA stream for trace stream id, creating it at first
// use; trace stream 0 is the default stream.
func (r *replayer) stream(id uint64) (uint64, error) {
	if id == 0 {
		return 0, nil
	}
	if s, ok := r.streams[id]; ok {
		return s, nil
	}
	s, err := r.rt.StreamCreate()
	if err != nil {
		return 0, fmt.Errorf("stream %d: %w", id, err)
	}
	r.streams[id] = s
	return s, nil
}

// event returns the CUDA event for trace event id, creating it at first
// use.
func (r *replayer) event(id uint64) (uint64, error) {
	if e, ok := r.events[id]; ok {
		return e, nil
	}
	e, err := r.rt.EventCreate()
	if err != nil {
		return 0, fmt.Errorf("event %d: %w", id, err)
	}
	r.events[id] = e
	return e, nil
}

func (r *replayer) step(i int64, ev trace.Event) error {
	r.res.Events++
	var err error
	switch ev.Op {
	case trace.OpMalloc:
		err = r.malloc(i, ev)
	case trace.OpMallocFailed:
		err = r.mallocFailed(i, ev)
	case trace.OpFree:
		err = r.free(i, ev)
	case trace.OpStreamSync:
		var s uint64
		if s, err = r.stream(ev.Stream); err == nil {
			err = r.dev.streamSync(s)
		}
		if sy, ok := r.policy.(policies.Syncer); ok && err == nil {
			sy.StreamSync(ev.Stream)
		}
	case trace.OpDeviceSync:
		err = r.dev.deviceSync()
		if sy, ok := r.policy.(policies.Syncer); ok && err == nil {
			sy.DeviceSync()
		}
	case trace.OpEventRecord:
		var s, e uint64
		if s, err = r.stream(ev.Stream); err == nil {
			if e, err = r.event(ev.Addr); err == nil {
				err = r.dev.eventRecord(e, s)
			}
		}
		if sy, ok := r.policy.(policies.Syncer); ok && err == nil {
			sy.EventRecord(ev.Addr, ev.Stream)
		}
	case trace.OpStreamWaitEvent:
		var s, e uint64
		if s, err = r.stream(ev.Stream); err == nil {
			if e, err = r.event(ev.Addr); err == nil {
				err = r.dev.streamWaitEvent(s, e)
			}
		}
		if sy, ok := r.policy.(policies.Syncer); ok && err == nil {
			sy.StreamWaitEvent(ev.Stream, ev.Addr)
		}
	case trace.OpEventSync:
		var e uint64
		if e, err = r.event(ev.Addr); err == nil {
			err = r.dev.eventSync(e)
		}
		if sy, ok := r.policy.(policies.Syncer); ok && err == nil {
			sy.EventSync(ev.Addr)
		}
	case trace.OpEmptyCache:
		if rel, ok := r.policy.(policies.Releaser); ok {
			err = rel.EmptyCache()
		}
	}
	if err != nil {
		return fmt.Errorf("event %d (%s): %w", i, ev.Op, err)
	}
	r.observe(i, ev.Time)
	return nil
}

func (r *replayer) malloc(i int64, ev trace.Event) error {
	if _, dup := r.live.Get(ev.Addr); dup {
		r.anomaly(i, fmt.Sprintf("malloc of %#x, which is already live", ev.Addr))
		return nil
	}
	switch ev.Kind {
	case trace.KindPinned, trace.KindManaged:
		return r.hostMalloc(i, ev)
	}
	r.res.Mallocs++
	r.requested += ev.Size
	r.res.PeakRequested = max(r.res.PeakRequested, r.requested)
	b, err := r.policyMalloc(ev.Size, ev.Stream)
	if err != nil {
		if !errors.Is(err, policies.ErrOutOfMemory) {
			return fmt.Errorf("malloc of %d bytes: %w", ev.Size, err)
		}
		r.oom(i, ev.Size)
		r.live.Put(ev.Addr, liveAlloc{requested: ev.Size, kind: ev.Kind, failed: true})
		return nil
	}
	r.allocated += b.Size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	r.live.Put(ev.Addr, liveAlloc{block: b, requested: ev.Size, kind: ev.Kind})
	return nil
}

// hostMalloc replays a pinned or managed allocation with a real
// cudaMallocHost or cudaMallocManaged, within its bound: pinned memory
// under Config.MaxPinned, managed memory never above what is left of the
// device limit. A refused or failed one is an OOM.
func (r *replayer) hostMalloc(i int64, ev trace.Event) error {
	var ptr uint64
	var err error
	size := max(ev.Size, 1)
	if ev.Kind == trace.KindPinned {
		if r.pinned+size > r.cfg.MaxPinned {
			err = policies.ErrOutOfMemory
		} else {
			ptr, err = r.dev.mallocHost(size)
		}
	} else {
		limit := r.dev.Capacity() - min(r.dev.Capacity(), r.reserved())
		if r.managed+size > limit {
			err = policies.ErrOutOfMemory
		} else {
			ptr, err = r.dev.mallocManaged(size)
		}
	}
	if err != nil {
		if !errors.Is(err, policies.ErrOutOfMemory) {
			return fmt.Errorf("%s malloc of %d bytes: %w", ev.Kind, ev.Size, err)
		}
		r.oom(i, ev.Size)
		r.live.Put(ev.Addr, liveAlloc{requested: ev.Size, kind: ev.Kind, failed: true})
		return nil
	}
	if ev.Kind == trace.KindPinned {
		r.pinned += size
		r.res.PeakPinned = max(r.res.PeakPinned, r.pinned)
	} else {
		r.managed += size
		r.res.PeakManaged = max(r.res.PeakManaged, r.managed)
	}
	r.live.Put(ev.Addr, liveAlloc{block: policies.Block{Addr: ptr, Size: size}, requested: ev.Size, kind: ev.Kind})
	return nil
}

func (r *replayer) mallocFailed(i int64, ev trace.Event) error {
	r.res.SourceOOMs++
	if !ev.Kind.OnDevice() {
		return nil
	}
	b, err := r.policyMalloc(ev.Size, ev.Stream)
	if err != nil {
		if !errors.Is(err, policies.ErrOutOfMemory) {
			return fmt.Errorf("malloc of %d bytes: %w", ev.Size, err)
		}
		r.oom(i, ev.Size)
		return nil
	}
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated+b.Size)
	if err := r.policyFree(b.Addr, ev.Stream); err != nil {
		return fmt.Errorf("free of the block of a failed malloc: %w", err)
	}
	return nil
}

func (r *replayer) free(i int64, ev trace.Event) error {
	a, ok := r.live.Take(ev.Addr)
	if !ok {
		r.anomaly(i, fmt.Sprintf("free of %#x, which is not live", ev.Addr))
		return nil
	}
	if a.kind == trace.KindPinned || a.kind == trace.KindManaged {
		if a.failed {
			return nil
		}
		return r.hostFree(a)
	}
	r.res.Frees++
	r.requested -= a.requested
	if a.failed {
		return nil
	}
	r.allocated -= a.block.Size
	if err := r.policyFree(a.block.Addr, ev.Stream); err != nil {
		return fmt.Errorf("free of %#x: %w", ev.Addr, err)
	}
	return nil
}

// policyMalloc and policyFree call the policy. A simulated policy's own
// time is sampled: one call in policyTimeEvery is timed, its device calls'
// time (timed in C) taken out, and finish scales the sum up, so that the
// clock reads stay out of the gaps between the device calls (a direct
// target's time is its device calls').
func (r *replayer) policyMalloc(size, stream uint64) (policies.Block, error) {
	if r.direct || r.policyCalls%policyTimeEvery != 0 {
		r.policyCalls++
		return r.policy.Malloc(size, stream)
	}
	r.policyCalls++
	t0, d0 := nanotime(), r.dev.AllocTime()
	b, err := r.policy.Malloc(size, stream)
	r.policyOwnNS += nanotime() - t0 - (r.dev.AllocTime() - d0)
	return b, err
}

func (r *replayer) policyFree(addr, stream uint64) error {
	if r.direct || r.policyCalls%policyTimeEvery != 0 {
		r.policyCalls++
		return r.policy.Free(addr, stream)
	}
	r.policyCalls++
	t0, d0 := nanotime(), r.dev.AllocTime()
	err := r.policy.Free(addr, stream)
	r.policyOwnNS += nanotime() - t0 - (r.dev.AllocTime() - d0)
	return err
}

// policyTimeEvery is the sampling period of a simulated policy's own time.
const policyTimeEvery = 16

// clockBase is the origin of nanotime.
var clockBase = time.Now()

// nanotime returns monotonic nanoseconds since clockBase: one clock read,
// where time.Now takes two.
func nanotime() int64 { return int64(time.Since(clockBase)) }

func (r *replayer) hostFree(a liveAlloc) error {
	if a.kind == trace.KindPinned {
		r.pinned -= a.block.Size
		return r.dev.freeHost(a.block.Addr, a.block.Size)
	}
	r.managed -= a.block.Size
	return r.dev.freeManaged(a.block.Addr, a.block.Size)
}

func (r *replayer) oom(i int64, size uint64) {
	r.res.OOMs++
	if r.res.FirstOOMEvent < 0 {
		r.res.FirstOOMEvent = i
		r.res.FirstOOMSize = size
	}
}

func (r *replayer) anomaly(i int64, msg string) {
	r.res.Anomalies++
	if r.res.FirstAnomaly == "" {
		r.res.FirstAnomaly = fmt.Sprintf("event %d: %s", i, msg)
	}
}

// reserved returns the device bytes the replay holds: the policy's
// segments, or the live allocations of the stream-ordered target.
func (r *replayer) reserved() uint64 {
	if r.async != nil {
		return r.async.Reserved()
	}
	return r.dev.Reserved()
}

func (r *replayer) observe(i, t int64) {
	r.series.Observe(&r.res.Result, r.policy, i, t, r.requested, r.allocated, r.reserved())
}

// finish completes the result from the device's and the policy's
// counters.
func (r *replayer) finish() {
	r.series.Finish(&r.res.Result, r.policy, r.allocated, r.reserved())
	if r.async != nil {
		r.res.PeakReserved = max(r.res.PeakReserved, r.res.Driver.PoolReservedHigh)
		l := r.dev.Latencies()
		r.res.DeviceAllocs = l.Count("cudaMallocAsync", "cudaMallocFromPoolAsync")
		r.res.DeviceFrees = l.Count("cudaFreeAsync")
	} else {
		r.res.DeviceAllocs = r.dev.Allocs()
		r.res.DeviceFrees = r.dev.Frees()
	}
	if c, ok := r.policy.(policies.Counter); ok {
		r.res.AllocRetries = c.Retries()
	}
	r.res.Latency = r.dev.Latencies().Rows()
	r.res.AllocTimeNS = r.dev.AllocTime()
	r.res.SyncTimeNS = r.dev.SyncTime()
	r.res.Calls = r.dev.Calls()
	if r.direct {
		r.res.PolicyTimeNS = r.res.AllocTimeNS
	} else {
		r.res.PolicyTimeNS = r.policyOwnNS*policyTimeEvery + r.res.AllocTimeNS
	}
	r.res.Seq = r.dev.Seq()
	r.dev.seq = nil
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
	var addrs []uint64 // taken first: the table must not change during All
	for addr := range r.live.All() {
		addrs = append(addrs, addr)
	}
	for _, addr := range addrs {
		if a, _ := r.live.Take(addr); (a.kind == trace.KindPinned || a.kind == trace.KindManaged) && !a.failed {
			keep(r.hostFree(a))
		}
	}
	if r.async != nil {
		keep(r.async.close())
	}
	keep(r.dev.FreeAll())
	for id, e := range r.events {
		keep(r.rt.EventDestroy(e))
		delete(r.events, id)
	}
	for id, s := range r.streams {
		keep(r.rt.StreamDestroy(s))
		delete(r.streams, id)
	}
	return first
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
				return nil, fmt.Errorf("C loop: %w", err)
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
			return nil, fmt.Errorf("timed C loop: %w", err)
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
