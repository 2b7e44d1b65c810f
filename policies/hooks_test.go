package policies_test

import (
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
)

// This file holds a driver like driveSimple that also passes on what the
// engine passes on to the optional abilities: synchronizations and events
// (Syncer), markers (Marker) and the trace's peak requested bytes (Hinter).

// hookCase is a hand-worked replay through driveHooks.
type hookCase struct {
	simpleCase
	// hint, when not 0, is given to a Hinter before the first event.
	hint uint64
}

// driveHooks replays the text-form trace text against the policy named name
// on a simulated device of capacity bytes, as driveSimple does, and also
// calls the policy's Syncer on synchronizations and event ops, its Marker
// on markers and, when hint is not 0, its Hinter before the first event.
func driveHooks(t testing.TB, name string, s policies.Settings, capacity, hint uint64, text string) simpleRun {
	t.Helper()
	_, evs, err := trace.ParseText(name, strings.NewReader(text))
	if err != nil {
		t.Fatalf("ParseText: %v", err)
	}
	dev := sim.NewDevice(capacity)
	p, err := policies.New(name, dev, s)
	if err != nil {
		t.Fatalf("New(%q, %v): %v", name, s, err)
	}
	if h, ok := p.(policies.Hinter); ok && hint != 0 {
		h.Hint(hint)
	}
	run := simpleRun{dev: dev, policy: p}
	sy, _ := p.(policies.Syncer)
	live := map[uint64]policies.Block{}
	for i, ev := range evs {
		switch ev.Op {
		case trace.OpMalloc:
			b, err := p.Malloc(ev.Size, ev.Stream)
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("event %d: malloc of %d bytes: %v", i, ev.Size, err)
				}
				run.ooms = append(run.ooms, i)
				continue
			}
			live[ev.Addr] = b
			run.blocks = append(run.blocks, b)
		case trace.OpFree:
			b, ok := live[ev.Addr]
			if !ok {
				continue
			}
			delete(live, ev.Addr)
			if err := p.Free(b.Addr, ev.Stream); err != nil {
				t.Fatalf("event %d: free of %#x: %v", i, b.Addr, err)
			}
		case trace.OpEmptyCache:
			if r, ok := p.(policies.Releaser); ok {
				if err := r.EmptyCache(); err != nil {
					t.Fatalf("event %d: empty_cache: %v", i, err)
				}
			}
		case trace.OpMarker:
			if m, ok := p.(policies.Marker); ok {
				if err := m.Mark(ev.Label); err != nil {
					t.Fatalf("event %d: marker: %v", i, err)
				}
			}
		case trace.OpStreamSync:
			if sy != nil {
				sy.StreamSync(ev.Stream)
			}
		case trace.OpDeviceSync:
			if sy != nil {
				sy.DeviceSync()
			}
		case trace.OpEventRecord:
			if sy != nil {
				sy.EventRecord(ev.Addr, ev.Stream)
			}
		case trace.OpStreamWaitEvent:
			if sy != nil {
				sy.StreamWaitEvent(ev.Stream, ev.Addr)
			}
		case trace.OpEventSync:
			if sy != nil {
				sy.EventSync(ev.Addr)
			}
		}
	}
	return run
}

// runHookCases replays each case through driveHooks and compares every
// recorded figure, as runSimpleCases does.
func runHookCases(t *testing.T, cases []hookCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkSimpleRun(t, driveHooks(t, tc.policy, tc.settings, tc.capacity, tc.hint, tc.trace), tc.simpleCase)
		})
	}
}

// tilingChecker is implemented, in tests, by the policies of this file's
// neighbours (hooks_export_test.go): a check of their own records.
type tilingChecker interface {
	CheckTiling() error
}

// hooked wraps simple cases for runHookCases, with no hint.
func hooked(cs ...simpleCase) []hookCase {
	hs := make([]hookCase, len(cs))
	for i, c := range cs {
		hs[i] = hookCase{simpleCase: c}
	}
	return hs
}

// checkHookInvariants is checkInvariants with several streams: it replays a
// few thousand random mallocs and frees on three streams (a free on the
// malloc's stream mostly, on another one sometimes), stream, device and
// event synchronizations, event records and waits, iteration markers and
// the odd empty_cache, and checks the layout after each (see checkLayout).
// A hint of 0 is not given.
func checkHookInvariants(t *testing.T, name string, s policies.Settings, capacity, hint uint64, exact bool) {
	t.Helper()
	dev := trackPages(sim.NewDevice(capacity))
	p, err := policies.New(name, dev, s)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := p.(policies.Hinter); ok && hint != 0 {
		h.Hint(hint)
	}
	sy, _ := p.(policies.Syncer)
	mk, _ := p.(policies.Marker)
	rng := rand.New(rand.NewSource(3))
	type liveBlock struct {
		b      policies.Block
		stream uint64
	}
	var live []liveBlock
	var blocks []policies.Block
	ooms := 0
	event := uint64(0)
	for op := range 6000 {
		stream := uint64(rng.Intn(3))
		switch r := rng.Intn(1000); {
		case r < 5:
			if rel, ok := p.(policies.Releaser); ok {
				if err := rel.EmptyCache(); err != nil {
					t.Fatalf("op %d: EmptyCache: %v", op, err)
				}
			}
		case r < 25 && sy != nil:
			sy.StreamSync(stream)
		case r < 30 && sy != nil:
			sy.DeviceSync()
		case r < 50 && sy != nil:
			event++
			sy.EventRecord(event, stream)
		case r < 70 && sy != nil && event > 0:
			sy.StreamWaitEvent(stream, 1+uint64(rng.Intn(int(event))))
		case r < 80 && sy != nil && event > 0:
			sy.EventSync(1 + uint64(rng.Intn(int(event))))
		case r < 90 && mk != nil:
			if err := mk.Mark("iteration"); err != nil {
				t.Fatalf("op %d: Mark: %v", op, err)
			}
		case r < 500 && len(live) > 0:
			i := rng.Intn(len(live))
			lb := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			if rng.Intn(4) != 0 {
				stream = lb.stream
			}
			if err := p.Free(lb.b.Addr, stream); err != nil {
				t.Fatalf("op %d: free of %#x on stream %d: %v", op, lb.b.Addr, stream, err)
			}
		default:
			size := randomSize(rng)
			b, err := p.Malloc(size, stream)
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("op %d: malloc of %d bytes: %v", op, size, err)
				}
				ooms++
				continue
			}
			if b.Size < size {
				t.Fatalf("op %d: malloc of %d bytes gave a block of %d", op, size, b.Size)
			}
			if size > 0 {
				live = append(live, liveBlock{b, stream})
			}
		}
		blocks = blocks[:0]
		for _, lb := range live {
			blocks = append(blocks, lb.b)
		}
		checkLayout(t, op, dev, p, blocks, exact)
		if c, ok := p.(tilingChecker); ok {
			if err := c.CheckTiling(); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
		}
	}
	var retries int64
	if c, ok := p.(policies.Counter); ok {
		retries = c.Retries()
	}
	t.Logf("%d live blocks at the end, %d OOMs, %d retries, %d device allocs, %d device frees, peak %d MiB",
		len(live), ooms, retries, dev.Allocs(), dev.Frees(), dev.PeakReserved()/sMiB)
}
