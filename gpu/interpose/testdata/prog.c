// prog.c is the program the interposer's tests record, linked against the
// fake runtime (shared, or compiled in as a static runtime). Its first
// argument picks a scenario; it prints every return code, so that a run
// with and without the interposer can be compared.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMallocAsync(void **p, size_t n, void *s);
int cudaMallocFromPoolAsync(void **p, size_t n, void *pool, void *s);
int cudaFreeAsync(void *p, void *s);
int cudaMallocHost(void **p, size_t n);
int cudaHostAlloc(void **p, size_t n, unsigned f);
int cudaFreeHost(void *p);
int cudaMallocManaged(void **p, size_t n, unsigned f);
int cudaStreamSynchronize(void *s);
int cudaStreamSynchronize_ptsz(void *s);
int cudaDeviceSynchronize(void);
int cudaEventRecord(void *e, void *s);
int cudaEventRecordWithFlags(void *e, void *s, unsigned f);
int cudaStreamWaitEvent(void *s, void *e, unsigned f);
int cudaEventSynchronize(void *e);
int cudaStreamBeginCapture(void *s, int mode);
int cudaStreamEndCapture(void *s, void **g);
int cudaGraphDestroy(void *g);

#define S1 ((void *)0x5001)
#define S2 ((void *)0x5002)
#define E1 ((void *)0xe001)
#define E2 ((void *)0xe002)
#define POOL ((void *)0x9001)

#define R(call) printf("%s = %d\n", #call, call)

static void all(void) {
	void *a, *b, *c, *h, *h2, *m, *x;
	R(cudaMalloc(&a, 1000));
	R(cudaMalloc(&x, 0));
	R(cudaMalloc(&x, 1ull << 50));
	R(cudaMallocAsync(&b, 2000, S1));
	R(cudaMallocFromPoolAsync(&c, 3000, POOL, S2));
	R(cudaMallocHost(&h, 4000));
	R(cudaHostAlloc(&h2, 5000, 1));
	R(cudaMallocManaged(&m, 6000, 1));
	R(cudaEventRecord(E1, S1));
	R(cudaStreamWaitEvent(S2, E1, 0));
	R(cudaEventRecordWithFlags(E2, S2, 0));
	R(cudaEventSynchronize(E1));
	R(cudaEventSynchronize(NULL));
	R(cudaStreamSynchronize(S1));
	R(cudaStreamSynchronize_ptsz(NULL));
	R(cudaFreeAsync(b, S1));
	R(cudaFreeAsync(c, S2));
	R(cudaDeviceSynchronize());
	R(cudaFree(a));
	R(cudaFree(a));
	R(cudaFree(NULL));
	R(cudaFreeHost(h));
	R(cudaFreeHost(h2));
	R(cudaFree(m));
}

// graph captures stream S1 into a graph: two stream-ordered mallocs
// during the capture (graph memory), one on S2 outside it, the graph
// destroyed, a capture of the legacy stream refused.
static void graph(void) {
	void *a, *b, *g;
	R(cudaStreamBeginCapture(S1, 0));
	R(cudaMallocAsync(&a, 4096, S1));
	R(cudaMallocAsync(&b, 8192, S1));
	R(cudaFreeAsync(a, S1));
	R(cudaFreeAsync(b, S1));
	R(cudaStreamEndCapture(S1, &g));
	R(cudaMallocAsync(&a, 100, S2));
	R(cudaFreeAsync(a, S2));
	R(cudaGraphDestroy(g));
	R(cudaStreamBeginCapture(NULL, 0));
}

// vmm maps memory through the driver's virtual memory API, reaching it as
// PyTorch does (entry points from cuGetProcAddress, as the runtime's
// cudaGetDriverEntryPoint hands them out) with via "proc", and as XLA does
// (dlsym on libcuda.so.1) otherwise: a range, a create of an unsupported
// handle type, two pages mapped and made accessible, a third mapping, an
// unmap of the first two at once, an unmap of part of the third, a create
// refused for lack of memory, a pool trimmed.
typedef int (*reserve_fn)(unsigned long long *, size_t, size_t, unsigned long long, unsigned long long);
typedef int (*free_fn)(unsigned long long, size_t);
typedef int (*create_fn)(unsigned long long *, size_t, const void *, unsigned long long);
typedef int (*release_fn)(unsigned long long);
typedef int (*map_fn)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
typedef int (*trim_fn)(void *, size_t);
typedef int (*access_fn)(unsigned long long, size_t, const void *, size_t);
typedef int (*proc_fn)(const char *, void **, int, unsigned long long, int *);

static void vmm(int via_proc) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		exit(1);
	}
	proc_fn proc = (proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	void *f[8];
	const char *names[] = {"cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemPoolTrimTo", "cuMemSetAccess"};
	for (int i = 0; i < 8; i++) {
		f[i] = NULL;
		if (via_proc)
			proc(names[i], &f[i], 12000, 0, NULL);
		else
			f[i] = dlsym(lib, names[i]);
		if (!f[i]) {
			fprintf(stderr, "no %s\n", names[i]);
			exit(1);
		}
	}
	const size_t page = 2u << 20;
	unsigned long long va, h1, h2, h3, hx;
	R(((reserve_fn)f[0])(&va, 16 * page, 0, 0, 0));
	R(((create_fn)f[2])(&h1, page, NULL, 1));
	R(((create_fn)f[2])(&h1, page, NULL, 0));
	R(((create_fn)f[2])(&h2, page, NULL, 0));
	R(((create_fn)f[2])(&h3, 2 * page, NULL, 0));
	R(((map_fn)f[4])(va, page, 0, h1, 0));
	R(((map_fn)f[4])(va + page, page, 0, h2, 0));
	char desc[16] = {0};
	R(((access_fn)f[7])(va, 2 * page, desc, 1));
	R(((map_fn)f[4])(va + 4 * page, 2 * page, 0, h3, 0));
	R(((create_fn)f[2])(&hx, 1ull << 50, NULL, 0));
	R(((free_fn)f[5])(va, 2 * page));
	R(((free_fn)f[5])(va + 4 * page, page));
	R(((free_fn)f[5])(va + 4 * page, 2 * page));
	R(((release_fn)f[3])(h1));
	R(((release_fn)f[3])(h2));
	R(((release_fn)f[3])(h3));
	R(((free_fn)f[1])(va, 16 * page));
	R(((trim_fn)f[6])(POOL, 0));
}

static int per_thread;

static void *worker(void *arg) {
	size_t size = 1024 * (size_t)(uintptr_t)arg;
	for (int i = 0; i < per_thread; i++) {
		void *p;
		if (cudaMalloc(&p, size) != 0 || cudaFree(p) != 0)
			abort();
	}
	return NULL;
}

static void threads(int n, int m) {
	pthread_t t[64];
	per_thread = m;
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

static void forks(void) {
	void *a, *b;
	R(cudaMalloc(&a, 100));
	fflush(stdout);
	pid_t p = fork();
	if (p == 0) {
		R(cudaMalloc(&b, 200));
		R(cudaFree(b));
		exit(0);
	}
	waitpid(p, NULL, 0);
	// A child that makes no call gets no trace.
	p = fork();
	if (p == 0)
		_exit(0);
	waitpid(p, NULL, 0);
	R(cudaFree(a));
}

static void *exiter(void *arg) {
	(void)arg;
	void *b;
	R(cudaMalloc(&b, 200));
	fflush(stdout);
	exit(3);
}

static void exit_thread(void) {
	void *a;
	pthread_t t;
	R(cudaMalloc(&a, 100));
	pthread_create(&t, NULL, exiter, NULL);
	pthread_join(t, NULL);
}

static void die(void) {
	void *a, *b;
	R(cudaMalloc(&a, 100));
	R(cudaMalloc(&b, 200));
	fflush(stdout);
	raise(SIGKILL);
}

static void exec_self(const char *self) {
	void *a;
	R(cudaMalloc(&a, 300));
	fflush(stdout);
	execl(self, self, "after-exec", (char *)NULL);
	perror("execl");
	exit(1);
}

static void after_exec(void) {
	void *b;
	R(cudaMalloc(&b, 400));
	R(cudaFree(b));
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// bench prints the time of one cudaMalloc + cudaFree pair in ns, the best
// of 5 rounds of n pairs.
static void bench(int n) {
	void *p;
	cudaFree(NULL);
	double best = 1e30;
	for (int r = 0; r < 5; r++) {
		double t0 = now();
		for (int i = 0; i < n; i++) {
			cudaMalloc(&p, 256);
			cudaFree(p);
		}
		double dt = (now() - t0) / n;
		if (dt < best)
			best = dt;
	}
	printf("%.1f\n", best);
}

int main(int argc, char **argv) {
	const char *mode = argc > 1 ? argv[1] : "all";
	if (!strcmp(mode, "all"))
		all();
	else if (!strcmp(mode, "threads"))
		threads(atoi(argv[2]), atoi(argv[3]));
	else if (!strcmp(mode, "fork"))
		forks();
	else if (!strcmp(mode, "exit-thread"))
		exit_thread();
	else if (!strcmp(mode, "signal"))
		die();
	else if (!strcmp(mode, "exec"))
		exec_self(argv[0]);
	else if (!strcmp(mode, "after-exec"))
		after_exec();
	else if (!strcmp(mode, "graph"))
		graph();
	else if (!strcmp(mode, "vmm"))
		vmm(0);
	else if (!strcmp(mode, "vmm-proc"))
		vmm(1);
	else if (!strcmp(mode, "bench"))
		bench(atoi(argv[2]));
	else if (!strcmp(mode, "exit"))
		return atoi(argv[2]);
	else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	return 0;
}
