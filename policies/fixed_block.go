package policies

import "fmt"

// FixedBlock is a pool of fixed-size blocks carved from large device
// chunks, the classic hand-written GPU pool, and, through its settings,
// RAPIDS RMM's fixed_size_memory_resource (include/rmm/mr/device/
// fixed_size_memory_resource.hpp, now cpp/src/mr/detail/
// fixed_size_memory_resource_impl.cpp, with detail/fixed_size_free_list.hpp
// and the stream-ordered base detail/stream_ordered_memory_resource.hpp).
//
// Every request up to the block size gets one whole block (the block size
// is what it holds). Free blocks form a first in, first out list: a malloc
// takes the front, a free appends to the back. When the list is empty, a
// chunk of blocks_per_chunk blocks comes from the device and its blocks
// join the list in address order. Chunks are never given back. A request
// larger than a block goes straight to the device as a segment of its own
// (its size rounded up to 256 B), returned at its free; with oversize=oom
// it is an OOM instead, as in RMM. A malloc of 0 bytes returns the block
// {0, 0}, whose free does nothing.
//
// With per_stream, as in RMM, each stream has its own list: a block freed
// on a stream joins that stream's list; a malloc takes from its stream's
// list first, then from the first other stream's list that has a block (RMM
// makes the stream wait on an event of the free, so the block is reusable
// at once), and a new chunk's blocks join the allocating stream's list. The
// other streams are visited in the order in which they were first seen.
// Without it, streams are ignored.
//
// Settings (defaults in brackets):
//   - block_size [8MiB]: the bytes of a block, rounded up to 256 B.
//   - blocks_per_chunk [64]: blocks in a device chunk (512 MiB chunks by
//     default), from 1 to 2^20.
//   - oversize [device]: what a request over the block size gets: device
//     (a segment of its own) or oom.
//   - preallocate [false]: take one chunk from the device when the policy
//     is built, in the default stream's list.
//   - per_stream [false]: one free list per stream, as RMM.
//
// RMM's fixed_size_memory_resource is block_size=1MiB, blocks_per_chunk=128,
// oversize=oom, preallocate=true, per_stream=true.
type FixedBlock struct {
	dev      Device
	oversize bool // requests over the block size go to the device
	fs       fixedSize
	live     map[uint64]uint64 // address -> 0 for a block, bytes for a segment of its own
	up       func(size, stream uint64) (uint64, error)
}

// fixedSize is the free-list machinery of RMM's fixed_size_memory_resource,
// shared by fixed-block and the bins of rmm-binning: blocks of one size in
// first in, first out lists, one per stream or one for all, refilled a
// chunk at a time from an upstream.
type fixedSize struct {
	blockSize  uint64
	perChunk   uint64
	perStream  bool
	streams    rmmStreams[fixedList]
	freeBlocks uint64
	// held is each list's number of free blocks by the order of streams
	// (a list's id less one), kept as lists change, so that a malloc
	// finds the first other stream with a block without a pass over
	// every stream (which made N streams cost N^2).
	held sizeTree
}

// fixedList is a first in, first out list of block addresses.
type fixedList struct {
	buf  []uint64
	head int
	id   int // in fixedSize.streams.order, plus one; 0 until counted
}

// len returns the number of blocks in l.
func (l *fixedList) len() int { return len(l.buf) - l.head }

func (l *fixedList) push(a uint64) { l.buf = append(l.buf, a) }

func (l *fixedList) pop() (uint64, bool) {
	if l.head == len(l.buf) {
		return 0, false
	}
	a := l.buf[l.head]
	l.head++
	switch {
	case l.head == len(l.buf):
		l.buf, l.head = l.buf[:0], 0
	case l.head >= 1024 && l.head >= len(l.buf)/2:
		n := copy(l.buf, l.buf[l.head:])
		l.buf, l.head = l.buf[:n], 0
	}
	return a, true
}

// maxBlocksPerChunk bounds blocks_per_chunk, so that a chunk's list stays
// a few megabytes.
const maxBlocksPerChunk = 1 << 20

var (
	_ Policy     = (*FixedBlock)(nil)
	_ FreeSpacer = (*FixedBlock)(nil)
)

func init() {
	register(Info{
		Name:   "fixed-block",
		Design: "fixed-size blocks carved from device chunks; RAPIDS RMM's fixed_size_memory_resource (fixed_size_memory_resource_impl.cpp) through its settings",
		Settings: []Setting{
			{Key: "block_size", Default: "8MiB", Doc: "the bytes of a block, rounded up to 256 B"},
			{Key: "blocks_per_chunk", Default: "64", Doc: "blocks in a device chunk, from 1 to 2^20"},
			{Key: "oversize", Default: "device", Doc: "what a request over the block size gets: device (a segment of its own) or oom"},
			{Key: "preallocate", Default: "false", Doc: "take one chunk from the device when the policy is built"},
			{Key: "per_stream", Default: "false", Doc: "one free list per stream, as RMM"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewFixedBlock(dev, s) })
}

// NewFixedBlock returns a fixed-block policy on dev, with its first chunk
// allocated when preallocate is set. It returns an error naming the key for
// an unknown or malformed setting, and an error wrapping ErrOutOfMemory
// when the device refuses the preallocated chunk.
func NewFixedBlock(dev Device, s Settings) (*FixedBlock, error) {
	const name = "fixed-block"
	if err := s.Check(name, "block_size", "blocks_per_chunk", "oversize", "preallocate", "per_stream"); err != nil {
		return nil, err
	}
	bs, err := s.Bytes(name, "block_size", 8<<20)
	if err != nil {
		return nil, err
	}
	if bs == 0 || bs > maxRequest {
		return nil, invalidSettingf(name, s, "block_size", "must be from 1 B to 4 EiB")
	}
	bs = ceilToMultiple(bs, rmmAlignment)
	per, err := s.Uint(name, "blocks_per_chunk", 64)
	if err != nil {
		return nil, err
	}
	if per == 0 || per > maxBlocksPerChunk {
		return nil, invalidSettingf(name, s, "blocks_per_chunk", "must be from 1 to %d", maxBlocksPerChunk)
	}
	if bs > maxRequest/per {
		return nil, invalidSettingf(name, s, "blocks_per_chunk", "chunks of %d blocks of %d bytes overflow", per, bs)
	}
	oversize := true
	switch v := s["oversize"]; v {
	case "", "device":
	case "oom":
		oversize = false
	default:
		return nil, invalidSettingf(name, s, "oversize", "must be device or oom")
	}
	pre, err := s.Bool(name, "preallocate", false)
	if err != nil {
		return nil, err
	}
	ps, err := s.Bool(name, "per_stream", false)
	if err != nil {
		return nil, err
	}
	p := &FixedBlock{
		dev:      dev,
		oversize: oversize,
		fs:       fixedSize{blockSize: bs, perChunk: per, perStream: ps},
		live:     map[uint64]uint64{},
	}
	p.up = func(size, stream uint64) (uint64, error) { return dev.Alloc(size) }
	if pre {
		if err := p.fs.preallocate(p.up); err != nil {
			return nil, fmt.Errorf("policy %s: preallocating a chunk of %d bytes: %w", name, bs*per, err)
		}
	}
	return p, nil
}

// Name returns "fixed-block".
func (p *FixedBlock) Name() string { return "fixed-block" }

// FreeSpace returns the bytes of the free blocks and the block size if any
// block is free.
func (p *FixedBlock) FreeSpace() (total, largest uint64) { return p.fs.freeSpace() }

// Malloc gives a request up to the block size a whole block, from the
// stream's list, another stream's or a new chunk; a larger one a device
// segment of its own, or an OOM with oversize=oom. It returns an error
// wrapping ErrOutOfMemory when the device refuses.
func (p *FixedBlock) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("fixed-block", size)
	}
	if size > p.fs.blockSize {
		if !p.oversize {
			return Block{}, fmt.Errorf("policy fixed-block: malloc of %d bytes: larger than the block size %d: %w", size, p.fs.blockSize, ErrOutOfMemory)
		}
		n := ceilToMultiple(size, rmmAlignment)
		addr, err := p.dev.Alloc(n)
		if err != nil {
			return Block{}, fmt.Errorf("policy fixed-block: malloc of %d bytes: %w", size, err)
		}
		p.live[addr] = n
		return Block{Addr: addr, Size: n}, nil
	}
	addr, err := p.fs.malloc(stream, p.up)
	if err != nil {
		return Block{}, fmt.Errorf("policy fixed-block: malloc of %d bytes: chunk of %d bytes: %w", size, p.fs.blockSize*p.fs.perChunk, err)
	}
	p.live[addr] = 0
	return Block{Addr: addr, Size: p.fs.blockSize}, nil
}

// Free appends the block at addr to the stream's list (or the only list),
// or returns a segment of its own to the device. It returns an error if
// addr is not a live block.
func (p *FixedBlock) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	n, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("policy fixed-block: free of %#x: not a live block", addr)
	}
	delete(p.live, addr)
	if n > 0 {
		if err := p.dev.Free(addr); err != nil {
			return fmt.Errorf("policy fixed-block: %w", err)
		}
		return nil
	}
	p.fs.free(addr, stream)
	return nil
}

// list returns the free list of stream.
func (f *fixedSize) list(stream uint64) *fixedList {
	if !f.perStream {
		stream = 0
	}
	l := f.streams.get(stream)
	if l.id == 0 {
		l.id = len(f.streams.order)
	}
	return l
}

// counted sets l's count of blocks in f.held, after a change.
func (f *fixedSize) counted(l *fixedList) { f.held.set(l.id-1, uint64(l.len())) }

// preallocate puts one chunk from up into the default stream's list.
func (f *fixedSize) preallocate(up func(size, stream uint64) (uint64, error)) error {
	return f.addChunk(f.list(0), 0, up)
}

// addChunk appends the blocks of a new chunk from up to list l.
func (f *fixedSize) addChunk(l *fixedList, stream uint64, up func(size, stream uint64) (uint64, error)) error {
	base, err := up(f.blockSize*f.perChunk, stream)
	if err != nil {
		return err
	}
	for i := range f.perChunk {
		l.push(base + i*f.blockSize)
	}
	f.counted(l)
	f.freeBlocks += f.perChunk
	return nil
}

// malloc returns the address of a free block for stream, taking a new
// chunk from up when no list has one.
func (f *fixedSize) malloc(stream uint64, up func(size, stream uint64) (uint64, error)) (uint64, error) {
	l := f.list(stream)
	a, ok := l.pop()
	if ok {
		f.counted(l)
	} else if f.perStream {
		// The first other stream, in the order streams came, that holds a
		// block (l holds none).
		if i := f.held.first(0, 1); i >= 0 {
			o := f.streams.order[i]
			a, ok = o.pop()
			f.counted(o)
		}
	}
	if !ok {
		if err := f.addChunk(l, stream, up); err != nil {
			return 0, err
		}
		a, _ = l.pop()
		f.counted(l)
	}
	f.freeBlocks--
	return a, nil
}

// free appends block addr to the list of stream.
func (f *fixedSize) free(addr, stream uint64) {
	l := f.list(stream)
	l.push(addr)
	f.counted(l)
	f.freeBlocks++
}

// freeSpace returns the bytes of the free blocks and the block size if
// any is free.
func (f *fixedSize) freeSpace() (total, largest uint64) {
	if f.freeBlocks == 0 {
		return 0, 0
	}
	return f.freeBlocks * f.blockSize, f.blockSize
}
