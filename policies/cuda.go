package policies

import "fmt"

// CUDA is no caching at all: every malloc is a device allocation and every
// free a device free, as a program calling cudaMalloc and cudaFree directly
// (the "cuda" resource of RMM's replay benchmark).
//
// The bytes cudaMalloc really sets aside are not observable; the driver
// sub-allocates small requests in 512 B steps inside 2 MiB pages (measured
// on an H200, see shared/reference/CUDA_MEASURED.md). So the policy asks the
// device for the requested size rounded up to the granularity, 512 B by
// default, and that rounded size is the block's size. A malloc of 0 bytes
// returns the block {0, 0} without a device call, and a free of address 0
// does nothing, as cudaMalloc(0) returns NULL and cudaFree(NULL) succeeds.
// Streams are ignored.
//
// Settings (defaults in brackets):
//   - granularity [512]: requests are rounded up to a multiple of it
//     (bytes, at least 1).
type CUDA struct {
	dev         Device
	granularity uint64
}

var (
	_ Policy     = (*CUDA)(nil)
	_ FreeSpacer = (*CUDA)(nil)
)

func init() {
	register(Info{
		Name:   "cuda",
		Design: "no caching: every malloc is a cudaMalloc, every free a cudaFree",
		Settings: []Setting{
			{Key: "granularity", Default: "512", Doc: "requests are rounded up to a multiple of it, in bytes, from 1 B to 2 MiB"},
		},
	}, func(dev Device, s Settings) (Policy, error) { return NewCUDA(dev, s) })
}

// NewCUDA returns a cuda policy on dev. It returns an error naming the key
// for an unknown or malformed setting.
func NewCUDA(dev Device, s Settings) (*CUDA, error) {
	if err := s.Check("cuda", "granularity"); err != nil {
		return nil, err
	}
	g, err := s.Bytes("cuda", "granularity", 512)
	if err != nil {
		return nil, err
	}
	if g == 0 || g > deviceGranularity {
		return nil, invalidSettingf("cuda", s, "granularity", "must be from 1 B to 2 MiB")
	}
	return &CUDA{dev: dev, granularity: g}, nil
}

// Name returns "cuda".
func (p *CUDA) Name() string { return "cuda" }

// Malloc allocates size bytes, rounded up to the granularity, from the
// device. It returns the device's error, wrapping ErrOutOfMemory when the
// device refuses.
func (p *CUDA) Malloc(size, stream uint64) (Block, error) {
	if size == 0 {
		return Block{}, nil
	}
	if size > maxRequest {
		return Block{}, errRequestTooLarge("cuda", size)
	}
	n := ceilToMultiple(size, p.granularity)
	addr, err := p.dev.Alloc(n)
	if err != nil {
		return Block{}, fmt.Errorf("policy cuda: malloc of %d bytes: %w", size, err)
	}
	return Block{Addr: addr, Size: n}, nil
}

// Free returns the block at addr to the device. It returns the device's
// error for an address that is not a live block.
func (p *CUDA) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	if err := p.dev.Free(addr); err != nil {
		return fmt.Errorf("policy cuda: %w", err)
	}
	return nil
}

// FreeSpace returns 0, 0: the policy keeps no free memory.
func (p *CUDA) FreeSpace() (total, largest uint64) { return 0, 0 }
