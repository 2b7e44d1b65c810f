// A CUDAPluggableAllocator library that answers every malloc with NULL
// without asking the device, and another entry point that answers with a
// pointer it never got from it: both misbehave.
#include <stddef.h>
#include <sys/types.h>

void *my_malloc(ssize_t size, int device, void *stream) { return NULL; }
void *bogus_malloc(ssize_t size, int device, void *stream) { return (void *)0x1000; }
void my_free(void *ptr, size_t size, int device, void *stream) {}
