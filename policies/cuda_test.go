package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
)

func TestCUDAReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "every malloc and free is a device call",
			policy: "cuda",
			trace: `
malloc id=1 size=1000   # 1024 B (512 B steps) at the first segment
malloc id=2 size=512    # the next 2 MiB-aligned address
free id=1               # device free: 512 B reserved
malloc id=3 size=3MiB   # 3 MiB + 512 B reserved: the peak
free id=2
free id=3
`,
			blocks:    []policies.Block{{devBase, 1024}, {devBase + 2*sMiB, 512}, {devBase + 4*sMiB, 3 * sMiB}},
			peak:      3*sMiB + 512,
			allocs:    3,
			frees:     3,
			checkFree: true,
		},
		{
			name:   "size 0 is NULL without a device call",
			policy: "cuda",
			trace: `
malloc id=1 size=0
free id=1
`,
			blocks: []policies.Block{{0, 0}},
		},
		{
			name:     "device refusal is an OOM",
			policy:   "cuda",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=3MiB   # 0: devBase
malloc id=2 size=2MiB   # 1: 3 + 2 MiB > 4 MiB: OOM
free id=1               # 2
malloc id=3 size=2MiB   # 3: next fresh address: devBase+4MiB (3 MiB rounded to 2 MiB steps)
free id=2               # 4: its malloc failed: nothing to free
`,
			blocks: []policies.Block{{devBase, 3 * sMiB}, {devBase + 4*sMiB, 2 * sMiB}},
			ooms:   []int{1},
			peak:   3 * sMiB,
			allocs: 2,
			frees:  1,
		},
		{
			name:     "granularity 2 MiB",
			policy:   "cuda",
			settings: policies.Settings{"granularity": "2MiB"},
			trace: `
malloc id=1 size=1          # 2 MiB
malloc id=2 size=2097153    # 2 MiB + 1 B: 4 MiB
`,
			blocks: []policies.Block{{devBase, 2 * sMiB}, {devBase + 2*sMiB, 4 * sMiB}},
			peak:   6 * sMiB,
			allocs: 2,
		},
		{
			name:     "granularity 256 B",
			policy:   "cuda",
			settings: policies.Settings{"granularity": "256"},
			trace:    "malloc id=1 size=100\n",
			blocks:   []policies.Block{{devBase, 256}},
			peak:     256,
			allocs:   1,
		},
	})
}

func TestCUDASettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"cuda", policies.Settings{"granularity": "0"}, "granularity"},
		{"cuda", policies.Settings{"granularity": "lots"}, "granularity"},
		{"cuda", policies.Settings{"granularity": "4MiB"}, "granularity"},
		{"cuda", policies.Settings{"rounding": "512"}, "rounding"},
	})
}

func TestCUDAInvariants(t *testing.T) {
	checkInvariants(t, "cuda", nil, 512*sMiB, true)
}

func TestCUDAFreeUnknown(t *testing.T) {
	r := driveSimple(t, "cuda", nil, 0, "malloc id=1 size=1\n")
	if err := r.policy.Free(devBase+2*sMiB, 0); err == nil {
		t.Errorf("Free of a never-allocated address succeeded")
	}
}
