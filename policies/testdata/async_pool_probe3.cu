// async_pool_probe3.cu: does the CUDA stream-ordered pool wait on another
// stream's pending free (an internal dependency) rather than grow, and does
// it prefer mapped free space to unmapped address space below it?
// Build: nvcc -o probe3 async_pool_probe3.cu
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>

static cudaMemPool_t pool;
static void show(const char *what, void *p) {
	uint64_t res = 0, used = 0;
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res);
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
	printf("%-60s ptr=%p reserved=%llu used=%llu\n", what, p, (unsigned long long)res, (unsigned long long)used);
}
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); } } while (0)

__global__ void spin(long long ns) {
	long long t0 = clock64();
	while (clock64() - t0 < ns * 2) {}
}

int main() {
	cudaStream_t s1, s2;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaDeviceGetDefaultMemPool(&pool, 0));
	uint64_t keep = ~0ull, zero = 0;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
	void *a, *b, *c, *d;
	CK(cudaMallocAsync(&a, 32 << 20, s1)); show("malloc a 32MiB s1", a);
	spin<<<1, 1, 0, s1>>>(300000000);
	CK(cudaFreeAsync(a, s1)); show("s1 busy 300ms; free a on s1", 0);
	CK(cudaMallocAsync(&b, 32 << 20, s2)); show("malloc b 32MiB s2 (pool full of a's pending free)", b);
	CK(cudaMallocAsync(&c, 1 << 20, s2)); show("malloc c 1MiB s2", c);
	CK(cudaFreeAsync(b, s2)); CK(cudaFreeAsync(c, s2));
	CK(cudaDeviceSynchronize()); CK(cudaMemPoolTrimTo(pool, 0)); show("device sync, trim", 0);

	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
	CK(cudaMallocAsync(&a, 32 << 20, s1)); show("t0: malloc a 32MiB s1", a);
	CK(cudaMallocAsync(&b, 32 << 20, s1)); show("t0: malloc b 32MiB s1", b);
	CK(cudaMallocAsync(&c, 1 << 20, s1)); show("t0: malloc c 1MiB s1", c);
	CK(cudaFreeAsync(a, s1)); CK(cudaFreeAsync(b, s1)); CK(cudaStreamSynchronize(s1)); show("t0: free a, b; sync s1", 0);
	CK(cudaMallocAsync(&d, 1 << 20, s1)); show("t0: malloc d 1MiB s1 (mapped hole above, unmapped below)", d);
	CK(cudaFreeAsync(d, s1));
	CK(cudaMallocAsync(&d, 48 << 20, s1)); show("t0: free d; malloc d 48MiB s1", d);
	CK(cudaFreeAsync(d, s1)); CK(cudaFreeAsync(c, s1)); CK(cudaStreamSynchronize(s1)); show("t0: free all, sync", 0);
	// Release threshold in between chunks: 3 chunks free, threshold 40 MiB;
	// which chunk stays? Then a 1 MiB malloc shows where.
	uint64_t th = 40 << 20;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &th));
	CK(cudaMallocAsync(&a, 96 << 20, s1)); show("th40: malloc a 96MiB", a);
	CK(cudaFreeAsync(a, s1)); CK(cudaStreamSynchronize(s1)); show("th40: free a, sync", 0);
	CK(cudaMallocAsync(&b, 1 << 20, s1)); show("th40: malloc b 1MiB", b);
	return 0;
}
