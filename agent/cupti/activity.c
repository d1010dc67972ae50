/* activity.c - CUPTI's activity buffers: a fixed pool handed to CUPTI, and the buffer-completed
 * path that turns each record into ring records (docs/ring.md) in its device's ring. */
#define _GNU_SOURCE
#include "ki_cupti.h"

#include <stdlib.h>
#include <sys/mman.h>

/* ---- pool --------------------------------------------------------------- */

static void *map_zeroed(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int ki_cupti_activity_init(struct ki_cupti *g, size_t buffers, size_t buffer_bytes) {
    buffer_bytes = (buffer_bytes + 4095) & ~(size_t)4095; /* CUPTI wants 8-byte aligned buffers */
    g->pool = map_zeroed(buffers * buffer_bytes);
    g->free_list = calloc(buffers, sizeof *g->free_list);
    g->names = map_zeroed(KI_CUPTI_NAMES * sizeof *g->names);
    g->launches = map_zeroed(KI_CUPTI_CORR_SLOTS * sizeof *g->launches);
    g->ranges = map_zeroed(KI_CUPTI_RANGE_SLOTS * sizeof *g->ranges);
    if (!g->pool || !g->free_list || !g->names || !g->launches || !g->ranges) return -ENOMEM;
    g->buffers = buffers;
    g->buffer_bytes = buffer_bytes;
    for (size_t i = 0; i < buffers; i++) g->free_list[i] = (uint32_t)(buffers - 1 - i);
    g->free_count = buffers;
    pthread_mutex_init(&g->lock, NULL);
    pthread_mutex_init(&g->pool_lock, NULL);
    g->next_name_id = 0;
    ki_cupti_clock_refresh(g);
    return 0;
}

void CUPTIAPI ki_cupti_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    struct ki_cupti *g = &ki_cupti_g;
    *buffer = NULL;
    *size = 0;
    *max_records = 0;
    pthread_mutex_lock(&g->pool_lock);
    if (g->free_count > 0) {
        uint32_t i = g->free_list[--g->free_count];
        *buffer = g->pool + (size_t)i * g->buffer_bytes;
        *size = g->buffer_bytes;
    }
    pthread_mutex_unlock(&g->pool_lock);
    if (!*buffer) {
        __atomic_fetch_add(&g->pool_exhausted, 1, __ATOMIC_RELAXED);
        ki_cupti_log(KI_LOG_POOL, "all %zu activity buffers are in use: CUPTI drops records until one is back "
                     "(counted; KI_CUPTI_BUFFERS sets the pool)", g->buffers);
    }
}

static void pool_put(struct ki_cupti *g, uint8_t *buffer) {
    if (buffer < g->pool || buffer >= g->pool + g->buffers * g->buffer_bytes) return; /* not ours */
    size_t i = (size_t)(buffer - g->pool) / g->buffer_bytes;
    pthread_mutex_lock(&g->pool_lock);
    if (g->free_count < g->buffers) g->free_list[g->free_count++] = (uint32_t)i;
    pthread_mutex_unlock(&g->pool_lock);
}

void CUPTIAPI ki_cupti_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size;
    struct ki_cupti *g = &ki_cupti_g;
    pthread_mutex_lock(&g->lock);
    if (g->active) {
        if (buffer && valid) ki_cupti_activity_process(g, buffer, valid);
        size_t dropped = 0;
        if (g->api.ActivityGetNumDroppedRecords &&
            g->api.ActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
            g->cupti_dropped_total += dropped;
        ki_cupti_activity_report(g);
    }
    pthread_mutex_unlock(&g->lock);
    if (buffer) pool_put(g, buffer);
}

/* ---- clock -------------------------------------------------------------- */

/* A bracket wider than this (the thread was preempted between its reads) does not move the offset. */
#define KI_CUPTI_CLOCK_BRACKET_NS 20000ULL

void ki_cupti_clock_refresh(struct ki_cupti *g) {
    if (!g->api.GetTimestamp) return;
    uint64_t best = UINT64_MAX;
    int64_t offset = 0;
    for (int i = 0; i < 5; i++) { /* the narrowest of five brackets */
        uint64_t r0 = ki_ring_now_ns(), c = 0;
        if (g->api.GetTimestamp(&c) != CUPTI_SUCCESS) return;
        uint64_t r1 = ki_ring_now_ns();
        if (r1 - r0 < best) {
            best = r1 - r0;
            offset = (int64_t)(r0 + (r1 - r0) / 2) - (int64_t)c;
        }
    }
    /* A noisy reading would move every later timestamp by up to its width, and records written
     * after it could then read earlier than records written before: keep the last good offset. */
    if (best <= KI_CUPTI_CLOCK_BRACKET_NS || g->clock_at_ns == 0) g->clock_offset_ns = offset;
    g->clock_at_ns = ki_ring_mono_ns();
}

static inline uint64_t to_ring_ns(const struct ki_cupti *g, uint64_t cupti_ns) {
    return cupti_ns + (uint64_t)g->clock_offset_ns; /* modulo 2^64: a corrupt timestamp wraps, never traps */
}

/* ---- rings and names ---------------------------------------------------- */

static struct ki_cupti_device *device_attach(struct ki_cupti *g, uint32_t dev);

/* The device's ring when attached (the path of nearly every record), else an attempt to attach. */
static inline struct ki_cupti_device *device_ring(struct ki_cupti *g, uint32_t dev) {
    if (__builtin_expect(dev < KI_CUPTI_MAX_DEVICES && g->devices[dev].attached, 1)) return &g->devices[dev];
    return device_attach(g, dev);
}

__attribute__((noinline)) static struct ki_cupti_device *device_attach(struct ki_cupti *g, uint32_t dev) {
    if (dev >= KI_CUPTI_MAX_DEVICES) {
        g->unknown_device++;
        return NULL;
    }
    struct ki_cupti_device *d = &g->devices[dev];
    uint64_t now = ki_ring_mono_ns();
    if (now >= d->retry_ns) {
        char name[KI_RING_NAME_MAX + 1], err[256];
        snprintf(name, sizeof name, "/kernel_insight.%s%u", g->prefix, dev);
        if (ki_ring_attach(&d->ring, name, KI_RING_PRODUCER, err, sizeof err) == 0) {
            d->attached = 1;
            return d;
        }
        ki_cupti_log(KI_LOG_RING, "%s: records of GPU %u are counted and dropped until the ring exists", err, dev);
        d->retry_ns = now + 1000000000ULL;
    }
    d->counts[KI_CUPTI_RING_REFUSED]++;
    return NULL;
}

static inline uint32_t name_slot(const char *raw) {
    return (uint32_t)(((uint64_t)(uintptr_t)raw * 0x9E3779B97F4A7C15ULL) >> 40) & (KI_CUPTI_NAMES - 1);
}

static struct ki_cupti_name *name_intern(struct ki_cupti *g, const char *raw);

/* The entry of CUPTI's name pointer (interned on first sight), or NULL when the table is full. */
static inline struct ki_cupti_name *name_of(struct ki_cupti *g, const char *raw) {
    struct ki_cupti_name *e = &g->names[name_slot(raw)];
    if (__builtin_expect(e->raw == raw && e->text != NULL, 1)) return e;
    return name_intern(g, raw);
}

__attribute__((noinline)) static struct ki_cupti_name *name_intern(struct ki_cupti *g, const char *raw) {
    uint32_t h = name_slot(raw);
    for (uint32_t probe = 0; probe < 64; probe++) {
        struct ki_cupti_name *e = &g->names[(h + probe) & (KI_CUPTI_NAMES - 1)];
        if (e->raw == raw && e->text) return e;
        if (e->text) continue;
        char buf[1024];
        size_t len = ki_cupti_name_short(raw, buf, sizeof buf, g->name_max);
        e->text = malloc(len + 1);
        if (!e->text) return NULL;
        memcpy(e->text, buf, len + 1);
        e->len = (uint32_t)len;
        e->raw = raw;
        e->id = ++g->next_name_id;
        return e;
    }
    ki_cupti_log(KI_LOG_NAME, "kernel name table full (%u names): further new names are not written", KI_CUPTI_NAMES);
    return NULL;
}

/* Make sure device dev's ring has the name; 0 when it has. */
static inline int name_in_ring(struct ki_cupti_device *d, uint32_t dev, struct ki_cupti_name *e) {
    uint64_t bit = 1ULL << dev;
    if (__builtin_expect(e->registered & bit, 1)) return 0;
    int rc = ki_ring_string(&d->ring, e->id, e->text, e->len);
    if (rc == 0) e->registered |= bit;
    return rc;
}

/* The string id of an NVTX range slot + 1 in device dev's ring, 0 when unknown. */
static uint32_t range_id(struct ki_cupti *g, struct ki_cupti_device *d, uint32_t dev, uint32_t slot1) {
    if (slot1 == 0 || slot1 > KI_CUPTI_RANGE_SLOTS) return 0;
    struct ki_cupti_name *e = &g->range_names[slot1 - 1];
    if (!e->text) {
        const struct ki_cupti_range *r = &g->ranges[slot1 - 1];
        if (!__atomic_load_n(&r->ready, __ATOMIC_ACQUIRE)) return 0;
        e->text = malloc(r->len + 1);
        if (!e->text) return 0;
        memcpy(e->text, r->text, r->len);
        e->text[r->len] = '\0';
        e->len = r->len;
        e->id = ++g->next_name_id;
    }
    return name_in_ring(d, dev, e) == 0 ? e->id : 0;
}

/* Ring records are not written one by one: up to KI_CUPTI_BATCH of them are built here first, then
 * written run by run (a run: consecutive records of one device) with one reservation of the run's
 * slots, one atomic step on the ring's head for up to KI_RING_RESERVE_MAX records instead of one
 * per record. Names and NVTX ranges are registered
 * (STRING records) while building, so they are in the ring before the records that use them. */
#define KI_CUPTI_BATCH 64u

struct ki_cupti_batch {
    size_t n;
    uint32_t last_id;               /* the device of the last kernel record, UINT32_MAX: none yet */
    struct ki_cupti_device *last;   /* its attached ring */
    struct ki_cupti_device *dev[KI_CUPTI_BATCH];
    struct ki_rec rec[KI_CUPTI_BATCH];
};

/* A record to fill in (zeroed), for device d. */
static inline struct ki_rec *batch_add(struct ki_cupti_batch *b, struct ki_cupti_device *d) {
    struct ki_rec *rec = &b->rec[b->n];
    b->dev[b->n++] = d;
    memset(rec, 0, sizeof *rec);
    return rec;
}

/* The next record, for device d, to be written whole by the caller. */
static inline struct ki_rec *batch_slot(struct ki_cupti_batch *b, struct ki_cupti_device *d) {
    b->dev[b->n] = d;
    return &b->rec[b->n++];
}

static void batch_write(struct ki_cupti_batch *b) {
    for (size_t i = 0, run; i < b->n; i += run) {
        struct ki_cupti_device *d = b->dev[i];
        for (run = 1; i + run < b->n && run < KI_RING_RESERVE_MAX && b->dev[i + run] == d; run++) {
        }
        uint64_t pos;
        int got = ki_ring_reserve(&d->ring, (unsigned)run, &pos);
        if (got < 0) { /* full: this record is refused, the next ones try again */
            d->counts[KI_CUPTI_RING_REFUSED]++;
            run = 1;
            continue;
        }
        run = (size_t)got;
        unsigned ok = ki_ring_put_n(&d->ring, pos, &b->rec[i], (unsigned)got);
        d->counts[KI_CUPTI_RECORDS_WRITTEN] += ok;
        d->counts[KI_CUPTI_RING_REFUSED] += (unsigned)got - ok;
    }
    b->n = 0;
}

static inline void note_context(struct ki_cupti *g, uint32_t ctx, uint32_t dev) {
    if (ctx < KI_CUPTI_CONTEXTS) g->context_device[ctx] = dev + 1;
}

/* ---- records ------------------------------------------------------------ */

/* CUPTI hands over the newest layout of its own version. The fields read here sit at the same
 * offsets in CUDA 12's layouts (Kernel8/9, Memcpy5, Synchronization, Context2) as in CUDA 13's, so
 * a CUDA 12 CUPTI (API version KI_CUPTI_MIN_API and up) is read through the CUDA 13 structs. */
#define KI_SAME(a, b, f) KI_STATIC_ASSERT(offsetof(a, f) == offsetof(b, f), #a "." #f " moved")
#define KI_SAME_KERNEL(T)                                                                                    \
    KI_SAME(T, CUpti_ActivityKernel10, start); KI_SAME(T, CUpti_ActivityKernel10, end);                      \
    KI_SAME(T, CUpti_ActivityKernel10, deviceId); KI_SAME(T, CUpti_ActivityKernel10, contextId);             \
    KI_SAME(T, CUpti_ActivityKernel10, streamId); KI_SAME(T, CUpti_ActivityKernel10, correlationId);         \
    KI_SAME(T, CUpti_ActivityKernel10, name)
KI_SAME_KERNEL(CUpti_ActivityKernel8);
KI_SAME_KERNEL(CUpti_ActivityKernel9);
KI_SAME(CUpti_ActivityMemcpy5, CUpti_ActivityMemcpy6, bytes);
KI_SAME(CUpti_ActivityMemcpy5, CUpti_ActivityMemcpy6, start);
KI_SAME(CUpti_ActivityMemcpy5, CUpti_ActivityMemcpy6, deviceId);
KI_SAME(CUpti_ActivityMemcpy5, CUpti_ActivityMemcpy6, contextId);
KI_SAME(CUpti_ActivityMemcpy5, CUpti_ActivityMemcpy6, correlationId);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, type);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, start);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, end);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, contextId);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, streamId);
KI_SAME(CUpti_ActivitySynchronization, CUpti_ActivitySynchronization2, cudaEventId);
KI_SAME(CUpti_ActivityContext2, CUpti_ActivityContext3, contextId);
KI_SAME(CUpti_ActivityContext2, CUpti_ActivityContext3, deviceId);

static void on_kernel(struct ki_cupti *g, struct ki_cupti_batch *b, const CUpti_ActivityKernel10 *k) {
    note_context(g, k->contextId, k->deviceId);
    struct ki_cupti_device *d = b->last; /* a buffer's kernels are mostly of one device */
    if (k->deviceId != b->last_id) {
        if (!(d = device_ring(g, k->deviceId))) return;
        b->last_id = k->deviceId;
        b->last = d;
    }
    uint16_t dev = (uint16_t)k->deviceId;
    struct ki_cupti_name *e = name_of(g, k->name);
    struct ki_cupti_launch l;
    int launch = ki_cupti_launch_find(g, k->correlationId, &l);
    if (!e || name_in_ring(d, dev, e) < 0) {
        d->counts[KI_CUPTI_RING_REFUSED] += 1u + (unsigned)launch; /* the kernel and its launch */
        return;
    }
    uint64_t corr = KI_CUPTI_CORRELATION_TAG | k->correlationId;
    /* Whole records (every byte set, the zeros too): no memset before the fields. */
    if (launch) {
        uint32_t range = l.range ? range_id(g, d, dev, l.range) : 0;
        *batch_slot(b, d) = (struct ki_rec){
            .type = KI_REC_LAUNCH, .flags = KI_FLAG_LAUNCH_SPAN, .device = dev, .id = e->id, .ts_ns = l.launch_ns,
            .u.launch = {.pid = d->ring.pid, .tid = l.tid, .grid = {(uint32_t)corr, (uint32_t)(corr >> 32), l.host_ns},
                         .block = {range, 0, 0}},
        };
    }
    uint64_t start = to_ring_ns(g, k->start);
    *batch_slot(b, d) = (struct ki_rec){
        .type = KI_REC_KERNEL, .device = dev, .id = e->id, .ts_ns = start,
        .u.kernel = {.end_ns = k->end >= k->start ? to_ring_ns(g, k->end) : start, .stream = k->streamId,
                     .correlation = corr, .pid = d->ring.pid},
    };
}

static void on_memop(struct ki_cupti *g, struct ki_cupti_batch *b, uint32_t kind, uint32_t dev, uint32_t ctx, uint64_t start, uint64_t bytes,
                     uint32_t corr) {
    note_context(g, ctx, dev);
    struct ki_cupti_device *d = device_ring(g, dev);
    if (!d) return;
    struct ki_cupti_launch l;
    struct ki_rec *rec = batch_add(b, d);
    rec->type = KI_REC_MEMOP;
    rec->device = (uint16_t)dev;
    rec->id = kind;
    rec->ts_ns = to_ring_ns(g, start);
    rec->u.memop.bytes = bytes;
    rec->u.memop.pid = d->ring.pid;
    rec->u.memop.tid = ki_cupti_launch_find(g, corr, &l) ? l.tid : 0;
}

static void on_sync(struct ki_cupti *g, struct ki_cupti_batch *b, const CUpti_ActivitySynchronization2 *s) {
    uint32_t kind, dev1 = s->contextId < KI_CUPTI_CONTEXTS ? g->context_device[s->contextId] : 0;
    uint64_t handle = s->streamId;
    switch (s->type) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: kind = KI_SYNC_STREAM; break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: kind = KI_SYNC_CONTEXT; handle = s->contextId; break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: kind = KI_SYNC_EVENT; handle = s->cudaEventId; break;
    default: return; /* a stream waiting on an event: no host thread waits */
    }
    if (dev1 == 0) {
        g->unknown_device++;
        return;
    }
    struct ki_cupti_device *d = device_ring(g, dev1 - 1);
    if (!d) return;
    struct ki_rec *rec = batch_add(b, d);
    rec->type = KI_REC_SYNC;
    rec->device = (uint16_t)(dev1 - 1);
    rec->id = kind;
    rec->ts_ns = to_ring_ns(g, s->start);
    rec->u.sync.duration_ns = s->end > s->start ? s->end - s->start : 0;
    rec->u.sync.handle = handle;
    rec->u.sync.pid = d->ring.pid;
}

size_t ki_cupti_activity_process(struct ki_cupti *g, uint8_t *buffer, size_t valid) {
    if (ki_ring_mono_ns() - g->clock_at_ns > 1000000000ULL) ki_cupti_clock_refresh(g); /* drift: ppm */
    struct ki_cupti_batch b;
    b.n = 0;
    b.last_id = UINT32_MAX;
    b.last = NULL;
    CUpti_Activity *a = NULL;
    size_t n = 0;
    while (g->api.ActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS && a) {
        n++;
        if (b.n > KI_CUPTI_BATCH - 2) batch_write(&b); /* room for the most one record adds */
        switch (a->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            on_kernel(g, &b, (const CUpti_ActivityKernel10 *)a);
            break;
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
            on_memop(g, &b, KI_MEM_MEMCPY, m->deviceId, m->contextId, m->start, m->bytes, m->correlationId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
            on_memop(g, &b, KI_MEM_MEMSET, m->deviceId, m->contextId, m->start, m->bytes, m->correlationId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
            on_sync(g, &b, (const CUpti_ActivitySynchronization2 *)a);
            break;
        case CUPTI_ACTIVITY_KIND_CONTEXT: {
            const CUpti_ActivityContext3 *c = (const CUpti_ActivityContext3 *)a;
            note_context(g, c->contextId, c->deviceId);
            break;
        }
        default:
            break;
        }
    }
    batch_write(&b);
    return n;
}

/* ---- the probe's own counts ---------------------------------------------- */

static const uint32_t count_metric[KI_CUPTI_COUNT_MAX] = {
    [KI_CUPTI_RECORDS_WRITTEN] = KI_METRIC_CUPTI_RECORDS,
    [KI_CUPTI_CUPTI_DROPPED] = KI_METRIC_CUPTI_DROPPED,
    [KI_CUPTI_RING_REFUSED] = KI_METRIC_CUPTI_RING_REFUSED,
    [KI_CUPTI_POOL_EXHAUSTED] = KI_METRIC_CUPTI_POOL_EXHAUSTED,
};

/* Add what grew since the last report to the ring header's counters (the agent ships them as
 * ki_agent_cupti_*_records_total): exact even when the ring is too full for the samples. */
static inline void header_add(uint64_t *counter, uint64_t total, uint64_t *added) {
    if (total > *added) KI_ADD_RLX(counter, total - *added);
    *added = total; /* (a count that went back, as the benchmark resets it, adds nothing) */
}

void ki_cupti_activity_report(struct ki_cupti *g) {
    int first = 1;
    uint64_t now = ki_ring_now_ns();
    for (uint32_t dev = 0; dev < KI_CUPTI_MAX_DEVICES; dev++) {
        struct ki_cupti_device *d = &g->devices[dev];
        if (!d->attached) continue;
        if (first) { /* the process's own counts go with its first GPU */
            d->counts[KI_CUPTI_CUPTI_DROPPED] = g->cupti_dropped_total;
            d->counts[KI_CUPTI_POOL_EXHAUSTED] = __atomic_load_n(&g->pool_exhausted, __ATOMIC_RELAXED);
            d->counts[KI_CUPTI_RING_REFUSED] += g->unknown_device; /* no ring to go to: a device past 63, */
            g->unknown_device = 0;                                  /* or a sync of an unknown context */
            header_add(&d->ring.hdr->cupti_dropped, g->cupti_dropped_total, &g->dropped_in_header);
            first = 0;
        }
        header_add(&d->ring.hdr->cupti_refused, d->counts[KI_CUPTI_RING_REFUSED], &d->refused_in_header);
        for (int c = 0; c < KI_CUPTI_COUNT_MAX; c++) {
            if (d->counts[c] == d->reported[c]) continue;
            if (ki_ring_sample(&d->ring, count_metric[c], (uint16_t)dev, now, (double)d->counts[c], d->ring.pid) == 0)
                d->reported[c] = d->counts[c];
        }
    }
}
