// A small caching allocator in the shape of a CUDAPluggableAllocator
// library, for the so: policy's tests (and, built against the real CUDA
// runtime, for PyTorch: torch.cuda.memory.CUDAPluggableAllocator(path,
// "my_malloc", "my_free")).
//
// Requests are rounded up to 512 bytes. Those of at most 1 MiB (small) are
// placed in 2 MiB segments, larger ones in segments of their size rounded
// up to 2 MiB. A request takes the best-fitting free block of its pool
// (small or large) and stream, the smallest, at the lowest address among
// equals, split when more than 512 bytes remain; a free block coalesces
// with its free neighbours. When no block fits, a segment is cudaMalloc'd;
// when the device refuses it, every wholly free segment is given back
// (cudaFree) and the cudaMalloc tried once more; NULL if refused again.
//
// With CACHING_LOG=FILE set, every request is written to FILE in allocsim's
// text trace form (malloc addr=PTR size=N stream=S; free addr=PTR
// stream=S), and the allocator's own figures as a comment line
// "# stats ..." after every request and at unload.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

typedef struct CUstream_st *cudaStream_t;
extern int cudaMalloc(void **ptr, size_t size);
extern int cudaFree(void *ptr);

#define ROUND 512
#define SMALL (1 << 20)
#define SEGMENT (2 << 20)

struct block {
	uintptr_t ptr;
	size_t size;
	int free, small;
	uintptr_t stream;
	struct block *prev, *next; // neighbours in the segment
	struct block *all;         // every block
};

static struct block *blocks;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long n_malloc, n_free, n_refused, reserved, peak;
static FILE *logf;
static int log_init;

static void stats(void) {
	if (logf) {
		fprintf(logf, "# stats mallocs=%lld frees=%lld refused=%lld reserved=%lld peak=%lld\n", n_malloc, n_free, n_refused, reserved, peak);
		fflush(logf);
	}
}

static void open_log(void) {
	if (!log_init) {
		log_init = 1;
		const char *p = getenv("CACHING_LOG");
		if (p && *p)
			logf = fopen(p, "w");
	}
}

static struct block *new_block(uintptr_t ptr, size_t size, int small, uintptr_t stream) {
	struct block *b = calloc(1, sizeof *b);
	b->ptr = ptr, b->size = size, b->small = small, b->stream = stream, b->free = 1;
	b->all = blocks;
	blocks = b;
	return b;
}

static void drop(struct block *b) {
	for (struct block **p = &blocks; *p; p = &(*p)->all)
		if (*p == b) {
			*p = b->all;
			break;
		}
	free(b);
}

static struct block *best_fit(size_t size, int small, uintptr_t stream) {
	struct block *best = NULL;
	for (struct block *b = blocks; b; b = b->all)
		if (b->free && b->small == small && b->stream == stream && b->size >= size &&
		    (!best || b->size < best->size || (b->size == best->size && b->ptr < best->ptr)))
			best = b;
	return best;
}

// release gives back every wholly free segment.
static void release(void) {
	for (struct block *b = blocks, *next; b; b = next) {
		next = b->all;
		if (b->free && !b->prev && !b->next) {
			if (cudaFree((void *)b->ptr) == 0) {
				n_free++;
				reserved -= b->size;
			}
			drop(b);
		}
	}
}

static struct block *segment(size_t size, int small, uintptr_t stream) {
	size_t seg = small ? SEGMENT : (size + SEGMENT - 1) / SEGMENT * SEGMENT;
	void *p = NULL;
	if (cudaMalloc(&p, seg) != 0) {
		n_refused++;
		release();
		if (cudaMalloc(&p, seg) != 0) {
			n_refused++;
			return NULL;
		}
	}
	n_malloc++;
	reserved += seg;
	if (reserved > peak)
		peak = reserved;
	return new_block((uintptr_t)p, seg, small, stream);
}

void *my_malloc(ssize_t size, int device, cudaStream_t stream) {
	pthread_mutex_lock(&mu);
	open_log();
	size_t n = size <= 0 ? ROUND : ((size_t)size + ROUND - 1) / ROUND * ROUND;
	int small = n <= SMALL;
	struct block *b = best_fit(n, small, (uintptr_t)stream);
	if (!b)
		b = segment(n, small, (uintptr_t)stream);
	void *ptr = NULL;
	if (b) {
		if (b->size - n >= ROUND) {
			struct block *rest = new_block(b->ptr + n, b->size - n, small, b->stream);
			rest->prev = b, rest->next = b->next;
			if (b->next)
				b->next->prev = rest;
			b->next = rest, b->size = n;
		}
		b->free = 0;
		ptr = (void *)b->ptr;
	}
	if (logf) {
		if (ptr)
			fprintf(logf, "malloc addr=%#lx size=%zd stream=%lu\n", (unsigned long)(uintptr_t)ptr, size, (unsigned long)(uintptr_t)stream);
		else
			fprintf(logf, "# oom size=%zd stream=%lu\n", size, (unsigned long)(uintptr_t)stream);
		stats();
	}
	pthread_mutex_unlock(&mu);
	return ptr;
}

void my_free(void *ptr, size_t size, int device, cudaStream_t stream) {
	pthread_mutex_lock(&mu);
	open_log();
	struct block *b = blocks;
	while (b && (b->ptr != (uintptr_t)ptr || b->free))
		b = b->all;
	if (b) {
		b->free = 1;
		if (b->next && b->next->free) { // absorb the next block
			struct block *n = b->next;
			b->size += n->size, b->next = n->next;
			if (n->next)
				n->next->prev = b;
			drop(n);
		}
		if (b->prev && b->prev->free) { // be absorbed by the previous one
			struct block *p = b->prev;
			p->size += b->size, p->next = b->next;
			if (b->next)
				b->next->prev = p;
			drop(b);
		}
	}
	if (logf) {
		fprintf(logf, "free addr=%#lx stream=%lu\n", (unsigned long)(uintptr_t)ptr, (unsigned long)(uintptr_t)stream);
		stats();
	}
	pthread_mutex_unlock(&mu);
}

// caching_stats writes the allocator's figures: cudaMalloc and cudaFree
// calls that succeeded, cudaMalloc calls refused, bytes reserved now and
// at the peak.
void caching_stats(long long out[5]) {
	pthread_mutex_lock(&mu);
	out[0] = n_malloc, out[1] = n_free, out[2] = n_refused, out[3] = reserved, out[4] = peak;
	pthread_mutex_unlock(&mu);
}

__attribute__((destructor)) static void at_unload(void) {
	stats();
	if (logf)
		fclose(logf);
}
