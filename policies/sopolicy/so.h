// Loading of a CUDAPluggableAllocator library and of the CUDA runtime shim
// that serves its device calls: see sopolicy.go.
#ifndef ALLOCSIM_SO_H
#define ALLOCSIM_SO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

void *so_open(const char *path, int global, char *err, size_t errlen);
void so_close(void *handle);
// so_sym returns the address of symbol name in handle's scope and sets
// *file to the path of the object that defines it ("" if unknown).
void *so_sym(void *handle, const char *name, const char **file);
// so_set_table gives the shim at handle the engine's table; 0 on success,
// -1 when the shim lacks allocsim_shim_set.
int so_set_table(void *handle);
void *so_call_alloc(void *fn, ssize_t size, int device, uintptr_t stream);
void so_call_free(void *fn, uintptr_t ptr, size_t size, int device, uintptr_t stream);
// so_loaded writes the paths of the loaded objects into buf, one a line,
// as many as fit, and returns the length written.
size_t so_loaded(char *buf, size_t n);

#endif
