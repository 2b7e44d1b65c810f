package policies

import "fmt"

// RMMBinning is RAPIDS RMM's binning_memory_resource in front of a
// pool_memory_resource, as RMM's replay benchmark builds it
// (cpp/benchmarks/replay/replay.cpp, make_binning): rapidsai/rmm
// include/rmm/mr/device/binning_memory_resource.hpp (now cpp/src/mr/detail/
// binning_memory_resource_impl.cpp), with a fixed_size_memory_resource per
// bin.
//
// Bins hold blocks of the powers of two from 2^min_size_exponent to
// 2^max_size_exponent bytes (256 KiB to 4 MiB by default). A request goes
// to the smallest bin whose block size is at least the requested bytes and
// gets a whole block; a request larger than the largest bin goes to the
// pool (see RMMPool, here with initial pool size 0, as in the benchmark).
// Each bin is RMM's fixed_size_memory_resource (see FixedBlock with its RMM
// settings): per-stream first in, first out lists of blocks, refilled by
// chunks of blocks_per_chunk blocks allocated from the pool on the
// allocating stream, and one chunk allocated when the policy is built: so
// the pool holds 992 MiB (chunks of 32, 64, 128, 256 and 512 MiB, in that
// order, which the pool's growth rule turns into device allocations of the
// same sizes) before the first malloc. Bins never give chunks back, and the
// pool never gives memory back to the device. A malloc of 0 bytes returns
// the block {0, 0}, whose free does nothing.
//
// Settings (defaults in brackets):
//   - min_size_exponent [18], max_size_exponent [22]: the bins' block sizes
//     are 2^k bytes for k from the first to the second (rounded up to
//     256 B), 0 <= min <= max <= 40.
//   - blocks_per_chunk [128]: blocks in a bin's chunk, from 1 to 2^20.
//   - initial_pool_size [0], maximum_pool_size [none]: the pool's, as for
//     rmm-pool.
type RMMBinning struct {
	pool *RMMPool
	bins []*rmmBin          // by ascending block size
	live map[uint64]*rmmBin // live blocks: their bin, nil for the pool's
	up   func(size, stream uint64) (uint64, error)
}

// rmmBin is a bin: a fixed-size resource over the pool.
type rmmBin struct{ fs fixedSize }

var (
	_ Policy     = (*RMMBinning)(nil)
	_ FreeSpacer = (*RMMBinning)(nil)
	_ Counter    = (*RMMBinning)(nil)
)

func init() {
	register(Info{
		Name:   "rmm-binning",
		Design: "RAPIDS RMM's binning_memory_resource over a pool_memory_resource, as its replay benchmark builds it (binning_memory_resource_impl.cpp)",
		Settings: append([]Setting{
			{Key: "min_size_exponent", Default: "18", Doc: "the smallest bin's blocks are 2^min_size_exponent bytes (rounded up to 256 B)"},
			{Key: "max_size_exponent", Default: "22", Doc: "the largest bin's blocks are 2^max_size_exponent bytes; min <= max <= 40"},
			{Key: "blocks_per_chunk", Default: "128", Doc: "blocks in a bin's chunk, from 1 to 2^20"},
		}, rmmPoolSettings...),
	}, func(dev Device, s Settings) (Policy, error) { return NewRMMBinning(dev, s) })
}

// NewRMMBinning returns an rmm-binning policy on dev, with each bin's
// first chunk allocated. It returns an error naming the key for an unknown
// or malformed setting, and an error wrapping ErrOutOfMemory when the
// device refuses the initial chunks.
func NewRMMBinning(dev Device, s Settings) (*RMMBinning, error) {
	const name = "rmm-binning"
	if err := s.Check(name, "min_size_exponent", "max_size_exponent", "blocks_per_chunk",
		"initial_pool_size", "maximum_pool_size"); err != nil {
		return nil, err
	}
	lo, err := s.Uint(name, "min_size_exponent", 18)
	if err != nil {
		return nil, err
	}
	hi, err := s.Uint(name, "max_size_exponent", 22)
	if err != nil {
		return nil, err
	}
	if hi > 40 {
		return nil, invalidSettingf(name, s, "max_size_exponent", "must be at most 40")
	}
	if lo > hi {
		if _, ok := s["min_size_exponent"]; ok {
			return nil, invalidSettingf(name, s, "min_size_exponent", "must be at most max_size_exponent (%d)", hi)
		}
		return nil, invalidSettingf(name, s, "max_size_exponent", "must be at least min_size_exponent (%d)", lo)
	}
	per, err := s.Uint(name, "blocks_per_chunk", 128)
	if err != nil {
		return nil, err
	}
	if per == 0 || per > maxBlocksPerChunk {
		return nil, invalidSettingf(name, s, "blocks_per_chunk", "must be from 1 to %d", maxBlocksPerChunk)
	}
	pool, err := newRMMPool(name, dev, s)
	if err != nil {
		return nil, err
	}
	p := &RMMBinning{pool: pool, live: map[uint64]*rmmBin{}}
	p.up = func(size, stream uint64) (uint64, error) {
		b, err := p.pool.Malloc(size, stream)
		return b.Addr, err
	}
	for k := lo; k <= hi; k++ {
		bs := ceilToMultiple(1<<k, rmmAlignment)
		if n := len(p.bins); n > 0 && p.bins[n-1].fs.blockSize == bs {
			continue // RMM adds a bin of a given size once
		}
		bin := &rmmBin{fs: fixedSize{blockSize: bs, perChunk: per, perStream: true}}
		if err := bin.fs.preallocate(p.up); err != nil {
			return nil, fmt.Errorf("policy %s: the first chunk of the %d-byte bin: %w", name, bs, err)
		}
		p.bins = append(p.bins, bin)
	}
	return p, nil
}

// Name returns "rmm-binning".
func (p *RMMBinning) Name() string { return "rmm-binning" }

// Retries returns the pool's retries.
func (p *RMMBinning) Retries() int64 { return p.pool.Retries() }

// FreeSpace returns the free bytes of the bins and the pool, and the size
// in bytes of the largest free block of either.
func (p *RMMBinning) FreeSpace() (total, largest uint64) {
	total, largest = p.pool.FreeSpace()
	for _, b := range p.bins {
		t, l := b.fs.freeSpace()
		total += t
		largest = max(largest, l)
	}
	return total, largest
}

// Malloc gives size bytes a block of the smallest bin that holds them, or
// a block of the pool when no bin does. It returns an error wrapping
// ErrOutOfMemory when the pool cannot grow.
func (p *RMMBinning) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	var bin *rmmBin
	for _, b := range p.bins {
		if b.fs.blockSize >= size {
			bin = b
			break
		}
	}
	if bin == nil {
		b, err := p.pool.Malloc(size, stream)
		if err == nil && b.Addr != 0 {
			p.live[b.Addr] = nil
		}
		return b, err
	}
	addr, err := bin.fs.malloc(stream, p.up)
	if err != nil {
		return Block{}, fmt.Errorf("policy rmm-binning: malloc of %d bytes: chunk of the %d-byte bin: %w", size, bin.fs.blockSize, err)
	}
	p.live[addr] = bin
	return Block{Addr: addr, Size: bin.fs.blockSize}, nil
}

// Free returns the block at addr to its bin's list of stream, or to the
// pool. It returns an error if addr is not a live block.
func (p *RMMBinning) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	bin, ok := p.live[addr]
	if !ok {
		return fmt.Errorf("policy rmm-binning: free of %#x: not a live block", addr)
	}
	delete(p.live, addr)
	if bin == nil {
		return p.pool.Free(addr, stream)
	}
	bin.fs.free(addr, stream)
	return nil
}
