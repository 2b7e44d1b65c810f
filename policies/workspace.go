package policies

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// Workspace is the preallocated workspace of inference engines and
// training loops (TensorRT's and cuDNN's workspace, the static arenas of
// compiled graphs, the per-step scratch buffer of a hand-written training
// loop): one device region, reserved once, carved by bump allocation, and
// reset as a whole rather than freed block by block. It is a baseline, not
// the simulation of one library.
//
// Each request is rounded up to the alignment and placed at the region's
// top, which then moves up past it; a free does not move the top, so a
// freed block is not reused before a reset. The top goes back to the
// region's start when no block in the region is live, and, at an
// iteration marker (a trace marker whose label starts with reset_marker),
// down to the end of the highest live block in the region (blocks that
// outlive iterations, such as weights, stay where they are). A request that
// does not fit above the top goes to the device as a segment of its own
// (the request rounded up to 512 B, as cudaMalloc's step), given back at
// its free: the overflow.
//
// The region's size, rounded up to 2 MiB (the device page), is the size
// setting; without it, factor times the trace's peak of live requested
// bytes, which the engine gives before the first event (Hinter). An engine
// that cannot give it (one that streams the trace once) leaves the policy
// to size the region after a warm-up: until the first time nothing is live
// or the second iteration marker (the end of the first iteration), every
// request goes to the device, and the region is then factor times the peak
// of live requested bytes seen so far. The region is allocated at the first
// malloc that can use it; if the device refuses it, requests overflow and
// the region is tried again at the next malloc. It is never given back
// (EmptyCache does not apply). Streams are ignored. A malloc of 0 bytes
// returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - size [unset]: the region's size in bytes.
//   - factor [1.2]: the region's size as a multiple of the peak of live
//     requested bytes, when size is unset.
//   - alignment [256]: requests are rounded up to a multiple of it, a power
//     of two from 1 B to 2 MiB.
//   - reset_marker [iteration]: the label prefix of the markers that reset
//     the top; empty: markers never do.
type Workspace struct {
	dev         Device
	size        uint64 // the size setting, 0 if unset
	factor      float64
	alignment   uint64
	resetMarker string

	hint     uint64 // from Hint
	region   uint64 // the region's address, 0 if not allocated
	capacity uint64 // the region's size in bytes
	top      uint64 // offset of the first unused byte in the region

	// stack holds the region's blocks above the last reset in address
	// order, freed ones marked dead and dropped from the end lazily.
	stack  []wsEntry
	blocks trace.AddrMap[wsBlock] // live blocks by address, in the region and outside
	nlive  int                    // live blocks in the region

	// Warm-up (no size, no hint): live and peak requested bytes, reset
	// markers seen, and whether it is over.
	liveRequested, peakRequested uint64
	marks                        int
	warmedUp                     bool
}

// wsEntry is a block of the region: its offset range [start, end).
type wsEntry struct {
	start, end uint64
	dead       bool
}

// wsBlock is a live block: of the region, at index of the stack, or an
// overflow block of its own device segment, for requested bytes.
type wsBlock struct {
	index     int
	requested uint64
	overflow  bool
}

var (
	_ Policy     = (*Workspace)(nil)
	_ FreeSpacer = (*Workspace)(nil)
	_ Hinter     = (*Workspace)(nil)
	_ Marker     = (*Workspace)(nil)
)

func init() {
	register(Info{
		Name:   "workspace",
		Design: "one preallocated region with bump allocation, reset per iteration (the workspace of inference engines and training loops)",
		Settings: []Setting{
			{Key: "size", Default: "factor times the peak requested", Derived: true, Doc: "the region's size in bytes, rounded up to 2 MiB"},
			{Key: "factor", Default: "1.2", Doc: "the region's size as a multiple of the trace's peak of live requested bytes, when size is unset"},
			{Key: "alignment", Default: "256", Doc: "requests are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
			{Key: "reset_marker", Default: "iteration", Doc: "the label prefix of the markers that reset the top; empty: markers never do"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewWorkspace(dev, s) })
}

// NewWorkspace returns a workspace policy on dev. It returns an error
// naming the key for an unknown or malformed setting.
func NewWorkspace(dev Device, s Settings) (*Workspace, error) {
	const name = "workspace"
	if err := s.Check(name, "alignment", "factor", "reset_marker", "size"); err != nil {
		return nil, err
	}
	size, err := s.Bytes(name, "size", 0)
	if err != nil {
		return nil, err
	}
	if _, ok := s["size"]; ok && (size == 0 || size > maxRequest) {
		return nil, invalidSettingf(name, s, "size", "must be from 1 B to 4 EiB")
	}
	factor := 1.2
	if v, ok := s["factor"]; ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return nil, invalidSettingf(name, s, "factor", "must be a number above 0")
		}
		factor = f
	}
	align, err := s.Bytes(name, "alignment", 256)
	if err != nil {
		return nil, err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return nil, invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	marker, ok := s["reset_marker"]
	if !ok {
		marker = "iteration"
	}
	return &Workspace{
		dev:         dev,
		size:        size,
		factor:      factor,
		alignment:   align,
		resetMarker: marker,
	}, nil
}

// Name returns "workspace".
func (p *Workspace) Name() string { return "workspace" }

// Hint gives the trace's peak of live requested bytes, which sizes the
// region when the size setting is unset.
func (p *Workspace) Hint(peakRequested uint64) { p.hint = peakRequested }

// FreeSpace returns the bytes above the region's top, the only free bytes
// the policy can place a request in, as both the total and the largest
// free block.
func (p *Workspace) FreeSpace() (total, largest uint64) {
	if p.region == 0 {
		return 0, 0
	}
	return p.capacity - p.top, p.capacity - p.top
}

// regionSize returns the size in bytes the region is to have, 0 if it is
// not known yet (warm-up).
func (p *Workspace) regionSize() uint64 {
	var n uint64
	switch {
	case p.size > 0:
		n = p.size
	case p.hint > 0:
		n = scaleBytes(p.hint, p.factor)
	case p.warmedUp:
		n = scaleBytes(p.peakRequested, p.factor)
	}
	if n == 0 {
		return 0
	}
	return ceilToMultiple(min(n, maxRequest), deviceGranularity)
}

// scaleBytes returns n times f, rounded up, at most maxRequest.
func scaleBytes(n uint64, f float64) uint64 {
	v := math.Ceil(float64(n) * f)
	if v >= maxRequest {
		return maxRequest
	}
	return uint64(v)
}

// Malloc places size bytes, rounded up to the alignment, at the region's
// top, or in a device segment of its own if they do not fit. It returns an
// error wrapping ErrOutOfMemory when the device refuses that segment.
func (p *Workspace) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("workspace", size)
	}
	n := ceilToMultiple(size, p.alignment)
	if p.region == 0 {
		if err := p.allocRegion(); err != nil {
			return Block{}, fmt.Errorf("policy workspace: malloc of %d bytes: %w", size, err)
		}
	}
	if p.region != 0 && n <= p.capacity-p.top {
		b := Block{Addr: p.region + p.top, Size: n}
		p.blocks.Put(b.Addr, wsBlock{index: len(p.stack)})
		p.stack = append(p.stack, wsEntry{start: p.top, end: p.top + n})
		p.top += n
		p.nlive++
		return b, nil
	}
	m := ceilToMultiple(n, 512)
	addr, err := p.dev.Alloc(m)
	if err != nil {
		return Block{}, fmt.Errorf("policy workspace: malloc of %d bytes: %w", size, err)
	}
	p.blocks.Put(addr, wsBlock{requested: size, overflow: true})
	if !p.warmedUp {
		p.liveRequested += size
		p.peakRequested = max(p.peakRequested, p.liveRequested)
	}
	return Block{Addr: addr, Size: m}, nil
}

// allocRegion allocates the region once its size is known. A refusal of
// the device leaves no region and no error.
func (p *Workspace) allocRegion() error {
	n := p.regionSize()
	if n == 0 {
		return nil
	}
	addr, err := p.dev.Alloc(n)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil
		}
		return err
	}
	p.region, p.capacity, p.top = addr, n, 0
	return nil
}

// Free takes back the block at addr: a region block is marked dead (the
// top goes back to the start when it was the last live one), an overflow
// block goes back to the device. It returns an error if addr is not a live
// block.
func (p *Workspace) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	o, ok := p.blocks.Take(addr)
	if !ok {
		return fmt.Errorf("policy workspace: free of %#x: not a live block", addr)
	}
	if !o.overflow {
		p.stack[o.index].dead = true
		p.nlive--
		if p.nlive == 0 {
			p.top = 0
			p.stack = p.stack[:0]
		}
		return nil
	}
	if !p.warmedUp {
		p.liveRequested -= o.requested
		if p.liveRequested == 0 {
			p.warmedUp = true // nothing is live: the end of the warm-up
		}
	}
	if err := p.dev.Free(addr); err != nil {
		return fmt.Errorf("policy workspace: %w", err)
	}
	return nil
}

// Mark resets the top at an iteration marker (a label that starts with
// reset_marker): down to the end of the highest live block in the region.
// During the warm-up the second such marker ends it. It never fails.
func (p *Workspace) Mark(label string) error {
	if p.resetMarker == "" || !strings.HasPrefix(label, p.resetMarker) {
		return nil
	}
	if !p.warmedUp {
		if p.marks++; p.marks >= 2 {
			p.warmedUp = true
		}
	}
	k := len(p.stack)
	for k > 0 && p.stack[k-1].dead {
		k--
	}
	p.stack = p.stack[:k]
	if k == 0 {
		p.top = 0
	} else {
		p.top = p.stack[k-1].end
	}
	return nil
}
