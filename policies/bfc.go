package policies

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/gpualloc/allocsim/trace"
)

// BFC is TensorFlow's GPU allocator, best-fit with coalescing, as in
// tensorflow/core/common_runtime/bfc_allocator.cc (with the GPU defaults of
// gpu/gpu_bfc_allocator.cc).
//
// Requests are rounded up to a multiple of 256 B. Free chunks sit in 21
// bins by size (bin b holds [256*2^b, 256*2^(b+1)), the last is
// unbounded), each ordered by (size, address); a malloc searches from the
// request's bin upward and takes the first chunk that is large enough. As
// the bins partition the sizes, that is the smallest free chunk that fits,
// the lowest address among equal sizes, and the policy keeps the free
// chunks in one tree in that order. A chunk is split when it is at least
// twice the rounded request or when the remainder would be 128 MiB or
// more; the front part is returned, so a block may be larger than its
// rounded request. A freed chunk coalesces with free neighbours in its
// region.
//
// Memory comes from the device in regions, not coalesced with one another
// unless coalesce_regions says so. With allow_growth, the first region is 2 MiB (or the memory
// limit if smaller), and each later one doubles the size of the previous
// one, or more when a request needs it (the doubling then skips once);
// without it, one region of the whole memory limit. A region is never
// larger than the memory limit minus the regions already held. When a
// malloc finds no chunk and cannot add a region, garbage collection (on by
// default, as TF_ENABLE_GPU_GARBAGE_COLLECTION) returns every wholly free
// region to the device if that would make room, and a region is added
// again (a retry, see Retries). When the device itself refuses a region,
// the policy asks for 10% less at a time, down to the request, once in its
// life (TensorFlow's backpedal; each smaller try is a retry). Then the
// malloc is an OOM.
//
// Not modelled: the timestamped chunks of stream-ordered frees
// (freed_at_count), the retry helper that waits up to 10 s for another
// thread to free memory, and where the driver places a virtual-memory
// sub-allocator's regions (which decides which of them coalesce: the
// simulated device places each segment after the previous one, so with
// coalesce_regions all of them do). Streams are ignored (TensorFlow runs
// one compute stream per device), and so is empty_cache, which TensorFlow does not have. A malloc
// of 0 bytes returns the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - allow_growth [true]: grow regions from 2 MiB by doubling; false takes
//     one region of the memory limit at the first malloc, and needs a limit.
//   - memory_limit [the device's capacity, unlimited without one]: the
//     bytes the policy may hold (TensorFlow's total_memory).
//   - memory_fraction [none]: the memory limit as this fraction of the
//     card's total memory (the card the trace names), rounded up to 2 MiB
//     as XLA takes it, or else of the device's capacity, in (0, 1]; not
//     with memory_limit.
//   - garbage_collection [true]: return wholly free regions when a region
//     cannot be added.
//   - coalesce_regions [false]: a device segment that begins where a region
//     ends extends that region, its chunk merging with the region's free
//     last chunk, as BFC does over a sub-allocator that supports coalescing
//     (XLA's virtual-memory one; TensorFlow's cudaMalloc one does not).
//
// XLA runs this allocator under every JAX job on a GPU (its BFC of
// xla/tsl/framework/bfc_allocator.cc, made in xla/pjrt/gpu's
// CreateBFCAllocator, named GPU_0_bfc): preallocated by default, which is
// allow_growth=false, and growing with XLA_PYTHON_CLIENT_PREALLOCATE=false,
// which is allow_growth=true; its memory limit is
// XLA_PYTHON_CLIENT_MEM_FRACTION (0.75) of the card's total memory as the
// driver reports it, rounded up to 2 MiB, which memory_stats() gives as
// bytes_limit (on the H200 here 112583507968: 0.75 of the 150109880320
// bytes cudaMemGetInfo reports, rounded up to 53684 pages of 2 MiB);
// memory_fraction=0.75 on a trace that names its card gives it. The cuDNN
// and cuBLAS memory of such a job never reaches the allocator
// (trace.DirectSite).
type BFC struct {
	dev         Device
	allowGrowth bool
	gc          bool
	coalesce    bool   // coalesce_regions
	limit       uint64 // memory limit in bytes; noLimit if none

	curRegion   uint64 // size of the next region, before doubling
	total       uint64 // bytes in regions
	backpedaled bool

	free    fitTree // free chunks by (size, address)
	live    trace.AddrMap[*fitBlock]
	regions []*bfcRegion
	retries int64
	nodes   fitNodes
}

// bfcRegion is a region of the bfc policy: one device segment, or with
// coalesce_regions several adjacent ones (segs, their addresses).
type bfcRegion struct {
	addr, size uint64
	first      *fitBlock
	segs       []uint64
}

const (
	bfcMinAllocation = 256       // kMinAllocationSize
	bfcMaxWaste      = 128 << 20 // kMaxInternalFragmentation
	noLimit          = ^uint64(0)
)

var (
	_ Policy     = (*BFC)(nil)
	_ FreeSpacer = (*BFC)(nil)
	_ Counter    = (*BFC)(nil)
)

func init() {
	register(Info{
		Name:   "bfc",
		Design: "TensorFlow's best-fit with coalescing (tensorflow/core/common_runtime/bfc_allocator.cc)",
		Settings: []Setting{
			{Key: "allow_growth", Default: "true", Doc: "grow regions from 2 MiB by doubling; false takes one region of the memory limit at the first malloc"},
			{Key: "memory_limit", Default: "the device's capacity, else none", Derived: true, Doc: "the bytes the policy may hold (TensorFlow's total_memory), at least 256"},
			{Key: "memory_fraction", Default: "none", Derived: true, Doc: "the memory limit as this fraction of the card's total memory, rounded up to 2 MiB as XLA takes it (XLA_PYTHON_CLIENT_MEM_FRACTION), or of the capacity where the trace names no card, in (0, 1]; not with memory_limit"},
			{Key: "coalesce_regions", Default: "false", Doc: "a device segment that begins where a region ends extends it (BFC over a sub-allocator that coalesces: XLA's virtual-memory one)"},
			{Key: "garbage_collection", Default: "true", Doc: "return wholly free regions to the device when a region cannot be added"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewBFC(dev, s) })
	registerRecorded("bfc", bfcRecorded)
}

// bfcRecorded is the RecordedFunc of bfc: an XSpace of XLA's BFC records its
// memory limit (recorded "memory_limit"), not whether XLA preallocated it;
// XLA's default, preallocation (allow_growth=false), is taken. A user's
// memory_fraction replaces the recorded limit.
func bfcRecorded(source string, recorded map[string]string, user Settings) (Settings, bool, error) {
	if source != "xspace" {
		return user, false, nil
	}
	s := Settings{"allow_growth": "false"}
	if l, ok := recorded["memory_limit"]; ok {
		if _, frac := user["memory_fraction"]; !frac {
			s["memory_limit"] = l
		}
	}
	maps.Copy(s, user)
	return s, true, nil
}

// NewBFC returns a bfc policy on dev. It returns an error naming the key
// for an unknown or malformed setting, and for allow_growth=false without
// a memory limit.
func NewBFC(dev Device, s Settings) (*BFC, error) {
	const name = "bfc"
	if err := s.Check(name, "allow_growth", "garbage_collection", "memory_limit", "memory_fraction", "coalesce_regions"); err != nil {
		return nil, err
	}
	coalesce, err := s.Bool(name, "coalesce_regions", false)
	if err != nil {
		return nil, err
	}
	growth, err := s.Bool(name, "allow_growth", true)
	if err != nil {
		return nil, err
	}
	gc, err := s.Bool(name, "garbage_collection", true)
	if err != nil {
		return nil, err
	}
	limit, err := s.Bytes(name, "memory_limit", deviceCapacity(dev))
	if err != nil {
		return nil, err
	}
	if f, set := s["memory_fraction"]; set {
		if _, both := s["memory_limit"]; both {
			return nil, invalidSettingf(name, s, "memory_fraction", "give memory_limit or memory_fraction, not both")
		}
		frac, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(frac > 0 && frac <= 1) {
			return nil, invalidSettingf(name, s, "memory_fraction", "must be a fraction in (0, 1]")
		}
		if card, ok := dev.(CardMemorier); ok && card.CardMemory() > 0 {
			// XLA's limit: the fraction of the card's total memory,
			// rounded up to its 2 MiB pages.
			limit = ceilToMultiple(uint64(frac*float64(card.CardMemory())), 2<<20)
		} else if capacity := deviceCapacity(dev); capacity > 0 {
			limit = uint64(frac * float64(capacity))
		} else {
			return nil, invalidSettingf(name, s, "memory_fraction", "needs a card or a device capacity (--capacity)")
		}
		if limit < bfcMinAllocation {
			return nil, invalidSettingf(name, s, "memory_fraction", "leaves less than 256 B")
		}
	}
	if _, set := s["memory_limit"]; set && limit < bfcMinAllocation {
		return nil, invalidSettingf(name, s, "memory_limit", "must be at least 256 B")
	}
	if limit == 0 {
		if !growth {
			return nil, invalidSettingf(name, s, "allow_growth", "false needs a memory limit (--capacity or memory_limit)")
		}
		limit = noLimit
	}
	p := &BFC{
		dev:         dev,
		allowGrowth: growth,
		gc:          gc,
		coalesce:    coalesce,
		limit:       limit,
	}
	if growth {
		p.curRegion = ceilToMultiple(min(limit, 2<<20), bfcMinAllocation)
	} else {
		p.curRegion = ceilToMultiple(limit, bfcMinAllocation)
	}
	return p, nil
}

// deviceCapacity returns dev's capacity in bytes, 0 if it has none.
func deviceCapacity(dev Device) uint64 {
	if c, ok := dev.(Capacitor); ok {
		return c.Capacity()
	}
	return 0
}

// Name returns "bfc".
func (p *BFC) Name() string { return "bfc" }

// Retries returns the number of regions asked of the device again after a
// garbage collection or, once, after the device refused one (backpedal).
func (p *BFC) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes in the regions and the size in bytes of
// the largest free chunk.
func (p *BFC) FreeSpace() (total, largest uint64) { return p.free.bytes, p.free.largest() }

// Malloc places size bytes, rounded up to 256 B, in the best-fitting free
// chunk, adding a region when none fits. Stream is ignored. It returns an
// error wrapping ErrOutOfMemory when no region can be added even after
// garbage collection.
func (p *BFC) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("bfc", size)
	}
	n := ceilToMultiple(size, bfcMinAllocation)
	c := p.free.takeBest(n)
	if c == nil {
		ok, err := p.extend(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy bfc: malloc of %d bytes: %w", size, err)
		}
		if !ok && p.gc {
			freed, err := p.deallocateFreeRegions(n)
			if err != nil {
				return Block{}, fmt.Errorf("policy bfc: malloc of %d bytes: %w", size, err)
			}
			if freed {
				p.retries++
				if ok, err = p.extend(n); err != nil {
					return Block{}, fmt.Errorf("policy bfc: malloc of %d bytes: %w", size, err)
				}
			}
		}
		if ok {
			c = p.free.takeBest(n)
		}
		if c == nil {
			return Block{}, fmt.Errorf("policy bfc: malloc of %d bytes (%d rounded) with %d of %d in regions, %d free, largest free chunk %d: %w",
				size, n, p.total, p.limit, p.free.bytes, p.free.largest(), ErrOutOfMemory)
		}
	}
	if c.size >= 2*n || c.size-n >= bfcMaxWaste {
		r := p.nodes.get(c.addr+n, c.size-n)
		linkAfter(c, r)
		c.size = n
		p.free.insert(r)
	}
	p.live.Put(c.addr, c)
	return Block{Addr: c.addr, Size: c.size}, nil
}

// Free returns the chunk at addr, coalesced with its free neighbours in
// the region. Stream is ignored. It returns an error if addr is not a live
// chunk.
func (p *BFC) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	c, _ := p.live.Take(addr)
	if c == nil {
		return fmt.Errorf("policy bfc: free of %#x: not a live block", addr)
	}
	if nx := c.next; nx != nil && nx.tree != nil {
		p.free.remove(nx)
		c.size += nx.size
		unlink(nx)
		p.nodes.put(nx)
	}
	if pv := c.prev; pv != nil && pv.tree != nil {
		p.free.remove(pv)
		pv.size += c.size
		unlink(c)
		p.nodes.put(c)
		c = pv
	}
	p.free.insert(c)
	return nil
}

// extend adds a region large enough for n bytes (BFCAllocator::Extend). It
// reports false when the memory limit or the device leaves no room, and
// returns an error only for a device failure other than an OOM.
func (p *BFC) extend(n uint64) (bool, error) {
	avail := (p.limit - p.total) / bfcMinAllocation * bfcMinAllocation
	if n > avail {
		return false, nil
	}
	increased := false
	for n > p.curRegion {
		p.curRegion *= 2
		increased = true
	}
	bytes := min(p.curRegion, avail)
	addr, err := p.dev.Alloc(bytes)
	if err != nil && errors.Is(err, ErrOutOfMemory) && !p.backpedaled {
		p.backpedaled = true
		for err != nil && errors.Is(err, ErrOutOfMemory) {
			// bytes * 0.9f in single precision, as the original.
			bytes = ceilToMultiple(uint64(float32(bytes)*float32(0.9)), bfcMinAllocation)
			if bytes < n {
				break
			}
			p.retries++
			addr, err = p.dev.Alloc(bytes)
		}
	}
	if err != nil {
		if errors.Is(err, ErrOutOfMemory) {
			return false, nil
		}
		return false, err
	}
	if !increased && p.curRegion < 1<<62 {
		p.curRegion *= 2
	}
	p.total += bytes
	c := p.nodes.get(addr, bytes)
	if p.coalesce {
		// A segment that starts where a region ends extends it
		// (RegionManager::AddOrExtendAllocationRegion): its chunk follows
		// the region's last one, and merges with it if that is free.
		for _, r := range p.regions {
			if r.addr+r.size != addr {
				continue
			}
			r.size += bytes
			r.segs = append(r.segs, addr)
			last := r.first
			for last.next != nil {
				last = last.next
			}
			if last.tree != nil {
				p.free.remove(last)
				last.size += bytes
				p.nodes.put(c)
				c = last
			} else {
				linkAfter(last, c)
			}
			p.free.insert(c)
			return true, nil
		}
	}
	p.regions = append(p.regions, &bfcRegion{addr: addr, size: bytes, first: c, segs: []uint64{addr}})
	p.free.insert(c)
	return true, nil
}

// deallocateFreeRegions returns every wholly free region to the device
// when that makes room for n bytes (BFCAllocator::DeallocateFreeRegions),
// and reports whether it returned any. It returns the device's error for
// a failed free.
func (p *BFC) deallocateFreeRegions(n uint64) (bool, error) {
	var freed uint64
	for _, r := range p.regions {
		if r.first.tree != nil && r.first.next == nil {
			freed += r.size
		}
	}
	if freed == 0 {
		return false, nil
	}
	if p.limit != noLimit && n > p.limit-p.total+freed {
		return false, nil
	}
	kept := p.regions[:0]
	var err error
	for _, r := range p.regions {
		if r.first.tree == nil || r.first.next != nil {
			kept = append(kept, r)
			continue
		}
		p.free.remove(r.first)
		p.nodes.put(r.first)
		p.total -= r.size
		for _, seg := range r.segs {
			if ferr := p.dev.Free(seg); ferr != nil && err == nil {
				err = ferr
			}
		}
	}
	clear(p.regions[len(kept):])
	p.regions = kept
	return true, err
}

// fitBlock is a run of bytes of a segment, free or allocated, linked to its
// address neighbours (within its segment, or its superblock for
// rmm-arena). A free block is in one fitTree.
type fitBlock struct {
	addr, size uint64
	prev, next *fitBlock
	tree       *fitTree         // the tree holding the block while free; nil while allocated
	sb         *arenaSuperblock // rmm-arena: the superblock holding the block
}

// fitTree is the free list of the policies bfc, rmm-pool and rmm-arena: a
// freeTree of blocks keyed by (size, address) for best fit, or by address
// (blocks.byAddr) for first fit, that marks its blocks as in it and counts
// their bytes.
type fitTree struct {
	blocks freeTree[*fitBlock]
	bytes  uint64 // free bytes in the tree
}

// linkAfter puts new block r after b among b's neighbours, in b's
// superblock.
func linkAfter(b, r *fitBlock) {
	r.prev, r.next, r.sb = b, b.next, b.sb
	if b.next != nil {
		b.next.prev = r
	}
	b.next = r
}

// linkBefore puts new block a before b among b's neighbours, in b's
// superblock; the caller updates whatever points at b as a first block.
func linkBefore(b, a *fitBlock) {
	a.prev, a.next, a.sb = b.prev, b, b.sb
	if b.prev != nil {
		b.prev.next = a
	}
	b.prev = a
}

// unlink takes block b out of its neighbours' links.
func unlink(b *fitBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
	b.prev, b.next = nil, nil
}

// fitNodes recycles fitBlocks, so that steady-state mallocs and frees
// allocate nothing.
type fitNodes struct{ spare []*fitBlock }

func (f *fitNodes) get(addr, size uint64) *fitBlock {
	var b *fitBlock
	if k := len(f.spare); k > 0 {
		b = f.spare[k-1]
		f.spare = f.spare[:k-1]
	} else {
		b = new(fitBlock)
	}
	b.addr, b.size = addr, size
	return b
}

func (f *fitNodes) put(b *fitBlock) {
	*b = fitBlock{}
	f.spare = append(f.spare, b)
}

// largest returns the size of the largest free block, 0 if none.
func (t *fitTree) largest() uint64 { return t.blocks.largest() }

// best returns the smallest block of at least n bytes, the lowest address
// among equals, or nil; t is keyed by (size, address).
func (t *fitTree) best(n uint64) *fitBlock {
	b, _ := t.blocks.best(n)
	return b
}

// takeBest removes the block best returns from t and returns it, or nil,
// in one descent.
func (t *fitTree) takeBest(n uint64) *fitBlock {
	b, ok := t.blocks.takeBest(n)
	if !ok {
		return nil
	}
	b.tree = nil
	t.bytes -= b.size
	return b
}

// takeFirst cuts n bytes from the front of the block first returns, in
// one descent: a block of n bytes leaves t and is returned with true; a
// larger one stays, its address n bytes higher and its size n bytes less,
// and is returned with false. It returns nil if no block fits, or if ok,
// when not nil, refuses the block.
func (t *fitTree) takeFirst(n uint64, ok func(*fitBlock) bool) (*fitBlock, bool) {
	b, old, found := t.blocks.takeFirst(n, ^uint64(0), ok)
	if !found {
		return nil, false
	}
	t.bytes -= n
	if old == n {
		b.tree = nil
		return b, true
	}
	b.addr, b.size = b.addr+n, b.size-n
	return b, false
}

// first returns the lowest block of at least n bytes, or nil; t is keyed
// by address.
func (t *fitTree) first(n uint64) *fitBlock {
	b, _ := t.blocks.first(n)
	return b
}

// insert puts free block b into t.
func (t *fitTree) insert(b *fitBlock) {
	b.tree = t
	t.bytes += b.size
	t.blocks.insert(b.size, b.addr, b)
}

// remove takes free block b, whose address and size are those it has in
// t, out of t.
func (t *fitTree) remove(b *fitBlock) {
	t.blocks.delete(b.size, b.addr)
	b.tree = nil
	t.bytes -= b.size
}

// resize sets the address and size of free block b in place, in a tree
// keyed by address (only); its place in address order must not change.
func (t *fitTree) resize(b *fitBlock, addr, size uint64) {
	t.bytes += size - b.size
	t.blocks.resize(b.addr, addr, size)
	b.addr, b.size = addr, size
}
