// async_pool_probe.cu measures how the CUDA stream-ordered allocator's pool
// reserves memory (cudaMemPoolAttrReservedMemCurrent, UsedMemCurrent) for a
// sequence of cudaMallocAsync calls, and what a synchronize gives back.
// It documents the facts policies/async_pool.go models; it is not built by
// the Go tests. Build: nvcc -o probe async_pool_probe.cu
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>

static cudaMemPool_t pool;
static void show(const char *what, void *p) {
	uint64_t res = 0, used = 0;
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res);
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
	printf("%-40s ptr=%p reserved=%llu used=%llu\n", what, p, (unsigned long long)res, (unsigned long long)used);
}
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); } } while (0)

int main() {
	cudaStream_t s1, s2;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaDeviceGetDefaultMemPool(&pool, 0));
	uint64_t keep = ~0ull;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
	// 1. Granularity of growth, threshold UINT64_MAX (nothing given back).
	size_t sizes[] = {1, 1, 512, 513, 4096, 1 << 20, (1 << 20) + 1, 2 << 20, 3 << 20, 20 << 20, (32 << 20) + 1, 33 << 20, 100 << 20, 1000 << 20};
	void *ps[32];
	int n = sizeof sizes / sizeof sizes[0];
	for (int i = 0; i < n; i++) {
		char w[64];
		CK(cudaMallocAsync(&ps[i], sizes[i], s1));
		snprintf(w, sizeof w, "malloc %zu on s1", sizes[i]);
		show(w, ps[i]);
	}
	for (int i = 0; i < n; i++) CK(cudaFreeAsync(ps[i], s1));
	CK(cudaStreamSynchronize(s1));
	show("all freed, s1 synced (threshold max)", 0);
	CK(cudaMemPoolTrimTo(pool, 0));
	show("trimmed to 0", 0);
	// 2. Threshold 0: release at sync.
	uint64_t zero = 0;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
	void *a, *b, *c;
	CK(cudaMallocAsync(&a, 1 << 20, s1)); show("t0: malloc a 1MiB s1", a);
	CK(cudaMallocAsync(&b, 1 << 20, s1)); show("t0: malloc b 1MiB s1", b);
	CK(cudaMallocAsync(&c, 64 << 20, s1)); show("t0: malloc c 64MiB s1", c);
	CK(cudaFreeAsync(c, s1)); show("t0: free c on s1", 0);
	CK(cudaStreamSynchronize(s2)); show("t0: sync s2 (other stream)", 0);
	CK(cudaStreamSynchronize(s1)); show("t0: sync s1", 0);
	CK(cudaFreeAsync(b, s1)); CK(cudaStreamSynchronize(s1)); show("t0: free b, sync s1 (a live)", 0);
	CK(cudaFreeAsync(a, s1)); CK(cudaStreamSynchronize(s1)); show("t0: free a, sync s1", 0);
	// 3. Reuse on the same stream and across streams.
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
	CK(cudaMallocAsync(&a, 8 << 20, s1)); show("keep: malloc a 8MiB s1", a);
	CK(cudaFreeAsync(a, s1));
	CK(cudaMallocAsync(&b, 8 << 20, s1)); show("keep: free a, malloc b 8MiB s1", b);
	CK(cudaFreeAsync(b, s1));
	CK(cudaMallocAsync(&c, 8 << 20, s2)); show("keep: free b s1, malloc c 8MiB s2", c);
	CK(cudaFreeAsync(c, s2));
	CK(cudaDeviceSynchronize());
	CK(cudaMemPoolTrimTo(pool, 0));
	show("end", 0);
	// 4. Small allocations packed: 3 x 700 KiB, then 5 x 1.5 MiB.
	for (int i = 0; i < 3; i++) { CK(cudaMallocAsync(&ps[i], 700 << 10, s1)); show("700KiB", ps[i]); }
	for (int i = 3; i < 8; i++) { CK(cudaMallocAsync(&ps[i], 1536 << 10, s1)); show("1.5MiB", ps[i]); }
	for (int i = 8; i < 11; i++) { CK(cudaMallocAsync(&ps[i], 40 << 20, s1)); show("40MiB", ps[i]); }
	return 0;
}
