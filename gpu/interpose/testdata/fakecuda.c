// fakecuda.c is a fake CUDA driver (libcuda.so.1) for the interposer's
// tests: the entry points the interposer wraps, over host memory, reached
// as the real runtime reaches them, through cuGetProcAddress.
//
// Semantics kept from the real driver: cuMemAlloc of 0 bytes and a free of
// an address that is not live return CUDA_ERROR_INVALID_VALUE (1); more than
// 1 TiB returns CUDA_ERROR_OUT_OF_MEMORY (2); a NULL event returns
// CUDA_ERROR_INVALID_HANDLE (400).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUevent;

// live is a set of live addresses: open addressing, tombstones as 1.
#define LIVE (1 << 16)
static uintptr_t live[LIVE];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t hash(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> 48) & (LIVE - 1); }

static int add(void *p) {
	pthread_mutex_lock(&mu);
	size_t i = hash((uintptr_t)p);
	while (live[i] > 1)
		i = (i + 1) & (LIVE - 1);
	live[i] = (uintptr_t)p;
	pthread_mutex_unlock(&mu);
	return 0;
}

static int del(void *p) {
	int found = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = hash((uintptr_t)p); live[i]; i = (i + 1) & (LIVE - 1))
		if (live[i] == (uintptr_t)p) {
			live[i] = 1;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	return found;
}

static int alloc(void **p, size_t n) {
	if (!p || n == 0)
		return 1;
	if (n > (1ull << 40))
		return 2;
	*p = malloc(n);
	add(*p);
	return 0;
}

static int release(void *p) {
	if (!p || !del(p))
		return 1;
	free(p);
	return 0;
}

int cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc((void **)p, n); }
int cuMemFree_v2(CUdeviceptr p) { return release((void *)(uintptr_t)p); }
int cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc((void **)p, n); }
int cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc((void **)p, n); }
int cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, CUstream s) { (void)pool; (void)s; return alloc((void **)p, n); }
int cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return release((void *)(uintptr_t)p); }
int cuMemAllocHost_v2(void **p, size_t n) { return alloc(p, n); }
int cuMemHostAlloc(void **p, size_t n, unsigned f) { (void)f; return alloc(p, n); }
int cuMemFreeHost(void *p) { return release(p); }
int cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)f; return alloc((void **)p, n); }
int cuStreamSynchronize(CUstream s) { (void)s; return 0; }
int cuStreamSynchronize_ptsz(CUstream s) { (void)s; return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuEventRecord(CUevent e, CUstream s) { (void)s; return e ? 0 : 400; }
int cuEventRecordWithFlags(CUevent e, CUstream s, unsigned f) { (void)s; (void)f; return e ? 0 : 400; }
int cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { (void)s; (void)f; return e ? 0 : 400; }
int cuEventSynchronize(CUevent e) { return e ? 0 : 400; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }

// Graph capture: the legacy stream (NULL) cannot be captured
// (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900); a capture ends with a
// graph, a counter; a NULL graph is CUDA_ERROR_INVALID_VALUE.
static uintptr_t next_graph = 0x6001;
int cuStreamBeginCapture_v2(CUstream s, int mode) { (void)mode; return s ? 0 : 900; }
int cuStreamEndCapture(CUstream s, void **g) {
	if (!s || !g)
		return 1;
	pthread_mutex_lock(&mu);
	*g = (void *)next_graph++;
	pthread_mutex_unlock(&mu);
	return 0;
}
int cuGraphDestroy(void *g) { return g ? 0 : 1; }

// The virtual memory API, over nothing: a range is a counter of addresses,
// a handle a counter; a create of more than 1 TiB returns
// CUDA_ERROR_OUT_OF_MEMORY, one with flags 1 CUDA_ERROR_NOT_SUPPORTED
// (801, as an unsupported handle type), a map or unmap of 0 bytes
// CUDA_ERROR_INVALID_VALUE.
static unsigned long long next_va = 0x7f0000000000ull, next_handle = 0x100;
int cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long f) {
	(void)align; (void)addr; (void)f;
	if (!p || n == 0)
		return 1;
	pthread_mutex_lock(&mu);
	*p = next_va;
	next_va += (n + (2u << 20) - 1) / (2u << 20) * (2u << 20);
	pthread_mutex_unlock(&mu);
	return 0;
}
int cuMemAddressFree(CUdeviceptr p, size_t n) { return p && n ? 0 : 1; }
int cuMemCreate(unsigned long long *h, size_t n, const void *prop, unsigned long long f) {
	(void)prop;
	if (!h || n == 0)
		return 1;
	if (n > (1ull << 40))
		return 2;
	if (f == 1)
		return 801;
	pthread_mutex_lock(&mu);
	*h = next_handle++;
	pthread_mutex_unlock(&mu);
	return 0;
}
int cuMemRelease(unsigned long long h) { return h ? 0 : 1; }
int cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long f) {
	(void)off; (void)f;
	return p && n && h ? 0 : 1;
}
int cuMemUnmap(CUdeviceptr p, size_t n) { return p && n ? 0 : 1; }
int cuMemPoolTrimTo(void *pool, size_t keep) { (void)keep; return pool ? 0 : 1; }
int cuMemSetAccess(CUdeviceptr p, size_t n, const void *desc, size_t count) {
	(void)desc;
	return p && n && count ? 0 : 1;
}

int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static const struct {
	const char *name;
	void *fn, *ptsz;
} table[] = {
    {"cuMemAlloc", (void *)cuMemAlloc_v2, 0},
    {"cuMemFree", (void *)cuMemFree_v2, 0},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, 0},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync, 0},
    {"cuMemAllocHost", (void *)cuMemAllocHost_v2, 0},
    {"cuMemHostAlloc", (void *)cuMemHostAlloc, 0},
    {"cuMemFreeHost", (void *)cuMemFreeHost, 0},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged, 0},
    {"cuStreamSynchronize", (void *)cuStreamSynchronize, (void *)cuStreamSynchronize_ptsz},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize, 0},
    {"cuEventRecord", (void *)cuEventRecord, 0},
    {"cuEventRecordWithFlags", (void *)cuEventRecordWithFlags, 0},
    {"cuStreamWaitEvent", (void *)cuStreamWaitEvent, 0},
    {"cuEventSynchronize", (void *)cuEventSynchronize, 0},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount, 0},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve, 0},
    {"cuMemAddressFree", (void *)cuMemAddressFree, 0},
    {"cuMemCreate", (void *)cuMemCreate, 0},
    {"cuMemRelease", (void *)cuMemRelease, 0},
    {"cuMemMap", (void *)cuMemMap, 0},
    {"cuMemUnmap", (void *)cuMemUnmap, 0},
    {"cuMemPoolTrimTo", (void *)cuMemPoolTrimTo, 0},
    {"cuMemSetAccess", (void *)cuMemSetAccess, 0},
    {"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2, 0},
    {"cuStreamEndCapture", (void *)cuStreamEndCapture, 0},
    {"cuGraphDestroy", (void *)cuGraphDestroy, 0},
};

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
	if (status)
		*status = 0;
	if (strcmp(sym, "cuGetProcAddress") == 0) {
		*pfn = ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
		return 0;
	}
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
		if (strcmp(sym, table[i].name) == 0) {
			*pfn = (flags & 2) && table[i].ptsz ? table[i].ptsz : table[i].fn;
			return 0;
		}
	*pfn = NULL;
	if (status)
		*status = 1;
	return 500; // CUDA_ERROR_NOT_FOUND
}

int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
	return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
