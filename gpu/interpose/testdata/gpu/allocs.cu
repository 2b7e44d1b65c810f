// allocs.cu is the real CUDA program that the GPU-machine check records
// with `record run` (check.sh): a known sequence of every intercepted call,
// four threads of cudaMalloc/cudaFree, then timing loops, whose per-call
// times with and without the interposer give its overhead. It prints the
// calls it made ("count NAME N") and the times ("time NAME_ns X").
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                                                  \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                                  \
		if (e_ != cudaSuccess) {                                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(1);                                                                           \
		}                                                                                      \
	} while (0)

static double now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

__global__ void touch(char *p, size_t n) {
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = 1;
}

static void *worker(void *arg) {
	size_t size = 4096 * (1 + (uintptr_t)arg);
	for (int i = 0; i < 50; i++) {
		void *p;
		CK(cudaMalloc(&p, size));
		CK(cudaFree(p));
	}
	return NULL;
}

int main(int argc, char **argv) {
	int iters = argc > 1 ? atoi(argv[1]) : 100000;
	long mallocs = 0, frees = 0;
	CK(cudaFree(0));

	// 1. Every intercepted call once.
	size_t sizes[] = {512, 4096, 1 << 20, 2 << 20, 20 << 20, 64 << 20, 256 << 20};
	void *p[7];
	for (int i = 0; i < 7; i++, mallocs++)
		CK(cudaMalloc(&p[i], sizes[i]));
	touch<<<(1 << 20) / 256, 256>>>((char *)p[2], 1 << 20);
	cudaStream_t s;
	cudaEvent_t ev;
	CK(cudaStreamCreate(&s));
	CK(cudaEventCreate(&ev));
	void *a, *h, *h2, *m, *big;
	CK(cudaMallocAsync(&a, 1 << 20, s));
	CK(cudaEventRecord(ev, s));
	CK(cudaStreamWaitEvent(0, ev, 0));
	CK(cudaEventSynchronize(ev));
	CK(cudaFreeAsync(a, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMallocHost(&h, 1 << 20));
	CK(cudaHostAlloc(&h2, 4096, cudaHostAllocDefault));
	CK(cudaMallocManaged(&m, 1 << 20));
	cudaError_t e = cudaMalloc(&big, (size_t)1 << 40);
	printf("count failed_cudaMalloc %d (error %d)\n", e != cudaSuccess, (int)e);
	cudaGetLastError();
	CK(cudaDeviceSynchronize());
	for (int i = 0; i < 7; i++, frees++)
		CK(cudaFree(p[i]));
	CK(cudaFreeHost(h));
	CK(cudaFreeHost(h2));
	CK(cudaFree(m));

	// 2. Four threads.
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	mallocs += 200;
	frees += 200;

	// 3. Timing loops.
	const int pairs = 2000;
	double t0 = now_ns();
	for (int i = 0; i < pairs; i++) {
		void *q;
		CK(cudaMalloc(&q, 1 << 20));
		CK(cudaFree(q));
	}
	printf("time malloc_free_1MiB_pair_ns %.1f\n", (now_ns() - t0) / pairs);
	mallocs += pairs;
	frees += pairs;

	cudaMemPool_t pool;
	CK(cudaDeviceGetDefaultMemPool(&pool, 0));
	uint64_t thr = UINT64_MAX;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
	for (int i = 0; i < 10; i++) {
		void *q;
		CK(cudaMallocAsync(&q, 1024, s));
		CK(cudaFreeAsync(q, s));
	}
	CK(cudaStreamSynchronize(s));
	t0 = now_ns();
	for (int i = 0; i < iters; i++) {
		void *q;
		CK(cudaMallocAsync(&q, 1024, s));
		CK(cudaFreeAsync(q, s));
	}
	printf("time mallocasync_freeasync_pair_ns %.1f\n", (now_ns() - t0) / iters);
	CK(cudaStreamSynchronize(s));
	t0 = now_ns();
	for (int i = 0; i < iters; i++)
		CK(cudaStreamSynchronize(s));
	printf("time streamsync_ns %.1f\n", (now_ns() - t0) / iters);
	t0 = now_ns();
	for (int i = 0; i < iters; i++)
		CK(cudaEventRecord(ev, s));
	printf("time eventrecord_ns %.1f\n", (now_ns() - t0) / iters);
	CK(cudaStreamSynchronize(s));

	printf("count cudaMalloc %ld\ncount cudaFree %ld\n", mallocs, frees);
	printf("count cudaMallocAsync %d\ncount cudaFreeAsync %d\n", 1 + 10 + iters, 1 + 10 + iters);
	printf("count pinned 2\ncount managed 1\n");
	printf("count cudaStreamSynchronize %d\ncount cudaEventRecord %d\n", 4 + iters, 1 + iters);
	CK(cudaEventDestroy(ev));
	CK(cudaStreamDestroy(s));
	return 0;
}
