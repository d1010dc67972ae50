/*
 * fake_cuda_inject.c - a stand-in libcuda.so.1 for the CUPTI probe's tests: the driver side of
 * CUPTI. Real names and signatures (cuda.h, CUDA 13).
 *
 * cuInit loads the library named by CUDA_INJECTION64_PATH and calls its InitializeInjection, as
 * the real driver does. Each call then does what CUPTI sees of the real one: launch callbacks
 * (enter, exit) around cuLaunchKernel, and activity records in the CUDA 13 layouts from the
 * stand-in CUPTI (fake_cupti.c, found in the process once the probe has loaded it): a kernel runs
 * 1 us per block of grid x on its stream, after the stream's previous work. Without an injection
 * library, or with one that loaded no CUPTI, the calls do nothing observable, as with no tool.
 * kifake_nvtx_push/pop stand for NVTX's ranges (which reach CUPTI through NVTX's own injection).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cupti.h>
#include <generated_nvtx_meta.h>

#define EXPORT __attribute__((visibility("default")))
#define STREAMS 16

struct CUctx_st { int device; uint32_t id; };
struct CUfunc_st { char *name; };

static struct CUctx_st contexts[64];
static __thread struct CUctx_st *current;
static uint64_t stream_busy[64][STREAMS]; /* CUPTI time each stream's work ends */
static uint64_t grid_id;

static void (*rec_fn)(const void *, size_t);
static int (*kind_fn)(CUpti_ActivityKind);
static uint32_t (*api_fn)(CUpti_CallbackDomain, CUpti_CallbackId, const char *, CUpti_ApiCallbackSite, uint32_t,
                          uint64_t *);
static void (*nvtx_fn)(CUpti_CallbackId, const char *, const void *);
static CUptiResult (*ts_fn)(uint64_t *);

static void find_cupti(void) {
    void *p;
    if ((p = dlsym(RTLD_DEFAULT, "kifake_cupti_record"))) memcpy(&rec_fn, &p, sizeof p);
    if ((p = dlsym(RTLD_DEFAULT, "kifake_cupti_kind_enabled"))) memcpy(&kind_fn, &p, sizeof p);
    if ((p = dlsym(RTLD_DEFAULT, "kifake_cupti_api"))) memcpy(&api_fn, &p, sizeof p);
    if ((p = dlsym(RTLD_DEFAULT, "kifake_cupti_nvtx"))) memcpy(&nvtx_fn, &p, sizeof p);
    if ((p = dlsym(RTLD_DEFAULT, "cuptiGetTimestamp"))) memcpy(&ts_fn, &p, sizeof p);
}

static uint64_t now_cupti(void) {
    uint64_t t = 0;
    if (ts_fn) ts_fn(&t);
    return t;
}

static int wants(CUpti_ActivityKind kind) { return rec_fn && kind_fn && kind_fn(kind); }

static uint32_t stream_id(CUstream s) { return s ? (uint32_t)((uintptr_t)s % 1000) : 7u; }

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    static int done;
    if (done++) return CUDA_SUCCESS;
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (path && *path) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = NULL;
        void *sym = h ? dlsym(h, "InitializeInjection") : NULL;
        if (sym) memcpy(&init, &sym, sizeof sym);
        if (init) init();
        else fprintf(stderr, "fake libcuda: injection %s not loaded: %s\n", path, dlerror());
    }
    find_cupti();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    const char *n = getenv("KIFAKE_GPUS");
    *count = n ? atoi(n) : 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= 64) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev < 0 || dev >= 64) return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = &contexts[dev];
    if (c->id == 0) {
        c->device = dev;
        c->id = (uint32_t)dev + 1;
        if (wants(CUPTI_ACTIVITY_KIND_CONTEXT)) {
            CUpti_ActivityContext3 r;
            memset(&r, 0, sizeof r);
            r.kind = CUPTI_ACTIVITY_KIND_CONTEXT;
            r.contextId = c->id;
            r.deviceId = (uint32_t)dev;
            r.nullStreamId = 7;
            rec_fn(&r, sizeof r);
        }
    }
    *ctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
    (void)mod;
    struct CUfunc_st *fn = malloc(sizeof *fn);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    fn->name = strdup(name); /* CUPTI's name pointer: stable while the module is loaded */
    *f = fn;
    return CUDA_SUCCESS;
}

static uint64_t *busy_of(CUstream s) { return &stream_busy[current->device][stream_id(s) % STREAMS]; }

/* Work of ns on the stream after what is queued there: its start; *end gets its end. */
static uint64_t occupy(CUstream s, uint64_t ns, uint64_t *end) {
    uint64_t *busy = busy_of(s), now = now_cupti();
    uint64_t start = *busy > now ? *busy : now;
    *busy = *end = start + ns;
    return start;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shmem, CUstream stream, void **params,
                               void **extra) {
    (void)params;
    (void)extra;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t data = 0;
    uint32_t corr = 0;
    if (api_fn)
        corr = api_fn(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel",
                      CUPTI_API_ENTER, 0, &data);
    if (wants(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) {
        uint64_t end, start = occupy(stream, 1000ULL * gx, &end);
        CUpti_ActivityKernel10 k;
        memset(&k, 0, sizeof k);
        k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.registersPerThread = 32;
        k.start = start;
        k.end = end;
        k.completed = end;
        k.deviceId = (uint32_t)current->device;
        k.contextId = current->id;
        k.streamId = stream_id(stream);
        k.gridX = (int32_t)gx;
        k.gridY = (int32_t)gy;
        k.gridZ = (int32_t)gz;
        k.blockX = (int32_t)bx;
        k.blockY = (int32_t)by;
        k.blockZ = (int32_t)bz;
        k.dynamicSharedMemory = (int32_t)shmem;
        k.correlationId = corr;
        k.gridId = (int64_t)__atomic_add_fetch(&grid_id, 1, __ATOMIC_RELAXED);
        k.name = f->name;
        rec_fn(&k, sizeof k);
    }
    if (api_fn)
        api_fn(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", CUPTI_API_EXIT,
               corr, &data);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    (void)dst;
    (void)src;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t data = 0;
    uint32_t corr = api_fn ? api_fn(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
                                    "cuMemcpyHtoDAsync_v2", CUPTI_API_ENTER, 0, &data)
                           : 0;
    if (wants(CUPTI_ACTIVITY_KIND_MEMCPY)) {
        CUpti_ActivityMemcpy6 m;
        memset(&m, 0, sizeof m);
        m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
        m.bytes = bytes;
        m.start = occupy(stream, bytes / 20 + 1, &m.end); /* 20 GB/s */
        m.deviceId = (uint32_t)current->device;
        m.contextId = current->id;
        m.streamId = stream_id(stream);
        m.correlationId = corr;
        rec_fn(&m, sizeof m);
    }
    if (api_fn)
        api_fn(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync_v2",
               CUPTI_API_EXIT, corr, &data);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
    (void)dst;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    uint32_t corr = api_fn ? api_fn(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async,
                                    "cuMemsetD8Async", CUPTI_API_ENTER, 0, NULL)
                           : 0;
    if (wants(CUPTI_ACTIVITY_KIND_MEMSET)) {
        CUpti_ActivityMemset4 m;
        memset(&m, 0, sizeof m);
        m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
        m.value = value;
        m.bytes = n;
        m.start = occupy(stream, n / 100 + 1, &m.end);
        m.deviceId = (uint32_t)current->device;
        m.contextId = current->id;
        m.streamId = stream_id(stream);
        m.correlationId = corr;
        rec_fn(&m, sizeof m);
    }
    return CUDA_SUCCESS;
}

static void sync_record(CUpti_ActivitySynchronizationType type, uint64_t until, uint32_t stream) {
    if (!wants(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)) return;
    uint64_t now = now_cupti();
    CUpti_ActivitySynchronization2 s;
    memset(&s, 0, sizeof s);
    s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    s.type = type;
    s.start = now;
    s.end = until > now ? until : now; /* the host waited for the stream's work */
    s.contextId = current->id;
    s.streamId = stream;
    rec_fn(&s, sizeof s);
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    sync_record(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE, *busy_of(stream), stream_id(stream));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t until = 0;
    for (int i = 0; i < STREAMS; i++)
        if (stream_busy[current->device][i] > until) until = stream_busy[current->device][i];
    sync_record(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE, until, 0);
    return CUDA_SUCCESS;
}

EXPORT void kifake_nvtx_push(const char *message) {
    nvtxRangePushA_params p = {message};
    if (nvtx_fn) nvtx_fn(CUPTI_CBID_NVTX_nvtxRangePushA, "nvtxRangePushA", &p);
}

EXPORT void kifake_nvtx_pop(void) {
    if (nvtx_fn) nvtx_fn(CUPTI_CBID_NVTX_nvtxRangePop, "nvtxRangePop", NULL);
}

/* A fuzzed activity stream: count records of random kinds and bytes (name pointers valid or NULL,
 * as CUPTI's always are), from seed. */
EXPORT void kifake_fuzz(unsigned seed, unsigned count) {
    if (!rec_fn) return;
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_CONTEXT,
        CUPTI_ACTIVITY_KIND_MARKER, CUPTI_ACTIVITY_KIND_NVLINK};
    static char *names[16];
    uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int i = 0; i < 16; i++) {
        size_t len = NEXT() % (i < 4 ? 3000 : 200);
        names[i] = malloc(len + 1);
        for (size_t j = 0; j < len; j++) names[i][j] = (char)(1 + NEXT() % 255);
        names[i][len] = '\0';
        if (i == 1 && len > 2) memcpy(names[i], "_Z", 2); /* a broken mangled name */
    }
    uint8_t raw[sizeof(CUpti_ActivityKernel10) + 64];
    for (unsigned n = 0; n < count; n++) {
        for (size_t j = 0; j < sizeof raw; j += 8) {
            uint64_t v = NEXT();
            memcpy(raw + j, &v, 8);
        }
        CUpti_ActivityKind kind = kinds[NEXT() % (sizeof kinds / sizeof *kinds)];
        memcpy(raw, &kind, sizeof kind);
        size_t size = sizeof(CUpti_ActivityKernel10);
        if (kind == CUPTI_ACTIVITY_KIND_KERNEL || kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)raw;
            uint64_t pick = NEXT();
            k->name = pick % 17 == 16 ? NULL : names[pick % 16];
            k->pAccessPolicyWindow = NULL;
            k->reserved0 = NULL;
            if (pick & 0x100) k->deviceId %= 4; /* most land on a GPU with a ring */
            if (pick & 0x200) k->end = k->start + (NEXT() % 1000000);
        } else if (kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)raw;
            m->reserved0 = NULL;
            if (NEXT() & 1) m->deviceId %= 4;
            size = sizeof *m;
        } else if (kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)raw;
            m->reserved0 = NULL;
            if (NEXT() & 1) m->deviceId %= 4;
            size = sizeof *m;
        } else if (kind == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) {
            CUpti_ActivitySynchronization2 *s = (CUpti_ActivitySynchronization2 *)raw;
            if (NEXT() & 1) s->contextId %= 8;
            size = sizeof *s;
        } else if (kind == CUPTI_ACTIVITY_KIND_CONTEXT) {
            CUpti_ActivityContext3 *c = (CUpti_ActivityContext3 *)raw;
            c->contextId %= 300;
            c->deviceId %= 70;
            size = sizeof *c;
        } else {
            size = 16 + NEXT() % 128;
        }
        rec_fn(raw, size);
    }
#undef NEXT
}
