package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// The pool maps 32 MiB chunks of one address range, which the simulated
// device reserves at devBase; allocations are rounded up to 512 B and
// placed first fit by address over the range. Each chunk mapped is one
// device allocation, each chunk unmapped one device free.
func TestAsyncPoolReplay(t *testing.T) {
	const chunk = 32 * sMiB
	sync := policies.Settings{"frees_complete": "at_sync"}
	with := func(kv ...string) policies.Settings {
		s := policies.Settings{"frees_complete": "at_sync"}
		for i := 0; i < len(kv); i += 2 {
			s[kv[i]] = kv[i+1]
		}
		return s
	}
	runHookCases(t, hooked(
		simpleCase{
			name:   "reuse on the same stream at once",
			policy: "async-pool",
			trace: `
malloc id=1 size=1MiB stream=1   # devBase: chunk 0 mapped
free id=1 stream=1
malloc id=2 size=1MiB stream=1   # devBase again
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase, sMiB}},
			peak:      chunk,
			allocs:    1,
			checkFree: true, freeTotal: 31 * sMiB, freeLargest: 31 * sMiB,
		},
		simpleCase{
			name:   "another stream at once: the GPU keeps up (at_once)",
			policy: "async-pool",
			trace: `
malloc id=1 size=32MiB stream=1  # chunk 0
free id=1 stream=1               # complete at once
malloc id=2 size=32MiB stream=2  # devBase: no new chunk
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase, chunk}},
			peak:   chunk,
			allocs: 1,
		},
		simpleCase{
			name:   "another stream's pending free only when it fits better than a ready block",
			policy: "async-pool",
			trace: `
malloc id=1 size=4MiB stream=1   # devBase, chunk 0
malloc id=2 size=1MiB stream=1   # devBase+4MiB
malloc id=3 size=8MiB stream=1   # devBase+5MiB
malloc id=4 size=1MiB stream=1   # devBase+13MiB
free id=1 stream=1               # pending on stream 1
stream_sync stream=1             # ready: [0, 4 MiB); chunk 0 is busy, kept
free id=3 stream=1               # pending on stream 1: [5, 13 MiB)
malloc id=5 size=3MiB stream=2   # the ready 4 MiB fits better than the pending 8 MiB: devBase
malloc id=6 size=7MiB stream=2   # the pending 8 MiB fits better than the ready rest: devBase+5MiB
`,
			blocks: []policies.Block{
				{devBase, 4 * sMiB}, {devBase + 4*sMiB, sMiB}, {devBase + 5*sMiB, 8 * sMiB}, {devBase + 13*sMiB, sMiB},
				{devBase, 3 * sMiB}, {devBase + 5*sMiB, 7 * sMiB},
			},
			peak:   chunk,
			allocs: 1,
		},
		simpleCase{
			name:     "at_sync: another stream after a stream synchronize",
			policy:   "async-pool",
			settings: sync,
			trace: `
malloc id=1 size=1MiB stream=1   # chunk 0 at devBase
malloc id=2 size=31MiB stream=1  # devBase+1MiB: chunk 0 is full
free id=1 stream=1               # pending on stream 1
malloc id=3 size=1MiB stream=2   # stream 2 may not reuse it yet: devBase+32MiB, chunk 1
stream_sync stream=1             # the free is complete; no chunk is idle
malloc id=4 size=1MiB stream=2   # now stream 2 reuses it: devBase
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, 31 * sMiB}, {devBase + chunk, sMiB}, {devBase, sMiB},
			},
			peak:      2 * chunk,
			allocs:    2,
			checkFree: true, freeTotal: 31 * sMiB, freeLargest: 31 * sMiB,
		},
		simpleCase{
			name:     "at_sync: another stream after an event dependency",
			policy:   "async-pool",
			settings: sync,
			trace: `
malloc id=1 size=32MiB stream=1     # A at devBase, chunk 0
free id=1 stream=1                  # pending on stream 1 (its first free)
event_record event=7 stream=1       # event 7 is ordered after that free
malloc id=2 size=32MiB stream=2     # stream 2 is not: B at devBase+32MiB, chunk 1
stream_wait_event stream=2 event=7  # now it is
malloc id=3 size=32MiB stream=2     # no free of its own: A, devBase
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase, chunk}},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:   "best fit: a stream's own pending frees first, then another's",
			policy: "async-pool",
			trace: `
malloc id=1 size=2MiB stream=1   # devBase
malloc id=2 size=1MiB stream=1   # devBase+2MiB
malloc id=3 size=1MiB stream=2   # devBase+3MiB
malloc id=4 size=1MiB stream=2   # devBase+4MiB
free id=1 stream=1               # 2 MiB pending on stream 1
free id=3 stream=2               # 1 MiB pending on stream 2
malloc id=5 size=1MiB stream=1   # its own first: devBase, not stream 2's exact fit
malloc id=6 size=1MiB stream=2   # its own: devBase+3MiB
malloc id=7 size=1MiB stream=2   # none of its own: stream 1's rest, devBase+1MiB, before the ready rest of the chunk
`,
			blocks: []policies.Block{
				{devBase, 2 * sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 3*sMiB, sMiB}, {devBase + 4*sMiB, sMiB},
				{devBase, sMiB}, {devBase + 3*sMiB, sMiB}, {devBase + sMiB, sMiB},
			},
			peak:   chunk,
			allocs: 1,
		},
		simpleCase{
			name:   "best fit among ready blocks, the oldest free first",
			policy: "async-pool",
			trace: `
malloc id=1 size=4MiB stream=1   # devBase
malloc id=2 size=1MiB stream=1   # devBase+4MiB
malloc id=3 size=2MiB stream=1   # devBase+5MiB
malloc id=4 size=1MiB stream=1   # devBase+7MiB
malloc id=5 size=2MiB stream=1   # devBase+8MiB
malloc id=6 size=1MiB stream=1   # devBase+10MiB
free id=5 stream=1               # 2 MiB at devBase+8MiB, pending
free id=3 stream=1               # 2 MiB at devBase+5MiB, pending, newer
free id=1 stream=1               # 4 MiB at devBase, pending, newest
stream_sync stream=1             # all ready; no chunk idle
malloc id=7 size=2MiB stream=1   # best fit: the two 2 MiB blocks, the older first: devBase+8MiB
malloc id=8 size=2MiB stream=1   # devBase+5MiB
malloc id=9 size=1MiB stream=1   # the 4 MiB block (the range's rest is larger): devBase
`,
			blocks: []policies.Block{
				{devBase, 4 * sMiB}, {devBase + 4*sMiB, sMiB}, {devBase + 5*sMiB, 2 * sMiB}, {devBase + 7*sMiB, sMiB},
				{devBase + 8*sMiB, 2 * sMiB}, {devBase + 10*sMiB, sMiB},
				{devBase + 8*sMiB, 2 * sMiB}, {devBase + 5*sMiB, 2 * sMiB}, {devBase, sMiB},
			},
			peak:   chunk,
			allocs: 1,
		},
		simpleCase{
			name:     "at_sync: an event recorded before the free orders nothing",
			policy:   "async-pool",
			settings: sync,
			trace: `
malloc id=1 size=32MiB stream=1     # A at devBase, chunk 0
event_record event=1 stream=1       # before the free
free id=1 stream=1
stream_wait_event stream=2 event=1
malloc id=2 size=32MiB stream=2     # not ordered after the free: B at devBase+32MiB, chunk 1
event_record event=2 stream=1       # after the free
event_sync event=2                  # the host sees the free complete: chunk 0 idle, over threshold 0: unmapped
malloc id=3 size=32MiB stream=2     # devBase, chunk 0 mapped again
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase, chunk}},
			peak:   2 * chunk,
			allocs: 3,
			frees:  1,
		},
		simpleCase{
			name:   "release threshold 0: back at a synchronize ordered after the free",
			policy: "async-pool",
			trace: `
malloc id=1 size=64MiB stream=1   # chunks 0 and 1
free id=1 stream=1                # reusable at once, but not known complete to the host
stream_sync stream=2              # not ordered after the free: nothing goes back
stream_sync stream=1              # both chunks go back
malloc id=2 size=1MiB stream=1    # devBase: chunk 0 mapped again
free id=2 stream=1
device_sync                       # back
`,
			blocks:    []policies.Block{{devBase, 2 * chunk}, {devBase, sMiB}},
			peak:      2 * chunk,
			allocs:    3,
			frees:     3,
			checkFree: true,
		},
		simpleCase{
			name:     "a larger threshold keeps whole chunks, the lowest",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "40MiB"},
			trace: `
malloc id=1 size=32MiB stream=1   # chunk 0
malloc id=2 size=32MiB stream=1   # chunk 1
malloc id=3 size=32MiB stream=1   # chunk 2
free id=1 stream=1
free id=2 stream=1
free id=3 stream=1
stream_sync stream=1              # 96 MiB idle, over 40 MiB: chunks 2, then 1 go back; 32 MiB <= 40 MiB
malloc id=4 size=1MiB stream=2    # devBase, in chunk 0
`,
			blocks: []policies.Block{
				{devBase, chunk}, {devBase + chunk, chunk}, {devBase + 2*chunk, chunk}, {devBase, sMiB},
			},
			peak:      3 * chunk,
			allocs:    3,
			frees:     2,
			checkFree: true, freeTotal: 31 * sMiB, freeLargest: 31 * sMiB,
		},
		simpleCase{
			name:     "release_threshold=max keeps everything",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "max"},
			trace: `
malloc id=1 size=64MiB stream=1   # chunks 0 and 1
free id=1 stream=1
stream_sync stream=1              # complete, kept
malloc id=2 size=1MiB stream=2    # devBase
`,
			blocks: []policies.Block{{devBase, 2 * chunk}, {devBase, sMiB}},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "at_sync: pending frees of one stream merge",
			policy:   "async-pool",
			settings: sync,
			trace: `
malloc id=1 size=1MiB stream=1   # devBase
malloc id=2 size=1MiB stream=1   # devBase+1MiB
malloc id=3 size=30MiB stream=1  # devBase+2MiB: chunk 0 is full
free id=1 stream=1
free id=2 stream=1               # merges with id 1's block: 2 MiB pending on stream 1
malloc id=4 size=2MiB stream=1   # devBase
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 2*sMiB, 30 * sMiB}, {devBase, 2 * sMiB},
			},
			peak:   chunk,
			allocs: 1,
		},
		simpleCase{
			name:   "512-byte steps; an allocation straddles into the next chunk",
			policy: "async-pool",
			trace: `
malloc id=1 size=1         # 512 B at devBase: chunk 0
malloc id=2 size=513       # 1024 B at devBase+512
malloc id=3 size=20MiB     # devBase+1536
malloc id=4 size=33554433  # 32 MiB+512 B at devBase+20MiB+1536, up to devBase+52MiB+2048: chunk 1
                           # mapped, 64 MiB in all (measured: 67108864)
`,
			blocks: []policies.Block{
				{devBase, 512}, {devBase + 512, 1024}, {devBase + 1536, 20 * sMiB}, {devBase + 20*sMiB + 1536, chunk + 512},
			},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "granularity",
			policy:   "async-pool",
			settings: policies.Settings{"granularity": "2MiB"},
			trace: `
malloc id=1 size=3MiB   # chunks 0 and 1 of 2 MiB at devBase
malloc id=2 size=1MiB   # the rest of chunk 1: devBase+3MiB
`,
			blocks: []policies.Block{{devBase, 3 * sMiB}, {devBase + 3*sMiB, sMiB}},
			peak:   4 * sMiB,
			allocs: 2,
		},
		simpleCase{
			name:   "an idle chunk moves rather than the pool grow",
			policy: "async-pool",
			trace: `
malloc id=1 size=32MiB   # chunk 0
malloc id=2 size=32MiB   # chunk 1
free id=1                # chunk 0 idle, kept: no synchronize
malloc id=3 size=64MiB   # too big for chunk 0's 32 MiB: devBase+64MiB, chunks 2 and 3; chunk 0's
                         # memory is unmapped and mapped as chunk 2, chunk 3 is new: 96 MiB reserved
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase + 2*chunk, 2 * chunk}},
			peak:   3 * chunk,
			allocs: 4,
			frees:  1,
		},
		simpleCase{
			name:     "at_sync: an internal dependency when the device refuses",
			policy:   "async-pool",
			settings: sync,
			capacity: 2 * chunk,
			trace: `
malloc id=1 size=32MiB stream=1   # 0: A at devBase, chunk 0
malloc id=2 size=32MiB stream=2   # 1: B at devBase+32MiB, chunk 1; the device is full
free id=1 stream=1                # 2: pending on stream 1: chunk 0 is not idle
malloc id=3 size=32MiB stream=2   # 3: not ordered after it; chunk 2 is refused: stream 2 waits for
                                  #    stream 1 and takes A
malloc id=4 size=1MiB stream=2    # 4: chunk 2 refused, nothing pending: OOM
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase, chunk}},
			ooms:   []int{4},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "at_sync: no internal dependencies",
			policy:   "async-pool",
			settings: with("reuse_allow_internal_dependencies", "false"),
			capacity: 2 * chunk,
			trace: `
malloc id=1 size=32MiB stream=1   # 0: A at devBase
malloc id=2 size=32MiB stream=2   # 1: B at devBase+32MiB
free id=1 stream=1                # 2: pending on stream 1
malloc id=3 size=32MiB stream=2   # 3: chunk 2 refused, A not reusable: OOM
malloc id=4 size=1MiB stream=2    # 4: OOM
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}},
			ooms:   []int{3, 4},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "at_sync: no event dependencies",
			policy:   "async-pool",
			settings: with("reuse_follow_event_dependencies", "false"),
			trace: `
malloc id=1 size=32MiB stream=1
free id=1 stream=1
event_record event=1 stream=1
stream_wait_event stream=2 event=1
malloc id=2 size=32MiB stream=2   # the wait does not count: B at devBase+32MiB
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "empty_cache: a device synchronize and a trim to 0",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "max"},
			trace: `
malloc id=1 size=1MiB stream=1
free id=1 stream=1   # not known complete: no synchronize yet
empty_cache          # complete, and back whatever the threshold
`,
			blocks:    []policies.Block{{devBase, sMiB}},
			peak:      chunk,
			allocs:    1,
			frees:     1,
			checkFree: true,
		},
		simpleCase{
			name:   "size 0",
			policy: "async-pool",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	))
}

func TestAsyncPoolSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"async-pool", policies.Settings{"release_threshold": "lots"}, "release_threshold"},
		{"async-pool", policies.Settings{"granularity": "1MiB"}, "granularity"},
		{"async-pool", policies.Settings{"granularity": "0"}, "granularity"},
		{"async-pool", policies.Settings{"granularity": "x"}, "granularity"},
		{"async-pool", policies.Settings{"alignment": "3"}, "alignment"},
		{"async-pool", policies.Settings{"alignment": "4MiB"}, "alignment"},
		{"async-pool", policies.Settings{"reuse_follow_event_dependencies": "x"}, "reuse_follow_event_dependencies"},
		{"async-pool", policies.Settings{"reuse_allow_internal_dependencies": "x"}, "reuse_allow_internal_dependencies"},
		{"async-pool", policies.Settings{"reuse_allow_opportunistic": "false"}, "reuse_allow_opportunistic"},
		{"async-pool", policies.Settings{"frees_complete": "later"}, "frees_complete"},
	})
}

func TestAsyncPoolInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"release_threshold": "max"},
		{"release_threshold": "100MiB", "granularity": "2MiB", "alignment": "256"},
		{"reuse_follow_event_dependencies": "false", "reuse_allow_internal_dependencies": "false"},
		{"frees_complete": "at_sync"},
		{"frees_complete": "at_sync", "release_threshold": "max", "granularity": "4MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkHookInvariants(t, "async-pool", s, 256*sMiB, 0, true)
		})
	}
}

func TestAsyncPoolFreeUnknown(t *testing.T) {
	r := driveHooks(t, "async-pool", nil, 0, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 512, devBase + 1, devBase + 32*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkAsyncPool(b *testing.B) {
	b.Run("sim", func(b *testing.B) {
		benchSimple(b, "async-pool", nil, func() policies.Device { return sim.NewDevice(0) })
	})
	b.Run("null", func(b *testing.B) {
		benchSimple(b, "async-pool", nil, func() policies.Device { return &nullDevice{next: devBase} })
	})
}
