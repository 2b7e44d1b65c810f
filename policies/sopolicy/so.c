// Loading and calling a CUDAPluggableAllocator library: see so.h.
#define _GNU_SOURCE
#include "so.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "_cgo_export.h"

void *so_open(const char *path, int global, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", errlen - 1);
		err[errlen - 1] = 0;
	}
	return h;
}

void so_close(void *handle) { dlclose(handle); }

void *so_sym(void *handle, const char *name, const char **file) {
	*file = "";
	void *p = dlsym(handle, name);
	Dl_info info;
	if (p && dladdr(p, &info) && info.dli_fname)
		*file = info.dli_fname;
	return p;
}

static int table_malloc(uintptr_t *ptr, size_t size, int kind) { return allocsimSoMalloc(ptr, size, kind); }
static int table_free(uintptr_t ptr, int kind) { return allocsimSoFree(ptr, kind); }
static int table_mem_info(size_t *free, size_t *total) { return allocsimSoMemInfo(free, total); }

struct allocsim_shim_table {
	int (*malloc)(uintptr_t *ptr, size_t size, int kind);
	int (*free)(uintptr_t ptr, int kind);
	int (*mem_info)(size_t *free, size_t *total);
};

static struct allocsim_shim_table table = {table_malloc, table_free, table_mem_info};

int so_set_table(void *handle) {
	void (*set)(struct allocsim_shim_table *) = (void (*)(struct allocsim_shim_table *))dlsym(handle, "allocsim_shim_set");
	if (!set)
		return -1;
	set(&table);
	return 0;
}

void *so_call_alloc(void *fn, ssize_t size, int device, uintptr_t stream) {
	return ((void *(*)(ssize_t, int, void *))fn)(size, device, (void *)stream);
}

void so_call_free(void *fn, uintptr_t ptr, size_t size, int device, uintptr_t stream) {
	((void (*)(void *, size_t, int, void *))fn)((void *)ptr, size, device, (void *)stream);
}

struct loaded {
	char *buf;
	size_t n, len;
};

static int add_loaded(struct dl_phdr_info *info, size_t size, void *data) {
	struct loaded *l = data;
	const char *name = info->dlpi_name;
	size_t k = name ? strlen(name) : 0;
	if (k == 0 || l->len + k + 1 > l->n)
		return 0;
	memcpy(l->buf + l->len, name, k);
	l->buf[l->len + k] = '\n';
	l->len += k + 1;
	return 0;
}

size_t so_loaded(char *buf, size_t n) {
	struct loaded l = {buf, n, 0};
	dl_iterate_phdr(add_loaded, &l);
	return l.len;
}
