package policies_test

import (
	"errors"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

func TestRMMPoolReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "growth by max(request, pool size) and best fit",
			policy: "rmm-pool",
			trace: `
malloc id=1 size=1000   # 0: 1024 B; the pool is empty: grows by max(1024, 0) = 1024 B at devBase
malloc id=2 size=1      # 1: 256 B; grows by max(256, 1024) = 1024 B at devBase+2MiB (the device's
                        #    next 2 MiB-aligned address); [devBase+2MiB+256, 768] free
malloc id=3 size=3000   # 2: 3072 B; 768 is too small: grows by max(3072, 2048) at devBase+4MiB
malloc id=4 size=512    # 3: the 768 B block: devBase+2MiB+256, [devBase+2MiB+768, 256] free
free id=1               # 4: [devBase, 1024] free
malloc id=5 size=1024   # 5: best fit among 256 and 1024: devBase
free id=3               # 6: [devBase+4MiB, 3072] free
malloc id=6 size=2048   # 7: devBase+4MiB, [devBase+4MiB+2048, 1024] free
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 2*sMiB, 256}, {devBase + 4*sMiB, 3072}, {devBase + 2*sMiB + 256, 512},
				{devBase, 1024}, {devBase + 4*sMiB, 2048},
			},
			peak:      1024 + 1024 + 3072,
			allocs:    3,
			checkFree: true, freeTotal: 256 + 1024, freeLargest: 1024,
		},
		{
			name:     "initial pool; no coalescing across upstream blocks",
			policy:   "rmm-pool",
			settings: policies.Settings{"initial_pool_size": "2MiB"},
			trace: `
malloc id=1 size=1MiB   # 0: from the initial pool A = [devBase, 2 MiB]: devBase
malloc id=2 size=1MiB   # 1: devBase+1MiB; A full
malloc id=3 size=1      # 2: grows by max(256, 2 MiB): B = [devBase+2MiB, 2 MiB], right after A
free id=2               # 3: [devBase+1MiB, 1 MiB] free
free id=3               # 4: B whole again; it touches A's free tail but starts an upstream block:
                        #    the two stay apart
malloc id=4 size=3MiB   # 5: 1 MiB and 2 MiB free, no 3 MiB: grows by max(3, 4) MiB, C at devBase+4MiB
malloc id=5 size=1MiB   # 6: two 1 MiB blocks (devBase+1MiB, devBase+7MiB): the lower one
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 2*sMiB, 256}, {devBase + 4*sMiB, 3 * sMiB},
				{devBase + sMiB, sMiB},
			},
			peak:      8 * sMiB,
			allocs:    3,
			checkFree: true, freeTotal: 3 * sMiB, freeLargest: 2 * sMiB,
		},
		{
			name:   "a stream's own list first",
			policy: "rmm-pool",
			trace: `
malloc id=1 size=1MiB stream=1   # A: 1 MiB at devBase
malloc id=2 size=1MiB stream=2   # B: max(1, 1) MiB at devBase+2MiB
free id=1 stream=1               # A to stream 1's list
free id=2 stream=2               # B to stream 2's list
malloc id=3 size=1MiB stream=2   # its own list: devBase+2MiB, though stream 1 has a lower block
malloc id=4 size=1MiB stream=2   # its list is empty: stream 1's block, devBase
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase, sMiB}},
			peak:   2 * sMiB,
			allocs: 2,
		},
		{
			name:   "take from another stream, then merge the lists",
			policy: "rmm-pool",
			trace: `
malloc id=1 size=1MiB stream=1     # 0: grows 1 MiB: devBase
malloc id=2 size=1MiB stream=1     # 1: grows max(1, 1) MiB: devBase+2MiB
malloc id=3 size=2MiB stream=1     # 2: grows max(2, 2) MiB: devBase+4MiB
free id=3 stream=2                 # 3: to the list of stream 2, where it was freed
malloc id=4 size=512KiB stream=1   # 4: stream 1's list is empty; stream 2's has 2 MiB: devBase+4MiB,
                                   #    [devBase+4.5MiB, 1.5 MiB] stays in stream 2's list
free id=4 stream=1                 # 5: to stream 1's list; its neighbour is in stream 2's: apart
malloc id=5 size=2MiB stream=3     # 6: no list holds 2 MiB; stream 1's list merged into stream 3's, no;
                                   #    then stream 2's, which coalesces: [devBase+4MiB, 2 MiB]
malloc id=6 size=1 stream=1        # 7: every list empty: grows max(256, 4 MiB): devBase+6MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 4*sMiB, 2 * sMiB}, {devBase + 4*sMiB, 512 * sKiB},
				{devBase + 4*sMiB, 2 * sMiB}, {devBase + 6*sMiB, 256},
			},
			peak:      8 * sMiB,
			allocs:    4,
			checkFree: true, freeTotal: 4*sMiB - 256, freeLargest: 4*sMiB - 256,
		},
		{
			name:     "maximum_pool_size",
			policy:   "rmm-pool",
			settings: policies.Settings{"maximum_pool_size": "8MiB"},
			trace: `
malloc id=1 size=1MiB   # 0: room 8 MiB: grows by max(1, 8/2) = 4 MiB at devBase
malloc id=2 size=3MiB   # 1: devBase+1MiB, the rest of it
malloc id=3 size=3MiB   # 2: room 4 MiB: grows by max(3, 2) = 3 MiB at devBase+4MiB
malloc id=4 size=2MiB   # 3: room 1 MiB < 2 MiB: OOM
malloc id=5 size=1MiB   # 4: room 1 MiB: grows by max(1, 0.5) MiB at devBase+8MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, 3 * sMiB}, {devBase + 4*sMiB, 3 * sMiB}, {devBase + 8*sMiB, sMiB},
			},
			ooms:   []int{3},
			peak:   8 * sMiB,
			allocs: 3,
		},
		{
			name:     "halving when the device refuses",
			policy:   "rmm-pool",
			capacity: 6 * sMiB,
			trace: `
malloc id=1 size=2MiB      # 0: grows 2 MiB at devBase
malloc id=2 size=1MiB      # 1: grows max(1, 2) MiB at devBase+2MiB; 1 MiB left
malloc id=3 size=1536KiB   # 2: grows max(1.5, 4) MiB: refused (8 > 6 MiB); retry at max(1.5, 2) MiB:
                           #    devBase+4MiB; [devBase+5.5MiB, 512 KiB] left
malloc id=4 size=1MiB      # 3: best fit: devBase+3MiB
malloc id=5 size=1MiB      # 4: grows 6 MiB, refused; retries at 3, 1.5 and 1 MiB, all refused: OOM
`,
			blocks: []policies.Block{
				{devBase, 2 * sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 4*sMiB, 1536 * sKiB}, {devBase + 3*sMiB, sMiB},
			},
			ooms:      []int{4},
			peak:      6 * sMiB,
			allocs:    3,
			retries:   4,
			checkFree: true, freeTotal: 512 * sKiB, freeLargest: 512 * sKiB,
		},
		{
			name:   "size 0 and empty_cache",
			policy: "rmm-pool",
			trace:  "malloc id=1 size=0\nfree id=1\nmalloc id=2 size=1\nfree id=2\nempty_cache\n",
			blocks: []policies.Block{{0, 0}, {devBase, 256}},
			peak:   256,
			allocs: 1,
		},
	})
}

func TestRMMPoolSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"rmm-pool", policies.Settings{"initial_pool_size": "1000"}, "initial_pool_size"},
		{"rmm-pool", policies.Settings{"initial_pool_size": "x"}, "initial_pool_size"},
		{"rmm-pool", policies.Settings{"maximum_pool_size": "1000"}, "maximum_pool_size"},
		{"rmm-pool", policies.Settings{"maximum_pool_size": "0"}, "maximum_pool_size"},
		{"rmm-pool", policies.Settings{"initial_pool_size": "4MiB", "maximum_pool_size": "2MiB"}, "initial_pool_size"},
		{"rmm-pool", policies.Settings{"pool_size": "1GiB"}, "pool_size"},
	})
}

func TestRMMPoolInitialRefused(t *testing.T) {
	_, err := policies.New("rmm-pool", sim.NewDevice(sMiB), policies.Settings{"initial_pool_size": "2MiB"})
	if !errors.Is(err, policies.ErrOutOfMemory) {
		t.Fatalf("New with an initial pool over the capacity: %v, want an error wrapping ErrOutOfMemory", err)
	}
}

func TestRMMPoolInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"initial_pool_size": "64MiB"},
		{"maximum_pool_size": "400MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "rmm-pool", s, 512*sMiB, true)
		})
	}
	t.Run("streams", func(t *testing.T) { checkStreamInvariants(t, "rmm-pool", nil, 512*sMiB) })
}

func TestRMMPoolFreeUnknown(t *testing.T) {
	r := driveSimple(t, "rmm-pool", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 2*sMiB, devBase + 1, devBase + 4*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkRMMPool(b *testing.B) { benchPolicy(b, "rmm-pool", nil) }
