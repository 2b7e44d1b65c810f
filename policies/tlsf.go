package policies

import (
	"fmt"
	"math/bits"
)

// TLSF is a two-level segregated fit allocator, following M. Masmano,
// I. Ripoll, A. Crespo and J. Real, "TLSF: a new dynamic memory allocator
// for real-time systems" (ECRTS 2004) and their reference implementation
// (TLSF 2.4): a good fit found in constant time, the placement used by
// real-time systems and by GPU memory libraries (Vulkan and Direct3D 12
// memory allocators) inside their device memory blocks.
//
// Free blocks are kept in segregated lists indexed by two levels: the first
// level is the power of two of the block size, the second level splits each
// power-of-two range into 2^sl_log2 equal classes. Sizes below
// alignment * 2^sl_log2 are mapped linearly, one class per alignment step.
// Two bitmaps record which lists are non-empty, so both search and insert
// take a few bit operations, whatever the number of free blocks.
//
// A malloc rounds the request up to the alignment, then up to the lower
// bound of the next class (for sizes above the linear range), so that every
// block of that class and of every class above it is large enough; it takes
// the first block of the first non-empty such list (a good fit, not always
// the best one). As in the reference implementation the block handed out is
// the request rounded to that class boundary (up to 1/2^sl_log2 of internal
// fragmentation); class_rounding=false hands out the aligned request
// instead, as later implementations do. The rest of the free block, at the
// higher address, goes back to the lists. A freed block is coalesced at once
// with its free neighbours and put at the head of its list (LIFO).
//
// When no list holds a large enough block the pool grows, as the reference
// implementation grows by a new area: a device segment of
// max(segment_size, rounded request), rounded up to 2 MiB (the device page).
// The reference implementation never gives an area back; here, as with the
// package's other caching policies, wholly free segments go back to the
// device on EmptyCache, when the device refuses a segment (then the device
// allocation is tried once more, a retry, see Retries) or, with release
// set, as soon as a segment is wholly free. Streams are ignored. A malloc of
// 0 bytes returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - alignment [256]: sizes are rounded up to a multiple of it, a power of
//     two from 1 B to 2 MiB (the reference implementation aligns to two CPU
//     words; 256 B is cudaMalloc's pointer alignment).
//   - sl_log2 [5]: log2 of the number of second-level classes per power of
//     two, from 0 to 6 (the reference implementation's 5: 32 classes).
//   - segment_size [2MiB]: the smallest segment asked of the device.
//   - class_rounding [true]: hand out the class-rounded size (reference
//     implementation) rather than the aligned request.
//   - release [false]: return a segment to the device as soon as it is
//     wholly free.
type TLSF struct {
	dev           Device
	alignShift    uint // log2 of the alignment
	slLog2        uint
	segmentSize   uint64
	classRounding bool
	release       bool

	flMap uint64             // bit f: some list of first level f is non-empty
	slMap [64]uint64         // by first level, bit s: list (f, s) is non-empty
	heads [64][64]*tlsfBlock // the free lists, by first and second level

	live      map[uint64]*tlsfBlock
	segments  []*tlsfSegment
	freeBytes uint64
	retries   int64
	spare     []*tlsfBlock
}

// tlsfBlock is a run of bytes of a segment, free or allocated, linked to
// its address neighbours; a free block is also in the list of its class.
type tlsfBlock struct {
	addr, size   uint64
	seg          *tlsfSegment
	prev, next   *tlsfBlock // address neighbours in the segment, nil at its ends
	fprev, fnext *tlsfBlock // free list links
	free         bool
}

// tlsfSegment is a device segment of the TLSF policy.
type tlsfSegment struct {
	addr, size uint64
	first      *tlsfBlock
	index      int // position in TLSF.segments
}

var (
	_ Policy     = (*TLSF)(nil)
	_ Releaser   = (*TLSF)(nil)
	_ FreeSpacer = (*TLSF)(nil)
	_ Counter    = (*TLSF)(nil)
)

func init() {
	register(Info{
		Name:   "tlsf",
		Design: "two-level segregated fit (Masmano, Ripoll, Crespo and Real, ECRTS 2004; TLSF 2.4)",
		Settings: []Setting{
			{Key: "alignment", Default: "256", Doc: "sizes are rounded up to a multiple of it, in bytes: a power of two from 1 B to 2 MiB"},
			{Key: "sl_log2", Default: "5", Doc: "log2 of the number of second-level classes per power of two, from 0 to 6"},
			{Key: "segment_size", Default: "2MiB", Doc: "the smallest segment asked of the device, in bytes"},
			{Key: "class_rounding", Default: "true", Doc: "hand out the class-rounded size rather than the aligned request"},
			{Key: "release", Default: "false", Doc: "return a segment to the device as soon as it is wholly free"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewTLSF(dev, s) })
}

// NewTLSF returns a TLSF policy on dev. It returns an error naming the key
// for an unknown or malformed setting.
func NewTLSF(dev Device, s Settings) (*TLSF, error) {
	const name = "tlsf"
	if err := s.Check(name, "alignment", "class_rounding", "release", "segment_size", "sl_log2"); err != nil {
		return nil, err
	}
	align, err := s.Bytes(name, "alignment", 256)
	if err != nil {
		return nil, err
	}
	if !isPowerOfTwo(align) || align > deviceGranularity {
		return nil, invalidSettingf(name, s, "alignment", "must be a power of two from 1 B to 2 MiB")
	}
	sl, err := s.Uint(name, "sl_log2", 5)
	if err != nil {
		return nil, err
	}
	if sl > 6 {
		return nil, invalidSettingf(name, s, "sl_log2", "must be from 0 to 6")
	}
	seg, err := s.Bytes(name, "segment_size", deviceGranularity)
	if err != nil {
		return nil, err
	}
	if seg == 0 || seg > maxRequest {
		return nil, invalidSettingf(name, s, "segment_size", "must be from 1 B to 4 EiB")
	}
	rounding, err := s.Bool(name, "class_rounding", true)
	if err != nil {
		return nil, err
	}
	rel, err := s.Bool(name, "release", false)
	if err != nil {
		return nil, err
	}
	return &TLSF{
		dev:           dev,
		alignShift:    uint(bits.TrailingZeros64(align)),
		slLog2:        uint(sl),
		segmentSize:   ceilToMultiple(seg, deviceGranularity),
		classRounding: rounding,
		release:       rel,
		live:          map[uint64]*tlsfBlock{},
	}, nil
}

// Name returns "tlsf".
func (p *TLSF) Name() string { return "tlsf" }

// Retries returns the number of device allocations retried after
// returning the wholly free segments to the device.
func (p *TLSF) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes inside the segments and the size in
// bytes of the largest free block (found in the highest non-empty list).
func (p *TLSF) FreeSpace() (total, largest uint64) {
	if p.flMap == 0 {
		return p.freeBytes, 0
	}
	fl := bits.Len64(p.flMap) - 1
	sl := bits.Len64(p.slMap[fl]) - 1
	for b := p.heads[fl][sl]; b != nil; b = b.fnext {
		largest = max(largest, b.size)
	}
	return p.freeBytes, largest
}

// mapping returns the list (first level, second level) that a free block
// of size bytes (a multiple of the alignment) belongs to.
func (p *TLSF) mapping(size uint64) (fl, sl uint) {
	base := p.alignShift + p.slLog2 // sizes below 1<<base are mapped linearly
	if size < 1<<base {
		return 0, uint(size >> p.alignShift)
	}
	m := uint(bits.Len64(size)) - 1
	return m - base + 1, uint(size>>(m-p.slLog2)) - 1<<p.slLog2
}

// searchSize returns n (a multiple of the alignment) rounded up to the
// lower bound of the next class, so that every block of the class of the
// result, and of every class above, holds n bytes.
func (p *TLSF) searchSize(n uint64) uint64 {
	if n < 1<<(p.alignShift+p.slLog2) {
		return n
	}
	t := uint64(1)<<(uint(bits.Len64(n))-1-p.slLog2) - 1
	return (n + t) &^ t
}

// find returns the first block of the first non-empty list at or above
// (fl, sl), nil if there is none.
func (p *TLSF) find(fl, sl uint) *tlsfBlock {
	m := p.slMap[fl] & (^uint64(0) << sl)
	if m == 0 {
		f := p.flMap & (^uint64(0) << (fl + 1))
		if f == 0 {
			return nil
		}
		fl = uint(bits.TrailingZeros64(f))
		m = p.slMap[fl]
	}
	return p.heads[fl][bits.TrailingZeros64(m)]
}

// insert puts free block b at the head of its list.
func (p *TLSF) insert(b *tlsfBlock) {
	fl, sl := p.mapping(b.size)
	h := p.heads[fl][sl]
	b.fprev, b.fnext = nil, h
	if h != nil {
		h.fprev = b
	}
	p.heads[fl][sl] = b
	p.slMap[fl] |= 1 << sl
	p.flMap |= 1 << fl
}

// remove takes free block b out of its list.
func (p *TLSF) remove(b *tlsfBlock) {
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	}
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		fl, sl := p.mapping(b.size)
		p.heads[fl][sl] = b.fnext
		if b.fnext == nil {
			p.slMap[fl] &^= 1 << sl
			if p.slMap[fl] == 0 {
				p.flMap &^= 1 << fl
			}
		}
	}
	b.fprev, b.fnext = nil, nil
}

// Malloc places size bytes, rounded up to the alignment and to its class,
// in the first block of the first large enough list, or in a new segment.
// Stream is ignored. It returns an error wrapping ErrOutOfMemory when the
// device refuses the segment even after the release of every wholly free
// segment.
func (p *TLSF) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("tlsf", size)
	}
	n := ceilToMultiple(size, 1<<p.alignShift)
	r := p.searchSize(n)
	if p.classRounding {
		n = r
	}
	b := p.find(p.mapping(r))
	if b != nil {
		p.remove(b)
	} else {
		var err error
		if b, err = p.grow(r); err != nil {
			return Block{}, fmt.Errorf("policy tlsf: malloc of %d bytes: %w", size, err)
		}
	}
	if rest := b.size - n; rest > 0 {
		// Sizes are multiples of the alignment: the rest is at least one
		// alignment unit, the smallest block.
		q := p.newBlock(b.addr+n, rest, b.seg)
		q.prev, q.next = b, b.next
		if b.next != nil {
			b.next.prev = q
		}
		b.next = q
		b.size = n
		p.insert(q)
	}
	b.free = false
	p.freeBytes -= n
	p.live[b.addr] = b
	return Block{Addr: b.addr, Size: n}, nil
}

// Free returns the block at addr to the lists, coalesced with its free
// neighbours; with release set, a segment left wholly free goes back to the
// device. Stream is ignored. It returns an error if addr is not a live
// block.
func (p *TLSF) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	b, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("policy tlsf: free of %#x: not a live block", addr)
	}
	delete(p.live, addr)
	p.freeBytes += b.size
	if nx := b.next; nx != nil && nx.free {
		p.remove(nx)
		b.size += nx.size
		b.next = nx.next
		if nx.next != nil {
			nx.next.prev = b
		}
		p.recycle(nx)
	}
	if pv := b.prev; pv != nil && pv.free {
		p.remove(pv)
		pv.size += b.size
		pv.next = b.next
		if b.next != nil {
			b.next.prev = pv
		}
		p.recycle(b)
		b = pv
	}
	b.free = true
	if p.release && b.prev == nil && b.next == nil {
		return p.freeSegment(b.seg)
	}
	p.insert(b)
	return nil
}

// EmptyCache returns every wholly free segment to the device.
func (p *TLSF) EmptyCache() error {
	_, err := p.releaseFree()
	return err
}

// releaseFree returns every wholly free segment to the device and reports
// how many it returned.
func (p *TLSF) releaseFree() (int, error) {
	n := 0
	for i := 0; i < len(p.segments); {
		s := p.segments[i]
		if f := s.first; f.free && f.next == nil {
			p.remove(f)
			if err := p.freeSegment(s); err != nil {
				return n, err
			}
			n++
			continue // segments[i] now holds the former last segment
		}
		i++
	}
	return n, nil
}

// freeSegment returns segment s, whose single block is free and in no
// list, to the device.
func (p *TLSF) freeSegment(s *tlsfSegment) error {
	last := p.segments[len(p.segments)-1]
	p.segments[s.index] = last
	last.index = s.index
	p.segments = p.segments[:len(p.segments)-1]
	p.freeBytes -= s.size
	p.recycle(s.first)
	if err := p.dev.Free(s.addr); err != nil {
		return fmt.Errorf("policy tlsf: %w", err)
	}
	return nil
}

// grow allocates a segment large enough for n bytes and returns its single
// free block, in no list.
func (p *TLSF) grow(n uint64) (*tlsfBlock, error) {
	size := ceilToMultiple(max(p.segmentSize, n), deviceGranularity)
	addr, err := allocRetry(p.dev, size, p.releaseFree, &p.retries)
	if err != nil {
		return nil, err
	}
	s := &tlsfSegment{addr: addr, size: size, index: len(p.segments)}
	b := p.newBlock(addr, size, s)
	s.first = b
	p.segments = append(p.segments, s)
	p.freeBytes += size
	return b, nil
}

func (p *TLSF) newBlock(addr, size uint64, s *tlsfSegment) *tlsfBlock {
	var b *tlsfBlock
	if k := len(p.spare); k > 0 {
		b = p.spare[k-1]
		p.spare = p.spare[:k-1]
	} else {
		b = new(tlsfBlock)
	}
	*b = tlsfBlock{addr: addr, size: size, seg: s, free: true}
	return b
}

func (p *TLSF) recycle(b *tlsfBlock) {
	*b = tlsfBlock{}
	p.spare = append(p.spare, b)
}
