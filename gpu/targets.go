package gpu

import (
	"fmt"
	"math"

	"github.com/gpualloc/allocsim/policies"
)

// Direct targets: names `replay gpu --policy` takes besides the registered
// policies.
const (
	// TargetCUDA makes every malloc a cudaMalloc of the requested size and
	// every free a cudaFree.
	TargetCUDA = "cuda"
	// TargetCUDAAsync makes every malloc a cudaMallocAsync and every free
	// a cudaFreeAsync, on the trace's streams.
	TargetCUDAAsync = "cuda-async"
)

// Targets returns the names `replay gpu` accepts: the direct targets and
// every registered policy, sorted, without duplicates.
func Targets() []string {
	out := []string{TargetCUDA, TargetCUDAAsync}
	for _, n := range policies.Names() {
		if n != TargetCUDA && n != TargetCUDAAsync {
			out = append(out, n)
		}
	}
	return out
}

// TargetInfos describes the direct targets as the policy registry
// describes a policy (replay policies lists them): what each calls and its
// settings with their defaults.
func TargetInfos() []policies.Info {
	return []policies.Info{
		{Name: TargetCUDA, Design: "replay gpu only: every malloc a cudaMalloc of the requested size, every free a cudaFree (made in batches in C)"},
		{Name: TargetCUDAAsync, Design: "replay gpu only: cudaMallocAsync and cudaFreeAsync on the trace's streams, from a memory pool", Settings: []policies.Setting{
			{Key: "pool", Default: "own", Doc: "own: a pool created for the replay with its limit as maximum size; default: the device's default pool"},
			{Key: "release_threshold", Default: "0", Doc: "bytes the pool keeps at a synchronize (cudaMemPoolAttrReleaseThreshold); max keeps everything"},
		}},
	}
}

// CheckSettings returns an error naming the key for a setting the direct
// target called name does not take (cuda takes none; cuda-async pool and
// release_threshold), as a replay of it would; nil for other names, whose
// settings are the registered policy's.
func CheckSettings(name string, s policies.Settings) error {
	for _, in := range TargetInfos() {
		if in.Name == name {
			return s.Check(name, in.Keys()...)
		}
	}
	return nil
}

// cudaTarget calls cudaMalloc and cudaFree directly. A malloc of 0 bytes is
// no call, as cudaMalloc(0) returns NULL.
type cudaTarget struct {
	dev policies.Device
}

var _ policies.Policy = (*cudaTarget)(nil)

func newCUDATarget(dev policies.Device, s policies.Settings) (*cudaTarget, error) {
	if err := CheckSettings(TargetCUDA, s); err != nil {
		return nil, err
	}
	return &cudaTarget{dev: dev}, nil
}

func (t *cudaTarget) Name() string { return TargetCUDA }

func (t *cudaTarget) Malloc(size, stream uint64) (policies.Block, error) {
	if size == 0 {
		return policies.Block{}, nil
	}
	addr, err := t.dev.Alloc(size)
	if err != nil {
		return policies.Block{}, err
	}
	return policies.Block{Addr: addr, Size: size}, nil
}

func (t *cudaTarget) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	return t.dev.Free(addr)
}

// asyncTarget is the stream-ordered allocator: cudaMallocAsync and
// cudaFreeAsync on the streams the trace names, from a memory pool.
//
// Settings (defaults in brackets):
//   - pool [own]: "own" allocates from a pool created for the replay
//     (cudaMemPoolCreate, with the replay's limit as its maximum size, and
//     cudaMallocFromPoolAsync), destroyed at the end; "default" from the
//     device's default pool (cudaMallocAsync), whose release threshold is
//     set only when release_threshold is given and put back at the end.
//   - release_threshold [0, the CUDA default]: bytes the pool keeps at a
//     synchronization; "max" for UINT64_MAX (never release).
type asyncTarget struct {
	dev       *Device
	stream    func(uint64) (uint64, error) // trace stream -> CUDA stream
	pool      uint64                       // the pool allocated from
	own       bool                         // pool was created for the replay
	restore   bool                         // put oldThresh back on the default pool
	oldThresh uint64
	limit     uint64
	live      map[uint64]uint64 // pointer -> bytes
	used      uint64
	peakUsed  uint64
}

var (
	_ policies.Policy   = (*asyncTarget)(nil)
	_ policies.Releaser = (*asyncTarget)(nil)
)

func newAsyncTarget(dev *Device, limit uint64, s policies.Settings, stream func(uint64) (uint64, error)) (*asyncTarget, error) {
	if err := CheckSettings(TargetCUDAAsync, s); err != nil {
		return nil, err
	}
	rt := dev.rt
	if !rt.HasAsync() {
		return nil, fmt.Errorf("%s: the CUDA runtime %s has no stream-ordered allocator (cudaMallocAsync needs CUDA 11.2)", TargetCUDAAsync, rt.Path)
	}
	thresh, threshSet := uint64(0), false
	if v, ok := s["release_threshold"]; ok {
		threshSet = true
		if v == "max" {
			thresh = math.MaxUint64
		} else {
			n, err := s.Bytes(TargetCUDAAsync, "release_threshold", 0)
			if err != nil {
				return nil, err
			}
			thresh = n
		}
	}
	t := &asyncTarget{dev: dev, stream: stream, limit: limit, live: map[uint64]uint64{}}
	switch p := s["pool"]; p {
	case "", "own":
		pool, err := rt.MemPoolCreate(limit)
		if err != nil {
			// Runtimes before CUDA 12.2 want the maximum size zero.
			if pool, err = rt.MemPoolCreate(0); err != nil {
				return nil, fmt.Errorf("%s: %w", TargetCUDAAsync, err)
			}
		}
		t.pool, t.own = pool, true
		if err := rt.SetMemPoolAttr(pool, PoolReleaseThreshold, thresh); err != nil {
			t.close()
			return nil, fmt.Errorf("%s: %w", TargetCUDAAsync, err)
		}
	case "default":
		pool, err := rt.DefaultMemPool()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", TargetCUDAAsync, err)
		}
		t.pool = pool
		if threshSet {
			old, err := rt.MemPoolAttr(pool, PoolReleaseThreshold)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", TargetCUDAAsync, err)
			}
			if err := rt.SetMemPoolAttr(pool, PoolReleaseThreshold, thresh); err != nil {
				return nil, fmt.Errorf("%s: %w", TargetCUDAAsync, err)
			}
			t.oldThresh, t.restore = old, true
		}
		// Start the high-water marks from here; they can only be reset
		// to zero.
		rt.SetMemPoolAttr(pool, PoolReservedHigh, 0)
		rt.SetMemPoolAttr(pool, PoolUsedHigh, 0)
	default:
		return nil, fmt.Errorf("policy %s: setting pool=%q: want own or default", TargetCUDAAsync, p)
	}
	dev.LogPool(t.pool)
	return t, nil
}

func (t *asyncTarget) Name() string { return TargetCUDAAsync }

func (t *asyncTarget) Malloc(size, stream uint64) (policies.Block, error) {
	if size == 0 {
		return policies.Block{}, nil
	}
	if size > t.limit || t.used > t.limit-size {
		return policies.Block{}, fmt.Errorf("%s: malloc of %d bytes with %d in use would pass the limit of %d bytes: %w", TargetCUDAAsync, size, t.used, t.limit, policies.ErrOutOfMemory)
	}
	s, err := t.stream(stream)
	if err != nil {
		return policies.Block{}, err
	}
	pool := t.pool
	if !t.own {
		pool = 0 // cudaMallocAsync: the device's current pool, the default one
	}
	ptr, err := t.dev.mallocAsync(size, pool, s)
	if err != nil {
		return policies.Block{}, fmt.Errorf("%s: malloc of %d bytes: %w", TargetCUDAAsync, size, err)
	}
	if !t.own {
		// The default pool has no maximum size: keep its reservation
		// under the limit by hand.
		if r, err := t.dev.rt.MemPoolAttr(t.pool, PoolReservedCurrent); err == nil && r > t.limit {
			t.dev.freeAsync(ptr, size, s)
			t.dev.streamSync(s)
			t.dev.trim(t.pool, 0)
			return policies.Block{}, fmt.Errorf("%s: malloc of %d bytes took the default pool to %d reserved bytes, past the limit of %d: %w", TargetCUDAAsync, size, r, t.limit, policies.ErrOutOfMemory)
		}
	}
	t.live[ptr] = size
	t.used += size
	t.peakUsed = max(t.peakUsed, t.used)
	return policies.Block{Addr: ptr, Size: size}, nil
}

func (t *asyncTarget) Free(addr, stream uint64) error {
	if addr == 0 {
		return nil
	}
	size, ok := t.live[addr]
	if !ok {
		return fmt.Errorf("%s: free of %#x: not a live allocation", TargetCUDAAsync, addr)
	}
	s, err := t.stream(stream)
	if err != nil {
		return err
	}
	if err := t.dev.freeAsync(addr, size, s); err != nil {
		return fmt.Errorf("%s: free of %#x: %w", TargetCUDAAsync, addr, err)
	}
	delete(t.live, addr)
	t.used -= size
	return nil
}

// EmptyCache waits for the device and gives every unused byte of the pool
// back (cudaMemPoolTrimTo 0).
func (t *asyncTarget) EmptyCache() error {
	if err := t.dev.deviceSync(); err != nil {
		return err
	}
	return t.dev.trim(t.pool, 0)
}

// Reserved returns the bytes of live allocations.
func (t *asyncTarget) Reserved() uint64 { return t.used }

// poolStats reads the pool's reserved and used high-water marks.
func (t *asyncTarget) poolStats() (reservedHigh, usedHigh uint64) {
	reservedHigh, _ = t.dev.rt.MemPoolAttr(t.pool, PoolReservedHigh)
	usedHigh, _ = t.dev.rt.MemPoolAttr(t.pool, PoolUsedHigh)
	return reservedHigh, usedHigh
}

// close frees every live allocation, waits for the device, gives the pool's
// memory back and destroys or restores the pool. It returns the first
// error.
func (t *asyncTarget) close() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for ptr, size := range t.live {
		keep(t.dev.freeAsync(ptr, size, 0))
		delete(t.live, ptr)
	}
	t.used = 0
	keep(t.dev.deviceSync())
	if t.pool != 0 {
		keep(t.dev.trim(t.pool, 0))
		t.dev.LogPool(0)
		if t.own {
			keep(t.dev.rt.MemPoolDestroy(t.pool))
		} else if t.restore {
			keep(t.dev.rt.SetMemPoolAttr(t.pool, PoolReleaseThreshold, t.oldThresh))
		}
		t.pool = 0
	}
	return first
}
