package sim

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/trace"
)

// This file holds what a Device does beyond cudaMalloc and cudaFree:
// address ranges with pages mapped on demand (policies.Mapper, for
// expandable segments), following a recording's addresses, and a log of
// its calls.

var _ policies.Mapper = (*Device)(nil)

// followBase is the first address a device following a recording hands
// out of its own, once it no longer agrees with the recording: above every
// address a real process sees (user space ends at 2^47), so that its own
// segments never overlap recorded ones.
const followBase = 1 << 48

// DeviceCall is a device call the simulated device made (or a recording
// says the source made): Op is trace.OpSegmentAlloc (cudaMalloc),
// OpSegmentFree (cudaFree), OpSegmentMap or OpSegmentUnmap (pages of an
// expandable segment); Addr and Size are the segment's or the pages'.
type DeviceCall struct {
	Op   trace.Op
	Addr uint64
	Size uint64
}

func (c DeviceCall) String() string {
	return fmt.Sprintf("%s of %d bytes at %#x", c.Op, c.Size, c.Addr)
}

// recording is the part of a Device that plain segments do not need; nil
// until used.
type recording struct {
	ranges map[uint64]*addrRange // reserved ranges by start

	follow   bool
	hints    []DeviceCall // recorded allocations and maps not yet taken
	head     int
	diverged bool
	own      uint64 // next own address while following

	onCall func(DeviceCall)
}

// addrRange is a reserved address range and how many of its bytes are
// mapped.
type addrRange struct {
	size, mapped uint64
}

func (d *Device) rc() *recording {
	if d.rec == nil {
		d.rec = &recording{ranges: map[uint64]*addrRange{}, own: followBase}
	}
	return d.rec
}

// FollowRecording makes d replay a recording's placement: the segments it
// allocates, and the ranges it reserves, are at the addresses of the
// recorded device calls given to Observe, in order, as long as they agree
// (same call, same size, a place that is free); from the first
// disagreement on, d hands out addresses of its own above those of any
// recording. Best fit among equal free blocks goes to the lowest address,
// so a replay that must match the source block for block needs segments
// where the source had them.
func (d *Device) FollowRecording() { d.rc().follow = true }

// Observe tells d of a device call the recording shows the source made:
// an event with Op trace.OpSegmentAlloc or OpSegmentMap (others are
// ignored). Only a device following a recording keeps them.
func (d *Device) Observe(ev trace.Event) {
	r := d.rec
	if r == nil || !r.follow || r.diverged {
		return
	}
	if ev.Op != trace.OpSegmentAlloc && ev.Op != trace.OpSegmentMap {
		return
	}
	if r.head > 64 && r.head*2 > len(r.hints) {
		r.hints = append(r.hints[:0], r.hints[r.head:]...)
		r.head = 0
	}
	r.hints = append(r.hints, DeviceCall{ev.Op, ev.Addr, ev.Size})
}

// Diverged reports whether d, following a recording, found a call that
// disagrees with it, and so places on its own.
func (d *Device) Diverged() bool { return d.rec != nil && d.rec.diverged }

// OnCall makes d call f after each of its successful calls (segment
// allocations and frees, maps and unmaps); nil stops it.
func (d *Device) OnCall(f func(DeviceCall)) { d.rc().onCall = f }

func (d *Device) called(op trace.Op, addr, size uint64) {
	if d.rec != nil && d.rec.onCall != nil {
		d.rec.onCall(DeviceCall{op, addr, size})
	}
}

// place returns the address of a new segment (or range, with op
// trace.OpSegmentMap) of size bytes.
func (d *Device) place(size uint64) (uint64, error) {
	if r := d.rec; r != nil && r.follow {
		if addr, ok := d.recorded(trace.OpSegmentAlloc, size); ok {
			r.head++
			return addr, nil
		}
		return bump(&r.own, size, "device alloc")
	}
	return bump(&d.next, size, "device alloc")
}

// bump returns *next and moves it past a segment of size bytes (2 MiB
// aligned), or returns an error wrapping policies.ErrOutOfMemory and
// policies.ErrOverflow when the segment would end past 2^64, the end of
// the address space (what says which call).
func bump(next *uint64, size uint64, what string) (uint64, error) {
	n, ok := alignSegmentChecked(size)
	end, carry := bits.Add64(*next, n, 0)
	if !ok || carry != 0 {
		return 0, fmt.Errorf("%s of %d bytes at %#x: past the end of the 64-bit address space: %w: %w", what, size, *next, policies.ErrOverflow, policies.ErrOutOfMemory)
	}
	addr := *next
	*next = end
	return addr, nil
}

// alignSegmentChecked is alignSegment, and false when the result does not
// fit in 64 bits.
func alignSegmentChecked(size uint64) (uint64, bool) {
	if size > math.MaxUint64-(segmentAlign-1) {
		return 0, false
	}
	return alignSegment(size), true
}

// recorded returns the address of the next recorded call if it is op of
// size bytes (any size for a map, whose range d reserves) at a free place;
// else d no longer follows the recording.
func (d *Device) recorded(op trace.Op, size uint64) (uint64, bool) {
	r := d.rec
	if r.diverged {
		return 0, false
	}
	if r.head < len(r.hints) {
		h := r.hints[r.head]
		if h.Op == op && (op == trace.OpSegmentMap || h.Size == size) && !d.overlaps(h.Addr, size) {
			return h.Addr, true
		}
	}
	r.diverged = true
	return 0, false
}

// overlaps reports whether [addr, addr+size) runs past the end of the
// address space or meets a live segment or reserved range.
func (d *Device) overlaps(addr, size uint64) bool {
	if size > ^addr {
		return true // past the end of the address space: no free place
	}
	meets := func(a, n uint64) bool { return addr < a+n && a < addr+size }
	for a, n := range d.live.All() {
		if meets(a, n) {
			return true
		}
	}
	if d.rec != nil {
		for a, rg := range d.rec.ranges {
			if meets(a, rg.size) {
				return true
			}
		}
	}
	return false
}

func alignSegment(size uint64) uint64 {
	return (size + segmentAlign - 1) / segmentAlign * segmentAlign
}

// Reserve reserves size bytes of address space, backed by nothing
// (cuMemAddressReserve), and returns its start: where the next recorded
// map is, when d follows a recording and that place is free. It is not a
// device allocation.
func (d *Device) Reserve(size uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("device reserve of 0 bytes")
	}
	r := d.rc()
	var addr uint64
	if r.follow {
		var ok bool
		if addr, ok = d.recorded(trace.OpSegmentMap, size); !ok {
			var err error
			if addr, err = bump(&r.own, size, "device reserve"); err != nil {
				d.overflowed()
				return 0, err
			}
		}
	} else {
		var err error
		if addr, err = bump(&d.next, size, "device reserve"); err != nil {
			d.overflowed()
			return 0, err
		}
	}
	r.ranges[addr] = &addrRange{size: size}
	return addr, nil
}

// rangeOf returns the reserved range holding [addr, addr+size), or nil.
func (d *Device) rangeOf(addr, size uint64) *addrRange {
	if d.rec == nil {
		return nil
	}
	for a, rg := range d.rec.ranges {
		if a <= addr && addr+size <= a+rg.size {
			return rg
		}
	}
	return nil
}

// Map backs [addr, addr+size) of a reserved range with memory: one device
// allocation, however many pages. It is held to a card's capacity
// (HoldFootprint: an error wrapping policies.ErrOutOfMemory, as
// cuMemCreate's), not to a reserved-bytes capacity: PyTorch checks its
// memory fraction before it maps (against the size of the segment it would
// have allocated), then maps whole pages that may pass it. It returns an
// error for a range not reserved or mapped over.
func (d *Device) Map(addr, size uint64) error {
	rg := d.rangeOf(addr, size)
	if rg == nil || size == 0 {
		return fmt.Errorf("device map of %d bytes at %#x: not inside a reserved range", size, addr)
	}
	if rg.mapped+size > rg.size {
		return fmt.Errorf("device map of %d bytes at %#x: the range has %d of %d bytes mapped already", size, addr, rg.mapped, rg.size)
	}
	if d.card {
		if err := d.refuse("device map", size); err != nil {
			return err
		}
	}
	if r := d.rec; r.follow && !r.diverged {
		if r.head < len(r.hints) && r.hints[r.head] == (DeviceCall{trace.OpSegmentMap, addr, size}) {
			r.head++
		} else {
			r.diverged = true
		}
	}
	rg.mapped += size
	d.reserved += size
	d.peak = max(d.peak, d.reserved)
	d.allocs++
	d.changes++
	// No latency of cuMemCreate + cuMemMap was measured: a map is charged
	// as a cudaMalloc of its size, an unmap as a cudaFree.
	d.meter().alloc(addr, size)
	d.called(trace.OpSegmentMap, addr, size)
	return nil
}

// Unmap gives back the memory of [addr, addr+size) of a reserved range:
// one device free.
func (d *Device) Unmap(addr, size uint64) error {
	rg := d.rangeOf(addr, size)
	if rg == nil || size > rg.mapped {
		return fmt.Errorf("device unmap of %d bytes at %#x: not mapped", size, addr)
	}
	rg.mapped -= size
	d.reserved -= size
	d.frees++
	d.changes++
	d.meter().free(addr, size)
	d.called(trace.OpSegmentUnmap, addr, size)
	return nil
}

// Release gives back the reserved range at addr (cuMemAddressFree), which
// must have nothing mapped.
func (d *Device) Release(addr uint64) error {
	var rg *addrRange
	if d.rec != nil {
		rg = d.rec.ranges[addr]
	}
	if rg == nil {
		return fmt.Errorf("device release of %#x: not a reserved range", addr)
	}
	if rg.mapped > 0 {
		return fmt.Errorf("device release of %#x: %d bytes still mapped", addr, rg.mapped)
	}
	delete(d.rec.ranges, addr)
	return nil
}
