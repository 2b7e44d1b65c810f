package gpu

import (
	"bufio"
	"fmt"
	"io"
	"strconv"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
)

// Device is the real GPU behind the policies' device interface: Alloc is a
// cudaMalloc and Free a cudaFree, each timed. It never holds more than its
// limit in bytes: an Alloc that would pass it is refused as an out-of-memory
// without calling the runtime, and a cudaMalloc that fails with
// cudaErrorMemoryAllocation is an out-of-memory too. Latencies of every
// call made through the device are recorded by call and size class.
//
// A Device is not safe for concurrent use.
type Device struct {
	rt       *Runtime
	limit    uint64
	reserved uint64
	peak     uint64
	allocs   int64
	frees    int64
	live     map[uint64]uint64 // pointer -> bytes, cudaMalloc'd segments

	lat     sim.Latencies
	allocNS int64 // device-memory allocation calls
	syncNS  int64 // synchronizations
	calls   int64

	log *bufio.Writer // per-call log, nil for none
	seq *Seq          // cudaMalloc/cudaFree sequence being recorded, nil for none
}

var (
	_ policies.Device    = (*Device)(nil)
	_ policies.Capacitor = (*Device)(nil)
)

// NewDevice returns a device on rt that holds at most limit bytes of
// cudaMalloc'd segments.
func NewDevice(rt *Runtime, limit uint64) *Device {
	return &Device{rt: rt, limit: limit, live: map[uint64]uint64{}}
}

// LogCalls writes one CSV line per runtime call from now on to w
// (call,size,ptr,ns: the size in bytes, the pointer in hex, the call's
// duration in nanoseconds), after a header. Flush writes out what is
// buffered.
func (d *Device) LogCalls(w io.Writer) {
	d.log = bufio.NewWriterSize(w, 1<<20)
	d.log.WriteString("call,size,ptr,ns\n")
}

// Flush writes out the buffered call log and returns its first error.
func (d *Device) Flush() error {
	if d.log == nil {
		return nil
	}
	return d.log.Flush()
}

// RecordSeq starts recording the cudaMalloc/cudaFree sequence made through
// the device, for Runtime.RunSeq.
func (d *Device) RecordSeq() { d.seq = &Seq{slots: map[uint64]int32{}} }

// Seq returns the recorded sequence, nil if none.
func (d *Device) Seq() *Seq { return d.seq }

// Seq is a recorded sequence of cudaMalloc and cudaFree calls: Size[i] > 0
// is a cudaMalloc of that many bytes into slot Slot[i], Size[i] == 0 a
// cudaFree of the pointer in Slot[i].
type Seq struct {
	Size  []uint64
	Slot  []int32
	slots map[uint64]int32 // live pointer -> slot
	spare []int32
	next  int32
}

func (s *Seq) malloc(ptr, size uint64) {
	var slot int32
	if n := len(s.spare); n > 0 {
		slot, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		slot = s.next
		s.next++
	}
	s.slots[ptr] = slot
	s.Size = append(s.Size, size)
	s.Slot = append(s.Slot, slot)
}

func (s *Seq) free(ptr uint64) {
	slot, ok := s.slots[ptr]
	if !ok {
		return
	}
	delete(s.slots, ptr)
	s.spare = append(s.spare, slot)
	s.Size = append(s.Size, 0)
	s.Slot = append(s.Slot, slot)
}

// Call classes for the time totals.
const (
	classOther = iota
	classAlloc // device-memory allocation and free calls
	classSync  // synchronizations
)

// record accounts one call.
func (d *Device) record(call string, class int, size, ptr uint64, ns int64) {
	d.calls++
	d.lat.Add(call, size, ns)
	switch class {
	case classAlloc:
		d.allocNS += ns
	case classSync:
		d.syncNS += ns
	}
	if d.log != nil {
		b := d.log.AvailableBuffer()
		b = append(b, call...)
		b = append(b, ',')
		b = strconv.AppendUint(b, size, 10)
		b = append(b, ",0x"...)
		b = strconv.AppendUint(b, ptr, 16)
		b = append(b, ',')
		b = strconv.AppendInt(b, ns, 10)
		b = append(b, '\n')
		d.log.Write(b)
	}
}

// Alloc is a cudaMalloc of size bytes. It returns an error wrapping
// policies.ErrOutOfMemory, without calling the runtime, when the segment
// would take the device past its limit, and when cudaMalloc fails with
// cudaErrorMemoryAllocation; any other failure is the runtime's *Error.
func (d *Device) Alloc(size uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("device alloc of 0 bytes")
	}
	if size > d.limit || d.reserved > d.limit-size {
		return 0, fmt.Errorf("device alloc of %d bytes with %d reserved would pass the limit of %d bytes: %w", size, d.reserved, d.limit, policies.ErrOutOfMemory)
	}
	ptr, ns, err := d.rt.Malloc(size)
	d.record("cudaMalloc", classAlloc, size, ptr, ns)
	if err != nil {
		return 0, fmt.Errorf("device alloc of %d bytes: %w", size, err)
	}
	d.live[ptr] = size
	d.reserved += size
	d.peak = max(d.peak, d.reserved)
	d.allocs++
	if d.seq != nil {
		d.seq.malloc(ptr, size)
	}
	return ptr, nil
}

// Free is a cudaFree of the segment at addr. It returns an error for an
// address that is not a live segment, without calling the runtime, and the
// runtime's error if cudaFree fails.
func (d *Device) Free(addr uint64) error {
	size, ok := d.live[addr]
	if !ok {
		return fmt.Errorf("device free of %#x: not a live segment", addr)
	}
	ns, err := d.rt.Free(addr)
	d.record("cudaFree", classAlloc, size, addr, ns)
	if err != nil {
		return fmt.Errorf("device free of %#x: %w", addr, err)
	}
	delete(d.live, addr)
	d.reserved -= size
	d.frees++
	if d.seq != nil {
		d.seq.free(addr)
	}
	return nil
}

// FreeAll frees every live segment and returns the first error.
func (d *Device) FreeAll() error {
	var first error
	for addr := range d.live {
		if err := d.Free(addr); err != nil {
			if first == nil {
				first = err
			}
			// Drop it anyway: it cannot be freed twice.
			d.reserved -= d.live[addr]
			delete(d.live, addr)
		}
	}
	return first
}

// Capacity returns the device's limit in bytes.
func (d *Device) Capacity() uint64 { return d.limit }

// Reserved returns the bytes in live cudaMalloc'd segments.
func (d *Device) Reserved() uint64 { return d.reserved }

// PeakReserved returns the largest value Reserved has had.
func (d *Device) PeakReserved() uint64 { return d.peak }

// Allocs and Frees return the number of successful cudaMalloc and cudaFree
// calls made through Alloc and Free.
func (d *Device) Allocs() int64 { return d.allocs }
func (d *Device) Frees() int64  { return d.frees }

// Latencies returns the latencies of every call made through the device.
// They are the device's own and valid until the next call.
func (d *Device) Latencies() *sim.Latencies { return &d.lat }

// AllocTime returns the nanoseconds spent in device-memory allocation and
// free calls (cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync), as
// timed in C.
func (d *Device) AllocTime() int64 { return d.allocNS }

// SyncTime returns the nanoseconds spent in synchronizations.
func (d *Device) SyncTime() int64 { return d.syncNS }

// Calls returns the number of timed runtime calls made through the device.
func (d *Device) Calls() int64 { return d.calls }

// The calls below are the other runtime calls a replay makes, timed and
// recorded like Alloc and Free.

func (d *Device) mallocAsync(size, pool, stream uint64) (uint64, error) {
	var ptr uint64
	var ns int64
	var err error
	call := "cudaMallocAsync"
	if pool != 0 {
		call = "cudaMallocFromPoolAsync"
		ptr, ns, err = d.rt.MallocFromPoolAsync(size, pool, stream)
	} else {
		ptr, ns, err = d.rt.MallocAsync(size, stream)
	}
	d.record(call, classAlloc, size, ptr, ns)
	return ptr, err
}

func (d *Device) freeAsync(ptr, size, stream uint64) error {
	ns, err := d.rt.FreeAsync(ptr, stream)
	d.record("cudaFreeAsync", classAlloc, size, ptr, ns)
	return err
}

func (d *Device) trim(pool, keep uint64) error {
	ns, err := d.rt.MemPoolTrimTo(pool, keep)
	d.record("cudaMemPoolTrimTo", classAlloc, 0, pool, ns)
	return err
}

func (d *Device) streamSync(s uint64) error {
	ns, err := d.rt.StreamSync(s)
	d.record("cudaStreamSynchronize", classSync, 0, s, ns)
	return err
}

func (d *Device) deviceSync() error {
	ns, err := d.rt.DeviceSync()
	d.record("cudaDeviceSynchronize", classSync, 0, 0, ns)
	return err
}

func (d *Device) eventRecord(ev, s uint64) error {
	ns, err := d.rt.EventRecord(ev, s)
	d.record("cudaEventRecord", classOther, 0, ev, ns)
	return err
}

func (d *Device) streamWaitEvent(s, ev uint64) error {
	ns, err := d.rt.StreamWaitEvent(s, ev)
	d.record("cudaStreamWaitEvent", classSync, 0, ev, ns)
	return err
}

func (d *Device) eventSync(ev uint64) error {
	ns, err := d.rt.EventSync(ev)
	d.record("cudaEventSynchronize", classSync, 0, ev, ns)
	return err
}

func (d *Device) mallocHost(size uint64) (uint64, error) {
	ptr, ns, err := d.rt.MallocHost(size)
	d.record("cudaMallocHost", classOther, size, ptr, ns)
	return ptr, err
}

func (d *Device) freeHost(ptr, size uint64) error {
	ns, err := d.rt.FreeHost(ptr)
	d.record("cudaFreeHost", classOther, size, ptr, ns)
	return err
}

func (d *Device) mallocManaged(size uint64) (uint64, error) {
	ptr, ns, err := d.rt.MallocManaged(size)
	d.record("cudaMallocManaged", classOther, size, ptr, ns)
	return ptr, err
}

func (d *Device) freeManaged(ptr, size uint64) error {
	ns, err := d.rt.Free(ptr)
	d.record("cudaFree(managed)", classOther, size, ptr, ns)
	return err
}
