package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
)

func TestBuddyReplay(t *testing.T) {
	const chunk = 64 * sMiB // the default max_order 26
	runSimpleCases(t, []simpleCase{
		{
			name:   "split and merge",
			policy: "buddy",
			trace: `
malloc id=1 size=1000   # 0: order 10 at devBase; the 64 MiB chunk is split down to 1 KiB,
                        #    the upper halves [devBase+2^k, 2^k] (k = 10..25) left free
malloc id=2 size=512    # 1: order 9: [devBase+1KiB, 1 KiB] split: devBase+1KiB, [devBase+1536, 512] free
malloc id=3 size=513    # 2: order 10: [devBase+2KiB, 2 KiB] split: devBase+2KiB, [devBase+3KiB, 1 KiB] free
malloc id=4 size=3MiB   # 3: order 22: the free [devBase+4MiB, 4 MiB]
free id=2               # 4: merges with devBase+1536: [devBase+1KiB, 1 KiB]; its buddy id=1 is live
free id=1               # 5: merges: [devBase, 2 KiB]; its buddy holds id=3
free id=3               # 6: merges with devBase+3KiB, then devBase, then each free upper half
                        #    up to [devBase, 4 MiB]; its buddy holds id=4
malloc id=5 size=4MiB   # 7: order 22: the block just merged, devBase
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 512}, {devBase + 2048, 1024}, {devBase + 4*sMiB, 4 * sMiB},
				{devBase, 4 * sMiB},
			},
			peak:   chunk,
			allocs: 1,
			// Free: [devBase+8MiB, 8 MiB], [+16MiB, 16 MiB], [+32MiB, 32 MiB].
			checkFree: true, freeTotal: 56 * sMiB, freeLargest: 32 * sMiB,
		},
		{
			name:   "whole chunk back",
			policy: "buddy",
			trace: `
malloc id=1 size=1000   # devBase
malloc id=2 size=3MiB   # devBase+4MiB
free id=1
free id=2               # everything merges into the whole chunk, cached
empty_cache             # the chunk goes back
malloc id=3 size=1      # a new chunk at devBase+64MiB
`,
			blocks:    []policies.Block{{devBase, 1024}, {devBase + 4*sMiB, 4 * sMiB}, {devBase + chunk, 512}},
			peak:      chunk,
			allocs:    2,
			frees:     1,
			checkFree: true, freeTotal: chunk - 512, freeLargest: 32 * sMiB,
		},
		{
			name:   "requests over the chunk get their own segment",
			policy: "buddy",
			trace: `
malloc id=1 size=65MiB   # a 66 MiB segment (2 MiB steps) at devBase
malloc id=2 size=64MiB   # a whole chunk at devBase+66MiB
free id=1                # device free at once
`,
			blocks:    []policies.Block{{devBase, 66 * sMiB}, {devBase + 66*sMiB, chunk}},
			peak:      66*sMiB + chunk,
			allocs:    2,
			frees:     1,
			checkFree: true,
		},
		{
			name:     "retry",
			policy:   "buddy",
			settings: policies.Settings{"max_order": "21"}, // 2 MiB chunks
			capacity: 6 * sMiB,
			trace: `
malloc id=1 size=1MiB   # 0: chunk A at devBase, order 20
malloc id=2 size=2MiB   # 1: order 21, no free block: chunk B at devBase+2MiB
free id=1               # 2: merges into the whole of A, cached
malloc id=3 size=3MiB   # 3: over the chunk: a 4 MiB segment is refused (8 > 6 MiB);
                        #    A goes back; the retry gets devBase+4MiB
malloc id=4 size=512    # 4: a chunk is refused (8 > 6), nothing wholly free: OOM
free id=2               # 5: B wholly free, cached
malloc id=5 size=512    # 6: from B: devBase+2MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + 2*sMiB, 2 * sMiB}, {devBase + 4*sMiB, 4 * sMiB}, {devBase + 2*sMiB, 512},
			},
			ooms:    []int{4},
			peak:    6 * sMiB,
			allocs:  3,
			frees:   1,
			retries: 1,
		},
		{
			name:     "release",
			policy:   "buddy",
			settings: policies.Settings{"release": "true"},
			trace: `
malloc id=1 size=512   # chunk at devBase
free id=1              # wholly free: back at once
malloc id=2 size=512   # a new chunk at devBase+64MiB
`,
			blocks: []policies.Block{{devBase, 512}, {devBase + chunk, 512}},
			peak:   chunk,
			allocs: 2,
			frees:  1,
		},
		{
			name:     "min_order and max_order",
			policy:   "buddy",
			settings: policies.Settings{"min_order": "12", "max_order": "21"},
			trace: `
malloc id=1 size=1      # 4 KiB at devBase, a 2 MiB chunk
malloc id=2 size=4097   # 8 KiB at devBase+8KiB ([devBase+4KiB, 4 KiB] stays free)
`,
			blocks:    []policies.Block{{devBase, 4 * sKiB}, {devBase + 8*sKiB, 8 * sKiB}},
			peak:      2 * sMiB,
			allocs:    1,
			checkFree: true, freeTotal: 2*sMiB - 12*sKiB, freeLargest: sMiB,
		},
		{
			name:   "size 0",
			policy: "buddy",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestBuddySettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"buddy", policies.Settings{"min_order": "27"}, "min_order"},
		{"buddy", policies.Settings{"min_order": "-1"}, "min_order"},
		{"buddy", policies.Settings{"max_order": "49"}, "max_order"},
		{"buddy", policies.Settings{"max_order": "8"}, "max_order"},
		{"buddy", policies.Settings{"min_order": "20", "max_order": "19"}, "min_order"},
		{"buddy", policies.Settings{"max_order": "x"}, "max_order"},
		{"buddy", policies.Settings{"release": "yes"}, "release"},
		{"buddy", policies.Settings{"chunk": "1"}, "chunk"},
	})
}

func TestBuddyInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"release": "true"},
		{"min_order": "8", "max_order": "22"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "buddy", s, 512*sMiB, true)
		})
	}
}

func TestBuddyFreeUnknown(t *testing.T) {
	r := driveSimple(t, "buddy", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 512, devBase + 1, devBase + 64*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}
