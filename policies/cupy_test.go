package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
)

// The device gives each segment its own 2 MiB-aligned place (devBase,
// devBase+2MiB, ...) of exactly the size asked: CuPy's pool allocates the
// rounded request, no more.
func TestCuPyReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "rounding to 512 B, a split, the rest merged back",
			policy: "cupy",
			trace: `
malloc id=1 size=1000   # 0: 1024 B; the arena is empty: segment A = [devBase, 1024]
malloc id=2 size=3000   # 1: 3072 B: segment B = [devBase+2MiB, 3072]
free id=2               # 2: B one free chunk
malloc id=3 size=1      # 3: 512 B from B's front: devBase+2MiB; the rest [devBase+2MiB+512, 2560] free
malloc id=4 size=2560   # 4: that rest, whole: devBase+2MiB+512
free id=3               # 5: [devBase+2MiB, 512] free; the chunk after it is in use
free id=4               # 6: merged with the free 512 B before it: B one free chunk again
malloc id=5 size=3072   # 7: B: devBase+2MiB
malloc id=6 size=0      # 8: 0 bytes: {0, 0}, no segment
free id=6               # 9: nothing
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 2*sMiB, 3072}, {devBase + 2*sMiB, 512}, {devBase + 2*sMiB + 512, 2560},
				{devBase + 2*sMiB, 3072}, {0, 0},
			},
			peak:      1024 + 3072,
			allocs:    2,
			checkFree: true, freeTotal: 0, freeLargest: 0,
		},
		{
			name:   "the smallest chunk that fits; of equal ones the one made first",
			policy: "cupy",
			trace: `
malloc id=1 size=8KiB   # 0: segment A = [devBase, 8192], chunk 0
malloc id=2 size=4KiB   # 1: segment B = [devBase+2MiB, 4096], chunk 1
malloc id=3 size=2KiB   # 2: segment C = [devBase+4MiB, 2048], chunk 2
free id=1               # 3: A free
malloc id=4 size=4KiB   # 4: A (8192) is the only free chunk: its front, devBase; the rest is a
                        #    new chunk 3 = [devBase+4KiB, 4096]
free id=2               # 5: B free: chunk 1, 4096 at devBase+2MiB
free id=3               # 6: C free: chunk 2, 2048
malloc id=5 size=4000   # 7: 4096 B: C is too small; chunks 1 and 3 hold it, both 4096 B: chunk 1,
                        #    made first, at devBase+2MiB, though chunk 3's address is lower
malloc id=6 size=1025   # 8: 1536 B: C, the smallest that fits, devBase+4MiB; [+1536, 512] free
`,
			blocks: []policies.Block{
				{devBase, 8 * sKiB}, {devBase + 2*sMiB, 4 * sKiB}, {devBase + 4*sMiB, 2 * sKiB}, {devBase, 4 * sKiB},
				{devBase + 2*sMiB, 4 * sKiB}, {devBase + 4*sMiB, 1536},
			},
			peak:      8*sKiB + 4*sKiB + 2*sKiB,
			allocs:    3,
			checkFree: true, freeTotal: 4*sKiB + 512, freeLargest: 4 * sKiB,
		},
		{
			name:   "an arena per stream; a free goes back to the allocating stream's",
			policy: "cupy",
			trace: `
malloc id=1 size=1MiB stream=1     # 0: stream 1's arena is empty: segment A = [devBase, 1 MiB]
free id=1 stream=0                 # 1: A back to stream 1's arena, though freed on stream 0
malloc id=2 size=1MiB stream=0     # 2: stream 0's arena is empty: segment B = [devBase+2MiB, 1 MiB]
malloc id=3 size=512KiB stream=1   # 3: A's front: devBase; the rest [devBase+512KiB, 512 KiB] stays
                                   #    in stream 1's arena
free id=2                          # 4: B to stream 0's arena
malloc id=4 size=512KiB stream=1   # 5: stream 1's: the rest of A, devBase+512KiB (B is stream 0's)
malloc id=5 size=1 stream=1        # 6: stream 1's arena is empty: segment C = [devBase+4MiB, 512]
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + 2*sMiB, sMiB}, {devBase, 512 * sKiB}, {devBase + 512*sKiB, 512 * sKiB},
				{devBase + 4*sMiB, 512},
			},
			peak:      2*sMiB + 512,
			allocs:    3,
			checkFree: true, freeTotal: sMiB, freeLargest: sMiB,
		},
		{
			name:   "empty_cache gives back the segments that are one free chunk",
			policy: "cupy",
			trace: `
malloc id=1 size=1MiB   # 0: segment A = [devBase, 1 MiB]
malloc id=2 size=2MiB   # 1: segment B = [devBase+2MiB, 2 MiB]
free id=2               # 2: B one free chunk
malloc id=3 size=1MiB   # 3: B's front, devBase+2MiB; [devBase+3MiB, 1 MiB] free
free id=1               # 4: A one free chunk
empty_cache             # 5: A given back; B is split (id 3 lives): kept, with its free rest
malloc id=4 size=1MiB   # 6: B's rest: devBase+3MiB
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase + 2*sMiB, 2 * sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 3*sMiB, sMiB}},
			peak:      3 * sMiB,
			allocs:    2,
			frees:     1,
			checkFree: true, freeTotal: 0, freeLargest: 0,
		},
		{
			name:     "the limit: give back and try again, twice, then OOM",
			policy:   "cupy",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=2MiB      # 0: segment A = [devBase, 2 MiB]: 2 of 4 MiB reserved
malloc id=2 size=1MiB      # 1: segment B = [devBase+2MiB, 1 MiB]: 3 MiB
free id=2                  # 2: B cached
malloc id=3 size=1536KiB   # 3: B is too small; 3 + 1.5 MiB is refused: B given back, a retry:
                           #    2 + 1.5 MiB fits: segment C = [devBase+4MiB, 1.5 MiB]
malloc id=4 size=1MiB      # 4: 3.5 + 1 MiB refused; nothing to give back, a retry; again (CuPy
                           #    collects garbage first), a retry; refused: OOM
malloc id=5 size=5MiB      # 5: more than the limit: OOM at once, no retry
free id=1                  # 6: A cached, nothing given back
`,
			blocks:    []policies.Block{{devBase, 2 * sMiB}, {devBase + 2*sMiB, sMiB}, {devBase + 4*sMiB, 1536 * sKiB}},
			ooms:      []int{4, 5},
			peak:      2*sMiB + 1536*sKiB,
			allocs:    3,
			frees:     1,
			retries:   3,
			checkFree: true, freeTotal: 2 * sMiB, freeLargest: 2 * sMiB,
		},
	})
}

func TestCuPySettings(t *testing.T) {
	runSettingCases(t, []settingCase{{"cupy", policies.Settings{"limit": "1GiB"}, "limit"}})
}

func TestCuPyInvariants(t *testing.T) {
	checkInvariants(t, "cupy", nil, 0, true)
	checkInvariants(t, "cupy", nil, 64<<20, true)
}
