/*
 * ki_cupti.h - the CUPTI activity probe, internal interfaces (docs/probes.md, "CUPTI activity probe").
 *
 * libki_cupti.so.1 is loaded by the CUDA driver through CUDA_INJECTION64_PATH: at cuInit the driver
 * calls InitializeInjection (inject.c), which loads CUPTI by name, subscribes to the launch and NVTX
 * callbacks (callbacks.c) and enables the activity kinds. CUPTI hands its buffers back through
 * ki_cupti_buffer_completed (activity.c), which turns each record into the ring records of
 * docs/ring.md (KERNEL with its LAUNCH_SPAN, MEMOP, SYNC) in the ring of the record's device.
 * Names are demangled and shortened by names.c.
 *
 * Nothing here may break the workload: every failure is logged once and the probe steps aside.
 */
#ifndef KI_CUPTI_H
#define KI_CUPTI_H

#include "ki_ring.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cupti.h>

/* The oldest CUPTI API version read: CUDA 12.0's (whose records put the fields read where CUDA
 * 13's do; activity.c checks that at compile time). */
#define KI_CUPTI_MIN_API 18u
#define KI_CUPTI_MAX_DEVICES 64u        /* rings this probe writes; records of higher device ids are refused */
#define KI_CUPTI_CORR_SLOTS 16384u      /* launches remembered between their callback and their kernel record */
#define KI_CUPTI_RANGE_SLOTS 1024u      /* distinct NVTX range texts remembered */
#define KI_CUPTI_RANGE_TEXT 64u         /* bytes of an NVTX range's text kept (cut beyond) */
#define KI_CUPTI_RANGE_DEPTH 16u        /* nested NVTX ranges followed per thread */
#define KI_CUPTI_NAME_MAX_DEFAULT 192u  /* longest kernel name written (bytes, six STRING records) */
#define KI_CUPTI_NAMES 8192u            /* distinct kernel names remembered (power of two) */
#define KI_CUPTI_CONTEXTS 256u          /* CUDA contexts mapped to their device */
/* Correlations the probe writes are CUPTI's correlation id with this bit set, so they never meet
 * the CUDA-event probe's (sequence numbers from 1) in the same process (docs/ring.md). */
#define KI_CUPTI_CORRELATION_TAG (1ULL << 62)

/* GPU_SAMPLE metric ids of the probe's counts (agent/metric_ids.py, MetricId.CUPTI_*). */
#define KI_METRIC_CUPTI_RECORDS 29
#define KI_METRIC_CUPTI_DROPPED 30
#define KI_METRIC_CUPTI_RING_REFUSED 31
#define KI_METRIC_CUPTI_POOL_EXHAUSTED 32

/* The probe's own counts, written to each ring as cumulative GPU_SAMPLE records per process
 * (docs/metrics.md); CUPTI's drops and the ring's refusals are also added to the ring header's
 * cupti_dropped and cupti_refused, which the agent ships as its counters (docs/ring.md). */
enum ki_cupti_count {
    KI_CUPTI_RECORDS_WRITTEN = 0, /* ring records written (names excluded) */
    KI_CUPTI_CUPTI_DROPPED,       /* records CUPTI dropped (cuptiActivityGetNumDroppedRecords) */
    KI_CUPTI_RING_REFUSED,        /* records the ring refused (full, or no ring for the device) */
    KI_CUPTI_POOL_EXHAUSTED,      /* buffer requests answered with no buffer: the pool was empty */
    KI_CUPTI_COUNT_MAX
};

/* The CUPTI entry points the probe calls, resolved from the library it loaded. */
struct ki_cupti_api {
    CUptiResult (*GetVersion)(uint32_t *);
    CUptiResult (*GetResultString)(CUptiResult, const char **);
    CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
    CUptiResult (*Unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
    CUptiResult (*EnableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
    CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
    CUptiResult (*ActivityDisable)(CUpti_ActivityKind);
    CUptiResult (*ActivityFlushAll)(uint32_t);
    CUptiResult (*ActivityFlushPeriod)(uint32_t);
    CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
    CUptiResult (*GetTimestamp)(uint64_t *);
};

/* A kernel name as written: the short form of CUPTI's (mangled) name and which rings have it. */
struct ki_cupti_name {
    const char *raw;      /* CUPTI's pointer (stable while its module is loaded); NULL: free entry */
    char *text;           /* short name (names.c), NUL-terminated */
    uint32_t raw_len;     /* strlen(raw), to tell a reused pointer from the name it had */
    uint32_t len;         /* strlen(text) */
    uint32_t id;          /* string id, the same in every ring (ids are per producer) */
    uint64_t registered;  /* bit d: written into device d's ring by this producer */
};

struct ki_cupti_device {
    struct ki_ring ring;          /* producer handle, attached lazily */
    int attached;                 /* 1: ring usable */
    uint64_t retry_ns;            /* monotonic time of the next attach attempt */
    uint64_t counts[KI_CUPTI_COUNT_MAX];
    uint64_t reported[KI_CUPTI_COUNT_MAX]; /* last values written as samples */
    uint64_t refused_in_header;   /* of counts[KI_CUPTI_RING_REFUSED], added to the ring header's cupti_refused */
};

/* One launch seen by the callbacks, found again by its CUPTI correlation id. */
struct ki_cupti_launch {
    uint32_t corr;      /* atomic: correlation id of the entry, 0 while being written */
    uint32_t tid;       /* launching thread */
    uint64_t launch_ns; /* CLOCK_REALTIME at the launch call's entry */
    uint32_t host_ns;   /* time inside the launch call (capped) */
    uint32_t range;     /* NVTX range slot + 1 enclosing the launch, 0 none */
};

struct ki_cupti_range {
    uint64_t hash;                   /* atomic: 0 free, hash|1 taken */
    uint32_t ready;                  /* atomic: text written */
    uint32_t len;
    char text[KI_CUPTI_RANGE_TEXT];
};

struct ki_cupti {
    struct ki_cupti_api api;
    void *lib;                        /* dlopen handle of CUPTI */
    CUpti_SubscriberHandle subscriber;
    pthread_mutex_t lock;             /* the buffer-completed path and everything it owns below */
    int active;                       /* records are written (cleared in a forked child, or when stepping aside) */
    int forked_child;                 /* this process is a fork of the one that loaded the probe */
    char prefix[64];                  /* ring label prefix (KI_PROBE_LABEL_PREFIX) */
    uint32_t name_max;                /* longest kernel name written */
    uint32_t pid;
    /* buffer pool */
    uint8_t *pool;                    /* buffers * buffer_bytes, mapped once */
    size_t buffer_bytes, buffers;
    uint32_t *free_list;              /* indexes of free buffers */
    size_t free_count;
    pthread_mutex_t pool_lock;        /* short holds only: CUPTI asks for buffers from any thread */
    /* clock: realtime = cupti + offset, refreshed every flush period */
    int64_t clock_offset_ns;
    uint64_t clock_at_ns;             /* monotonic time of the last refresh */
    /* names */
    struct ki_cupti_name *names;      /* KI_CUPTI_NAMES entries, open addressing by raw pointer */
    uint32_t next_name_id;
    struct ki_cupti_name range_names[KI_CUPTI_RANGE_SLOTS]; /* interned NVTX range texts */
    uint32_t context_device[KI_CUPTI_CONTEXTS]; /* context id -> device + 1, 0 unknown */
    struct ki_cupti_device devices[KI_CUPTI_MAX_DEVICES];
    uint64_t cupti_dropped_total;     /* cuptiActivityGetNumDroppedRecords summed */
    uint64_t dropped_in_header;       /* of which added to the first ring header's cupti_dropped */
    uint64_t pool_exhausted;          /* buffer requests with the pool empty */
    uint64_t unknown_device;          /* records whose device was out of range or unknown */
    /* callbacks */
    struct ki_cupti_launch *launches; /* KI_CUPTI_CORR_SLOTS */
    struct ki_cupti_range *ranges;    /* KI_CUPTI_RANGE_SLOTS */
    uint64_t ranges_full;             /* NVTX ranges not remembered: the table was full */
};

extern struct ki_cupti ki_cupti_g;

/* ---- inject.c --------------------------------------------------------- */
/* Log one line to stderr, prefixed "ki-cupti: ", once per key (0..63) when key >= 0. */
void ki_cupti_log(int key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum { KI_LOG_RING = 0, KI_LOG_DEVICE = 1, KI_LOG_POOL = 2, KI_LOG_NAME = 3, KI_LOG_KIND = 8 /* + kind index */ };

/* ---- activity.c ------------------------------------------------------- */
/* Set up the pool (buffers x buffer_bytes), the name table and the clock. 0 or -errno. */
int ki_cupti_activity_init(struct ki_cupti *g, size_t buffers, size_t buffer_bytes);
void CUPTIAPI ki_cupti_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records);
void CUPTIAPI ki_cupti_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);
/* Translate the records of one completed buffer into ring records (g->lock held). Returns records seen. */
size_t ki_cupti_activity_process(struct ki_cupti *g, uint8_t *buffer, size_t valid);
/* Write the probe's counts as samples into every attached ring (g->lock held). */
void ki_cupti_activity_report(struct ki_cupti *g);
/* Refresh the CUPTI-to-CLOCK_REALTIME offset (g->lock held). */
void ki_cupti_clock_refresh(struct ki_cupti *g);

/* ---- callbacks.c ------------------------------------------------------ */
void CUPTIAPI ki_cupti_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void *data);
/* Enable the launch (runtime and driver) and NVTX callbacks on the subscriber. Returns callbacks enabled. */
int ki_cupti_callbacks_enable(struct ki_cupti *g);
/* The launch entry of a correlation id, copied out (all but corr); 0 when it is not (or no longer)
 * known. Inline: the buffer-completed path asks once per record, with the table allocated (the
 * probe is active only once ki_cupti_activity_init succeeded). */
static inline int ki_cupti_launch_find(const struct ki_cupti *g, uint32_t corr, struct ki_cupti_launch *out) {
    if (corr == 0) return 0;
    const struct ki_cupti_launch *e = &g->launches[corr & (KI_CUPTI_CORR_SLOTS - 1)];
    if (__atomic_load_n(&e->corr, __ATOMIC_ACQUIRE) != corr) return 0;
    out->tid = e->tid;
    out->launch_ns = e->launch_ns;
    out->host_ns = e->host_ns;
    out->range = e->range;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&e->corr, __ATOMIC_RELAXED) == corr; /* else rewritten meanwhile */
}

/* ---- names.c ---------------------------------------------------------- */
/* The short, readable form of a kernel name (demangled; return type, parameters and, past max,
 * nested template arguments dropped; cut with "..." as the last resort) into out (out_size >= 8).
 * Returns its length. */
size_t ki_cupti_name_short(const char *raw, char *out, size_t out_size, size_t max);

#endif /* KI_CUPTI_H */
