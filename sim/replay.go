package sim

import (
	"errors"
	"fmt"
	"github.com/gpualloc/allocsim/sim/results"
	"io"
	"maps"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// Config says how to replay a trace: against which policy, with which
// settings, on a device of which capacity.
type Config struct {
	// Trace names the trace in the result (the path as given by the user).
	Trace string
	// Policy is the registry name of the policy (see policies.Names).
	Policy string
	// Settings are the policy's settings by key.
	Settings policies.Settings
	// Capacity is the simulated device's capacity in bytes, 0 for unlimited.
	Capacity uint64
	// CardCapacity, with Capacity 0, takes the capacity from the card the
	// trace names (Header.DeviceMemory) less its context (ContextBytes);
	// unlimited when it names none. CardCapacityUsed says it did (set by
	// Prepare).
	CardCapacity, CardCapacityUsed bool
	// CardMemory is the total memory in bytes of the card the trace names
	// (Header.DeviceMemory), 0 if none; Prepare sets it. A policy that
	// sizes itself by the card's memory reads it (policies.CardMemorier).
	CardMemory uint64
	// Card says Capacity is a card's memory less its context: the
	// simulated device holds its footprint to it, not its reserved bytes
	// (Device.HoldFootprint). Prepare sets it with CardCapacityUsed.
	Card bool
	// Observer, if not nil, is told of every action of the allocator (see
	// Observer), for recording its history.
	Observer Observer
	// Progress, if not nil, is called once the replay has passed over the
	// trace's events, for a progress display; replays of other Configs may
	// call it at the same time from other goroutines.
	Progress func()
	// AsRecorded replays a recording as it was recorded (see recorded.go):
	// a policy that follows recordings of its own allocator takes the
	// trace's recorded settings, with Settings over them, and the device
	// the recorded addresses.
	AsRecorded bool
	// foreign is set by withRecorded for a trace recorded under another
	// allocator than the policy's (or under none): a Follower is then not
	// shown its device calls.
	foreign bool
	// noNotes is set by withRecorded when the user's settings replace
	// recorded ones: what a policies.Inferrer infers is not asked.
	noNotes bool
	// watch is set by withRecorded when a replay as recorded is watched
	// for where it parts from the recording (parting.go): its own
	// allocator's recording, the recorded settings; noCalls and noFrees
	// say what the recording lacks (trace.UnrecordedSegments,
	// UnrecordedSegmentFrees).
	watch, noCalls, noFrees bool
	// Check runs the invariant checker (see Checker) after each event: a
	// violation stops the replay with a *CheckError. In tests it is on
	// whatever Check says (see checkByDefault).
	Check bool
	// CostModel charges the device's calls to a cost model of the GPU's
	// call latencies; nil means the embedded H200 model.
	CostModel *CostModel
	// Strict stops Run at the trace's first semantic problem (see
	// trace.Validator) with an error, instead of counting it and going on.
	Strict bool
	// PeakRequestedHint is the trace's peak of live requested bytes when
	// known before the replay; Run computes it for policies that size
	// themselves from it (policies.Hinter).
	PeakRequestedHint uint64
	// Backend, if not nil, is the device the replay runs on instead of a
	// simulated device of Capacity (package gpu's real GPU). Check,
	// Observer and CostModel need the simulated device and are refused
	// with a Backend (Check is left off, even in tests).
	Backend Backend
	// NewPolicy, if not nil, builds the policy instead of the registry
	// entry named Policy: a target of a Backend that is no registered
	// policy (package gpu's cuda and cuda-async).
	NewPolicy policies.Factory
}

// bytes128 is a count of bytes that cannot wrap: the live requested bytes
// of a trace whose mallocs together ask for more than 2^64 bytes (an
// over-size malloc that fails) stay exact, and read saturated.
type bytes128 struct{ hi, lo uint64 }

func (b *bytes128) add(n uint64) {
	var c uint64
	b.lo, c = bits.Add64(b.lo, n, 0)
	b.hi += c
}

func (b *bytes128) sub(n uint64) {
	var c uint64
	b.lo, c = bits.Sub64(b.lo, n, 0)
	b.hi -= c
}

// sat returns the count, math.MaxUint64 when it does not fit in 64 bits.
func (b bytes128) sat() uint64 {
	if b.hi > 0 {
		return math.MaxUint64
	}
	return b.lo
}

// liveAlloc is a malloc of the trace that is live in the replay: 32 bytes,
// the index of its event, its kind and two flags packed in one word.
type liveAlloc struct {
	block     policies.Block // placement by the policy (zero for host kinds); its Addr the handle with liveHandle
	requested uint64         // requested bytes
	// bits is the index of the malloc's event over 8 bits of flags: the
	// kind in the low 4, then failed and released.
	bits uint64
}

const (
	liveKindMask = 0x0f
	// liveFailed is set when the malloc failed in the replay: there is no
	// block to give back at the free.
	liveFailed = 0x10
	// liveReleased is set at the free request: the program no longer
	// holds the bytes, but the block is reusable only at the free.
	liveReleased = 0x20
	// liveDirect is set for a device malloc that a CUDA library made
	// around the allocator (trace.DirectSite): no policy holds it.
	liveDirect = 0x40
	// liveHandle is set for a block that the policy placed with a handle
	// (policies.Handler): block.Addr holds the handle, not the address,
	// and the free goes through FreeHandle.
	liveHandle = 0x80
)

// newLive returns the live allocation of the malloc at event i (at most
// 2^56-1) of kind k, placed at b.
func newLive(b policies.Block, requested uint64, k trace.Kind, i int64) liveAlloc {
	return liveAlloc{block: b, requested: requested, bits: uint64(i)<<8 | uint64(k)&liveKindMask}
}

// handledLive returns newLive's live allocation for block b that a
// policies.Handler placed under handle h: h kept in place of b's address.
func handledLive(b policies.Block, h, requested uint64, k trace.Kind, i int64) liveAlloc {
	a := newLive(policies.Block{Addr: h, Size: b.Size}, requested, k, i)
	a.bits |= liveHandle
	return a
}

// failedLive returns the live allocation of a malloc at event i that
// failed in the replay.
func failedLive(requested uint64, k trace.Kind, i int64) liveAlloc {
	a := newLive(policies.Block{}, requested, k, i)
	a.bits |= liveFailed
	return a
}

func (a *liveAlloc) event() int64     { return int64(a.bits >> 8) }
func (a *liveAlloc) kind() trace.Kind { return trace.Kind(a.bits & liveKindMask) }
func (a *liveAlloc) failed() bool     { return a.bits&liveFailed != 0 }
func (a *liveAlloc) released() bool   { return a.bits&liveReleased != 0 }
func (a *liveAlloc) setReleased()     { a.bits |= liveReleased }
func (a *liveAlloc) direct() bool     { return a.bits&liveDirect != 0 }

// handled reports whether a is a block that Replay.handler placed
// (liveHandle) on the device, that no free request released: its free
// is freeHandled's.
func (a *liveAlloc) handled() bool {
	return a.bits&(liveHandle|liveReleased|liveDirect|liveFailed) == liveHandle && a.kind().OnDevice()
}

// releasedHandled reports whether a is handled (handled) but for its free
// request.
func (a *liveAlloc) releasedHandled() bool {
	return a.bits&(liveHandle|liveReleased|liveDirect|liveFailed) == liveHandle|liveReleased && a.kind().OnDevice()
}

// Replay replays the events of one trace against one policy on a simulated
// device, one event at a time, and accumulates a Result.
type Replay struct {
	cfg    Config
	policy policies.Policy
	back   Backend     // the device: dev, or cfg.Backend
	dev    *Device     // the simulated device, nil on a Backend
	timer  PolicyTimer // back's, if it times the policy's calls
	pooler policies.Pooler
	res    Result

	// The mallocs into private pools that a policy that is no Pooler
	// placed in its default pools, by pool; poolNames names them (the
	// trace's "pools" metadata).
	unpooled  map[uint32]int64
	poolNames map[uint32]string

	live trace.AddrMap[liveAlloc] // live allocations by trace address
	// rv, where Run resolved the trace's live allocations ahead of the
	// replay (live.go), and slots, the live allocations by the resolver's
	// number, stand in for live and frees; rv is nil otherwise. Only Run
	// sets it, on replays of its own that no caller steps or asks (Live
	// reads live).
	rv    *resolved
	slots []liveAlloc
	// batched is the batch's first pass's events for its second, where
	// Run steps the replay in batches (batch.go).
	batched []batchEvent

	requested       bytes128 // live requested device bytes, never wrapping
	allocated       uint64   // live allocated device bytes
	pinned, managed uint64   // live host-side bytes
	direct          uint64   // live bytes of direct mallocs (directMalloc)

	series SeriesBuilder
	obs    *observing // nil unless cfg.Observer
	rec    recorded   // replaying as recorded (recorded.go)
	watch  *partWatch // nil unless watched for parting (parting.go)
	// unshown bounds the peak, when watched on a recording that does not
	// show its releases and the policy tells what one would release.
	unshown *unshownWatch
	check   *Checker // nil unless cfg.Check

	// The trace's semantic problems (as trace.Validator finds them, with
	// the replay's own table of live allocations): the one of the current
	// event, counted at its end.
	lastTime, lastIdx int64 // the previous event's time (ns) and index
	timed             bool  // whether there was a previous event
	frees             trace.FreeLog
	problem           *trace.ValidationError

	// history is the number of events that rebuild the state before a
	// truncated trace's history (see truncated.go), 0 if none.
	history int64

	// plain says the replay needs none of step's optional work (plainOK):
	// Run steps its mallocs and frees through stepPlain.
	plain bool
	// ahead tells a policies.Pipeliner the coming calls (ahead.go); nil
	// for other policies.
	ahead *ahead
	// handler is the policy as a policies.Handler, in a plain replay
	// only (where nothing but the free reads a live block's address),
	// else nil.
	handler policies.Handler
	// obsChanges is the simulated device's changes at the last observe:
	// observeSlow takes its short way while they hold (sameDevice).
	obsChanges uint64
}

// NewReplay builds the policy named in cfg on a fresh simulated device, or
// on cfg.Backend. It returns an error for an unknown policy or a bad
// setting, and for an Observer, Check or CostModel with a Backend.
func NewReplay(cfg Config) (*Replay, error) {
	var dev *Device
	var back Backend
	var pdev policies.Device
	var chk *Checker
	if cfg.Backend != nil {
		switch {
		case cfg.Observer != nil:
			return nil, fmt.Errorf("policy %s: an allocator history (--viz) needs the simulated device", cfg.Policy)
		case cfg.Check:
			return nil, fmt.Errorf("policy %s: the invariant checker (--check) needs the simulated device", cfg.Policy)
		case cfg.CostModel != nil:
			return nil, fmt.Errorf("policy %s: a cost model charges the simulated device only", cfg.Policy)
		}
		back, pdev = cfg.Backend, cfg.Backend
	} else {
		dev = NewDevice(cfg.Capacity)
		if cfg.Card {
			dev.HoldFootprint()
		}
		dev.SetCardMemory(cfg.CardMemory)
		back, pdev = dev, dev
		if cfg.Check || checkByDefault() {
			chk = NewChecker(dev)
			pdev = chk.Wrap()
		}
		if cfg.CostModel != nil {
			dev.SetCostModel(cfg.CostModel)
		}
	}
	obs := newObserving(cfg.Observer, dev)
	build := cfg.NewPolicy
	if build == nil {
		build = func(d policies.Device, s policies.Settings) (policies.Policy, error) {
			return policies.New(cfg.Policy, d, s)
		}
	}
	p, err := build(obs.wrap(pdev), cfg.Settings)
	var buildErr string
	if errors.Is(err, policies.ErrOutOfMemory) {
		// A policy that takes memory up front (a preallocated pool) and
		// finds no room: every malloc of the replay is an OOM.
		buildErr = err.Error()
		p, err = unbuilt{name: cfg.Policy}, nil
	}
	if err != nil {
		return nil, err
	}
	if h, ok := p.(policies.Hinter); ok && cfg.PeakRequestedHint > 0 {
		h.Hint(cfg.PeakRequestedHint)
	}
	if chk != nil {
		chk.SetPolicy(p)
	}
	r := &Replay{
		cfg:    cfg,
		policy: p,
		back:   back,
		dev:    dev,
		obs:    obs,
		check:  chk,
	}
	r.timer, _ = back.(PolicyTimer)
	r.pooler, _ = p.(policies.Pooler)
	r.startRecorded()
	r.res = Result{
		Trace:            cfg.Trace,
		Policy:           p.Name(),
		Settings:         cfg.Settings,
		Capacity:         cfg.Capacity,
		CapacityFromCard: cfg.CardCapacityUsed,
		FirstOOMEvent:    -1,
		BuildError:       buildErr,
	}
	return r, nil
}

// unbuilt stands for a policy whose construction the device refused: it
// fails every malloc with an OOM.
type unbuilt struct{ name string }

func (u unbuilt) Name() string { return u.name }

func (u unbuilt) Malloc(size, stream uint64) (policies.Block, error) {
	return policies.Block{}, fmt.Errorf("policy %s could not be built: %w", u.name, policies.ErrOutOfMemory)
}

func (u unbuilt) Free(addr, stream uint64) error {
	return fmt.Errorf("policy %s could not be built: no block at %#x", u.name, addr)
}

// Policy returns the policy being replayed.
func (r *Replay) Policy() policies.Policy { return r.policy }

// Device returns the simulated device, nil for a replay on a Backend.
func (r *Replay) Device() *Device { return r.dev }

// Step replays event ev, the i-th event of the trace (from 0). It returns an
// error only for a failure of the policy other than an OOM, or for an event
// that cannot be replayed at all; OOMs are counted and the replay goes on.
func (r *Replay) Step(i int64, ev trace.Event) error { return r.step(i, &ev) }

// step is Step on an event the caller keeps (Run's events are not copied).
func (r *Replay) step(i int64, ev *trace.Event) error {
	r.res.Events++
	r.checkTime(i, ev)
	if r.dev != nil {
		r.dev.SetTime(ev.Time) // the simulated device without an interface call per event
	} else {
		r.back.SetTime(ev.Time)
	}
	r.obs.at(i, ev)
	if r.watch != nil {
		r.watch.begin(i, ev)
	}
	if r.check != nil {
		r.check.Begin(i)
	}
	if ev.Pool != 0 || ev.Op == trace.OpPoolRelease || ev.Restore {
		if p := trace.CheckPool(i, *ev); p != nil {
			r.problem = p
		}
	}
	switch ev.Op {
	case trace.OpMalloc:
		if err := r.malloc(i, ev); err != nil {
			return err
		}
	case trace.OpMallocFailed:
		if err := r.mallocFailed(i, ev); err != nil {
			return err
		}
	case trace.OpFree:
		if err := r.free(i, ev); err != nil {
			return err
		}
	case trace.OpFreeRequested:
		r.freeRequested(i, ev)
		r.rec.requested(i, ev)
	case trace.OpSegmentAlloc, trace.OpSegmentFree, trace.OpSegmentMap, trace.OpSegmentUnmap:
		r.followed(ev)
		if r.unshown != nil && ev.Op == trace.OpSegmentAlloc {
			r.unshown.fresh = append(r.unshown.fresh, policies.Block{Addr: ev.Addr, Size: ev.Size})
		}
	case trace.OpMarker:
		if m, ok := r.policy.(policies.Marker); ok {
			if err := m.Mark(ev.Label); err != nil {
				return fmt.Errorf("event %d: marker %q: %w", i, ev.Label, err)
			}
		}
	case trace.OpStreamSync, trace.OpDeviceSync, trace.OpEventRecord, trace.OpStreamWaitEvent, trace.OpEventSync:
		if err := r.sync(i, ev); err != nil {
			return err
		}
	case trace.OpPoolRelease:
		if r.pooler != nil && ev.Pool != 0 {
			if err := r.pooler.ReleasePool(ev.Pool); err != nil {
				return fmt.Errorf("event %d: pool_release of pool %d: %w", i, ev.Pool, err)
			}
		}
	case trace.OpEmptyCache:
		if ev.Pool != 0 {
			// A private pool's own: nothing for a policy that keeps none.
			if r.pooler != nil {
				if err := r.pooler.EmptyPool(ev.Pool); err != nil {
					return fmt.Errorf("event %d: empty_cache of pool %d: %w", i, ev.Pool, err)
				}
			}
			break
		}
		if rel, ok := r.policy.(policies.Releaser); ok {
			if err := rel.EmptyCache(); err != nil {
				return fmt.Errorf("event %d: empty_cache: %w", i, err)
			}
		}
	}
	if r.check != nil {
		if err := r.check.Step(); err != nil {
			return err
		}
	}
	if r.watch != nil {
		r.watch.end(i, ev)
	}
	if r.problem != nil {
		if r.cfg.Strict {
			return fmt.Errorf("%w (--strict)", r.problem)
		}
		r.res.Anomalies++
		if r.res.FirstAnomaly == "" {
			r.res.FirstAnomaly = r.problem.Error()
		}
	}
	r.observe(i, ev.Time)
	if i+1 == r.history {
		r.historyBegins()
	}
	return nil
}

// next steps event i through the path that Prepare chose for the replay:
// stepPlain for a plain one, else step.
func (r *Replay) next(i int64, ev *trace.Event) error {
	if r.plain {
		return r.stepPlain(i, ev)
	}
	return r.step(i, ev)
}

// plainOK reports whether the replay needs none of the work that step does
// only for some replays: the simulated device, no checker, observer, watch on a recording, policy timer, recorded ties or
// inferred calls, and no reconstructed history. Prepare sets plain from it.
func (r *Replay) plainOK() bool {
	return r.dev != nil && r.check == nil && r.obs == nil && r.watch == nil &&
		r.unshown == nil && r.timer == nil && r.rec.ties == nil && r.rec.inferrer == nil && r.history == 0
}

// stepPlain is step for a plain replay (Replay.plain), with the common
// events on a path of their own: a malloc of device memory in the default
// pools, of a valid size, at a live-free address, and a free of a live
// address, each in time order. On such an event every branch of step for
// the optional work is known not taken (plainOK), no semantic problem is
// found (so none is counted), so what stepPlain does is what step does,
// without asking; with a Handler policy (Replay.handler) its mallocs, and
// the frees of blocks it placed and no free request released, take
// mallocHandled and freeHandled. Any other event goes to step, before
// anything is changed: the checks below read only.
func (r *Replay) stepPlain(i int64, ev *trace.Event) error {
	if !plainEvent(ev, r.lastTime) {
		return r.step(i, ev)
	}
	var err error
	if ev.Op == trace.OpMalloc {
		// A duplicate leaves the table as it was: step finds it again.
		slot, dup := r.liveRef(i, ev)
		if dup {
			return r.step(i, ev)
		}
		if r.handler != nil {
			err = r.mallocHandled(i, ev, slot)
		} else {
			err = r.plainMalloc(i, ev, slot)
		}
	} else {
		// A free of an address not live leaves the table as it was.
		a, ok := r.liveTake(i, ev)
		if !ok {
			return r.step(i, ev)
		}
		if a.handled() {
			err = r.freeHandled(i, ev, a)
		} else {
			err = r.plainFree(i, ev, a)
		}
	}
	if err != nil {
		return err
	}
	if !r.observeQuick(i, ev.Time) {
		r.observeSlow(i, ev.Time)
	}
	return nil
}

// plainEvent reports whether ev, after an event at time last (ns; 0 before
// the first), is a malloc or a free that stepPlain takes on its own path
// if its address is live (a free) or not (a malloc): in time order, in
// the default pools, not a restore, and for a malloc of a valid size on
// the device, with no label (which may name a direct malloc,
// trace.IsDirect). It reads the event alone, so a resolver finds it
// ahead (resolvedPlain).
func plainEvent(ev *trace.Event, last int64) bool {
	if ev.Time < last || ev.Time < 0 || ev.Pool != 0 || ev.Restore {
		return false
	}
	switch ev.Op {
	case trace.OpMalloc:
		// Size 0 or over trace.MaxSize is a problem.
		return ev.Label == "" && ev.Kind.OnDevice() && ev.Size-1 < trace.MaxSize
	case trace.OpFree:
		return true
	}
	return false
}

// stepResolved is stepPlain in a replay whose live allocations a resolver
// found (Replay.rv): an event it marked plain (resolvedPlain), a malloc
// of an address not live or a free of a live one, takes stepPlain's own
// path; any other goes to step.
func (r *Replay) stepResolved(i int64, ev *trace.Event) error {
	e := r.rv.ids[i]
	if e&resolvedPlain == 0 {
		return r.step(i, ev)
	}
	n := e & resolvedNumber
	var err error
	if ev.Op == trace.OpMalloc {
		if int(n) >= len(r.slots) {
			r.slots = append(r.slots, make([]liveAlloc, int(n)+1-len(r.slots))...)
		}
		// Not cleared: mallocHandled and plainMalloc write the slot
		// whole, unless the replay fails.
		if r.handler != nil {
			err = r.mallocHandled(i, ev, &r.slots[n])
		} else {
			err = r.plainMalloc(i, ev, &r.slots[n])
		}
	} else if a := r.slots[n]; a.handled() {
		err = r.freeHandled(i, ev, a)
	} else {
		err = r.plainFree(i, ev, a)
	}
	if err != nil {
		return err
	}
	if !r.observeQuick(i, ev.Time) {
		r.observeSlow(i, ev.Time)
	}
	return nil
}

// plainMalloc is stepPlain's malloc ev, event i, its live allocation
// written at slot, where the policy is no Handler (Replay.handler; else
// mallocHandled): mallocSlot.
func (r *Replay) plainMalloc(i int64, ev *trace.Event, slot *liveAlloc) error {
	r.plainBegin(i, ev)
	err := r.mallocSlot(i, ev, slot)
	r.liveRose()
	return err
}

// liveRose folds the live bytes after a malloc of stepPlain's own into
// the series' open point and, while the reserved bytes are at their peak,
// into the idle share there: what observeQuick leaves out.
// observe folds the same bytes again, to the same figures (a max, and
// stillAtPeak after a new peak is none).
func (r *Replay) liveRose() {
	s := &r.series
	alloc := r.allocated
	s.foldLive(r.requested.sat(), alloc)
	s.stillAtPeak(&r.res, alloc, r.dev.reserved)
}

// plainFree is stepPlain's free ev, event i, of live allocation a, taken
// out of the live allocations, where a is not handled (else
// freeHandled): freed.
func (r *Replay) plainFree(i int64, ev *trace.Event, a liveAlloc) error {
	r.plainBegin(i, ev)
	return r.freed(i, ev, a)
}

// mallocHandled is plainMalloc for a Handler policy (Replay.handler):
// mallocSlot in a plain replay (no checker, observer, watch, ties or
// inferred calls there), for stepPlain and stepResolved, which call it
// straight (a call less an event): the malloc ev of event i, in the
// default pools, its live allocation written at slot.
func (r *Replay) mallocHandled(i int64, ev *trace.Event, slot *liveAlloc) error {
	r.mallocBegin(i, ev)
	dev := r.dev
	reserved, allocs, overflows := dev.reserved, dev.allocs, dev.overflows
	b, h, err := r.handler.MallocHandle(ev.Size, ev.Stream)
	if err != nil || reserved > r.allocated && dev.allocs != allocs {
		return r.mallocAnswered(i, ev, slot, b, h, err, reserved, allocs, overflows)
	}
	// mallocPlaced, written out: too large to inline, and this is the
	// replay's most common path.
	*slot = handledLive(b, h, ev.Size, ev.Kind, i)
	r.allocated += b.Size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	r.liveRose()
	return nil
}

// mallocBegin is what mallocHandled does before the policy's call: the
// event begun (plainBegin) and its requested bytes counted.
func (r *Replay) mallocBegin(i int64, ev *trace.Event) {
	r.plainBegin(i, ev)
	r.res.Mallocs++
	r.requested.add(ev.Size)
	r.res.PeakRequested = max(r.res.PeakRequested, r.requested.sat())
}

// mallocAnswered is what mallocHandled does after the policy's call,
// which returned block b, handle h and err, on a device that held
// reserved bytes, had made allocs allocations and overflows overflows
// before it: an OOM or a failure counted, fragmentation found, and the
// live allocation written at slot.
func (r *Replay) mallocAnswered(i int64, ev *trace.Event, slot *liveAlloc, b policies.Block, h uint64, err error, reserved uint64, allocs, overflows int64) error {
	if err != nil {
		r.fragmented(ev.Size, reserved, allocs, true)
		err = r.mallocRefused(i, ev, slot, overflows, err)
		r.liveRose()
		return err
	}
	if reserved > r.allocated && r.dev.allocs != allocs {
		r.fragmented(ev.Size, reserved, allocs, false)
	}
	r.mallocPlaced(i, ev, slot, b, h)
	return nil
}

// mallocPlaced writes the live allocation of malloc ev, event i, placed
// at block b with handle h, at slot, and counts its allocated bytes.
func (r *Replay) mallocPlaced(i int64, ev *trace.Event, slot *liveAlloc, b policies.Block, h uint64) {
	*slot = handledLive(b, h, ev.Size, ev.Kind, i)
	r.allocated += b.Size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	r.liveRose()
}

// freeHandled is plainFree of a live allocation a that is handled: of
// device memory, placed by the policy with a handle, and not released by
// a free request. It does what freed does for it in a plain replay (no
// checker, observer or follower there), for stepPlain and stepResolved,
// which call it straight.
func (r *Replay) freeHandled(i int64, ev *trace.Event, a liveAlloc) error {
	r.plainBegin(i, ev)
	r.freeLogged(i, ev)
	r.freeCounted(a, a.block.Size)
	return freeEnd(i, ev, r.handler.FreeHandle(a.block.Addr, ev.Stream, false))
}

// freeCounted takes the bytes of live allocation a, freed, out of the
// counts: alloc allocated bytes (its block's, or none where its free
// request took them out: release) and its requested bytes.
func (r *Replay) freeCounted(a liveAlloc, alloc uint64) {
	r.allocated -= alloc
	r.requested.sub(a.requested)
	r.res.Frees++
}

// freeEnd returns the error of free ev, event i, from the policy's err.
func freeEnd(i int64, ev *trace.Event, err error) error {
	if err != nil {
		return fmt.Errorf("event %d: free of %#x: %w", i, ev.Addr, err)
	}
	return nil
}

// plainBegin is what step does before an event of stepPlain's own: the
// count, the time in order (checkTime with no problem; r.problem is read
// only within step, which sets it at every event) and the device's clock.
func (r *Replay) plainBegin(i int64, ev *trace.Event) {
	r.res.Events++
	r.lastTime, r.lastIdx, r.timed = ev.Time, i, true
	r.dev.SetTime(ev.Time)
}

// observeQuick and observeSlow are observe on the simulated device, with
// no watch on a recording, after a malloc or free of stepPlain's own
// (event i at time t, ns), called as
//
//	if !r.observeQuick(i, t) {
//		r.observeSlow(i, t)
//	}
//
// so that the quick way, small enough, inlines into the caller. After an
// event that made no device call since the last observe, the reserved
// bytes and the footprint are those the peaks and the open point hold
// already. The quick way is for such an event that finds no fragmentation
// (sameDevice) and leaves the open point open: its live bytes were
// folded in at its malloc (liveRose), and a free's are below those of the
// event before, folded in already, so only the point's last event and its
// count change. observeQuick reports whether it took the quick way.
func (r *Replay) observeQuick(i, t int64) bool {
	s := &r.series
	if s.n+1 >= s.width || !r.sameDevice() {
		return false
	}
	s.cur.Event, s.cur.Time = i, t
	s.n++
	return true
}

// observeSlow is observeQuick's other way. After an event that made no
// device call since the last observe (sameDevice), only the live bytes
// and the idle share at the peak are folded in.
func (r *Replay) observeSlow(i, t int64) {
	s := &r.series
	if r.sameDevice() {
		alloc, reserved := r.allocated, r.dev.reserved
		s.stillAtPeak(&r.res, alloc, reserved)
		if s.addLive(i, t, r.requested.sat(), alloc) {
			s.closeAt(r.policy, alloc, reserved)
		}
		return
	}
	fp := r.dev.Footprint()
	r.res.PeakFootprint = max(r.res.PeakFootprint, fp)
	r.series.Footprint(fp)
	r.series.Observe(&r.res, r.policy, i, t, r.requested.sat(), r.allocated, r.dev.reserved)
	r.observed()
}

// sameDevice reports whether the simulated device made no call that
// changes its reserved bytes or footprint since the last observe, the
// series' open point holds an event observed then or since, and no
// fragmentation was found at this event: what observeSlow's short way
// needs. The peak reserved bytes then stand as that observe left them.
func (r *Replay) sameDevice() bool {
	return r.dev.changes == r.obsChanges && r.series.n != 0 && r.series.evFrag == 0
}

// observed notes the simulated device's state at an observe, for
// sameDevice.
func (r *Replay) observed() {
	if r.dev != nil {
		r.obsChanges = r.dev.changes
	}
}

// checkTime sets the event's problem to time going backwards, as
// trace.Clock finds it; the clock is called only then, so that the event
// is not copied into it at every step.
func (r *Replay) checkTime(i int64, ev *trace.Event) {
	if ev.Time < 0 || r.timed && ev.Time < r.lastTime {
		var c trace.Clock
		if r.timed {
			c.Check(r.lastIdx, trace.Event{Time: r.lastTime})
		}
		r.problem = c.Check(i, *ev)
	} else {
		r.problem = nil
	}
	r.lastTime, r.lastIdx, r.timed = ev.Time, i, true
}

func (r *Replay) malloc(i int64, ev *trace.Event) error {
	if ev.Size == 0 || ev.Size > trace.MaxSize {
		r.problem = trace.CheckSize(i, *ev) // replayed all the same: the policy decides
	}
	// One probe finds a duplicate or makes the slot, filled below; the
	// policy does not touch the table meanwhile.
	slot, dup := r.liveRef(i, ev)
	if dup {
		r.problem = trace.LiveMalloc(i, *ev, slot.event())
		return nil
	}
	if !ev.Kind.OnDevice() {
		return r.hostMalloc(i, ev, slot)
	}
	if ev.Label != "" && trace.IsDirect(ev.Kind, ev.Label) {
		return r.directMalloc(i, ev, slot)
	}
	return r.mallocSlot(i, ev, slot)
}

// mallocSlot replays a malloc of device memory through the policy, its
// live allocation to be written at slot, a new entry of the live table.
func (r *Replay) mallocSlot(i int64, ev *trace.Event, slot *liveAlloc) error {
	r.res.Mallocs++
	// The trace's own live bytes: the lower bound, whatever the policy does.
	r.requested.add(ev.Size)
	r.res.PeakRequested = max(r.res.PeakRequested, r.requested.sat())
	if r.rec.ties != nil {
		r.rec.ties.FollowTie(ev.Addr)
	}
	if r.unshown != nil {
		r.unshown.malloc(ev.Addr)
	}
	reserved, allocs := r.deviceState()
	overflows := r.devOverflows()
	var b policies.Block
	var h uint64
	var err error
	handled := r.handler != nil && ev.Pool == 0
	if handled {
		b, h, err = r.handler.MallocHandle(ev.Size, ev.Stream)
	} else {
		b, err = r.policyMalloc(ev)
	}
	if r.rec.inferrer != nil {
		r.noteInferred(i, ev.Size)
	}
	r.fragmented(ev.Size, reserved, allocs, err != nil)
	if err != nil {
		return r.mallocRefused(i, ev, slot, overflows, err)
	}
	if handled {
		*slot = handledLive(b, h, ev.Size, ev.Kind, i)
	} else {
		*slot = newLive(b, ev.Size, ev.Kind, i)
	}
	if r.check != nil {
		if err := r.check.Malloc(b, ev.Size); err != nil {
			return err
		}
	}
	r.allocated += b.Size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	r.obs.tell(ActionAlloc, b, ev.Size)
	if r.watch != nil {
		r.watch.placed, r.watch.addr = true, b.Addr
	}
	return nil
}

// mallocRefused ends the malloc of event i that the policy refused with
// err, its live allocation to be written at slot: an OOM (an overflow too
// if the device refused one since overflows, devOverflows before the
// call), or the error for any other.
func (r *Replay) mallocRefused(i int64, ev *trace.Event, slot *liveAlloc, overflows int64, err error) error {
	if !errors.Is(err, policies.ErrOutOfMemory) {
		return fmt.Errorf("event %d: malloc of %d bytes: %w", i, ev.Size, err)
	}
	r.overflow(i, ev, err, overflows)
	r.oom(i, ev.Size)
	// The requested bytes stay counted: the source had them live.
	*slot = failedLive(ev.Size, ev.Kind, i)
	return nil
}

// hostMalloc replays a malloc of pinned or managed host memory: the
// backend allocates it (the simulated device only counts it); a refusal is
// an OOM.
func (r *Replay) hostMalloc(i int64, ev *trace.Event, slot *liveAlloc) error {
	addr, err := r.back.HostMalloc(ev.Kind, ev.Size)
	if err != nil {
		if !errors.Is(err, policies.ErrOutOfMemory) {
			return fmt.Errorf("event %d: %s malloc of %d bytes: %w", i, ev.Kind, ev.Size, err)
		}
		r.oom(i, ev.Size)
		*slot = failedLive(ev.Size, ev.Kind, i)
		return nil
	}
	count := &r.managed
	if ev.Kind == trace.KindPinned {
		count = &r.pinned
	}
	if *count > math.MaxUint64-ev.Size {
		// Checked: the live host bytes would wrap.
		r.back.HostFree(ev.Kind, addr, ev.Size)
		r.overflow(i, ev, fmt.Errorf("%s malloc of %d bytes with %d live: %w: %w", ev.Kind, ev.Size, *count, policies.ErrOverflow, policies.ErrOutOfMemory), r.devOverflows())
		r.oom(i, ev.Size)
		*slot = failedLive(ev.Size, ev.Kind, i)
		return nil
	}
	*count += ev.Size
	if ev.Kind == trace.KindPinned {
		r.res.PeakPinned = max(r.res.PeakPinned, r.pinned)
	} else {
		r.res.PeakManaged = max(r.res.PeakManaged, r.managed)
	}
	*slot = newLive(policies.Block{Addr: addr, Size: ev.Size}, ev.Size, ev.Kind, i)
	return nil
}

// directMalloc replays a device malloc that a CUDA library made straight
// from the driver (trace.DirectSite): it goes around the policy, as it went
// around the recorded job's allocator, and its bytes are counted apart
// (Result.DirectMallocs, PeakDirect), not in the requested, allocated or
// reserved bytes.
func (r *Replay) directMalloc(i int64, ev *trace.Event, slot *liveAlloc) error {
	r.res.DirectMallocs++
	var addr uint64
	if r.dev != nil {
		// Its pages take the card's memory (the footprint).
		a, err := r.dev.DirectAlloc(ev.Size)
		if err != nil {
			if !errors.Is(err, policies.ErrOutOfMemory) {
				return fmt.Errorf("event %d: %w", i, err)
			}
			// The card refuses the library's malloc: the job's OOM.
			r.oom(i, ev.Size)
			*slot = failedLive(ev.Size, ev.Kind, i)
			slot.bits |= liveDirect
			return nil
		}
		addr = a
	}
	r.direct += ev.Size
	r.res.PeakDirect = max(r.res.PeakDirect, r.direct)
	*slot = newLive(policies.Block{Addr: addr, Size: ev.Size}, ev.Size, ev.Kind, i)
	slot.bits |= liveDirect
	return nil
}

// sync replays a synchronization: on the device, then told to the policy.
func (r *Replay) sync(i int64, ev *trace.Event) error {
	// The backend is an interface: given ev itself, every event of the
	// replay would be moved to the heap; a copy moves only syncs.
	evc := *ev
	if err := r.back.Sync(&evc); err != nil {
		return fmt.Errorf("event %d (%s): %w", i, ev.Op, err)
	}
	s, ok := r.policy.(policies.Syncer)
	if !ok {
		return nil
	}
	switch ev.Op {
	case trace.OpStreamSync:
		s.StreamSync(ev.Stream)
	case trace.OpDeviceSync:
		s.DeviceSync()
	case trace.OpEventRecord:
		s.EventRecord(ev.Addr, ev.Stream)
	case trace.OpStreamWaitEvent:
		s.StreamWaitEvent(ev.Stream, ev.Addr)
	case trace.OpEventSync:
		s.EventSync(ev.Addr)
	}
	return nil
}

// policyMalloc and policyFree call the policy, timed by the backend when
// it is a PolicyTimer (small enough to be inlined when it is not).
func (r *Replay) policyMalloc(ev *trace.Event) (policies.Block, error) {
	if r.timer != nil || ev.Pool != 0 {
		return r.timedMalloc(ev.Size, ev.Stream, ev.Pool, ev.Restore)
	}
	return r.policy.Malloc(ev.Size, ev.Stream)
}

func (r *Replay) policyFree(addr, stream uint64) error {
	if r.timer != nil {
		return r.timedFree(addr, stream)
	}
	return r.policy.Free(addr, stream)
}

// timedMalloc is policyMalloc's slow path: timed, or into a private pool
// (which a policy that is no Pooler gets as a plain malloc, counted), or a
// restored block.
func (r *Replay) timedMalloc(size, stream uint64, pool uint32, restore bool) (policies.Block, error) {
	if pool != 0 && r.pooler == nil {
		if r.unpooled == nil {
			r.unpooled = map[uint32]int64{}
		}
		r.unpooled[pool]++
		pool = 0
	}
	if r.timer != nil {
		r.timer.BeginPolicy()
		defer r.timer.EndPolicy()
	}
	switch {
	case pool != 0 && restore:
		return r.pooler.RestoreBlock(size, stream, pool)
	case pool != 0:
		return r.pooler.MallocPool(size, stream, pool)
	}
	return r.policy.Malloc(size, stream)
}

func (r *Replay) timedFree(addr, stream uint64) error {
	r.timer.BeginPolicy()
	defer r.timer.EndPolicy()
	return r.policy.Free(addr, stream)
}

// mallocFailed replays a malloc that failed in the source as an attempt:
// an OOM if the policy fails too, else the block is freed at once, as the
// program never got it.
func (r *Replay) mallocFailed(i int64, ev *trace.Event) error {
	r.res.SourceOOMs++
	if !ev.Kind.OnDevice() {
		return nil
	}
	reserved, allocs := r.deviceState()
	overflows := r.devOverflows()
	b, err := r.policyMalloc(ev)
	if r.rec.inferrer != nil {
		r.noteInferred(i, ev.Size)
	}
	r.fragmented(ev.Size, reserved, allocs, err != nil)
	if err != nil {
		if !errors.Is(err, policies.ErrOutOfMemory) {
			return fmt.Errorf("event %d: malloc of %d bytes: %w", i, ev.Size, err)
		}
		r.overflow(i, ev, err, overflows)
		r.oom(i, ev.Size)
		return nil
	}
	// The block lives for an instant: count it in the peaks before the
	// free, as the program would have held it had the malloc succeeded,
	// its requested bytes as its allocated ones.
	r.res.SourceOOMsServed++
	with := r.requested
	with.add(ev.Size)
	r.res.PeakRequested = max(r.res.PeakRequested, with.sat())
	r.allocated += b.Size
	r.res.PeakAllocated = max(r.res.PeakAllocated, r.allocated)
	if reserved := r.back.Reserved(); reserved > r.res.PeakReserved {
		r.res.PeakReserved = reserved
		r.res.PeakReservedEvent = i
		r.series.atNewPeak(r.allocated)
	}
	if r.dev != nil {
		r.res.PeakFootprint = max(r.res.PeakFootprint, r.dev.Footprint())
		r.series.Footprint(r.dev.Footprint())
	}
	r.series.Instant(with.sat(), r.allocated, r.back.Reserved())
	r.allocated -= b.Size
	if r.check != nil {
		if err := r.check.Malloc(b, ev.Size); err != nil {
			return err
		}
		if err := r.check.Free(b); err != nil {
			return err
		}
	}
	r.obs.tell(ActionAlloc, b, ev.Size)
	if r.watch != nil {
		r.watch.placed, r.watch.addr = true, b.Addr
	}
	r.obs.tell(ActionFreeRequested, b, ev.Size)
	r.obs.tell(ActionFreeCompleted, b, ev.Size)
	if err := r.policyFree(b.Addr, ev.Stream); err != nil {
		return fmt.Errorf("event %d: free of the block of a failed malloc: %w", i, err)
	}
	return nil
}

// freeRequested takes the bytes of the allocation at ev.Addr out of the
// allocated figure, as PyTorch's allocator does (allocated_bytes) when the
// program frees a block still in use on another stream; its requested bytes
// stay live (PyTorch's requested_bytes) and the block goes back to the
// policy only at the matching free (free_completed).
func (r *Replay) freeRequested(i int64, ev *trace.Event) {
	p := r.livePtr(i, ev)
	if p == nil {
		r.problem = r.notLive(i, ev)
		return
	}
	if p.released() {
		return
	}
	p.setReleased()
	a := *p
	r.release(a)
	if a.kind().OnDevice() && !a.failed() && !a.direct() {
		r.obs.tell(ActionFreeRequested, a.block, a.requested)
	}
}

// release takes a live allocation's bytes out of the live figures at its
// free request: its allocated bytes, or a host kind's bytes.
func (r *Replay) release(a liveAlloc) {
	if a.direct() {
		if !a.failed() {
			r.direct -= a.requested
		}
		return
	}
	switch a.kind() {
	case trace.KindPinned:
		r.pinned -= a.requested
	case trace.KindManaged:
		r.managed -= a.requested
	default:
		r.allocated -= a.block.Size
	}
}

func (r *Replay) free(i int64, ev *trace.Event) error {
	a, ok := r.liveTake(i, ev)
	if !ok {
		r.problem = r.notLive(i, ev)
		return nil
	}
	return r.freed(i, ev, a)
}

// freed replays free ev of live allocation a, taken out of the live table.
func (r *Replay) freed(i int64, ev *trace.Event, a liveAlloc) error {
	r.freeLogged(i, ev)
	if !a.released() {
		r.release(a)
	}
	if a.direct() {
		if !a.failed() && r.dev != nil {
			r.dev.DirectFree(a.block.Addr, a.block.Size)
		}
		return nil
	}
	if !a.kind().OnDevice() {
		if a.failed() {
			return nil
		}
		if err := r.back.HostFree(a.kind(), a.block.Addr, a.block.Size); err != nil {
			return fmt.Errorf("event %d: %s free of %#x: %w", i, a.kind(), ev.Addr, err)
		}
		return nil
	}
	// The requested bytes stay live until the free completes: the block
	// cannot be reused before, so this is the bound any policy must hold.
	r.requested.sub(a.requested)
	r.res.Frees++
	if a.failed() {
		// The malloc failed in the replay: nothing to give back.
		return nil
	}
	if r.check != nil {
		if err := r.check.Free(a.block); err != nil {
			return err
		}
	}
	if !a.released() {
		r.obs.tell(ActionFreeRequested, a.block, a.requested)
	}
	r.obs.tell(ActionFreeCompleted, a.block, a.requested)
	if err := r.freeBlock(i, ev, a); err != nil {
		return fmt.Errorf("event %d: free of %#x: %w", i, ev.Addr, err)
	}
	return nil
}

// devOverflows returns the simulated device's count of allocations
// refused for an overflow (Device.Overflows), 0 on a Backend.
func (r *Replay) devOverflows() int64 {
	if r.dev == nil {
		return 0
	}
	return r.dev.overflows
}

// overflow counts the malloc of event i that failed with err as an OOM
// because its bytes would pass 2^64, for the result's warning: err wraps
// policies.ErrOverflow, or the device refused an allocation for it while
// the policy served the malloc (devOverflows was before then; a policy
// that tried again returns an OOM of its own). Other OOMs are not
// counted.
func (r *Replay) overflow(i int64, ev *trace.Event, err error, before int64) {
	if !errors.Is(err, policies.ErrOverflow) {
		if r.devOverflows() == before {
			return
		}
		err = fmt.Errorf("%w (the device refused an allocation: %w)", err, policies.ErrOverflow)
	}
	if r.res.Overflow == nil {
		r.res.Overflow = &Overflow{First: fmt.Sprintf("event %d: malloc of %d bytes: %v", i, ev.Size, err)}
	}
	r.res.Overflow.Mallocs++
}

func (r *Replay) oom(i int64, size uint64) {
	r.res.OOMs++
	r.obs.tell(ActionOOM, policies.Block{}, size)
	if r.watch != nil {
		r.watch.oom = true
	}
	if r.res.FirstOOMEvent < 0 {
		r.res.FirstOOMEvent = i
		r.res.FirstOOMSize = size
		r.res.FirstOOMTime = r.lastTime // the event's (checkTime)
	}
}

// observe updates the peaks and the series after event i.
func (r *Replay) observe(i, t int64) {
	var reserved uint64
	if r.dev != nil {
		reserved = r.dev.Reserved()
		fp := r.dev.Footprint()
		r.res.PeakFootprint = max(r.res.PeakFootprint, fp)
		r.series.Footprint(fp)
	} else {
		reserved = r.back.Reserved()
	}
	r.series.Observe(&r.res, r.policy, i, t, r.requested.sat(), r.allocated, reserved)
	if r.unshown != nil && r.res.PeakReservedEvent == i && reserved == r.res.PeakReserved {
		r.unshown.atPeak()
	}
	r.observed()
}

// idle is the cached but idle share of reserved bytes: 1 -
// allocated/reserved, 0 when nothing is reserved.
func idle(allocated, reserved uint64) float64 {
	if reserved == 0 || allocated >= reserved {
		return 0
	}
	return 1 - float64(allocated)/float64(reserved)
}

// deviceState returns the bytes reserved and the device allocations (maps
// included) made so far, which fragmented compares after a malloc.
func (r *Replay) deviceState() (reserved uint64, allocs int64) {
	if r.dev != nil {
		return r.dev.Reserved(), r.dev.Allocs()
	}
	allocs, _ = r.back.DeviceCalls()
	return r.back.Reserved(), allocs
}

// fragmented folds in the fragmentation of a malloc of size bytes, made
// with reserved bytes reserved and allocs device allocations made before
// it (deviceState), r.allocated not yet counting it: the policy's free
// bytes over its reserved ones where they added up to the request and the
// policy still allocated from the device, or where they and the capacity
// not reserved added up to it and the malloc failed (as failed says):
// free memory that, joined, would have served it.
func (r *Replay) fragmented(size, reserved uint64, allocs int64, failed bool) {
	if reserved <= r.allocated {
		return
	}
	free := reserved - r.allocated
	if failed {
		if r.dev != nil && r.dev.Capacity() > reserved {
			free += r.dev.Capacity() - reserved
		}
		if free < size {
			return
		}
	} else {
		if free < size {
			return
		}
		if _, now := r.deviceState(); now == allocs {
			return // served from its free memory
		}
	}
	r.series.Fragmented(reserved-r.allocated, reserved)
}

// SetPoolNames gives the replay the names of the trace's private pools,
// from header h's "pools" metadata ("1=(1,0) 2=(0,1)"), for the warning
// about mallocs into private pools when the policy is no Pooler, and the
// trace's "pool_warning".
func (r *Replay) SetPoolNames(h trace.Header) {
	r.poolNames = trace.PoolNames(h)
	r.res.PoolWarning = h.Metadata["pool_warning"]
}

// unpooledPools describes the mallocs into private pools that a policy
// that is no Pooler placed in its default pools, by pool in ascending
// order ("(1,0): 37 mallocs, (0,1): 2 mallocs"), named by names where it
// names them; "" if none.
func unpooledPools(counts map[uint32]int64, names map[uint32]string) string {
	if len(counts) == 0 {
		return ""
	}
	ids := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(ids))
	for k, id := range ids {
		parts[k] = fmt.Sprintf("%s: %d mallocs", trace.PoolLabel(names, id), counts[id])
	}
	return strings.Join(parts, ", ")
}

// Finish returns the result of the replay so far, with the device's and the
// policy's counters.
func (r *Replay) Finish() *Result {
	res := r.res
	r.series.Finish(&res, r.policy, r.allocated, r.back.Reserved())
	res.DeviceAllocs, res.DeviceFrees = r.back.DeviceCalls()
	if r.dev != nil {
		r.dev.FillCost(&res)
	}
	if c, ok := r.policy.(policies.Counter); ok {
		res.AllocRetries = c.Retries()
	}
	if b, ok := r.policy.(policies.PlanBounder); ok {
		pb := b.PlanBound()
		res.Plan = &results.PlanBound{Height: pb.Height, LowerBound: pb.LowerBound, Proven: pb.Proven, Seconds: pb.Elapsed.Seconds(), Nodes: pb.Nodes, Stopped: pb.Stopped}
	}
	res.PrivatePools = unpooledPools(r.unpooled, r.poolNames)
	if u := r.unshown; u != nil {
		res.PeakUnshown = u.bytes()
	}
	if w := r.watch; w != nil && w.parted != nil {
		res.Parted, res.PartedAtOOM = w.parted.String(), w.partedOOM
	}
	res.Warnings = results.WarningsOf(&res)
	if w, ok := r.policy.(policies.Warner); ok {
		res.Warnings = append(res.Warnings, w.Warnings()...)
	}
	return &res
}

// Run reads src to the end once and replays its events against each of
// cfgs in turn, returning one result per config in the same order. When a
// config's policy is a policies.Planner, the events are read into memory
// first and given to its Plan. When the offline policy is among cfgs and
// placed every malloc, each result's PeakOffline is its peak reserved
// bytes. Errors name the event index; a read error from src is returned
// as is.
func Run(src trace.Source, cfgs ...Config) ([]*Result, error) {
	reps, src, err := Prepare(src, cfgs...)
	if err != nil {
		return nil, err
	}
	defer closeAll(reps) // on a failure; at the end, Close below says how it went
	stepErr := func(rep *Replay, err error) error {
		if rep.cfg.Strict && errors.As(err, new(*trace.ValidationError)) {
			return err // the trace's problem, not the policy's
		}
		return fmt.Errorf("policy %s: %w", rep.policy.Name(), err)
	}
	step := func(i int64, ev *trace.Event) error {
		for _, rep := range reps {
			if err := rep.next(i, ev); err != nil {
				return stepErr(rep, err)
			}
		}
		return nil
	}
	if ss, ok := src.(*trace.SliceSource); ok {
		// Events already in memory: each replay in a pass of its own,
		// which keeps its tables in the cache (one pass of 180 replays
		// took 1.8 times as long), and no call per event to fetch them.
		// The error is the one a single pass meets first: at the
		// earliest event, of the first replay there.
		evs := ss.Rest()
		var first error
		firstAt := int64(len(evs))
		// The live allocations resolved once for every replay but a
		// Pipeliner's (which looks ahead by address), on a goroutine of
		// their own while the first replay runs (live.go).
		var rsv *resolver
		if resolveLive(len(evs)) && slices.ContainsFunc(reps, func(rep *Replay) bool { return rep.ahead == nil }) {
			rsv = newResolver(evs)
			defer rsv.release()
			rsv.start()
		}
		for _, rep := range reps {
			if rsv != nil && rep.ahead == nil {
				rep.rv = rsv.view()
			}
			rep.series.expect(int64(len(evs)))
			step := rep.step
			if rep.plain {
				step = rep.stepPlain
			}
			if rep.ahead != nil {
				step1 := step
				step = func(k int64, ev *trace.Event) error {
					if err := rep.tellAhead(k, evs[k:]); err != nil {
						return err
					}
					return step1(k, ev)
				}
			}
			// The events resolved so far; all of them without a resolver.
			ready := int64(math.MaxInt64)
			if rep.rv != nil {
				ready = rep.rv.ready
			}
			switch {
			case rep.plain && rep.rv != nil && rep.handler != nil:
				rep.batched = make([]batchEvent, maxBatch)
				for k := int64(0); k < firstAt; {
					if k >= ready {
						rep.rv.wait(k)
						ready = rep.rv.ready
					}
					next, err := rep.stepBatch(evs, k, min(ready, firstAt))
					if err != nil {
						first, firstAt = stepErr(rep, err), next
						break
					}
					k = next
				}
			case rep.plain && rep.rv != nil:
				for k := int64(0); k < firstAt; k++ {
					if k >= ready {
						rep.rv.wait(k)
						ready = rep.rv.ready
					}
					if err := rep.stepResolved(k, &evs[k]); err != nil {
						first, firstAt = stepErr(rep, err), k
						break
					}
				}
			case rep.plain && rep.ahead == nil:
				for k := int64(0); k < firstAt; k++ {
					if err := rep.stepPlain(k, &evs[k]); err != nil {
						first, firstAt = stepErr(rep, err), k
						break
					}
				}
			default:
				for k := int64(0); k < firstAt; k++ {
					if k >= ready {
						rep.rv.wait(k)
						ready = rep.rv.ready
					}
					if err := step(k, &evs[k]); err != nil {
						first, firstAt = stepErr(rep, err), k
						break
					}
				}
			}
			if rep.cfg.Progress != nil {
				rep.cfg.Progress()
			}
		}
		if first != nil {
			return nil, first
		}
	} else {
		if slices.ContainsFunc(reps, func(rep *Replay) bool { return rep.ahead != nil }) {
			if err := runAhead(src, reps, stepErr); err != nil {
				return nil, err
			}
		} else {
			// The loop stays here: step given &ev through a call of
			// another function would move every event to the heap.
			for i := int64(0); ; i++ {
				ev, err := src.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					return nil, err
				}
				if err := step(i, &ev); err != nil {
					return nil, err
				}
			}
		}
		for _, rep := range reps {
			if rep.cfg.Progress != nil {
				rep.cfg.Progress()
			}
		}
	}
	for _, rep := range reps {
		if err := rep.End(); err != nil {
			return nil, fmt.Errorf("policy %s: %w", rep.policy.Name(), err)
		}
	}
	for _, rep := range reps {
		if err := rep.Close(); err != nil {
			return nil, fmt.Errorf("policy %s: %w", rep.policy.Name(), err)
		}
	}
	out := make([]*Result, len(reps))
	for k, rep := range reps {
		out[k] = rep.Finish()
	}
	setPeakOffline(out)
	return out, nil
}

// setPeakOffline gives every result the peak reserved bytes of the offline
// result among them that served every malloc, if there is one, else 0;
// and the least peak that a result's plan proved (the optimal policy's:
// Result.Plan, Proven; the lowest if several did), else 0.
func setPeakOffline(rs []*Result) {
	var peak, optimum uint64
	for _, r := range rs {
		if r.Policy == policies.OfflineName && r.OOMs == 0 && peak == 0 {
			peak = r.PeakReserved
		}
		if p := r.Plan; p != nil && p.Proven && p.Height > 0 && (optimum == 0 || p.Height < optimum) {
			optimum = p.Height
		}
	}
	for _, r := range rs {
		r.PeakOffline, r.PeakOptimum = peak, optimum
	}
}

// RunSplit is Run with cfgs split into up to jobs groups that replay at
// once (splitGroups), group g reading the source that source(g) returns
// (each the whole of one trace) and calling its done func when it stops:
// the results of Run, in the order of cfgs, PeakOffline set across all
// the groups. It returns the error of the first group (in group order)
// that failed.
func RunSplit(jobs int, source func(g int) (src trace.Source, done func()), cfgs ...Config) ([]*Result, error) {
	jobs = max(1, min(jobs, len(cfgs)))
	groups := splitGroups(cfgs, jobs)
	out := make([]*Result, len(cfgs))
	errs := make([]error, jobs)
	var wg sync.WaitGroup
	for g := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, done := source(g)
			if done != nil {
				defer done()
			}
			idx := groups[g]
			group := make([]Config, len(idx))
			for n, k := range idx {
				group[n] = cfgs[k]
			}
			rs, err := Run(src, group...)
			if err != nil {
				errs[g] = err
				return
			}
			for n, k := range idx {
				out[k] = rs[n]
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	setPeakOffline(out)
	return out, nil
}

// Prepare builds one Replay per config for the trace src, in the sequence
// every replay of a trace takes, on the simulated device or on a config's
// Backend alike: the recorded settings (Config.AsRecorded), the trace's
// peak of live requested bytes for a policies.Hinter (a first pass over
// src), the reconstruction of a truncated history, and the whole trace for
// a policies.Planner's Plan (read into memory). It returns the replays, in
// the order of cfgs, and the source to read the events from (src itself
// when nothing had to read it). The caller steps every event through each
// replay, then calls End, Finish and Close; Run does all of it. Errors are
// those of NewReplay, of a Plan and of reading src; the replays built are
// closed then.
func Prepare(src trace.Source, cfgs ...Config) (_ []*Replay, _ trace.Source, err error) {
	reps := make([]*Replay, len(cfgs))
	defer func() {
		if err != nil {
			closeAll(reps)
		}
	}()
	for k, c := range cfgs {
		c, err := c.withCard(src.Header()).withRecorded(src.Header())
		if err != nil {
			return nil, nil, err
		}
		rep, err := NewReplay(c)
		if err != nil {
			return nil, nil, err
		}
		rep.Reconstructed(ReconstructedEvents(src.Header()))
		rep.res.TraceSource = src.Header().Source
		rep.SetPoolNames(src.Header())
		reps[k] = rep
	}
	src, err = hint(src, reps)
	if err != nil {
		return nil, nil, err
	}
	src, err = plan(src, reps)
	if err != nil {
		return nil, nil, err
	}
	for _, rep := range reps {
		rep.plain = rep.plainOK()
		if rep.plain {
			rep.handler, _ = rep.policy.(policies.Handler)
		}
		rep.ahead = newAhead(rep)
	}
	for _, c := range cfgs {
		if so, ok := c.Observer.(SourceObserver); ok {
			so.ObserveSource(src.Header(), trace.StacksOf(src))
		}
	}
	return reps, src, nil
}

// Close releases what the replay's policy holds outside the replay, when
// it is an io.Closer (an exec: policy's child process), and returns its
// error; it may be called more than once. Run closes every replay it
// built, at the end or at a failure; a caller of Prepare closes them after
// Finish.
func (r *Replay) Close() error {
	if c, ok := r.policy.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// closeAll closes reps (nil ones skipped), their errors dropped: after a
// failure, which is the error to report.
func closeAll(reps []*Replay) {
	for _, rep := range reps {
		if rep != nil {
			rep.Close()
		}
	}
}

// Reopener is implemented by sources that can start over from their first
// event, such as a trace file opened again; Run uses it for a first pass
// when a policy needs a figure of the whole trace.
type Reopener interface {
	Reopen() (trace.Source, error)
}

// hint gives the replays whose policy is a policies.Hinter, and whose
// config gave no PeakRequestedHint, the trace's peak of live requested
// bytes, from a first pass over src: read again through Reopener when src
// has it, else from the events held in memory. It returns the source to
// replay from. Whether a policy is a Hinter is asked of the policy built,
// as for every other ability, whether or not the registry knows it.
func hint(src trace.Source, reps []*Replay) (trace.Source, error) {
	var hinters []policies.Hinter
	var need []*Replay
	for _, rep := range reps {
		if h, ok := rep.policy.(policies.Hinter); ok && rep.cfg.PeakRequestedHint == 0 {
			hinters, need = append(hinters, h), append(need, rep)
		}
	}
	if len(need) == 0 {
		return src, nil
	}
	var evs []trace.Event
	var peak peakLive
	ro, reopen := src.(Reopener)
	if ss, ok := src.(*trace.SliceSource); ok {
		// Events in memory: passed over in place, then reopened.
		for k, rest := 0, ss.Rest(); k < len(rest); k++ {
			peak.add(&rest[k])
		}
	} else {
		for {
			ev, err := src.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			if !reopen {
				evs = trace.AppendEvent(evs, ev)
			}
			peak.add(&ev)
		}
	}
	if reopen {
		again, err := ro.Reopen()
		if err != nil {
			return nil, err
		}
		src = again
	} else {
		src = trace.NewSliceSource(src.Header(), evs).WithStacks(trace.StacksOf(src))
	}
	for k, rep := range need {
		rep.cfg.PeakRequestedHint = peak.peak
		if peak.peak > 0 {
			hinters[k].Hint(peak.peak)
		}
	}
	return src, nil
}

// peakLive finds a trace's peak of live requested device bytes, as the
// events go by: a malloc of an address already live and a free of one not
// live do not count.
type peakLive struct {
	sizes trace.AddrMap[uint64] // live device allocations' requested bytes by address
	live  bytes128
	peak  uint64
}

func (p *peakLive) add(ev *trace.Event) {
	switch ev.Op {
	case trace.OpMalloc:
		if ev.Kind.OnDevice() {
			if n, dup := p.sizes.Ref(ev.Addr); !dup {
				*n = ev.Size
				p.live.add(ev.Size)
				p.peak = max(p.peak, p.live.sat())
			}
		}
	case trace.OpFreeRequested, trace.OpFree:
		if n, ok := p.sizes.Take(ev.Addr); ok {
			p.live.sub(n)
		}
	}
}

// splitGroups splits the indices of cfgs into jobs groups of about equal
// work: each config, heaviest first, to the group with the least work so
// far (the lowest-numbered among equals), in the order of cfgs within a
// group. A clairvoyant planner (policies.Planner: offline, greedy-by-size,
// greedy-by-lifetime) searches over the whole trace and weighs as much as
// all the configs that are none (on kv_decode offline takes 6.9 s, a
// replay 0.1 to 0.3 s), so that the planners spread over the groups first
// and the replays fill around them (round robin put offline and
// greedy-by-lifetime with workspace in one group of two: 11.5 s of 17.5 s
// sequential for replay sim --policy all). The results do not depend on
// the grouping.
func splitGroups(cfgs []Config, jobs int) [][]int {
	planner := make([]bool, len(cfgs))
	others := 0
	for k, c := range cfgs {
		in, ok := policies.Lookup(c.Policy)
		planner[k] = ok && in.Abilities.Planner && c.NewPolicy == nil
		if !planner[k] {
			others++
		}
	}
	weight := func(k int) int {
		if planner[k] {
			return others + 1
		}
		return 1
	}
	order := make([]int, len(cfgs))
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool { return weight(order[a]) > weight(order[b]) })
	groups := make([][]int, jobs)
	work := make([]int, jobs)
	for _, k := range order {
		g := 0
		for h := range work {
			if work[h] < work[g] {
				g = h
			}
		}
		groups[g] = append(groups[g], k)
		work[g] += weight(k)
	}
	for _, g := range groups {
		sort.Ints(g)
	}
	return groups
}

// plan hands the whole trace to the policies that must see it before the
// replay (policies.Planner, such as offline): it reads src to the end, calls
// each such policy's Plan and returns a source over the events read. When
// no policy is a Planner it returns src as is, and the replay streams.
func plan(src trace.Source, reps []*Replay) (trace.Source, error) {
	var planners []*Replay
	for _, rep := range reps {
		if _, ok := rep.policy.(policies.Planner); ok {
			planners = append(planners, rep)
		}
	}
	if len(planners) == 0 {
		return src, nil
	}
	var evs []trace.Event
	if ss, ok := src.(*trace.SliceSource); ok {
		evs = ss.Rest() // read only: no copy
	} else {
		var err error
		if evs, err = trace.ReadAll(src); err != nil {
			return nil, err
		}
	}
	planned := withoutDirect(evs)
	for _, rep := range planners {
		if err := rep.policy.(policies.Planner).Plan(planned); err != nil {
			return nil, fmt.Errorf("policy %s: plan: %w", rep.policy.Name(), err)
		}
	}
	return trace.NewSliceSource(src.Header(), evs).WithStacks(trace.StacksOf(src)), nil
}

// withoutDirect returns evs without the mallocs that go around the policy
// (trace.IsDirect: directMalloc) and their frees, which a Planner must
// not plan for; evs itself when it has none.
func withoutDirect(evs []trace.Event) []trace.Event {
	first := -1
	for i := range evs {
		if ev := &evs[i]; ev.Op == trace.OpMalloc && trace.IsDirect(ev.Kind, ev.Label) {
			first = i
			break
		}
	}
	if first < 0 {
		return evs
	}
	out := slices.Clone(evs[:first])
	direct := map[uint64]bool{} // live direct mallocs by address
	for _, ev := range evs[first:] {
		switch {
		case ev.Op == trace.OpMalloc && trace.IsDirect(ev.Kind, ev.Label):
			direct[ev.Addr] = true
			continue
		case (ev.Op == trace.OpFree || ev.Op == trace.OpFreeRequested) && direct[ev.Addr]:
			if ev.Op == trace.OpFree {
				delete(direct, ev.Addr)
			}
			continue
		}
		out = append(out, ev)
	}
	return out
}

// seriesPoints is MaxSeriesPoints, a variable so that a test can make
// short traces fill a series.
var seriesPoints = MaxSeriesPoints

// SeriesBuilder downsamples a per-event series to at most MaxSeriesPoints
// points without knowing the trace's length: each point covers a run of
// events; when the points run out, neighbours are merged and the runs
// double. The zero value is ready to use. Package gpu shares it.
type SeriesBuilder struct {
	pts   []Point
	width int64 // events per point; 0 means 1
	cur   Point
	n     int64 // events in cur
	// evFrag is the fragmented bytes of the event being folded in,
	// peakFrag the most of any event, atPeak those of the event that took
	// the reserved bytes to their peak; allocAtPeak is the most bytes
	// allocated while the reserved bytes held their peak.
	evFrag, peakFrag, atPeak, allocAtPeak uint64
}

// Add folds event i, at time t (ns), with its requested, allocated and
// reserved bytes into the current point, and reports whether the point is
// full and must be closed with Close.
func (s *SeriesBuilder) Add(i, t int64, req, alloc, res uint64) bool {
	s.cur.Reserved = max(s.cur.Reserved, res)
	return s.addLive(i, t, req, alloc)
}

// addLive is Add for an event after which the reserved bytes are those
// folded into the open point already (it holds events): only its live
// bytes can raise the point's figures.
func (s *SeriesBuilder) addLive(i, t int64, req, alloc uint64) bool {
	s.cur.Event, s.cur.Time = i, t
	s.foldLive(req, alloc)
	s.n++
	return s.n >= max(s.width, 1)
}

// foldLive folds req bytes requested and alloc allocated into the current
// point.
func (s *SeriesBuilder) foldLive(req, alloc uint64) {
	s.cur.Requested = max(s.cur.Requested, req)
	s.cur.Allocated = max(s.cur.Allocated, alloc)
}

// expect sets the points' width for a series of n events to the one
// that merging reaches by their end, before the builder holds any point,
// so that no point is merged on the way: the points are the same, since
// each covers the same run of events either way (the runs are aligned:
// points merge in pairs, and only when seriesPoints of them are held), and
// a merged point is the fold of its two. The points are allocated at
// once. It does nothing for n <= 0, a builder in use, or an odd
// seriesPoints (whose merge drops the last point).
func (s *SeriesBuilder) expect(n int64) {
	p := int64(seriesPoints)
	if n <= 0 || s.n != 0 || len(s.pts) != 0 || s.width > 1 || p%2 != 0 {
		return
	}
	events := n
	w, held := int64(1), int64(0)
	for held+n/w >= p {
		// The point that fills the series closes, and the points merge.
		n -= (p - held) * w
		held, w = p/2, 2*w
	}
	if n%w != 0 && held+n/w+1 == p {
		w *= 2 // Finish closes the last point, which fills the series
	}
	s.width = w
	s.pts = make([]Point, 0, (events+w-1)/w)
}

// stillAtPeak folds in the bytes allocated, alloc, after an event that did
// not raise the peak reserved bytes (res's), with reserved reserved: while
// the reserved bytes are at their peak, the most allocated, whose idle
// share Finish gives as res's IdleAtPeak (the share at its least).
func (s *SeriesBuilder) stillAtPeak(res *Result, alloc, reserved uint64) {
	if reserved == res.PeakReserved {
		s.allocAtPeak = max(s.allocAtPeak, alloc)
	}
}

// Footprint folds the device's footprint in bytes after the event that
// the next Add (or Observe) folds in into the current point.
func (s *SeriesBuilder) Footprint(f uint64) { s.cur.Footprint = max(s.cur.Footprint, f) }

// Instant folds into the current point the requested, allocated and
// reserved bytes of an instant within the event that the next Observe
// folds in (a failed malloc that the replay served, its block held for an
// instant), so that the series shows the peaks the result counts.
func (s *SeriesBuilder) Instant(req, alloc, res uint64) {
	s.cur.Requested = max(s.cur.Requested, req)
	s.cur.Allocated = max(s.cur.Allocated, alloc)
	s.cur.Reserved = max(s.cur.Reserved, res)
}

// Fragmented folds into the current point the fragmentation of the event
// that the next Observe folds in: its fragmented bytes (the free reserved
// bytes that could not serve a malloc, Result.PeakFragmentation's
// definition), of the reserved bytes before the malloc.
func (s *SeriesBuilder) Fragmented(bytes, reserved uint64) {
	s.evFrag = bytes
	s.peakFrag = max(s.peakFrag, bytes)
	s.cur.Fragmentation = max(s.cur.Fragmentation, float64(bytes)/float64(reserved))
}

// atNewPeak notes that the event being folded in took the reserved bytes
// to a new peak, with alloc bytes allocated.
func (s *SeriesBuilder) atNewPeak(alloc uint64) {
	s.atPeak, s.allocAtPeak = s.evFrag, alloc
}

// Open reports whether the current point holds events not yet closed.
func (s *SeriesBuilder) Open() bool { return s.n > 0 }

// Close ends the current point with the idle share (1 - allocated /
// reserved) and external fragmentation at its last event.
func (s *SeriesBuilder) Close(idle, ext float64) {
	s.cur.Idle, s.cur.External = idle, ext
	s.pts = append(s.pts, s.cur)
	s.cur, s.n = Point{}, 0
	if len(s.pts) < seriesPoints {
		return
	}
	half := s.pts[:0]
	for k := 0; k+1 < len(s.pts); k += 2 {
		a, b := s.pts[k], s.pts[k+1]
		b.Requested = max(a.Requested, b.Requested)
		b.Allocated = max(a.Allocated, b.Allocated)
		b.Reserved = max(a.Reserved, b.Reserved)
		b.Footprint = max(a.Footprint, b.Footprint)
		b.Fragmentation = max(a.Fragmentation, b.Fragmentation)
		half = append(half, b)
	}
	s.pts = half
	s.width = 2 * max(s.width, 1)
}

// Points returns the closed points. The slice is the builder's own.
func (s *SeriesBuilder) Points() []Point { return s.pts }

// Observe folds event i, at time t (ns), with the live requested,
// allocated and reserved bytes after it, into the series and into res's
// peak reserved bytes, the bytes allocated at that peak (the most while
// the reserved bytes are at their peak, for Finish's idle share there)
// and the fragmented bytes of the event that reached it (those given to
// Fragmented since the last Observe, else 0). A point that fills is
// closed with the idle share at
// the event and the external fragmentation of policy p's free space (0 if
// p does not report it).
func (s *SeriesBuilder) Observe(res *Result, p policies.Policy, i, t int64, req, alloc, reserved uint64) {
	if reserved > res.PeakReserved {
		res.PeakReserved = reserved
		res.PeakReservedEvent = i
		s.atNewPeak(alloc)
	} else {
		s.stillAtPeak(res, alloc, reserved)
	}
	s.evFrag = 0
	if s.Add(i, t, req, alloc, reserved) {
		s.closeAt(p, alloc, reserved)
	}
}

// Finish closes the open point, if any, as Observe does, and sets res's
// series, its most fragmented bytes, the idle share at its peak reserved
// bytes (its least there) and, over those bytes, its peak fragmentation
// and the fragmentation at that peak.
func (s *SeriesBuilder) Finish(res *Result, p policies.Policy, alloc, reserved uint64) {
	if s.Open() {
		s.closeAt(p, alloc, reserved)
	}
	res.Series = s.Points()
	res.IdleAtPeak = idle(s.allocAtPeak, res.PeakReserved)
	res.PeakFragmentedBytes = s.peakFrag
	if res.PeakReserved > 0 {
		res.PeakFragmentation = float64(s.peakFrag) / float64(res.PeakReserved)
		res.FragmentationAtPeak = float64(s.atPeak) / float64(res.PeakReserved)
	}
}

func (s *SeriesBuilder) closeAt(p policies.Policy, alloc, reserved uint64) {
	var ext float64
	if fs, ok := p.(policies.FreeSpacer); ok {
		if total, largest := fs.FreeSpace(); total > 0 {
			ext = 1 - float64(largest)/float64(total)
		}
	}
	s.Close(idle(alloc, reserved), ext)
}

// Live reports whether the trace's allocation at addr is live in the
// replay (made and not freed, whether its malloc succeeded or not).
func (r *Replay) Live(addr uint64) bool {
	_, ok := r.live.Get(addr)
	return ok
}
