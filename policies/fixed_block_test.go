package policies_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// rmmFixedSize are the fixed-block settings of RMM's
// fixed_size_memory_resource.
var rmmFixedSize = policies.Settings{
	"block_size": "1MiB", "blocks_per_chunk": "128", "oversize": "oom", "preallocate": "true", "per_stream": "true",
}

func TestFixedBlockReplay(t *testing.T) {
	const block, chunk = 8 * sMiB, 512 * sMiB // the defaults
	small := policies.Settings{"block_size": "1MiB", "blocks_per_chunk": "2"}
	smallPerStream := policies.Settings{"block_size": "1MiB", "blocks_per_chunk": "2", "per_stream": "true"}
	// The same trace for the single list and the per-stream lists.
	const streams = `
malloc id=1 size=1 stream=1      # chunk A at devBase: devBase
malloc id=2 size=1 stream=1      # devBase+1MiB
free id=1 stream=1
free id=2 stream=2
malloc id=3 size=1 stream=2
malloc id=4 size=1 stream=2
`
	runSimpleCases(t, []simpleCase{
		{
			name:   "blocks from a chunk, first in first out, oversize to the device",
			policy: "fixed-block",
			trace: `
malloc id=1 size=1        # a 512 MiB chunk at devBase, 64 blocks of 8 MiB: the first, devBase
malloc id=2 size=8MiB     # devBase+8MiB
free id=1                 # devBase to the back of the list
malloc id=3 size=100      # the front: devBase+16MiB
malloc id=4 size=8388609  # over the block size: a segment of 8 MiB + 256 B at devBase+512MiB
free id=4                 # back to the device
`,
			blocks: []policies.Block{
				{devBase, block}, {devBase + block, block}, {devBase + 2*block, block}, {devBase + chunk, block + 256},
			},
			peak:      chunk + block + 256,
			allocs:    2,
			frees:     1,
			checkFree: true, freeTotal: 62 * block, freeLargest: block,
		},
		{
			name:     "a new chunk when the list is empty",
			policy:   "fixed-block",
			settings: small,
			trace: `
malloc id=1 size=1        # chunk A of 2 MiB at devBase: devBase
malloc id=2 size=1MiB     # devBase+1MiB
malloc id=3 size=1        # chunk B at devBase+2MiB: devBase+2MiB; devBase+3MiB left
free id=1
free id=2                 # list: devBase+3MiB, devBase, devBase+1MiB
malloc id=4 size=1        # devBase+3MiB
malloc id=5 size=1        # devBase
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 3*sMiB, sMiB}, {devBase, sMiB},
			},
			peak:      4 * sMiB,
			allocs:    2,
			checkFree: true, freeTotal: sMiB, freeLargest: sMiB,
		},
		{
			name:     "one list: streams ignored",
			policy:   "fixed-block",
			settings: small,
			trace:    streams + "# list after the frees: devBase, devBase+1MiB\n",
			blocks:   []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase, sMiB}, {devBase + sMiB, sMiB}},
			peak:     2 * sMiB,
			allocs:   1,
		},
		{
			name:     "per_stream: a stream's own list first, then another's",
			policy:   "fixed-block",
			settings: smallPerStream,
			trace: streams + `# stream 1's list: devBase; stream 2's: devBase+1MiB.
# id=3 takes its own stream's devBase+1MiB, id=4 then stream 1's devBase.
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + sMiB, sMiB}, {devBase, sMiB}},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:     "per_stream: a new chunk joins the allocating stream's list",
			policy:   "fixed-block",
			settings: smallPerStream,
			trace: `
malloc id=1 size=1 stream=1   # chunk A to stream 1's list: devBase; devBase+1MiB left there
malloc id=2 size=1 stream=2   # stream 2's list is empty: stream 1's devBase+1MiB
malloc id=3 size=1 stream=2   # every list empty: chunk B to stream 2's list: devBase+2MiB
malloc id=4 size=1 stream=1   # stream 1's list is empty: stream 2's devBase+3MiB
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 3*sMiB, sMiB}},
			peak:   4 * sMiB,
			allocs: 2,
		},
		{
			name:     "RMM's fixed_size_memory_resource",
			policy:   "fixed-block",
			settings: rmmFixedSize,
			trace: `
# When built: a 128 MiB chunk of 1 MiB blocks at devBase, in stream 0's list.
malloc id=1 size=1 stream=1         # 0: stream 1's list is empty: stream 0's front, devBase
malloc id=2 size=1MiB               # 1: stream 0: devBase+1MiB
free id=1 stream=1                  # 2: to stream 1's list
malloc id=3 size=2 stream=1         # 3: devBase
malloc id=4 size=1048577            # 4: over the block size: OOM
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase, sMiB}},
			ooms:      []int{4},
			peak:      128 * sMiB,
			allocs:    1,
			checkFree: true, freeTotal: 126 * sMiB, freeLargest: sMiB,
		},
		{
			name:     "device refuses a chunk",
			policy:   "fixed-block",
			settings: small,
			capacity: 3 * sMiB,
			trace: `
malloc id=1 size=1      # 0: chunk A at devBase
malloc id=2 size=1      # 1: devBase+1MiB
malloc id=3 size=1      # 2: a second chunk would make 4 > 3 MiB: OOM
malloc id=4 size=2MiB   # 3: a segment of its own of 2 MiB: 4 > 3 MiB: OOM
free id=1
malloc id=5 size=1      # 5: devBase
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase, sMiB}},
			ooms:   []int{2, 3},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:   "size 0",
			policy: "fixed-block",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestFixedBlockSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"fixed-block", policies.Settings{"block_size": "0"}, "block_size"},
		{"fixed-block", policies.Settings{"block_size": "big"}, "block_size"},
		{"fixed-block", policies.Settings{"blocks_per_chunk": "0"}, "blocks_per_chunk"},
		{"fixed-block", policies.Settings{"blocks_per_chunk": "2000000"}, "blocks_per_chunk"},
		{"fixed-block", policies.Settings{"block_size": "16TiB", "blocks_per_chunk": "1000000"}, "blocks_per_chunk"},
		{"fixed-block", policies.Settings{"oversize": "split"}, "oversize"},
		{"fixed-block", policies.Settings{"preallocate": "2"}, "preallocate"},
		{"fixed-block", policies.Settings{"per_stream": "x"}, "per_stream"},
		{"fixed-block", policies.Settings{"chunk_size": "1GiB"}, "chunk_size"},
	})
}

func TestFixedBlockPreallocateRefused(t *testing.T) {
	_, err := policies.New("fixed-block", sim.NewDevice(256*sMiB), policies.Settings{"preallocate": "true"})
	if !errors.Is(err, policies.ErrOutOfMemory) {
		t.Fatalf("New with a chunk over the capacity: %v, want an error wrapping ErrOutOfMemory", err)
	}
}

func TestFixedBlockInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		rmmFixedSize,
		{"block_size": "100000", "blocks_per_chunk": "7", "per_stream": "true"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "fixed-block", s, 2048*sMiB, true)
		})
	}
	t.Run("streams", func(t *testing.T) {
		checkStreamInvariants(t, "fixed-block", policies.Settings{"block_size": "1MiB", "per_stream": "true"}, 2048*sMiB)
	})
}

func TestFixedBlockFreeUnknown(t *testing.T) {
	r := driveSimple(t, "fixed-block", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\nmalloc id=3 size=9MiB\nfree id=3\n")
	for _, addr := range []uint64{devBase + 16*sMiB, devBase + 1, devBase + 512*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkFixedBlock(b *testing.B) {
	b.Run("defaults", func(b *testing.B) { benchPolicy(b, "fixed-block", nil) })
	// RMM's settings, but with requests over 1 MiB to the device, as the
	// benchmark asks up to 2 MiB.
	s := maps.Clone(rmmFixedSize)
	s["oversize"] = "device"
	b.Run("rmm", func(b *testing.B) { benchPolicy(b, "fixed-block", s) })
}
