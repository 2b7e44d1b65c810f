// A stub CUDA runtime to link the test libraries against, as a real
// pluggable allocator links -lcudart: it is never loaded by the tests
// (the so: policy's shim stands in for it), and aborts if it is.
#include <stddef.h>
#include <stdlib.h>

int cudaMalloc(void **ptr, size_t size) { abort(); }
int cudaFree(void *ptr) { abort(); }
