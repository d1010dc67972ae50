/* kstats.c - records into native histograms, kept spans, HISTOGRAMS sections (ki_kstats.h, docs/wire.md). */
#define _POSIX_C_SOURCE 200809L
#include "ki_kstats.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ki_histinc.h"
#include "ki_ring.h"
#include "ki_varint.h"

#define NS_PER_S 1000000000ULL
#define NS_PER_MS 1000000ULL

/* HISTOGRAMS columns, in wire order (docs/wire.md); C_COUNT_INC only in body version 4. */
enum {
    C_KIND, C_PRODUCER, C_ID, C_GPU, C_PID, C_STREAM, C_FLAGS, C_SCHEMA, C_ZT, C_ZC, C_COUNT, C_SUM,
    C_NPOS, C_NNEG, C_COUNT_INC, C_POS_OFF, C_POS_LEN, C_POS_DELTA, C_NEG_OFF, C_NEG_LEN, C_NEG_DELTA, NCOLS
};
#define FLAG_FIRST 0x01u     /* the histogram's first export since the agent started: a counter reset */
#define FLAG_INCREMENT 0x02u /* zero count and buckets added since the previous export (body version 4) */
#define SEEN_EXPORTED 0x01u
#define SEEN_CHANGED 0x02u
#define BASE_BYTES_DEFAULT (4u << 20) /* the bases' arena: pages touched only as used (ki_histinc.h) */
#define KEY_CACHE_BITS 8              /* 256 entries of 32 bytes: 8 KiB */

/* A direct-mapped cache of key -> slot in front of the table's lookup (slot_of). */
struct key_cache {
    uint64_t w[3]; /* the key's words (ki_histtab_slot_words) */
    uint32_t kind; /* EMPTY_KIND: an empty entry (no key has it: no slot compare per lookup) */
    int32_t slot;
};
#define EMPTY_KIND UINT32_MAX

struct ki_kstats {
    struct ki_kstats_config cfg;
    struct ki_histtab *tab;
    uint64_t *exported;   /* per slot: count at its last export */
    uint8_t *seen;        /* per slot: SEEN_EXPORTED once exported, SEEN_CHANGED when an export since the
                           * last sweep for idle keys shipped a change (no memory of its own: a byte) */
    double *tail_s;       /* per slot: spans above this many seconds are tail (+Inf: none yet); and
                           * tail_s[-1], +Inf: a refused key's kernel (slot -1) is never tail, with
                           * no test of the slot on the span decisions' common path */
    uint32_t tail_set;    /* slots whose tail_s is set (slots are handed out in order: pages of
                           * tail_s are touched only as keys arrive) */
    /* key -> slot for the keys seen last: a record's slot without a call into the table (its
     * hash, hash entry and key) for the few hundred keys a busy GPU runs at a time */
    struct key_cache *cache;
    /* sampling, per second of record time */
    uint64_t window_end_ns; /* record time the next second starts at (a comparison per record, not a
                             * division) */
    uint64_t window_kernels; /* kernels seen in it */
    uint64_t window_tail;    /* tail spans kept in it */
    uint64_t window_sampled; /* sampled spans kept in it (at most twice the rate: the first second,
                              * whose kernel rate is not known yet, and bursts) */
    uint64_t sample_gap;     /* kernels to go up to the next uniformly sampled one, counted down (1:
                              * this one; UINT64_MAX: none, sampling off): one decrement a kernel
                              * instead of a random number a kernel (draw_gap) */
    uint64_t window_tail_seen; /* tail candidates in it (slower than their threshold) */
    uint64_t tail_below;     /* keep a tail candidate when rng < this: span_tail_rate / the last
                              * second's candidates, so a capped tail is spread over the second
                              * instead of being its first span_tail_rate candidates */
    uint64_t rng;
    double sample_log;       /* ln(1 - p), p the sample probability of this second: span_sample_rate /
                              * the last second's kernels (0: p = 0, -Inf: p = 1) */
    uint64_t capture_max;    /* the latest capture_until: while no window runs (0), one comparison a
                              * kernel instead of the GPU's bound and its load */
    uint64_t capture_until[KI_KSTATS_MAX_GPUS];
    /* export */
    uint64_t next_export_ns; /* monotonic */
    uint64_t export_ts_ns;   /* realtime stamp of the export in progress */
    uint64_t last_ts_ns;     /* stamp of the export before it (0: none yet) */
    uint32_t cursor;         /* next slot to look at; == used: done */
    int exporting;
    uint8_t *col[NCOLS];     /* column scratch, section_max bytes each (touched only as used) */
    size_t col_len[NCOLS];
    struct ki_histogram_export ex; /* export scratch */
    struct ki_histogram_export inc; /* increment scratch (increments on) */
    struct ki_histinc *bases;      /* what was last shipped of each histogram (NULL: increments off) */
    uint64_t next_snapshot_ns;     /* monotonic: every histogram's next export after it is a snapshot */
    uint64_t next_sweep_ns;        /* monotonic: the next export after it evicts the idle keys (idle_ns) */
    uint32_t max_keys;             /* here, not with tab: the per-record fields above keep the offsets
                                    * they had before cfg grew by idle_ns) */
    int resend_next;               /* the next export re-sends unchanged histograms too (ki_kstats_snapshot all) */
    int hold_sweep;                /* batches wait to be settled: no sweep for idle keys (ki_kstats_hold_sweep) */
    int resend;                    /* the export in progress does */
    size_t room;             /* elements of each export array */
    size_t worst;            /* bytes one histogram can take in the columns */
    struct ki_kstats_stats st;
};

/* Empty the key cache (at the start, and after keys were evicted: an entry may name a slot that
 * now holds another key). */
static void forget_keys(struct ki_kstats *ks) {
    for (uint32_t i = 0; i < 1u << KEY_CACHE_BITS; i++) ks->cache[i] = (struct key_cache){{0, 0, 0}, EMPTY_KIND, -1};
}

struct ki_kstats *ki_kstats_create(const struct ki_kstats_config *cfg) {
    if (!cfg || cfg->interval_ns == 0 || !(cfg->tail_quantile > 0 && cfg->tail_quantile <= 1) ||
        cfg->section_max < 4096) {
        errno = EINVAL;
        return NULL;
    }
    /* Cache-line aligned: the per-record fields (key cache, sampling window) then sit in lines of
     * their own wherever the heap puts the struct. At malloc's 16-byte alignment the statically
     * linked agent's heap layout made loads of the one-entry key cache stall and every kernel cost more
     * CPU (`make bench-histogram`, its cpu phase: bench/results/histogram.md); aligned, both builds cost the same. */
    struct ki_kstats *ks = aligned_alloc(64, (sizeof *ks + 63) & ~(size_t)63);
    if (!ks) return NULL;
    memset(ks, 0, sizeof *ks);
    ks->cfg = *cfg;
    ks->tab = ki_histtab_create(&cfg->hist);
    if (!ks->tab) {
        int e = errno;
        free(ks);
        errno = e;
        return NULL;
    }
    ks->max_keys = cfg->hist.max_keys;
    ks->cache = aligned_alloc(64, sizeof *ks->cache << KEY_CACHE_BITS);
    ks->exported = calloc(ks->max_keys, sizeof *ks->exported);
    ks->seen = calloc(ks->max_keys, 1);
    ks->tail_s = malloc(((size_t)ks->max_keys + 1) * sizeof *ks->tail_s);
    if (ks->tail_s) *ks->tail_s++ = INFINITY; /* tail_s[-1] */
    ks->room = ki_histtab_export_room(ks->tab);
    ks->ex.pos_spans = malloc(ks->room * sizeof *ks->ex.pos_spans);
    ks->ex.neg_spans = malloc(ks->room * sizeof *ks->ex.neg_spans);
    ks->ex.pos_deltas = malloc(ks->room * sizeof *ks->ex.pos_deltas);
    ks->ex.neg_deltas = malloc(ks->room * sizeof *ks->ex.neg_deltas);
    if (cfg->snapshot_ns) {
        ks->inc.pos_spans = malloc(ks->room * sizeof *ks->inc.pos_spans);
        ks->inc.neg_spans = malloc(ks->room * sizeof *ks->inc.neg_spans);
        ks->inc.pos_deltas = malloc(ks->room * sizeof *ks->inc.pos_deltas);
        ks->inc.neg_deltas = malloc(ks->room * sizeof *ks->inc.neg_deltas);
        ks->bases = ki_histinc_create(ks->max_keys, ks->room, cfg->base_bytes ? cfg->base_bytes : BASE_BYTES_DEFAULT);
    }
    /* fixed columns at most 80 bytes; both signs together: a span (2 varints of 5) per bucket
     * at most, and up to 3 deltas of 10 bytes per bucket (gaps of two are filled with zeros) */
    ks->worst = 80 + KI_VARINT_MAX + (ks->room / 3) * (5 + 5 + 3 * KI_VARINT_MAX);
    int ok = ks->cache && ks->exported && ks->seen && ks->tail_s && ks->ex.pos_spans && ks->ex.neg_spans && ks->ex.pos_deltas &&
             ks->ex.neg_deltas && ks->worst < cfg->section_max &&
             (!cfg->snapshot_ns || (ks->bases && ks->inc.pos_spans && ks->inc.neg_spans && ks->inc.pos_deltas &&
                                    ks->inc.neg_deltas));
    for (int c = 0; ok && c < NCOLS; c++) ok = (ks->col[c] = malloc(cfg->section_max)) != NULL;
    if (!ok) {
        int e = ks->worst >= cfg->section_max && ks->ex.neg_deltas ? EINVAL : ENOMEM;
        ki_kstats_destroy(ks);
        errno = e;
        return NULL;
    }
    forget_keys(ks);
    ks->window_end_ns = NS_PER_S;
    ks->rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)ks;
    /* until a second has been counted: keep every span (up to twice the rate) */
    ks->sample_log = cfg->span_sample_rate ? -INFINITY : 0.0;
    ks->sample_gap = cfg->span_sample_rate ? 1 : UINT64_MAX;
    ks->tail_below = UINT64_MAX;
    return ks;
}

void ki_kstats_destroy(struct ki_kstats *ks) {
    if (!ks) return;
    ki_histtab_destroy(ks->tab);
    free(ks->cache);
    free(ks->exported);
    free(ks->seen);
    free(ks->tail_s ? ks->tail_s - 1 : NULL);
    free(ks->ex.pos_spans);
    free(ks->ex.neg_spans);
    free(ks->ex.pos_deltas);
    free(ks->ex.neg_deltas);
    free(ks->inc.pos_spans);
    free(ks->inc.neg_spans);
    free(ks->inc.pos_deltas);
    free(ks->inc.neg_deltas);
    ki_histinc_destroy(ks->bases);
    for (int c = 0; c < NCOLS; c++) free(ks->col[c]);
    free(ks);
}

static inline uint64_t next_random(struct ki_kstats *ks) {
    uint64_t x = ks->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return ks->rng = x;
}

/* Natural logarithm of x > 0 without libm (the agent links none: agent/src/Makefile): x = m 2^e with
 * m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.172; eight terms of
 * atanh's series leave ~1e-14 relative. Only draw_gap calls it, once per sampled span. */
static double ln_pos(double x) {
    int e;
    double m = frexp(x, &e); /* [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2;
        e--;
    }
    double t = (m - 1) / (m + 1), t2 = t * t, s = 0;
    for (int k = 15; k >= 1; k -= 2) s = s * t2 + 1.0 / k; /* 1 + t^2/3 + t^4/5 + ... + t^14/15 */
    return 2 * t * s + e * 0.69314718055994530942;
}

/* Kernels up to and including the next one the uniform sample keeps, at probability p per kernel
 * (ks->sample_log = ln(1 - p)): geometric, 1 + floor(ln(U) / ln(1 - p)) for U uniform in (0, 1).
 * Counting it down keeps each kernel with probability p independently, as a draw per kernel
 * would, for one random number per sampled span instead of one per kernel (at 1M kernels a
 * second and the default 50 spans: 50 draws instead of 1M). */
static uint64_t draw_gap(struct ki_kstats *ks) {
    if (ks->sample_log == 0.0) return UINT64_MAX;      /* p = 0 (sampling off) */
    if (ks->sample_log == -INFINITY) return 1;         /* p = 1 */
    double u = ((double)(next_random(ks) >> 11) + 0.5) * 0x1.0p-53; /* (0, 1) */
    double g = ln_pos(u) / ks->sample_log;             /* >= 0 */
    return g < 9.0e18 ? (uint64_t)g + 1 : UINT64_MAX;
}

/* The slot of the key (pid | gpu << 32, stream, name_id | producer << 32, kind): through the
 * key cache (one multiplication to its entry, the key compared with the entry's without a
 * branch per field), else the table's lookup, whose answer replaces the entry. -1 when the
 * table refused the key (the key and the observation counted there). */
static inline int32_t slot_of(struct ki_kstats *ks, uint64_t w0, uint64_t w1, uint64_t w2, uint32_t kind) {
    uint64_t mix = (w2 + (w0 << 20) + (w1 << 40) + ((uint64_t)kind << 58)) * 0x9E3779B97F4A7C15ULL;
    struct key_cache *e = &ks->cache[mix >> (64 - KEY_CACHE_BITS)];
    if (((w0 ^ e->w[0]) | (w1 ^ e->w[1]) | (w2 ^ e->w[2]) | (kind ^ e->kind)) == 0) return e->slot;
    int s = ki_histtab_slot_words(ks->tab, w0, w1, w2, kind);
    if (s < 0) {
        ki_histtab_refused(ks->tab, 1);
        return -1;
    }
    while (ks->tail_set <= (uint32_t)s) ks->tail_s[ks->tail_set++] = INFINITY; /* a new key */
    *e = (struct key_cache){{w0, w1, w2}, kind, s};
    return s;
}

/* A new second of record time: the sample probability for it from the last one's kernel rate. */
static void roll_window(struct ki_kstats *ks, uint64_t sec) {
    uint64_t rate = ks->cfg.span_sample_rate;
    if (!rate) ks->sample_log = 0.0;
    else if (ks->window_kernels <= rate) ks->sample_log = -INFINITY;
    else ks->sample_log = ln_pos(1.0 - (double)rate / (double)ks->window_kernels);
    ks->sample_gap = draw_gap(ks); /* the count so far is forgotten: a geometric gap has no memory */
    /* (window_sampled is 0 below: a gap that reaches 0 always finds the second under its cap) */
    uint64_t tail = ks->cfg.span_tail_rate;
    if (ks->window_tail_seen <= tail) ks->tail_below = UINT64_MAX;
    else ks->tail_below = (uint64_t)((double)tail / (double)ks->window_tail_seen * 18446744073709551615.0);
    ks->window_end_ns = (sec + 1) * NS_PER_S;
    ks->window_kernels = 0;
    ks->window_tail = 0;
    ks->window_tail_seen = 0;
    ks->window_sampled = 0;
}

/* Whether to keep the span of a KERNEL record observed as d seconds in slot s (-1: refused). */
static inline int kernel_keep(struct ki_kstats *ks, const struct ki_rec *k, int32_t s, double d) {
    if (k->ts_ns >= ks->window_end_ns) roll_window(ks, k->ts_ns / NS_PER_S);
    ks->window_kernels++;
    if ((k->ts_ns < ks->capture_max && k->device < KI_KSTATS_MAX_GPUS && k->ts_ns < ks->capture_until[k->device]) ||
        (k->flags & KI_FLAG_FAILED)) {
        ks->st.spans_captured++;
        return 1;
    }
    if (d > ks->tail_s[s]) { /* (tail_s[-1]: +Inf) */
        ks->window_tail_seen++;
        if (ks->window_tail < ks->cfg.span_tail_rate &&
            (ks->tail_below == UINT64_MAX || next_random(ks) <= ks->tail_below)) {
            ks->window_tail++;
            ks->st.spans_tail++;
            return 1;
        }
    }
    if (--ks->sample_gap == 0) {
        ks->window_sampled++;
        ks->st.spans_sampled++;
        /* At twice the rate none more this second: no count reaches 0 until roll_window draws again. */
        ks->sample_gap = ks->window_sampled < 2 * (uint64_t)ks->cfg.span_sample_rate ? draw_gap(ks) : UINT64_MAX;
        return 1;
    }
    return 0;
}

#define NOT_FOLDED (-2) /* a record no histogram takes (slot_of's -1: a key refused) */
#define FOLD_BLOCK 16    /* records folded a pass at a time (KI_RING_PEEK_BLOCK: the ring's blocks) */

/* A record's histogram slot (NOT_FOLDED, or -1: refused) and the value it adds (*v). */
static inline int32_t key_of(struct ki_kstats *ks, const struct ki_record *r, double *v) {
    const struct ki_rec *k = &r->rec;
    if (k->type == KI_REC_KERNEL) {
        *v = k->u.kernel.end_ns > k->ts_ns ? (double)(k->u.kernel.end_ns - k->ts_ns) * 1e-9 : 0.0;
        return slot_of(ks, k->u.kernel.pid | (uint64_t)k->device << 32, k->u.kernel.stream,
                       k->id | (uint64_t)r->producer << 32, KI_HIST_KERNEL);
    }
    if (k->flags & KI_FLAG_FAILED) return NOT_FOLDED;
    if (k->type == KI_REC_COLLECTIVE) {
        *v = (double)k->u.collective.duration_ns * 1e-9;
        return slot_of(ks, (uint64_t)k->device << 32, KI_HISTOGRAM_NO_STREAM, k->id, KI_HIST_NCCL);
    }
    if (k->type == KI_REC_MEMOP && k->id == KI_MEM_MEMCPY) {
        *v = (double)k->u.memop.bytes;
        return slot_of(ks, (uint64_t)k->device << 32, KI_HISTOGRAM_NO_STREAM, 0, KI_HIST_MEMCPY);
    }
    return NOT_FOLDED;
}

/* In blocks of FOLD_BLOCK records, three passes: every record's key to its slot, then the
 * observations, then which spans are kept. Each pass is a short loop whose turns do not depend
 * on each other, so the CPU overlaps the chains of dependent loads of several records (hash ->
 * hash entry -> key; histogram -> bucket index -> count) instead of waiting on one record's at a
 * time; the order of observations into one histogram, and of the sampling decisions, stays the
 * records' order.
 *
 * The span decision of the common kernel (inside the current second and after the last capture
 * window, not FAILED, not above its tail, not the sampled one) is tests that branch, each as
 * predictable as the kernels are alike, instead of kernel_keep's in full; such a kernel is
 * dropped and only counted, its counters in locals for the block rather than read-modify-writes
 * on ks chained through memory from record to record. Any other kernel goes through kernel_keep
 * with them written back: the same decisions as kernel_keep's for every record, bit for bit. */
/* Record times of a common kernel, from the last capture window's end (from) to the end of the
 * current second: from <= ts < window_end_ns is ts - from < this, one comparison. */
static inline uint64_t common_span(const struct ki_kstats *ks, uint64_t from) {
    return ks->window_end_ns > from ? ks->window_end_ns - from : 0;
}

size_t ki_kstats_feed(struct ki_kstats *ks, struct ki_record *recs, size_t n) {
    size_t w = 0;
    const double *const tail = ks->tail_s; /* tail[-1] (a refused key): +Inf */
    const uint64_t from = ks->capture_max;
    for (size_t b = 0; b < n; b += FOLD_BLOCK) {
        size_t m = n - b < FOLD_BLOCK ? n - b : FOLD_BLOCK;
        struct ki_record *blk = recs + b;
        int32_t slot[FOLD_BLOCK];
        double v[FOLD_BLOCK];
        for (size_t j = 0; j < m; j++) {
            slot[j] = key_of(ks, &blk[j], &v[j]);
            /* tail[slot] for the third pass, fetched while the observations run (integer arithmetic:
             * NOT_FOLDED's address lies before the array, and a prefetch never faults) */
            __builtin_prefetch((const void *)((uintptr_t)tail + (uintptr_t)(intptr_t)slot[j] * sizeof *tail));
        }
        ks->st.aggregated += ki_histtab_observe_slots(ks->tab, slot, v, m);
        uint64_t gap = ks->sample_gap, kernels = ks->window_kernels;
        uint64_t span = common_span(ks, from);
        for (size_t j = 0; j < m; j++) {
            const struct ki_rec *k = &blk[j].rec;
            int keep = 1;
            if (k->type == KI_REC_KERNEL) {
                if (k->ts_ns - from < span && !(k->flags & KI_FLAG_FAILED) && !(v[j] > tail[slot[j]]) && gap > 1) {
                    gap--;
                    kernels++;
                    continue;
                }
                ks->sample_gap = gap;
                ks->window_kernels = kernels;
                keep = kernel_keep(ks, k, slot[j], v[j]);
                gap = ks->sample_gap;
                kernels = ks->window_kernels;
                span = common_span(ks, from);
            }
            if (keep) {
                if (w != b + j) recs[w] = blk[j];
                w++;
            }
        }
        ks->sample_gap = gap;
        ks->window_kernels = kernels;
    }
    return w;
}

size_t ki_kstats_fold(void *arg, struct ki_record *recs, size_t n) { return ki_kstats_feed(arg, recs, n); }

/* Evict every key whose histogram shipped no change since the last sweep (an idle_ns ago or more)
 * and holds nothing unshipped: its last change went out in an export at least idle_ns ago, so
 * nothing is lost, and its slot, buckets and base go to new keys (a process that exited leaves
 * its keys behind: a workload restarted every hour would fill the table). Every other key starts
 * the next period unchanged. Runs at the start of an export, between folds: once per idle_ns,
 * one pass over the slots' flag bytes, nothing on the per-record path. */
static void sweep_idle(struct ki_kstats *ks) {
    struct ki_histtab_stats ts;
    ki_histtab_stats(ks->tab, &ts);
    int evicted = 0;
    for (uint32_t s = 0; s < (uint32_t)ts.slots; s++) {
        /* (a key never exported whose every observation was refused holds nothing either) */
        uint8_t seen = ks->seen[s];
        if ((seen == SEEN_EXPORTED || seen == 0) && ki_histtab_count(ks->tab, s) == ks->exported[s] &&
            ki_histtab_evict(ks->tab, s) == 0) {
            ks->exported[s] = 0;
            ks->seen[s] = 0; /* the slot's next key: a first export (counter reset) */
            ks->tail_s[s] = INFINITY;
            if (ks->bases) ki_histinc_forget(ks->bases, s);
            evicted = 1;
        } else {
            ks->seen[s] &= (uint8_t)~SEEN_CHANGED;
        }
    }
    if (evicted) forget_keys(ks);
}

int ki_kstats_want(struct ki_kstats *ks, uint64_t mono_ns, uint64_t real_ns) {
    if (ks->exporting) return 1;
    if (mono_ns < ks->next_export_ns) return 0;
    ks->next_export_ns = ks->next_export_ns && mono_ns - ks->next_export_ns < ks->cfg.interval_ns
                             ? ks->next_export_ns + ks->cfg.interval_ns
                             : mono_ns + ks->cfg.interval_ns;
    /* Each export is a sample of every series it holds: stamp it at least 1 ms (the store's
     * resolution) after the one before, so that two exports within a millisecond (at SIGTERM: a
     * batch sealed while draining the rest of the ring, then the last one) never give one
     * series two different values at one time. */
    if (ks->last_ts_ns && real_ns < ks->last_ts_ns + NS_PER_MS) real_ns = ks->last_ts_ns + NS_PER_MS;
    ks->export_ts_ns = ks->last_ts_ns = real_ns;
    ks->cursor = 0;
    ks->exporting = 1;
    ks->resend = ks->resend_next;
    ks->resend_next = 0;
    /* Not in an export that re-sends every histogram: an idle key's last change may be what it
     * re-sends (docs/wire.md, "Increments"); the sweep waits for the next export. */
    if (ks->cfg.idle_ns && mono_ns >= ks->next_sweep_ns && !ks->resend && !ks->hold_sweep) {
        sweep_idle(ks);
        ks->next_sweep_ns = mono_ns > UINT64_MAX - ks->cfg.idle_ns ? UINT64_MAX : mono_ns + ks->cfg.idle_ns;
    }
    if (ks->bases && mono_ns >= ks->next_snapshot_ns) { /* a snapshot of every histogram, now and then */
        ki_histinc_forget_all(ks->bases);
        ks->next_snapshot_ns = mono_ns == UINT64_MAX ? mono_ns : mono_ns + ks->cfg.snapshot_ns;
    }
    return 1;
}

int ki_kstats_pending(const struct ki_kstats *ks) { return ks->exporting; }

void ki_kstats_hold_sweep(struct ki_kstats *ks, int hold) { ks->hold_sweep = hold; }

int ki_kstats_increments(const struct ki_kstats *ks) { return ks->bases != NULL; }

void ki_kstats_snapshot(struct ki_kstats *ks, int all) {
    if (!ks->bases) return;
    ki_histinc_forget_all(ks->bases);
    if (all) ks->resend_next = 1;
}

size_t ki_kstats_section_bound(const struct ki_kstats *ks) {
    return 2 * KI_VARINT_MAX + ks->cfg.section_max + NCOLS * KI_VARINT_MAX;
}

static inline void put_uv(struct ki_kstats *ks, int c, uint64_t v) {
    ks->col_len[c] += ki_varint_put(ks->col[c] + ks->col_len[c], v);
}
static inline void put_sv(struct ki_kstats *ks, int c, int64_t v) { put_uv(ks, c, ki_zigzag((uint64_t)v)); }
static inline void put_f64(struct ki_kstats *ks, int c, double v) {
    memcpy(ks->col[c] + ks->col_len[c], &v, 8);
    ks->col_len[c] += 8;
}

/* One histogram's values into the columns: e is ks->ex (cumulative) or ks->inc (an increment). */
static void put_hist(struct ki_kstats *ks, const struct ki_histogram_key *key, uint8_t flags,
                     const struct ki_histogram_export *e, uint64_t count_inc) {
    ks->col[C_KIND][ks->col_len[C_KIND]++] = (uint8_t)key->kind;
    put_uv(ks, C_PRODUCER, key->producer);
    put_uv(ks, C_ID, key->name_id);
    put_uv(ks, C_GPU, key->gpu);
    put_uv(ks, C_PID, key->pid);
    put_uv(ks, C_STREAM, key->stream == KI_HISTOGRAM_NO_STREAM ? 0 : key->stream + 1);
    ks->col[C_FLAGS][ks->col_len[C_FLAGS]++] = flags;
    put_sv(ks, C_SCHEMA, e->schema);
    put_f64(ks, C_ZT, e->zero_threshold);
    put_uv(ks, C_ZC, e->zero_count);
    put_uv(ks, C_COUNT, e->count);
    put_f64(ks, C_SUM, e->sum);
    put_uv(ks, C_NPOS, e->n_pos_spans);
    put_uv(ks, C_NNEG, e->n_neg_spans);
    if (ks->bases) put_uv(ks, C_COUNT_INC, count_inc);
    for (uint32_t i = 0; i < e->n_pos_spans; i++) {
        put_sv(ks, C_POS_OFF, e->pos_spans[i].offset);
        put_uv(ks, C_POS_LEN, e->pos_spans[i].length);
    }
    for (uint32_t i = 0; i < e->n_pos_deltas; i++) put_sv(ks, C_POS_DELTA, e->pos_deltas[i]);
    for (uint32_t i = 0; i < e->n_neg_spans; i++) {
        put_sv(ks, C_NEG_OFF, e->neg_spans[i].offset);
        put_uv(ks, C_NEG_LEN, e->neg_spans[i].length);
    }
    for (uint32_t i = 0; i < e->n_neg_deltas; i++) put_sv(ks, C_NEG_DELTA, e->neg_deltas[i]);
}

int ki_kstats_encode(struct ki_kstats *ks, uint8_t *out, size_t cap, size_t *len, uint64_t *ts_ns,
                     void (*name)(void *arg, uint32_t producer, uint32_t id), void *arg) {
    *len = 0;
    *ts_ns = ks->export_ts_ns;
    if (cap < ki_kstats_section_bound(ks)) return -ENOBUFS;
    memset(ks->col_len, 0, sizeof ks->col_len);
    size_t total = 0, k = 0;
    struct ki_histtab_stats ts;
    ki_histtab_stats(ks->tab, &ts);
    uint32_t used = (uint32_t)ts.slots;
    uint32_t s = ks->cursor;
    /* A table of many keys exports in quarter sections: the buffers each part passes through
     * (columns, section, body, frame, zstd's context) are touched a quarter as far (~0.3 MB less
     * at 10,000 keys); a small table's export stays one section, compressed as one. */
    size_t part_max = used > ks->cfg.section_max / 64 ? ks->cfg.section_max / 4 : ks->cfg.section_max;
    for (; s < used; s++) {
        uint64_t count = ki_histtab_count(ks->tab, s);
        if (count == ks->exported[s] && ks->seen[s] && !ks->resend) continue;
        if (count == 0) continue; /* every observation refused so far */
        if (total && total + ks->worst > part_max) break; /* the rest goes in the next part */
        ki_histtab_export(ks->tab, s, &ks->ex);
        struct ki_histogram_key key;
        ki_histtab_key(ks->tab, s, &key);
        uint64_t count_inc = 0;
        if (ks->bases && ki_histinc_next(ks->bases, s, &ks->ex, &ks->inc, &count_inc) && ks->seen[s]) {
            put_hist(ks, &key, FLAG_INCREMENT, &ks->inc, count_inc);
            ks->st.increments_exported++;
        } else {
            put_hist(ks, &key, ks->seen[s] ? 0 : FLAG_FIRST, &ks->ex, 0);
        }
        if (name && key.kind == KI_HIST_KERNEL) name(arg, key.producer, key.name_id);
        total = 0;
        for (int c = 0; c < NCOLS; c++) total += ks->col_len[c];
        ks->seen[s] |= count != ks->exported[s] ? SEEN_EXPORTED | SEEN_CHANGED : SEEN_EXPORTED;
        ks->exported[s] = count;
        if (count >= ks->cfg.tail_min_count)
            ks->tail_s[s] = ki_histtab_quantile_upper(ks->tab, s, ks->cfg.tail_quantile);
        k++;
    }
    ks->cursor = s;
    if (s >= used) ks->exporting = 0;
    if (!k) return 0;
    ks->st.histograms_exported += k;
    size_t o = ki_varint_put(out, k);
    o += ki_varint_put(out + o, ks->export_ts_ns);
    for (int c = 0; c < NCOLS; c++) {
        if (c == C_COUNT_INC && !ks->bases) continue; /* body version 3 */
        o += ki_varint_put(out + o, ks->col_len[c]);
        memcpy(out + o, ks->col[c], ks->col_len[c]);
        o += ks->col_len[c];
    }
    *len = o;
    return 0;
}

void ki_kstats_capture(struct ki_kstats *ks, int gpu, uint64_t until_real_ns) {
    ks->capture_max = 0;
    for (int g = 0; g < KI_KSTATS_MAX_GPUS; g++) {
        if (gpu < 0 || g == gpu) ks->capture_until[g] = until_real_ns;
        if (ks->capture_until[g] > ks->capture_max) ks->capture_max = ks->capture_until[g];
    }
}

void ki_kstats_stats(const struct ki_kstats *ks, struct ki_kstats_stats *out) {
    *out = ks->st;
    ki_histtab_stats(ks->tab, &out->table);
}
