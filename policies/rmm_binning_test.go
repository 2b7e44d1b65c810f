package policies_test

import (
	"errors"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

func TestRMMBinningReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "bins of 256 KiB to 4 MiB, the pool above",
			policy: "rmm-binning",
			trace: `
# When built, each bin takes a chunk of 128 blocks from the pool, which grows by max(chunk, pool size):
# 256 KiB bin: 32 MiB at devBase; 512 KiB: 64 MiB at devBase+32MiB; 1 MiB: 128 MiB at devBase+96MiB;
# 2 MiB: 256 MiB at devBase+224MiB; 4 MiB: 512 MiB at devBase+480MiB. The pool holds 992 MiB.
malloc id=1 size=1           # 0: 256 KiB bin: devBase
malloc id=2 size=256KiB      # 1: still the 256 KiB bin: devBase+256KiB
malloc id=3 size=262145      # 2: 512 KiB bin: devBase+32MiB
malloc id=4 size=3MiB        # 3: 4 MiB bin: devBase+480MiB
malloc id=5 size=4194305     # 4: over 4 MiB: the pool, which grows by max(4 MiB + 256 B, 992 MiB)
                             #    at devBase+992MiB
free id=1                    # 5: to the back of the 256 KiB bin's list
malloc id=6 size=100         # 6: the front: devBase+512KiB
free id=5                    # 7: the pool's 992 MiB block is whole again
malloc id=7 size=5MiB        # 8: devBase+992MiB
`,
			blocks: []policies.Block{
				{devBase, 256 * sKiB}, {devBase + 256*sKiB, 256 * sKiB}, {devBase + 32*sMiB, 512 * sKiB},
				{devBase + 480*sMiB, 4 * sMiB}, {devBase + 992*sMiB, 4*sMiB + 256}, {devBase + 512*sKiB, 256 * sKiB},
				{devBase + 992*sMiB, 5 * sMiB},
			},
			peak:   2 * 992 * sMiB,
			allocs: 6,
			// Bins: 126 of 256 KiB, 127 of 512 KiB, 128 of 1 MiB, 128 of 2 MiB, 127 of 4 MiB;
			// the pool: 987 MiB.
			checkFree:   true,
			freeTotal:   126*256*sKiB + 127*512*sKiB + 128*sMiB + 256*sMiB + 127*4*sMiB + 987*sMiB,
			freeLargest: 987 * sMiB,
		},
		{
			name:     "streams, and a new chunk from the pool",
			policy:   "rmm-binning",
			settings: policies.Settings{"min_size_exponent": "20", "max_size_exponent": "21", "blocks_per_chunk": "2"},
			trace: `
# When built: the 1 MiB bin's chunk of 2 MiB at devBase, the 2 MiB bin's of 4 MiB at devBase+2MiB
# (the pool grows by max(4, 2) MiB), both in the bins' stream 0 lists.
malloc id=1 size=1 stream=1      # 0: 1 MiB bin; stream 1's list is empty: stream 0's devBase
malloc id=2 size=1MiB stream=1   # 1: stream 0's devBase+1MiB
malloc id=3 size=1MiB stream=1   # 2: no block left: a chunk from the pool on stream 1; the pool grows by
                                 #    max(2, 6) MiB at devBase+6MiB: the chunk at devBase+6MiB, the pool's
                                 #    [devBase+8MiB, 4 MiB] in its stream 1 list; devBase+6MiB
malloc id=4 size=3MiB stream=1   # 3: over 2 MiB: the pool, stream 1's list: devBase+8MiB
free id=1 stream=2               # 4: to the 1 MiB bin's stream 2 list
malloc id=5 size=2MiB stream=2   # 5: 2 MiB bin; stream 2's list is empty: stream 0's devBase+2MiB
malloc id=6 size=1MiB stream=2   # 6: 1 MiB bin, stream 2's list: devBase
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 6*sMiB, sMiB}, {devBase + 8*sMiB, 3 * sMiB},
				{devBase + 2*sMiB, 2 * sMiB}, {devBase, sMiB},
			},
			peak:   12 * sMiB,
			allocs: 3,
			// The 1 MiB bin's devBase+7MiB, the 2 MiB bin's devBase+4MiB, the pool's 1 MiB.
			checkFree: true, freeTotal: 4 * sMiB, freeLargest: 2 * sMiB,
		},
		{
			name:     "the pool refuses a chunk",
			policy:   "rmm-binning",
			settings: policies.Settings{"min_size_exponent": "20", "max_size_exponent": "20", "blocks_per_chunk": "2", "maximum_pool_size": "3MiB"},
			trace: `
# When built: the pool grows by max(2 MiB, 3/2 MiB) = 2 MiB at devBase for the bin's chunk.
malloc id=1 size=1        # 0: devBase
malloc id=2 size=1        # 1: devBase+1MiB
malloc id=3 size=1        # 2: a chunk of 2 MiB; 1 MiB of room: OOM
malloc id=4 size=1048577   # 3: the pool: room 1 MiB < 1 MiB + 256 B: OOM
malloc id=5 size=1000KiB  # 4: the 1 MiB bin again: OOM
malloc id=6 size=2MiB     # 5: the pool: room 1 MiB < 2 MiB: OOM
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}},
			ooms:   []int{2, 3, 4, 5},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:   "size 0",
			policy: "rmm-binning",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
			peak:   992 * sMiB,
			allocs: 5,
		},
	})
}

func TestRMMBinningSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"rmm-binning", policies.Settings{"min_size_exponent": "x"}, "min_size_exponent"},
		{"rmm-binning", policies.Settings{"max_size_exponent": "41"}, "max_size_exponent"},
		{"rmm-binning", policies.Settings{"max_size_exponent": "10"}, "max_size_exponent"},
		{"rmm-binning", policies.Settings{"min_size_exponent": "20", "max_size_exponent": "19"}, "min_size_exponent"},
		{"rmm-binning", policies.Settings{"blocks_per_chunk": "0"}, "blocks_per_chunk"},
		{"rmm-binning", policies.Settings{"initial_pool_size": "1000"}, "initial_pool_size"},
		{"rmm-binning", policies.Settings{"maximum_pool_size": "1"}, "maximum_pool_size"},
		{"rmm-binning", policies.Settings{"bins": "4"}, "bins"},
	})
}

func TestRMMBinningChunksRefused(t *testing.T) {
	_, err := policies.New("rmm-binning", sim.NewDevice(512*sMiB), nil)
	if !errors.Is(err, policies.ErrOutOfMemory) {
		t.Fatalf("New with 992 MiB of chunks over a 512 MiB device: %v, want an error wrapping ErrOutOfMemory", err)
	}
}

func TestRMMBinningInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"min_size_exponent": "9", "max_size_exponent": "16", "blocks_per_chunk": "50"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "rmm-binning", s, 2048*sMiB, true)
		})
	}
	t.Run("streams", func(t *testing.T) { checkStreamInvariants(t, "rmm-binning", nil, 2048*sMiB) })
}

func TestRMMBinningFreeUnknown(t *testing.T) {
	// The 256 KiB bin's chunk is the pool's block at devBase; freeing it
	// while its first block is free in the bin must fail.
	r := driveSimple(t, "rmm-binning", nil, 0, "malloc id=1 size=1\nfree id=1\nmalloc id=2 size=5MiB\nfree id=2\n")
	for _, addr := range []uint64{devBase, devBase + 1, devBase + 992*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkRMMBinning(b *testing.B) { benchPolicy(b, "rmm-binning", nil) }
