package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// The simulated device places each chunk at the next 2 MiB-aligned address
// and counts its exact size as reserved; Paddle asks for chunks of the
// aligned request (chunk_size 0) with no rounding to 2 MiB.
func TestPaddleReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "best fit, allocations at the high end, chunks of the request",
			policy: "paddle",
			trace: `
malloc id=1 size=1000   # 1024 B: a 1024 B chunk at devBase
malloc id=2 size=3000   # 3072 B: a chunk at devBase+2MiB
free id=1               # idle chunks stay cached
free id=2
malloc id=3 size=500    # 512 B: best fit is the 1024 B block; the high half: devBase+512
malloc id=4 size=2000   # 2048 B: from the 3072 B block, its high end: devBase+2MiB+1024
malloc id=5 size=1024   # free: 512 B at devBase, 1024 B at devBase+2MiB: that one, exactly
malloc id=6 size=512    # devBase
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 2*sMiB, 3072}, {devBase + 512, 512},
				{devBase + 2*sMiB + 1024, 2048}, {devBase + 2*sMiB, 1024}, {devBase, 512},
			},
			peak:      1024 + 3072,
			allocs:    2,
			checkFree: true,
		},
		{
			name:     "chunk_size: the request at the chunk's end",
			policy:   "paddle",
			settings: policies.Settings{"chunk_size": "1MiB"},
			trace: `
malloc id=1 size=1000   # a 1 MiB chunk at devBase; the block at its end, devBase+1MiB-1024
malloc id=2 size=1MiB   # the free 1 MiB-1024 is too small: a chunk of exactly 1 MiB at devBase+2MiB
malloc id=3 size=2000   # from the free low part: its high end, devBase+1MiB-3072
free id=1               # its low neighbour is live: alone
free id=3               # merges with both neighbours: the chunk is one free block
malloc id=4 size=1MiB   # best fit: that chunk, exactly
`,
			blocks: []policies.Block{
				{devBase + sMiB - 1024, 1024}, {devBase + 2*sMiB, sMiB}, {devBase + sMiB - 3072, 2048}, {devBase, sMiB},
			},
			peak:      2 * sMiB,
			allocs:    2,
			checkFree: true,
		},
		{
			name:   "a pool per stream",
			policy: "paddle",
			trace: `
malloc id=1 size=1000 stream=1   # stream 1's pool: a chunk at devBase
free id=1 stream=1
malloc id=2 size=1000 stream=2  # stream 2's pool is empty: a chunk at devBase+2MiB
malloc id=3 size=1000 stream=1  # devBase
free id=3 stream=2              # back to stream 1's pool, whatever the stream of the free
malloc id=4 size=1000 stream=1  # devBase
`,
			blocks:    []policies.Block{{devBase, 1024}, {devBase + 2*sMiB, 1024}, {devBase, 1024}, {devBase, 1024}},
			peak:      2048,
			allocs:    2,
			checkFree: true, freeTotal: 0, freeLargest: 0,
		},
		{
			name:     "one pool for all streams",
			policy:   "paddle",
			settings: policies.Settings{"per_stream": "false"},
			trace: `
malloc id=1 size=1000 stream=1   # a chunk at devBase
free id=1 stream=1
malloc id=2 size=1000 stream=2  # devBase
malloc id=3 size=1000 stream=1  # a chunk at devBase+2MiB
free id=3 stream=1
malloc id=4 size=1000 stream=1  # devBase+2MiB
`,
			blocks: []policies.Block{{devBase, 1024}, {devBase, 1024}, {devBase + 2*sMiB, 1024}, {devBase + 2*sMiB, 1024}},
			peak:   2048,
			allocs: 2,
		},
		{
			name:     "idle chunks given back on a refusal: own pool, then every pool",
			policy:   "paddle",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=2MiB stream=0     # 0: stream 0: a 2 MiB chunk at devBase
malloc id=2 size=1MiB stream=1     # 1: stream 1: a 1 MiB chunk at devBase+2MiB (3 MiB reserved)
free id=1 stream=0                 # 2: idle
free id=2 stream=1                 # 3: idle
malloc id=3 size=3MiB stream=0     # 4: a 3 MiB chunk is refused (6 > 4 MiB); stream 0 gives its idle
                                   #    chunk back; the retry gets devBase+4MiB
free id=3 stream=0                 # 5: idle
malloc id=4 size=3584KiB stream=1  # 6: refused (7.5 MiB); stream 1 gives its 1 MiB back; retry refused
                                   #    (6.5 MiB); every pool: stream 0's 3 MiB; the retry gets devBase+8MiB
malloc id=5 size=1MiB stream=0     # 7: refused, no idle chunk anywhere: OOM
`,
			blocks: []policies.Block{
				{devBase, 2 * sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 4*sMiB, 3 * sMiB}, {devBase + 8*sMiB, 3584 * sKiB},
			},
			ooms:    []int{7},
			peak:    4 * sMiB,
			allocs:  4,
			frees:   3,
			retries: 3,
		},
		{
			name:     "allow_free_idle_chunk=false",
			policy:   "paddle",
			settings: policies.Settings{"allow_free_idle_chunk": "false"},
			capacity: 3 * sMiB,
			trace: `
malloc id=1 size=2MiB   # 0: devBase
free id=1               # 1: idle
empty_cache             # 2: nothing is given back
malloc id=2 size=3MiB   # 3: refused (5 > 3 MiB), nothing may be given back: OOM
`,
			blocks: []policies.Block{{devBase, 2 * sMiB}},
			ooms:   []int{3},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:     "free_idle_chunk",
			policy:   "paddle",
			settings: policies.Settings{"free_idle_chunk": "true"},
			trace: `
malloc id=1 size=1000   # a chunk at devBase
free id=1               # idle: given back at once
malloc id=2 size=1000   # a new chunk at devBase+2MiB
`,
			blocks: []policies.Block{{devBase, 1024}, {devBase + 2*sMiB, 1024}},
			peak:   1024,
			allocs: 2,
			frees:  1,
		},
		{
			name:     "free_when_no_cache_hit",
			policy:   "paddle",
			settings: policies.Settings{"free_when_no_cache_hit": "true"},
			trace: `
malloc id=1 size=1000   # a chunk at devBase
malloc id=2 size=1000   # a chunk at devBase+2MiB
free id=1               # idle, cached
malloc id=3 size=4000   # no fit: the idle chunk goes back first; a chunk at devBase+4MiB
`,
			blocks: []policies.Block{{devBase, 1024}, {devBase + 2*sMiB, 1024}, {devBase + 4*sMiB, 4096}},
			peak:   1024 + 4096, // id 1's chunk went back before the growth
			allocs: 3,
			frees:  1,
		},
		{
			name:   "empty_cache",
			policy: "paddle",
			trace: `
malloc id=1 size=1000 stream=1
malloc id=2 size=1000 stream=2
malloc id=3 size=1000 stream=2
free id=1 stream=1
free id=2 stream=2
empty_cache             # both idle chunks, from both pools
`,
			blocks: []policies.Block{{devBase, 1024}, {devBase + 2*sMiB, 1024}, {devBase + 4*sMiB, 1024}},
			peak:   3 * 1024,
			allocs: 3,
			frees:  2,
		},
		{
			name:   "size 0",
			policy: "paddle",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestPaddleSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"paddle", policies.Settings{"alignment": "0"}, "alignment"},
		{"paddle", policies.Settings{"alignment": "4MiB"}, "alignment"},
		{"paddle", policies.Settings{"chunk_size": "lots"}, "chunk_size"},
		{"paddle", policies.Settings{"chunk_size": "8EiB"}, "chunk_size"},
		{"paddle", policies.Settings{"allow_free_idle_chunk": "yes please"}, "allow_free_idle_chunk"},
		{"paddle", policies.Settings{"free_idle_chunk": "2"}, "free_idle_chunk"},
		{"paddle", policies.Settings{"free_when_no_cache_hit": "x"}, "free_when_no_cache_hit"},
		{"paddle", policies.Settings{"per_stream": "x"}, "per_stream"},
		{"paddle", policies.Settings{"auto_growth_chunk_size_in_mb": "1"}, "auto_growth_chunk_size_in_mb"},
	})
}

func TestPaddleInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"chunk_size": "20MiB"},
		{"free_idle_chunk": "true", "alignment": "512"},
		{"free_when_no_cache_hit": "true", "per_stream": "false", "chunk_size": "3000000"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkHookInvariants(t, "paddle", s, 256*sMiB, 0, true)
		})
	}
}

func TestPaddleFreeUnknown(t *testing.T) {
	r := driveSimple(t, "paddle", nil, 0, "malloc id=1 size=1 stream=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 2*sMiB, devBase + 1, 0x1234} {
		for _, stream := range []uint64{0, 1, 7} {
			if err := r.policy.Free(addr, stream); err == nil {
				t.Errorf("Free(%#x, %d) of no live block succeeded", addr, stream)
			}
		}
	}
}

func BenchmarkPaddle(b *testing.B) {
	b.Run("sim", func(b *testing.B) {
		benchSimple(b, "paddle", nil, func() policies.Device { return sim.NewDevice(0) })
	})
	b.Run("null", func(b *testing.B) {
		benchSimple(b, "paddle", nil, func() policies.Device { return &nullDevice{next: devBase} })
	})
}
