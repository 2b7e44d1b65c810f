package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// With the defaults (alignment 256 B, sl_log2 5) sizes below 8 KiB
// (256 * 2^5) have a list each per 256 B step; above, each power of two
// [2^m, 2^(m+1)) is cut into 32 classes of 2^(m-5) bytes, and a request is
// rounded up to the next class boundary.
func TestTLSFReplay(t *testing.T) {
	const seg = 2 * sMiB // the default segment_size
	runSimpleCases(t, []simpleCase{
		{
			name:   "good fit and class rounding",
			policy: "tlsf",
			trace: `
malloc id=1 size=100      # 256 B; no block: a 2 MiB segment at devBase; the rest (2 MiB-256) to its list
malloc id=2 size=10000    # 10240 B (40*256); in [8 KiB, 16 KiB) classes are 256 B wide: no rounding; devBase+256
malloc id=3 size=100000   # 100096 B; in [64 KiB, 128 KiB) classes are 2 KiB wide: 100352 B at devBase+10496
free id=2                 # 10240 B free between two live blocks: class (8 KiB, 8)
malloc id=4 size=9000     # 9216 B, class (8 KiB, 4): the first non-empty list at or above is id 2's:
                          # devBase+256, the rest (1024 B at devBase+9472) to the linear lists
malloc id=5 size=1000     # 1024 B: exactly that rest
`,
			blocks: []policies.Block{
				{devBase, 256}, {devBase + 256, 10240}, {devBase + 10496, 100352},
				{devBase + 256, 9216}, {devBase + 9472, 1024},
			},
			peak:   seg,
			allocs: 1,
			// Live: 256 + 9216 + 1024 + 100352 = 110848 B; the tail from
			// devBase+110848 is the one free block.
			checkFree: true, freeTotal: seg - 110848, freeLargest: seg - 110848,
		},
		{
			name:     "the head of the list, not the best fit",
			policy:   "tlsf",
			settings: policies.Settings{"class_rounding": "false"},
			trace: `
malloc id=1 size=16896    # A at devBase (class [16896, 17408) of [16 KiB, 32 KiB), 512 B wide)
malloc id=2 size=256      # devBase+16896
malloc id=3 size=17152    # B at devBase+17152, the same class as A (no class rounding)
malloc id=4 size=256      # devBase+34304
free id=1                 # the class's list: A
free id=3                 # B at the head: B, A
malloc id=5 size=16896    # the head, B, though A fits exactly: devBase+17152, 256 B left at devBase+34048
`,
			blocks: []policies.Block{
				{devBase, 16896}, {devBase + 16896, 256}, {devBase + 17152, 17152}, {devBase + 34304, 256},
				{devBase + 17152, 16896},
			},
			peak:   seg,
			allocs: 1,
			// Live: 256 + 256 + 16896; the largest free block is the tail
			// from devBase+34560.
			checkFree: true, freeTotal: seg - 17408, freeLargest: seg - 34560,
		},
		{
			name:     "power-of-two classes",
			policy:   "tlsf",
			settings: policies.Settings{"sl_log2": "0", "alignment": "512"},
			trace: `
malloc id=1 size=1000     # 1024 B: a power of two already
malloc id=2 size=1500     # 1536 B rounds up to the next power of two: 2048 B at devBase+1024
`,
			blocks: []policies.Block{{devBase, 1024}, {devBase + 1024, 2048}},
			peak:   seg,
			allocs: 1,
		},
		{
			name:   "coalescing both sides, empty_cache, large segments",
			policy: "tlsf",
			trace: `
malloc id=1 size=4MiB     # over segment_size: a 4 MiB segment at devBase, all of it
malloc id=2 size=1MiB     # a 2 MiB segment at devBase+4MiB; 1 MiB left at devBase+5MiB
malloc id=3 size=512KiB   # devBase+5MiB; 512 KiB left at devBase+5.5MiB
free id=2                 # its neighbour is live: no merge
free id=3                 # merges with both neighbours: the whole segment is one free block
empty_cache               # that segment goes back
malloc id=4 size=2MiB     # a new segment at devBase+6MiB
`,
			blocks: []policies.Block{
				{devBase, 4 * sMiB}, {devBase + 4*sMiB, sMiB}, {devBase + 5*sMiB, 512 * sKiB}, {devBase + 6*sMiB, 2 * sMiB},
			},
			peak:      6 * sMiB,
			allocs:    3,
			frees:     1,
			checkFree: true,
		},
		{
			name:     "retry",
			policy:   "tlsf",
			capacity: 6 * sMiB,
			trace: `
malloc id=1 size=1MiB     # 0: segment A at devBase
malloc id=2 size=1536KiB  # 1: A's 1 MiB rest is too small: segment B at devBase+2MiB
free id=1                 # 2: A wholly free, cached
malloc id=3 size=3MiB     # 3: no free block is large enough; a 4 MiB segment is refused (8 > 6 MiB);
                          #    A goes back; the retry gets devBase+4MiB
malloc id=4 size=2MiB     # 4: B's and the new segment's rests are too small, a segment is refused,
                          #    none is wholly free: OOM
`,
			blocks:  []policies.Block{{devBase, sMiB}, {devBase + 2*sMiB, 1536 * sKiB}, {devBase + 4*sMiB, 3 * sMiB}},
			ooms:    []int{4},
			peak:    6 * sMiB,
			allocs:  3,
			frees:   1,
			retries: 1,
		},
		{
			name:     "release",
			policy:   "tlsf",
			settings: policies.Settings{"release": "true"},
			trace: `
malloc id=1 size=1        # segment at devBase
free id=1                 # wholly free: back at once
malloc id=2 size=1        # a new segment at devBase+2MiB
`,
			blocks: []policies.Block{{devBase, 256}, {devBase + seg, 256}},
			peak:   seg,
			allocs: 2,
			frees:  1,
		},
		{
			name:     "segment_size",
			policy:   "tlsf",
			settings: policies.Settings{"segment_size": "5MiB"},
			// 5 MiB rounds up to a 6 MiB segment. The second malloc,
			// 6 MiB-512 B, would fit in the rest (6 MiB-256 B), but it is
			// rounded up to its class boundary, 6 MiB (classes of
			// 128 KiB in [4 MiB, 8 MiB)), and the rest is in the class
			// below: a segment of its own at devBase+6MiB, all of it.
			trace:  "malloc id=1 size=1\nmalloc id=2 size=6290944\n",
			blocks: []policies.Block{{devBase, 256}, {devBase + 6*sMiB, 6 * sMiB}},
			peak:   12 * sMiB,
			allocs: 2,
		},
		{
			name:   "size 0",
			policy: "tlsf",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestTLSFSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"tlsf", policies.Settings{"alignment": "3"}, "alignment"},
		{"tlsf", policies.Settings{"alignment": "4MiB"}, "alignment"},
		{"tlsf", policies.Settings{"alignment": "x"}, "alignment"},
		{"tlsf", policies.Settings{"sl_log2": "7"}, "sl_log2"},
		{"tlsf", policies.Settings{"sl_log2": "-1"}, "sl_log2"},
		{"tlsf", policies.Settings{"segment_size": "0"}, "segment_size"},
		{"tlsf", policies.Settings{"class_rounding": "maybe"}, "class_rounding"},
		{"tlsf", policies.Settings{"release": "2"}, "release"},
		{"tlsf", policies.Settings{"fli": "30"}, "fli"},
	})
}

func TestTLSFInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"release": "true"},
		{"class_rounding": "false", "sl_log2": "3", "alignment": "512"},
		{"sl_log2": "0", "alignment": "1", "segment_size": "64MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkHookInvariants(t, "tlsf", s, 256*sMiB, 0, true)
		})
	}
}

func TestTLSFFreeUnknown(t *testing.T) {
	r := driveSimple(t, "tlsf", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 256, devBase + 1, devBase + 2*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkTLSF(b *testing.B) {
	b.Run("sim", func(b *testing.B) { benchSimple(b, "tlsf", nil, func() policies.Device { return sim.NewDevice(0) }) })
	b.Run("null", func(b *testing.B) {
		benchSimple(b, "tlsf", nil, func() policies.Device { return &nullDevice{next: devBase} })
	})
}
