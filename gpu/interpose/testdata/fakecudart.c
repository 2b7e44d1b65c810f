// fakecudart.c is a fake CUDA runtime for the interposer's tests. Built as
// a shared library (libcudart.so.13) it stands for the dynamically linked
// runtime that PyTorch uses; compiled into the test program it stands for
// nvcc's statically linked runtime. Either way it reaches the driver as the
// real one does: dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then
// cuGetProcAddress("cuGetProcAddress") for the 5-argument (12000) and the
// 4-argument (11030) forms, and every entry point from those.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*gp5_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gp4_t)(const char *, void **, int, unsigned long long);

static struct {
	int (*memAlloc)(void **, size_t);
	int (*memFree)(void *);
	int (*memAllocAsync)(void **, size_t, void *);
	int (*memAllocFromPoolAsync)(void **, size_t, void *, void *);
	int (*memFreeAsync)(void *, void *);
	int (*memHostAlloc)(void **, size_t, unsigned);
	int (*memFreeHost)(void *);
	int (*memAllocManaged)(void **, size_t, unsigned);
	int (*streamSynchronize)(void *);
	int (*streamSynchronizePtsz)(void *);
	int (*ctxSynchronize)(void);
	int (*eventRecord)(void *, void *);
	int (*eventRecordWithFlags)(void *, void *, unsigned);
	int (*streamWaitEvent)(void *, void *, unsigned);
	int (*eventSynchronize)(void *);
	int (*streamBeginCapture)(void *, int);
	int (*streamEndCapture)(void *, void **);
	int (*graphDestroy)(void *);
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void get(void *gp, int ver, int four, const char *name, void *dst, unsigned long long flags) {
	void *fn = NULL;
	int rc = four ? ((gp4_t)gp)(name, &fn, ver, flags) : ((gp5_t)gp)(name, &fn, ver, flags, NULL);
	if (rc != 0 || !fn) {
		fprintf(stderr, "fakecudart: no %s\n", name);
		abort();
	}
	*(void **)dst = fn;
}

static void init(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "fakecudart: %s\n", dlerror());
		abort();
	}
	void *boot = dlsym(h, "cuGetProcAddress_v2");
	void *gp5 = NULL, *gp4 = NULL;
	get(boot, 12000, 0, "cuGetProcAddress", &gp5, 0);
	get(boot, 11030, 0, "cuGetProcAddress", &gp4, 0);
	get(gp5, 12000, 0, "cuMemAlloc", &drv.memAlloc, 0);
	get(gp5, 12000, 0, "cuMemFree", &drv.memFree, 0);
	get(gp5, 12000, 0, "cuMemAllocAsync", &drv.memAllocAsync, 0);
	get(gp5, 12000, 0, "cuMemAllocFromPoolAsync", &drv.memAllocFromPoolAsync, 0);
	get(gp5, 12000, 0, "cuMemFreeAsync", &drv.memFreeAsync, 0);
	get(gp5, 12000, 0, "cuMemHostAlloc", &drv.memHostAlloc, 0);
	get(gp5, 12000, 0, "cuMemFreeHost", &drv.memFreeHost, 0);
	get(gp5, 12000, 0, "cuMemAllocManaged", &drv.memAllocManaged, 0);
	get(gp5, 12000, 0, "cuStreamSynchronize", &drv.streamSynchronize, 0);
	get(gp5, 12000, 0, "cuStreamSynchronize", &drv.streamSynchronizePtsz, 2);
	get(gp5, 12000, 0, "cuEventRecord", &drv.eventRecord, 0);
	get(gp5, 12000, 0, "cuEventRecordWithFlags", &drv.eventRecordWithFlags, 0);
	get(gp5, 12000, 0, "cuStreamWaitEvent", &drv.streamWaitEvent, 0);
	get(gp4, 11030, 1, "cuCtxSynchronize", &drv.ctxSynchronize, 0);
	get(gp4, 11030, 1, "cuEventSynchronize", &drv.eventSynchronize, 0);
	get(gp5, 12000, 0, "cuStreamBeginCapture", &drv.streamBeginCapture, 0);
	get(gp5, 12000, 0, "cuStreamEndCapture", &drv.streamEndCapture, 0);
	get(gp5, 12000, 0, "cuGraphDestroy", &drv.graphDestroy, 0);
}

#define INIT() pthread_once(&once, init)

int cudaMalloc(void **p, size_t n) {
	INIT();
	if (n == 0) {
		*p = NULL;
		return 0;
	}
	return drv.memAlloc(p, n);
}
int cudaFree(void *p) {
	INIT();
	return p ? drv.memFree(p) : 0;
}
int cudaMallocAsync(void **p, size_t n, void *s) { INIT(); return drv.memAllocAsync(p, n, s); }
int cudaMallocFromPoolAsync(void **p, size_t n, void *pool, void *s) { INIT(); return drv.memAllocFromPoolAsync(p, n, pool, s); }
int cudaFreeAsync(void *p, void *s) { INIT(); return drv.memFreeAsync(p, s); }
int cudaHostAlloc(void **p, size_t n, unsigned f) { INIT(); return drv.memHostAlloc(p, n, f); }
// cudaMallocHost calls another intercepted function, as some runtime calls
// do: the interposer must record it once.
int cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
int cudaFreeHost(void *p) { INIT(); return p ? drv.memFreeHost(p) : 0; }
int cudaMallocManaged(void **p, size_t n, unsigned f) { INIT(); return drv.memAllocManaged(p, n, f); }
int cudaStreamSynchronize(void *s) { INIT(); return drv.streamSynchronize(s); }
int cudaStreamSynchronize_ptsz(void *s) { INIT(); return drv.streamSynchronizePtsz(s); }
int cudaDeviceSynchronize(void) { INIT(); return drv.ctxSynchronize(); }
int cudaEventRecord(void *e, void *s) { INIT(); return drv.eventRecord(e, s); }
int cudaEventRecordWithFlags(void *e, void *s, unsigned f) { INIT(); return drv.eventRecordWithFlags(e, s, f); }
int cudaStreamWaitEvent(void *s, void *e, unsigned f) { INIT(); return drv.streamWaitEvent(s, e, f); }
int cudaEventSynchronize(void *e) { INIT(); return drv.eventSynchronize(e); }
int cudaStreamBeginCapture(void *s, int mode) { INIT(); return drv.streamBeginCapture(s, mode); }
int cudaStreamEndCapture(void *s, void **g) { INIT(); return drv.streamEndCapture(s, g); }
int cudaGraphDestroy(void *g) { INIT(); return drv.graphDestroy(g); }
