package policies_test

import (
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// The region is the first device segment, at devBase; overflow segments
// follow at the next 2 MiB-aligned addresses.
func TestWorkspaceReplay(t *testing.T) {
	runHookCases(t, []hookCase{
		{simpleCase: simpleCase{
			name:     "bump allocation, reset when nothing is live",
			policy:   "workspace",
			settings: policies.Settings{"size": "2MiB"},
			trace: `
malloc id=1 size=1000   # the region, 2 MiB at devBase; 1024 B at its start, the top at 1024
malloc id=2 size=3000   # 3072 B at devBase+1024, the top at 4096
free id=1               # a hole below the top, not reused
malloc id=3 size=100    # 256 B at devBase+4096
free id=2
free id=3               # nothing is live in the region: the top goes back to its start
malloc id=4 size=100    # devBase
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 3072}, {devBase + 4096, 256}, {devBase, 256},
			},
			peak:      2 * sMiB,
			allocs:    1,
			checkFree: true, freeTotal: 2*sMiB - 256, freeLargest: 2*sMiB - 256,
		}},
		{simpleCase: simpleCase{
			name:     "overflow to the device",
			policy:   "workspace",
			settings: policies.Settings{"size": "3MiB"}, // rounded up to 4 MiB
			trace: `
malloc id=1 size=3MiB     # the region, 4 MiB at devBase: devBase, the top at 3 MiB
malloc id=2 size=1500KiB  # does not fit above the top: a segment of its own at devBase+4MiB
malloc id=3 size=1MiB     # fits: devBase+3MiB; the region is full
malloc id=4 size=1        # 512 B at devBase+6MiB
free id=2                 # back to the device
free id=4
`,
			blocks: []policies.Block{
				{devBase, 3 * sMiB}, {devBase + 4*sMiB, 1500 * sKiB}, {devBase + 3*sMiB, sMiB}, {devBase + 6*sMiB, 512},
			},
			peak:      4*sMiB + 1500*sKiB + 512,
			allocs:    3,
			frees:     2,
			checkFree: true,
		}},
		{simpleCase: simpleCase{
			name:   "sized from the hint: 1.2 times the peak requested",
			policy: "workspace",
			trace: `
malloc id=1 size=10MiB   # the region, 12 MiB at devBase: devBase
malloc id=2 size=2MiB    # devBase+10MiB: full
malloc id=3 size=1       # overflow: 512 B at devBase+12MiB
`,
			blocks: []policies.Block{{devBase, 10 * sMiB}, {devBase + 10*sMiB, 2 * sMiB}, {devBase + 12*sMiB, 512}},
			peak:   12*sMiB + 512,
			allocs: 2,
		}, hint: 10 * sMiB},
		{simpleCase: simpleCase{
			name:     "the size setting wins over the hint; factor",
			policy:   "workspace",
			settings: policies.Settings{"factor": "2"},
			trace:    "malloc id=1 size=1\n", // the region, 2 * 3 MiB = 6 MiB
			blocks:   []policies.Block{{devBase, 256}},
			peak:     6 * sMiB,
			allocs:   1,
		}, hint: 3 * sMiB},
		{simpleCase: simpleCase{
			name:     "iteration markers roll the top back to the highest live block",
			policy:   "workspace",
			settings: policies.Settings{"size": "2MiB"},
			trace: `
malloc id=1 size=1MiB              # weights: devBase
marker label="iteration 1 batch=8" # the top stays at 1 MiB, the end of the weights
malloc id=2 size=256KiB            # devBase+1MiB
malloc id=3 size=256KiB            # devBase+1.25MiB
free id=2
free id=3
marker label="iteration 2 batch=8" # back down to the end of the weights
malloc id=4 size=512KiB            # devBase+1MiB
free id=4
marker label="eval"                # not an iteration marker: the top stays at 1.5 MiB
malloc id=5 size=256KiB            # devBase+1.5MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, 256 * sKiB}, {devBase + 1280*sKiB, 256 * sKiB},
				{devBase + sMiB, 512 * sKiB}, {devBase + 1536*sKiB, 256 * sKiB},
			},
			peak:      2 * sMiB,
			allocs:    1,
			checkFree: true, freeTotal: 256 * sKiB, freeLargest: 256 * sKiB,
		}},
		{simpleCase: simpleCase{
			name:     "reset_marker",
			policy:   "workspace",
			settings: policies.Settings{"size": "2MiB", "reset_marker": "step"},
			trace: `
malloc id=1 size=1MiB        # devBase
malloc id=2 size=512KiB      # devBase+1MiB
free id=2
marker label="iteration 1"   # not a reset marker here
malloc id=3 size=256KiB      # devBase+1.5MiB
free id=3
marker label="step 7"        # back to the end of id 1
malloc id=4 size=256KiB      # devBase+1MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + sMiB, 512 * sKiB}, {devBase + 1536*sKiB, 256 * sKiB}, {devBase + sMiB, 256 * sKiB},
			},
			peak:   2 * sMiB,
			allocs: 1,
		}},
		{simpleCase: simpleCase{
			name:   "no size, no hint: sized after a warm-up iteration",
			policy: "workspace",
			trace: `
marker label="iteration 1"   # the first iteration marker starts the warm-up iteration
malloc id=1 size=1MiB        # to the device: devBase
malloc id=2 size=3MiB        # devBase+2MiB
free id=2
malloc id=3 size=4MiB        # devBase+6MiB; 5 MiB live, the peak so far
free id=3
marker label="iteration 2"   # the second ends it: the region is to be 1.2 * 5 MiB, rounded to 6 MiB
malloc id=4 size=4MiB        # the region, at devBase+10MiB: devBase+10MiB
`,
			blocks: []policies.Block{
				{devBase, sMiB}, {devBase + 2*sMiB, 3 * sMiB}, {devBase + 6*sMiB, 4 * sMiB}, {devBase + 10*sMiB, 4 * sMiB},
			},
			peak:   sMiB + 6*sMiB,
			allocs: 4,
			frees:  2,
		}},
		{simpleCase: simpleCase{
			name:   "no size, no hint: the warm-up ends when nothing is live",
			policy: "workspace",
			trace: `
malloc id=1 size=1MiB   # to the device: devBase
free id=1               # nothing live: the region is to be 1.2 MiB, rounded to 2 MiB
malloc id=2 size=1MiB   # the region, at devBase+2MiB
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + 2*sMiB, sMiB}},
			peak:   2 * sMiB,
			allocs: 2,
			frees:  1,
		}},
		{simpleCase: simpleCase{
			name:     "an overflow refused: OOM",
			policy:   "workspace",
			settings: policies.Settings{"size": "4MiB"},
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=1MiB   # 0: the region is granted: devBase
malloc id=2 size=4MiB   # 1: does not fit above the top; 5 MiB is refused: OOM
`,
			blocks: []policies.Block{{devBase, sMiB}},
			ooms:   []int{1},
			peak:   4 * sMiB,
			allocs: 1,
		}},
		{simpleCase: simpleCase{
			name:     "the region refused",
			policy:   "workspace",
			settings: policies.Settings{"size": "8MiB"},
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=1MiB   # the region (8 MiB) is refused: a segment of its own at devBase
free id=1
malloc id=2 size=1MiB   # refused again: devBase+2MiB
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + 2*sMiB, sMiB}},
			peak:   sMiB,
			allocs: 2,
			frees:  1,
		}},
		{simpleCase: simpleCase{
			name:   "size 0",
			policy: "workspace",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		}},
	})
}

func TestWorkspaceSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"workspace", policies.Settings{"size": "big"}, "size"},
		{"workspace", policies.Settings{"size": "0"}, "size"},
		{"workspace", policies.Settings{"factor": "x"}, "factor"},
		{"workspace", policies.Settings{"factor": "0"}, "factor"},
		{"workspace", policies.Settings{"factor": "-1"}, "factor"},
		{"workspace", policies.Settings{"factor": "NaN"}, "factor"},
		{"workspace", policies.Settings{"alignment": "3"}, "alignment"},
		{"workspace", policies.Settings{"alignment": "4MiB"}, "alignment"},
		{"workspace", policies.Settings{"region": "1GiB"}, "region"},
	})
}

func TestWorkspaceInvariants(t *testing.T) {
	for _, c := range []struct {
		s    policies.Settings
		hint uint64
	}{
		{policies.Settings{"size": "64MiB"}, 0},
		{nil, 100 * sMiB},
		{nil, 0},
		{policies.Settings{"reset_marker": "", "alignment": "1"}, 40 * sMiB},
	} {
		t.Run(fmtSettings(c.s), func(t *testing.T) {
			checkHookInvariants(t, "workspace", c.s, 256*sMiB, c.hint, false)
		})
	}
}

func TestWorkspaceFreeUnknown(t *testing.T) {
	r := driveHooks(t, "workspace", policies.Settings{"size": "2MiB"}, 0, 0,
		"malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\nmalloc id=3 size=3MiB\n")
	for _, addr := range []uint64{devBase + 256, devBase + 1, devBase + 4*sMiB + 512, 0x1234} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func BenchmarkWorkspace(b *testing.B) {
	s := policies.Settings{"size": "4GiB"}
	b.Run("sim", func(b *testing.B) {
		benchSimple(b, "workspace", s, func() policies.Device { return sim.NewDevice(0) })
	})
	b.Run("null", func(b *testing.B) {
		benchSimple(b, "workspace", s, func() policies.Device { return &nullDevice{next: devBase} })
	})
}
