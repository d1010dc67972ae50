/*
 * fake_cupti.c - a stand-in libcupti.so.13 for the CUPTI probe's tests and benchmark.
 *
 * Exports the CUPTI entry points the probe calls, with the names, signatures and record layouts
 * of the CUDA 13 headers (cupti.h: CUpti_ActivityKernel10, Memcpy6, Memset4, Synchronization2,
 * Context3), and behaves as the real library does where the probe can tell: buffers are asked for
 * with the registered request callback, handed back full, on cuptiActivityFlushAll and every
 * cuptiActivityFlushPeriod milliseconds from its own thread; records with no buffer to go to are
 * dropped and counted (cuptiActivityGetNumDroppedRecords); callbacks fire only where enabled.
 *
 * The stand-in driver (fake_cuda_inject.c) produces the activity through the kifake_cupti_*
 * functions, which the real library does not have. Settings: KIFAKE_CUPTI_REFUSE (activity kinds,
 * comma-separated numbers, answered CUPTI_ERROR_NOT_COMPATIBLE), KIFAKE_CUPTI_NO_SUBSCRIBE=1
 * (cuptiSubscribe answers CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, as with another tool),
 * KIFAKE_CUPTI_VERSION (the API version cuptiGetVersion reports), KIFAKE_CUPTI_HOLD=N (keep up to N full buffers until the next flush, as CUPTI's queue does when
 * its thread is behind: with a small pool, buffer requests then find it empty).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cupti.h>

#define EXPORT __attribute__((visibility("default")))
#define HDR 8u /* each record is preceded by its size (u32) and padding, 8-byte aligned */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_BuffersCallbackRequestFunc on_request;
static CUpti_BuffersCallbackCompleteFunc on_complete;
static CUpti_CallbackFunc on_callback;
static void *callback_data;
static int subscribed;
static uint8_t enabled_cb[8][1024];   /* [domain][cbid] */
static uint8_t enabled_kind[64];
static uint8_t *buf;                  /* the buffer being filled */
static size_t buf_size, buf_used;
static uint64_t dropped;              /* records with no buffer since the last query */
static uint32_t next_corr;
static pthread_t period_thread;
static volatile uint32_t period_ms;
static int period_started;
static uint8_t *held[64];             /* full buffers kept until the next flush (KIFAKE_CUPTI_HOLD) */
static size_t held_size[64], held_used[64], nheld;

EXPORT CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version) {
    const char *v = getenv("KIFAKE_CUPTI_VERSION");
    *version = v ? (uint32_t)atoi(v) : CUPTI_API_VERSION;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str) {
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_NOT_COMPATIBLE: *str = "CUPTI_ERROR_NOT_COMPATIBLE"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; break;
    }
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts); /* not the ring's clock: the probe must map it */
    *timestamp = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback,
                                          void *userdata) {
    const char *no = getenv("KIFAKE_CUPTI_NO_SUBSCRIBE");
    if ((no && no[0] == '1') || subscribed) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    on_callback = callback;
    callback_data = userdata;
    subscribed = 1;
    *subscriber = (CUpti_SubscriberHandle)&subscribed;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber) {
    (void)subscriber;
    subscribed = 0;
    on_callback = NULL;
    memset(enabled_cb, 0, sizeof enabled_cb);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                               CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    if (!subscriber || domain >= 8 || cbid >= 1024) return CUPTI_ERROR_INVALID_PARAMETER;
    enabled_cb[domain][cbid] = (uint8_t)(enable != 0);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                             CUpti_CallbackDomain domain) {
    if (!subscriber || domain >= 8) return CUPTI_ERROR_INVALID_PARAMETER;
    memset(enabled_cb[domain], enable != 0, sizeof enabled_cb[domain]);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                          CUpti_BuffersCallbackCompleteFunc complete) {
    if (!request || !complete) return CUPTI_ERROR_INVALID_PARAMETER;
    on_request = request;
    on_complete = complete;
    return CUPTI_SUCCESS;
}

static int refused(CUpti_ActivityKind kind) {
    const char *list = getenv("KIFAKE_CUPTI_REFUSE");
    if (!list) return 0;
    for (const char *p = list; *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p) break;
        if (k == (long)kind) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
    if ((unsigned)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
    if (refused(kind)) return CUPTI_ERROR_NOT_COMPATIBLE;
    enabled_kind[kind] = 1;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
    if ((unsigned)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
    enabled_kind[kind] = 0;
    return CUPTI_SUCCESS;
}

static size_t hold_max(void) {
    const char *v = getenv("KIFAKE_CUPTI_HOLD");
    size_t n = v ? (size_t)atoi(v) : 0;
    return n > 64 ? 64 : n;
}

/* Hand the buffer being filled back (outside the lock, as CUPTI's own thread does); flush: the
 * held ones first, in order. Not flush: a full buffer may be held instead. */
static void complete_current_(int flush) {
    uint8_t *out[65];
    size_t sizes[65], used[65], n = 0;
    pthread_mutex_lock(&lock);
    if (!flush && buf && nheld < hold_max()) {
        held[nheld] = buf;
        held_size[nheld] = buf_size;
        held_used[nheld++] = buf_used;
    } else {
        if (flush) {
            for (size_t i = 0; i < nheld; i++) {
                out[n] = held[i];
                sizes[n] = held_size[i];
                used[n++] = held_used[i];
            }
            nheld = 0;
        }
        if (buf) {
            out[n] = buf;
            sizes[n] = buf_size;
            used[n++] = buf_used;
        }
    }
    buf = NULL;
    buf_size = buf_used = 0;
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < n; i++)
        if (on_complete) on_complete(NULL, 0, out[i], sizes[i], used[i]);
}

static void complete_current(void) { complete_current_(1); }

EXPORT CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    complete_current();
    return CUPTI_SUCCESS;
}

static void *period_loop(void *arg) {
    (void)arg;
    for (;;) {
        uint32_t ms = period_ms;
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (period_ms) complete_current();
    }
    return NULL;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityFlushPeriod(uint32_t time) {
    period_ms = time;
    if (time && !period_started) {
        period_started = 1;
        pthread_create(&period_thread, NULL, period_loop, NULL);
        pthread_detach(period_thread);
    }
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    size_t off;
    if (*record == NULL) {
        off = 0;
    } else {
        uint8_t *cur = (uint8_t *)*record;
        uint32_t size;
        memcpy(&size, cur - HDR, 4);
        off = (size_t)(cur - buffer) + ((size + 7u) & ~7u);
    }
    if (off + HDR > valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    uint32_t size;
    memcpy(&size, buffer + off, 4);
    if (size == 0 || off + HDR + size > valid) return CUPTI_ERROR_INVALID_KIND;
    *record = (CUpti_Activity *)(buffer + off + HDR);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream, size_t *n) {
    (void)context;
    (void)stream;
    *n = (size_t)__atomic_exchange_n(&dropped, 0, __ATOMIC_RELAXED);
    return CUPTI_SUCCESS;
}

/* ---- for the stand-in driver ------------------------------------------------ */

EXPORT int kifake_cupti_kind_enabled(CUpti_ActivityKind kind) { return (unsigned)kind < 64 && enabled_kind[kind]; }

/* Append one activity record (kind enabled or not: the caller checks), completing full buffers. */
/* Put one record into a buffer in this library's framing (what cuptiActivityGetNextRecord reads):
 * the new used size, or 0 when it does not fit. The benchmark fills its buffers with it. */
EXPORT size_t kifake_cupti_frame(uint8_t *buffer, size_t size, size_t used, const void *rec, size_t n) {
    size_t need = HDR + ((n + 7u) & ~7u);
    if (used + need > size) return 0;
    uint32_t s = (uint32_t)n;
    memcpy(buffer + used, &s, 4);
    memcpy(buffer + used + HDR, rec, n);
    return used + need;
}

EXPORT void kifake_cupti_record(const void *rec, size_t size) {
    size_t need = HDR + ((size + 7u) & ~7u);
    for (int step = 0; step < 8; step++) {
        pthread_mutex_lock(&lock);
        size_t after = buf ? kifake_cupti_frame(buf, buf_size, buf_used, rec, size) : 0;
        if (after) {
            buf_used = after;
            pthread_mutex_unlock(&lock);
            return;
        }
        int full = buf != NULL;
        pthread_mutex_unlock(&lock);
        if (full) {
            complete_current_(0);
            continue;
        }
        uint8_t *b = NULL;
        size_t bsize = 0, maxrec = 0;
        if (on_request) on_request(&b, &bsize, &maxrec);
        if (!b) break; /* no buffer: the record is dropped */
        pthread_mutex_lock(&lock);
        int take = buf == NULL && bsize >= need;
        if (take) {
            buf = b;
            buf_size = bsize;
            buf_used = 0;
        }
        pthread_mutex_unlock(&lock);
        if (!take && on_complete) on_complete(NULL, 0, b, bsize, 0); /* another thread got one first */
    }
    __atomic_fetch_add(&dropped, 1, __ATOMIC_RELAXED);
}

/* An API call as the callbacks see it: enter (returns its correlation id) and exit. */
EXPORT uint32_t kifake_cupti_api(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const char *function,
                                 CUpti_ApiCallbackSite site, uint32_t corr, uint64_t *correlation_data) {
    if (site == CUPTI_API_ENTER) corr = __atomic_add_fetch(&next_corr, 1, __ATOMIC_RELAXED);
    if (on_callback && domain < 8 && cbid < 1024 && enabled_cb[domain][cbid]) {
        CUpti_CallbackData d;
        memset(&d, 0, sizeof d);
        d.callbackSite = site;
        d.functionName = function;
        d.correlationId = corr;
        d.correlationData = correlation_data;
        on_callback(callback_data, domain, cbid, &d);
    }
    return corr;
}

EXPORT void kifake_cupti_nvtx(CUpti_CallbackId cbid, const char *function, const void *params) {
    if (!on_callback || !enabled_cb[CUPTI_CB_DOMAIN_NVTX][cbid]) return;
    CUpti_NvtxData d;
    memset(&d, 0, sizeof d);
    d.functionName = function;
    d.functionParams = params;
    on_callback(callback_data, CUPTI_CB_DOMAIN_NVTX, cbid, &d);
}
