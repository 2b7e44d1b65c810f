package sim

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/gpualloc/allocsim/internal/ordmap"
	"github.com/gpualloc/allocsim/policies"
)

// ErrInvariant is the error a CheckError wraps: match it with errors.Is.
var ErrInvariant = errors.New("invariant violated")

// checkByDefault reports whether replays run the checker even when their
// Config does not ask: in a test binary (one with the testing package's
// flags) that runs no benchmarks, so that every test replaying a trace
// checks the invariants and benchmarks measure the replay alone. The
// environment variable ALLOCSIM_CHECK=1 or =0 forces it on or off.
func checkByDefault() bool {
	if v := os.Getenv("ALLOCSIM_CHECK"); v != "" {
		return v != "0"
	}
	if flag.Lookup("test.v") == nil {
		return false
	}
	if b := flag.Lookup("test.bench"); b != nil && b.Value.String() != "" {
		return false
	}
	return true
}

// CheckError is a violation of the placement invariants found by a Checker:
// what went wrong, at which event, and the blocks involved.
type CheckError struct {
	// Event is the index of the trace event during which the violation
	// was found.
	Event int64
	// Msg says what went wrong, naming both blocks.
	Msg string
	// Block is the block at fault (the one just handed out, or the
	// segment just freed, as a Block); Other is the live block it collides
	// with, zero when there is none.
	Block, Other policies.Block
}

func (e *CheckError) Error() string {
	return fmt.Sprintf("event %d: %v: %s", e.Event, ErrInvariant, e.Msg)
}

// Unwrap returns ErrInvariant.
func (e *CheckError) Unwrap() error { return ErrInvariant }

// Checker checks a policy's placements against the device it runs on,
// after each malloc and free of a replay:
//   - no two live blocks overlap (but a block that extends a live one in
//     place, policies.Aliaser, and that one), and a block is never handed out while it
//     is live (a freed block handed out twice shows as this);
//   - every live block lies inside a live device segment, from the malloc
//     that hands it out to its free (a segment freed to the device with a
//     live block inside is a violation);
//   - a block holds at least the requested bytes;
//   - the device's reserved bytes equal the sum of the live segments the
//     policy allocated and has not freed;
//   - for a policy that reports its free space (policies.FreeSpacer), the
//     largest free block is no larger than the free bytes, and live block
//     bytes plus free bytes fit in the reserved bytes.
//
// Blocks of 0 bytes (a malloc of 0 bytes) are not tracked. The Checker sees
// the device calls through the Device it wraps (see Wrap); the first
// violation is kept and returned by the next call of Malloc, Free or Step.
type Checker struct {
	dev    *Device
	policy policies.Policy

	event    int64
	blocks   ordmap.Map[liveBlock] // live blocks by address
	segments ordmap.Map[uint64]    // live segments: address -> size in bytes
	reserved uint64                // bytes in segments
	live     uint64                // bytes in live blocks
	mapped   map[uint64]bool       // segments that are runs of mapped pages (check_map.go)
	// aliased are the live blocks that a later block extends in place
	// (policies.Aliaser), by address: out of blocks, so that the block
	// extending one may overlap it, and out of live, so that their bytes
	// count once.
	aliased map[uint64]liveBlock
	err     *CheckError
}

// liveBlock is a block handed out and not yet freed.
type liveBlock struct {
	size  uint64
	event int64 // the event of the malloc that handed it out
}

// NewChecker returns a Checker of the placements of a policy on dev. Give
// the policy the device returned by Wrap, so that the Checker sees the
// segments, and then the policy itself with SetPolicy.
func NewChecker(dev *Device) *Checker {
	return &Checker{dev: dev, blocks: ordmap.New[liveBlock](), segments: ordmap.New[uint64]()}
}

// Wrap returns a Device for the policy: the checker's device, whose
// allocations and frees the Checker records. It has every method of
// *Device, so a policy's type assertions see the same abilities.
func (c *Checker) Wrap() policies.Device { return &checkedDevice{Device: c.dev, c: c} }

// SetPolicy names the policy whose free space Step checks, when it is a
// policies.FreeSpacer.
func (c *Checker) SetPolicy(p policies.Policy) { c.policy = p }

// Begin starts the checks of event i.
func (c *Checker) Begin(i int64) { c.event = i }

// Malloc checks block b, just handed out for a malloc of size bytes, and
// records it as live. It returns the first violation found so far.
func (c *Checker) Malloc(b policies.Block, size uint64) error {
	if c.err != nil {
		return c.err
	}
	if b.Size == 0 {
		if size > 0 {
			c.fail(b, policies.Block{}, "malloc of %d bytes got the empty block %s", size, fmtBlock(b))
		}
		return c.errOrNil()
	}
	switch {
	case b.Size < size:
		c.fail(b, policies.Block{}, "malloc of %d bytes got block %s of %d bytes", size, fmtBlock(b), b.Size)
	case b.Addr+b.Size < b.Addr:
		c.fail(b, policies.Block{}, "block %s wraps around the address space", fmtBlock(b))
	}
	if c.err != nil {
		return c.err
	}
	if al, ok := c.policy.(policies.Aliaser); ok {
		if old, ok := al.Aliases(b); ok {
			lb, live := c.blocks.Get(old.Addr)
			if !live || lb.size != old.Size || old.Addr < b.Addr || old.Addr+old.Size > b.Addr+b.Size {
				c.fail(b, old, "block %s said to extend block %s in place, which is not a live block inside it", fmtBlock(b), fmtBlock(old))
				return c.err
			}
			c.blocks.Delete(old.Addr)
			if c.aliased == nil {
				c.aliased = map[uint64]liveBlock{}
			}
			c.aliased[old.Addr] = lb
			c.live -= old.Size
		}
	}
	if a, lb, ok := c.blocks.Floor(b.Addr); ok && a+lb.size > b.Addr {
		o := policies.Block{Addr: a, Size: lb.size}
		if a == b.Addr {
			c.fail(b, o, "block %s handed out twice: block %s at the same address is live since event %d", fmtBlock(b), fmtBlock(o), lb.event)
		} else {
			c.fail(b, o, "block %s overlaps block %s, live since event %d", fmtBlock(b), fmtBlock(o), lb.event)
		}
		return c.err
	}
	if a, lb, ok := c.blocks.Ceil(b.Addr); ok && a < b.Addr+b.Size {
		o := policies.Block{Addr: a, Size: lb.size}
		c.fail(b, o, "block %s overlaps block %s, live since event %d", fmtBlock(b), fmtBlock(o), lb.event)
		return c.err
	}
	s, n, ok := c.segments.Floor(b.Addr)
	if !ok || b.Addr+b.Size > s+n {
		seg := policies.Block{Addr: s, Size: n}
		if !ok || b.Addr >= s+n {
			c.fail(b, policies.Block{}, "block %s is not inside a live device segment", fmtBlock(b))
		} else {
			c.fail(b, seg, "block %s runs past the end of its device segment %s", fmtBlock(b), fmtBlock(seg))
		}
		return c.err
	}
	c.blocks.Put(b.Addr, liveBlock{size: b.Size, event: c.event})
	c.live += b.Size
	return nil
}

// Free records that block b is being freed: call it before the policy's
// Free, so that a segment the policy frees with it is no longer in use. It
// returns the first violation found so far.
func (c *Checker) Free(b policies.Block) error {
	if c.err != nil {
		return c.err
	}
	if b.Size == 0 {
		return nil
	}
	if lb, ok := c.aliased[b.Addr]; ok && lb.size == b.Size {
		delete(c.aliased, b.Addr) // its bytes left live when it was extended
		return nil
	}
	lb, ok := c.blocks.Get(b.Addr)
	if !ok || lb.size != b.Size {
		// The engine frees only blocks it was handed: the checker lost
		// track, which is a bug of the checker or the engine.
		c.fail(b, policies.Block{}, "free of block %s, which the checker does not hold live", fmtBlock(b))
		return c.err
	}
	c.blocks.Delete(b.Addr)
	c.live -= b.Size
	return nil
}

// Step ends the checks of the current event: the reserved bytes and the
// policy's free space. It returns the first violation found so far.
func (c *Checker) Step() error {
	if c.err != nil {
		return c.err
	}
	if got := c.dev.Reserved(); got != c.reserved {
		c.fail(policies.Block{}, policies.Block{}, "device reserved bytes %d != %d, the sum of the %d live segments", got, c.reserved, c.segments.Len())
		return c.err
	}
	if fs, ok := c.policy.(policies.FreeSpacer); ok {
		total, largest := fs.FreeSpace()
		switch {
		case largest > total:
			c.fail(policies.Block{}, policies.Block{}, "largest free block of %d bytes > %d free bytes", largest, total)
		case total > c.reserved || c.live > c.reserved-total:
			c.fail(policies.Block{}, policies.Block{}, "%d bytes in live blocks + %d free bytes > %d reserved bytes", c.live, total, c.reserved)
		}
	}
	return c.errOrNil()
}

func (c *Checker) errOrNil() error {
	if c.err != nil {
		return c.err
	}
	return nil
}

func (c *Checker) fail(b, o policies.Block, format string, args ...any) {
	if c.err == nil {
		c.err = &CheckError{Event: c.event, Msg: fmt.Sprintf(format, args...), Block: b, Other: o}
	}
}

// segmentAlloc records a segment allocated on the device.
func (c *Checker) segmentAlloc(addr, size uint64) {
	seg := policies.Block{Addr: addr, Size: size}
	if s, n, ok := c.segments.Floor(addr); ok && s+n > addr {
		c.fail(seg, policies.Block{Addr: s, Size: n}, "device segment %s overlaps live segment %s", fmtBlock(seg), fmtBlock(policies.Block{Addr: s, Size: n}))
	}
	if s, n, ok := c.segments.Ceil(addr); ok && s < addr+size {
		c.fail(seg, policies.Block{Addr: s, Size: n}, "device segment %s overlaps live segment %s", fmtBlock(seg), fmtBlock(policies.Block{Addr: s, Size: n}))
	}
	c.segments.Put(addr, size)
	c.reserved += size
}

// segmentFree records a segment freed on the device: no live block may lie
// in it.
func (c *Checker) segmentFree(addr, size uint64) {
	seg := policies.Block{Addr: addr, Size: size}
	if a, lb, ok := c.blocks.Ceil(addr); ok && a < addr+size {
		o := policies.Block{Addr: a, Size: lb.size}
		c.fail(seg, o, "device segment %s freed while block %s in it is live (since event %d)", fmtBlock(seg), fmtBlock(o), lb.event)
	}
	c.segments.Delete(addr)
	c.reserved -= size
}

// checkedDevice is the Device a checked policy runs on: the simulated
// device, with its segment calls reported to the Checker.
type checkedDevice struct {
	*Device
	c *Checker
}

// Alloc allocates a segment on the device and records it.
func (d *checkedDevice) Alloc(size uint64) (uint64, error) {
	addr, err := d.Device.Alloc(size)
	if err == nil {
		d.c.segmentAlloc(addr, size)
	}
	return addr, err
}

// Free frees a segment on the device and records it.
func (d *checkedDevice) Free(addr uint64) error {
	size, ok := d.Device.Segment(addr)
	if err := d.Device.Free(addr); err != nil {
		return err
	}
	if ok {
		d.c.segmentFree(addr, size)
	}
	return nil
}

// fmtBlock formats a block as its half-open address range and size.
func fmtBlock(b policies.Block) string {
	return fmt.Sprintf("[%#x, %#x) (%d bytes)", b.Addr, b.Addr+b.Size, b.Size)
}
