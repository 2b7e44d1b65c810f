// Trampolines over the CUDA runtime, loaded at run time with dlopen. The
// prototypes are declared here, so no CUDA header is needed to build; each
// call is timed in C around the runtime call alone.
#ifndef ALLOCSIM_GPU_CUDART_H
#define ALLOCSIM_GPU_CUDART_H

#include <stddef.h>
#include <stdint.h>

// cudaMemPoolProps as of CUDA 12.2+ (88 bytes; older runtimes have 64
// reserved bytes where maxSize and usage are, and want them zero).
typedef struct {
	int allocType;     // cudaMemAllocationTypePinned = 1
	int handleTypes;   // cudaMemHandleTypeNone = 0
	int locationType;  // cudaMemLocationTypeDevice = 1
	int locationId;    // device ordinal
	void *win32SecurityAttributes;
	size_t maxSize;    // 0: no limit
	unsigned short usage;
	unsigned char reserved[54];
} cr_pool_props;

// cr_lib holds the loaded library and its entry points; a NULL pointer is a
// function the runtime does not export.
typedef struct cr_lib {
	void *handle;
	int (*cudaMalloc)(void **, size_t);
	int (*cudaFree)(void *);
	int (*cudaMallocAsync)(void **, size_t, void *);
	int (*cudaFreeAsync)(void *, void *);
	int (*cudaMallocFromPoolAsync)(void **, size_t, void *, void *);
	int (*cudaDeviceGetDefaultMemPool)(void **, int);
	int (*cudaMemPoolCreate)(void **, const cr_pool_props *);
	int (*cudaMemPoolDestroy)(void *);
	int (*cudaMemPoolSetAttribute)(void *, int, void *);
	int (*cudaMemPoolGetAttribute)(void *, int, void *);
	int (*cudaMemPoolTrimTo)(void *, size_t);
	int (*cudaStreamCreateWithFlags)(void **, unsigned int);
	int (*cudaStreamDestroy)(void *);
	int (*cudaStreamSynchronize)(void *);
	int (*cudaEventCreateWithFlags)(void **, unsigned int);
	int (*cudaEventDestroy)(void *);
	int (*cudaEventRecord)(void *, void *);
	int (*cudaStreamWaitEvent)(void *, void *, unsigned int);
	int (*cudaEventSynchronize)(void *);
	int (*cudaDeviceSynchronize)(void);
	int (*cudaMemGetInfo)(size_t *, size_t *);
	int (*cudaMallocHost)(void **, size_t);
	int (*cudaFreeHost)(void *);
	int (*cudaMallocManaged)(void **, size_t, unsigned int);
	const char *(*cudaGetErrorName)(int);
	const char *(*cudaGetErrorString)(int);
	int (*cudaGetLastError)(void);
	int (*cudaGetDevice)(int *);
	int (*cudaRuntimeGetVersion)(int *);
	int (*cudaDriverGetVersion)(int *);
	int (*cudaGetDeviceProperties)(void *, int);
	// The driver's virtual memory management, for expandable segments:
	// found in the runtime library when it exports them (the fake one of
	// the tests), else in the driver library libcuda.so.1 (vmm_handle).
	void *vmm_handle;
	int (*cuMemGetAllocationGranularity)(size_t *, const void *, int);
	int (*cuMemAddressReserve)(uint64_t *, size_t, size_t, uint64_t, unsigned long long);
	int (*cuMemAddressFree)(uint64_t, size_t);
	int (*cuMemCreate)(uint64_t *, size_t, const void *, unsigned long long);
	int (*cuMemRelease)(uint64_t);
	int (*cuMemMap)(uint64_t, size_t, size_t, uint64_t, unsigned long long);
	int (*cuMemUnmap)(uint64_t, size_t);
	int (*cuMemSetAccess)(uint64_t, size_t, const void *, size_t);
	int (*cuGetErrorName)(int, const char **);
	// last_call_end is when (cr_now) the last allocation call (cudaMalloc,
	// cudaFree and their async forms) returned, 0 before the first.
	int64_t last_call_end;
} cr_lib;

// cr_res is the outcome of one call: the runtime's return code, the pointer
// or value it produced, and its duration in nanoseconds (CLOCK_MONOTONIC).
typedef struct {
	int rc;
	uint64_t ptr;
	int64_t ns;
} cr_res;

// cr_open loads the library at path. On failure it returns NULL and copies
// dlerror's message into err.
cr_lib *cr_open(const char *path, char *err, size_t errlen);
// cr_missing returns the name of the first required entry point that
// cr_open did not find, or NULL.
const char *cr_missing(const cr_lib *l);
void cr_close(cr_lib *l);
void *cr_sym(const cr_lib *l, const char *name);
int64_t cr_now(void);
// cr_wait returns once ns nanoseconds have passed since since (a cr_now
// time): it sleeps through most of a long wait and spins the rest.
void cr_wait(int64_t since, int64_t ns);
// cr_pace waits until ns nanoseconds have passed since the last allocation
// call returned (no wait before the first).
void cr_pace(cr_lib *l, int64_t ns);

cr_res cr_malloc(cr_lib *l, uint64_t size);
cr_res cr_free(cr_lib *l, uint64_t ptr);
cr_res cr_malloc_async(cr_lib *l, uint64_t size, uint64_t stream);
cr_res cr_malloc_from_pool_async(cr_lib *l, uint64_t size, uint64_t pool, uint64_t stream);
cr_res cr_free_async(cr_lib *l, uint64_t ptr, uint64_t stream);
cr_res cr_default_pool(cr_lib *l, int device);
cr_res cr_pool_create(cr_lib *l, int device, uint64_t max_size);
cr_res cr_pool_destroy(cr_lib *l, uint64_t pool);
cr_res cr_pool_set(cr_lib *l, uint64_t pool, int attr, uint64_t value);
cr_res cr_pool_get(cr_lib *l, uint64_t pool, int attr);
cr_res cr_pool_trim(cr_lib *l, uint64_t pool, uint64_t keep);
cr_res cr_stream_create(cr_lib *l, unsigned int flags);
cr_res cr_stream_destroy(cr_lib *l, uint64_t stream);
cr_res cr_stream_sync(cr_lib *l, uint64_t stream);
cr_res cr_event_create(cr_lib *l, unsigned int flags);
cr_res cr_event_destroy(cr_lib *l, uint64_t ev);
cr_res cr_event_record(cr_lib *l, uint64_t ev, uint64_t stream);
cr_res cr_stream_wait_event(cr_lib *l, uint64_t stream, uint64_t ev);
cr_res cr_event_sync(cr_lib *l, uint64_t ev);
cr_res cr_device_sync(cr_lib *l);
// cr_mem_get_info returns free bytes in ptr and total bytes in *total.
cr_res cr_mem_get_info(cr_lib *l, uint64_t *total);
cr_res cr_malloc_host(cr_lib *l, uint64_t size);
cr_res cr_free_host(cr_lib *l, uint64_t ptr);
cr_res cr_malloc_managed(cr_lib *l, uint64_t size);
cr_res cr_get_last_error(cr_lib *l);
cr_res cr_get_device(cr_lib *l);
cr_res cr_runtime_version(cr_lib *l);
cr_res cr_driver_version(cr_lib *l);
// cr_device_name copies the device's name into buf.
int cr_device_name(cr_lib *l, int device, char *buf, size_t len);
const char *cr_error_name(cr_lib *l, int rc);
const char *cr_error_string(cr_lib *l, int rc);
// cr_call_int calls fn, an int (*)(void) found with cr_sym.
int cr_call_int(void *fn);

// The driver's virtual memory calls (cuMem*), for expandable segments.
// cr_vmm_missing returns the name of the first one neither the runtime
// library nor libcuda.so.1 exports, or NULL.
const char *cr_vmm_missing(cr_lib *l);
// cr_vmm_granularity returns in ptr the minimum granularity of device
// memory on device (cuMemGetAllocationGranularity).
cr_res cr_vmm_granularity(cr_lib *l, int device);
// cr_vmm_reserve reserves size bytes of address space (cuMemAddressReserve)
// and returns its start in ptr; cr_vmm_free_va gives it back.
cr_res cr_vmm_reserve(cr_lib *l, uint64_t size);
cr_res cr_vmm_free_va(cr_lib *l, uint64_t ptr, uint64_t size);
// cr_vmm_map backs [ptr, ptr+size) with size/page physical allocations of
// page bytes each (cuMemCreate and cuMemMap per page, then one
// cuMemSetAccess for read and write from device), storing their handles in
// handles; on a failing call it undoes what it did and returns that call's
// code (its ptr the failing call, CR_VMM_*). The duration is the whole map's, and the allocation calls count as
// one in last_call_end.
cr_res cr_vmm_map(cr_lib *l, int device, uint64_t ptr, uint64_t size, uint64_t page, uint64_t *handles);
// On a failure of cr_vmm_map or cr_vmm_unmap, the result's ptr says which
// call failed.
enum { CR_VMM_CREATE = 1, CR_VMM_MAP, CR_VMM_SET_ACCESS, CR_VMM_UNMAP, CR_VMM_RELEASE };
// cr_vmm_unmap unmaps the pages of [ptr, ptr+size) and releases their
// handles (cuMemUnmap and cuMemRelease per page); it goes on past a failing
// call and returns the first failure's code.
cr_res cr_vmm_unmap(cr_lib *l, uint64_t ptr, uint64_t size, uint64_t page, const uint64_t *handles);
// cr_vmm_error_name returns the driver's name of CUresult rc, or NULL.
const char *cr_vmm_error_name(cr_lib *l, int rc);

// cr_batch makes the calls of n operations back to back, each timed in C:
// operation i is a cudaMalloc of size[i] bytes into slot[i] when size[i] > 0,
// else a cudaFree of the pointer in slot[i], with no call when that pointer
// is NULL (its malloc failed or was refused). slot_ptr and slot_size hold
// the slots' pointers and sizes from batch to batch. A cudaMalloc that would
// take *reserved past limit is refused without a call (rc[i] = CR_REFUSED).
// ptr[i] gets the pointer allocated or freed, ns[i] the call's duration and
// rc[i] its return code; *reserved is kept up to date. When wait is not
// NULL, each call is preceded by cr_pace(l, wait[i]). It stops at the
// first failing call other than a cudaMalloc out of memory (2) and returns
// its index, else n.
#define CR_REFUSED (-2)
int64_t cr_batch(cr_lib *l, const uint64_t *size, const int32_t *slot, int64_t n, uint64_t *slot_ptr,
                 uint64_t *slot_size, uint64_t limit, uint64_t *reserved, uint64_t *ptr, int64_t *ns,
                 int32_t *rc, const int64_t *wait);

// cr_seq_run replays a sequence of n cudaMalloc/cudaFree calls in a plain C
// loop: for call i, size[i] > 0 is a cudaMalloc of that many bytes whose
// pointer goes to ptrs[slot[i]], size[i] == 0 a cudaFree of ptrs[slot[i]].
// It returns the loop's wall time in ns. With timed set it also times each
// call and stores the sum in *calls_ns. On a failing call it stops and
// stores its index in *failed (else -1) and its return code in *rc.
int64_t cr_seq_run(cr_lib *l, const uint64_t *size, const int32_t *slot, int64_t n, int timed,
                   uint64_t *ptrs, int64_t *calls_ns, int64_t *failed, int *rc);

#endif
