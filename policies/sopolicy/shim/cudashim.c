// The CUDA runtime (and driver) shim of the so: policies: the memory calls
// of a CUDAPluggableAllocator library, served by the simulated device of
// the replay. sopolicy builds it at run time with the SONAME the library
// needs (libcudart.so.13, libcuda.so.1, ...) and loads it RTLD_GLOBAL
// before the library, so that the library's DT_NEEDED is satisfied by it
// and its calls bind to it. Each call goes through the table that the
// engine sets with allocsim_shim_set; without one, calls fail with
// cudaErrorInitializationError. Prototypes are declared here: no CUDA
// headers are needed to build it.
#include <stddef.h>
#include <stdint.h>

// Kinds of device calls, for the engine's messages.
enum { K_MALLOC, K_MALLOC_ASYNC, K_CU_MEM_ALLOC, K_CU_MEM_ALLOC_ASYNC };

struct allocsim_shim_table {
	int (*malloc)(uintptr_t *ptr, size_t size, int kind);
	int (*free)(uintptr_t ptr, int kind);
	int (*mem_info)(size_t *free, size_t *total);
};

static struct allocsim_shim_table *T;
static int last_error; // cudaGetLastError's

// allocsim_shim_set sets the table the calls go through.
void allocsim_shim_set(struct allocsim_shim_table *t) { T = t; }

static int done(int rc) {
	if (rc != 0)
		last_error = rc;
	return rc;
}

static int do_malloc(void **ptr, size_t size, int kind) {
	if (!ptr)
		return done(1); // cudaErrorInvalidValue
	if (!T)
		return done(3); // cudaErrorInitializationError
	uintptr_t a = 0;
	int rc = T->malloc(&a, size, kind);
	*ptr = rc == 0 ? (void *)a : NULL;
	return done(rc);
}

static int do_free(void *ptr, int kind) {
	if (!ptr)
		return 0;
	if (!T)
		return done(3);
	return done(T->free((uintptr_t)ptr, kind));
}

int cudaMalloc(void **ptr, size_t size) { return do_malloc(ptr, size, K_MALLOC); }
int cudaFree(void *ptr) { return do_free(ptr, K_MALLOC); }
int cudaMallocAsync(void **ptr, size_t size, void *stream) { return do_malloc(ptr, size, K_MALLOC_ASYNC); }
int cudaFreeAsync(void *ptr, void *stream) { return do_free(ptr, K_MALLOC_ASYNC); }

int cudaMemGetInfo(size_t *free, size_t *total) {
	if (!free || !total)
		return done(1);
	if (!T)
		return done(3);
	return done(T->mem_info(free, total));
}

int cudaGetDevice(int *device) {
	if (!device)
		return done(1);
	*device = 0;
	return 0;
}
int cudaSetDevice(int device) { return device == 0 ? 0 : done(101); } // cudaErrorInvalidDevice
int cudaStreamSynchronize(void *stream) { return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaGetLastError(void) {
	int e = last_error;
	last_error = 0;
	return e;
}
int cudaPeekAtLastError(void) { return last_error; }

static const char *error_name(int e) {
	switch (e) {
	case 0: return "cudaSuccess";
	case 1: return "cudaErrorInvalidValue";
	case 2: return "cudaErrorMemoryAllocation";
	case 3: return "cudaErrorInitializationError";
	case 101: return "cudaErrorInvalidDevice";
	default: return "cudaErrorUnknown";
	}
}
const char *cudaGetErrorName(int e) { return error_name(e); }
const char *cudaGetErrorString(int e) {
	switch (e) {
	case 0: return "no error";
	case 1: return "invalid argument";
	case 2: return "out of memory";
	case 3: return "initialization error";
	case 101: return "invalid device ordinal";
	default: return "unknown error";
	}
}

// The driver API's memory calls (CUresult: CUDA_ERROR_OUT_OF_MEMORY is 2
// there too), for libraries that use them.
typedef unsigned long long CUdeviceptr;

static int cu_alloc(CUdeviceptr *ptr, size_t size, int kind) {
	void *p = NULL;
	int rc = do_malloc(&p, size, kind);
	if (ptr)
		*ptr = (CUdeviceptr)(uintptr_t)p;
	return rc;
}

int cuInit(unsigned flags) { return 0; }
int cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) { return cu_alloc(ptr, size, K_CU_MEM_ALLOC); }
int cuMemAlloc(CUdeviceptr *ptr, size_t size) { return cu_alloc(ptr, size, K_CU_MEM_ALLOC); }
int cuMemFree_v2(CUdeviceptr ptr) { return do_free((void *)(uintptr_t)ptr, K_CU_MEM_ALLOC); }
int cuMemFree(CUdeviceptr ptr) { return do_free((void *)(uintptr_t)ptr, K_CU_MEM_ALLOC); }
int cuMemAllocAsync(CUdeviceptr *ptr, size_t size, void *stream) { return cu_alloc(ptr, size, K_CU_MEM_ALLOC_ASYNC); }
int cuMemFreeAsync(CUdeviceptr ptr, void *stream) { return do_free((void *)(uintptr_t)ptr, K_CU_MEM_ALLOC_ASYNC); }
int cuMemGetInfo_v2(size_t *free, size_t *total) { return cudaMemGetInfo(free, total); }
int cuGetErrorString(int e, const char **s) {
	if (s)
		*s = cudaGetErrorString(e);
	return 0;
}
