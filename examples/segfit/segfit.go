// Package segfit is an allocator policy written outside allocsim, as a
// researcher writes one: a segregated fit. It registers itself as "segfit"
// (policies.Register), so that the replay command built by main.go, and
// any program that imports this package, replays traces against it beside
// the built-in policies.
//
// Its rules, all of them:
//
//   - a malloc of at most 1 MiB takes a block of its class, the next power
//     of two of its size and at least 512 bytes, from the class's free
//     list, lowest address first; a class without a free block takes a
//     slab from the device and cuts it into blocks of the class;
//   - a slab is min_slab bytes (2 MiB by default), or, once the replay
//     has given the trace's peak of requested bytes (a policies.Hinter),
//     half of that peak rounded up to 2 MiB, at most 64 MiB;
//   - a larger malloc takes a segment of its own, its size rounded up to
//     2 MiB, given back to the device at its free;
//   - a freed block goes back to its class's list; slabs are kept.
package segfit

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/gpualloc/allocsim/policies"
)

// Name is the registry name.
const Name = "segfit"

const (
	minClass   = 512
	maxClass   = 1 << 20
	page       = 2 << 20
	maxSlab    = 64 << 20
	keyMinSlab = "min_slab"
)

func init() {
	policies.Register(policies.Info{
		Name:   Name,
		Design: "segregated fit: power-of-two classes of 512 B to 1 MiB cut from slabs, larger mallocs in segments of their own (example of an outside policy; examples/segfit)",
		Settings: []policies.Setting{
			{Key: keyMinSlab, Default: "2MiB", Doc: "bytes of a slab before the replay gives the trace's peak of requested bytes"},
		},
	}, New)
}

// SegFit is the policy; New builds it.
type SegFit struct {
	dev  policies.Device
	slab uint64              // bytes of the next slab
	free map[uint64][]uint64 // free blocks by class, highest address first
	live map[uint64]uint64   // live blocks: class, or 0 for a segment of its own
	big  map[uint64]bool     // segments of their own
}

// New builds a SegFit on dev. It returns an error naming a bad or unknown
// setting.
func New(dev policies.Device, s policies.Settings) (policies.Policy, error) {
	if err := s.Check(Name, keyMinSlab); err != nil {
		return nil, err
	}
	slab, err := s.Bytes(Name, keyMinSlab, page)
	if err != nil {
		return nil, err
	}
	if slab < maxClass || slab > maxSlab {
		return nil, fmt.Errorf("policy %s: %s %d: want 1 MiB to 64 MiB", Name, keyMinSlab, slab)
	}
	return &SegFit{dev: dev, slab: slab, free: map[uint64][]uint64{}, live: map[uint64]uint64{}, big: map[uint64]bool{}}, nil
}

// Name returns "segfit".
func (p *SegFit) Name() string { return Name }

// Hint sizes the slabs from the trace's peak of requested bytes.
func (p *SegFit) Hint(peakRequested uint64) {
	p.slab = min(max(p.slab, roundUp(peakRequested/2, page)), maxSlab)
}

// Malloc places size bytes: see the package doc.
func (p *SegFit) Malloc(size, stream uint64) (policies.Block, error) {
	if size > maxClass {
		n := roundUp(size, page)
		addr, err := p.dev.Alloc(n)
		if err != nil {
			return policies.Block{}, err
		}
		p.live[addr] = 0
		return policies.Block{Addr: addr, Size: n}, nil
	}
	c := class(size)
	list := p.free[c]
	if len(list) == 0 {
		base, err := p.dev.Alloc(p.slab)
		if err != nil {
			return policies.Block{}, err
		}
		for a := base + p.slab - c; ; a -= c {
			list = append(list, a)
			if a == base {
				break
			}
		}
	}
	addr := list[len(list)-1]
	p.free[c] = list[:len(list)-1]
	p.live[addr] = c
	return policies.Block{Addr: addr, Size: c}, nil
}

// Free takes the block at addr back.
func (p *SegFit) Free(addr, stream uint64) error {
	c, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("policy %s: no block at %#x", Name, addr)
	}
	delete(p.live, addr)
	if c == 0 {
		return p.dev.Free(addr)
	}
	list := p.free[c]
	// Keep the list highest first, so that the lowest is taken next.
	i, _ := slices.BinarySearchFunc(list, addr, func(a, b uint64) int {
		switch {
		case a > b:
			return -1
		case a < b:
			return 1
		}
		return 0
	})
	p.free[c] = slices.Insert(list, i, addr)
	return nil
}

// class is the class of a malloc of size bytes, at most 1 MiB.
func class(size uint64) uint64 {
	if size <= minClass {
		return minClass
	}
	return 1 << bits.Len64(size-1)
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }
