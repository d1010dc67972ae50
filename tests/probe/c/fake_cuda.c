/*
 * fake_cuda.c - a stand-in libcuda.so.1 for the eBPF tracer tests and benchmark.
 *
 * Exports the driver API entry points the tracer probes, with the real names
 * and signatures (cuda.h, CUDA 12), doing nothing but what the tests need to
 * observe: handles, device pointers from a counter, an out-of-memory failure
 * for requests over 1 TiB, and synchronisation calls that sleep for a time the
 * test program sets with fake_cuda_set_sync_us().
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default"), noinline))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_VALUE 1

static uintptr_t next_handle = 0x1000;
static CUdeviceptr next_ptr = 0x7f0000000000ULL;
static long sync_us;
static volatile unsigned long long launches;

static void pause_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

EXPORT void fake_cuda_set_sync_us(long us) { sync_us = us; }
EXPORT unsigned long long fake_cuda_launches(void) { return launches; }

EXPORT CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    (void)hmod;
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    *hfunc = (CUfunction)(next_handle += 0x40);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary lib, const char *name) {
    (void)lib;
    if (!kernel || !name) return CUDA_ERROR_INVALID_VALUE;
    *kernel = (CUkernel)(next_handle += 0x40);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params,
                               void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream; (void)params; (void)extra;
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    launches++;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                    unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream,
                                    void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream; (void)params; (void)extra;
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    launches++;
    return CUDA_SUCCESS;
}

static CUresult alloc(CUdeviceptr *dptr, size_t bytes) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > (1ULL << 40)) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = next_ptr;
    next_ptr += (bytes + 0xFFFF) & ~(CUdeviceptr)0xFFFF;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) { return alloc(dptr, bytes); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) { (void)s; return alloc(dptr, bytes); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { (void)s; return dptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; pause_us(sync_us); return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize(void) { pause_us(sync_us); return CUDA_SUCCESS; }
EXPORT CUresult cuEventSynchronize(CUevent e) { (void)e; pause_us(sync_us); return CUDA_SUCCESS; }
