/*
 * ki_probe.h - CUDA-event spans from C, C++ and CUDA code into a GPU's ring
 * (docs/probes.md, "CUDA-event timings").  Header-only, on top of ki_ring.h.
 *
 * A span records a cudaEvent pair on a stream; nothing synchronises on the
 * hot path.  ki_probe_reap() (called every KI_PROBE_REAP_EVERY ends, or by
 * you) asks cudaEventQuery whether the oldest spans have finished, reads
 * cudaEventElapsedTime and writes one KERNEL record per span, after the span's
 * host side (a LAUNCH record flagged LAUNCH_SPAN: when begin was called, on which
 * thread, how long until end; docs/ring.md).  Without CUDA
 * (a host compiler without -DKI_PROBE_CUDA, or -DKI_PROBE_CPU) the same API
 * times with CLOCK_MONOTONIC, so the logic can be tested anywhere.
 *
 *     struct ki_probe p; char err[256];
 *     if (ki_probe_init(&p, 0, "/kernel_insight.0", err, sizeof err) < 0) puts(err);
 *     uint32_t gemm = ki_probe_name(&p, "gemm");
 *     int s = ki_probe_begin(&p, gemm, stream);
 *     my_kernel<<<grid, block, 0, stream>>>(...);
 *     ki_probe_end(&p, s);
 *     ...
 *     ki_probe_close(&p);   // waits for the spans in flight, writes them
 *
 * C++: { ki::Span span(p, gemm, stream); my_kernel<<<...>>>(...); }
 *
 * Timestamps: the device time of an event is placed on CLOCK_REALTIME through
 * an anchor event synchronised at init and at every ki_probe_flush(); between
 * flushes each reaped span's end event becomes the next anchor, so elapsed
 * times stay short (cudaEventElapsedTime returns float milliseconds).
 * Not thread-safe: use one struct ki_probe per thread (each is its own producer).
 */
#ifndef KI_PROBE_H
#define KI_PROBE_H

#include "ki_ring.h"

#include <stdlib.h>

#if !defined(KI_PROBE_CPU) && (defined(__CUDACC__) || defined(KI_PROBE_CUDA))
#define KI_PROBE_USE_CUDA 1
#include <cuda_runtime.h>
#else
#define KI_PROBE_USE_CUDA 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KI_PROBE_MAX_INFLIGHT
#define KI_PROBE_MAX_INFLIGHT 4096u /* spans between begin and reap; a power of two */
#endif
#ifndef KI_PROBE_REAP_EVERY
#define KI_PROBE_REAP_EVERY 64u /* ki_probe_end reaps (without blocking) this often */
#endif

#if KI_PROBE_USE_CUDA
typedef cudaEvent_t ki_probe_event;
typedef cudaStream_t ki_probe_stream;
#else
typedef uint64_t ki_probe_event; /* CLOCK_MONOTONIC ns when recorded */
typedef void *ki_probe_stream;
#endif

struct ki_probe_span {
    ki_probe_event start, end;
    uint64_t launch_ns; /* CLOCK_REALTIME when begin was called (the host side) */
    uint64_t host_ns;   /* host time from begin to end */
    uint64_t stream;   /* stream handle, for the record */
    uint32_t name_id;  /* string id from ki_probe_name */
    uint32_t ended;    /* end recorded */
};

struct ki_probe {
    struct ki_ring ring;       /* producer handle of the GPU's ring */
    uint16_t device;           /* GPU index written into records */
    uint32_t tid;              /* the thread that owns this probe (its launches' thread) */
    uint32_t next_name;        /* last string id handed out */
    uint64_t head, tail;       /* spans begun / spans reaped */
    uint64_t correlation;      /* span sequence number */
    uint64_t written, dropped; /* KERNEL records written; spans lost (ring full, too many in flight) */
    ki_probe_event anchor;     /* an event whose CLOCK_REALTIME is anchor_ns */
    uint64_t anchor_ns;
    struct ki_probe_span spans[KI_PROBE_MAX_INFLIGHT];
};

/* ---- clock back ends ------------------------------------------------------ */

#if KI_PROBE_USE_CUDA
static inline int ki_probe__ev_create(ki_probe_event *e) { return cudaEventCreate(e) == cudaSuccess ? 0 : -EIO; }
static inline void ki_probe__ev_destroy(ki_probe_event e) { cudaEventDestroy(e); }
static inline void ki_probe__ev_record(ki_probe_event e, ki_probe_stream s) { cudaEventRecord(e, s); }
static inline int ki_probe__ev_done(ki_probe_event e) { return cudaEventQuery(e) == cudaSuccess; }
static inline void ki_probe__ev_wait(ki_probe_event e) { cudaEventSynchronize(e); }
static inline int64_t ki_probe__ev_elapsed_ns(ki_probe_event a, ki_probe_event b) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) return 0;
    return (int64_t)((double)ms * 1e6);
}
#else
static inline int ki_probe__ev_create(ki_probe_event *e) { *e = 0; return 0; }
static inline void ki_probe__ev_destroy(ki_probe_event e) { (void)e; }
static inline void ki_probe__ev_record(ki_probe_event e, ki_probe_stream s) { (void)e; (void)s; }
static inline int ki_probe__ev_done(ki_probe_event e) { (void)e; return 1; }
static inline void ki_probe__ev_wait(ki_probe_event e) { (void)e; }
static inline int64_t ki_probe__ev_elapsed_ns(ki_probe_event a, ki_probe_event b) { return (int64_t)(b - a); }
#endif

/* Record an event: the CPU back end stores the time in the slot itself. */
static inline void ki_probe__record(ki_probe_event *e, ki_probe_stream s) {
#if KI_PROBE_USE_CUDA
    ki_probe__ev_record(*e, s);
#else
    (void)s;
    *e = ki_ring_mono_ns();
#endif
}

/* This thread's id, from /proc/thread-self (POSIX calls only: gettid() needs _GNU_SOURCE); 0 if unknown. */
static inline uint32_t ki_probe__tid(void) {
    char link[64];
    ssize_t n = readlink("/proc/thread-self", link, sizeof link - 1);
    if (n <= 0) return 0;
    link[n] = '\0';
    const char *t = strrchr(link, '/');
    return t ? (uint32_t)strtoul(t + 1, NULL, 10) : 0;
}

/* Anchor: record on the default stream, wait for it, note the wall clock. */
static inline void ki_probe__anchor(struct ki_probe *p) {
    ki_probe__record(&p->anchor, 0);
    ki_probe__ev_wait(p->anchor);
    p->anchor_ns = ki_ring_now_ns();
}

/* ---- API ---------------------------------------------------------------------- */

/* Attach to the ring (ring_name, e.g. "/kernel_insight.0") as a producer and
 * create the event pool.  Returns 0 or a negative errno with err filled. */
static inline int ki_probe_init(struct ki_probe *p, uint16_t device, const char *ring_name, char *err,
                                size_t errlen) {
    memset(p, 0, sizeof *p);
    int rc = ki_ring_attach(&p->ring, ring_name, KI_RING_PRODUCER | KI_RING_CREATE, err, errlen);
    if (rc < 0) return rc;
    p->device = device;
    p->tid = ki_probe__tid();
    if (ki_probe__ev_create(&p->anchor) < 0) goto fail;
    for (uint32_t i = 0; i < KI_PROBE_MAX_INFLIGHT; i++)
        if (ki_probe__ev_create(&p->spans[i].start) < 0 || ki_probe__ev_create(&p->spans[i].end) < 0) goto fail;
    ki_probe__anchor(p);
    return 0;
fail:
    if (err && errlen) snprintf(err, errlen, "ki_probe_init: cannot create timing events (is there a CUDA device?)");
    ki_ring_close(&p->ring);
    return -EIO;
}

/* A new string id for a span name (write it once, keep the id). 0 if the ring refused the name. */
static inline uint32_t ki_probe_name(struct ki_probe *p, const char *name) {
    uint32_t id = ++p->next_name;
    return ki_ring_string(&p->ring, id, name, strlen(name)) == 0 ? id : 0;
}

/* Write the spans whose end event has completed, oldest first; with block,
 * wait for all of them.  Returns the number written. */
static inline int ki_probe_reap(struct ki_probe *p, int block) {
    int n = 0;
    while (p->tail < p->head) {
        struct ki_probe_span *s = &p->spans[p->tail & (KI_PROBE_MAX_INFLIGHT - 1)];
        if (!s->ended) break; /* still open */
        if (!ki_probe__ev_done(s->end)) {
            if (!block) break;
            ki_probe__ev_wait(s->end);
        }
        int64_t since = ki_probe__ev_elapsed_ns(p->anchor, s->start);
        int64_t dur = ki_probe__ev_elapsed_ns(s->start, s->end);
        uint64_t start_ns = p->anchor_ns + (uint64_t)since;
        uint64_t end_ns = start_ns + (uint64_t)(dur > 0 ? dur : 0);
        uint64_t corr = ++p->correlation;
        ki_ring_launch_span(&p->ring, s->name_id, p->device, s->launch_ns, p->tid, corr, s->host_ns);
        int rc = ki_ring_kernel(&p->ring, s->name_id, p->device, start_ns, end_ns, s->stream, corr);
        if (rc == 0) {
            p->written++;
            n++;
        } else {
            p->dropped++;
        }
        /* The end event is the next anchor (short elapsed times keep float ms precise): swap it in. */
        ki_probe_event old = p->anchor;
        p->anchor = s->end;
        p->anchor_ns = end_ns;
        s->end = old;
        s->ended = 0;
        p->tail++;
    }
    return n;
}

/* Start a span on a stream; returns its slot, or -1 when too many are in flight (counted in dropped). */
static inline int ki_probe_begin(struct ki_probe *p, uint32_t name_id, ki_probe_stream stream) {
    if (p->head - p->tail >= KI_PROBE_MAX_INFLIGHT) {
        ki_probe_reap(p, 0);
        if (p->head - p->tail >= KI_PROBE_MAX_INFLIGHT) {
            p->dropped++;
            return -1;
        }
    }
    uint64_t slot = p->head++;
    struct ki_probe_span *s = &p->spans[slot & (KI_PROBE_MAX_INFLIGHT - 1)];
    s->name_id = name_id;
    s->stream = (uint64_t)(uintptr_t)stream;
    s->ended = 0;
    s->launch_ns = ki_ring_now_ns();
    ki_probe__record(&s->start, stream);
    return (int)(slot & (KI_PROBE_MAX_INFLIGHT - 1));
}

/* End the span begun as slot (ignored when slot < 0); reaps now and then without blocking. */
static inline void ki_probe_end(struct ki_probe *p, int slot) {
    if (slot < 0) return;
    struct ki_probe_span *s = &p->spans[slot];
    ki_probe__record(&s->end, (ki_probe_stream)(uintptr_t)s->stream);
    s->host_ns = ki_ring_now_ns() - s->launch_ns;
    s->ended = 1;
    if ((p->head & (KI_PROBE_REAP_EVERY - 1)) == 0) ki_probe_reap(p, 0);
}

/* Wait for every ended span, write it, and re-anchor on the wall clock. */
static inline int ki_probe_flush(struct ki_probe *p) {
    int n = ki_probe_reap(p, 1);
    ki_probe__anchor(p);
    return n;
}

/* Flush, free the events, detach from the ring; safe on a zeroed or closed probe. */
static inline void ki_probe_close(struct ki_probe *p) {
    if (!p || !p->ring.hdr) return;
    ki_probe_reap(p, 1);
    ki_probe__ev_destroy(p->anchor);
    for (uint32_t i = 0; i < KI_PROBE_MAX_INFLIGHT; i++) {
        ki_probe__ev_destroy(p->spans[i].start);
        ki_probe__ev_destroy(p->spans[i].end);
    }
    ki_ring_close(&p->ring);
}

#ifdef __cplusplus
} /* extern "C" */

namespace ki {
/* RAII span: begins in the constructor, ends in the destructor. */
class Span {
  public:
    Span(struct ki_probe &p, uint32_t name_id, ki_probe_stream stream = 0) : p_(p), slot_(ki_probe_begin(&p, name_id, stream)) {}
    ~Span() { ki_probe_end(&p_, slot_); }
    Span(const Span &) = delete;
    Span &operator=(const Span &) = delete;

  private:
    struct ki_probe &p_;
    int slot_;
};
} // namespace ki
#endif

#endif /* KI_PROBE_H */
