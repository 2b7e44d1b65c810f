package gpu

// #include "cudart.h"
import "C"

import (
	"fmt"
	"sort"
	"unsafe"

	"github.com/gpualloc/allocsim/policies"
)

// The driver's virtual memory management behind policies.Mapper, as
// PyTorch's expandable segments use it (c10/cuda/CUDACachingAllocator.cpp,
// ExpandableSegment): an address range is reserved with
// cuMemAddressReserve, pages of physical memory are made with cuMemCreate
// and mapped into it with cuMemMap and cuMemSetAccess, unmapped with
// cuMemUnmap and cuMemRelease, and the range is given back with
// cuMemAddressFree. The entry points are the driver's (libcuda.so.1,
// loaded with dlopen at the first Reserve), or the runtime library's when
// it exports them (the fake runtime of the tests). A page is the driver's
// allocation granularity (2 MiB on the GPUs measured); a Map of several
// pages makes one physical allocation per page, so that any whole pages of
// it can be unmapped later, and counts as one device allocation.

// ErrNoVMM is returned by Reserve when the driver's virtual memory calls
// are not found.
var ErrNoVMM = fmt.Errorf("the driver's virtual memory management (cuMemCreate, cuMemMap) is not available")

// vmm is a Device's state of reserved ranges and mapped pages.
type vmm struct {
	page   uint64              // the driver's granularity in bytes
	ranges map[uint64]*vaRange // reserved ranges by start
	pages  map[uint64]uint64   // mapped page's address -> physical allocation handle
}

// vaRange is a reserved address range: its size and the bytes mapped.
type vaRange struct {
	size, mapped uint64
}

var _ policies.Mapper = (*Device)(nil)

// initVMM loads the virtual memory calls and the granularity at first use.
func (d *Device) initVMM() error {
	if d.vm != nil {
		return nil
	}
	if name := C.cr_vmm_missing(d.rt.lib); name != nil {
		return fmt.Errorf("%w: %s not found in %s or libcuda.so.1", ErrNoVMM, C.GoString(name), d.rt.Path)
	}
	r := C.cr_vmm_granularity(d.rt.lib, C.int(d.rt.Device))
	if r.rc != 0 || r.ptr == 0 {
		return fmt.Errorf("%w: cuMemGetAllocationGranularity: %w", ErrNoVMM, d.rt.driverError("cuMemGetAllocationGranularity", int(r.rc)))
	}
	d.vm = &vmm{page: uint64(r.ptr), ranges: map[uint64]*vaRange{}, pages: map[uint64]uint64{}}
	return nil
}

// driverError returns the Error for a driver call's CUresult rc.
func (rt *Runtime) driverError(call string, rc int) error {
	name := fmt.Sprintf("CUresult(%d)", rc)
	if s := C.cr_vmm_error_name(rt.lib, C.int(rc)); s != nil {
		name = C.GoString(s)
	}
	return &Error{Call: call, Code: rc, Name: name}
}

// Reserve reserves size bytes of address space (cuMemAddressReserve),
// rounded up to whole pages, and returns its start. It is not a device
// allocation. It returns an error wrapping ErrNoVMM when the driver's
// virtual memory calls are missing, and the driver's error if the call
// fails.
func (d *Device) Reserve(size uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("device reserve of 0 bytes")
	}
	if err := d.initVMM(); err != nil {
		return 0, err
	}
	size = (size + d.vm.page - 1) / d.vm.page * d.vm.page
	r := C.cr_vmm_reserve(d.rt.lib, C.uint64_t(size))
	d.record("cuMemAddressReserve", classOther, size, uint64(r.ptr), int64(r.ns))
	if r.rc != 0 {
		return 0, fmt.Errorf("device reserve of %d bytes: %w", size, d.rt.driverError("cuMemAddressReserve", int(r.rc)))
	}
	d.vm.ranges[uint64(r.ptr)] = &vaRange{size: size}
	return uint64(r.ptr), nil
}

// rangeOf returns the reserved range holding [addr, addr+size), or nil.
func (d *Device) rangeOf(addr, size uint64) *vaRange {
	if d.vm == nil {
		return nil
	}
	for a, rg := range d.vm.ranges {
		if a <= addr && addr+size <= a+rg.size {
			return rg
		}
	}
	return nil
}

// Map backs [addr, addr+size), whole pages of a reserved range, with
// memory: cuMemCreate and cuMemMap per page, then cuMemSetAccess, timed
// together as one device allocation ("cuMemMap" in the latencies). It
// returns an error wrapping policies.ErrOutOfMemory, without calling the
// driver, when the pages would take the device past its limit, and when
// cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY; the driver's error for
// any other failure, and an error for pages not reserved or mapped already.
func (d *Device) Map(addr, size uint64) error {
	rg := d.rangeOf(addr, size)
	if rg == nil || size == 0 {
		return fmt.Errorf("device map of %d bytes at %#x: not inside a reserved range", size, addr)
	}
	page := d.vm.page
	if addr%page != 0 || size%page != 0 {
		return fmt.Errorf("device map of %d bytes at %#x: not whole pages of %d bytes", size, addr, page)
	}
	for p := addr; p < addr+size; p += page {
		if _, ok := d.vm.pages[p]; ok {
			return fmt.Errorf("device map of %d bytes at %#x: the page at %#x is mapped already", size, addr, p)
		}
	}
	if size > d.limit || d.reserved > d.limit-size {
		return fmt.Errorf("device map of %d bytes with %d reserved would pass the limit of %d bytes: %w", size, d.reserved, d.limit, policies.ErrOutOfMemory)
	}
	handles := make([]uint64, size/page)
	d.paceCall()
	r := C.cr_vmm_map(d.rt.lib, C.int(d.rt.Device), C.uint64_t(addr), C.uint64_t(size), C.uint64_t(page), (*C.uint64_t)(unsafe.Pointer(&handles[0])))
	d.record("cuMemMap", classAlloc, size, addr, int64(r.ns))
	switch rc := int(r.rc); rc {
	case 0:
	case CodeMemoryAllocation: // CUDA_ERROR_OUT_OF_MEMORY has the runtime's code
		return fmt.Errorf("device map of %d bytes at %#x: %w: %w", size, addr, d.rt.driverError(vmmCall(r.ptr), rc), policies.ErrOutOfMemory)
	default:
		return fmt.Errorf("device map of %d bytes at %#x: %w", size, addr, d.rt.driverError(vmmCall(r.ptr), rc))
	}
	for k, h := range handles {
		d.vm.pages[addr+uint64(k)*page] = h
	}
	rg.mapped += size
	d.reserved += size
	d.peak = max(d.peak, d.reserved)
	d.allocs++
	return nil
}

// Unmap gives back the memory of [addr, addr+size), mapped whole pages:
// cuMemUnmap and cuMemRelease per page, timed together as one device free
// ("cuMemUnmap"). It returns an error for pages not mapped, and the
// driver's error if a call fails (the pages are dropped all the same).
func (d *Device) Unmap(addr, size uint64) error {
	rg := d.rangeOf(addr, size)
	if rg == nil || size == 0 || addr%d.vm.page != 0 || size%d.vm.page != 0 {
		return fmt.Errorf("device unmap of %d bytes at %#x: not whole pages of a reserved range", size, addr)
	}
	page := d.vm.page
	handles := make([]uint64, 0, size/page)
	for p := addr; p < addr+size; p += page {
		h, ok := d.vm.pages[p]
		if !ok {
			return fmt.Errorf("device unmap of %d bytes at %#x: the page at %#x is not mapped", size, addr, p)
		}
		handles = append(handles, h)
	}
	d.paceCall()
	r := C.cr_vmm_unmap(d.rt.lib, C.uint64_t(addr), C.uint64_t(size), C.uint64_t(page), (*C.uint64_t)(unsafe.Pointer(&handles[0])))
	d.record("cuMemUnmap", classAlloc, size, addr, int64(r.ns))
	for p := addr; p < addr+size; p += page {
		delete(d.vm.pages, p)
	}
	rg.mapped -= size
	d.reserved -= size
	d.frees++
	if r.rc != 0 {
		return fmt.Errorf("device unmap of %d bytes at %#x: %w", size, addr, d.rt.driverError(vmmCall(r.ptr), int(r.rc)))
	}
	return nil
}

// Release gives back the reserved range at addr (cuMemAddressFree), which
// must have nothing mapped.
func (d *Device) Release(addr uint64) error {
	var rg *vaRange
	if d.vm != nil {
		rg = d.vm.ranges[addr]
	}
	if rg == nil {
		return fmt.Errorf("device release of %#x: not a reserved range", addr)
	}
	if rg.mapped > 0 {
		return fmt.Errorf("device release of %#x: %d bytes still mapped", addr, rg.mapped)
	}
	r := C.cr_vmm_free_va(d.rt.lib, C.uint64_t(addr), C.uint64_t(rg.size))
	d.record("cuMemAddressFree", classOther, rg.size, addr, int64(r.ns))
	delete(d.vm.ranges, addr)
	if r.rc != 0 {
		return fmt.Errorf("device release of %#x: %w", addr, d.rt.driverError("cuMemAddressFree", int(r.rc)))
	}
	return nil
}

// releaseVMM unmaps every mapped page and gives back every reserved range,
// whatever state they are in, and returns the first error.
func (d *Device) releaseVMM() error {
	if d.vm == nil {
		return nil
	}
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	var pages []uint64
	for p := range d.vm.pages {
		pages = append(pages, p)
	}
	sort.Slice(pages, func(i, j int) bool { return pages[i] < pages[j] })
	for _, p := range pages {
		keep(d.Unmap(p, d.vm.page))
	}
	for a := range d.vm.ranges {
		keep(d.Release(a))
	}
	return first
}

// vmmCall names the call that failed in cr_vmm_map or cr_vmm_unmap.
func vmmCall(which C.uint64_t) string {
	switch which {
	case C.CR_VMM_CREATE:
		return "cuMemCreate"
	case C.CR_VMM_MAP:
		return "cuMemMap"
	case C.CR_VMM_SET_ACCESS:
		return "cuMemSetAccess"
	case C.CR_VMM_UNMAP:
		return "cuMemUnmap"
	case C.CR_VMM_RELEASE:
		return "cuMemRelease"
	}
	return "cuMem"
}
