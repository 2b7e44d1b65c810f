// async_pool_probe2.cu: cross-stream reuse of the CUDA stream-ordered pool
// while the freeing stream is still busy, under each reuse attribute, and
// which synchronize releases what. Build: nvcc -o probe2 async_pool_probe2.cu
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <unistd.h>

static cudaMemPool_t pool;
static void show(const char *what, void *p) {
	uint64_t res = 0, used = 0;
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &res);
	cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
	printf("%-52s ptr=%p reserved=%llu used=%llu\n", what, p, (unsigned long long)res, (unsigned long long)used);
}
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); } } while (0)

__global__ void spin(long long ns) {
	long long t0 = clock64();
	while (clock64() - t0 < ns * 2) {}
}
static void setReuse(int opp, int internal) {
	int one = 1;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &one));
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &opp));
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &internal));
}

int main() {
	cudaStream_t s1, s2;
	cudaEvent_t ev;
	CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	CK(cudaDeviceGetDefaultMemPool(&pool, 0));
	uint64_t keep = ~0ull, zero = 0;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
	void *a, *b, *c;
	const char *names[] = {"defaults (opp=1 internal=1)", "opp=0 internal=1", "opp=1 internal=0", "opp=0 internal=0"};
	int cfg[4][2] = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};
	for (int k = 0; k < 4; k++) {
		setReuse(cfg[k][0], cfg[k][1]);
		printf("== %s\n", names[k]);
		CK(cudaMallocAsync(&a, 8 << 20, s1)); show("malloc a 8MiB s1", a);
		spin<<<1, 1, 0, s1>>>(200000000);
		CK(cudaFreeAsync(a, s1)); show("s1 busy 200ms; free a on s1", 0);
		CK(cudaMallocAsync(&b, 8 << 20, s2)); show("malloc b 8MiB s2 (no dependency)", b);
		CK(cudaEventRecord(ev, s1));
		CK(cudaStreamWaitEvent(s2, ev, 0));
		CK(cudaMallocAsync(&c, 8 << 20, s2)); show("record ev s1, s2 waits ev, malloc c 8MiB s2", c);
		CK(cudaFreeAsync(b, s2)); CK(cudaFreeAsync(c, s2));
		CK(cudaDeviceSynchronize());
		CK(cudaMemPoolTrimTo(pool, 0)); show("device sync, trim", 0);
	}
	// Which synchronize releases what (threshold 0): a freed on s2, sync s1.
	setReuse(1, 1);
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
	printf("== threshold 0\n");
	CK(cudaMallocAsync(&a, 64 << 20, s2)); show("malloc a 64MiB s2", a);
	CK(cudaMallocAsync(&b, 1 << 20, s1)); show("malloc b 1MiB s1", b);
	CK(cudaFreeAsync(a, s2)); show("free a s2", 0);
	usleep(100000);
	CK(cudaStreamSynchronize(s1)); show("s2 idle; sync s1", 0);
	CK(cudaEventRecord(ev, s2)); CK(cudaEventSynchronize(ev)); show("record ev on s2, event sync", 0);
	CK(cudaMallocAsync(&a, 64 << 20, s2)); show("malloc a 64MiB s2", a);
	CK(cudaFreeAsync(a, s2)); CK(cudaDeviceSynchronize()); show("free a s2, device sync", 0);
	CK(cudaMallocAsync(&a, 64 << 20, s2)); CK(cudaFreeAsync(a, s2));
	CK(cudaMallocAsync(&c, 64 << 20, s1)); show("malloc 64MiB s2, free s2, malloc c 64MiB s1", c);
	// Threshold 40 MiB: what stays after a sync.
	uint64_t th = 40 << 20;
	CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &th));
	CK(cudaFreeAsync(c, s1)); CK(cudaFreeAsync(b, s1)); CK(cudaStreamSynchronize(s1)); show("threshold 40MiB: free c, b; sync s1", 0);
	return 0;
}
