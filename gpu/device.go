package gpu

import (
	"bufio"
	"fmt"
	"io"
	"strconv"

	"github.com/gpualloc/allocsim/policies"
	"github.com/gpualloc/allocsim/sim"
	"github.com/gpualloc/allocsim/trace"
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
	live     trace.AddrMap[segment] // cudaMalloc'd segments by pointer

	lat     sim.Latencies
	allocNS int64 // device-memory allocation calls
	syncNS  int64 // synchronizations
	calls   int64

	vm   *vmm      // reserved ranges and mapped pages (vmm.go), nil before the first Reserve
	play *playback // the outcomes of a batch's calls, made in C (batch.go); nil: call the runtime

	log     *bufio.Writer                                 // per-call log, nil for none
	onCall  func(call string, size, ptr uint64, ns int64) // told each call, nil for none
	logPool uint64                                        // the memory pool whose reserved bytes the log carries, 0 for none
	seq     *Seq                                          // cudaMalloc/cudaFree sequence being recorded, nil for none

	// Pacing (SetPace): the trace time in nanoseconds of the event being
	// replayed and of the event of the previous allocation call.
	pace      bool
	now, last int64
	called    bool
}

// PaceMin and PaceMax bound the idle times a paced replay keeps, in
// nanoseconds: a shorter gap between two allocation calls of the trace is
// not kept (it is below the smallest idle time a calibration measures, and
// a call takes about that long itself), a longer one is cut to PaceMax
// (the driver's wake-up cost is flat from about 50 ms of idle on, measured
// on an H200).
const (
	PaceMin = 100e3
	PaceMax = 50e6
)

// SetPace makes the device keep the trace's idle times: before each
// allocation call (cudaMalloc, cudaFree and their async forms) it waits
// until the trace time between the call's event and the previous call's
// event, within PaceMin and PaceMax, has passed since the previous call
// returned. SetTime gives it the events' times.
func (d *Device) SetPace(on bool) { d.pace = on }

// SetTime tells the device the trace time in nanoseconds of the event being
// replayed.
func (d *Device) SetTime(ns int64) { d.now = ns }

// paceWait returns how long to wait before an allocation call made for the
// event at trace time now, in nanoseconds, and notes the call.
func (d *Device) paceWait(now int64) int64 {
	if !d.pace {
		return 0
	}
	gap, first := now-d.last, !d.called
	d.called, d.last = true, now
	if first || gap < PaceMin {
		return 0
	}
	return min(gap, PaceMax)
}

// paceCall waits, when pacing, before an allocation call made for the
// current event.
func (d *Device) paceCall() {
	if d.pace {
		d.rt.Pace(d.paceWait(d.now))
	}
}

// segment is a live cudaMalloc'd segment: its size in bytes and its slot in
// the recorded sequence.
type segment struct {
	size uint64
	slot int32
}

var (
	_ policies.Device    = (*Device)(nil)
	_ policies.Capacitor = (*Device)(nil)
)

// NewDevice returns a device on rt that holds at most limit bytes of
// cudaMalloc'd segments.
func NewDevice(rt *Runtime, limit uint64) *Device {
	return &Device{rt: rt, limit: limit}
}

// LogCalls writes one CSV line per runtime call from now on to w
// (call,size,ptr,ns,pool_reserved: the size in bytes, the pointer in hex,
// the call's duration in nanoseconds, and, while a memory pool is logged
// (LogPool), the pool's reserved bytes after the call, read untimed with
// cudaMemPoolGetAttribute; empty otherwise), after a header. Flush writes
// out what is buffered.
func (d *Device) LogCalls(w io.Writer) {
	d.log = bufio.NewWriterSize(w, 1<<20)
	d.log.WriteString("call,size,ptr,ns,pool_reserved\n")
}

// LogPool makes the call log carry memory pool pool's reserved bytes
// (cudaMemPoolAttrReservedMemCurrent) after every call; 0 stops it.
func (d *Device) LogPool(pool uint64) { d.logPool = pool }

// Flush writes out the buffered call log and returns its first error.
func (d *Device) Flush() error {
	if d.log == nil {
		return nil
	}
	return d.log.Flush()
}

// RecordSeq starts recording the cudaMalloc/cudaFree sequence made through
// the device, for Runtime.RunSeq.
func (d *Device) RecordSeq() { d.seq = &Seq{} }

// Seq returns the recorded sequence, nil if none.
func (d *Device) Seq() *Seq { return d.seq }

// Seq is a recorded sequence of cudaMalloc and cudaFree calls. It is kept
// in blocks of fixed size, so that recording never copies what it has.
type Seq struct {
	blocks [][]seqCall
	spare  []int32 // free slots
	next   int32
}

type seqCall struct {
	size uint64 // 0 for a cudaFree
	slot int32
}

const seqBlock = 1 << 16

// Len returns the number of calls recorded.
func (s *Seq) Len() int {
	if len(s.blocks) == 0 {
		return 0
	}
	return (len(s.blocks)-1)*seqBlock + len(s.blocks[len(s.blocks)-1])
}

// Calls returns the sequence as Runtime.RunSeq takes it: call i is a
// cudaMalloc of size[i] bytes into slot[i] when size[i] > 0, else a cudaFree
// of the pointer in slot[i].
func (s *Seq) Calls() (size []uint64, slot []int32) {
	n := s.Len()
	size, slot = make([]uint64, 0, n), make([]int32, 0, n)
	for _, b := range s.blocks {
		for _, c := range b {
			size = append(size, c.size)
			slot = append(slot, c.slot)
		}
	}
	return size, slot
}

func (s *Seq) add(c seqCall) {
	if k := len(s.blocks); k == 0 || len(s.blocks[k-1]) == seqBlock {
		s.blocks = append(s.blocks, make([]seqCall, 0, seqBlock))
	}
	b := &s.blocks[len(s.blocks)-1]
	*b = append(*b, c)
}

// malloc records a cudaMalloc of size bytes and returns its slot.
func (s *Seq) malloc(size uint64) int32 {
	var slot int32
	if n := len(s.spare); n > 0 {
		slot, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		slot = s.next
		s.next++
	}
	s.add(seqCall{size, slot})
	return slot
}

// free records a cudaFree of the pointer in slot.
func (s *Seq) free(slot int32) {
	s.spare = append(s.spare, slot)
	s.add(seqCall{0, slot})
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
	if d.onCall != nil {
		d.onCall(call, size, ptr, ns)
	}
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
		b = append(b, ',')
		if d.logPool != 0 {
			if r, err := d.rt.MemPoolAttr(d.logPool, PoolReservedCurrent); err == nil {
				b = strconv.AppendUint(b, r, 10)
			}
		}
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
	if d.play != nil {
		return d.playAlloc(size)
	}
	if size > d.limit || d.reserved > d.limit-size {
		return 0, fmt.Errorf("device alloc of %d bytes with %d reserved would pass the limit of %d bytes: %w", size, d.reserved, d.limit, policies.ErrOutOfMemory)
	}
	d.paceCall()
	ptr, ns, err := d.rt.Malloc(size)
	d.record("cudaMalloc", classAlloc, size, ptr, ns)
	if err != nil {
		return 0, fmt.Errorf("device alloc of %d bytes: %w", size, err)
	}
	d.allocated(ptr, size)
	return ptr, nil
}

// allocated accounts for a successful cudaMalloc of size bytes at ptr.
func (d *Device) allocated(ptr, size uint64) {
	seg := segment{size: size, slot: -1}
	if d.seq != nil {
		seg.slot = d.seq.malloc(size)
	}
	d.live.Put(ptr, seg)
	d.reserved += size
	d.peak = max(d.peak, d.reserved)
	d.allocs++
}

// freed accounts for a successful cudaFree of seg, at ptr.
func (d *Device) freed(ptr uint64, seg segment) {
	d.live.Delete(ptr)
	d.reserved -= seg.size
	d.frees++
	if d.seq != nil && seg.slot >= 0 {
		d.seq.free(seg.slot)
	}
}

// Free is a cudaFree of the segment at addr. It returns an error for an
// address that is not a live segment, without calling the runtime, and the
// runtime's error if cudaFree fails.
func (d *Device) Free(addr uint64) error {
	if d.play != nil {
		return d.playFree(addr)
	}
	seg, ok := d.live.Get(addr)
	if !ok {
		return fmt.Errorf("device free of %#x: not a live segment", addr)
	}
	d.paceCall()
	ns, err := d.rt.Free(addr)
	d.record("cudaFree", classAlloc, seg.size, addr, ns)
	if err != nil {
		return fmt.Errorf("device free of %#x: %w", addr, err)
	}
	d.freed(addr, seg)
	return nil
}

// FreeAll frees every live segment, unmaps every mapped page and gives
// back every reserved range, and returns the first error.
func (d *Device) FreeAll() error {
	first := d.releaseVMM()
	var addrs []uint64 // taken first: the table must not change during All
	for addr := range d.live.All() {
		addrs = append(addrs, addr)
	}
	for _, addr := range addrs {
		if err := d.Free(addr); err != nil {
			if first == nil {
				first = err
			}
			// Drop it anyway: it cannot be freed twice.
			if seg, ok := d.live.Take(addr); ok {
				d.reserved -= seg.size
			}
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
	d.paceCall()
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
	d.paceCall()
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
