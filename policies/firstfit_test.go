package policies_test

import (
	"math/rand"
	"slices"
	"testing"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// forFitPolicies returns tc once for first-fit and once for best-fit, for
// traces where the two place every block alike.
func forFitPolicies(tcs ...simpleCase) []simpleCase {
	var out []simpleCase
	for _, tc := range tcs {
		for _, name := range []string{"first-fit", "best-fit"} {
			c := tc
			c.policy = name
			c.name = name + "/" + tc.name
			out = append(out, c)
		}
	}
	return out
}

func TestFitReplay(t *testing.T) {
	const seg = 2 * sMiB
	cases := forFitPolicies(
		simpleCase{
			name: "split and coalesce",
			trace: `
malloc id=1 size=1000      # 0: 1024 B at devBase, a 2 MiB segment
malloc id=2 size=512       # 1: devBase+1024
malloc id=3 size=4096      # 2: devBase+1536
free id=2                  # 3: [devBase+1024, 512 B] free between two live blocks
malloc id=4 size=100       # 4: 512 B: the hole at devBase+1024 (lowest, and an exact fit)
free id=1                  # 5: [devBase, 1024 B] free
free id=4                  # 6: coalesces with it: [devBase, 1536 B]
malloc id=5 size=1536      # 7: devBase
free id=3                  # 8: coalesces with the tail: [devBase+1536, 2 MiB - 1536]
malloc id=6 size=2095616   # 9: 2 MiB - 1536: the whole tail, no remainder
malloc id=7 size=1         # 10: segment full: a second one at devBase+2MiB
`,
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 512}, {devBase + 1536, 4096}, {devBase + 1024, 512},
				{devBase, 1536}, {devBase + 1536, seg - 1536}, {devBase + seg, 512},
			},
			peak:      2 * seg,
			allocs:    2,
			checkFree: true, freeTotal: seg - 512, freeLargest: seg - 512,
		},
		simpleCase{
			name:     "release a wholly free segment at once",
			settings: policies.Settings{"release": "true"},
			trace: `
malloc id=1 size=1MiB   # devBase
free id=1               # segment wholly free: device free
malloc id=2 size=1MiB   # a new segment at devBase+2MiB
free id=2               # device free
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase + seg, sMiB}},
			peak:      seg,
			allocs:    2,
			frees:     2,
			checkFree: true,
		},
		simpleCase{
			name: "keep a wholly free segment cached",
			trace: `
malloc id=1 size=1MiB   # devBase
free id=1               # cached
malloc id=2 size=1MiB   # devBase again
free id=2
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase, sMiB}},
			peak:      seg,
			allocs:    1,
			checkFree: true, freeTotal: seg, freeLargest: seg,
		},
		simpleCase{
			name: "empty_cache",
			trace: `
malloc id=1 size=1MiB   # segment A at devBase
malloc id=2 size=2MiB   # segment B at devBase+2MiB
empty_cache             # nothing wholly free
free id=1
free id=2
empty_cache             # A and B back to the device
malloc id=3 size=512    # segment C at devBase+4MiB
`,
			blocks:    []policies.Block{{devBase, sMiB}, {devBase + seg, seg}, {devBase + 2*seg, 512}},
			peak:      2 * seg,
			allocs:    3,
			frees:     2,
			checkFree: true, freeTotal: seg - 512, freeLargest: seg - 512,
		},
		simpleCase{
			name:     "retry succeeds",
			capacity: 6 * sMiB,
			trace: `
malloc id=1 size=2MiB   # 0: segment A at devBase, all of it
malloc id=2 size=512    # 1: segment B at devBase+2MiB
free id=1               # 2: A wholly free, cached
malloc id=3 size=3MiB   # 3: a 4 MiB segment is refused (4 + 4 > 6 MiB); A goes back; the retry gets devBase+4MiB
malloc id=4 size=5MiB   # 4: a 6 MiB segment is refused, nothing is wholly free: OOM, no retry
`,
			blocks:  []policies.Block{{devBase, seg}, {devBase + seg, 512}, {devBase + 2*seg, 3 * sMiB}},
			ooms:    []int{4},
			peak:    6 * sMiB,
			allocs:  3,
			frees:   1,
			retries: 1,
			// B's tail and the 1 MiB left in the 4 MiB segment.
			checkFree: true, freeTotal: seg - 512 + sMiB, freeLargest: seg - 512,
		},
		simpleCase{
			name:     "retry fails",
			capacity: 4 * sMiB,
			trace: `
malloc id=1 size=1MiB   # 0: segment A at devBase
malloc id=2 size=1MiB   # 1: devBase+1MiB, A full
malloc id=3 size=512    # 2: segment B at devBase+2MiB
free id=1               # 3
free id=2               # 4: A wholly free
malloc id=4 size=3MiB   # 5: 4 MiB refused (8 > 4); A goes back (2 MiB left); the retry is refused (6 > 4): OOM
malloc id=5 size=2MiB   # 6: B's free 2 MiB - 512 is too small; a 2 MiB segment fits: devBase+4MiB
`,
			blocks:  []policies.Block{{devBase, sMiB}, {devBase + sMiB, sMiB}, {devBase + seg, 512}, {devBase + 2*seg, seg}},
			ooms:    []int{5},
			peak:    4 * sMiB,
			allocs:  3,
			frees:   1,
			retries: 1,
		},
		simpleCase{
			name:     "alignment 256 B",
			settings: policies.Settings{"alignment": "256"},
			trace: `
malloc id=1 size=100   # 256 B
malloc id=2 size=300   # 512 B at devBase+256
`,
			blocks: []policies.Block{{devBase, 256}, {devBase + 256, 512}},
			peak:   seg,
			allocs: 1,
		},
		simpleCase{
			name:     "segment_size 20 MiB",
			settings: policies.Settings{"segment_size": "20MiB"},
			trace: `
malloc id=1 size=1       # a 20 MiB segment
malloc id=2 size=19MiB   # fits in its tail
malloc id=3 size=1MiB    # 1 MiB - 512 left: a new 20 MiB segment
`,
			blocks: []policies.Block{{devBase, 512}, {devBase + 512, 19 * sMiB}, {devBase + 20*sMiB, sMiB}},
			peak:   40 * sMiB,
			allocs: 2,
		},
		simpleCase{
			name:     "segment_size rounded up to 2 MiB",
			settings: policies.Settings{"segment_size": "3MiB"},
			trace: `
malloc id=1 size=1       # a 4 MiB segment
malloc id=2 size=5MiB    # larger than segment_size: 6 MiB at devBase+4MiB
`,
			blocks: []policies.Block{{devBase, 512}, {devBase + 4*sMiB, 5 * sMiB}},
			peak:   10 * sMiB,
			allocs: 2,
		},
		simpleCase{
			name: "size 0",
			trace: `
malloc id=1 size=0
free id=1
`,
			blocks: []policies.Block{{0, 0}},
		},
	)
	// Where the two differ: a small request between a larger hole at a
	// lower address and an exact hole at a higher one.
	const placement = `
malloc id=1 size=1024   # 0: devBase
malloc id=2 size=512    # 1: devBase+1024
malloc id=3 size=512    # 2: devBase+1536
malloc id=4 size=512    # 3: devBase+2048
free id=1               # 4: hole [devBase, 1024 B]
free id=3               # 5: hole [devBase+1536, 512 B]
malloc id=5 size=512    # 6
malloc id=6 size=512    # 7
malloc id=7 size=512    # 8
malloc id=8 size=2MiB   # 9: no hole of 2 MiB: a second segment at devBase+2MiB, all of it
malloc id=9 size=5MiB   # 10: a 6 MiB segment at devBase+4MiB, 1 MiB of it left free
`
	cases = append(cases,
		simpleCase{
			name:   "first-fit/lowest address",
			policy: "first-fit",
			trace:  placement,
			// 6: the 1 KiB hole at devBase is the lowest: split, [devBase+512, 512 B] stays free.
			// 7: devBase+512, the lowest hole. 8: devBase+1536.
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 512}, {devBase + 1536, 512}, {devBase + 2048, 512},
				{devBase, 512}, {devBase + 512, 512}, {devBase + 1536, 512},
				{devBase + seg, seg}, {devBase + 2*seg, 5 * sMiB},
			},
			peak:      10 * sMiB,
			allocs:    3,
			checkFree: true, freeTotal: seg - 2560 + sMiB, freeLargest: seg - 2560,
		},
		simpleCase{
			name:   "best-fit/smallest hole",
			policy: "best-fit",
			trace:  placement,
			// 6: the exact 512 B hole at devBase+1536. 7: the 1 KiB hole is now
			// the smallest that fits: devBase, split. 8: its rest, devBase+512.
			blocks: []policies.Block{
				{devBase, 1024}, {devBase + 1024, 512}, {devBase + 1536, 512}, {devBase + 2048, 512},
				{devBase + 1536, 512}, {devBase, 512}, {devBase + 512, 512},
				{devBase + seg, seg}, {devBase + 2*seg, 5 * sMiB},
			},
			peak:      10 * sMiB,
			allocs:    3,
			checkFree: true, freeTotal: seg - 2560 + sMiB, freeLargest: seg - 2560,
		},
	)
	runSimpleCases(t, cases)
}

func TestFitSettings(t *testing.T) {
	var cases []settingCase
	for _, name := range []string{"first-fit", "best-fit"} {
		cases = append(cases,
			settingCase{name, policies.Settings{"alignment": "3"}, "alignment"},
			settingCase{name, policies.Settings{"alignment": "4MiB"}, "alignment"},
			settingCase{name, policies.Settings{"alignment": "0"}, "alignment"},
			settingCase{name, policies.Settings{"alignment": "x"}, "alignment"},
			settingCase{name, policies.Settings{"segment_size": "0"}, "segment_size"},
			settingCase{name, policies.Settings{"segment_size": "big"}, "segment_size"},
			settingCase{name, policies.Settings{"release": "maybe"}, "release"},
			settingCase{name, policies.Settings{"order": "lifo"}, "order"},
		)
	}
	runSettingCases(t, cases)
}

func TestFitInvariants(t *testing.T) {
	for _, name := range []string{"first-fit", "best-fit"} {
		for _, s := range []policies.Settings{
			nil,
			{"release": "true"},
			{"alignment": "256", "segment_size": "20MiB"},
		} {
			t.Run(name+"/"+fmtSettings(s), func(t *testing.T) {
				checkInvariants(t, name, s, 512*sMiB, true)
			})
		}
	}
}

func TestFitFreeUnknown(t *testing.T) {
	for _, name := range []string{"first-fit", "best-fit"} {
		r := driveSimple(t, name, nil, 0, "malloc id=1 size=1\nmalloc id=2 size=1\nfree id=2\n")
		for _, addr := range []uint64{devBase + 512, devBase + 1, devBase + 2*sMiB} {
			if err := r.policy.Free(addr, 0); err == nil {
				t.Errorf("%s: Free(%#x) of no live block succeeded", name, addr)
			}
		}
	}
}

// TestFitModel replays random mallocs and frees and predicts every
// placement from the layout alone: the free blocks of a coalescing free
// list are exactly the gaps between live blocks in the device's segments,
// so first fit must take the lowest gap that fits and best fit the
// smallest (the lowest of equal ones), or a new segment when none fits.
// FreeSpace must report the gaps' total and the largest gap.
func TestFitModel(t *testing.T) {
	for _, name := range []string{"first-fit", "best-fit"} {
		for _, s := range []policies.Settings{nil, {"release": "true"}} {
			t.Run(name+"/"+fmtSettings(s), func(t *testing.T) {
				dev := sim.NewDevice(0)
				p, err := policies.New(name, dev, s)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewSource(3))
				var live []policies.Block
				for op := range 6000 {
					gaps := fitGaps(dev, live)
					var total, largest uint64
					for _, g := range gaps {
						total += g.Size
						largest = max(largest, g.Size)
					}
					if gt, gl := p.(policies.FreeSpacer).FreeSpace(); gt != total || gl != largest {
						t.Fatalf("op %d: FreeSpace() = %d, %d; the gaps give %d, %d", op, gt, gl, total, largest)
					}
					if len(live) > 0 && rng.Intn(100) < 48 {
						i := rng.Intn(len(live))
						if err := p.Free(live[i].Addr, 0); err != nil {
							t.Fatalf("op %d: %v", op, err)
						}
						live[i] = live[len(live)-1]
						live = live[:len(live)-1]
						continue
					}
					size := uint64(1 + rng.Intn(64*sKiB))
					if rng.Intn(10) == 0 {
						size = uint64(1 + rng.Intn(5*sMiB))
					}
					n := (size + 511) / 512 * 512
					var want *policies.Block
					for i, g := range gaps {
						if g.Size < n {
							continue
						}
						if want == nil || (name == "best-fit" && g.Size < want.Size) {
							want = &gaps[i]
						}
					}
					b, err := p.Malloc(size, 0)
					if err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
					switch {
					case want != nil && b.Addr != want.Addr:
						t.Fatalf("op %d: malloc of %d bytes at %#x, want %#x (gap of %d)", op, size, b.Addr, want.Addr, want.Size)
					case want == nil:
						// A new segment: its address is above every earlier one.
						for a := range dev.Segments() {
							if a > b.Addr {
								t.Fatalf("op %d: malloc of %d bytes at %#x, not in a new segment", op, size, b.Addr)
							}
						}
					}
					if b.Size != n {
						t.Fatalf("op %d: malloc of %d bytes gave %d, want %d", op, size, b.Size, n)
					}
					live = append(live, b)
				}
				t.Logf("%d live, %d device allocs, %d device frees", len(live), dev.Allocs(), dev.Frees())
			})
		}
	}
}

// fitGaps returns the runs of the device's segments that no live block
// covers, by ascending address.
func fitGaps(dev *sim.Device, live []policies.Block) []policies.Block {
	var segs []policies.Block
	for a, n := range dev.Segments() {
		segs = append(segs, policies.Block{Addr: a, Size: n})
	}
	byAddr := func(a, b policies.Block) int { return cmpUint(a.Addr, b.Addr) }
	slices.SortFunc(segs, byAddr)
	bs := slices.Clone(live)
	slices.SortFunc(bs, byAddr)
	var gaps []policies.Block
	j := 0
	for _, s := range segs {
		at, end := s.Addr, s.Addr+s.Size
		for ; j < len(bs) && bs[j].Addr < end; j++ {
			if bs[j].Addr > at {
				gaps = append(gaps, policies.Block{Addr: at, Size: bs[j].Addr - at})
			}
			at = bs[j].Addr + bs[j].Size
		}
		if at < end {
			gaps = append(gaps, policies.Block{Addr: at, Size: end - at})
		}
	}
	return gaps
}
