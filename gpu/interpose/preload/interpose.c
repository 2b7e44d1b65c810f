// interpose.c is the LD_PRELOAD library that `record run` injects into a
// program to record its CUDA allocation calls. Build:
//
//	cc -O2 -shared -fPIC -o librecord-interpose.so interpose.c -ldl -lpthread
//
// (-O2 matters: dlsym below must reach the real dlsym as a sibling call.)
//
// What it sees. It defines the CUDA runtime's allocation and sync functions
// (cudaMalloc, cudaFree, ...) and those of CUDA graph capture
// (cudaStreamBeginCapture, cudaStreamEndCapture, cudaGraphDestroy) so that a program linking the runtime
// dynamically (PyTorch) calls them here first; it also defines dlsym, so
// that a runtime linked statically (nvcc's default), which reaches the
// driver only through dlsym("cuGetProcAddress_v2") and then the driver's
// own table, gets wrappers for cuGetProcAddress and, through them, for
// cuMemAlloc, cuMemFree, ... Every wrapper forwards the call unchanged and
// returns the real return code. A per-thread depth counter records each
// call once: a runtime call that reaches the driver is recorded as the
// runtime call only, and an intercepted function calling another
// intercepted one is recorded at the outer call.
//
// Where it writes. With ALLOCSIM_RECORD_DIR set, each process image (a
// process, a forked child, the image after an exec) that makes at least one
// recorded call writes DIR/PID.START.raw: a 4096-byte header page and then
// fixed 64-byte records, written through a shared file mapping. A thread
// reserves a record with one atomic add, fills it and stores its api field
// last; so records reach the page cache as they are made, and nothing that
// completed is lost when the program exits from any thread, calls _exit or
// dies on a signal. A record whose api is 0 was never completed (or is the
// preallocated tail) and is skipped by the reader. At exit the process's
// /proc/self/maps is copied to DIR/PID.START.raw.maps so that call sites
// can be named by module and offset. Without ALLOCSIM_RECORD_DIR it only
// forwards.
//
// The record layout, the header layout and the api numbers are read by
// gpu/interpose (raw.go); keep them in step.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define RA() ((uint64_t)(uintptr_t)__builtin_return_address(0))

// The api numbers of records. Runtime calls 1..19, driver calls 21..39 and
// 42.. (40 and 41 are the entry-point queries).
enum {
	A_NONE = 0,
	A_cudaMalloc = 1,
	A_cudaFree = 2,
	A_cudaMallocAsync = 3,
	A_cudaMallocFromPoolAsync = 4,
	A_cudaFreeAsync = 5,
	A_cudaMallocHost = 6,
	A_cudaHostAlloc = 7,
	A_cudaFreeHost = 8,
	A_cudaMallocManaged = 9,
	A_cudaStreamSynchronize = 10,
	A_cudaDeviceSynchronize = 11,
	A_cudaEventRecord = 12,
	A_cudaStreamWaitEvent = 13,
	A_cudaEventSynchronize = 14,
	A_cudaEventRecordWithFlags = 15,
	A_cudaMemPoolTrimTo = 16,
	// CUDA graph capture: a stream's capture begun and ended (the graph
	// made), a graph destroyed.
	A_cudaStreamBeginCapture = 17,
	A_cudaStreamEndCapture = 18,
	A_cudaGraphDestroy = 19,
	A_cuMemAlloc = 21,
	A_cuMemFree = 22,
	A_cuMemAllocAsync = 23,
	A_cuMemAllocFromPoolAsync = 24,
	A_cuMemFreeAsync = 25,
	A_cuMemAllocHost = 26,
	A_cuMemHostAlloc = 27,
	A_cuMemFreeHost = 28,
	A_cuMemAllocManaged = 29,
	A_cuStreamSynchronize = 30,
	A_cuCtxSynchronize = 31,
	A_cuEventRecord = 32,
	A_cuStreamWaitEvent = 33,
	A_cuEventSynchronize = 34,
	A_cuEventRecordWithFlags = 35,
	// The virtual memory management API: a range reserved, physical
	// memory created, mapped into the range, unmapped, released.
	A_cuMemAddressReserve = 36,
	A_cuMemAddressFree = 37,
	A_cuMemCreate = 38,
	A_cuMemRelease = 39,
	// Not recorded: the driver's entry-point query, wrapped to hand out
	// wrappers.
	A_cuGetProcAddress = 40,
	A_cuGetProcAddress_v2 = 41,
	A_cuMemMap = 42,
	A_cuMemUnmap = 43,
	A_cuMemPoolTrimTo = 44,
	A_cuMemSetAccess = 45,
	A_cuStreamBeginCapture = 46,
	A_cuStreamEndCapture = 47,
	A_cuGraphDestroy = 48,
	NAPI
};

// Record flags.
#define F_PTSZ 1 // the per-thread default stream variant (stream 0 is per thread)

// rec is one recorded call: 64 bytes, little endian as the host.
struct rec {
	_Atomic uint32_t api; // stored last; 0: not completed
	int32_t rc;           // the call's return code
	uint32_t tid;         // kernel thread id
	uint32_t flags;       // F_*
	int64_t t;            // CLOCK_MONOTONIC nanoseconds
	uint64_t addr;        // pointer allocated or freed; the CUDA event
	uint64_t size;        // requested bytes
	uint64_t stream;      // CUDA stream handle
	uint64_t aux;         // flags argument, or the memory pool
	uint64_t caller;      // return address of the intercepted call
};
_Static_assert(sizeof(struct rec) == 64, "record size");

#define HDR_BYTES 4096
#define CHUNK_BYTES (4u << 20)
#define CHUNK_RECS (CHUNK_BYTES / sizeof(struct rec))
#define MAXCHUNKS 16384 // 1 Gi records

// filehdr is the first page of a raw file.
struct filehdr {
	char magic[8];         // "ALLOCREC"
	uint32_t version;      // 1
	uint32_t recsize;      // sizeof(struct rec)
	uint32_t pid, ppid;    //
	int64_t start_mono;    // image start (or fork), CLOCK_MONOTONIC ns
	int64_t start_real;    // the same instant, CLOCK_REALTIME ns
	_Atomic uint64_t dropped;   // records lost (no space)
	_Atomic uint64_t unwrapped; // entry points handed out unwrapped (slots full)
	uint32_t chunk_bytes;  // records are preallocated in chunks of this size
	uint32_t cmdline_len;  // bytes of cmdline used
	// offset 64: the launcher's environment, as torchrun and its kind set
	// it for each process (0: unset, else the value plus 1).
	uint32_t rank1, local_rank1, world_size1;
	char visible_devices[128]; // CUDA_VISIBLE_DEVICES, NUL-terminated
	char pad[512 - 64 - 12 - 128];
	char exe[512];         // offset 512: readlink(/proc/self/exe)
	char cmdline[HDR_BYTES - 1024]; // offset 1024: NUL-separated argv
};
_Static_assert(sizeof(struct filehdr) == HDR_BYTES, "header size");
_Static_assert(offsetof(struct filehdr, exe) == 512, "exe offset");

// Process state, reset in a forked child.
static int g_enabled;     // ALLOCSIM_RECORD_DIR is set
static char g_dir[PATH_MAX];
static char g_path[PATH_MAX + 64];
static int g_fd = -1;
static int g_failed;      // the file could not be created or grown
static struct filehdr *g_hdr;
static _Atomic uint64_t g_next;
static _Atomic(struct rec *) g_chunks[MAXCHUNKS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_start_mono, g_start_real;
static _Atomic uint64_t g_dropped_early;

static TLS int t_depth;
static TLS uint32_t t_tid;

static void *(*real_dlsym)(void *, const char *);

static int64_t clock_ns(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t tid(void) {
	if (!t_tid)
		t_tid = (uint32_t)syscall(SYS_gettid);
	return t_tid;
}

static void say(const char *msg) {
	ssize_t n = write(2, msg, strlen(msg));
	(void)n;
}

// read_file reads up to cap bytes of path into buf and returns the count.
static size_t read_file(const char *path, char *buf, size_t cap) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	size_t n = 0;
	while (n < cap) {
		ssize_t k = read(fd, buf + n, cap - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	return n;
}

// env_count1 returns the environment variable name read as a count (a
// decimal number below 2^31) plus 1, or 0 when it is unset or not one.
static uint32_t env_count1(const char *name) {
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	uint64_t n = 0;
	for (const char *c = v; *c; c++) {
		if (*c < '0' || *c > '9' || n >= (1u << 31) / 10)
			return 0;
		n = n * 10 + (uint64_t)(*c - '0');
	}
	return n < (1u << 31) ? (uint32_t)n + 1 : 0;
}

// open_file creates this image's raw file and maps its header. Called with
// g_mu held.
static int open_file(void) {
	for (int try = 0; try < 100; try++) {
		snprintf(g_path, sizeof g_path, "%s/%d.%lld.raw", g_dir, (int)getpid(), (long long)g_start_mono + try);
		g_fd = open(g_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (g_fd >= 0 || errno != EEXIST)
			break;
	}
	if (g_fd < 0)
		return -1;
	if (posix_fallocate(g_fd, 0, HDR_BYTES) != 0)
		return -1;
	void *h = mmap(NULL, HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, 0);
	if (h == MAP_FAILED)
		return -1;
	g_hdr = h;
	g_hdr->version = 1;
	g_hdr->recsize = sizeof(struct rec);
	g_hdr->pid = (uint32_t)getpid();
	g_hdr->ppid = (uint32_t)getppid();
	g_hdr->start_mono = g_start_mono;
	g_hdr->start_real = g_start_real;
	g_hdr->chunk_bytes = CHUNK_BYTES;
	atomic_store(&g_hdr->dropped, atomic_load(&g_dropped_early));
	ssize_t n = readlink("/proc/self/exe", g_hdr->exe, sizeof g_hdr->exe - 1);
	if (n < 0)
		n = 0;
	g_hdr->exe[n] = 0;
	g_hdr->cmdline_len = (uint32_t)read_file("/proc/self/cmdline", g_hdr->cmdline, sizeof g_hdr->cmdline);
	g_hdr->rank1 = env_count1("RANK");
	g_hdr->local_rank1 = env_count1("LOCAL_RANK");
	g_hdr->world_size1 = env_count1("WORLD_SIZE");
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	if (vis)
		snprintf(g_hdr->visible_devices, sizeof g_hdr->visible_devices, "%s", vis);
	memcpy(g_hdr->magic, "ALLOCREC", 8);
	return 0;
}

// map_chunk maps chunk c of the records, creating the file first if needed.
static struct rec *map_chunk(uint64_t c) {
	struct rec *base = NULL;
	pthread_mutex_lock(&g_mu);
	base = atomic_load_explicit(&g_chunks[c], memory_order_acquire);
	if (base || g_failed)
		goto out;
	if (g_fd < 0 && open_file() != 0)
		goto fail;
	off_t off = HDR_BYTES + (off_t)c * CHUNK_BYTES;
	// Reserve the blocks now: a write through the mapping to a hole that
	// the disk cannot fill would kill the program with SIGBUS.
	if (posix_fallocate(g_fd, off, CHUNK_BYTES) != 0)
		goto fail;
	void *p = mmap(NULL, CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, off);
	if (p == MAP_FAILED)
		goto fail;
	base = p;
	atomic_store_explicit(&g_chunks[c], base, memory_order_release);
	goto out;
fail:
	g_failed = 1;
	say("allocsim interposer: cannot write the trace; recording stops here\n");
out:
	pthread_mutex_unlock(&g_mu);
	return base;
}

static void drop(void) {
	if (g_hdr)
		atomic_fetch_add(&g_hdr->dropped, 1);
	else
		atomic_fetch_add(&g_dropped_early, 1);
}

// reserve returns the next record slot with its time set, or NULL when not
// recording.
static struct rec *reserve(void) {
	if (!g_enabled)
		return NULL;
	uint64_t i = atomic_fetch_add_explicit(&g_next, 1, memory_order_relaxed);
	uint64_t c = i / CHUNK_RECS;
	if (c >= MAXCHUNKS) {
		drop();
		return NULL;
	}
	struct rec *base = atomic_load_explicit(&g_chunks[c], memory_order_acquire);
	if (!base && !(base = map_chunk(c))) {
		drop();
		return NULL;
	}
	struct rec *r = &base[i % CHUNK_RECS];
	r->t = clock_ns(CLOCK_MONOTONIC);
	return r;
}

static void commit(struct rec *r, uint32_t api, int rc, uint64_t addr, uint64_t size, uint64_t stream,
                   uint64_t aux, uint64_t caller, uint32_t flags) {
	if (!r)
		return;
	r->rc = rc;
	r->tid = tid();
	r->flags = flags;
	r->addr = addr;
	r->size = size;
	r->stream = stream;
	r->aux = aux;
	r->caller = caller;
	atomic_store_explicit(&r->api, api, memory_order_release);
}

// ---- finding the real functions ----

static void init_dlsym(void) {
	if (real_dlsym)
		return;
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
	for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !real_dlsym; i++)
		real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	if (!real_dlsym) {
		say("allocsim interposer: cannot find the real dlsym\n");
		abort();
	}
}

// slot is one (real function, wrapper) pair. Slot 0 of an api is its
// exported symbol, whose real function is found by name on first use;
// slots 1.. are handed out by dlsym and cuGetProcAddress, one per distinct
// real function.
#define NSLOT 4
struct slot {
	_Atomic(void *) real;
	uint32_t flags;
};
static struct slot g_slots[NAPI][NSLOT];
static void *const g_wraps[NAPI][NSLOT];
static const char *const g_export[NAPI];
static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;

struct find_ctx {
	const char *sym;
	void *fn;
};

// find_in_cudart looks sym up in a loaded libcudart, for a runtime that the
// program loaded privately (RTLD_LOCAL), which RTLD_NEXT does not see.
static int find_in_cudart(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	struct find_ctx *fc = data;
	const char *base = strrchr(info->dlpi_name, '/');
	base = base ? base + 1 : info->dlpi_name;
	if (strncmp(base, "libcudart.so", 12) != 0)
		return 0;
	void *h = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
	if (!h)
		return 0;
	fc->fn = real_dlsym(h, fc->sym);
	dlclose(h);
	return fc->fn != NULL;
}

static void *resolve_export(int api) {
	init_dlsym();
	const char *sym = g_export[api];
	void *fn = real_dlsym(RTLD_NEXT, sym);
	if (!fn && api < A_cuMemAlloc) {
		const char *path = getenv("ALLOCSIM_RECORD_CUDART");
		if (path && *path) {
			void *h = dlopen(path, RTLD_NOLOAD | RTLD_LAZY);
			if (!h)
				h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
			if (h)
				fn = real_dlsym(h, sym);
		}
		if (!fn) {
			struct find_ctx fc = {sym, NULL};
			dl_iterate_phdr(find_in_cudart, &fc);
			fn = fc.fn;
		}
	}
	if (!fn && api >= A_cuMemAlloc) {
		void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
		if (h)
			fn = real_dlsym(h, sym);
	}
	if (!fn) {
		char msg[256];
		snprintf(msg, sizeof msg, "allocsim interposer: %s not found in a loaded CUDA library%s\n", sym,
		         api < A_cuMemAlloc ? " (record run --cudart PATH names the runtime)" : "");
		say(msg);
		return NULL;
	}
	atomic_store_explicit(&g_slots[api][0].real, fn, memory_order_release);
	return fn;
}

static inline void *real_of(int api, int k, uint32_t *flags) {
	void *fn = atomic_load_explicit(&g_slots[api][k].real, memory_order_acquire);
	*flags = g_slots[api][k].flags;
	if (!fn && k == 0)
		fn = resolve_export(api);
	return fn;
}

// wrap returns the wrapper that forwards to real, claiming a slot for it;
// real itself when it is one of the wrappers or no slot is left.
static void *wrap(int api, void *real, uint32_t flags) {
	if (!real)
		return real;
	for (int k = 0; k < NSLOT; k++)
		if (g_wraps[api][k] == real)
			return real;
	void *w = NULL;
	pthread_mutex_lock(&g_slot_mu);
	for (int k = 1; k < NSLOT; k++) {
		void *cur = atomic_load(&g_slots[api][k].real);
		if (cur == real) {
			w = g_wraps[api][k];
			break;
		}
		if (!cur) {
			g_slots[api][k].flags = flags;
			atomic_store_explicit(&g_slots[api][k].real, real, memory_order_release);
			w = g_wraps[api][k];
			break;
		}
	}
	pthread_mutex_unlock(&g_slot_mu);
	if (!w) {
		if (g_hdr)
			atomic_fetch_add(&g_hdr->unwrapped, 1);
		return real;
	}
	return w;
}

// ---- wrapper bodies, one per signature ----

#define NOTFOUND 999 // cudaErrorUnknown, CUDA_ERROR_UNKNOWN
#define U(p) ((uint64_t)(uintptr_t)(p))

// A malloc records after the call (its pointer is known then); a free
// reserves its record before the call, so that a free always comes before
// a malloc in another thread that gets the same address back.
#define PROLOGUE(T, ...)                             \
	uint32_t fl;                                     \
	T real = (T)real_of(api, k, &fl);                \
	if (!real)                                       \
		return NOTFOUND;                             \
	if (t_depth)                                     \
		return real(__VA_ARGS__);                    \
	t_depth++;

typedef int (*fn_m2)(void **, size_t);
static int body_m2(int api, int k, uint64_t ra, void **p, size_t n) {
	PROLOGUE(fn_m2, p, n)
	int rc = real(p, n);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && p ? U(*p) : 0, n, 0, 0, ra, fl);
	return rc;
}

typedef int (*fn_m3)(void **, size_t, unsigned);
static int body_m3(int api, int k, uint64_t ra, void **p, size_t n, unsigned f) {
	PROLOGUE(fn_m3, p, n, f)
	int rc = real(p, n, f);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && p ? U(*p) : 0, n, 0, f, ra, fl);
	return rc;
}

typedef int (*fn_ma)(void **, size_t, void *);
static int body_ma(int api, int k, uint64_t ra, void **p, size_t n, void *s) {
	PROLOGUE(fn_ma, p, n, s)
	int rc = real(p, n, s);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && p ? U(*p) : 0, n, U(s), 0, ra, fl);
	return rc;
}

typedef int (*fn_mp)(void **, size_t, void *, void *);
static int body_mp(int api, int k, uint64_t ra, void **p, size_t n, void *pool, void *s) {
	PROLOGUE(fn_mp, p, n, pool, s)
	int rc = real(p, n, pool, s);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && p ? U(*p) : 0, n, U(s), U(pool), ra, fl);
	return rc;
}

typedef int (*fn_f1)(void *);
static int body_f1(int api, int k, uint64_t ra, void *a) {
	PROLOGUE(fn_f1, a)
	struct rec *r = reserve();
	int rc = real(a);
	t_depth--;
	commit(r, api, rc, U(a), 0, 0, 0, ra, fl);
	return rc;
}

typedef int (*fn_fa)(void *, void *);
static int body_fa(int api, int k, uint64_t ra, void *a, void *s) {
	PROLOGUE(fn_fa, a, s)
	struct rec *r = reserve();
	int rc = real(a, s);
	t_depth--;
	commit(r, api, rc, U(a), 0, U(s), 0, ra, fl);
	return rc;
}

// Synchronizations record after the call: the point where the host knows
// the work is done.
typedef int (*fn_s1)(void *);
static int body_s1(int api, int k, uint64_t ra, void *s) {
	PROLOGUE(fn_s1, s)
	int rc = real(s);
	t_depth--;
	commit(reserve(), api, rc, 0, 0, U(s), 0, ra, fl);
	return rc;
}

// s0 is a device synchronize. It forwards one register argument, so that
// a versioned driver entry point taking a context gets it unchanged.
static int body_s0(int api, int k, uint64_t ra, void *a) {
	PROLOGUE(fn_s1, a)
	int rc = real(a);
	t_depth--;
	commit(reserve(), api, rc, 0, 0, 0, 0, ra, fl);
	return rc;
}

typedef int (*fn_er)(void *, void *);
static int body_er(int api, int k, uint64_t ra, void *e, void *s) {
	PROLOGUE(fn_er, e, s)
	int rc = real(e, s);
	t_depth--;
	commit(reserve(), api, rc, U(e), 0, U(s), 0, ra, fl);
	return rc;
}

typedef int (*fn_erf)(void *, void *, unsigned);
static int body_erf(int api, int k, uint64_t ra, void *e, void *s, unsigned f) {
	PROLOGUE(fn_erf, e, s, f)
	int rc = real(e, s, f);
	t_depth--;
	commit(reserve(), api, rc, U(e), 0, U(s), f, ra, fl);
	return rc;
}

typedef int (*fn_swe)(void *, void *, unsigned);
static int body_swe(int api, int k, uint64_t ra, void *s, void *e, unsigned f) {
	PROLOGUE(fn_swe, s, e, f)
	int rc = real(s, e, f);
	t_depth--;
	commit(reserve(), api, rc, U(e), 0, U(s), f, ra, fl);
	return rc;
}

typedef int (*fn_es)(void *);
static int body_es(int api, int k, uint64_t ra, void *e) {
	PROLOGUE(fn_es, e)
	int rc = real(e);
	t_depth--;
	commit(reserve(), api, rc, U(e), 0, 0, 0, ra, fl);
	return rc;
}

// The virtual memory management calls. A reserve, create or map records
// after the call, an unmap, release or address free before it (as a
// malloc and a free do).
typedef int (*fn_ar)(uint64_t *, size_t, size_t, uint64_t, unsigned long long);
static int body_ar(int api, int k, uint64_t ra, uint64_t *p, size_t n, size_t al, uint64_t a,
                   unsigned long long f) {
	PROLOGUE(fn_ar, p, n, al, a, f)
	int rc = real(p, n, al, a, f);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && p ? *p : 0, n, 0, a, ra, fl);
	return rc;
}

// af is cuMemAddressFree and cuMemUnmap: an address and a size.
typedef int (*fn_af)(uint64_t, size_t);
static int body_af(int api, int k, uint64_t ra, uint64_t a, size_t n) {
	PROLOGUE(fn_af, a, n)
	struct rec *r = reserve();
	int rc = real(a, n);
	t_depth--;
	commit(r, api, rc, a, n, 0, 0, ra, fl);
	return rc;
}

// mc is cuMemCreate: the handle goes in addr.
typedef int (*fn_mc)(uint64_t *, size_t, const void *, unsigned long long);
static int body_mc(int api, int k, uint64_t ra, uint64_t *h, size_t n, const void *prop, unsigned long long f) {
	PROLOGUE(fn_mc, h, n, prop, f)
	int rc = real(h, n, prop, f);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && h ? *h : 0, n, 0, f, ra, fl);
	return rc;
}

typedef int (*fn_rl)(uint64_t);
static int body_rl(int api, int k, uint64_t ra, uint64_t h) {
	PROLOGUE(fn_rl, h)
	struct rec *r = reserve();
	int rc = real(h);
	t_depth--;
	commit(r, api, rc, h, 0, 0, 0, ra, fl);
	return rc;
}

// mm is cuMemMap: the range's address and size, the handle in aux.
typedef int (*fn_mm)(uint64_t, size_t, size_t, uint64_t, unsigned long long);
static int body_mm(int api, int k, uint64_t ra, uint64_t a, size_t n, size_t off, uint64_t h,
                   unsigned long long f) {
	PROLOGUE(fn_mm, a, n, off, h, f)
	int rc = real(a, n, off, h, f);
	t_depth--;
	commit(reserve(), api, rc, a, n, 0, h, ra, fl);
	return rc;
}

// sa is cuMemSetAccess: a range made accessible, once per map of PyTorch's
// expandable segments (over the pages of one map).
typedef int (*fn_sa)(uint64_t, size_t, const void *, size_t);
static int body_sa(int api, int k, uint64_t ra, uint64_t a, size_t n, const void *desc, size_t count) {
	PROLOGUE(fn_sa, a, n, desc, count)
	int rc = real(a, n, desc, count);
	t_depth--;
	commit(reserve(), api, rc, a, n, 0, count, ra, fl);
	return rc;
}

// pt is cudaMemPoolTrimTo and cuMemPoolTrimTo: the pool in addr, the
// bytes to keep in size.
typedef int (*fn_pt)(void *, size_t);
static int body_pt(int api, int k, uint64_t ra, void *pool, size_t keep) {
	PROLOGUE(fn_pt, pool, keep)
	int rc = real(pool, keep);
	t_depth--;
	commit(reserve(), api, rc, U(pool), keep, 0, 0, ra, fl);
	return rc;
}

// bc is a capture begun on a stream, in a mode (in aux).
typedef int (*fn_bc)(void *, int);
static int body_bc(int api, int k, uint64_t ra, void *s, int mode) {
	PROLOGUE(fn_bc, s, mode)
	int rc = real(s, mode);
	t_depth--;
	commit(reserve(), api, rc, 0, 0, U(s), (uint64_t)(unsigned)mode, ra, fl);
	return rc;
}

// ec is a capture ended: the graph made goes in addr.
typedef int (*fn_ec)(void *, void **);
static int body_ec(int api, int k, uint64_t ra, void *s, void **g) {
	PROLOGUE(fn_ec, s, g)
	int rc = real(s, g);
	t_depth--;
	commit(reserve(), api, rc, rc == 0 && g ? U(*g) : 0, 0, U(s), 0, ra, fl);
	return rc;
}

// ---- cuGetProcAddress ----

#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

// proc_api maps a cuGetProcAddress name (the base name, versioned by
// cudaVersion) to the api to wrap it as, or A_NONE.
static int proc_api(const char *s, int ver) {
	static const struct {
		const char *name;
		int api, minver;
	} t[] = {
	    {"cuMemAlloc", A_cuMemAlloc, 3020},
	    {"cuMemFree", A_cuMemFree, 3020},
	    {"cuMemAllocHost", A_cuMemAllocHost, 3020},
	    {"cuMemHostAlloc", A_cuMemHostAlloc, 0},
	    {"cuMemFreeHost", A_cuMemFreeHost, 0},
	    {"cuMemAllocManaged", A_cuMemAllocManaged, 0},
	    {"cuMemAllocAsync", A_cuMemAllocAsync, 0},
	    {"cuMemAllocFromPoolAsync", A_cuMemAllocFromPoolAsync, 0},
	    {"cuMemFreeAsync", A_cuMemFreeAsync, 0},
	    {"cuStreamSynchronize", A_cuStreamSynchronize, 0},
	    {"cuCtxSynchronize", A_cuCtxSynchronize, 0},
	    {"cuEventRecord", A_cuEventRecord, 0},
	    {"cuEventRecordWithFlags", A_cuEventRecordWithFlags, 0},
	    {"cuStreamWaitEvent", A_cuStreamWaitEvent, 0},
	    {"cuEventSynchronize", A_cuEventSynchronize, 0},
	    {"cuMemAddressReserve", A_cuMemAddressReserve, 0},
	    {"cuMemAddressFree", A_cuMemAddressFree, 0},
	    {"cuMemCreate", A_cuMemCreate, 0},
	    {"cuMemRelease", A_cuMemRelease, 0},
	    {"cuMemMap", A_cuMemMap, 0},
	    {"cuMemUnmap", A_cuMemUnmap, 0},
	    {"cuMemPoolTrimTo", A_cuMemPoolTrimTo, 0},
	    {"cuMemSetAccess", A_cuMemSetAccess, 0},
	    // Version 1 of cuStreamBeginCapture takes no mode.
	    {"cuStreamBeginCapture", A_cuStreamBeginCapture, 10010},
	    {"cuStreamEndCapture", A_cuStreamEndCapture, 0},
	    {"cuGraphDestroy", A_cuGraphDestroy, 0},
	};
	if (s[0] != 'c' || s[1] != 'u')
		return A_NONE;
	if (strcmp(s, "cuGetProcAddress") == 0)
		return ver >= 12000 ? A_cuGetProcAddress_v2 : A_cuGetProcAddress;
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		if (strcmp(s, t[i].name) == 0)
			return ver >= t[i].minver ? t[i].api : A_NONE;
	return A_NONE;
}

// debug_lookup prints an entry-point lookup when ALLOCSIM_RECORD_DEBUG is
// set: how a program reaches the driver, for finding what it calls.
static void debug_lookup(const char *how, const char *sym, int api) {
	static int on = -1;
	if (on < 0)
		on = getenv("ALLOCSIM_RECORD_DEBUG") != NULL;
	if (!on)
		return;
	char msg[160];
	snprintf(msg, sizeof msg, "allocsim interposer: %s %s%s\n", how, sym, api != A_NONE ? " (wrapped)" : "");
	say(msg);
}

static void wrap_proc(const char *sym, void **pfn, int ver, uint64_t flags) {
	if (!sym || !pfn || !*pfn)
		return;
	int api = proc_api(sym, ver);
	debug_lookup("cuGetProcAddress", sym, api);
	if (api != A_NONE)
		*pfn = wrap(api, *pfn, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? F_PTSZ : 0);
}

typedef int (*fn_gp4)(const char *, void **, int, uint64_t);
static int body_gp4(int api, int k, uint64_t ra, const char *sym, void **pfn, int ver, uint64_t flags) {
	(void)ra;
	uint32_t fl;
	fn_gp4 real = (fn_gp4)real_of(api, k, &fl);
	if (!real)
		return NOTFOUND;
	int rc = real(sym, pfn, ver, flags);
	if (rc == 0)
		wrap_proc(sym, pfn, ver, flags);
	return rc;
}

typedef int (*fn_gp5)(const char *, void **, int, uint64_t, void *);
static int body_gp5(int api, int k, uint64_t ra, const char *sym, void **pfn, int ver, uint64_t flags,
                    void *status) {
	(void)ra;
	uint32_t fl;
	fn_gp5 real = (fn_gp5)real_of(api, k, &fl);
	if (!real)
		return NOTFOUND;
	int rc = real(sym, pfn, ver, flags, status);
	if (rc == 0)
		wrap_proc(sym, pfn, ver, flags);
	return rc;
}

// ---- the wrappers ----
//
// W(shape, api, exported name) defines the exported function (slot 0) and
// the slot 1..3 wrappers of api.

#define P_m2 (void **p, size_t n)
#define C_m2 p, n
#define P_m3 (void **p, size_t n, unsigned f)
#define C_m3 p, n, f
#define P_ma (void **p, size_t n, void *s)
#define C_ma p, n, s
#define P_mp (void **p, size_t n, void *pool, void *s)
#define C_mp p, n, pool, s
#define P_f1 (void *a)
#define C_f1 a
#define P_fa (void *a, void *s)
#define C_fa a, s
#define P_s1 (void *s)
#define C_s1 s
#define P_s0 (void *a)
#define C_s0 a
#define P_er (void *e, void *s)
#define C_er e, s
#define P_erf (void *e, void *s, unsigned f)
#define C_erf e, s, f
#define P_swe (void *s, void *e, unsigned f)
#define C_swe s, e, f
#define P_es (void *e)
#define C_es e
#define P_ar (uint64_t *p, size_t n, size_t al, uint64_t a, unsigned long long f)
#define C_ar p, n, al, a, f
#define P_af (uint64_t a, size_t n)
#define C_af a, n
#define P_mc (uint64_t *h, size_t n, const void *prop, unsigned long long f)
#define C_mc h, n, prop, f
#define P_rl (uint64_t h)
#define C_rl h
#define P_mm (uint64_t a, size_t n, size_t off, uint64_t h, unsigned long long f)
#define C_mm a, n, off, h, f
#define P_sa (uint64_t a, size_t n, const void *desc, size_t count)
#define C_sa a, n, desc, count
#define P_pt (void *pool, size_t keep)
#define C_pt pool, keep
#define P_bc (void *s, int mode)
#define C_bc s, mode
#define P_ec (void *s, void **g)
#define C_ec s, g
#define P_gp4 (const char *sym, void **pfn, int ver, uint64_t flags)
#define C_gp4 sym, pfn, ver, flags
#define P_gp5 (const char *sym, void **pfn, int ver, uint64_t flags, void *status)
#define C_gp5 sym, pfn, ver, flags, status

#define W(SH, API, EXP)                                                                         \
	EXPORT int EXP P_##SH { return body_##SH(A_##API, 0, RA(), C_##SH); }                      \
	static int API##_1 P_##SH { return body_##SH(A_##API, 1, RA(), C_##SH); }                  \
	static int API##_2 P_##SH { return body_##SH(A_##API, 2, RA(), C_##SH); }                  \
	static int API##_3 P_##SH { return body_##SH(A_##API, 3, RA(), C_##SH); }

#define APIS(X)                                                      \
	X(m2, cudaMalloc, cudaMalloc)                                    \
	X(f1, cudaFree, cudaFree)                                        \
	X(ma, cudaMallocAsync, cudaMallocAsync)                          \
	X(mp, cudaMallocFromPoolAsync, cudaMallocFromPoolAsync)          \
	X(fa, cudaFreeAsync, cudaFreeAsync)                              \
	X(m2, cudaMallocHost, cudaMallocHost)                            \
	X(m3, cudaHostAlloc, cudaHostAlloc)                              \
	X(f1, cudaFreeHost, cudaFreeHost)                                \
	X(m3, cudaMallocManaged, cudaMallocManaged)                      \
	X(s1, cudaStreamSynchronize, cudaStreamSynchronize)              \
	X(s0, cudaDeviceSynchronize, cudaDeviceSynchronize)              \
	X(er, cudaEventRecord, cudaEventRecord)                          \
	X(swe, cudaStreamWaitEvent, cudaStreamWaitEvent)                 \
	X(es, cudaEventSynchronize, cudaEventSynchronize)                \
	X(erf, cudaEventRecordWithFlags, cudaEventRecordWithFlags)       \
	X(pt, cudaMemPoolTrimTo, cudaMemPoolTrimTo)                      \
	X(bc, cudaStreamBeginCapture, cudaStreamBeginCapture)            \
	X(ec, cudaStreamEndCapture, cudaStreamEndCapture)                \
	X(es, cudaGraphDestroy, cudaGraphDestroy)                        \
	X(m2, cuMemAlloc, cuMemAlloc_v2)                                 \
	X(f1, cuMemFree, cuMemFree_v2)                                   \
	X(ma, cuMemAllocAsync, cuMemAllocAsync)                          \
	X(mp, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync)          \
	X(fa, cuMemFreeAsync, cuMemFreeAsync)                            \
	X(m2, cuMemAllocHost, cuMemAllocHost_v2)                         \
	X(m3, cuMemHostAlloc, cuMemHostAlloc)                            \
	X(f1, cuMemFreeHost, cuMemFreeHost)                              \
	X(m3, cuMemAllocManaged, cuMemAllocManaged)                      \
	X(s1, cuStreamSynchronize, cuStreamSynchronize)                  \
	X(s0, cuCtxSynchronize, cuCtxSynchronize)                        \
	X(er, cuEventRecord, cuEventRecord)                              \
	X(swe, cuStreamWaitEvent, cuStreamWaitEvent)                     \
	X(es, cuEventSynchronize, cuEventSynchronize)                    \
	X(erf, cuEventRecordWithFlags, cuEventRecordWithFlags)           \
	X(ar, cuMemAddressReserve, cuMemAddressReserve)                  \
	X(af, cuMemAddressFree, cuMemAddressFree)                        \
	X(mc, cuMemCreate, cuMemCreate)                                  \
	X(rl, cuMemRelease, cuMemRelease)                                \
	X(mm, cuMemMap, cuMemMap)                                        \
	X(af, cuMemUnmap, cuMemUnmap)                                    \
	X(pt, cuMemPoolTrimTo, cuMemPoolTrimTo)                          \
	X(sa, cuMemSetAccess, cuMemSetAccess)                            \
	X(bc, cuStreamBeginCapture, cuStreamBeginCapture_v2)             \
	X(ec, cuStreamEndCapture, cuStreamEndCapture)                    \
	X(es, cuGraphDestroy, cuGraphDestroy)                            \
	X(gp4, cuGetProcAddress, cuGetProcAddress)                       \
	X(gp5, cuGetProcAddress_v2, cuGetProcAddress_v2)

APIS(W)

#define WRAPS(SH, API, EXP) [A_##API] = {(void *)EXP, (void *)API##_1, (void *)API##_2, (void *)API##_3},
static void *const g_wraps[NAPI][NSLOT] = {APIS(WRAPS)};
#define EXPORTS(SH, API, EXP) [A_##API] = #EXP,
static const char *const g_export[NAPI] = {APIS(EXPORTS)};

// dlsym_api maps a symbol looked up by name to the api to wrap it as. Only
// names that resolve to the signatures above are listed (so not the
// 32-bit "cuMemAlloc"); the _ptsz names are the per-thread stream variants.
static int dlsym_api(const char *s, uint32_t *flags) {
	*flags = 0;
	size_t n = strlen(s);
	char base[64];
	if (n >= sizeof base)
		return A_NONE;
	memcpy(base, s, n + 1);
	if (n > 5 && (strcmp(base + n - 5, "_ptsz") == 0 || strcmp(base + n - 5, "_ptds") == 0)) {
		base[n - 5] = 0;
		*flags = F_PTSZ;
	}
	for (int api = 1; api < NAPI; api++)
		if (g_export[api] && strcmp(g_export[api], base) == 0)
			return api;
	return A_NONE;
}

// dlsym hands out wrappers for the CUDA entry points it knows and is
// otherwise the real dlsym. It must reach the real one as a sibling call
// (a jump, at -O2), so that the real dlsym sees the caller's return
// address, which RTLD_NEXT lookups are relative to.
EXPORT void *dlsym(void *handle, const char *sym) {
	if (!real_dlsym)
		init_dlsym();
	if (sym[0] != 'c' || sym[1] != 'u')
		return real_dlsym(handle, sym);
	uint32_t flags;
	int api = dlsym_api(sym, &flags);
	debug_lookup("dlsym", sym, api);
	if (api == A_NONE)
		return real_dlsym(handle, sym);
	return wrap(api, real_dlsym(handle, sym), flags);
}

// ---- process life ----

static void atfork_prepare(void) {
	pthread_mutex_lock(&g_slot_mu);
	pthread_mutex_lock(&g_mu);
}

static void atfork_parent(void) {
	pthread_mutex_unlock(&g_mu);
	pthread_mutex_unlock(&g_slot_mu);
}

// atfork_child starts the child's own trace: it drops the parent's
// mappings (shared with the parent's file) and creates a new file at the
// child's first recorded call.
static void atfork_child(void) {
	pthread_mutex_init(&g_mu, NULL);
	pthread_mutex_init(&g_slot_mu, NULL);
	t_tid = 0;
	if (!g_enabled)
		return;
	for (uint64_t c = 0; c < MAXCHUNKS; c++) {
		struct rec *p = atomic_load(&g_chunks[c]);
		if (!p)
			break;
		munmap(p, CHUNK_BYTES);
		atomic_store(&g_chunks[c], NULL);
	}
	if (g_hdr)
		munmap(g_hdr, HDR_BYTES);
	g_hdr = NULL;
	if (g_fd >= 0)
		close(g_fd);
	g_fd = -1;
	g_failed = 0;
	atomic_store(&g_next, 0);
	atomic_store(&g_dropped_early, 0);
	g_start_mono = clock_ns(CLOCK_MONOTONIC);
	g_start_real = clock_ns(CLOCK_REALTIME);
}

__attribute__((constructor)) static void interpose_init(void) {
	init_dlsym();
	g_start_mono = clock_ns(CLOCK_MONOTONIC);
	g_start_real = clock_ns(CLOCK_REALTIME);
	const char *dir = getenv("ALLOCSIM_RECORD_DIR");
	if (dir && *dir && strlen(dir) < sizeof g_dir) {
		strcpy(g_dir, dir);
		g_enabled = 1;
	}
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

// interpose_fini copies the memory map next to the trace, for naming call
// sites. It runs at exit() from any thread; other threads may still be
// recording, so it leaves the mappings alone.
__attribute__((destructor)) static void interpose_fini(void) {
	if (!g_enabled || !g_hdr)
		return;
	char path[sizeof g_path + 8];
	snprintf(path, sizeof path, "%s.maps", g_path);
	int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return;
	int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out >= 0) {
		char buf[16384];
		ssize_t n;
		while ((n = read(in, buf, sizeof buf)) > 0)
			if (write(out, buf, (size_t)n) != n)
				break;
		close(out);
	}
	close(in);
}
