package policies_test

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

func TestBFCReplay(t *testing.T) {
	runSimpleCases(t, []simpleCase{
		{
			name:   "rounding, best fit, split rule and region doubling",
			policy: "bfc",
			trace: `
malloc id=1 size=1000   # 0: 1024 B. No chunk: region A of 2 MiB at devBase (next region 4 MiB);
                        #    2 MiB >= 2*1024: split, devBase, [devBase+1024, 2MiB-1024] free
malloc id=2 size=1      # 1: 256 B: devBase+1024, [devBase+1280, 2MiB-1280] free
malloc id=3 size=1MiB   # 2: the free chunk is < 2 MiB and leaves < 128 MiB: not split,
                        #    the whole 2MiB-1280 at devBase+1280
free id=2               # 3: both neighbours live: [devBase+1024, 256] free
malloc id=4 size=200    # 4: 256 B, the exact fit devBase+1024
malloc id=5 size=3MiB   # 5: no chunk: region B of 4 MiB at devBase+2MiB (next 8 MiB); not split
malloc id=6 size=9MiB   # 6: 9 MiB > 8 MiB: the region doubles to 16 MiB (C at devBase+6MiB), and
                        #    as it was raised for the request, the next one stays 16 MiB; not split
malloc id=7 size=1      # 7: region D of 16 MiB at devBase+22MiB (next 32 MiB); split
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 256}, {devBase + 1280, 2*sMiB - 1280}, {devBase + 1024, 256},
				{devBase + 2*sMiB, 4 * sMiB}, {devBase + 6*sMiB, 16 * sMiB}, {devBase + 22*sMiB, 256},
			},
			peak:      (2 + 4 + 16 + 16) * sMiB,
			allocs:    4,
			checkFree: true, freeTotal: 16*sMiB - 256, freeLargest: 16*sMiB - 256,
		},
		{
			name:     "XLA's preallocation: memory_fraction of the capacity, one region",
			policy:   "bfc",
			settings: policies.Settings{"allow_growth": "false", "memory_fraction": "0.75"},
			capacity: 8 * sMiB,
			trace: `
malloc id=1 size=5MiB   # 0: the limit is 0.75 * 8 MiB = 6 MiB, one region of it at the first
                        #    malloc; 6 MiB < 2*5 MiB and the 1 MiB rest < 128 MiB: not split
malloc id=2 size=512    # 1: no free chunk, no room for a region: OOM
free id=1               # 2
malloc id=3 size=1MiB   # 3: 6 MiB >= 2 MiB: split, devBase
`,
			blocks: []policies.Block{{devBase, 6 * sMiB}, {devBase, sMiB}},
			ooms:   []int{1},
			peak:   6 * sMiB,
			allocs: 1,
		},
		{
			name:     "coalesce_regions: adjacent segments make one region",
			policy:   "bfc",
			settings: policies.Settings{"coalesce_regions": "true"},
			trace: `
malloc id=1 size=1MiB   # 0: region A of 2 MiB at devBase, split: [devBase+1MiB, 1MiB] free
malloc id=2 size=3MiB   # 1: no chunk: a 4 MiB segment at devBase+2MiB, where A ends: A grows to
                        #    6 MiB and the new chunk merges with the free last one:
                        #    [devBase+1MiB, 5MiB]; 5 MiB < 2*3 MiB and the 2 MiB rest
                        #    < 128 MiB: not split, devBase+1MiB of 5 MiB
free id=1               # 2: [devBase, 1MiB] merges with nothing (id 2 is live)
free id=2               # 3: all of A free: one chunk of 6 MiB
malloc id=3 size=5MiB   # 4: fits A's 6 MiB chunk across both segments: devBase, not split
`,
			blocks: []policies.Block{{devBase, sMiB}, {devBase + sMiB, 5 * sMiB}, {devBase, 6 * sMiB}},
			peak:   6 * sMiB,
			allocs: 2,
		},
		{
			name:   "coalesce with both neighbours",
			policy: "bfc",
			trace: `
malloc id=1 size=256        # region of 2 MiB at devBase: devBase
malloc id=2 size=256        # devBase+256
malloc id=3 size=256        # devBase+512, [devBase+768, 2MiB-768] free
free id=1                   # [devBase, 256] free
free id=3                   # merges with the tail: [devBase+512, 2MiB-512]
free id=2                   # merges with both: the whole region
malloc id=4 size=1048577    # 1MiB+256: the region is < twice that: all 2 MiB
`,
			blocks: []policies.Block{{devBase, 256}, {devBase + 256, 256}, {devBase + 512, 256}, {devBase, 2 * sMiB}},
			peak:   2 * sMiB,
			allocs: 1,
			// Nothing free.
			checkFree: true,
		},
		{
			name:   "split when the remainder is 128 MiB or more",
			policy: "bfc",
			trace: `
malloc id=1 size=300MiB   # 0: the region doubles from 2 MiB to 512 MiB (devBase), next stays 512 MiB;
                          #    512 < 600 but the remainder 212 MiB >= 128 MiB: split
malloc id=2 size=100MiB   # 1: 212 MiB >= 200 MiB: split, devBase+300MiB, 112 MiB left
malloc id=3 size=60MiB    # 2: 112 < 120 and 52 < 128: the whole 112 MiB at devBase+400MiB
malloc id=4 size=1        # 3: region of 512 MiB at devBase+512MiB (next 1 GiB)
`,
			blocks: []policies.Block{
				{devBase, 300 * sMiB}, {devBase + 300*sMiB, 100 * sMiB}, {devBase + 400*sMiB, 112 * sMiB},
				{devBase + 512*sMiB, 256},
			},
			peak:   1024 * sMiB,
			allocs: 2,
		},
		{
			name:     "without allow_growth: one region of the capacity",
			policy:   "bfc",
			settings: policies.Settings{"allow_growth": "false"},
			capacity: 64 * sMiB,
			trace: `
malloc id=1 size=1MiB     # 0: region of 64 MiB at devBase; split: devBase, 63 MiB free
malloc id=2 size=62MiB    # 1: not split (63 < 124, 1 < 128): 63 MiB at devBase+1MiB
malloc id=3 size=256      # 2: no chunk, no room for a region, no free region: OOM
free id=1                 # 3: [devBase, 1 MiB] free
malloc id=4 size=512KiB   # 4: 1 MiB >= 2*512 KiB: split, devBase
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase + sMiB, 63 * sMiB}, {devBase, 512 * sKiB}},
			ooms:      []int{2},
			peak:      64 * sMiB,
			allocs:    1,
			checkFree: true, freeTotal: 512 * sKiB, freeLargest: 512 * sKiB,
		},
		{
			name:     "growth under a capacity, then garbage collection",
			policy:   "bfc",
			capacity: 10 * sMiB,
			trace: `
malloc id=1 size=2MiB   # 0: region A of 2 MiB at devBase, whole (next 4 MiB)
malloc id=2 size=3MiB   # 1: region B of 4 MiB at devBase+2MiB, whole (next 8 MiB)
malloc id=3 size=1MiB   # 2: 8 MiB > the 4 MiB left: region C of 4 MiB at devBase+6MiB (next 16 MiB);
                        #    split: devBase+6MiB, [devBase+7MiB, 3 MiB] free
malloc id=4 size=4MiB   # 3: no chunk, no room, no wholly free region: OOM
free id=1               # 4: A wholly free
free id=2               # 5: B wholly free
malloc id=5 size=5MiB   # 6: no chunk fits 5 MiB, no room; freeing A and B (6 MiB) makes room: both go
                        #    back (a retry) and region D of min(16, 6) MiB comes at devBase+10MiB, whole
`,
			blocks: []policies.Block{
				{devBase, 2 * sMiB}, {devBase + 2*sMiB, 4 * sMiB}, {devBase + 6*sMiB, sMiB}, {devBase + 10*sMiB, 6 * sMiB},
			},
			ooms:      []int{3},
			peak:      10 * sMiB,
			allocs:    4,
			frees:     2,
			retries:   1,
			checkFree: true, freeTotal: 3 * sMiB, freeLargest: 3 * sMiB,
		},
		{
			name:     "garbage collection",
			policy:   "bfc",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=2MiB   # region A of 2 MiB at devBase (next 4 MiB)
free id=1               # A wholly free
malloc id=2 size=3MiB   # 2 MiB left < 3 MiB; freeing A makes room: it goes, and a 4 MiB region at devBase+2MiB
`,
			blocks:  []policies.Block{{devBase, 2 * sMiB}, {devBase + 2*sMiB, 4 * sMiB}},
			peak:    4 * sMiB,
			allocs:  2,
			frees:   1,
			retries: 1,
		},
		{
			name:     "garbage_collection false",
			policy:   "bfc",
			settings: policies.Settings{"garbage_collection": "false"},
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=2MiB   # 0: region A at devBase
free id=1               # 1
malloc id=2 size=3MiB   # 2: 2 MiB left < 3 MiB, A stays: OOM
`,
			blocks: []policies.Block{{devBase, 2 * sMiB}},
			ooms:   []int{2},
			peak:   2 * sMiB,
			allocs: 1,
		},
		{
			name:     "memory_limit",
			policy:   "bfc",
			settings: policies.Settings{"memory_limit": "3MiB"},
			trace: `
malloc id=1 size=1536KiB   # 0: region of 2 MiB at devBase (next 4 MiB); 2 < 3 MiB: not split
malloc id=2 size=1MiB      # 1: 1 MiB left under the limit: region of min(4, 1) MiB at devBase+2MiB
malloc id=3 size=256       # 2: nothing left: OOM
`,
			blocks: []policies.Block{{devBase, 2 * sMiB}, {devBase + 2*sMiB, sMiB}},
			ooms:   []int{2},
			peak:   3 * sMiB,
			allocs: 2,
		},
		{
			name:     "backpedal once when the device refuses",
			policy:   "bfc",
			settings: policies.Settings{"memory_limit": "8MiB"},
			capacity: 5 * sMiB,
			trace: `
malloc id=1 size=1      # 0: region A of 2 MiB at devBase (next 4 MiB)
malloc id=2 size=2MiB   # 1: region of 4 MiB: the device refuses (6 > 5 MiB). Backpedal, 0.9 at a time
                        #    rounded up to 256 B: 3774976 refused (5872128 > 5242880), 3397632 refused
                        #    (5494784), 3057920 fits (5155072): three retries; region B at devBase+2MiB,
                        #    not split (3057920 < 4 MiB); next region 8 MiB
malloc id=3 size=1      # 2: devBase+256 in A
malloc id=4 size=2MiB   # 3: region of min(8 MiB, 3133440 left) is refused; no second backpedal: OOM
`,
			blocks:  []policies.Block{{devBase, 256}, {devBase + 2*sMiB, 3057920}, {devBase + 256, 256}},
			ooms:    []int{3},
			peak:    2*sMiB + 3057920,
			allocs:  2,
			retries: 3,
		},
		{
			name:   "size 0",
			policy: "bfc",
			trace:  "malloc id=1 size=0\nfree id=1\n",
			blocks: []policies.Block{{0, 0}},
		},
	})
}

func TestBFCSettings(t *testing.T) {
	runSettingCases(t, []settingCase{
		{"bfc", policies.Settings{"allow_growth": "maybe"}, "allow_growth"},
		{"bfc", policies.Settings{"allow_growth": "false"}, "allow_growth"}, // no capacity, no limit
		{"bfc", policies.Settings{"garbage_collection": "2"}, "garbage_collection"},
		{"bfc", policies.Settings{"memory_limit": "lots"}, "memory_limit"},
		{"bfc", policies.Settings{"memory_limit": "100"}, "memory_limit"},
		{"bfc", policies.Settings{"growth": "true"}, "growth"},
	})
}

func TestBFCInvariants(t *testing.T) {
	for _, s := range []policies.Settings{
		nil,
		{"allow_growth": "false"},
		{"garbage_collection": "false"},
		{"memory_limit": "300MiB"},
	} {
		t.Run(fmtSettings(s), func(t *testing.T) {
			checkInvariants(t, "bfc", s, 512*sMiB, true)
		})
	}
}

func TestBFCFreeUnknown(t *testing.T) {
	r := driveSimple(t, "bfc", nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
	for _, addr := range []uint64{devBase + 256, devBase + 1, devBase + 2*sMiB} {
		if err := r.policy.Free(addr, 0); err == nil {
			t.Errorf("Free(%#x) of no live block succeeded", addr)
		}
	}
}

func TestBFCStreamInvariants(t *testing.T) {
	checkStreamInvariants(t, "bfc", nil, 512*sMiB)
}

func BenchmarkBFC(b *testing.B) { benchPolicy(b, "bfc", nil) }

// checkStreamInvariants is checkInvariants over four streams: each malloc
// and each free on a random one, so that blocks freed on another stream
// than their malloc's are common. It checks after each operation that no
// two live blocks overlap, that each lies inside a live device segment,
// and that reserved bytes are allocated plus free bytes (FreeSpacer).
func checkStreamInvariants(t *testing.T, name string, s policies.Settings, capacity uint64) {
	t.Helper()
	dev := sim.NewDevice(capacity)
	p, err := policies.New(name, dev, s)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(3))
	var live []policies.Block
	ooms := 0
	for op := range 6000 {
		if len(live) > 0 && rng.Intn(100) < 47 {
			i := rng.Intn(len(live))
			b := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			if err := p.Free(b.Addr, uint64(rng.Intn(4))); err != nil {
				t.Fatalf("op %d: free of %#x: %v", op, b.Addr, err)
			}
		} else {
			size := randomSize(rng)
			b, err := p.Malloc(size, uint64(rng.Intn(4)))
			if err != nil {
				if !errors.Is(err, policies.ErrOutOfMemory) {
					t.Fatalf("op %d: malloc of %d bytes: %v", op, size, err)
				}
				ooms++
				continue
			}
			if b.Size < size {
				t.Fatalf("op %d: malloc of %d bytes gave a block of %d", op, size, b.Size)
			}
			if size > 0 {
				live = append(live, b)
			}
		}
		checkLayout(t, op, dev, p, live, true)
	}
	t.Logf("%d live blocks at the end, %d OOMs, %d device allocs, %d device frees, peak %d MiB",
		len(live), ooms, dev.Allocs(), dev.Frees(), dev.PeakReserved()/sMiB)
}

// benchPolicy runs benchSimple for the policy on the simulated device and
// on nullDevice.
func benchPolicy(b *testing.B, name string, s policies.Settings) {
	b.Run("sim", func(b *testing.B) {
		benchSimple(b, name, s, func() policies.Device { return sim.NewDevice(0) })
	})
	b.Run("null", func(b *testing.B) {
		benchSimple(b, name, s, func() policies.Device { return &nullDevice{next: devBase} })
	})
}

func TestBFCMemoryFractionErrors(t *testing.T) {
	dev := sim.NewDevice(8 << 20)
	for _, s := range []policies.Settings{
		{"memory_fraction": "0.5", "memory_limit": "1MiB"},
		{"memory_fraction": "0"},
		{"memory_fraction": "1.5"},
		{"memory_fraction": "x"},
	} {
		if _, err := policies.NewBFC(dev, s); err == nil {
			t.Errorf("settings %v: no error", s)
		}
	}
	if _, err := policies.NewBFC(sim.NewDevice(0), policies.Settings{"memory_fraction": "0.5"}); err == nil {
		t.Errorf("memory_fraction without a capacity: no error")
	}
}

// TestBFCMemoryFractionCard: on a device that stands for a card, the
// fraction is of the card's total memory, rounded up to 2 MiB as XLA takes
// it: 0.75 of the H200's 150109880320 bytes is 112582410240, which is
// 53683.48 pages of 2 MiB, so 53684 pages, 112583507968 bytes, the
// bytes_limit JAX reported there.
func TestBFCMemoryFractionCard(t *testing.T) {
	dev := sim.NewDevice(0)
	dev.SetCardMemory(150109880320)
	p, err := policies.NewBFC(dev, policies.Settings{"allow_growth": "false", "memory_fraction": "0.75"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Malloc(1000, 0); err != nil {
		t.Fatal(err)
	}
	if got := dev.PeakReserved(); got != 112583507968 {
		t.Errorf("preallocated region %d bytes, want 112583507968", got)
	}
}
