package policies

import (
	"fmt"
	"slices"
	"strings"
)

// Slab is a size-class allocator in the manner of Bonwick's slab allocator
// (USENIX 1994) and of RMM's binning and fixed-size resources: each request
// is rounded up to the smallest size class that holds it and placed in a
// slab of that class, a device segment of slab_size bytes cut into equal
// objects. Requests over the largest class go straight to the device as a
// segment of their own, rounded up to 2 MiB; that segment is the block.
//
// Each class keeps its slabs with a free object in a list, most recently
// freed into first; a malloc takes an object of the list's first slab (the
// most recently freed object of that slab, else its lowest never-used
// one), and a class with no free object gets a new slab. A freed object
// returns to its slab. An empty slab stays cached until EmptyCache, a retry
// or, with release set, goes back to the device at once. When the device
// refuses a slab or segment, every empty slab is returned to the device
// and, if any was, the device allocation is tried once more (a retry, see
// Retries); then the malloc is an OOM. Streams are ignored. A malloc of 0
// bytes returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - classes [512,1KiB,2KiB,...,512KiB,1MiB]: the object sizes, a
//     comma-separated list of sizes in any order (the powers of two from
//     512 B to 1 MiB by default, the small-request range of PyTorch's
//     allocator).
//   - slab_size [2MiB]: the bytes of a slab, at least the largest class;
//     a slab of class c holds slab_size/c objects and wastes the rest.
//   - release [false]: return a slab to the device as soon as it is empty.
type Slab struct {
	dev      Device
	classes  []uint64 // ascending
	slabSize uint64
	release  bool

	partial   []*slabSegment // by class: slabs with a free object, a doubly linked list
	freeObjs  []uint64       // by class: free objects in slabs
	objects   map[uint64]*slabSegment
	freeBytes uint64
	retries   int64
	spare     []*slabSegment
}

// slabSegment is a device segment of the slab policy: a slab of one class,
// or the segment of a request over the largest class (class -1).
type slabSegment struct {
	addr, objSize uint64
	class         int
	objs, used    uint32
	bump          uint32   // objects below bump have been used at least once
	freeIdx       []uint32 // freed object indices below bump, a stack
	prev, next    *slabSegment
	listed        bool // on the class's partial list
}

var (
	_ Policy     = (*Slab)(nil)
	_ Releaser   = (*Slab)(nil)
	_ FreeSpacer = (*Slab)(nil)
	_ Counter    = (*Slab)(nil)
)

func init() {
	register(Info{
		Name:   "slab",
		Design: "size-class slabs in the manner of Bonwick's slab allocator (USENIX 1994)",
		Settings: []Setting{
			{Key: "classes", Default: "512,1KiB,2KiB,4KiB,8KiB,16KiB,32KiB,64KiB,128KiB,256KiB,512KiB,1MiB", Doc: "the object sizes in bytes, a comma-separated list in any order"},
			{Key: "slab_size", Default: "2MiB", Doc: "the bytes of a slab, at least the largest class"},
			{Key: "release", Default: "false", Doc: "return a slab to the device as soon as it is empty"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewSlab(dev, s) })
}

// NewSlab returns a slab policy on dev. It returns an error naming the key
// for an unknown or malformed setting.
func NewSlab(dev Device, s Settings) (*Slab, error) {
	const name = "slab"
	if err := s.Check(name, "classes", "slab_size", "release"); err != nil {
		return nil, err
	}
	var classes []uint64
	if v, ok := s["classes"]; ok {
		for f := range strings.SplitSeq(v, ",") {
			c, err := ParseSize(f)
			if err != nil {
				return nil, invalidSettingf(name, s, "classes", "%v", err)
			}
			if c == 0 {
				return nil, invalidSettingf(name, s, "classes", "a class of 0 bytes")
			}
			classes = append(classes, c)
		}
		slices.Sort(classes)
		for i := 1; i < len(classes); i++ {
			if classes[i] == classes[i-1] {
				return nil, invalidSettingf(name, s, "classes", "class %d listed twice", classes[i])
			}
		}
	} else {
		for c := uint64(512); c <= 1<<20; c *= 2 {
			classes = append(classes, c)
		}
	}
	size, err := s.Bytes(name, "slab_size", deviceGranularity)
	if err != nil {
		return nil, err
	}
	largest := classes[len(classes)-1]
	if size < largest || size > maxRequest {
		if _, ok := s["slab_size"]; !ok {
			return nil, invalidSettingf(name, s, "classes", "class %d is larger than slab_size (%d)", largest, size)
		}
		return nil, invalidSettingf(name, s, "slab_size", "must be from the largest class (%d) to 4 EiB", largest)
	}
	if size/classes[0] >= 1<<32 {
		return nil, invalidSettingf(name, s, "slab_size", "holds 2^32 or more objects of class %d", classes[0])
	}
	rel, err := s.Bool(name, "release", false)
	if err != nil {
		return nil, err
	}
	return &Slab{
		dev:      dev,
		classes:  classes,
		slabSize: size,
		release:  rel,
		partial:  make([]*slabSegment, len(classes)),
		freeObjs: make([]uint64, len(classes)),
		objects:  map[uint64]*slabSegment{},
	}, nil
}

// Name returns "slab".
func (p *Slab) Name() string { return "slab" }

// Retries returns the number of device allocations retried after
// returning the empty slabs to the device.
func (p *Slab) Retries() int64 { return p.retries }

// FreeSpace returns the bytes of the free objects in the slabs and the size
// in bytes of the largest free object.
func (p *Slab) FreeSpace() (total, largest uint64) {
	for c := len(p.classes) - 1; c >= 0; c-- {
		if p.freeObjs[c] > 0 {
			return p.freeBytes, p.classes[c]
		}
	}
	return p.freeBytes, 0
}

// Malloc places size bytes in an object of the smallest class that holds
// them, or in a segment of its own for a request over the largest class.
// Stream is ignored. It returns an error wrapping ErrOutOfMemory when the
// device refuses a slab or segment even after the release of every empty
// slab.
func (p *Slab) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("slab", size)
	}
	// The smallest class >= size, by binary search.
	lo, hi := 0, len(p.classes)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.classes[m] < size {
			lo = m + 1
		} else {
			hi = m
		}
	}
	c := lo
	if c == len(p.classes) {
		n := ceilToMultiple(size, deviceGranularity)
		addr, err := p.deviceAlloc(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy slab: malloc of %d bytes: %w", size, err)
		}
		g := p.newSegment(addr, n, -1, 1)
		g.used = 1
		p.objects[addr] = g
		return Block{Addr: addr, Size: n}, nil
	}
	obj := p.classes[c]
	g := p.partial[c]
	if g == nil {
		addr, err := p.deviceAlloc(p.slabSize)
		if err != nil {
			return Block{}, fmt.Errorf("policy slab: malloc of %d bytes: %w", size, err)
		}
		objs := p.slabSize / obj
		g = p.newSegment(addr, obj, c, uint32(objs))
		p.freeObjs[c] += objs
		p.freeBytes += objs * obj
		p.link(g)
	}
	var i uint32
	if k := len(g.freeIdx); k > 0 {
		i = g.freeIdx[k-1]
		g.freeIdx = g.freeIdx[:k-1]
	} else {
		i = g.bump
		g.bump++
	}
	g.used++
	if g.used == g.objs {
		p.unlink(g)
	}
	p.freeObjs[c]--
	p.freeBytes -= obj
	addr := g.addr + uint64(i)*obj
	p.objects[addr] = g
	return Block{Addr: addr, Size: obj}, nil
}

// Free returns the object at addr to its slab; with release set, a slab
// left empty goes back to the device. A segment of its own goes back to the
// device at once. Stream is ignored. It returns an error if addr is not a
// live block.
func (p *Slab) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	g, ok := p.objects[addr]
	if !ok {
		return fmt.Errorf("policy slab: free of %#x: not a live block", addr)
	}
	delete(p.objects, addr)
	if g.class < 0 {
		return p.freeSegment(g)
	}
	g.freeIdx = append(g.freeIdx, uint32((addr-g.addr)/g.objSize))
	g.used--
	p.freeObjs[g.class]++
	p.freeBytes += g.objSize
	if g.listed {
		p.unlink(g) // to the front
	}
	p.link(g)
	if g.used == 0 && p.release {
		return p.freeSlab(g)
	}
	return nil
}

// EmptyCache returns every empty slab to the device.
func (p *Slab) EmptyCache() error {
	_, err := p.releaseFree()
	return err
}

// releaseFree returns every empty slab to the device and reports how many
// it returned.
func (p *Slab) releaseFree() (int, error) {
	n := 0
	for c := range p.partial {
		for g := p.partial[c]; g != nil; {
			next := g.next
			if g.used == 0 {
				if err := p.freeSlab(g); err != nil {
					return n, err
				}
				n++
			}
			g = next
		}
	}
	return n, nil
}

// freeSlab returns empty slab g, on its class's list, to the device.
func (p *Slab) freeSlab(g *slabSegment) error {
	p.unlink(g)
	p.freeObjs[g.class] -= uint64(g.objs)
	p.freeBytes -= uint64(g.objs) * g.objSize
	return p.freeSegment(g)
}

func (p *Slab) freeSegment(g *slabSegment) error {
	addr := g.addr
	g.freeIdx = g.freeIdx[:0]
	*g = slabSegment{freeIdx: g.freeIdx}
	p.spare = append(p.spare, g)
	if err := p.dev.Free(addr); err != nil {
		return fmt.Errorf("policy slab: %w", err)
	}
	return nil
}

// deviceAlloc allocates n bytes from the device; when the device refuses,
// it returns the empty slabs and, if there were any, tries once more.
func (p *Slab) deviceAlloc(n uint64) (uint64, error) {
	return allocRetry(p.dev, n, p.releaseFree, &p.retries)
}

func (p *Slab) newSegment(addr, objSize uint64, class int, objs uint32) *slabSegment {
	var g *slabSegment
	if k := len(p.spare); k > 0 {
		g = p.spare[k-1]
		p.spare = p.spare[:k-1]
	} else {
		g = new(slabSegment)
	}
	*g = slabSegment{addr: addr, objSize: objSize, class: class, objs: objs, freeIdx: g.freeIdx}
	return g
}

// link puts slab g at the front of its class's list.
func (p *Slab) link(g *slabSegment) {
	g.prev, g.next = nil, p.partial[g.class]
	if g.next != nil {
		g.next.prev = g
	}
	p.partial[g.class] = g
	g.listed = true
}

func (p *Slab) unlink(g *slabSegment) {
	if g.prev != nil {
		g.prev.next = g.next
	} else {
		p.partial[g.class] = g.next
	}
	if g.next != nil {
		g.next.prev = g.prev
	}
	g.prev, g.next = nil, nil
	g.listed = false
}
