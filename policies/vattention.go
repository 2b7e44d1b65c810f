package policies

import (
	"errors"
	"fmt"
	"slices"
)

// VAttention models virtual KV tensors as vAttention (Prabhu et al.,
// "vAttention: Dynamic Memory Management for Serving LLMs without
// PagedAttention", ASPLOS'25; github.com/microsoft/vattention) and
// GLakeServe's vTensor (github.com/intelligent-machine-learning/glake,
// GLakeServe) keep them: a growing buffer gets a large virtual reservation
// of its own (cuMemAddressReserve), and physical pages (cuMemCreate and
// cuMemMap) are mapped into it as the buffer grows, so that the grown
// tensor is the old one's range extended in place: no copy, and no second
// copy of the memory live at once. Every other malloc goes to the pytorch
// policy (PyTorch's caching allocator, default settings) on the same
// device.
//
// A replay sees no torch.cat, only its mallocs and frees: torch.cat
// allocates the larger tensor and frees the old one once the copy is made.
// The Policy interface gives a malloc its size and stream only, not the
// call stack a recording may hold, and the decode traces at hand record
// none; so the rule that finds growth uses sizes, streams and order:
//   - confirmation: a free of a live buffer X whose call (among mallocs
//     and frees) comes right after the malloc of a buffer Y on X's stream,
//     Y larger than X and still live, makes Y a growing buffer of step
//     size(Y) - size(X) (requested bytes);
//   - prediction: a malloc of n bytes on stream s is the growth of the
//     growing buffer X on s, live, with size(X) + step(X) = n; among
//     several (the K and V caches of every layer grow in turn), the one
//     confirmed longest ago. The first two growths of a buffer are thus
//     never predicted: the buffer is in pytorch's pool until then.
//
// A predicted growth of a buffer held in a range of its own extends that
// range in place: the pages that the new size lacks are mapped (one device
// allocation), and the new tensor is the range's top n bytes (rounded up
// to 512 B; 512 B more where a tensor live in the range has that size),
// its address below the old one's, since the range grows downward from its
// top: the old tensor and the new one, both live between torch.cat's
// malloc and the old one's free, keep distinct addresses while sharing
// their pages. Their blocks overlap, which the policy says (Aliases), so that
// the replay's invariant checker allows it; the
// replay's allocated bytes count both until the old one's free, expected
// as the next call, which gives back nothing. If the next call is anything
// else, the prediction missed: the old buffer is a tensor of its own after
// all, and from that call on its pages are charged again, mapped in a
// range of its own until its free, whatever the capacity (the replay's
// reserved bytes lack them at the growth's malloc). A predicted growth of
// a buffer in pytorch's pool, and every predicted growth with in_place
// off, gets a new range with the pages of its whole size mapped: the copy
// still happens, as torch.cat makes it. A freed buffer's pages are
// unmapped and its range given back at once.
//
// Each range reserves 143000 MiB of address space (as pytorch's
// expandable segments size theirs), so no buffer outgrows it before the
// device is full. A map is held to the device's capacity (reserved bytes
// plus the map, a Capacitor's); when refused, pytorch's cached free
// segments are given back (empty_cache, counted as a retry) and the map is
// tried once more, and then the malloc goes to pytorch. The device must be
// a Mapper.
//
// Settings (defaults in brackets):
//   - page_size [2MiB]: bytes of a physical page, 64KiB, 128KiB, 256KiB
//     (vAttention's modified UVM driver) or 2MiB (CUDA's own granularity).
//   - in_place [true]: predicted growths extend their range in place;
//     false gives each a new range, copying as torch.cat does.
//
// Not modelled: call stacks (the interface does not pass them), so any op
// that makes a larger tensor and frees a smaller one of the same stream
// right after is taken as growth; a buffer that shrinks (its smaller copy
// is placed as any malloc); vAttention's preallocated per-request KV
// tensors, its deferred reclamation of pages and pages mapped ahead of
// use (pages are mapped when a growth needs them and unmapped at a free);
// the latency of the mapping calls beyond the device's cost model; private
// pools (mallocs into them arrive as plain mallocs).
type VAttention struct {
	pt      *PyTorch
	mapper  Mapper
	cap     Capacitor // nil when the device is none
	page    uint64
	inPlace bool

	live    map[uint64]*vaBuf  // live buffers of nonzero size by block address
	growing map[vaKey][]*vaBuf // growing buffers by stream and next size, confirmed longest ago first
	last    *vaBuf             // the buffer of the last call when it was a malloc, else nil
	pending *vaBuf             // superseded by the last call's in-place growth, until the next call
	retries int64

	stats VAttentionStats
}

// VAttentionStats counts what the growth rule of a VAttention found, for a
// replay's report.
type VAttentionStats struct {
	// Confirmed counts the frees that confirmed a malloc as the growth of
	// the freed buffer.
	Confirmed int64
	// InPlace counts the mallocs served by extending a range in place.
	InPlace int64
	// Moved counts the predicted growths given a new range (their old
	// buffer in pytorch's pool, or in_place off).
	Moved int64
	// Missed counts the predicted growths whose old buffer was not freed
	// at the next call.
	Missed int64
	// Uncharged counts the missed in-place growths whose old buffer's
	// pages the device refused to map again (they stay uncounted).
	Uncharged int64
	// Refused counts the predicted growths given to pytorch because the
	// device refused their pages.
	Refused int64
	// Mapped is the bytes of the pages mapped in ranges now, PeakMapped
	// the most so far.
	Mapped, PeakMapped uint64
}

// vaKey indexes growing buffers by stream and the size of their predicted
// growth.
type vaKey struct{ stream, next uint64 }

// vaBuf is a live malloc.
type vaBuf struct {
	addr, block uint64 // its block
	size        uint64 // requested bytes
	stream      uint64
	step        uint64   // bytes of its expected growth, 0 if none confirmed
	indexed     bool     // in growing
	pt          bool     // placed by pytorch
	rng         *vaRange // the range whose pages it holds, nil if none
	in          *vaRange // the range its address lies in, nil if pytorch's
	shadow      *vaRange // pages charged for it after a missed growth
}

// vaRange is a reserved address range with pages mapped at its top,
// [base+size-mapped, base+size), and the block sizes of the tensors live
// in it, each at the top less its size.
type vaRange struct {
	base, size, mapped uint64
	taken              map[uint64]bool
}

func (r *vaRange) top() uint64 { return r.base + r.size }

// Settings of the vattention policy.
const (
	vaKeyPageSize = "page_size"
	vaKeyInPlace  = "in_place"
	// vaAlign is the alignment of a tensor in its range, in bytes, as
	// PyTorch's blocks are.
	vaAlign = ptMinBlockSize
)

var (
	_ Policy     = (*VAttention)(nil)
	_ Releaser   = (*VAttention)(nil)
	_ FreeSpacer = (*VAttention)(nil)
	_ Counter    = (*VAttention)(nil)
)

func init() {
	register(Info{
		Name: "vattention",
		Design: "virtual KV tensors of vAttention (ASPLOS'25, microsoft/vattention) and GLakeServe's vTensor (intelligent-machine-learning/glake):" +
			" growing buffers, found by size, stream and order, extended in place by pages; the rest to the pytorch policy",
		Settings: []Setting{
			{Key: vaKeyPageSize, Default: "2MiB", Doc: "bytes of a physical page mapped into a growing buffer's range: 64KiB, 128KiB, 256KiB (vAttention's driver) or 2MiB"},
			{Key: vaKeyInPlace, Default: "true", Doc: "a predicted growth extends the old buffer's range in place (no copy); false maps a new range of the whole size"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewVAttention(dev, s) })
}

// NewVAttention returns the vattention policy on dev, which must be a
// Mapper, with settings s (page_size, in_place). It returns an error naming
// the key for an unknown or malformed setting.
func NewVAttention(dev Device, s Settings) (*VAttention, error) {
	const name = "vattention"
	if err := s.Check(name, vaKeyInPlace, vaKeyPageSize); err != nil {
		return nil, err
	}
	page, err := s.Bytes(name, vaKeyPageSize, 2<<20)
	if err != nil {
		return nil, err
	}
	switch page {
	case 64 << 10, 128 << 10, 256 << 10, 2 << 20:
	default:
		return nil, invalidSettingf(name, s, vaKeyPageSize, "must be 64KiB, 128KiB, 256KiB or 2MiB")
	}
	inPlace, err := s.Bool(name, vaKeyInPlace, true)
	if err != nil {
		return nil, err
	}
	m, ok := dev.(Mapper)
	if !ok {
		return nil, fmt.Errorf("policy %s: the device cannot map pages (it is no policies.Mapper)", name)
	}
	p := &VAttention{
		pt:      newPyTorch(dev, defaultPytorchConfig()),
		mapper:  m,
		page:    page,
		inPlace: inPlace,
		live:    map[uint64]*vaBuf{},
		growing: map[vaKey][]*vaBuf{},
	}
	if c, ok := dev.(Capacitor); ok {
		p.cap = c
	}
	return p, nil
}

// Name returns "vattention".
func (p *VAttention) Name() string { return "vattention" }

// Stats returns what the growth rule found so far.
func (p *VAttention) Stats() VAttentionStats { return p.stats }

// vaReserve is the address space of a range in bytes: pytorch's
// expandable segments' (a little over the memory of the device the traces
// were recorded on), a multiple of every page size.
const vaReserve = ptDeviceMemory

// tensorBytes is the bytes a tensor of size bytes takes in its range.
func tensorBytes(size uint64) uint64 { return (size + vaAlign - 1) &^ (vaAlign - 1) }

// pagesFor is the bytes of the whole pages that hold n bytes.
func (p *VAttention) pagesFor(n uint64) uint64 { return (n + p.page - 1) / p.page * p.page }

// Malloc places a request of size bytes on stream: as the growth of a
// growing buffer when the rule predicts one (see VAttention), else by
// pytorch. It returns an error wrapping ErrOutOfMemory when it cannot.
func (p *VAttention) Malloc(size, stream uint64) (Block, error) {
	if err := p.resolve(0); err != nil {
		return Block{}, err
	}
	p.last = nil
	if size == 0 || size > vaReserve {
		return p.ptMalloc(size, stream)
	}
	q := p.growing[vaKey{stream, size}]
	if len(q) == 0 {
		return p.ptMalloc(size, stream)
	}
	x := q[0]
	y := &vaBuf{size: size, block: tensorBytes(size), stream: stream}
	var err error
	switch {
	case p.inPlace && x.rng != nil:
		// Not at the address of a tensor live in the range (the old
		// one, or one whose growth missed): 512 B lower.
		for x.rng.taken[y.block] {
			y.block += vaAlign
		}
		var ok bool
		if ok, err = p.extend(x.rng, y.block); ok {
			y.rng, x.rng = x.rng, nil
			p.pending = x
			p.stats.InPlace++
		}
	default:
		var r *vaRange
		if r, err = p.newRange(y.block); r != nil {
			y.rng = r
			p.stats.Moved++
		}
	}
	if err != nil {
		return Block{}, err
	}
	if y.rng == nil {
		p.stats.Refused++
		return p.ptMalloc(size, stream)
	}
	p.unindex(x)
	y.in = y.rng
	y.addr = y.rng.top() - y.block
	y.rng.taken[y.block] = true
	p.live[y.addr] = y
	p.last = y
	return Block{Addr: y.addr, Size: y.block}, nil
}

// ptMalloc is Malloc by pytorch.
func (p *VAttention) ptMalloc(size, stream uint64) (Block, error) {
	b, err := p.pt.Malloc(size, stream)
	if err != nil || b.Size == 0 {
		return b, err
	}
	y := &vaBuf{addr: b.Addr, block: b.Size, size: size, stream: stream, pt: true}
	p.live[b.Addr] = y
	p.last = y
	return b, nil
}

// Free takes back the block at addr, as the rule says (see VAttention):
// nothing when it is the old buffer of the last call's in-place growth,
// else its pages unmapped and its range given back, or its block to
// pytorch.
func (p *VAttention) Free(addr, stream uint64) error {
	if err := p.resolve(addr); err != nil {
		return err
	}
	x := p.live[addr]
	if x == nil {
		p.last = nil
		return p.pt.Free(addr, stream) // the null block, or not allocated: pytorch says which
	}
	if y := p.last; y != nil && y != x && y.stream == x.stream && y.size > x.size {
		y.step = y.size - x.size
		p.index(y)
		p.stats.Confirmed++
	}
	p.last = nil
	p.unindex(x)
	delete(p.live, addr)
	if x.in != nil {
		delete(x.in.taken, x.block)
	}
	if x.pt {
		return p.pt.Free(addr, stream)
	}
	if err := p.release(x.rng); err != nil {
		return err
	}
	return p.release(x.shadow)
}

// Aliases implements Aliaser: after a malloc that extended a buffer's
// range in place, the old buffer's block, which the new block covers (the
// range grows downward from its top), until the next call settles it.
func (p *VAttention) Aliases(b Block) (Block, bool) {
	x := p.pending
	if x == nil {
		return Block{}, false
	}
	return Block{Addr: x.addr, Size: x.block}, true
}

// resolve settles the in-place growth of the last call at the next call,
// a free of the block at addr (0 for a malloc): when that is not the free
// of the old buffer, the old buffer's pages are mapped again in a range of
// its own.
func (p *VAttention) resolve(addr uint64) error {
	x := p.pending
	if x == nil {
		return nil
	}
	p.pending = nil
	if addr == x.addr {
		return nil // as predicted
	}
	p.stats.Missed++
	r, err := p.charge(x.block)
	if err != nil {
		return err
	}
	if r == nil {
		p.stats.Uncharged++
	}
	x.shadow = r
	return nil
}

// index adds the growing buffer x to the buffers whose growth a malloc
// can be.
func (p *VAttention) index(x *vaBuf) {
	k := vaKey{x.stream, x.size + x.step}
	if k.next < x.size {
		return // past 2^64: no malloc is its growth
	}
	p.growing[k] = append(p.growing[k], x)
	x.indexed = true
}

// unindex takes x out of the growing buffers.
func (p *VAttention) unindex(x *vaBuf) {
	if !x.indexed {
		return
	}
	x.indexed = false
	k := vaKey{x.stream, x.size + x.step}
	q := p.growing[k]
	if i := slices.Index(q, x); i >= 0 {
		q = slices.Delete(q, i, i+1)
	}
	if len(q) == 0 {
		delete(p.growing, k)
	} else {
		p.growing[k] = q
	}
}

// extend maps the pages that r lacks to hold n bytes at its top; false
// when the device refuses them.
func (p *VAttention) extend(r *vaRange, n uint64) (bool, error) {
	want := p.pagesFor(n)
	if want <= r.mapped {
		return true, nil
	}
	ok, err := p.mapPages(r.top()-want, want-r.mapped)
	if ok {
		p.mapped(want - r.mapped)
		r.mapped = want
	}
	return ok, err
}

// newRange reserves a range and maps the pages of n bytes at its top; nil
// when the device refuses them.
func (p *VAttention) newRange(n uint64) (*vaRange, error) {
	base, err := p.mapper.Reserve(vaReserve)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("vattention: reserving %d bytes of address space: %w", uint64(vaReserve), err)
	}
	r := &vaRange{base: base, size: vaReserve, taken: map[uint64]bool{}}
	ok, err := p.extend(r, n)
	if !ok || err != nil {
		if rerr := p.mapper.Release(base); err == nil {
			err = rerr
		}
		return nil, err
	}
	return r, nil
}

// charge maps n bytes' pages in a range of their own, whatever the
// capacity: the pages of a missed growth's old buffer, which the program
// held. It returns nil when the device refuses them.
func (p *VAttention) charge(n uint64) (*vaRange, error) {
	base, err := p.mapper.Reserve(vaReserve)
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("vattention: reserving %d bytes of address space: %w", uint64(vaReserve), err)
	}
	r := &vaRange{base: base, size: vaReserve, mapped: p.pagesFor(n)}
	if err := p.mapper.Map(r.top()-r.mapped, r.mapped); err != nil {
		if rerr := p.mapper.Release(base); rerr != nil {
			return nil, rerr
		}
		if errors.Is(err, ErrOutOfMemory) {
			return nil, nil
		}
		return nil, fmt.Errorf("vattention: mapping %d bytes at %#x: %w", r.mapped, r.top()-r.mapped, err)
	}
	p.mapped(r.mapped)
	return r, nil
}

// mapPages maps size bytes at addr when the capacity has room, after
// giving back pytorch's cached segments if it has not (a retry); false
// when it has no room or the device refuses.
func (p *VAttention) mapPages(addr, size uint64) (bool, error) {
	for try := 0; ; try++ {
		if p.room(size) {
			err := p.mapper.Map(addr, size)
			if err == nil {
				return true, nil
			}
			if !errors.Is(err, ErrOutOfMemory) {
				return false, fmt.Errorf("vattention: mapping %d bytes at %#x: %w", size, addr, err)
			}
		}
		if try > 0 {
			return false, nil
		}
		p.retries++
		if err := p.pt.EmptyCache(); err != nil {
			return false, err
		}
	}
}

// mapped counts n more bytes mapped.
func (p *VAttention) mapped(n uint64) {
	p.stats.Mapped += n
	p.stats.PeakMapped = max(p.stats.PeakMapped, p.stats.Mapped)
}

// room reports whether size more bytes fit under the device's capacity.
func (p *VAttention) room(size uint64) bool {
	if p.cap == nil || p.cap.Capacity() == 0 {
		return true
	}
	c, r := p.cap.Capacity(), p.cap.Reserved()
	return r <= c && size <= c-r
}

// release unmaps r's pages and gives r back; nil does nothing.
func (p *VAttention) release(r *vaRange) error {
	if r == nil {
		return nil
	}
	if r.mapped > 0 {
		if err := p.mapper.Unmap(r.top()-r.mapped, r.mapped); err != nil {
			return fmt.Errorf("vattention: unmapping %d bytes at %#x: %w", r.mapped, r.top()-r.mapped, err)
		}
		p.stats.Mapped -= r.mapped
		r.mapped = 0
	}
	if err := p.mapper.Release(r.base); err != nil {
		return fmt.Errorf("vattention: giving back the address range at %#x: %w", r.base, err)
	}
	return nil
}

// EmptyCache gives back pytorch's cached segments (torch.cuda.empty_cache());
// ranges hold no cache.
func (p *VAttention) EmptyCache() error { return p.pt.EmptyCache() }

// FreeSpace returns pytorch's free space: the bytes of a range's pages
// past its tensor serve no other malloc.
func (p *VAttention) FreeSpace() (total, largest uint64) { return p.pt.FreeSpace() }

// Retries returns pytorch's retries and the maps tried again after
// pytorch's cache was given back.
func (p *VAttention) Retries() int64 { return p.pt.Retries() + p.retries }
