/*
 * Unit test: kernel statistics in the drain loop (kstats.c).
 *   test_kstats                 sampling, tail, capture, FAILED, other types, multi-part export,
 *                               and records folded straight from a real ring (ki_drain_poll_keep)
 *                               giving what ki_kstats_feed gives, torn records skipped, their
 *                               slots freed as read
 *   test_kstats section IN OUT  feed IN (raw 64-byte records), export every histogram, write the
 *                               HISTOGRAMS sections to OUT (each as u32 length + bytes); prints
 *                               "ok <kept records>"
 *   test_kstats increments IN OUT K SNAP  the same with increments on (body version 4): IN fed in K
 *                               chunks, an export after each (before the SNAP-th, ki_kstats_snapshot;
 *                               -1: never); OUT holds (u32 export, u32 length, bytes) per section;
 *                               prints "ok <increments exported> <keys evicted>"
 *   test_kstats increments IN OUT K SNAP IDLE  the same with histogram_idle_s IDLE (exports 1 s apart)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ki_ring.h"
#include "ki_drain.h"
#include "ki_kstats.h"
#include "ki_test.h"

#define NS 1000000000ULL
#define T0 (1700000000ULL * NS)

static struct ki_kstats_config config(uint32_t sample_rate, uint32_t tail_rate) {
    struct ki_kstats_config c = {
        .hist = {.schema = 3, .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD, .max_buckets = 160,
                 .max_keys = 1024},
        .interval_ns = NS,
        .span_sample_rate = sample_rate,
        .span_tail_rate = tail_rate,
        .tail_quantile = 0.99,
        .tail_min_count = 100,
        .section_max = 64 << 10,
    };
    return c;
}

static struct ki_record kernel(uint64_t pos, uint32_t name, uint16_t gpu, uint64_t ts, uint64_t dur_ns) {
    struct ki_record r;
    memset(&r, 0, sizeof r);
    r.pos = pos;
    r.producer = 1;
    r.rec.type = KI_REC_KERNEL;
    r.rec.device = gpu;
    r.rec.id = name;
    r.rec.ts_ns = ts;
    r.rec.u.kernel.end_ns = ts + dur_ns;
    r.rec.u.kernel.stream = 7;
    r.rec.u.kernel.pid = 42;
    return r;
}

static void push(struct ki_record *recs, size_t *n, uint32_t name, uint16_t gpu, uint64_t ts, uint64_t dur_ns) {
    recs[*n] = kernel(*n, name, gpu, ts, dur_ns);
    ++*n;
}

static uint64_t rng = 88172645463325252ULL;
static double uniform(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}
/* Long-tailed: 10 us median, one in 200 a Pareto straggler up to 100x. */
static uint64_t duration(void) {
    double d = 10000.0 * exp(0.3 * (uniform() + uniform() + uniform() - 1.5));
    if (uniform() < 0.005) d *= 1.0 + 1.0 / pow(1.0 - uniform(), 1.0 / 1.3);
    return (uint64_t)d;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t export_all(struct ki_kstats *ks, uint64_t mono, uint8_t *buf, size_t cap, FILE *out, int *parts) {
    size_t total = 0, len;
    uint64_t ts;
    CHECK(ki_kstats_want(ks, mono, T0 + 5 * NS));
    do {
        CHECK_EQ(ki_kstats_encode(ks, buf, cap, &len, &ts, NULL, NULL), 0);
        CHECK(ts >= T0 + 5 * NS); /* later exports of one table: 1 ms after the one before */
        if (len && out) {
            uint32_t l = (uint32_t)len;
            CHECK(fwrite(&l, 4, 1, out) == 1 && fwrite(buf, 1, len, out) == len);
        }
        if (len) ++*parts;
        total += len;
    } while (ki_kstats_pending(ks));
    return total;
}

/* ki_kstats_fold, checking what ki_ring_peek_keep hands it: verified records of one block at
 * most, in ring order after the block before. */
static size_t blocks_seen;
static uint64_t next_pos;
static size_t fold_checked(void *arg, struct ki_record *recs, size_t n) {
    CHECK(n >= 1 && n <= KI_RING_PEEK_BLOCK);
    for (size_t i = 0; i < n; i++) {
        CHECK(recs[i].pos >= next_pos);
        CHECK_EQ(recs[i].check, ki_ring_checksum(recs[i].pos, recs[i].producer, &recs[i].rec));
        next_pos = recs[i].pos + 1;
    }
    blocks_seen++;
    return ki_kstats_fold(arg, recs, n);
}

/* The agent's read path: records folded from their ring slots by ki_drain_poll_keep with
 * ki_kstats_fold keep exactly what ki_kstats_feed keeps of the same records, in order, give the
 * same histograms, and torn records (anywhere in a block) are counted and neither folded nor kept. */
static void ring_fold_matches_feed(void) {
    static struct ki_record sent[600], got[600];
    char name[64], err[256];
    snprintf(name, sizeof name, "/ki_test_kstats_fold.%d", (int)getpid());
    ki_ring_unlink(name);
    int rc = 0;
    struct ki_drain *d = ki_drain_create(name, 1, 1024, &rc, err, sizeof err);
    CHECK(d != NULL);
    struct ki_ring r;
    CHECK_EQ(ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err), 0);
    size_t n = 0;
    for (int i = 0; i < 600; i++) {
        struct ki_rec rec;
        memset(&rec, 0, sizeof rec);
        rec.ts_ns = T0 + (uint64_t)i * 1000;
        rec.device = (uint16_t)(i % 3);
        if (i % 50 == 7) { /* not folded: kept */
            rec.type = KI_REC_LAUNCH;
            rec.id = 3;
        } else if (i % 50 == 9) { /* folded into nccl_op_duration_seconds */
            rec.type = KI_REC_COLLECTIVE;
            rec.id = 1;
            rec.u.collective.duration_ns = 1000 + (uint64_t)i;
        } else {
            rec.type = KI_REC_KERNEL;
            rec.id = 1 + (uint32_t)(i % 5);
            rec.flags = i % 100 == 11 ? KI_FLAG_FAILED : 0; /* kept */
            rec.u.kernel.end_ns = rec.ts_ns + duration();
            rec.u.kernel.stream = (uint64_t)(i % 2);
            rec.u.kernel.pid = 42;
        }
        uint64_t pos = KI_LOAD_RLX(&r.hdr->head);
        CHECK_EQ(ki_ring_write(&r, &rec), 0);
        if (i == 123 || i == 160 || i == 175) {
            /* torn after publication: alone in a block, and a block's first and last record
             * (the first 16 records fill blocks 0..9 from position 0; 160 and 175 open and
             * close the eleventh) */
            r.slots[pos & r.mask].check ^= 1u;
            continue;
        }
        sent[n].pos = pos;
        sent[n].producer = r.producer_id;
        sent[n].check = r.slots[pos & r.mask].check;
        sent[n].rec = rec;
        n++;
    }
    struct ki_kstats_config cfg = config(0, 0); /* no sampled or tail spans: the kept set is fixed */
    struct ki_kstats *folded = ki_kstats_create(&cfg), *fed = ki_kstats_create(&cfg);
    CHECK(folded != NULL && fed != NULL);
    size_t kept = 0, read_total = 0, read;
    do { /* groups of 37: reads that end anywhere within the records */
        kept += ki_drain_poll_keep(d, got + kept, 37, fold_checked, folded, &read);
        read_total += read;
    } while (read);
    CHECK_EQ(read_total, n);
    struct ki_drain_stats ds;
    ki_drain_stats(d, &ds);
    CHECK_EQ(ds.torn, 3);
    CHECK(blocks_seen > 600 / KI_RING_PEEK_BLOCK);
    size_t want = ki_kstats_feed(fed, sent, n);
    CHECK_EQ(kept, want);
    CHECK_EQ(want, 12 + 12 + 6); /* launches and collectives (only kernels leave), FAILED kernels */
    CHECK(memcmp(got, sent, kept * sizeof got[0]) == 0);
    size_t cap = ki_kstats_section_bound(fed);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    size_t la, lb;
    uint64_t ta, tb;
    CHECK(ki_kstats_want(folded, 1, T0) && ki_kstats_want(fed, 1, T0));
    CHECK_EQ(ki_kstats_encode(folded, a, cap, &la, &ta, NULL, NULL), 0);
    CHECK_EQ(ki_kstats_encode(fed, b, cap, &lb, &tb, NULL, NULL), 0);
    CHECK(la > 0 && la == lb && memcmp(a, b, la) == 0);
    struct ki_kstats_stats st;
    ki_kstats_stats(folded, &st);
    CHECK_EQ(st.aggregated, n - 12); /* all but the launches: kernels (FAILED ones observed too), collectives */
    ki_drain_commit(d);
    ki_drain_stats(d, &ds);
    CHECK_EQ(ds.backlog, 0);
    CHECK_EQ(KI_LOAD_RLX(&r.hdr->consumed), n);
    free(a);
    free(b);
    ki_kstats_destroy(folded);
    ki_kstats_destroy(fed);
    ki_ring_close(&r);
    ki_drain_destroy(d);
    ki_ring_unlink(name);
}

/* The fold path frees each slot as it reads it (ki_ring_consume_keep, docs/ring.md): with a full
 * ring, records folded but not yet committed leave room for as many new ones (the peek path of
 * ki_drain_poll holds them until the commit); a consumer that dies before its commit leaves them
 * freed behind tail, and the next one skips them (protocol step 4): read once, never twice. */
static void fold_frees_slots_as_read(void) {
    char name[64], err[256];
    snprintf(name, sizeof name, "/ki_test_kstats_free.%d", (int)getpid());
    ki_ring_unlink(name);
    int rc = 0;
    struct ki_drain *d = ki_drain_create(name, 1, 64, &rc, err, sizeof err);
    CHECK(d != NULL);
    struct ki_ring r;
    CHECK_EQ(ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err), 0);
    uint64_t written = 0;
    while (ki_ring_kernel(&r, 1, 0, T0 + written, T0 + written + 1000, 7, written) == 0) written++;
    CHECK_EQ(written, 64); /* full */
    struct ki_record out[64];
    size_t read;
    CHECK_EQ(ki_drain_poll(d, out, 8), 8); /* peeked: held until the commit */
    CHECK_EQ(ki_ring_kernel(&r, 1, 0, T0, T0 + 1000, 7, 99), KI_RING_DROPPED);
    struct ki_kstats_config cfg = config(0, 0);
    struct ki_kstats *ks = ki_kstats_create(&cfg);
    CHECK(ks != NULL);
    CHECK_EQ(ki_drain_poll_keep(d, out, 40, ki_kstats_fold, ks, &read), 0); /* every kernel folded */
    CHECK_EQ(read, 40);
    CHECK_EQ(ki_ring_kernel(&r, 1, 0, T0, T0 + 1000, 7, 99), KI_RING_DROPPED); /* in order: the 8 come first */
    ki_drain_commit(d); /* frees the 8 peeked, moves tail past all 48 */
    struct ki_drain_stats ds;
    ki_drain_stats(d, &ds);
    CHECK_EQ(ds.backlog, 16);
    CHECK_EQ(KI_LOAD_RLX(&r.hdr->consumed), 48);
    CHECK_EQ(ki_drain_poll_keep(d, out, 10, ki_kstats_fold, ks, &read), 0);
    CHECK_EQ(read, 10);
    for (uint64_t i = written; i < written + 48 + 10; i++) /* the 10 folded since the commit too */
        CHECK_EQ(ki_ring_kernel(&r, 1, 0, T0 + i, T0 + i + 1000, 7, i), 0);
    written += 58;
    CHECK_EQ(ki_ring_kernel(&r, 1, 0, T0, T0 + 1000, 7, 99), KI_RING_DROPPED);
    ki_drain_destroy(d); /* dies: the 10 read, freed, not committed */
    d = ki_drain_create(name, 0, 0, &rc, err, sizeof err);
    CHECK(d != NULL);
    uint64_t seen = 0, expect = 58; /* the ten are skipped: correlations 58.. in order */
    size_t got;
    while ((got = ki_drain_poll(d, out, 64)) > 0) {
        for (size_t i = 0; i < got; i++) CHECK_EQ(out[i].rec.u.kernel.correlation, expect++);
        seen += got;
        ki_drain_commit(d);
    }
    CHECK_EQ(seen, written - 58);
    CHECK_EQ(expect, written);
    struct ki_kstats_stats st;
    ki_kstats_stats(ks, &st);
    CHECK_EQ(st.aggregated, 50);
    ki_kstats_destroy(ks);
    ki_ring_close(&r);
    ki_drain_destroy(d);
    ki_ring_unlink(name);
}

/* ki_kstats_feed works in blocks of passes (slots, observations, decisions): fed all at once it
 * keeps, counts and exports exactly what it does fed one record at a time, with spans kept as
 * tail, keys refused by a full table in the middle of blocks, other record types
 * and FAILED kernels among them, and a run of one key (the key cache). */
static void blocks_match_single_records(void) {
    static struct ki_record a[5000], b[5000];
    size_t n = 0;
    for (int i = 0; i < 5000; i++) {
        /* more names than max_keys now and then; else 20 names, each with a tail, in runs at times */
        uint32_t name = i % 700 < 200 ? 1 + (uint32_t)(uniform() * 1200) : i % 700 < 260 ? 7 : 1 + (uint32_t)(uniform() * 20);
        push(a, &n, name, (uint16_t)(i % 2), T0 + (uint64_t)i * 700000, duration() * (1 + name % 5)); /* kernels differ */
        if (i % 97 == 5) a[n - 1].rec.flags = KI_FLAG_FAILED;
        if (i % 89 == 3) {
            a[n - 1].rec.type = KI_REC_COLLECTIVE;
            a[n - 1].rec.u.collective.duration_ns = 5000 + (uint64_t)i;
        }
        if (i % 83 == 2) a[n - 1].rec.type = KI_REC_LAUNCH;
    }
    memcpy(b, a, sizeof a);
    /* No uniform sample and no cap on the tail: every decision is deterministic (each table seeds
     * its random numbers from its own address, so two tables would sample differently). */
    struct ki_kstats_config cfg = config(0, 1000000);
    struct ki_kstats *one = ki_kstats_create(&cfg), *all = ki_kstats_create(&cfg);
    CHECK(one != NULL && all != NULL);
    size_t cap = ki_kstats_section_bound(one), kept_one = 0, kept_all = 0, la, lb;
    uint8_t *x = malloc(cap), *y = malloc(cap);
    uint64_t ta, tb;
    for (int half = 0; half < 2; half++) { /* the second half with tail thresholds from an export */
        size_t lo = half * n / 2, hi = (half + 1) * n / 2;
        for (size_t i = lo; i < hi; i++) {
            size_t k = ki_kstats_feed(one, &a[i], 1);
            if (k) a[kept_one++] = a[i];
        }
        size_t k = ki_kstats_feed(all, &b[lo], hi - lo);
        memmove(&b[kept_all], &b[lo], k * sizeof b[0]);
        kept_all += k;
        CHECK_EQ(kept_all, kept_one);
        CHECK(memcmp(a, b, kept_one * sizeof a[0]) == 0);
        CHECK(ki_kstats_want(one, (uint64_t)(half + 1) * 10 * NS, T0) && ki_kstats_want(all, (uint64_t)(half + 1) * 10 * NS, T0));
        do {
            CHECK_EQ(ki_kstats_encode(one, x, cap, &la, &ta, NULL, NULL), 0);
            CHECK_EQ(ki_kstats_encode(all, y, cap, &lb, &tb, NULL, NULL), 0);
            CHECK(la == lb && memcmp(x, y, la) == 0);
        } while (ki_kstats_pending(one));
        CHECK(!ki_kstats_pending(all));
    }
    struct ki_kstats_stats so, sa;
    ki_kstats_stats(one, &so);
    ki_kstats_stats(all, &sa);
    CHECK(so.table.keys_refused > 0 && so.spans_tail > 0 && so.spans_captured > 0 && so.aggregated > 4000);
    CHECK(memcmp(&so, &sa, sizeof so) == 0);
    free(x);
    free(y);
    ki_kstats_destroy(one);
    ki_kstats_destroy(all);
}

static void units(void) {
    static struct ki_record recs[40000];
    static double first[10000];
    size_t cap;
    /* 1. No sampling, no tail yet: only the first second keeps (no rate known), then only the
     * tail once the histogram has been exported; other types always. */
    struct ki_kstats_config cfg = config(0, 1000000);
    struct ki_kstats *ks = ki_kstats_create(&cfg);
    CHECK(ks != NULL);
    cap = ki_kstats_section_bound(ks);
    uint8_t *buf = malloc(cap);
    size_t n = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t d = duration();
        first[i] = (double)d;
        push(recs, &n, 1, 0, T0 + (uint64_t)i * 1000, d);
    }
    qsort(first, 10000, sizeof first[0], cmp_double);
    double p99 = first[9899]; /* rank ceil(0.99 * 10000) */
    CHECK_EQ(ki_kstats_feed(ks, recs, n), 0); /* sample rate 0 and no tail known: nothing kept */
    int parts = 0;
    CHECK(export_all(ks, 1, buf, cap, NULL, &parts) > 0);
    CHECK_EQ(parts, 1);
    /* The tail threshold is now the p99 bucket's upper bound: about 1% of new spans pass it. */
    n = 0;
    uint64_t slow = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t d = duration();
        push(recs, &n, 1, 0, T0 + NS + (uint64_t)i * 1000, d);
    }
    size_t kept = ki_kstats_feed(ks, recs, n);
    for (size_t i = 0; i < kept; i++) {
        CHECK_EQ(recs[i].rec.type, KI_REC_KERNEL);
        slow += (double)(recs[i].rec.u.kernel.end_ns - recs[i].rec.ts_ns) > p99;
    }
    CHECK(kept > 20 && kept < 200); /* ~1% of 10,000 */
    CHECK_EQ(slow, kept);           /* every kept one is slower than the exact p99 seen so far */
    struct ki_kstats_stats st;
    ki_kstats_stats(ks, &st);
    CHECK_EQ(st.aggregated, 20000);
    CHECK_EQ(st.spans_tail, kept);
    CHECK_EQ(st.table.keys, 1);
    /* 2. Capture window on GPU 1 keeps all of GPU 1, nothing more of GPU 0; FAILED always kept. */
    ki_kstats_capture(ks, 1, T0 + 3 * NS);
    n = 0;
    for (int i = 0; i < 100; i++) push(recs, &n, 2, 1, T0 + 2 * NS + (uint64_t)i, 5000);
    for (int i = 0; i < 100; i++) push(recs, &n, 2, 0, T0 + 2 * NS + (uint64_t)i, 5000);
    recs[n - 1].rec.flags = KI_FLAG_FAILED;
    push(recs, &n, 2, 1, T0 + 3 * NS, 5000); /* just after the window */
    kept = ki_kstats_feed(ks, recs, n);
    CHECK_EQ(kept, 101);
    CHECK_EQ(recs[100].rec.device, 0);
    CHECK_EQ(recs[100].rec.flags, KI_FLAG_FAILED);
    /* 3. NCCL ops, memcpys and other records: aggregated (not memcpy-free memops) and all kept. */
    n = 0;
    for (int i = 0; i < 10; i++) {
        struct ki_record r;
        memset(&r, 0, sizeof r);
        r.rec.type = KI_REC_COLLECTIVE;
        r.rec.id = 1;
        r.rec.ts_ns = T0 + 3 * NS;
        r.rec.u.collective.duration_ns = 1000000;
        recs[n++] = r;
        r.rec.type = KI_REC_MEMOP;
        r.rec.id = KI_MEM_MEMCPY;
        r.rec.u.memop.bytes = 4096;
        recs[n++] = r;
        r.rec.id = KI_MEM_ALLOC;
        recs[n++] = r;
        r.rec.type = KI_REC_ERROR;
        recs[n++] = r;
    }
    CHECK_EQ(ki_kstats_feed(ks, recs, n), 40);
    ki_kstats_stats(ks, &st);
    CHECK_EQ(st.aggregated, 20000 + 201 + 20);
    CHECK_EQ(st.table.keys, 1 + 2 + 2); /* kernel 1; kernel 2 on two GPUs; one NCCL op; memcpy */
    /* Only histograms that changed are exported again. */
    parts = 0;
    export_all(ks, 2 * NS, buf, cap, NULL, &parts);
    ki_kstats_stats(ks, &st);
    CHECK_EQ(st.histograms_exported, 1 + 5);
    CHECK(!ki_kstats_want(ks, 2 * NS, T0)); /* the next one is due one interval after the last was due */
    /* Exports within one millisecond of real time get distinct stamps, 1 ms apart (SIGTERM's last
     * export after one sealed while draining): one series never has two values at one time. */
    {
        size_t len;
        uint64_t ts1, ts2;
        CHECK(ki_kstats_want(ks, 10 * NS, T0 + 9 * NS));
        CHECK_EQ(ki_kstats_encode(ks, buf, cap, &len, &ts1, NULL, NULL), 0);
        CHECK(!ki_kstats_pending(ks));
        CHECK(ki_kstats_want(ks, 20 * NS, T0 + 9 * NS));
        CHECK_EQ(ki_kstats_encode(ks, buf, cap, &len, &ts2, NULL, NULL), 0);
        CHECK_EQ(ts1, T0 + 9 * NS);
        CHECK_EQ(ts2, T0 + 9 * NS + 1000000);
    }
    ki_kstats_destroy(ks);

    /* 3b. A capped tail spreads over the second: at 100,000 kernels a second (~1,000 above p99)
     * and at most 50 tail spans a second, the kept ones of a second are not its first 50
     * candidates (the first ~5% of it) but a sample of all of them. */
    cfg = config(0, 50);
    ks = ki_kstats_create(&cfg);
    n = 0;
    for (int i = 0; i < 10000; i++) push(recs, &n, 4, 0, T0 + (uint64_t)i * 10, duration());
    ki_kstats_feed(ks, recs, n);
    parts = 0;
    export_all(ks, 1, buf, cap, NULL, &parts); /* the tail threshold is known from here */
    for (int sec = 1; sec <= 3; sec++) {
        uint64_t kept_s = 0, last_ns = 0;
        for (int chunk = 0; chunk < 25; chunk++) { /* 100,000 kernels in chunks of 4,000 */
            n = 0;
            for (int i = 0; i < 4000; i++)
                push(recs, &n, 4, 0, T0 + (uint64_t)sec * NS + (uint64_t)(chunk * 4000 + i) * 10000, duration());
            size_t k = ki_kstats_feed(ks, recs, n);
            kept_s += k;
            for (size_t i = 0; i < k; i++) last_ns = recs[i].rec.ts_ns;
        }
        CHECK(kept_s <= 50);
        if (sec == 1) continue; /* the first second after the threshold: no candidate count yet */
        CHECK(kept_s >= 20);
        CHECK(last_ns > T0 + (uint64_t)sec * NS + NS / 2); /* kept ones reach into its second half */
    }
    ki_kstats_destroy(ks);

    /* 4. Uniform sample: at 10,000 kernels per second and 100 per second, about 1%. */
    cfg = config(100, 0);
    ks = ki_kstats_create(&cfg);
    uint64_t total_kept = 0;
    for (int s = 0; s < 5; s++) {
        n = 0;
        for (int i = 0; i < 10000; i++) push(recs, &n, 3, 0, T0 + (uint64_t)s * NS + (uint64_t)i * 1000, 1000);
        total_kept += ki_kstats_feed(ks, recs, n);
    }
    /* second 0: its first 200 (no rate known yet, capped at twice the rate); seconds 1..4 ~100 each */
    CHECK(total_kept > 200 + 250 && total_kept < 200 + 600);
    ki_kstats_destroy(ks);

    /* 5. Many histograms: the export comes in parts no larger than section_max. */
    cfg = config(0, 0);
    cfg.hist.max_keys = 4096;
    ks = ki_kstats_create(&cfg);
    n = 0;
    for (uint32_t k = 0; k < 4000; k++)
        for (int i = 0; i < 8; i++) push(recs, &n, k, 0, T0, 1000u << i);
    ki_kstats_feed(ks, recs, n);
    parts = 0;
    export_all(ks, 1, buf, cap, NULL, &parts);
    ki_kstats_stats(ks, &st);
    CHECK_EQ(st.histograms_exported, 4000);
    CHECK(parts >= 2);
    free(buf);
    ki_kstats_destroy(ks);
    /* 7. Every key grows at once (8 -> 16 -> 32 -> 64 slots): the pool is compacted, and every
     * histogram still holds exactly its observations. */
    {
        struct ki_histogram_config hc = {.schema = 3, .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD,
                                         .max_buckets = 160, .max_keys = 2000};
        struct ki_histtab *t = ki_histtab_create(&hc);
        CHECK(t != NULL);
        for (int b = 0; b < 40; b++)
            for (uint32_t k = 0; k < 2000; k++) {
                struct ki_histogram_key key = {k, 0, 1, k, 1, KI_HIST_KERNEL, 0};
                CHECK_EQ(ki_histtab_observe(t, &key, 1e-6 * pow(1.1, b) * (1 + k % 7)), 0);
            }
        struct ki_histtab_stats hs;
        ki_histtab_stats(t, &hs);
        CHECK(hs.compactions > 0);
        static struct ki_histogram_span sp[1024], sn[1024];
        static int64_t dp[1024], dn[1024];
        CHECK(ki_histtab_export_room(t) <= 1024);
        for (uint32_t k = 0; k < 2000; k++) {
            struct ki_histogram_key key = {k, 0, 1, k, 1, KI_HIST_KERNEL, 0};
            int s = ki_histtab_find(t, &key);
            CHECK(s >= 0);
            struct ki_histogram_export e = {.pos_spans = sp, .neg_spans = sn, .pos_deltas = dp, .neg_deltas = dn};
            CHECK_EQ(ki_histtab_export(t, (uint32_t)s, &e), 0);
            CHECK_EQ(e.count, 40);
            int32_t idx = 0, want[40];
            for (int b = 0; b < 40; b++) want[b] = ki_histogram_index(1e-6 * pow(1.1, b) * (1 + k % 7), 3);
            int got = 0, d = 0;
            int64_t c = 0;
            for (uint32_t i = 0; i < e.n_pos_spans; i++) {
                idx = i ? idx + sp[i].offset : sp[i].offset;
                for (uint32_t j = 0; j < sp[i].length; j++, idx++) {
                    c += dp[d++];
                    if (c == 0) continue; /* a filled gap */
                    CHECK_EQ(c, 1);
                    CHECK_EQ(idx, want[got]);
                    got++;
                }
            }
            CHECK_EQ(got, 40);
        }
        ki_histtab_destroy(t);
    }
    /* 8. Idle keys (idle_ns 10 s, exports 1 s apart): evicted at the first sweep after a whole
     * sweep period without a shipped change, never while a change is unshipped; the slot, its
     * cache entry and its tail threshold go to the next new key. */
    {
        struct ki_kstats_config ic = config(0, 0);
        ic.idle_ns = 10 * NS;
        ic.hist.max_keys = 16;
        struct ki_kstats *ik = ki_kstats_create(&ic);
        CHECK(ik != NULL);
        size_t icap = ki_kstats_section_bound(ik), ilen;
        uint8_t *ib = malloc(icap);
        CHECK(ib != NULL);
        struct ki_record r[16];
        uint64_t ts;
        size_t in;
        for (uint64_t sec = 1; sec <= 40; sec++) {
            in = 0;
            push(r, &in, 2, 0, T0 + sec * NS, 1000); /* kernel 2: busy throughout */
            if (sec == 1) push(r, &in, 1, 0, T0 + sec * NS, 1000); /* kernel 1: once, then idle */
            /* kernel 3: shipped at 5, unchanged through 11..21 but changed right before the sweep at 21:
             * that change is not shipped yet, so it stays */
            if (sec == 5 || sec == 21) push(r, &in, 3, 0, T0 + sec * NS, 1000);
            ki_kstats_feed(ik, r, in);
            CHECK(ki_kstats_want(ik, sec * NS, T0 + sec * NS)); /* sweeps at 1, 11, 21, 31 */
            do CHECK_EQ(ki_kstats_encode(ik, ib, icap, &ilen, &ts, NULL, NULL), 0);
            while (ki_kstats_pending(ik));
            ki_kstats_stats(ik, &st);
            /* kernel 1 shipped at 1, unchanged through the period 11..21: evicted at 21 */
            CHECK_EQ(st.table.evicted, sec < 21 ? 0 : 1);
            CHECK_EQ(st.table.keys, sec < 5 ? 2 : sec < 21 ? 3 : 2);
        }
        /* kernel 1 comes back: a new key (the cached slot of kernel 2 is still right) */
        in = 0;
        push(r, &in, 1, 0, T0 + 41 * NS, 1000);
        push(r, &in, 2, 0, T0 + 41 * NS, 1000);
        ki_kstats_feed(ik, r, in);
        ki_kstats_stats(ik, &st);
        CHECK_EQ(st.table.keys, 3);
        CHECK_EQ(st.table.slots, 3);
        free(ib);
        ki_kstats_destroy(ik);
    }
    /* 9. A held sweep (the agent's spool not empty): an idle key due for eviction at 21 (as kernel 1
     * above) stays while the sweep is held (21..25), and goes at the first export after it is
     * released (26). */
    {
        struct ki_kstats_config ic = config(0, 0);
        ic.idle_ns = 10 * NS;
        struct ki_kstats *ik = ki_kstats_create(&ic);
        CHECK(ik != NULL);
        size_t icap = ki_kstats_section_bound(ik), ilen;
        uint8_t *ib = malloc(icap);
        CHECK(ib != NULL);
        struct ki_record r[4];
        uint64_t ts;
        size_t in = 0;
        push(r, &in, 1, 0, T0 + NS, 1000); /* kernel 1: once, then idle */
        ki_kstats_feed(ik, r, in);
        for (uint64_t sec = 1; sec <= 30; sec++) {
            ki_kstats_hold_sweep(ik, sec >= 21 && sec <= 25);
            CHECK(ki_kstats_want(ik, sec * NS, T0 + sec * NS)); /* sweeps at 1, 11, (21..25 held) 26 */
            do CHECK_EQ(ki_kstats_encode(ik, ib, icap, &ilen, &ts, NULL, NULL), 0);
            while (ki_kstats_pending(ik));
            ki_kstats_stats(ik, &st);
            CHECK_EQ(st.table.evicted, sec < 26 ? 0 : 1);
            CHECK_EQ(st.table.keys, sec < 26 ? 1 : 0);
        }
        free(ib);
        ki_kstats_destroy(ik);
    }
    /* 6. Bad settings. */
    cfg = config(0, 0);
    cfg.section_max = 100;
    CHECK(ki_kstats_create(&cfg) == NULL);
    cfg = config(0, 0);
    cfg.tail_quantile = 0;
    CHECK(ki_kstats_create(&cfg) == NULL);
    ki_kstats_destroy(NULL);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "section")) {
        FILE *in = fopen(argv[2], "rb");
        CHECK(in != NULL);
        static struct ki_record recs[1 << 16];
        struct ki_kstats_config cfg = config(0, 0);
        struct ki_kstats *ks = ki_kstats_create(&cfg);
        CHECK(ks != NULL);
        size_t got, kept = 0;
        while ((got = fread(recs, sizeof recs[0], sizeof recs / sizeof recs[0], in)) > 0)
            kept += ki_kstats_feed(ks, recs, got);
        fclose(in);
        size_t cap = ki_kstats_section_bound(ks);
        uint8_t *buf = malloc(cap);
        FILE *out = fopen(argv[3], "wb");
        CHECK(out != NULL);
        int parts = 0;
        export_all(ks, 1, buf, cap, out, &parts);
        fclose(out);
        free(buf);
        ki_kstats_destroy(ks);
        printf("ok %zu\n", kept);
        return 0;
    }
    if ((argc == 6 || argc == 7) && !strcmp(argv[1], "increments")) {
        FILE *in = fopen(argv[2], "rb");
        CHECK(in != NULL);
        static struct ki_record recs[1 << 20];
        size_t n = fread(recs, sizeof recs[0], sizeof recs / sizeof recs[0], in);
        fclose(in);
        int k = atoi(argv[4]), snap = atoi(argv[5]);
        struct ki_kstats_config cfg = config(0, 0);
        cfg.snapshot_ns = 3600 * NS; /* no periodic snapshot within the test */
        if (argc == 7) cfg.idle_ns = (uint64_t)atoi(argv[6]) * NS;
        struct ki_kstats *ks = ki_kstats_create(&cfg);
        CHECK(ks != NULL);
        CHECK(ki_kstats_increments(ks));
        size_t cap = ki_kstats_section_bound(ks), len;
        uint8_t *buf = malloc(cap);
        FILE *out = fopen(argv[3], "wb");
        CHECK(out != NULL);
        for (int j = 0; j < k; j++) {
            size_t lo = n * (size_t)j / (size_t)k, hi = n * (size_t)(j + 1) / (size_t)k;
            ki_kstats_feed(ks, recs + lo, hi - lo);
            if (j == snap) ki_kstats_snapshot(ks, 1);
            uint64_t ts;
            CHECK(ki_kstats_want(ks, (uint64_t)(j + 1) * NS, T0 + (uint64_t)(j + 5) * NS));
            do {
                CHECK_EQ(ki_kstats_encode(ks, buf, cap, &len, &ts, NULL, NULL), 0);
                uint32_t e = (uint32_t)j, l = (uint32_t)len;
                if (len) CHECK(fwrite(&e, 4, 1, out) == 1 && fwrite(&l, 4, 1, out) == 1 && fwrite(buf, 1, len, out) == len);
            } while (ki_kstats_pending(ks));
        }
        fclose(out);
        free(buf);
        struct ki_kstats_stats st;
        ki_kstats_stats(ks, &st);
        ki_kstats_destroy(ks);
        printf("ok %llu %llu\n", (unsigned long long)st.increments_exported, (unsigned long long)st.table.evicted);
        return 0;
    }
    units();
    blocks_match_single_records();
    ring_fold_matches_feed();
    fold_frees_slots_as_read();
    printf("ok\n");
    return 0;
}
