// Package sim replays traces against allocator policies on a simulated
// device and measures memory use, fragmentation and device calls.
package sim

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// segmentAlign is the alignment in bytes of the addresses the simulated
// device hands out, as cudaMalloc aligns large allocations to 2 MiB.
const segmentAlign = 2 << 20

// baseAddr is the first address the simulated device hands out.
const baseAddr = 0x7f0000000000

// Device is a simulated GPU: a capacity in bytes (0 = unlimited) and a
// never-reused address space of 2 MiB-aligned segments, counting its device
// allocations and frees as cudaMalloc and cudaFree calls.
type Device struct {
	capacity   uint64
	card       bool   // the capacity holds the footprint (HoldFootprint)
	cardMemory uint64 // the total memory of the card it stands for, 0 if unknown
	reserved   uint64
	peak       uint64
	allocs     int64
	frees      int64
	overflows  int64 // allocations refused for policies.ErrOverflow
	next       uint64
	directNext uint64                // offset of the next direct allocation from directBase
	live       trace.AddrMap[uint64] // address -> size in bytes
	cost       *costMeter            // charges the calls to a cost model (cost.go)
	rec        *recording            // reserved ranges, recorded addresses, call log (device_map.go)
	// changes counts the calls that may have changed the reserved bytes,
	// the footprint or the overflows: a replay observes them again only
	// after one.
	changes uint64
	now     int64 // the trace time (ns) of the event being replayed (SetTime)
}

var (
	_ policies.Device    = (*Device)(nil)
	_ policies.Capacitor = (*Device)(nil)
)

// NewDevice returns a device of capacity bytes; 0 means unlimited.
func NewDevice(capacity uint64) *Device {
	return &Device{capacity: capacity, next: baseAddr, cost: newCostMeter(defaultCostModel())}
}

// HoldFootprint makes the capacity a card's memory less its context: the
// device refuses an allocation or a map that would take its footprint (the
// driver's pages, Footprint) past the capacity, as the card does, rather
// than one that would take the reserved bytes past it. Without a cost model
// no footprint is kept, and the reserved bytes are held.
func (d *Device) HoldFootprint() { d.card = true }

// refuse returns an error wrapping policies.ErrOutOfMemory when a device
// allocation (what says which) of size bytes more would pass the capacity:
// the footprint's for a card (HoldFootprint), else the reserved bytes'.
func (d *Device) refuse(what string, size uint64) error {
	if d.capacity == 0 {
		return nil
	}
	if d.card && d.cost != nil {
		if f := d.cost.footprintWith(size); f > d.capacity {
			return fmt.Errorf("%s of %d bytes would take the card's footprint to %d of %d: %w", what, size, f, d.capacity, policies.ErrOutOfMemory)
		}
		return nil
	}
	if size > d.capacity || d.reserved > d.capacity-size {
		return fmt.Errorf("%s of %d bytes with %d of %d reserved: %w", what, size, d.reserved, d.capacity, policies.ErrOutOfMemory)
	}
	return nil
}

// Alloc allocates a segment of size bytes. It returns an error wrapping
// policies.ErrOutOfMemory when reserved + size would exceed the capacity,
// like cudaMalloc under a per-process memory fraction, or for a card
// (HoldFootprint) when the footprint would. A refused call is not counted
// as a device allocation.
func (d *Device) Alloc(size uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("device alloc of 0 bytes")
	}
	if err := d.refuse("device alloc", size); err != nil {
		return 0, err
	}
	if d.reserved > math.MaxUint64-size {
		d.overflowed()
		return 0, fmt.Errorf("device alloc of %d bytes with %d reserved: %w: %w", size, d.reserved, policies.ErrOverflow, policies.ErrOutOfMemory)
	}
	addr, err := d.place(size)
	if err != nil {
		d.overflowed()
		return 0, err
	}
	d.live.Put(addr, size)
	d.reserved += size
	if d.reserved > d.peak {
		d.peak = d.reserved
	}
	d.allocs++
	d.changes++
	d.meter().alloc(addr, size)
	d.called(trace.OpSegmentAlloc, addr, size)
	return addr, nil
}

// overflowed counts an allocation refused for policies.ErrOverflow.
func (d *Device) overflowed() {
	d.overflows++
	d.changes++
}

// directBase is the first address of the direct allocations
// (DirectAlloc), apart from the policies' segments.
const directBase = 0x7e0000000000

// DirectAlloc places a device allocation of size bytes that a CUDA library
// made straight from the driver, around the policy (trace.DirectSite): its
// pages count in the footprint, but not in the reserved bytes, the device
// calls or the allocator time. On a card (HoldFootprint) it returns an error
// wrapping policies.ErrOutOfMemory when the footprint would pass the
// capacity, as the card refuses it; a per-process cap (the reserved bytes)
// does not hold it, as a framework's memory fraction does not.
func (d *Device) DirectAlloc(size uint64) (uint64, error) {
	if d.card && d.cost != nil && d.capacity > 0 {
		if f := d.cost.footprintWith(size); f > d.capacity {
			return 0, fmt.Errorf("direct device alloc of %d bytes would take the card's footprint to %d of %d: %w", size, f, d.capacity, policies.ErrOutOfMemory)
		}
	}
	n, ok := alignSegmentChecked(max(size, 1))
	end, carry := bits.Add64(d.directNext, n, 0)
	if !ok || carry != 0 || end > math.MaxUint64-directBase {
		d.overflowed()
		return 0, fmt.Errorf("direct device alloc of %d bytes: past the end of the 64-bit address space: %w: %w", size, policies.ErrOverflow, policies.ErrOutOfMemory)
	}
	addr := directBase + d.directNext
	d.directNext = end
	d.changes++
	if d.cost != nil {
		d.cost.untimed = true
		d.cost.alloc(addr, size)
		d.cost.untimed = false
	}
	return addr, nil
}

// DirectFree frees the direct allocation of size bytes at addr
// (DirectAlloc).
func (d *Device) DirectFree(addr, size uint64) {
	d.changes++
	if d.cost != nil {
		d.cost.untimed = true
		d.cost.free(addr, size)
		d.cost.untimed = false
	}
}

// Free releases the segment at addr. It returns an error if addr is not a
// live segment.
func (d *Device) Free(addr uint64) error {
	size, ok := d.live.Take(addr)
	if !ok {
		return fmt.Errorf("device free of %#x: not a live segment", addr)
	}
	d.reserved -= size
	d.frees++
	d.changes++
	d.meter().free(addr, size)
	d.called(trace.OpSegmentFree, addr, size)
	return nil
}

// SetCardMemory says the device stands for a card of total bytes of memory
// (policies.CardMemorier).
func (d *Device) SetCardMemory(total uint64) { d.cardMemory = total }

// CardMemory returns the total memory in bytes of the card the device
// stands for, 0 if unknown.
func (d *Device) CardMemory() uint64 { return d.cardMemory }

// Capacity returns the capacity in bytes, 0 if unlimited.
func (d *Device) Capacity() uint64 { return d.capacity }

// Reserved returns the bytes in live segments.
func (d *Device) Reserved() uint64 { return d.reserved }

// PeakReserved returns the largest value Reserved has had.
func (d *Device) PeakReserved() uint64 { return d.peak }

// Overflows returns the number of allocations (and reserves) refused
// because their bytes would pass 2^64: the address space, or the reserved
// bytes (policies.ErrOverflow). A policy that tries again after such a
// refusal may return an OOM that does not wrap it.
func (d *Device) Overflows() int64 { return d.overflows }

// Allocs returns the number of successful device allocations.
func (d *Device) Allocs() int64 { return d.allocs }

// Frees returns the number of device frees.
func (d *Device) Frees() int64 { return d.frees }

// Segment returns the size in bytes of the live segment at addr, and false
// if there is none there.
func (d *Device) Segment(addr uint64) (size uint64, ok bool) { return d.live.Get(addr) }

// Segments returns the live segments' sizes in bytes by address, in a new
// map that the caller owns: for tests and reports, not for a call per event
// (see Segment).
func (d *Device) Segments() map[uint64]uint64 {
	out := make(map[uint64]uint64, d.live.Len())
	for a, n := range d.live.All() {
		out[a] = n
	}
	return out
}
