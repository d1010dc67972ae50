/*
 * fake_cudart.c - a stand-in libcudart.so.12 exporting cudaLaunchKernel with its
 * real signature (dim3 by value), for the eBPF tracer tests.
 */
#include <stddef.h>

#define EXPORT __attribute__((visibility("default"), noinline))
typedef struct { unsigned int x, y, z; } dim3;
typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;

static volatile unsigned long long launches;

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                                    cudaStream_t stream) {
    (void)grid; (void)block; (void)args; (void)shmem; (void)stream;
    if (!func) return 1;
    launches++;
    return 0;
}
