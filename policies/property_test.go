package policies_test

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

// The property test drives every registered policy (policies.Names(), so
// that a policy added later is covered without a change here) with random
// valid traces, several streams, frees on other streams, frees requested
// before they complete, synchronizations, CUDA events, empty_cache,
// failed mallocs, iteration markers and host memory, sometimes under a
// capacity, replayed by sim.Run with the invariant checker on (sim.Checker:
// no overlapping blocks, none handed out twice, every block in a live
// segment, reserved bytes and free space consistent). A replay must end
// without error, and a policy with no OOM must have reserved at least the
// peak requested bytes. rapid shrinks a failing trace to a short one,
// printed in the text form.

// propertySettings are the settings the property test gives a policy:
// the defaults, but for the offline search's node budget, kept small so
// that a hundred traces plan in well under a second (the search runs all
// the same).
var propertySettings = map[string]policies.Settings{
	policies.OfflineName: {"nodes": "2000"},
}

// propertyRounds is how many times each policy's property is checked,
// each time with rapid's number of traces (-rapid.checks, 100 by default)
// from a new seed: about a thousand traces a policy, a fraction of a
// second each; enough to catch each of the off-by-one bugs planted in
// the policies' merges (see the commit that added this test).
func propertyRounds() int {
	if testing.Short() {
		return 2
	}
	return 10
}

func TestPropertyAllPolicies(t *testing.T) {
	for _, name := range policies.Names() {
		t.Run(name, func(t *testing.T) {
			for r := 0; r < propertyRounds() && !t.Failed(); r++ {
				rapid.Check(t, func(t *rapid.T) { checkPolicyProperty(t, name) })
			}
		})
	}
}

// checkPolicyProperty replays one random trace against the policy name.
func checkPolicyProperty(t *rapid.T, name string) {
	evs := genTrace(t)
	capacity := uint64(0)
	if rapid.IntRange(0, 3).Draw(t, "capped") == 0 {
		capacity = uint64(rapid.IntRange(16, 1024).Draw(t, "capacityMiB")) << 20
	}
	if capacity > 0 {
		// A policy that preallocates (rmm-binning's bins) may not fit
		// under a small capacity at all: then replay it unlimited.
		if _, err := policies.New(name, sim.NewDevice(capacity), propertySettings[name]); errors.Is(err, policies.ErrOutOfMemory) {
			capacity = 0
		}
	}
	if errs, err := trace.Validate(trace.NewSliceSource(trace.Header{}, evs), 1); err != nil || len(errs) > 0 {
		t.Fatalf("the generator made an invalid trace: %v %v", errs, err)
	}
	cfg := sim.Config{Trace: "random", Policy: name, Settings: propertySettings[name], Capacity: capacity, Check: true}
	rs, err := sim.Run(trace.NewSliceSource(trace.Header{Source: "text"}, evs), cfg)
	if err != nil {
		var ce *sim.CheckError
		if errors.As(err, &ce) {
			t.Fatalf("capacity %d: %v\ntrace:\n%s", capacity, err, traceText(evs, ce.Event))
		}
		t.Fatalf("capacity %d: %v\ntrace:\n%s", capacity, err, traceText(evs, -1))
	}
	r := rs[0]
	if r.OOMs == 0 && r.PeakReserved < r.PeakRequested {
		t.Fatalf("peak reserved %d < peak requested %d with no OOM\ntrace:\n%s", r.PeakReserved, r.PeakRequested, traceText(evs, -1))
	}
}

// genTrace draws a valid trace of up to a few hundred events.
func genTrace(t *rapid.T) []trace.Event {
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
			size := genSize(t)
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
			emit(trace.Event{Op: trace.OpMalloc, Addr: next, Size: genSize(t), Stream: s, Kind: kind})
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
				emit(trace.Event{Op: trace.OpMallocFailed, Size: genSize(t), Stream: stream("failedStream")})
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

// genSize draws a request size: mostly small and odd, some around the
// size classes and segment sizes of the policies (1 MiB, 2 MiB, 20 MiB),
// a few large.
func genSize(t *rapid.T) uint64 {
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

// traceText formats evs in the text form, one numbered event a line,
// marking event mark (-1 for none).
func traceText(evs []trace.Event, mark int64) string {
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
