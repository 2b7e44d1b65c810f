package policies

import (
	"errors"
	"fmt"

	"github.com/gpualloc/allocsim/trace"
)

// RMMArena is RAPIDS RMM's arena_memory_resource, as in rapidsai/rmm
// include/rmm/mr/device/arena_memory_resource.hpp and detail/arena.hpp (now
// cpp/include/rmm/mr/detail/arena.hpp and cpp/src/mr/detail/
// arena_memory_resource_impl.cpp), a simpler form of the global and
// per-thread arenas of Hoard and jemalloc.
//
// A global arena holds the memory, cut into superblocks (spans of at least
// 1 MiB); each stream has an arena of superblocks of its own. Requests are
// rounded up to 256 B. A request of at most 1 MiB goes to its stream's
// arena: the first free block (by address) that holds it, in the first
// superblock (by address) that has one, the front of it returned; when
// none does, the arena takes from the global arena the first superblock
// that has a large enough free block, cut down to 1 MiB when it is empty
// and at least 2 MiB (the rest stays global). A request over 1 MiB goes to
// the global arena directly: the first superblock that holds it, cut down
// to the request when empty and at least 1 MiB larger. A freed block
// coalesces with free neighbours in its superblock, which stays with its
// owner, whatever stream frees it: a stream's arena keeps its superblocks
// even when empty (RMM's class comment says empty superblocks return to the
// global arena; its code returns them only when it defragments), and the
// global arena merges an empty superblock with empty neighbours. When a malloc finds nothing, the policy defragments
// (RMM synchronizes the device and every arena hands all its superblocks
// back to the global arena, where adjacent empty ones merge), a retry (see
// Retries), and tries again; then it is an OOM. Streams matter only in
// which arena serves a request: RMM synchronizes the freeing stream before
// a block of another arena is returned, so reuse needs no further
// ordering in the replay. A malloc of 0 bytes returns the block {0, 0},
// whose free does nothing.
//
// The global arena is one device allocation made when the policy is built,
// arena_size bytes: by default half the device's capacity, as RMM takes
// half the free device memory; its peak reserved bytes are therefore that
// size. On a device without a capacity (or with arena_size=0) the global
// arena grows instead: when no superblock fits, it takes a device segment
// of the request (at least 1 MiB) rounded up to 2 MiB as a new superblock,
// which models an arena just large enough never to run out, and so never
// to defragment. Superblocks never merge across two such segments.
//
// Not modelled: per-thread arenas (RMM's per-thread default stream), the
// compile-time size classes (RMM_ARENA_USE_SIZE_CLASSES), the memory dump
// of an OOM.
//
// Settings (defaults in brackets):
//   - arena_size [half the capacity, at least 1 MiB, or 0 without a
//     capacity]: the bytes of the global arena, rounded down to 256 B, at
//     least 1 MiB; 0 grows it on demand.
type RMMArena struct {
	dev     Device
	grow    bool
	global  arenaOwner
	arenas  rmmStreams[arenaOwner]
	segs    []*arenaSuperblock // the first superblock of each device segment
	live    trace.AddrMap[*fitBlock]
	retries int64
	nodes   fitNodes
	spare   []*arenaSuperblock
	// free is the free bytes of the streams' arenas and tops their
	// largest free blocks, counted as an arena changes, so that FreeSpace
	// does not walk every arena at each event (N streams cost N^2).
	free uint64
	tops maxTops
}

// arenaOwner is the global arena or a stream's: the free blocks of the
// superblocks it owns, by address.
type arenaOwner struct {
	free  fitTree
	ready bool
	id    int    // in RMMArena.arenas.order
	bytes uint64 // free.bytes when last counted in RMMArena.free
}

// counted counts the free bytes and largest free block of a stream's
// arena a again in p.free and p.tops, after a change; the global arena
// is not counted there.
func (p *RMMArena) counted(a *arenaOwner) {
	if a == &p.global {
		return
	}
	p.free = p.free - a.bytes + a.free.bytes
	a.bytes = a.free.bytes
	p.tops.set(a.id, a.free.largest())
}

// arenaSuperblock is a span of a device segment owned by one arena; its
// blocks, linked by address, tile it.
type arenaSuperblock struct {
	addr, size, used uint64
	owner            *arenaOwner
	prev, next       *arenaSuperblock // neighbours in the device segment
	first            *fitBlock
}

// arenaMinSuperblock is the smallest superblock, and the largest request a
// stream's arena serves, in bytes.
const arenaMinSuperblock = 1 << 20

var (
	_ Policy     = (*RMMArena)(nil)
	_ FreeSpacer = (*RMMArena)(nil)
	_ Counter    = (*RMMArena)(nil)
)

func init() {
	register(Info{
		Name:   "rmm-arena",
		Design: "RAPIDS RMM's arena_memory_resource (arena_memory_resource.hpp, detail/arena.hpp)",
		Settings: []Setting{
			{Key: "arena_size", Default: "half the capacity, at least 1 MiB; 0 without a capacity", Derived: true, Doc: "the bytes of the global arena, rounded down to 256 B, at least 1 MiB; 0 grows it on demand"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewRMMArena(dev, s) })
}

// NewRMMArena returns an rmm-arena policy on dev, with its global arena
// allocated unless it grows. It returns an error naming the key for an
// unknown or malformed setting, and an error wrapping ErrOutOfMemory when
// the device refuses the arena.
func NewRMMArena(dev Device, s Settings) (*RMMArena, error) {
	const name = "rmm-arena"
	if err := s.Check(name, "arena_size"); err != nil {
		return nil, err
	}
	size, err := s.Bytes(name, "arena_size", deviceCapacity(dev)/2)
	if err != nil {
		return nil, err
	}
	size = size / rmmAlignment * rmmAlignment
	if _, set := s["arena_size"]; !set && deviceCapacity(dev) > 0 && size < arenaMinSuperblock {
		// Half of a device under 2 MiB: the smallest arena, which such a
		// device may refuse (then every malloc is an OOM).
		size = arenaMinSuperblock
	}
	if size != 0 && (size < arenaMinSuperblock || size > maxRequest) {
		return nil, invalidSettingf(name, s, "arena_size", "must be 0 (grow) or from 1 MiB to 4 EiB")
	}
	p := &RMMArena{dev: dev, grow: size == 0}
	p.global.free.blocks.byAddr = true
	if size > 0 {
		if err := p.addSegment(size); err != nil {
			return nil, fmt.Errorf("policy %s: arena of %d bytes: %w", name, size, err)
		}
	}
	return p, nil
}

// Name returns "rmm-arena".
func (p *RMMArena) Name() string { return "rmm-arena" }

// Retries returns the number of defragmentations: mallocs tried again
// after every arena handed its superblocks back.
func (p *RMMArena) Retries() int64 { return p.retries }

// FreeSpace returns the free bytes in all arenas and the size in bytes of
// the largest free block.
func (p *RMMArena) FreeSpace() (total, largest uint64) {
	return p.global.free.bytes + p.free, max(p.global.free.largest(), p.tops.max())
}

// Malloc places size bytes, rounded up to 256 B: in the stream's arena up
// to 1 MiB, in the global arena above, defragmenting once when neither
// has room. It returns an error wrapping ErrOutOfMemory when there is
// still no room.
func (p *RMMArena) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("rmm-arena", size)
	}
	n := ceilToMultiple(size, rmmAlignment)
	a := p.arenas.get(stream)
	if !a.ready {
		a.free.blocks.byAddr, a.ready = true, true
		a.id = len(p.arenas.order) - 1
	}
	b, err := p.allocate(a, n)
	if err == nil && b == nil {
		p.retries++
		p.defragment()
		b, err = p.allocate(a, n)
	}
	p.counted(a)
	if err != nil {
		return Block{}, fmt.Errorf("policy rmm-arena: malloc of %d bytes: %w", size, err)
	}
	if b == nil {
		return Block{}, fmt.Errorf("policy rmm-arena: malloc of %d bytes on stream %#x: no room in the arena (%d bytes free, largest %d): %w",
			size, stream, p.global.free.bytes+p.arenaFree(), max(p.global.free.largest(), p.arenaLargest()), ErrOutOfMemory)
	}
	return Block{Addr: b.addr, Size: n}, nil
}

func (p *RMMArena) arenaFree() uint64 { return p.free }

func (p *RMMArena) arenaLargest() uint64 { return p.tops.max() }

// Free returns the block at addr to its superblock, coalesced with its
// free neighbours there; an empty superblock of the global arena merges
// with empty neighbours. Stream is ignored. It returns an error if addr is
// not a live block.
func (p *RMMArena) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	b, _ := p.live.Take(addr)
	if b == nil {
		return fmt.Errorf("policy rmm-arena: free of %#x: not a live block", addr)
	}
	sb := b.sb
	sb.used -= b.size
	t := &sb.owner.free
	pv, nx := b.prev, b.next
	pFree, nFree := pv != nil && pv.tree != nil, nx != nil && nx.tree != nil
	switch {
	case pFree && nFree:
		t.remove(nx)
		t.resize(pv, pv.addr, pv.size+b.size+nx.size)
		p.unlinkBlock(b)
		p.unlinkBlock(nx)
	case pFree:
		t.resize(pv, pv.addr, pv.size+b.size)
		p.unlinkBlock(b)
	case nFree:
		t.resize(nx, b.addr, nx.size+b.size)
		p.unlinkBlock(b)
	default:
		t.insert(b)
	}
	if sb.owner == &p.global && sb.used == 0 {
		p.coalesce(sb) // sb may be merged away
	} else {
		p.counted(sb.owner)
	}
	return nil
}

// allocate places n bytes for arena a, or returns nil when nothing has
// room; it returns an error only for a device failure other than an OOM.
func (p *RMMArena) allocate(a *arenaOwner, n uint64) (*fitBlock, error) {
	if n > arenaMinSuperblock {
		// In one descent, unless the superblock found is to be cut down
		// first (globalFirstFit's split) or nothing fits.
		want := max(n, arenaMinSuperblock)
		noSplit := func(b *fitBlock) bool { return b.sb.used != 0 || b.sb.size < want+arenaMinSuperblock }
		if b := p.take(&p.global.free, n, noSplit); b != nil {
			return b, nil
		}
		sb, err := p.globalFirstFit(n)
		if sb == nil {
			return nil, err
		}
		return p.take(&p.global.free, n, nil), nil
	}
	if b := p.take(&a.free, n, nil); b != nil {
		return b, nil
	}
	sb, err := p.globalFirstFit(n)
	if sb == nil {
		return nil, err
	}
	p.move(sb, a)
	return p.take(&a.free, n, nil), nil
}

// globalFirstFit returns the global arena's first superblock with a free
// block of n bytes, cut down to max(n, 1 MiB) if it is empty and at least
// 1 MiB larger; growing the arena if it may. It returns nil when none has
// room.
func (p *RMMArena) globalFirstFit(n uint64) (*arenaSuperblock, error) {
	b := p.global.free.first(n)
	if b == nil && p.grow {
		err := p.addSegment(ceilToMultiple(max(n, arenaMinSuperblock), deviceGranularity))
		if err != nil {
			if errors.Is(err, ErrOutOfMemory) {
				return nil, nil
			}
			return nil, err
		}
		b = p.global.free.first(n)
	}
	if b == nil {
		return nil, nil
	}
	sb := b.sb
	if want := max(n, arenaMinSuperblock); sb.used == 0 && sb.size >= want+arenaMinSuperblock {
		p.split(sb, want)
	}
	return sb, nil
}

// take allocates n bytes from the front of the first free block of tree
// t large enough, nil if none is or ok (if not nil) refuses it.
func (p *RMMArena) take(t *fitTree, n uint64, ok func(*fitBlock) bool) *fitBlock {
	b, whole := t.takeFirst(n, ok)
	if b == nil {
		return nil
	}
	a := b
	if !whole {
		// b keeps its place in t, cut down to the rest.
		a = p.nodes.get(b.addr-n, n)
		linkBefore(b, a)
		if a.prev == nil {
			a.sb.first = a
		}
	}
	a.sb.used += n
	p.live.Put(a.addr, a)
	return a
}

// unlinkBlock takes block b, merged into a neighbour and out of any tree,
// out of its superblock and recycles it.
func (p *RMMArena) unlinkBlock(b *fitBlock) {
	if b.prev == nil {
		b.sb.first = b.next
	}
	unlink(b)
	p.nodes.put(b)
}

// addSegment allocates a device segment of size bytes as one empty
// superblock of the global arena.
func (p *RMMArena) addSegment(size uint64) error {
	addr, err := p.dev.Alloc(size)
	if err != nil {
		return err
	}
	sb := p.newSuperblock(addr, size)
	p.segs = append(p.segs, sb)
	return nil
}

// newSuperblock returns an empty superblock of the global arena, its one
// free block in the global tree, linked to no neighbour.
func (p *RMMArena) newSuperblock(addr, size uint64) *arenaSuperblock {
	var sb *arenaSuperblock
	if k := len(p.spare); k > 0 {
		sb = p.spare[k-1]
		p.spare = p.spare[:k-1]
	} else {
		sb = new(arenaSuperblock)
	}
	*sb = arenaSuperblock{addr: addr, size: size, owner: &p.global}
	b := p.nodes.get(addr, size)
	b.sb = sb
	sb.first = b
	p.global.free.insert(b)
	return sb
}

// split cuts empty global superblock sb down to head bytes; the rest
// becomes an empty global superblock after it.
func (p *RMMArena) split(sb *arenaSuperblock, head uint64) {
	tail := p.newSuperblock(sb.addr+head, sb.size-head)
	tail.prev, tail.next = sb, sb.next
	if sb.next != nil {
		sb.next.prev = tail
	}
	sb.next = tail
	p.global.free.resize(sb.first, sb.addr, head)
	sb.size = head
}

// merge merges empty global superblock b into a, its neighbour before it.
func (p *RMMArena) merge(a, b *arenaSuperblock) {
	fb := b.first
	p.global.free.remove(fb)
	p.global.free.resize(a.first, a.addr, a.size+b.size)
	a.size += b.size
	a.next = b.next
	if b.next != nil {
		b.next.prev = a
	}
	p.nodes.put(fb)
	*b = arenaSuperblock{}
	p.spare = append(p.spare, b)
}

// coalesce merges empty global superblock sb with its empty global
// neighbours.
func (p *RMMArena) coalesce(sb *arenaSuperblock) {
	if pv := sb.prev; pv != nil && pv.owner == &p.global && pv.used == 0 {
		p.merge(pv, sb)
		sb = pv
	}
	if nx := sb.next; nx != nil && nx.owner == &p.global && nx.used == 0 {
		p.merge(sb, nx)
	}
}

// move hands superblock sb, with its free blocks, to owner o.
func (p *RMMArena) move(sb *arenaSuperblock, o *arenaOwner) {
	for b := sb.first; b != nil; b = b.next {
		if b.tree != nil {
			b.tree.remove(b)
			o.free.insert(b)
		}
	}
	sb.owner = o
}

// defragment hands every arena's superblocks back to the global arena and
// merges adjacent empty superblocks there.
func (p *RMMArena) defragment() {
	for _, first := range p.segs {
		for sb := first; sb != nil; sb = sb.next {
			if sb.owner != &p.global {
				o := sb.owner
				p.move(sb, &p.global)
				p.counted(o)
			}
		}
		for sb := first; sb != nil; sb = sb.next {
			for sb.used == 0 && sb.next != nil && sb.next.used == 0 {
				p.merge(sb, sb.next)
			}
		}
	}
}
