package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// The pool grows by segments of the request rounded up to 32 MiB, which
// the simulated device places at devBase, devBase+32MiB, ... (addresses
// are never reused); allocations are rounded up to 512 B and placed first
// fit by address.
func TestAsyncPoolReplay(t *testing.T) {
	const chunk = 32 * sMiB
	runHookCases(t, hooked(
		simpleCase{
			name:   "reuse on the same stream at once",
			policy: "async-pool",
			trace: `
malloc id=1 size=1MiB stream=1   # a 32 MiB segment at devBase; its rest, from devBase+1MiB, free for all
free id=1 stream=1               # pending on stream 1
malloc id=2 size=1MiB stream=1   # stream 1 reuses it at once: devBase, below the rest
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase, sMiB}},
			peak:      chunk,
			allocs:    1,
			checkFree: true, freeTotal: 31 * sMiB, freeLargest: 31 * sMiB,
		},
		simpleCase{
			name:   "another stream after a stream synchronize",
			policy: "async-pool",
			trace: `
malloc id=1 size=1MiB stream=1   # segment A at devBase
malloc id=2 size=31MiB stream=1  # the rest of A: devBase+1MiB
free id=1 stream=1               # pending on stream 1
malloc id=3 size=1MiB stream=2   # stream 2 may not reuse it yet: segment B at devBase+32MiB
stream_sync stream=1             # the free is complete; no segment is wholly free
malloc id=4 size=1MiB stream=2   # now stream 2 reuses it: devBase, below B's rest
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, 31 * sMiB}, {devBase + chunk, sMiB}, {devBase, sMiB},
			},
			peak:      2 * chunk,
			allocs:    2,
			checkFree: true, freeTotal: 31 * sMiB, freeLargest: 31 * sMiB,
		},
		simpleCase{
			name:   "another stream after an event dependency",
			policy: "async-pool",
			trace: `
malloc id=1 size=32MiB stream=1     # segment A at devBase, all of it
free id=1 stream=1                  # pending on stream 1 (its first free)
event_record event=7 stream=1       # event 7 is ordered after that free
malloc id=2 size=32MiB stream=2     # stream 2 is not: segment B at devBase+32MiB
stream_wait_event stream=2 event=7  # now it is
free id=2 stream=2                  # pending on stream 2
malloc id=3 size=32MiB stream=2     # A (stream 1's, visible) and B (its own) fit: the lower, devBase
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase, chunk}},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:   "an event recorded before the free orders nothing",
			policy: "async-pool",
			trace: `
malloc id=1 size=32MiB stream=1     # A at devBase
event_record event=1 stream=1       # before the free
free id=1 stream=1
stream_wait_event stream=2 event=1
malloc id=2 size=32MiB stream=2     # not ordered after the free: B at devBase+32MiB
event_record event=2 stream=1       # after the free
event_sync event=2                  # the host sees the free complete: A wholly free, over threshold 0: back
malloc id=3 size=32MiB stream=2     # C at devBase+64MiB
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase + 2*chunk, chunk}},
			peak:   2 * chunk,
			allocs: 3,
			frees:  1,
		},
		simpleCase{
			name:   "release threshold 0: back at every synchronize that completes the free",
			policy: "async-pool",
			trace: `
malloc id=1 size=64MiB stream=1   # a 64 MiB segment at devBase
free id=1 stream=1
stream_sync stream=2              # completes no free of stream 1: nothing goes back
stream_sync stream=1              # the segment goes back
malloc id=2 size=1MiB stream=1    # a 32 MiB segment at devBase+64MiB
free id=2 stream=1
device_sync                       # back
`,
			blocks:    []policies.Block{{devBase, 2 * chunk}, {devBase + 2*chunk, sMiB}},
			peak:      2 * chunk,
			allocs:    2,
			frees:     2,
			checkFree: true,
		},
		simpleCase{
			name:     "a larger threshold keeps memory, the lowest first",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "40MiB"},
			trace: `
malloc id=1 size=32MiB stream=1   # A at devBase
malloc id=2 size=32MiB stream=1   # B at devBase+32MiB
malloc id=3 size=32MiB stream=1   # C at devBase+64MiB
free id=1 stream=1
free id=2 stream=1
free id=3 stream=1
stream_sync stream=1              # 96 MiB free, over 40 MiB: C, then B go back; 32 MiB <= 40 MiB: A stays
malloc id=4 size=1MiB stream=2    # in A: devBase
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
malloc id=1 size=64MiB stream=1
free id=1 stream=1
stream_sync stream=1              # complete, kept
malloc id=2 size=1MiB stream=2    # devBase
`,
			blocks: []policies.Block{{devBase, 2 * chunk}, {devBase, sMiB}},
			peak:   2 * chunk,
			allocs: 1,
		},
		simpleCase{
			name:   "pending frees of one stream merge",
			policy: "async-pool",
			trace: `
malloc id=1 size=1MiB stream=1   # devBase
malloc id=2 size=1MiB stream=1   # devBase+1MiB
malloc id=3 size=30MiB stream=1  # devBase+2MiB: the segment is full
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
			name:   "512-byte steps in 32 MiB segments, no straddling",
			policy: "async-pool",
			trace: `
malloc id=1 size=1         # 512 B at devBase, in a 32 MiB segment
malloc id=2 size=513       # 1024 B at devBase+512
malloc id=3 size=20MiB     # devBase+1536
malloc id=4 size=33554433  # 32 MiB+512 B; the rest (12 MiB-1536 B) is too small: a 64 MiB segment
                           # at devBase+32MiB (the driver maps one more 32 MiB chunk after the
                           # first and reserves 64 MiB in all)
`,
			blocks: []policies.Block{
				{devBase, 512}, {devBase + 512, 1024}, {devBase + 1536, 20 * sMiB}, {devBase + chunk, chunk + 512},
			},
			peak:   3 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "granularity",
			policy:   "async-pool",
			settings: policies.Settings{"granularity": "2MiB"},
			trace: `
malloc id=1 size=3MiB   # a 4 MiB segment at devBase
malloc id=2 size=1MiB   # its rest: devBase+3MiB
`,
			blocks: []policies.Block{{devBase, 3 * sMiB}, {devBase + 3*sMiB, sMiB}},
			peak:   4 * sMiB,
			allocs: 1,
		},
		simpleCase{
			name:     "an internal dependency when the device refuses",
			policy:   "async-pool",
			capacity: 2 * chunk,
			trace: `
malloc id=1 size=32MiB stream=1   # 0: A at devBase
malloc id=2 size=32MiB stream=2   # 1: B at devBase+32MiB; the device is full
free id=1 stream=1                # 2: pending on stream 1
malloc id=3 size=32MiB stream=2   # 3: not ordered after it; a segment is refused: stream 2 waits for
                                  #    stream 1 and takes A
malloc id=4 size=1MiB stream=2    # 4: nothing free, refused, nothing to give back: OOM
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}, {devBase, chunk}},
			ooms:   []int{4},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "no internal dependencies",
			policy:   "async-pool",
			settings: policies.Settings{"reuse_allow_internal_dependencies": "false"},
			capacity: 2 * chunk,
			trace: `
malloc id=1 size=32MiB stream=1   # 0: A at devBase
malloc id=2 size=32MiB stream=2   # 1: B at devBase+32MiB
free id=1 stream=1                # 2: pending on stream 1
malloc id=3 size=32MiB stream=2   # 3: refused; A's free is not complete, so not given back: OOM
malloc id=4 size=1MiB stream=2    # 4: OOM
`,
			blocks: []policies.Block{{devBase, chunk}, {devBase + chunk, chunk}},
			ooms:   []int{3, 4},
			peak:   2 * chunk,
			allocs: 2,
		},
		simpleCase{
			name:     "no event dependencies",
			policy:   "async-pool",
			settings: policies.Settings{"reuse_follow_event_dependencies": "false"},
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
			name:     "a retry after giving unused memory back",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "max"},
			capacity: 2 * chunk,
			trace: `
malloc id=1 size=32MiB stream=1   # A at devBase
free id=1 stream=1
stream_sync stream=1              # complete; kept
malloc id=2 size=64MiB stream=1   # A is too small; 64 MiB more is refused; A goes back; the retry gets
                                  # devBase+32MiB
`,
			blocks:  []policies.Block{{devBase, chunk}, {devBase + chunk, 2 * chunk}},
			peak:    2 * chunk,
			allocs:  2,
			frees:   1,
			retries: 1,
		},
		simpleCase{
			name:     "empty_cache: a device synchronize and a trim to 0",
			policy:   "async-pool",
			settings: policies.Settings{"release_threshold": "max"},
			trace: `
malloc id=1 size=1MiB stream=1
free id=1 stream=1   # pending: no synchronize yet
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
	})
}

func TestAsyncPoolInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"release_threshold": "max"},
		{"release_threshold": "100MiB", "granularity": "2MiB", "alignment": "256"},
		{"reuse_follow_event_dependencies": "false", "reuse_allow_internal_dependencies": "false"},
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
