// A fake CUDA runtime for the tests of package gpu: the entry points the
// package loads, with memory mapped behind every allocation (device memory
// at increasing addresses on 2 MiB boundaries, as the driver hands out
// fresh segments and as the simulated device does, so that policies that
// order blocks by address behave alike; host memory from malloc), a device of a given
// size, stream-ordered pools that release memory at synchronizations, and
// planted errors and latencies. Configured by environment variables, read at
// the first call:
//
//	FAKECUDA_TOTAL       device memory in bytes (default 1 GiB)
//	FAKECUDA_LATENCY_NS  busy wait in every allocation and free call (default 0)
//	FAKECUDA_FAIL        planted errors: CALL:N:CODE,... makes the N-th call
//	                     (from 1) of CALL return CODE, N = 0 every call
//	FAKECUDA_NOMAP       1: device memory is addresses alone, nothing mapped
//	                     (calls of constant cost, to measure a harness)
//	FAKECUDA_WAKE        GAP_NS:EXTRA_NS: a planted wake-up, a cudaMalloc,
//	                     cudaFree or async form that starts at least GAP_NS
//	                     after the previous one returned busy-waits EXTRA_NS
//	                     more (on top of FAKECUDA_LATENCY_NS); the first
//	                     call is not woken
//
// It also exports the driver's virtual memory calls (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
// cuMemAddressFree, cuMemGetAllocationGranularity, cuGetErrorName), with a
// granularity of 2 MiB: reserved ranges are addresses alone, a physical
// allocation counts against the device's memory, and every misuse the
// driver refuses (a map outside a reserved range or over a mapped page, an
// unmap of a range not mapped by one cuMemMap, a release of a handle still
// mapped, an address free with pages mapped) returns
// CUDA_ERROR_INVALID_VALUE (1). FAKECUDA_FAIL plants errors in them too.
// Built with -DFAKE_NO_ASYNC it lacks the stream-ordered allocator;
// with -DFAKE_NO_VMM it lacks the virtual memory calls.
// fakecuda_live() returns the number of live allocations, streams, events and
// created pools, so that tests can check that everything was released.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { KIND_DEVICE = 1, KIND_ASYNC, KIND_HOST, KIND_MANAGED, KIND_VA, KIND_MAPPED };

typedef struct alloc {
	void *p;
	size_t size;
	int kind;
	struct pool *pool;
	struct alloc *next;
} alloc;

typedef struct pool {
	uint64_t reserved, used, reserved_high, used_high, threshold, max_size;
} pool;

#define NBUCKETS 4096
static alloc *table[NBUCKETS];
static int inited;
static uint64_t total = 1ull << 30;
static uint64_t device_used; // cudaMalloc bytes and pool reservations
static int64_t latency_ns;
static int64_t wake_gap_ns = -1, wake_extra_ns; // FAKECUDA_WAKE; gap -1: none
static int64_t last_end; // when the last cudaMalloc, cudaFree or async form returned, 0 before the first
static int nomap;
static int last_error;
static int live_objects;
static pool default_pool;

#define MAXFAIL 16
static struct {
	char call[64];
	long n;
	int code;
	long seen;
} fails[MAXFAIL];
static int nfails;

static void init(void) {
	if (inited)
		return;
	inited = 1;
	const char *s = getenv("FAKECUDA_TOTAL");
	if (s)
		total = strtoull(s, NULL, 0);
	s = getenv("FAKECUDA_LATENCY_NS");
	if (s)
		latency_ns = strtoll(s, NULL, 0);
	s = getenv("FAKECUDA_WAKE");
	if (s && *s) {
		long long gap, extra;
		if (sscanf(s, "%lld:%lld", &gap, &extra) == 2 && gap >= 0) {
			wake_gap_ns = gap;
			wake_extra_ns = extra;
		}
	}
	s = getenv("FAKECUDA_NOMAP");
	if (s && *s == '1')
		nomap = 1;
	s = getenv("FAKECUDA_FAIL");
	if (s) {
		char *dup = strdup(s), *save = NULL;
		for (char *tok = strtok_r(dup, ",", &save); tok && nfails < MAXFAIL; tok = strtok_r(NULL, ",", &save)) {
			char name[64];
			long n;
			int code;
			if (sscanf(tok, "%63[^:]:%ld:%d", name, &n, &code) == 3) {
				strcpy(fails[nfails].call, name);
				fails[nfails].n = n;
				fails[nfails].code = code;
				nfails++;
			}
		}
		free(dup);
	}
}

// planted returns the error planted for this call of name, or 0.
static int planted(const char *name) {
	init();
	for (int i = 0; i < nfails; i++) {
		if (strcmp(fails[i].call, name) != 0)
			continue;
		fails[i].seen++;
		if (fails[i].n == 0 || fails[i].n == fails[i].seen)
			return fails[i].code;
	}
	return 0;
}

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000ll + t.tv_nsec;
}

static void busy(int64_t ns) {
	if (ns <= 0)
		return;
	int64_t a = now_ns();
	while (now_ns() - a < ns) {
	}
}

static void spin(void) { busy(latency_ns); }

// wake_begin, at the start of a cudaMalloc, cudaFree or async form, waits
// out the planted wake-up if the driver has been idle long enough.
static void wake_begin(void) {
	if (wake_gap_ns >= 0 && last_end != 0 && now_ns() - last_end >= wake_gap_ns)
		busy(wake_extra_ns);
}

// wake_end, at its return, starts the idle time.
static int wake_end(int rc) {
	last_end = now_ns();
	return rc;
}

static int ret(int rc) {
	if (rc)
		last_error = rc;
	return rc;
}

#define ENTER(name)                     \
	init();                             \
	{                                   \
		int pc_ = planted(name);        \
		if (pc_)                        \
			return ret(pc_);            \
	}

// Device memory: anonymous mappings, never touched, at increasing
// addresses.
static uintptr_t next_device = 0x7e0000000000ull;

static size_t map_len(size_t size) { return (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1); }

static void *device_map(size_t size) {
	size_t len = map_len(size);
	if (nomap) {
		void *p = (void *)next_device;
		next_device += len;
		return p;
	}
	void *p = mmap((void *)next_device, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	next_device = (uintptr_t)p + len;
	return p;
}

static unsigned bucket(const void *p) { return (unsigned)(((uintptr_t)p >> 4) * 2654435761u) % NBUCKETS; }

static alloc *find(const void *p) {
	for (alloc *a = table[bucket(p)]; a; a = a->next)
		if (a->p == p)
			return a;
	return NULL;
}

static void insert(void *p, size_t size, int kind, pool *pl) {
	alloc *a = calloc(1, sizeof *a);
	a->p = p;
	a->size = size;
	a->kind = kind;
	a->pool = pl;
	unsigned b = bucket(p);
	a->next = table[b];
	table[b] = a;
	live_objects++;
}

static void removea(alloc *x) {
	alloc **pp = &table[bucket(x->p)];
	while (*pp != x)
		pp = &(*pp)->next;
	*pp = x->next;
	if (x->kind == KIND_VA || x->kind == KIND_MAPPED) {
		// Addresses alone: nothing mapped.
	} else if (x->kind == KIND_DEVICE || x->kind == KIND_ASYNC) {
		if (!nomap)
			munmap(x->p, map_len(x->size));
	}
	else
		free(x->p);
	free(x);
	live_objects--;
}

int fakecuda_live(void) { return live_objects; }

const char *cudaGetErrorName(int rc) {
	switch (rc) {
	case 0: return "cudaSuccess";
	case 1: return "cudaErrorInvalidValue";
	case 2: return "cudaErrorMemoryAllocation";
	case 3: return "cudaErrorInitializationError";
	case 100: return "cudaErrorNoDevice";
	case 400: return "cudaErrorInvalidResourceHandle";
	case 700: return "cudaErrorIllegalAddress";
	case 801: return "cudaErrorNotSupported";
	}
	return "cudaErrorUnknown";
}

const char *cudaGetErrorString(int rc) { return cudaGetErrorName(rc); }

int cudaGetLastError(void) {
	int e = last_error;
	last_error = 0;
	return e;
}

int cudaGetDevice(int *d) {
	ENTER("cudaGetDevice");
	*d = 0;
	return 0;
}

int cudaRuntimeGetVersion(int *v) {
	*v = 13000;
	return 0;
}

int cudaDriverGetVersion(int *v) {
	*v = 13000;
	return 0;
}

int cudaGetDeviceProperties_v2(void *props, int device) {
	ENTER("cudaGetDeviceProperties");
	if (device != 0)
		return ret(1);
	strcpy((char *)props, "Fake CUDA Device");
	return 0;
}

int cudaMemGetInfo(size_t *f, size_t *t) {
	ENTER("cudaMemGetInfo");
	*f = total - device_used;
	*t = total;
	return 0;
}

static int do_malloc(void **p, size_t size) {
	spin();
	if (!p)
		return ret(1);
	if (size == 0) {
		*p = NULL;
		return 0;
	}
	if (size > total - device_used)
		return ret(2);
	void *m = device_map(size);
	if (!m)
		return ret(2);
	insert(m, size, KIND_DEVICE, NULL);
	device_used += size;
	*p = m;
	return 0;
}

int cudaMalloc(void **p, size_t size) {
	ENTER("cudaMalloc");
	wake_begin();
	return wake_end(do_malloc(p, size));
}

static int do_free(void *p) {
	spin();
	if (!p)
		return 0;
	alloc *a = find(p);
	if (!a || (a->kind != KIND_DEVICE && a->kind != KIND_MANAGED))
		return ret(1);
	if (a->kind == KIND_DEVICE)
		device_used -= a->size;
	removea(a);
	return 0;
}

int cudaFree(void *p) {
	ENTER("cudaFree");
	wake_begin();
	return wake_end(do_free(p));
}

int cudaMallocHost(void **p, size_t size) {
	ENTER("cudaMallocHost");
	spin();
	void *m = malloc(size ? size : 1);
	if (!m)
		return ret(2);
	insert(m, size, KIND_HOST, NULL);
	*p = m;
	return 0;
}

int cudaFreeHost(void *p) {
	ENTER("cudaFreeHost");
	spin();
	if (!p)
		return 0;
	alloc *a = find(p);
	if (!a || a->kind != KIND_HOST)
		return ret(1);
	removea(a);
	return 0;
}

int cudaMallocManaged(void **p, size_t size, unsigned flags) {
	ENTER("cudaMallocManaged");
	spin();
	if (flags != 1 && flags != 2)
		return ret(1);
	void *m = malloc(size ? size : 1);
	if (!m)
		return ret(2);
	insert(m, size, KIND_MANAGED, NULL);
	*p = m;
	return 0;
}

typedef struct handle {
	int magic;
} handle;
#define STREAM_MAGIC 0x5354
#define EVENT_MAGIC 0x4556

static int valid(void *h, int magic) { return h == NULL || ((handle *)h)->magic == magic; }

// release gives back every pool's unused memory above its threshold, as a
// synchronization does.
static void release(pool *pl) {
	uint64_t keep = pl->used > pl->threshold ? pl->used : pl->threshold;
	if (pl->reserved > keep) {
		device_used -= pl->reserved - keep;
		pl->reserved = keep;
	}
}

#define MAXPOOLS 64
static pool *pools[MAXPOOLS];
static int npools;

static void release_all(void) {
	release(&default_pool);
	for (int i = 0; i < npools; i++)
		if (pools[i])
			release(pools[i]);
}

int cudaStreamCreateWithFlags(void **s, unsigned flags) {
	ENTER("cudaStreamCreateWithFlags");
	handle *h = calloc(1, sizeof *h);
	h->magic = STREAM_MAGIC;
	*s = h;
	live_objects++;
	return 0;
}

int cudaStreamDestroy(void *s) {
	ENTER("cudaStreamDestroy");
	if (!s || !valid(s, STREAM_MAGIC))
		return ret(400);
	((handle *)s)->magic = 0;
	free(s);
	live_objects--;
	return 0;
}

int cudaStreamSynchronize(void *s) {
	ENTER("cudaStreamSynchronize");
	if (!valid(s, STREAM_MAGIC))
		return ret(400);
	release_all();
	return 0;
}

int cudaDeviceSynchronize(void) {
	ENTER("cudaDeviceSynchronize");
	release_all();
	return 0;
}

int cudaEventCreateWithFlags(void **e, unsigned flags) {
	ENTER("cudaEventCreateWithFlags");
	handle *h = calloc(1, sizeof *h);
	h->magic = EVENT_MAGIC;
	*e = h;
	live_objects++;
	return 0;
}

int cudaEventDestroy(void *e) {
	ENTER("cudaEventDestroy");
	if (!e || !valid(e, EVENT_MAGIC))
		return ret(400);
	((handle *)e)->magic = 0;
	free(e);
	live_objects--;
	return 0;
}

int cudaEventRecord(void *e, void *s) {
	ENTER("cudaEventRecord");
	if (!e || !valid(e, EVENT_MAGIC) || !valid(s, STREAM_MAGIC))
		return ret(400);
	return 0;
}

int cudaStreamWaitEvent(void *s, void *e, unsigned flags) {
	ENTER("cudaStreamWaitEvent");
	if (!e || !valid(e, EVENT_MAGIC) || !valid(s, STREAM_MAGIC))
		return ret(400);
	return 0;
}

int cudaEventSynchronize(void *e) {
	ENTER("cudaEventSynchronize");
	if (!e || !valid(e, EVENT_MAGIC))
		return ret(400);
	release_all();
	return 0;
}

#ifndef FAKE_NO_ASYNC
static int pool_alloc(void **p, size_t size, pool *pl, void *s) {
	spin();
	if (!p || !valid(s, STREAM_MAGIC))
		return ret(1);
	if (size == 0) {
		*p = NULL;
		return 0;
	}
	uint64_t idle = pl->reserved - pl->used;
	if (size > idle) {
		uint64_t grow = size - idle;
		if (grow > total - device_used || (pl->max_size && pl->reserved + grow > pl->max_size))
			return ret(2);
		pl->reserved += grow;
		device_used += grow;
	}
	void *m = device_map(size);
	if (!m)
		return ret(2);
	pl->used += size;
	if (pl->used > pl->used_high)
		pl->used_high = pl->used;
	if (pl->reserved > pl->reserved_high)
		pl->reserved_high = pl->reserved;
	insert(m, size, KIND_ASYNC, pl);
	*p = m;
	return 0;
}

int cudaMallocAsync(void **p, size_t size, void *s) {
	ENTER("cudaMallocAsync");
	wake_begin();
	return wake_end(pool_alloc(p, size, &default_pool, s));
}

int cudaMallocFromPoolAsync(void **p, size_t size, void *pl, void *s) {
	ENTER("cudaMallocFromPoolAsync");
	if (!pl)
		return ret(1);
	wake_begin();
	return wake_end(pool_alloc(p, size, (pool *)pl, s));
}

static int do_free_async(void *p, void *s) {
	spin();
	if (!valid(s, STREAM_MAGIC))
		return ret(400);
	if (!p)
		return 0;
	alloc *a = find(p);
	if (!a || a->kind != KIND_ASYNC)
		return ret(1);
	a->pool->used -= a->size;
	removea(a);
	return 0;
}

int cudaFreeAsync(void *p, void *s) {
	ENTER("cudaFreeAsync");
	wake_begin();
	return wake_end(do_free_async(p, s));
}

int cudaDeviceGetDefaultMemPool(void **pl, int device) {
	ENTER("cudaDeviceGetDefaultMemPool");
	if (device != 0)
		return ret(1);
	*pl = &default_pool;
	return 0;
}

typedef struct {
	int allocType, handleTypes, locationType, locationId;
	void *win32;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} props_t;

int cudaMemPoolCreate(void **out, const props_t *props) {
	ENTER("cudaMemPoolCreate");
	if (sizeof(props_t) != 88 || props->allocType != 1 || props->locationType != 1 || props->locationId != 0 ||
	    npools == MAXPOOLS)
		return ret(1);
	pool *pl = calloc(1, sizeof *pl);
	pl->max_size = props->maxSize;
	pools[npools++] = pl;
	live_objects++;
	*out = pl;
	return 0;
}

int cudaMemPoolDestroy(void *p) {
	ENTER("cudaMemPoolDestroy");
	for (int i = 0; i < npools; i++) {
		if (pools[i] == p) {
			pool *pl = pools[i];
			// Like CUDA, a pool destroyed with allocations live is
			// reclaimed when they are freed; here they simply leak.
			device_used -= pl->reserved - pl->used;
			pools[i] = NULL;
			free(pl);
			live_objects--;
			return 0;
		}
	}
	return ret(400);
}

int cudaMemPoolSetAttribute(void *p, int attr, void *v) {
	ENTER("cudaMemPoolSetAttribute");
	pool *pl = p;
	uint64_t x = *(uint64_t *)v;
	switch (attr) {
	case 4: pl->threshold = x; return 0;
	case 6: if (x) return ret(1); pl->reserved_high = 0; return 0;
	case 8: if (x) return ret(1); pl->used_high = 0; return 0;
	}
	return ret(1);
}

int cudaMemPoolGetAttribute(void *p, int attr, void *v) {
	ENTER("cudaMemPoolGetAttribute");
	pool *pl = p;
	uint64_t *out = v;
	switch (attr) {
	case 4: *out = pl->threshold; return 0;
	case 5: *out = pl->reserved; return 0;
	case 6: *out = pl->reserved_high; return 0;
	case 7: *out = pl->used; return 0;
	case 8: *out = pl->used_high; return 0;
	}
	return ret(1);
}

int cudaMemPoolTrimTo(void *p, size_t keep) {
	ENTER("cudaMemPoolTrimTo");
	pool *pl = p;
	uint64_t k = pl->used > keep ? pl->used : keep;
	if (pl->reserved > k) {
		device_used -= pl->reserved - k;
		pl->reserved = k;
	}
	return 0;
}
#endif

#ifndef FAKE_NO_VMM
// The driver's virtual memory management.
#define VMM_PAGE (2ull << 20)

typedef struct vmhandle {
	uint64_t size;
	int maps; // live mappings of it
} vmhandle;

int cuGetErrorName(int rc, const char **s) {
	*s = cudaGetErrorName(rc);
	return 0;
}

int cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
	ENTER("cuMemGetAllocationGranularity");
	(void)prop;
	(void)option;
	*g = VMM_PAGE;
	return 0;
}

int cuMemAddressReserve(uint64_t *p, size_t size, size_t align, uint64_t addr, unsigned long long flags) {
	ENTER("cuMemAddressReserve");
	(void)align;
	(void)addr;
	(void)flags;
	if (size == 0 || size % VMM_PAGE)
		return ret(1);
	if (nomap) {
		*p = next_device;
		next_device += size;
	} else {
		// The range is mapped without access, so that the kernel places no
		// later device allocation inside it: a hint past the end of the
		// address space (many large reservations) is not kept.
		void *v = mmap((void *)next_device, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (v == MAP_FAILED)
			return ret(2);
		*p = (uint64_t)(uintptr_t)v;
		next_device = (uintptr_t)v + size;
	}
	insert((void *)*p, size, KIND_VA, NULL);
	return 0;
}

// va_of returns the reserved range holding [p, p+size), or NULL.
static alloc *va_of(uint64_t p, uint64_t size) {
	for (int b = 0; b < NBUCKETS; b++)
		for (alloc *a = table[b]; a; a = a->next)
			if (a->kind == KIND_VA && (uint64_t)(uintptr_t)a->p <= p && p + size <= (uint64_t)(uintptr_t)a->p + a->size)
				return a;
	return NULL;
}

// mapped_in returns whether any page of [p, p+size) is mapped.
static int mapped_in(uint64_t p, uint64_t size) {
	for (int b = 0; b < NBUCKETS; b++)
		for (alloc *a = table[b]; a; a = a->next) {
			uint64_t q = (uint64_t)(uintptr_t)a->p;
			if (a->kind == KIND_MAPPED && q < p + size && p < q + a->size)
				return 1;
		}
	return 0;
}

int cuMemAddressFree(uint64_t p, size_t size) {
	ENTER("cuMemAddressFree");
	alloc *a = find((void *)p);
	if (!a || a->kind != KIND_VA || a->size != size || mapped_in(p, size))
		return ret(1);
	removea(a);
	if (!nomap)
		munmap((void *)p, size);
	return 0;
}

int cuMemCreate(uint64_t *h, size_t size, const void *prop, unsigned long long flags) {
	ENTER("cuMemCreate");
	(void)prop;
	(void)flags;
	spin();
	if (size == 0 || size % VMM_PAGE)
		return ret(1);
	if (size > total - device_used)
		return ret(2);
	vmhandle *x = calloc(1, sizeof *x);
	x->size = size;
	device_used += size;
	live_objects++;
	*h = (uint64_t)(uintptr_t)x;
	return 0;
}

int cuMemRelease(uint64_t h) {
	ENTER("cuMemRelease");
	vmhandle *x = (vmhandle *)(uintptr_t)h;
	if (!x || x->maps)
		return ret(1);
	device_used -= x->size;
	live_objects--;
	free(x);
	return 0;
}

int cuMemMap(uint64_t p, size_t size, size_t offset, uint64_t h, unsigned long long flags) {
	ENTER("cuMemMap");
	(void)flags;
	vmhandle *x = (vmhandle *)(uintptr_t)h;
	if (!x || offset != 0 || size != x->size || p % VMM_PAGE || !va_of(p, size) || mapped_in(p, size))
		return ret(1);
	x->maps++;
	insert((void *)p, size, KIND_MAPPED, (pool *)x);
	return 0;
}

int cuMemSetAccess(uint64_t p, size_t size, const void *desc, size_t count) {
	ENTER("cuMemSetAccess");
	(void)desc;
	if (count != 1 || !va_of(p, size))
		return ret(1);
	for (uint64_t q = p; q < p + size; q += VMM_PAGE) {
		alloc *a = find((void *)q);
		if (!a || a->kind != KIND_MAPPED)
			return ret(1);
		q += a->size - VMM_PAGE;
	}
	return 0;
}

int cuMemUnmap(uint64_t p, size_t size) {
	ENTER("cuMemUnmap");
	alloc *a = find((void *)p);
	if (!a || a->kind != KIND_MAPPED || a->size != size)
		return ret(1);
	((vmhandle *)a->pool)->maps--;
	removea(a);
	return 0;
}
#endif
