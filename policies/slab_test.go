package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
)

func TestSlabReplay(t *testing.T) {
	const slab = 2 * sMiB // the default slab_size
	runSimpleCases(t, []simpleCase{
		{
			name:   "classes, slabs and own segments",
			policy: "slab",
			trace: `
malloc id=1 size=100      # 0: class 512 B: slab A at devBase (4096 objects), object 0
malloc id=2 size=512      # 1: object 1: devBase+512
malloc id=3 size=513      # 2: class 1 KiB: slab B at devBase+2MiB
free id=1                 # 3: object 0 of A free
malloc id=4 size=200      # 4: the freed object: devBase
malloc id=5 size=1MiB     # 5: class 1 MiB: slab C at devBase+4MiB (2 objects)
malloc id=6 size=1MiB     # 6: devBase+5MiB; C full
malloc id=7 size=700KiB   # 7: class 1 MiB: slab D at devBase+6MiB
malloc id=8 size=1048577  # 8: over the largest class: a 2 MiB segment at devBase+8MiB
free id=8                 # 9: device free at once
`,
			blocks: []policies.Block{
				{devBase, 512}, {devBase + 512, 512}, {devBase + slab, 1024}, {devBase, 512},
				{devBase + 2*slab, sMiB}, {devBase + 5*sMiB, sMiB}, {devBase + 3*slab, sMiB},
				{devBase + 4*slab, 2 * sMiB},
			},
			peak:   5 * slab,
			allocs: 5,
			frees:  1,
			// A: 4094 free objects of 512 B; B: 2047 of 1 KiB; D: 1 of 1 MiB.
			checkFree: true, freeTotal: 4094*512 + 2047*1024 + sMiB, freeLargest: sMiB,
		},
		{
			name:   "the most recently freed-into slab first",
			policy: "slab",
			trace: `
malloc id=1 size=1MiB   # slab A at devBase
malloc id=2 size=1MiB   # devBase+1MiB; A full
malloc id=3 size=1MiB   # slab B at devBase+2MiB
free id=1               # A has a free object again: to the front of the list
malloc id=4 size=1MiB   # from A: devBase
malloc id=5 size=1MiB   # A full again: from B, devBase+3MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + slab, sMiB}, {devBase, sMiB}, {devBase + 3*sMiB, sMiB},
			},
			peak:      2 * slab,
			allocs:    2,
			checkFree: true,
		},
		{
			name:     "custom classes and slab_size",
			policy:   "slab",
			settings: policies.Settings{"classes": "3000, 1000", "slab_size": "10000"},
			trace: `
malloc id=1 size=1      # class 1000: slab A of 10000 B at devBase (10 objects)
malloc id=2 size=2500   # class 3000: slab B at devBase+2MiB (3 objects, 1000 B wasted)
malloc id=3 size=3001   # over the largest class: a 2 MiB segment at devBase+4MiB
malloc id=4 size=1000   # class 1000: devBase+1000
`,
			blocks:    []policies.Block{{devBase, 1000}, {devBase + 2*sMiB, 3000}, {devBase + 4*sMiB, 2 * sMiB}, {devBase + 1000, 1000}},
			peak:      2*10000 + 2*sMiB,
			allocs:    3,
			checkFree: true, freeTotal: 8*1000 + 2*3000, freeLargest: 3000,
		},
		{
			name:     "release",
			policy:   "slab",
			settings: policies.Settings{"release": "true"},
			trace: `
malloc id=1 size=512   # slab at devBase
free id=1              # empty: back at once
malloc id=2 size=512   # a new slab at devBase+2MiB
`,
			blocks: []policies.Block{{devBase, 512}, {devBase + slab, 512}},
			peak:   slab,
			allocs: 2,
			frees:  1,
		},
		{
			name:   "empty_cache",
			policy: "slab",
			trace: `
malloc id=1 size=512   # slab at devBase
free id=1              # empty, cached
malloc id=2 size=512   # devBase again
empty_cache            # the slab is not empty: nothing
free id=2
empty_cache            # the slab goes back
`,
			blocks:    []policies.Block{{devBase, 512}, {devBase, 512}},
			peak:      slab,
			allocs:    1,
			frees:     1,
			checkFree: true,
		},
		{
			name:     "retry",
			policy:   "slab",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=512    # 0: slab A at devBase
malloc id=2 size=1024   # 1: slab B at devBase+2MiB
free id=1               # 2: A empty, cached
malloc id=3 size=2048   # 3: a new slab is refused (6 > 4 MiB); A goes back; the retry gets devBase+4MiB
malloc id=4 size=4096   # 4: a new slab is refused, no slab is empty: OOM
`,
			blocks:  []policies.Block{{devBase, 512}, {devBase + slab, 1024}, {devBase + 2*slab, 2048}},
			ooms:    []int{4},
			peak:    4 * sMiB,
			allocs:  3,
			frees:   1,
			retries: 1,
		},
		{
			name:   "size 0",
			policy: "slab",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestSlabSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"slab", policies.Settings{"classes": ""}, "classes"},
		{"slab", policies.Settings{"classes": "512,x"}, "classes"},
		{"slab", policies.Settings{"classes": "512,512"}, "classes"},
		{"slab", policies.Settings{"classes": "0"}, "classes"},
		{"slab", policies.Settings{"classes": "4MiB"}, "classes"},
		{"slab", policies.Settings{"slab_size": "1KiB"}, "slab_size"},
		{"slab", policies.Settings{"slab_size": "abc"}, "slab_size"},
		{"slab", policies.Settings{"classes": "1", "slab_size": "8GiB"}, "slab_size"},
		{"slab", policies.Settings{"release": "2"}, "release"},
		{"slab", policies.Settings{"size_classes": "512"}, "size_classes"},
	})
}

func TestSlabInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"release": "true"},
		{"classes": "256,768,3000,100000", "slab_size": "1MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "slab", s, 512*sMiB, false)
		})
	}
}

func TestSlabFreeUnknown(t *testing.T) {
	r := driveSimple(t, "slab", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 512, devBase + 1, devBase + 2*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}
