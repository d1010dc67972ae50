/* callbacks.c - what the host side of a launch tells: its thread, when it was called, how long the
 * call took and the NVTX range around it, kept by CUPTI correlation id until the kernel's activity
 * record comes back (activity.c). Runs on the workload's threads: no locks, no allocation. */
#define _GNU_SOURCE
#include "ki_cupti.h"

#include <generated_nvtx_meta.h>
#include <sys/syscall.h>
#include <unistd.h>

static __thread uint32_t tls_tid;
static __thread uint16_t tls_ranges[KI_CUPTI_RANGE_DEPTH]; /* range slot + 1 per open level */
static __thread uint32_t tls_depth;                       /* open levels (may exceed the array) */

static uint32_t ki_cupti_tid(void) {
    if (!tls_tid) tls_tid = (uint32_t)syscall(SYS_gettid);
    return tls_tid;
}

/* The launch APIs whose correlation ids the kernels carry (runtime and driver; a runtime launch's
 * driver call beneath it has the same id, and the runtime's exit, last, keeps the outer timing). */
static const CUpti_CallbackId driver_launches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};
static const CUpti_CallbackId runtime_launches[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000,
    CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000,
};
static const CUpti_CallbackId nvtx_ids[] = {
    CUPTI_CBID_NVTX_nvtxRangePushA, CUPTI_CBID_NVTX_nvtxRangePushEx, CUPTI_CBID_NVTX_nvtxRangePop,
    CUPTI_CBID_NVTX_nvtxDomainRangePushEx, CUPTI_CBID_NVTX_nvtxDomainRangePop,
};

int ki_cupti_callbacks_enable(struct ki_cupti *g) {
    int n = 0;
    for (size_t i = 0; i < sizeof driver_launches / sizeof *driver_launches; i++)
        n += g->api.EnableCallback(1, g->subscriber, CUPTI_CB_DOMAIN_DRIVER_API, driver_launches[i]) == CUPTI_SUCCESS;
    for (size_t i = 0; i < sizeof runtime_launches / sizeof *runtime_launches; i++)
        n += g->api.EnableCallback(1, g->subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_launches[i]) == CUPTI_SUCCESS;
    for (size_t i = 0; i < sizeof nvtx_ids / sizeof *nvtx_ids; i++)
        n += g->api.EnableCallback(1, g->subscriber, CUPTI_CB_DOMAIN_NVTX, nvtx_ids[i]) == CUPTI_SUCCESS;
    return n;
}

/* The slot + 1 of a range text in the shared table (inserted when new), 0 when the table is full. */
static uint32_t range_intern(struct ki_cupti *g, const char *text) {
    size_t len = 0;
    uint64_t h = 1469598103934665603ULL;
    while (len < KI_CUPTI_RANGE_TEXT - 1 && text[len]) {
        h = (h ^ (uint8_t)text[len]) * 1099511628211ULL;
        len++;
    }
    h |= 1;
    for (uint32_t probe = 0; probe < 32; probe++) {
        uint32_t i = (uint32_t)((h >> 8) + probe) & (KI_CUPTI_RANGE_SLOTS - 1);
        struct ki_cupti_range *r = &g->ranges[i];
        uint64_t cur = __atomic_load_n(&r->hash, __ATOMIC_ACQUIRE);
        if (cur == 0) {
            if (__atomic_compare_exchange_n(&r->hash, &cur, h, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                memcpy(r->text, text, len);
                r->text[len] = '\0';
                r->len = (uint32_t)len;
                __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
                return i + 1;
            }
        }
        if (cur == h) return i + 1; /* the same hash: taken as the same text */
    }
    __atomic_fetch_add(&g->ranges_full, 1, __ATOMIC_RELAXED);
    return 0;
}

static void on_nvtx(struct ki_cupti *g, CUpti_CallbackId cbid, const CUpti_NvtxData *d) {
    const char *text = NULL;
    switch (cbid) {
    case CUPTI_CBID_NVTX_nvtxRangePushA:
        text = ((const nvtxRangePushA_params *)d->functionParams)->message;
        break;
    case CUPTI_CBID_NVTX_nvtxRangePushEx:
    case CUPTI_CBID_NVTX_nvtxDomainRangePushEx: {
        const nvtxEventAttributes_t *a =
            cbid == CUPTI_CBID_NVTX_nvtxRangePushEx
                ? ((const nvtxRangePushEx_params *)d->functionParams)->eventAttrib
                : ((const nvtxDomainRangePushEx_params *)d->functionParams)->core.eventAttrib;
        if (a && a->messageType == NVTX_MESSAGE_TYPE_ASCII) text = a->message.ascii;
        else text = "";
        break;
    }
    case CUPTI_CBID_NVTX_nvtxRangePop:
    case CUPTI_CBID_NVTX_nvtxDomainRangePop:
        if (tls_depth > 0) tls_depth--;
        return;
    default:
        return;
    }
    uint32_t slot = text && text[0] ? range_intern(g, text) : 0;
    if (tls_depth < KI_CUPTI_RANGE_DEPTH) tls_ranges[tls_depth] = (uint16_t)slot;
    tls_depth++;
}

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void CUPTIAPI ki_cupti_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data) {
    struct ki_cupti *g = userdata;
    if (!__atomic_load_n(&g->active, __ATOMIC_RELAXED) || !data) return;
    if (domain == CUPTI_CB_DOMAIN_NVTX) {
        on_nvtx(g, cbid, data);
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API && domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        if (cb->correlationData) *cb->correlationData = realtime_ns();
        return;
    }
    uint64_t start = cb->correlationData ? *cb->correlationData : 0;
    uint64_t now = realtime_ns();
    if (start == 0 || start > now) start = now;
    uint32_t corr = cb->correlationId;
    if (corr == 0) return;
    struct ki_cupti_launch *e = &g->launches[corr & (KI_CUPTI_CORR_SLOTS - 1)];
    __atomic_store_n(&e->corr, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    e->tid = ki_cupti_tid();
    e->launch_ns = start;
    e->host_ns = now - start > UINT32_MAX ? UINT32_MAX : (uint32_t)(now - start);
    uint32_t depth = tls_depth;
    e->range = depth == 0 ? 0 : depth <= KI_CUPTI_RANGE_DEPTH ? tls_ranges[depth - 1] : tls_ranges[KI_CUPTI_RANGE_DEPTH - 1];
    __atomic_store_n(&e->corr, corr, __ATOMIC_RELEASE);
}
