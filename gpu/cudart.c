// Trampolines over the CUDA runtime: see cudart.h.
#define _GNU_SOURCE
#include "cudart.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t cr_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void cr_wait(int64_t since, int64_t ns) {
	// Sleep until 200 us before the end (a sleep overshoots by tens of
	// microseconds), then spin.
	int64_t left = since + ns - cr_now();
	if (left > 400000) {
		int64_t s = left - 200000;
		struct timespec ts = {s / 1000000000, s % 1000000000};
		nanosleep(&ts, NULL);
	}
	while (cr_now() - since < ns) {
	}
}

void cr_pace(cr_lib *l, int64_t ns) {
	if (ns > 0 && l->last_call_end != 0)
		cr_wait(l->last_call_end, ns);
}

#define LOAD(name) l->name = (__typeof__(l->name))dlsym(l->handle, #name)

cr_lib *cr_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", errlen - 1);
		err[errlen - 1] = 0;
		return NULL;
	}
	cr_lib *l = calloc(1, sizeof *l);
	l->handle = h;
	LOAD(cudaMalloc);
	LOAD(cudaFree);
	LOAD(cudaMallocAsync);
	LOAD(cudaFreeAsync);
	LOAD(cudaMallocFromPoolAsync);
	LOAD(cudaDeviceGetDefaultMemPool);
	LOAD(cudaMemPoolCreate);
	LOAD(cudaMemPoolDestroy);
	LOAD(cudaMemPoolSetAttribute);
	LOAD(cudaMemPoolGetAttribute);
	LOAD(cudaMemPoolTrimTo);
	LOAD(cudaStreamCreateWithFlags);
	LOAD(cudaStreamDestroy);
	LOAD(cudaStreamSynchronize);
	LOAD(cudaEventCreateWithFlags);
	LOAD(cudaEventDestroy);
	LOAD(cudaEventRecord);
	LOAD(cudaStreamWaitEvent);
	LOAD(cudaEventSynchronize);
	LOAD(cudaDeviceSynchronize);
	LOAD(cudaMemGetInfo);
	LOAD(cudaMallocHost);
	LOAD(cudaFreeHost);
	LOAD(cudaMallocManaged);
	LOAD(cudaGetErrorName);
	LOAD(cudaGetErrorString);
	LOAD(cudaGetLastError);
	LOAD(cudaGetDevice);
	LOAD(cudaRuntimeGetVersion);
	LOAD(cudaDriverGetVersion);
	// CUDA 12 exports the current struct layout as _v2; the name field
	// comes first in every version.
	l->cudaGetDeviceProperties = (__typeof__(l->cudaGetDeviceProperties))dlsym(h, "cudaGetDeviceProperties_v2");
	if (!l->cudaGetDeviceProperties)
		LOAD(cudaGetDeviceProperties);
	return l;
}

const char *cr_missing(const cr_lib *l) {
#define NEED(name) if (!l->name) return #name
	NEED(cudaMalloc);
	NEED(cudaFree);
	NEED(cudaStreamCreateWithFlags);
	NEED(cudaStreamDestroy);
	NEED(cudaStreamSynchronize);
	NEED(cudaEventCreateWithFlags);
	NEED(cudaEventDestroy);
	NEED(cudaEventRecord);
	NEED(cudaStreamWaitEvent);
	NEED(cudaEventSynchronize);
	NEED(cudaDeviceSynchronize);
	NEED(cudaMemGetInfo);
	NEED(cudaMallocHost);
	NEED(cudaFreeHost);
	NEED(cudaMallocManaged);
	NEED(cudaGetErrorName);
	NEED(cudaGetLastError);
#undef NEED
	return NULL;
}

void cr_close(cr_lib *l) {
	// The library stays loaded: the CUDA runtime does not support being
	// unloaded and reloaded in one process.
	free(l);
}

void *cr_sym(const cr_lib *l, const char *name) { return dlsym(l->handle, name); }

int cr_call_int(void *fn) { return ((int (*)(void))fn)(); }

// ENOSYM is the code returned for an entry point the runtime lacks; CUDA's
// own codes are never negative.
#define ENOSYM (-1)

#define TIMED(fn, call)                        \
	cr_res r = {0, 0, 0};                      \
	if (!l->fn) {                              \
		r.rc = ENOSYM;                         \
		return r;                              \
	}                                          \
	int64_t t0 = cr_now();                     \
	r.rc = call;                               \
	r.ns = cr_now() - t0;

cr_res cr_malloc(cr_lib *l, uint64_t size) {
	void *p = NULL;
	TIMED(cudaMalloc, l->cudaMalloc(&p, (size_t)size));
	l->last_call_end = t0 + r.ns;
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_free(cr_lib *l, uint64_t ptr) {
	TIMED(cudaFree, l->cudaFree((void *)(uintptr_t)ptr));
	l->last_call_end = t0 + r.ns;
	return r;
}

cr_res cr_malloc_async(cr_lib *l, uint64_t size, uint64_t stream) {
	void *p = NULL;
	TIMED(cudaMallocAsync, l->cudaMallocAsync(&p, (size_t)size, (void *)(uintptr_t)stream));
	l->last_call_end = t0 + r.ns;
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_malloc_from_pool_async(cr_lib *l, uint64_t size, uint64_t pool, uint64_t stream) {
	void *p = NULL;
	TIMED(cudaMallocFromPoolAsync,
	      l->cudaMallocFromPoolAsync(&p, (size_t)size, (void *)(uintptr_t)pool, (void *)(uintptr_t)stream));
	l->last_call_end = t0 + r.ns;
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_free_async(cr_lib *l, uint64_t ptr, uint64_t stream) {
	TIMED(cudaFreeAsync, l->cudaFreeAsync((void *)(uintptr_t)ptr, (void *)(uintptr_t)stream));
	l->last_call_end = t0 + r.ns;
	return r;
}

cr_res cr_default_pool(cr_lib *l, int device) {
	void *p = NULL;
	TIMED(cudaDeviceGetDefaultMemPool, l->cudaDeviceGetDefaultMemPool(&p, device));
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_pool_create(cr_lib *l, int device, uint64_t max_size) {
	void *p = NULL;
	cr_pool_props props;
	memset(&props, 0, sizeof props);
	props.allocType = 1;
	props.locationType = 1;
	props.locationId = device;
	props.maxSize = (size_t)max_size;
	TIMED(cudaMemPoolCreate, l->cudaMemPoolCreate(&p, &props));
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_pool_destroy(cr_lib *l, uint64_t pool) {
	TIMED(cudaMemPoolDestroy, l->cudaMemPoolDestroy((void *)(uintptr_t)pool));
	return r;
}

cr_res cr_pool_set(cr_lib *l, uint64_t pool, int attr, uint64_t value) {
	TIMED(cudaMemPoolSetAttribute, l->cudaMemPoolSetAttribute((void *)(uintptr_t)pool, attr, &value));
	return r;
}

cr_res cr_pool_get(cr_lib *l, uint64_t pool, int attr) {
	uint64_t v = 0;
	TIMED(cudaMemPoolGetAttribute, l->cudaMemPoolGetAttribute((void *)(uintptr_t)pool, attr, &v));
	r.ptr = v;
	return r;
}

cr_res cr_pool_trim(cr_lib *l, uint64_t pool, uint64_t keep) {
	TIMED(cudaMemPoolTrimTo, l->cudaMemPoolTrimTo((void *)(uintptr_t)pool, (size_t)keep));
	return r;
}

cr_res cr_stream_create(cr_lib *l, unsigned int flags) {
	void *s = NULL;
	TIMED(cudaStreamCreateWithFlags, l->cudaStreamCreateWithFlags(&s, flags));
	r.ptr = (uint64_t)(uintptr_t)s;
	return r;
}

cr_res cr_stream_destroy(cr_lib *l, uint64_t stream) {
	TIMED(cudaStreamDestroy, l->cudaStreamDestroy((void *)(uintptr_t)stream));
	return r;
}

cr_res cr_stream_sync(cr_lib *l, uint64_t stream) {
	TIMED(cudaStreamSynchronize, l->cudaStreamSynchronize((void *)(uintptr_t)stream));
	return r;
}

cr_res cr_event_create(cr_lib *l, unsigned int flags) {
	void *e = NULL;
	TIMED(cudaEventCreateWithFlags, l->cudaEventCreateWithFlags(&e, flags));
	r.ptr = (uint64_t)(uintptr_t)e;
	return r;
}

cr_res cr_event_destroy(cr_lib *l, uint64_t ev) {
	TIMED(cudaEventDestroy, l->cudaEventDestroy((void *)(uintptr_t)ev));
	return r;
}

cr_res cr_event_record(cr_lib *l, uint64_t ev, uint64_t stream) {
	TIMED(cudaEventRecord, l->cudaEventRecord((void *)(uintptr_t)ev, (void *)(uintptr_t)stream));
	return r;
}

cr_res cr_stream_wait_event(cr_lib *l, uint64_t stream, uint64_t ev) {
	TIMED(cudaStreamWaitEvent, l->cudaStreamWaitEvent((void *)(uintptr_t)stream, (void *)(uintptr_t)ev, 0));
	return r;
}

cr_res cr_event_sync(cr_lib *l, uint64_t ev) {
	TIMED(cudaEventSynchronize, l->cudaEventSynchronize((void *)(uintptr_t)ev));
	return r;
}

cr_res cr_device_sync(cr_lib *l) {
	TIMED(cudaDeviceSynchronize, l->cudaDeviceSynchronize());
	return r;
}

cr_res cr_mem_get_info(cr_lib *l, uint64_t *total) {
	size_t f = 0, t = 0;
	TIMED(cudaMemGetInfo, l->cudaMemGetInfo(&f, &t));
	r.ptr = f;
	*total = t;
	return r;
}

cr_res cr_malloc_host(cr_lib *l, uint64_t size) {
	void *p = NULL;
	TIMED(cudaMallocHost, l->cudaMallocHost(&p, (size_t)size));
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_free_host(cr_lib *l, uint64_t ptr) {
	TIMED(cudaFreeHost, l->cudaFreeHost((void *)(uintptr_t)ptr));
	return r;
}

cr_res cr_malloc_managed(cr_lib *l, uint64_t size) {
	void *p = NULL;
	// cudaMemAttachGlobal = 1
	TIMED(cudaMallocManaged, l->cudaMallocManaged(&p, (size_t)size, 1));
	r.ptr = (uint64_t)(uintptr_t)p;
	return r;
}

cr_res cr_get_last_error(cr_lib *l) {
	TIMED(cudaGetLastError, l->cudaGetLastError());
	return r;
}

cr_res cr_get_device(cr_lib *l) {
	int d = 0;
	TIMED(cudaGetDevice, l->cudaGetDevice(&d));
	r.ptr = (uint64_t)d;
	return r;
}

cr_res cr_runtime_version(cr_lib *l) {
	int v = 0;
	TIMED(cudaRuntimeGetVersion, l->cudaRuntimeGetVersion(&v));
	r.ptr = (uint64_t)v;
	return r;
}

cr_res cr_driver_version(cr_lib *l) {
	int v = 0;
	TIMED(cudaDriverGetVersion, l->cudaDriverGetVersion(&v));
	r.ptr = (uint64_t)v;
	return r;
}

int cr_device_name(cr_lib *l, int device, char *buf, size_t len) {
	if (!l->cudaGetDeviceProperties || len == 0)
		return ENOSYM;
	// Larger than cudaDeviceProp in any CUDA version so far.
	char *props = calloc(1, 16384);
	int rc = l->cudaGetDeviceProperties(props, device);
	if (rc == 0) {
		strncpy(buf, props, len - 1);
		buf[len - 1] = 0;
	}
	free(props);
	return rc;
}

const char *cr_error_name(cr_lib *l, int rc) {
	return l->cudaGetErrorName ? l->cudaGetErrorName(rc) : NULL;
}

const char *cr_error_string(cr_lib *l, int rc) {
	return l->cudaGetErrorString ? l->cudaGetErrorString(rc) : NULL;
}

int64_t cr_seq_run(cr_lib *l, const uint64_t *size, const int32_t *slot, int64_t n, int timed,
                   uint64_t *ptrs, int64_t *calls_ns, int64_t *failed, int *rc) {
	int64_t sum = 0, t0 = 0;
	*failed = -1;
	*rc = 0;
	int64_t start = cr_now();
	for (int64_t i = 0; i < n; i++) {
		int c;
		if (timed)
			t0 = cr_now();
		if (size[i] > 0) {
			void *p = NULL;
			c = l->cudaMalloc(&p, (size_t)size[i]);
			ptrs[slot[i]] = (uint64_t)(uintptr_t)p;
		} else {
			c = l->cudaFree((void *)(uintptr_t)ptrs[slot[i]]);
			ptrs[slot[i]] = 0;
		}
		if (timed)
			sum += cr_now() - t0;
		if (c != 0) {
			*failed = i;
			*rc = c;
			break;
		}
	}
	int64_t wall = cr_now() - start;
	*calls_ns = sum;
	return wall;
}

int64_t cr_batch(cr_lib *l, const uint64_t *size, const int32_t *slot, int64_t n, uint64_t *slot_ptr,
                 uint64_t *slot_size, uint64_t limit, uint64_t *reserved, uint64_t *ptr, int64_t *ns,
                 int32_t *rc, const int64_t *wait) {
	uint64_t res = *reserved;
	int64_t i;
	for (i = 0; i < n; i++) {
		int32_t s = slot[i];
		int c = 0;
		ns[i] = 0;
		if (size[i] > 0) {
			ptr[i] = 0;
			if (size[i] > limit || res > limit - size[i]) {
				rc[i] = CR_REFUSED;
				slot_ptr[s] = 0;
				continue;
			}
			void *p = NULL;
			if (wait)
				cr_pace(l, wait[i]);
			int64_t t0 = cr_now();
			c = l->cudaMalloc(&p, (size_t)size[i]);
			l->last_call_end = cr_now();
			ns[i] = l->last_call_end - t0;
			rc[i] = c;
			if (c == 0) {
				slot_ptr[s] = (uint64_t)(uintptr_t)p;
				slot_size[s] = size[i];
				res += size[i];
				ptr[i] = slot_ptr[s];
			} else {
				slot_ptr[s] = 0;
			}
		} else {
			ptr[i] = slot_ptr[s];
			rc[i] = 0;
			if (ptr[i] == 0)
				continue; // its malloc failed or was refused: no call
			if (wait)
				cr_pace(l, wait[i]);
			int64_t t0 = cr_now();
			c = l->cudaFree((void *)(uintptr_t)ptr[i]);
			l->last_call_end = cr_now();
			ns[i] = l->last_call_end - t0;
			rc[i] = c;
			if (c == 0) {
				slot_ptr[s] = 0;
				res -= slot_size[s];
			}
		}
		if (c != 0) {
			if (l->cudaGetLastError)
				l->cudaGetLastError(); // so that the failure does not show up at a later call
			if (!(size[i] > 0 && c == 2))
				break; // only an out-of-memory cudaMalloc lets the batch go on
		}
	}
	*reserved = res;
	return i < n ? i : n;
}

// The driver's virtual memory management. The structs are declared as the
// driver API lays them out (cuda.h, CUDA 11.2 and later), so that no CUDA
// header is needed: CUmemAllocationProp and CUmemAccessDesc.
typedef struct {
	int type;                 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	int requestedHandleTypes; // CU_MEM_HANDLE_TYPE_NONE = 0
	int locationType;         // CU_MEM_LOCATION_TYPE_DEVICE = 1
	int locationId;           // device ordinal
	void *win32HandleMetaData;
	unsigned char allocFlags[8];
} cr_mem_prop;

typedef struct {
	int locationType; // CU_MEM_LOCATION_TYPE_DEVICE = 1
	int locationId;
	int flags; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
} cr_access_desc;

#define VMM_LOAD(name) l->name = (__typeof__(l->name))vmm_sym(l, #name)

static void *vmm_sym(cr_lib *l, const char *name) {
	void *f = dlsym(l->handle, name);
	if (!f && l->vmm_handle)
		f = dlsym(l->vmm_handle, name);
	return f;
}

const char *cr_vmm_missing(cr_lib *l) {
	if (!l->cuMemCreate) {
		if (!dlsym(l->handle, "cuMemCreate") && !l->vmm_handle)
			l->vmm_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
		VMM_LOAD(cuMemGetAllocationGranularity);
		VMM_LOAD(cuMemAddressReserve);
		VMM_LOAD(cuMemAddressFree);
		VMM_LOAD(cuMemCreate);
		VMM_LOAD(cuMemRelease);
		VMM_LOAD(cuMemMap);
		VMM_LOAD(cuMemUnmap);
		VMM_LOAD(cuMemSetAccess);
		VMM_LOAD(cuGetErrorName);
	}
#define NEED(name) if (!l->name) return #name
	NEED(cuMemGetAllocationGranularity);
	NEED(cuMemAddressReserve);
	NEED(cuMemAddressFree);
	NEED(cuMemCreate);
	NEED(cuMemRelease);
	NEED(cuMemMap);
	NEED(cuMemUnmap);
	NEED(cuMemSetAccess);
#undef NEED
	return NULL;
}

static cr_mem_prop vmm_prop(int device) {
	cr_mem_prop p;
	memset(&p, 0, sizeof p);
	p.type = 1;
	p.locationType = 1;
	p.locationId = device;
	return p;
}

cr_res cr_vmm_granularity(cr_lib *l, int device) {
	cr_res r = {0, 0, 0};
	size_t g = 0;
	cr_mem_prop p = vmm_prop(device);
	int64_t t0 = cr_now();
	r.rc = l->cuMemGetAllocationGranularity(&g, &p, 0); // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	r.ns = cr_now() - t0;
	r.ptr = g;
	return r;
}

cr_res cr_vmm_reserve(cr_lib *l, uint64_t size) {
	cr_res r = {0, 0, 0};
	uint64_t p = 0;
	int64_t t0 = cr_now();
	r.rc = l->cuMemAddressReserve(&p, (size_t)size, 0, 0, 0);
	r.ns = cr_now() - t0;
	r.ptr = p;
	return r;
}

cr_res cr_vmm_free_va(cr_lib *l, uint64_t ptr, uint64_t size) {
	cr_res r = {0, 0, 0};
	int64_t t0 = cr_now();
	r.rc = l->cuMemAddressFree(ptr, (size_t)size);
	r.ns = cr_now() - t0;
	return r;
}

cr_res cr_vmm_map(cr_lib *l, int device, uint64_t ptr, uint64_t size, uint64_t page, uint64_t *handles) {
	cr_res r = {0, 0, 0};
	cr_mem_prop p = vmm_prop(device);
	uint64_t n = size / page, done = 0; // pages created and mapped
	int64_t t0 = cr_now();
	for (; done < n; done++) {
		r.rc = l->cuMemCreate(&handles[done], (size_t)page, &p, 0);
		if (r.rc) {
			r.ptr = CR_VMM_CREATE;
			break;
		}
		r.rc = l->cuMemMap(ptr + done * page, (size_t)page, 0, handles[done], 0);
		if (r.rc) {
			r.ptr = CR_VMM_MAP;
			l->cuMemRelease(handles[done]);
			break;
		}
	}
	if (!r.rc) {
		cr_access_desc d = {1, device, 3};
		r.rc = l->cuMemSetAccess(ptr, (size_t)size, &d, 1);
		if (r.rc)
			r.ptr = CR_VMM_SET_ACCESS;
	}
	l->last_call_end = cr_now();
	r.ns = l->last_call_end - t0;
	if (r.rc) {
		// Undo the pages made before the failing call (all of them when
		// cuMemSetAccess failed).
		for (uint64_t k = 0; k < done; k++) {
			l->cuMemUnmap(ptr + k * page, (size_t)page);
			l->cuMemRelease(handles[k]);
		}
	}
	return r;
}

cr_res cr_vmm_unmap(cr_lib *l, uint64_t ptr, uint64_t size, uint64_t page, const uint64_t *handles) {
	cr_res r = {0, 0, 0};
	uint64_t n = size / page;
	int64_t t0 = cr_now();
	for (uint64_t k = 0; k < n; k++) {
		int c = l->cuMemUnmap(ptr + k * page, (size_t)page);
		if (c && !r.rc) {
			r.rc = c;
			r.ptr = CR_VMM_UNMAP;
		}
		c = l->cuMemRelease(handles[k]);
		if (c && !r.rc) {
			r.rc = c;
			r.ptr = CR_VMM_RELEASE;
		}
	}
	l->last_call_end = cr_now();
	r.ns = l->last_call_end - t0;
	return r;
}

const char *cr_vmm_error_name(cr_lib *l, int rc) {
	const char *s = NULL;
	if (l->cuGetErrorName && l->cuGetErrorName(rc, &s) == 0)
		return s;
	return NULL;
}
