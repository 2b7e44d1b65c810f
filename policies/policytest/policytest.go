// Package policytest is the conformance kit of an allocator policy, in
// the manner of testing/fstest: Run holds a registered policy, built in or
// registered by another module (policies.Register), to what the replay
// engine relies on, so that a researcher's policy is checked the way the
// built-in ones are.
//
//	func TestSegFit(t *testing.T) { policytest.Run(t, "segfit", nil) }
//
// What it checks, each a subtest:
//
//   - info: the registry entry (policies.Lookup) is whole: a design line, a
//     doc line for every setting, and the built policy's Name is its
//     registry name;
//   - settings: an unknown setting key is refused with an error naming the
//     key, and the documented defaults (Info.Defaults) place a trace
//     exactly as no settings do;
//   - property: random valid traces (several streams, frees on other
//     streams, frees requested before they complete, synchronizations, CUDA
//     events, empty_cache, failed mallocs, markers, host memory; a quarter
//     under a capacity) replayed by sim.Run with the invariant checker on
//     (sim.Checker: no two live blocks overlap, none is handed out twice,
//     every block lies in a live segment, reserved bytes and free space
//     agree); each replay must end without error, and one without OOMs must
//     reserve at least the peak requested bytes. rapid shrinks a failing
//     trace, printed in the text form.
package policytest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// Options tune Run; the zero value checks with the policy's defaults.
type Options struct {
	// Settings are given to the policy in every replay (a search budget
	// kept small, say); nil for none.
	Settings policies.Settings
	// Rounds is how many times the property is checked, each with rapid's
	// number of traces (-rapid.checks, 100 by default) from a new seed;
	// 0 means 10, or 2 under -short.
	Rounds int
}

// Run checks the policy registered as name (see the package doc); opts
// may be nil.
func Run(t *testing.T, name string, opts *Options) {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	info, ok := policies.Lookup(name)
	if !ok {
		t.Fatalf("policy %q is not registered (policies.Register in an init function of the package that defines it, which the test must import)", name)
	}
	t.Run("info", func(t *testing.T) { checkInfo(t, info, opts) })
	t.Run("settings", func(t *testing.T) { checkSettings(t, info, opts) })
	t.Run("property", func(t *testing.T) {
		rounds := opts.Rounds
		if rounds == 0 {
			rounds = 10
			if testing.Short() {
				rounds = 2
			}
		}
		for r := 0; r < rounds && !t.Failed(); r++ {
			rapid.Check(t, func(t *rapid.T) { Property(t, name, opts.Settings) })
		}
	})
}

func checkInfo(t *testing.T, info policies.Info, opts *Options) {
	if strings.TrimSpace(info.Design) == "" {
		t.Errorf("%s: no Design line (the allocator it follows, and its source where it copies one)", info.Name)
	}
	for _, s := range info.Settings {
		if strings.TrimSpace(s.Doc) == "" {
			t.Errorf("%s: setting %q has no Doc", info.Name, s.Key)
		}
	}
	p, err := policies.New(info.Name, sim.NewDevice(0), opts.Settings)
	if err != nil {
		t.Fatalf("%s: does not build: %v", info.Name, err)
	}
	if p.Name() != info.Name {
		t.Errorf("built policy names itself %q, registered as %q", p.Name(), info.Name)
	}
}

func checkSettings(t *testing.T, info policies.Info, opts *Options) {
	const bogus = "no-such-key-of-policytest"
	s := policies.Settings{bogus: "1"}
	for k, v := range opts.Settings {
		s[k] = v
	}
	if _, err := policies.New(info.Name, sim.NewDevice(0), s); err == nil || !strings.Contains(err.Error(), bogus) {
		t.Errorf("%s: an unknown setting %q: error %v, want one naming the key (policies.Settings.Check)", info.Name, bogus, err)
	}
	// The documented defaults place as no settings do.
	def := info.Defaults()
	for k, v := range opts.Settings {
		def[k] = v
	}
	evs := fixedTrace()
	run := func(s policies.Settings) *sim.Result {
		rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "text"}, evs),
			sim.Config{Trace: "defaults", Policy: info.Name, Settings: s, Check: true})
		if err != nil {
			t.Fatalf("%s with settings %v: %v", info.Name, s, err)
		}
		return rs[0]
	}
	a, b := run(opts.Settings), run(def)
	if a.PeakReserved != b.PeakReserved || a.PeakAllocated != b.PeakAllocated || a.DeviceAllocs != b.DeviceAllocs || a.DeviceFrees != b.DeviceFrees {
		t.Errorf("%s: its documented defaults %v replay otherwise than no settings: peak reserved %d, allocated %d, %d device allocs and %d frees, against %d, %d, %d, %d",
			info.Name, def, b.PeakReserved, b.PeakAllocated, b.DeviceAllocs, b.DeviceFrees, a.PeakReserved, a.PeakAllocated, a.DeviceAllocs, a.DeviceFrees)
	}
}

// fixedTrace is a trace of 400 mallocs of sizes from bytes to 24 MiB on two
// streams, freed in another order, with an empty_cache half way.
func fixedTrace() []trace.Event {
	var evs []trace.Event
	x := uint64(88172645463325252)
	rnd := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	var live []uint64
	for i := range 400 {
		size := 1 + rnd()%(1<<(10+rnd()%15))
		addr := uint64(i + 1)
		evs = append(evs, trace.Event{Op: trace.OpMalloc, Addr: addr, Size: size, Stream: rnd() % 2, Time: int64(len(evs))})
		live = append(live, addr)
		if len(live) > 20 || rnd()%3 == 0 {
			k := int(rnd() % uint64(len(live)))
			evs = append(evs, trace.Event{Op: trace.OpFree, Addr: live[k], Time: int64(len(evs))})
			live = append(live[:k], live[k+1:]...)
		}
		if i == 200 {
			evs = append(evs, trace.Event{Op: trace.OpEmptyCache, Time: int64(len(evs))})
		}
	}
	return evs
}

// Property replays one random trace (GenTrace) against the policy name with
// settings s under the invariant checker, sometimes under a capacity, and
// fails t where the replay fails, a check fails, or a replay without OOMs
// reserved fewer bytes than its peak of requested bytes.
func Property(t *rapid.T, name string, s policies.Settings) {
	evs := GenTrace(t)
	capacity := uint64(0)
	if rapid.IntRange(0, 3).Draw(t, "capped") == 0 {
		capacity = uint64(rapid.IntRange(16, 1024).Draw(t, "capacityMiB")) << 20
	}
	if capacity > 0 {
		// A policy that preallocates (rmm-binning's bins) may not fit
		// under a small capacity at all: then replay it unlimited.
		if _, err := policies.New(name, sim.NewDevice(capacity), s); errors.Is(err, policies.ErrOutOfMemory) {
			capacity = 0
		}
	}
	if errs, err := trace.Validate(trace.NewSliceSource(trace.Header{}, evs), 1); err != nil || len(errs) > 0 {
		t.Fatalf("the generator made an invalid trace: %v %v", errs, err)
	}
	cfg := sim.Config{Trace: "random", Policy: name, Settings: s, Capacity: capacity, Check: true}
	rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "text"}, evs), cfg)
	if err != nil {
		var ce *sim.CheckError
		if errors.As(err, &ce) {
			t.Fatalf("capacity %d: %v\ntrace:\n%s", capacity, err, TraceText(evs, ce.Event))
		}
		t.Fatalf("capacity %d: %v\ntrace:\n%s", capacity, err, TraceText(evs, -1))
	}
	r := rs[0]
	if r.OOMs == 0 && r.PeakReserved < r.PeakRequested {
		t.Fatalf("peak reserved %d < peak requested %d with no OOM\ntrace:\n%s", r.PeakReserved, r.PeakRequested, TraceText(evs, -1))
	}
}

// GenTrace draws a valid trace of up to a few hundred events.
func GenTrace(t *rapid.T) []trace.Event {
	streams := rapid.IntRange(1, 4).Draw(t, "streams")
	ops := rapid.IntRange(1, 160).Draw(t, "ops")
	var evs []trace.Event
	type alloc struct {
		addr      uint64
		stream    uint64
		requested bool // a free request is out
	}
	var live []alloc
	next := uint64(1)
	nextEvent := uint64(1)
	now := int64(0)
	emit := func(ev trace.Event) {
		now += 10
		ev.Time = now
		evs = append(evs, ev)
	}
	stream := func(label string) uint64 { return uint64(rapid.IntRange(0, streams-1).Draw(t, label)) }
	free := func(i int, s uint64) {
		a := live[i]
		emit(trace.Event{Op: trace.OpFree, Addr: a.addr, Stream: s})
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
	for range ops {
		// Small ranges: rapid draws them about evenly (wide ones lean
		// to small values). Mallocs and frees 3/10 each, bursts of
		// mallocs (to fill pools and chunks) and of frees 1/10 each, the
		// rest 1/5.
		action := rapid.IntRange(0, 9).Draw(t, "action")
		if (action >= 3 && action < 6 || action == 9) && len(live) == 0 {
			action = 0
		}
		switch {
		case action == 8:
			n := rapid.IntRange(1, 80).Draw(t, "burst")
			size := GenSize(t)
			s := stream("burstStream")
			for range n {
				emit(trace.Event{Op: trace.OpMalloc, Addr: next, Size: size, Stream: s})
				live = append(live, alloc{addr: next, stream: s})
				next++
			}
		case action == 9:
			for n := rapid.IntRange(1, len(live)).Draw(t, "burstFrees"); n > 0; n-- {
				i := rapid.IntRange(0, len(live)-1).Draw(t, "burstVictim")
				free(i, live[i].stream)
			}
		case action < 3:
			kind := trace.KindDevice
			switch rapid.IntRange(0, 15).Draw(t, "kind") {
			case 1:
				kind = trace.KindAsync
			case 2:
				kind = trace.KindPinned
			case 3:
				kind = trace.KindManaged
			}
			s := stream("stream")
			emit(trace.Event{Op: trace.OpMalloc, Addr: next, Size: GenSize(t), Stream: s, Kind: kind})
			live = append(live, alloc{addr: next, stream: s})
			next++
		case action < 6:
			i := rapid.IntRange(0, len(live)-1).Draw(t, "victim")
			s := live[i].stream
			if rapid.IntRange(0, 4).Draw(t, "otherStream") == 0 {
				s = stream("freeStream")
				if s != live[i].stream {
					// As a program must (replay check): order the
					// freeing stream after the malloc's first.
					ev := nextEvent
					nextEvent++
					emit(trace.Event{Op: trace.OpEventRecord, Addr: ev, Stream: live[i].stream})
					emit(trace.Event{Op: trace.OpStreamWaitEvent, Addr: ev, Stream: s})
				}
			}
			free(i, s)
		default:
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 2 && len(live) > 0:
				// The program frees a block still in use on another
				// stream: the request now, the free later.
				i := rapid.IntRange(0, len(live)-1).Draw(t, "requested")
				if !live[i].requested {
					live[i].requested = true
					emit(trace.Event{Op: trace.OpFreeRequested, Addr: live[i].addr, Stream: live[i].stream})
				}
			case op < 4:
				emit(trace.Event{Op: trace.OpStreamSync, Stream: stream("syncStream")})
			case op < 5:
				emit(trace.Event{Op: trace.OpDeviceSync})
			case op < 7:
				ev := nextEvent
				nextEvent++
				emit(trace.Event{Op: trace.OpEventRecord, Addr: ev, Stream: stream("recordStream")})
				emit(trace.Event{Op: trace.OpStreamWaitEvent, Addr: ev, Stream: stream("waitStream")})
				if rapid.Bool().Draw(t, "eventSync") {
					emit(trace.Event{Op: trace.OpEventSync, Addr: ev})
				}
			case op < 8:
				emit(trace.Event{Op: trace.OpEmptyCache})
			case op < 9:
				emit(trace.Event{Op: trace.OpMallocFailed, Size: GenSize(t), Stream: stream("failedStream")})
			default:
				emit(trace.Event{Op: trace.OpMarker, Label: "iteration"})
			}
		}
	}
	// Free most of what is left, so that the end of a trace exercises the
	// merges too; leave the rest live.
	for len(live) > 0 && rapid.IntRange(0, 3).Draw(t, "drain") > 0 {
		i := rapid.IntRange(0, len(live)-1).Draw(t, "drainVictim")
		free(i, live[i].stream)
	}
	return evs
}

// GenSize draws a request size: mostly small and odd, some around the
// size classes and segment sizes of the policies (1 MiB, 2 MiB, 20 MiB),
// a few large.
func GenSize(t *rapid.T) uint64 {
	switch rapid.IntRange(0, 9).Draw(t, "sizeClass") {
	case 0, 1, 2:
		return uint64(rapid.IntRange(1, 4096).Draw(t, "small"))
	case 3, 4:
		return uint64(rapid.IntRange(4096, 1<<20).Draw(t, "medium"))
	case 5:
		// Near a power of two or a multiple of 512 B: the edges of
		// rounding and size classes.
		base := uint64(512) << rapid.IntRange(0, 16).Draw(t, "shift")
		return base - 1 + uint64(rapid.IntRange(0, 2).Draw(t, "edge"))
	case 6, 7:
		return uint64(rapid.IntRange(1<<20, 12<<20).Draw(t, "large"))
	case 8:
		return uint64(rapid.IntRange(12<<20, 80<<20).Draw(t, "huge"))
	default:
		return uint64(512 * rapid.IntRange(1, 64).Draw(t, "blocks512"))
	}
}

// TraceText formats evs in the text form, one numbered event a line,
// marking event mark (-1 for none).
func TraceText(evs []trace.Event, mark int64) string {
	var b strings.Builder
	for i, ev := range evs {
		m := "  "
		if int64(i) == mark {
			m = "=>"
		}
		fmt.Fprintf(&b, "%s %3d  %s\n", m, i, trace.FormatText(ev))
	}
	return b.String()
}
