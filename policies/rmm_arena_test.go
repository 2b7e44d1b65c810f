package policies_test

import (
	"errors"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

func TestRMMArenaReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "superblocks, first fit, over 1 MiB to the global arena (growing)",
			policy: "rmm-arena",
			trace: `
malloc id=1 size=1000   # 0: 1024 B. Stream 0's arena is empty; so is the global arena: it grows by
                        #    a 2 MiB segment at devBase; the superblock is cut to 1 MiB for the
                        #    stream's arena, [devBase+1MiB, 1 MiB] stays global. devBase
malloc id=2 size=1      # 1: 256 B: devBase+1024
malloc id=3 size=2MiB   # 2: over 1 MiB: the global arena; its 1 MiB is too small: it grows by a
                        #    2 MiB segment at devBase+2MiB, not cut (< 2 + 1 MiB): devBase+2MiB
malloc id=4 size=1MiB   # 3: 1 MiB is the stream arena's: none free there; the global [devBase+1MiB,
                        #    1 MiB] is too small to cut: the stream's arena takes it whole
free id=1               # 4: [devBase, 1024] free
malloc id=5 size=512    # 5: first fit by address: devBase, [devBase+512, 512] free
free id=3               # 6: the global superblock at devBase+2MiB is empty again
malloc id=6 size=3MiB   # 7: no global superblock holds 3 MiB: a 4 MiB segment at devBase+4MiB, cut
                        #    to 3 MiB, [devBase+7MiB, 1 MiB] stays global
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 256}, {devBase + 2*sMiB, 2 * sMiB}, {devBase + sMiB, sMiB},
				{devBase, 512}, {devBase + 4*sMiB, 3 * sMiB},
			},
			peak:   8 * sMiB,
			allocs: 3,
			// Stream 0's arena: 512 B and 1 MiB - 1280 B; global: 2 MiB and 1 MiB.
			checkFree: true, freeTotal: 4*sMiB - 768, freeLargest: 2 * sMiB,
		},
		{
			name:   "a block goes back to the superblock it came from",
			policy: "rmm-arena",
			trace: `
malloc id=1 size=1 stream=1   # a 2 MiB segment at devBase; stream 1's arena takes [devBase, 1 MiB]: devBase
free id=1 stream=2            # back to stream 1's superblock, which stays in stream 1's arena
malloc id=2 size=1 stream=2   # stream 2's arena takes the global [devBase+1MiB, 1 MiB]: devBase+1MiB
malloc id=3 size=1 stream=1   # devBase
`,
			blocks: []policies.Block{{devBase, 256}, {devBase + sMiB, 256}, {devBase, 256}},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:     "per-stream arenas, defragment on OOM",
			policy:   "rmm-arena",
			settings: policies.Settings{"arena_size": "4MiB"},
			trace: `
# When built: the global arena, one 4 MiB superblock at devBase.
malloc id=1 size=1MiB stream=1      # 0: stream 1's arena takes [devBase, 1 MiB]: devBase
malloc id=2 size=1MiB stream=2      # 1: stream 2's arena takes [devBase+1MiB, 1 MiB]: devBase+1MiB
free id=1 stream=1                  # 2: stream 1's superblock is empty; it stays in stream 1's arena
malloc id=3 size=2MiB stream=2      # 3: the global [devBase+2MiB, 2 MiB], whole: devBase+2MiB
malloc id=4 size=1MiB stream=2      # 4: stream 2's superblock is full, the global arena has nothing:
                                    #    defragment (a retry): both streams' superblocks go global;
                                    #    stream 2's arena takes the empty [devBase, 1 MiB]: devBase
free id=2 stream=1                  # 5: its superblock is global now, and empty; its neighbours are
                                    #    stream 2's and full
malloc id=5 size=1536KiB stream=3   # 6: no global superblock holds 1.5 MiB; defragment (a retry)
                                    #    merges nothing: OOM
free id=3 stream=2                  # 7: [devBase+2MiB, 2 MiB] empty: merges with [devBase+1MiB, 1 MiB]
malloc id=6 size=1536KiB stream=3   # 8: the 3 MiB superblock, cut to 1.5 MiB: devBase+1MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 2*sMiB, 2 * sMiB}, {devBase, sMiB},
				{devBase + sMiB, 1536 * sKiB},
			},
			ooms:      []int{6},
			peak:      4 * sMiB,
			allocs:    1,
			retries:   2,
			checkFree: true, freeTotal: 1536 * sKiB, freeLargest: 1536 * sKiB,
		},
		{
			name:     "default arena: half the capacity",
			policy:   "rmm-arena",
			capacity: 16 * sMiB,
			trace: `
# When built: the global arena of 8 MiB at devBase.
malloc id=1 size=5MiB   # 0: cut to 5 MiB: devBase; [devBase+5MiB, 3 MiB] global
malloc id=2 size=4MiB   # 1: nothing holds 4 MiB, defragment (a retry) changes nothing: OOM
malloc id=3 size=3MiB   # 2: the 3 MiB superblock, whole: devBase+5MiB
`,
			blocks:  []policies.Block{{devBase, 5 * sMiB}, {devBase + 5*sMiB, 3 * sMiB}},
			ooms:    []int{1},
			peak:    8 * sMiB,
			allocs:  1,
			retries: 1,
		},
		{
			name:     "growing under a capacity",
			policy:   "rmm-arena",
			settings: policies.Settings{"arena_size": "0"},
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=1 stream=1      # 0: a 2 MiB segment at devBase; stream 1 takes [devBase, 1 MiB]
malloc id=2 size=2MiB stream=1   # 1: a 2 MiB segment at devBase+2MiB, whole
free id=1 stream=1               # 2: stream 1's superblock is empty, kept
malloc id=3 size=1MiB stream=2   # 3: stream 2 takes the global [devBase+1MiB, 1 MiB]: devBase+1MiB
malloc id=4 size=1MiB stream=2   # 4: nothing global, a new segment is refused: defragment (a retry);
                                 #    stream 1's empty superblock goes global: devBase
malloc id=5 size=1 stream=2      # 5: nothing anywhere, a new segment refused, defragment: OOM
`,
			blocks:  []policies.Block{{devBase, 256}, {devBase + 2*sMiB, 2 * sMiB}, {devBase + sMiB, sMiB}, {devBase, sMiB}},
			ooms:    []int{5},
			peak:    4 * sMiB,
			allocs:  2,
			retries: 2,
		},
		{
			name:   "size 0",
			policy: "rmm-arena",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestRMMArenaSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"rmm-arena", policies.Settings{"arena_size": "x"}, "arena_size"},
		{"rmm-arena", policies.Settings{"arena_size": "1000KiB"}, "arena_size"},
		{"rmm-arena", policies.Settings{"superblock": "1MiB"}, "superblock"},
	})
	// Half of a 1 MiB device is less than a superblock: the arena is the
	// smallest, 1 MiB, all the device holds; on a smaller device the
	// device refuses it, an OOM (not a setting's error: none was given).
	dev := sim.NewDevice(sMiB)
	if _, err := policies.New("rmm-arena", dev, nil); err != nil || dev.Reserved() != sMiB {
		t.Errorf("New on a 1 MiB device: %v, %d bytes reserved, want a 1 MiB arena", err, dev.Reserved())
	}
	if _, err := policies.New("rmm-arena", sim.NewDevice(sMiB/2), nil); !errors.Is(err, policies.ErrOutOfMemory) {
		t.Errorf("New on a 512 KiB device: %v, want an error wrapping ErrOutOfMemory", err)
	}
}

func TestRMMArenaRefused(t *testing.T) {
	_, err := policies.New("rmm-arena", sim.NewDevice(4*sMiB), policies.Settings{"arena_size": "8MiB"})
	if !errors.Is(err, policies.ErrOutOfMemory) {
		t.Fatalf("New with an arena over the capacity: %v, want an error wrapping ErrOutOfMemory", err)
	}
}

func TestRMMArenaInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"arena_size": "0"},
		{"arena_size": "100MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "rmm-arena", s, 512*sMiB, true)
		})
	}
	t.Run("streams", func(t *testing.T) { checkStreamInvariants(t, "rmm-arena", nil, 512*sMiB) })
	t.Run("streams growing", func(t *testing.T) {
		checkStreamInvariants(t, "rmm-arena", policies.Settings{"arena_size": "0"}, 512*sMiB)
	})
}

func TestRMMArenaFreeUnknown(t *testing.T) {
	r := driveSimple(t, "rmm-arena", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 256, devBase + 1, devBase + sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkRMMArena(b *testing.B) { benchPolicy(b, "rmm-arena", nil) }
