/*
 * Unit test: native-histogram accumulators (histogram.c).
 *   test_histogram                     the published examples (below), edge cases, and the drain
 *                                      loop's block observation (ki_histtab_observe_slots) giving
 *                                      what one observation at a time gives, at every schema
 *   test_histogram index IN OUT        IN: float64 values; OUT: int32 index per (schema -4..8, value)
 *   test_histogram export SCHEMA IN    observe IN under one key, print the exported histogram
 * Expected numbers are copied from prometheus/client_golang prometheus/histogram_test.go
 * (TestGetLe, TestNativeHistogram; commit 89c60c05).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "ki_histogram.h"
#include "ki_histogram_bounds.h"
#include "ki_test.h"

#define ROOM 4096
static struct ki_histogram_span ps[ROOM], ns[ROOM];
static int64_t pd[ROOM], nd[ROOM];

static struct ki_histogram_export export_one(struct ki_histtab *t, uint32_t slot) {
    CHECK(ki_histtab_export_room(t) <= ROOM);
    struct ki_histogram_export e = {.pos_spans = ps, .neg_spans = ns, .pos_deltas = pd, .neg_deltas = nd};
    CHECK_EQ(ki_histtab_export(t, slot, &e), 0);
    return e;
}

struct scenario {
    const char *name;
    double obs[16];
    int nobs;
    int32_t schema; /* client_golang's schema for the factor of the case */
    double zt, max_zt;
    uint32_t max_buckets;
    uint64_t count, zero_count;
    double sum, want_zt;
    int32_t want_schema;
    int32_t pspans[8], nspans[8]; /* offset, length pairs; terminated by length 0 */
    int64_t pdeltas[8], ndeltas[8];
    int npd, nnd;
};

#define ZT KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD
static const struct scenario SCENARIOS[] = {
    {"factor 1.1 results in schema 3", {0, 1, 2, 3}, 4, 3, ZT, 0, 1000, 4, 1, 6, ZT, 3,
     {0, 1, 7, 1, 4, 1}, {0}, {1, 0, 0}, {0}, 3, 0},
    {"factor 1.2 results in schema 2", {0, 1, 1.2, 1.4, 1.8, 2}, 6, 2, ZT, 0, 1000, 6, 1, 7.4, ZT, 2,
     {0, 5}, {0}, {1, -1, 2, -2, 2}, {0}, 5, 0},
    {"factor 4 results in schema -1",
     {0.0156251, 0.0625, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 3.5, 5, 6, 7, 33.33}, 14, -1, ZT, 0, 1000, 14, 0,
     63.2581251, ZT, -1, {-2, 6}, {0}, {2, 0, 0, 2, -1, -2}, {0}, 6, 0},
    {"factor 17 results in schema -2",
     {0.0156251, 0.0625, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 3.5, 5, 6, 7, 33.33}, 14, -2, ZT, 0, 1000, 14, 0,
     63.2581251, ZT, -2, {-1, 4}, {0}, {2, 2, 3, -6}, {0}, 4, 0},
    {"negative buckets", {0, -1, -1.2, -1.4, -1.8, -2}, 6, 2, ZT, 0, 1000, 6, 1, -7.4, ZT, 2,
     {0}, {0, 5}, {0}, {1, -1, 2, -2, 2}, 0, 5},
    {"negative and positive buckets", {0, -1, -1.2, -1.4, -1.8, -2, 1, 1.2, 1.4, 1.8, 2}, 11, 2, ZT, 0, 1000, 11,
     1, 0, ZT, 2, {0, 5}, {0, 5}, {1, -1, 2, -2, 2}, {1, -1, 2, -2, 2}, 5, 5},
    {"wide zero bucket", {0, -1, -1.2, -1.4, -1.8, -2, 1, 1.2, 1.4, 1.8, 2}, 11, 2, 1.4, 0, 1000, 11, 7, 0, 1.4,
     2, {4, 1}, {4, 1}, {2}, {2}, 1, 1},
    {"+Inf observation", {0, 1, 1.2, 1.4, 1.8, 2, INFINITY}, 7, 2, ZT, 0, 1000, 7, 1, INFINITY, ZT, 2,
     {0, 5, 4092, 1}, {0}, {1, -1, 2, -2, 2, -1}, {0}, 6, 0},
    {"-Inf observation", {0, 1, 1.2, 1.4, 1.8, 2, -INFINITY}, 7, 2, ZT, 0, 1000, 7, 1, -INFINITY, ZT, 2,
     {0, 5}, {4097, 1}, {1, -1, 2, -2, 2}, {1}, 5, 1},
    {"limited buckets but nothing triggered", {0, 1, 1.2, 1.4, 1.8, 2}, 6, 2, ZT, 0, 4, 6, 1, 7.4, ZT, 2,
     {0, 5}, {0}, {1, -1, 2, -2, 2}, {0}, 5, 0},
    {"buckets limited by halving resolution", {0, 1, 1.1, 1.2, 1.4, 1.8, 2, 3}, 8, 2, ZT, 0, 4, 8, 1, 11.5, ZT, 1,
     {0, 5}, {0}, {1, 2, -1, -2, 1}, {0}, 5, 0},
    {"buckets limited by widening the zero bucket", {0, 1, 1.1, 1.2, 1.4, 1.8, 2, 3}, 8, 2, ZT, 1.2, 4, 8, 2,
     11.5, 1, 2, {1, 7}, {0}, {1, 1, -2, 2, -2, 0, 1}, {0}, 7, 0},
    {"buckets limited by widening the zero bucket twice", {0, 1, 1.1, 1.2, 1.4, 1.8, 2, 3, 4}, 9, 2, ZT, 1.2, 4, 9,
     3, 15.5, 1.189207115002721, 2, {2, 7}, {0}, {2, -2, 2, -2, 0, 1, 0}, {0}, 7, 0},
    {"buckets limited by halving resolution, negative observations", {0, -1, -1.1, -1.2, -1.4, -1.8, -2, -3}, 8, 2,
     ZT, 0, 4, 8, 1, -11.5, ZT, 1, {0}, {0, 5}, {0}, {1, 2, -1, -2, 1}, 0, 5},
    {"buckets limited by widening the zero bucket, negative observations", {0, -1, -1.1, -1.2, -1.4, -1.8, -2, -3},
     8, 2, ZT, 1.2, 4, 8, 2, -11.5, 1, 2, {0}, {1, 7}, {0}, {1, 1, -2, 2, -2, 0, 1}, 0, 7},
    {"buckets limited by widening the zero bucket twice, negative observations",
     {0, -1, -1.1, -1.2, -1.4, -1.8, -2, -3, -4}, 9, 2, ZT, 1.2, 4, 9, 3, -15.5, 1.189207115002721, 2, {0}, {2, 7},
     {0}, {2, -2, 2, -2, 0, 1, 0}, 0, 7},
};

static void check_spans(const char *name, const struct ki_histogram_span *got, uint32_t n, const int32_t *want) {
    uint32_t k = 0;
    while (k < 4 && want[2 * k + 1] != 0) k++;
    if (n != k) fprintf(stderr, "%s: %u spans, want %u\n", name, n, k);
    CHECK_EQ(n, k);
    for (uint32_t i = 0; i < n; i++) {
        CHECK_EQ(got[i].offset, want[2 * i]);
        CHECK_EQ(got[i].length, want[2 * i + 1]);
    }
}

static void run_scenario(const struct scenario *s) {
    fprintf(stderr, "scenario: %s\n", s->name); /* names the failing case */
    struct ki_histogram_config cfg = {s->schema, s->zt, s->max_buckets, s->max_zt, 4};
    struct ki_histtab *t = ki_histtab_create(&cfg);
    CHECK(t != NULL);
    struct ki_histogram_key k = {1, 0, KI_HISTOGRAM_NO_STREAM, 7};
    for (int i = 0; i < s->nobs; i++) CHECK_EQ(ki_histtab_observe(t, &k, s->obs[i]), 0);
    struct ki_histogram_export e = export_one(t, 0);
    CHECK_EQ(e.count, s->count);
    CHECK_EQ(e.zero_count, s->zero_count);
    CHECK(e.sum == s->sum || fabs(e.sum - s->sum) < 1e-9);
    CHECK(e.zero_threshold == s->want_zt);
    CHECK_EQ(e.schema, s->want_schema);
    check_spans(s->name, e.pos_spans, e.n_pos_spans, s->pspans);
    check_spans(s->name, e.neg_spans, e.n_neg_spans, s->nspans);
    CHECK_EQ(e.n_pos_deltas, s->npd);
    CHECK_EQ(e.n_neg_deltas, s->nnd);
    for (int i = 0; i < s->npd; i++) CHECK_EQ(e.pos_deltas[i], s->pdeltas[i]);
    for (int i = 0; i < s->nnd; i++) CHECK_EQ(e.neg_deltas[i], s->ndeltas[i]);
    ki_histtab_destroy(t);
}

static void unit(void) {
    /* TestGetLe */
    static const struct { int32_t key, schema; double want; } LE[] = {
        {-1, -1, 0.25}, {0, -1, 1}, {1, -1, 4}, {512, -1, DBL_MAX}, {513, -1, INFINITY},
        {-1, 0, 0.5}, {0, 0, 1}, {1, 0, 2}, {1024, 0, DBL_MAX}, {1025, 0, INFINITY},
        {-1, 2, 0.8408964152537144}, {0, 2, 1}, {1, 2, 1.189207115002721}, {4096, 2, DBL_MAX}, {4097, 2, INFINITY},
    };
    for (size_t i = 0; i < sizeof LE / sizeof LE[0]; i++) CHECK(ki_histogram_upper(LE[i].key, LE[i].schema) == LE[i].want);
    /* The bounds table: entry 2j of schema s is entry j of schema s-1, and every entry is 2^(j/2^s-1) within
     * 8 ulp (client_golang's table was built by repeated multiplication: entries 109, 111, 125 of schema 7 are
     * 3-4 ulp below exp2, which is why the table is copied, not recomputed). */
    for (int s = 1; s <= 8; s++)
        for (int j = 0; j < (1 << s); j++) {
            double b = ki_histogram_bounds[s][j], x = exp2((double)j / (1 << s) - 1);
            CHECK(fabs(b - x) <= 8 * DBL_EPSILON * x);
            if (j % 2 == 0) CHECK(b == ki_histogram_bounds[s - 1][j / 2]);
            if (j > 0) CHECK(b > ki_histogram_bounds[s][j - 1]);
        }
    /* Edge cases: powers of two are upper bounds (bucket (2^(k-1), 2^k] at schema 0), boundaries belong below. */
    for (int s = KI_HISTOGRAM_SCHEMA_MIN; s <= KI_HISTOGRAM_SCHEMA_MAX; s++) {
        CHECK_EQ(ki_histogram_index(1.0, s), 0);
        CHECK_EQ(ki_histogram_index(-1.0, s), 0);
        CHECK_EQ(ki_histogram_index(nextafter(1.0, 2), s), 1);
        CHECK_EQ(ki_histogram_index(INFINITY, s), ki_histogram_index(DBL_MAX, s) + 1);
        for (int32_t i = -300; i <= 300; i += 7) { /* every upper bound is in its own bucket, the next double above */
            double u = ki_histogram_upper(i, s);
            if (u == 0 || u == DBL_MAX || isinf(u) || u < DBL_MIN) continue;
            CHECK_EQ(ki_histogram_index(u, s), i);
            CHECK_EQ(ki_histogram_index(nextafter(u, INFINITY), s), i + 1);
        }
        CHECK(ki_histogram_upper(ki_histogram_index(DBL_MAX, s), s) == DBL_MAX);
    }
    CHECK_EQ(ki_histogram_index(4.0, 0), 2);
    CHECK_EQ(ki_histogram_index(4.0, -1), 1);
    CHECK_EQ(ki_histogram_index(DBL_MIN / 4, 0), -1024); /* subnormal 2^-1024: the upper bound of bucket -1024 */
    for (size_t i = 0; i < sizeof SCENARIOS / sizeof SCENARIOS[0]; i++) run_scenario(&SCENARIOS[i]);

    /* NaN: counted, no bucket, sum NaN. Tiny values in the zero bucket. */
    struct ki_histogram_config cfg = {3, ZT, 8, 0, 2};
    struct ki_histtab *t = ki_histtab_create(&cfg);
    CHECK(t != NULL);
    struct ki_histogram_key a = {10, 0, KI_HISTOGRAM_NO_STREAM, 1}, b = {10, 0, 3, 1}, c = {11, 0, 3, 1};
    CHECK_EQ(ki_histtab_observe(t, &a, NAN), 0);
    CHECK_EQ(ki_histtab_observe(t, &a, 1e-40), 0);
    CHECK_EQ(ki_histtab_observe(t, &a, -1e-300), 0);
    CHECK_EQ(ki_histtab_observe(t, &a, ZT), 0);
    CHECK_EQ(ki_histtab_observe(t, &a, nextafter(ZT, 1)), 0);
    struct ki_histogram_export e = export_one(t, 0);
    CHECK_EQ(e.count, 5);
    CHECK_EQ(e.zero_count, 3);
    CHECK(isnan(e.sum));
    CHECK_EQ(e.n_pos_spans, 1);
    CHECK_EQ(e.pos_spans[0].offset, -128 * 8 + 1);
    /* The table: keys are distinct by stream and pid; a full table refuses and counts. */
    CHECK_EQ(ki_histtab_observe(t, &b, 0.5), 0);
    CHECK_EQ(ki_histtab_observe(t, &c, 0.5), -ENOSPC);
    CHECK_EQ(ki_histtab_observe(t, &c, 0.5), -ENOSPC);
    CHECK_EQ(ki_histtab_find(t, &b), 1);
    CHECK_EQ(ki_histtab_find(t, &c), -ENOENT);
    struct ki_histogram_key got_key;
    CHECK_EQ(ki_histtab_key(t, 1, &got_key), 0);
    CHECK(got_key.stream == 3 && got_key.pid == 10 && got_key.name_id == 1);
    CHECK_EQ(ki_histtab_key(t, 2, &got_key), -ENOENT);
    CHECK_EQ(ki_histtab_export(t, 2, &e), -ENOENT);
    struct ki_histtab_stats st;
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.keys, 2);
    CHECK_EQ(st.keys_refused, 2);
    CHECK_EQ(st.obs_refused, 2);
    ki_histtab_destroy(t);
    /* Refusal at schema -4: 1 bucket allowed, a second magnitude cannot be merged in. */
    struct ki_histogram_config tiny = {-4, 0, 1, 0, 1};
    t = ki_histtab_create(&tiny);
    CHECK_EQ(ki_histtab_observe(t, &a, 1), 0);
    CHECK_EQ(ki_histtab_observe(t, &a, 1e100), -ERANGE);
    CHECK_EQ(ki_histtab_observe(t, &a, 0.5), 0); /* same bucket as 1 at schema -4: (2^-16, 1] */
    e = export_one(t, 0);
    CHECK_EQ(e.count, 2);
    CHECK(e.sum == 1.5);
    CHECK_EQ(e.n_pos_deltas, 1);
    CHECK_EQ(e.pos_deltas[0], 2);
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.bucket_refused, 1);
    ki_histtab_destroy(t);
    /* A small shared pool (64 narrow bucket slots: 192 bytes). a's first chunk (16 bytes, dense),
     * then d's; a's second bucket 16 indexes away makes it sparse in a new 16-byte chunk at the
     * end and frees its first one, which b takes (no new pool bytes). a, now the pool's last
     * chunk, grows in place up to the pool's end: 160 bytes from offset 32, 52 one-byte counts and
     * 16-bit keys. Then buckets run out: the refusal is counted and what was taken stays consistent. */
    struct ki_histogram_config pooled = {0, ZT, 64, 0, 4, 64};
    t = ki_histtab_create(&pooled);
    CHECK(t != NULL);
    struct ki_histogram_key d = {12, 0, 3, 1};
    CHECK_EQ(ki_histtab_observe(t, &a, 1.0), 0);
    CHECK_EQ(ki_histtab_observe(t, &d, 1.0), 0);
    ki_histtab_stats(t, &st);
    uint64_t before = st.bytes;
    int taken = 1, refused = 0;
    CHECK_EQ(ki_histtab_observe(t, &a, 0x1p16), 0);
    taken++;
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.bytes, before + 16);
    CHECK_EQ(ki_histtab_observe(t, &b, 1.0), 0); /* takes the chunk a gave up */
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.bytes, before + 16);
    for (int i = 2; i < 64; i++) {
        int rc = ki_histtab_observe(t, &a, ldexp(1.0, 16 * i)); /* one new bucket each at schema 0 */
        if (rc == 0) taken++;
        else {
            CHECK_EQ(rc, -ENOBUFS);
            refused++;
        }
    }
    CHECK_EQ(taken, 52);
    CHECK_EQ(refused, 12);
    e = export_one(t, 0);
    CHECK_EQ(e.count, taken);
    int64_t total = 0, run = 0;
    for (uint32_t i = 0; i < e.n_pos_deltas; i++) total += (run += e.pos_deltas[i]);
    CHECK_EQ(total, taken);
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.pool_refused, refused);
    CHECK_EQ(st.bytes, before + 160);
    CHECK_EQ(ki_histtab_observe(t, &a, 1.0), 0); /* existing buckets still count */
    ki_histtab_destroy(t);
    /* Storage forms: a dense chunk whose counts widen past 255 and 65535 (one byte, two, four);
     * sparse once a bucket lies far away, its narrow 16-bit keys rebased when a bucket lies
     * outside their range and widened to 32 bits past 65535 indexes; the export is the same as
     * from exact counts and indexes. */
    struct ki_histogram_config wide = {8, ZT, 160, 0, 1};
    t = ki_histtab_create(&wide);
    CHECK(t != NULL);
    double vals[5] = {1.0, 0x1p130, 0x1p-100, 0x1p200, 3.0};
    uint64_t times[5] = {70000, 300, 1, 2, 256};
    for (int v = 0; v < 5; v++)
        for (uint64_t i = 0; i < times[v]; i++) CHECK_EQ(ki_histtab_observe(t, &a, vals[v]), 0);
    e = export_one(t, 0);
    CHECK_EQ(e.count, 70000 + 300 + 1 + 2 + 256);
    CHECK_EQ(e.schema, 8);
    int order[5] = {2, 0, 4, 1, 3}; /* ascending */
    CHECK_EQ(e.n_pos_spans, 5);
    CHECK_EQ(e.n_pos_deltas, 5);
    int32_t next = 0;
    int64_t prev = 0;
    for (int j = 0; j < 5; j++) {
        int32_t idx = ki_histogram_index(vals[order[j]], 8);
        CHECK_EQ(e.pos_spans[j].offset, idx - next);
        CHECK_EQ(e.pos_spans[j].length, 1);
        CHECK_EQ(e.pos_deltas[j], (int64_t)times[order[j]] - prev);
        next = idx + 1;
        prev = (int64_t)times[order[j]];
    }
    ki_histtab_destroy(t);
    /* Dense and sparse forms against plain counting: clustered values with outliers near and far
     * (so histograms go dense -> sparse -> dense as they fill in), several keys sharing the pool,
     * no bucket limit reached; the exported buckets, decoded, are the exact counts per index. */
    struct ki_histogram_config many = {3, ZT, 1300, 0, 8};
    t = ki_histtab_create(&many);
    CHECK(t != NULL);
    static uint32_t ref[8][4096];
    memset(ref, 0, sizeof ref);
    uint64_t rng = 88172645463325252ULL;
    for (int i = 0; i < 200000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        uint32_t k = (uint32_t)(rng % 8), r = (uint32_t)(rng >> 8) % 1000;
        int32_t idx = r < 900 ? (int32_t)((rng >> 20) % (16 + 40 * k)) /* a cluster */
                              : (int32_t)((rng >> 20) % (i < 1000 ? 1200 : 400)); /* outliers */
        struct ki_histogram_key key = {1, k, 0, 1};
        CHECK_EQ(ki_histtab_observe(t, &key, ki_histogram_upper(idx, 3)), 0);
        ref[k][idx]++;
    }
    for (uint32_t k = 0; k < 8; k++) {
        struct ki_histogram_key key = {1, k, 0, 1};
        e = export_one(t, (uint32_t)ki_histtab_find(t, &key));
        uint32_t got[4096] = {0};
        int32_t at = 0;
        int64_t cnt = 0;
        uint32_t di = 0;
        for (uint32_t sp = 0; sp < e.n_pos_spans; sp++) {
            at += e.pos_spans[sp].offset;
            for (uint32_t l = 0; l < e.pos_spans[sp].length; l++, at++) {
                cnt += e.pos_deltas[di++];
                CHECK(at >= 0 && at < 4096 && cnt >= 0);
                got[at] = (uint32_t)cnt;
            }
        }
        CHECK_EQ(di, e.n_pos_deltas);
        CHECK(memcmp(got, ref[k], sizeof got) == 0);
    }
    ki_histtab_destroy(t);
    /* Bad settings. */
    struct ki_histogram_config bad = {9, 0, 8, 0, 1};
    CHECK(ki_histtab_create(&bad) == NULL && errno == EINVAL);
    bad.schema = 0;
    bad.max_keys = 0;
    CHECK(ki_histtab_create(&bad) == NULL && errno == EINVAL);
    ki_histtab_destroy(NULL);
}

static double *read_values(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *n = (size_t)len / sizeof(double);
    double *v = malloc((size_t)len + 8);
    CHECK(v != NULL);
    CHECK_EQ(fread(v, sizeof(double), *n, f), *n);
    fclose(f);
    return v;
}

/* Evictions (ki_histtab_evict) against a reference: nkeys keys of a universe twice the table's size
 * observed, evicted and observed again at random; after every round each key of the universe is
 * found iff the reference holds it, with exactly the reference's count and buckets (a reused slot
 * and a reused chunk carry nothing over). max_keys 3000 has 2-byte hash entries, 70000 4-byte ones. */
static uint64_t evict_rng = 0x2545F4914F6CDD1DULL;
static uint32_t evict_rand(uint32_t n) {
    evict_rng ^= evict_rng << 13;
    evict_rng ^= evict_rng >> 7;
    evict_rng ^= evict_rng << 17;
    return (uint32_t)(evict_rng % n);
}
static struct ki_histogram_key evict_key(uint32_t k) {
    /* neighbouring keys (pid in runs, a few GPUs and streams): long probe runs in the hash */
    return (struct ki_histogram_key){1000 + k / 16, k % 4, k % 3 == 0 ? KI_HISTOGRAM_NO_STREAM : k % 5, k, 7,
                                     KI_HIST_KERNEL, 0};
}
static double evict_value(uint32_t k, uint64_t j) { return 1e-6 * (double)(1 + (k + j * 7) % 40); }

static void evictions(uint32_t max_keys, int rounds) {
    struct ki_histogram_config cfg = {3, ZT, 40, 0, max_keys};
    struct ki_histtab *t = ki_histtab_create(&cfg);
    CHECK(t != NULL);
    uint32_t universe = 2 * max_keys;
    uint64_t *ref = calloc(universe, sizeof *ref); /* observations of the key's current life, 0: absent */
    CHECK(ref != NULL);
    uint32_t present = 0;
    uint64_t evicted = 0;
    for (int r = 0; r < rounds; r++) {
        for (uint32_t i = 0; i < max_keys; i++) { /* observe: new keys while there is room */
            uint32_t k = evict_rand(universe);
            struct ki_histogram_key key = evict_key(k);
            int rc = ki_histtab_observe(t, &key, evict_value(k, ref[k]));
            if (ref[k] || present < max_keys) {
                CHECK_EQ(rc, 0);
                if (!ref[k]) present++;
                ref[k]++;
            } else {
                CHECK_EQ(rc, -ENOSPC);
            }
        }
        for (uint32_t i = 0; i < max_keys / 3; i++) { /* evict */
            uint32_t k = evict_rand(universe);
            struct ki_histogram_key key = evict_key(k);
            int s = ki_histtab_find(t, &key);
            CHECK_EQ(s >= 0, ref[k] != 0);
            if (s < 0) continue;
            CHECK_EQ(ki_histtab_evict(t, (uint32_t)s), 0);
            CHECK_EQ(ki_histtab_evict(t, (uint32_t)s), -ENOENT);
            CHECK_EQ(ki_histtab_find(t, &key), -ENOENT);
            struct ki_histogram_key back;
            CHECK_EQ(ki_histtab_key(t, (uint32_t)s, &back), -ENOENT);
            ref[k] = 0;
            present--;
            evicted++;
        }
        struct ki_histtab_stats st;
        ki_histtab_stats(t, &st);
        CHECK_EQ(st.keys, present);
        CHECK_EQ(st.evicted, evicted);
        CHECK(st.slots <= max_keys);
        for (uint32_t k = 0; k < universe; k++) {
            struct ki_histogram_key key = evict_key(k), back;
            int s = ki_histtab_find(t, &key);
            CHECK_EQ(s >= 0, ref[k] != 0);
            if (s < 0) continue;
            CHECK_EQ(ki_histtab_key(t, (uint32_t)s, &back), 0);
            CHECK(memcmp(&back, &key, sizeof key) == 0);
            CHECK_EQ(ki_histtab_count(t, (uint32_t)s), ref[k]);
            struct ki_histogram_export e = export_one(t, (uint32_t)s);
            /* bucket counts by index from the lowest value's bucket (40 values span < 64 buckets) */
            const int32_t lo = ki_histogram_index(1e-6, 3);
            uint64_t want[64] = {0}, got[64] = {0};
            for (uint64_t j = 0; j < ref[k]; j++) want[ki_histogram_index(evict_value(k, j), 3) - lo]++;
            int64_t run = 0;
            int32_t idx = 0;
            for (uint32_t a = 0, d = 0; a < e.n_pos_spans; a++) {
                idx += e.pos_spans[a].offset;
                for (uint32_t b = 0; b < e.pos_spans[a].length; b++, idx++) {
                    run += e.pos_deltas[d++];
                    if (!run) continue;
                    CHECK(idx >= lo && idx < lo + 64);
                    got[idx - lo] += (uint64_t)run;
                }
            }
            CHECK(memcmp(want, got, sizeof want) == 0);
        }
    }
    /* Capacity comes back: evict every key of a full table, then max_keys new keys all fit. */
    for (uint32_t k = 0; k < universe && present < max_keys; k++) {
        struct ki_histogram_key key = evict_key(k);
        if (ki_histtab_find(t, &key) < 0 && ki_histtab_observe(t, &key, 1e-6) == 0) {
            ref[k] = 1;
            present++;
        }
    }
    CHECK_EQ(present, max_keys);
    struct ki_histogram_key extra = evict_key(universe + 1);
    CHECK_EQ(ki_histtab_observe(t, &extra, 1e-6), -ENOSPC);
    for (uint32_t s = 0; s < max_keys; s++) CHECK_EQ(ki_histtab_evict(t, s), 0);
    struct ki_histtab_stats st;
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.keys, 0);
    for (uint32_t k = 0; k < max_keys; k++) {
        struct ki_histogram_key key = evict_key(universe + 2 + k);
        CHECK_EQ(ki_histtab_observe(t, &key, 1e-6 * (1 + k % 40)), 0);
    }
    ki_histtab_stats(t, &st);
    CHECK_EQ(st.keys, max_keys);
    CHECK_EQ(st.slots, max_keys);
    for (uint32_t k = 0; k < max_keys; k++) {
        struct ki_histogram_key key = evict_key(universe + 2 + k);
        int s = ki_histtab_find(t, &key);
        CHECK(s >= 0);
        CHECK_EQ(ki_histtab_count(t, (uint32_t)s), 1);
    }
    free(ref);
    ki_histtab_destroy(t);
}

/* ki_histtab_observe_slots (the drain loop's form: its own index arithmetic, the bound compared by
 * its mantissa) against ki_histtab_observe_slot one value at a time (hist_index, observe_dense and
 * observe_general), at every schema: values on and next to every bucket bound, around the zero
 * threshold, zero, subnormal, negative, infinite and NaN, and long-tailed durations; blocks of 1 to
 * 40 slots with refused (negative) slots among them; few buckets (schema reductions and wider zero
 * buckets inside a block) and one bucket hit 70,000 times (counts widened to 2 and 4 bytes). Every
 * histogram's export (sum bit for bit) and the table's counters must be the same. */
static void blocks_match_one_at_a_time(void) {
    static double vals[100000];
    static int32_t slots[100000];
    static struct ki_histogram_span ps2[ROOM], ns2[ROOM];
    static int64_t pd2[ROOM], nd2[ROOM];
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    for (int32_t schema = KI_HISTOGRAM_SCHEMA_MIN; schema <= KI_HISTOGRAM_SCHEMA_MAX; schema++) {
        for (int small = 0; small < 2; small++) {
            struct ki_histogram_config cfg = {schema, ZT, small ? 12 : 160, small ? 1e-3 : 0, 8, 0};
            struct ki_histtab *a = ki_histtab_create(&cfg), *b = ki_histtab_create(&cfg);
            CHECK(a != NULL && b != NULL);
            int nkeys = 0;
            for (uint32_t k = 0; k < 8; k++) {
                struct ki_histogram_key key = {100 + k, 0, KI_HISTOGRAM_NO_STREAM, k, 0, 0, 0};
                CHECK_EQ(ki_histtab_slot(a, &key), nkeys);
                CHECK_EQ(ki_histtab_slot(b, &key), nkeys);
                nkeys++;
            }
            /* keys 0-3: values far apart (sparse buckets); keys 4-7: kernel-like durations, dense
             * buckets (the common path), key 5 the one bucket hit 70,000 times */
            size_t n = 0;
            const double *bounds = ki_histogram_bounds[schema > 0 ? schema : 0];
            uint32_t per = schema > 0 ? 1u << schema : 1u;
            for (int twice = 0; twice < 2; twice++) /* the second time into buckets that exist */
                for (int e = -30; e <= 30; e++) {
                    int near = e >= -17 && e <= -14;
                    if (!near && e % 7) continue;
                    for (uint32_t j = 0; j < per; j++) {
                        double x = ldexp(bounds[j], e);
                        const double xs[3] = {x, nextafter(x, 0), nextafter(x, INFINITY)};
                        for (int q = 0; q < 3; q++) {
                            rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
                            uint32_t r = (uint32_t)((rng * 0x2545F4914F6CDD1DULL) >> 40);
                            vals[n] = xs[q];
                            slots[n++] = r % 23 == 0 ? -1 : (int32_t)(r % 4) + (near ? 4 : 0);
                        }
                    }
                }
            const double odd[] = {0.0, -0.0, ZT, nextafter(ZT, 1), nextafter(ZT, 0), -ZT, 1e-320, -1e-320, DBL_MIN,
                                  DBL_MAX, -DBL_MAX, INFINITY, -INFINITY, NAN, -2.5e-6, 1e-3, 2e-3};
            for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
                vals[n] = odd[i];
                slots[n++] = (int32_t)(i % 4);
            }
            for (int round = 0; round < 2; round++) {
                /* long-tailed durations, a few stragglers; the second round also into buckets new
                 * to the widened counts */
                while (n < (round ? 100000u : 30000u)) {
                    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
                    uint64_t r = rng * 0x2545F4914F6CDD1DULL;
                    double u = ((double)(r >> 11) + 0.5) * 0x1.0p-53;
                    vals[n] = 2e-5 * exp(2.0 * (u - 0.5)) * (u > 0.995 ? 30.0 : 1.0);
                    slots[n++] = (r & 0xFF) % 23 == 0 ? -1 : (int32_t)(4 + (r & 3));
                }
                while (!round && n < 97000) { /* one bucket: counts of 1, 2 and 4 bytes */
                    vals[n] = 3.3e-5;
                    slots[n++] = 5;
                }
            }
            size_t counted_a = 0, counted_b = 0;
            for (size_t i = 0; i < n; i++)
                if (slots[i] >= 0) counted_a += ki_histtab_observe_slot(a, (uint32_t)slots[i], vals[i]) == 0;
            for (size_t i = 0, m = 1; i < n; i += m, m = m % 40 + 1) {
                size_t k = n - i < m ? n - i : m;
                counted_b += ki_histtab_observe_slots(b, slots + i, vals + i, k);
            }
            CHECK_EQ(counted_b, counted_a);
            for (int k = 0; k < nkeys; k++) {
                struct ki_histogram_export x = export_one(a, (uint32_t)k);
                struct ki_histogram_export y = {.pos_spans = ps2, .neg_spans = ns2, .pos_deltas = pd2, .neg_deltas = nd2};
                CHECK_EQ(ki_histtab_export(b, (uint32_t)k, &y), 0);
                CHECK_EQ(x.schema, y.schema);
                CHECK(memcmp(&x.zero_threshold, &y.zero_threshold, sizeof x.zero_threshold) == 0);
                CHECK(memcmp(&x.sum, &y.sum, sizeof x.sum) == 0);
                CHECK_EQ(x.count, y.count);
                CHECK_EQ(x.zero_count, y.zero_count);
                CHECK(x.n_pos_spans == y.n_pos_spans && x.n_neg_spans == y.n_neg_spans);
                CHECK(x.n_pos_deltas == y.n_pos_deltas && x.n_neg_deltas == y.n_neg_deltas);
                CHECK(memcmp(ps, ps2, x.n_pos_spans * sizeof ps[0]) == 0 && memcmp(ns, ns2, x.n_neg_spans * sizeof ns[0]) == 0);
                CHECK(memcmp(pd, pd2, x.n_pos_deltas * sizeof pd[0]) == 0 && memcmp(nd, nd2, x.n_neg_deltas * sizeof nd[0]) == 0);
            }
            struct ki_histtab_stats sa, sb;
            ki_histtab_stats(a, &sa);
            ki_histtab_stats(b, &sb);
            CHECK(sa.bucket_refused == sb.bucket_refused && sa.pool_refused == sb.pool_refused && sa.bytes == sb.bytes);
            if (schema == 3 && !small) { /* the widened counts were reached */
                struct ki_histogram_export x = export_one(a, 5);
                int64_t top = 0, c = 0;
                for (uint32_t i = 0; i < x.n_pos_deltas; i++) c += x.pos_deltas[i], top = c > top ? c : top;
                CHECK(top > 65535);
            }
            ki_histtab_destroy(a);
            ki_histtab_destroy(b);
        }
    }
}

int main(int argc, char **argv) {
    if (argc == 1) {
        unit();
        blocks_match_one_at_a_time();
        evictions(3000, 6);
        evictions(70000, 2);
        puts("ok");
        return 0;
    }
    size_t n;
    double *v = read_values(argv[argc == 4 && !strcmp(argv[1], "index") ? 2 : 3], &n);
    if (!strcmp(argv[1], "index")) {
        FILE *out = fopen(argv[3], "wb");
        CHECK(out != NULL);
        for (int32_t s = KI_HISTOGRAM_SCHEMA_MIN; s <= KI_HISTOGRAM_SCHEMA_MAX; s++)
            for (size_t i = 0; i < n; i++) {
                int32_t k = ki_histogram_index(v[i], s);
                CHECK_EQ(fwrite(&k, sizeof k, 1, out), 1);
            }
        fclose(out);
        printf("ok indexes=%zu\n", n * 13);
    } else {
        struct ki_histogram_config cfg = {atoi(argv[2]), ZT, 160, 0, 1};
        struct ki_histtab *t = ki_histtab_create(&cfg);
        CHECK(t != NULL);
        struct ki_histogram_key k = {1, 0, KI_HISTOGRAM_NO_STREAM, 1};
        for (size_t i = 0; i < n; i++) CHECK_EQ(ki_histtab_observe(t, &k, v[i]), 0);
        struct ki_histogram_export e = export_one(t, 0);
        printf("ok\nschema %d\nzero_threshold %.17g\nzero_count %llu\ncount %llu\nsum %.17g\n", e.schema,
               e.zero_threshold, (unsigned long long)e.zero_count, (unsigned long long)e.count, e.sum);
        printf("pos_spans");
        for (uint32_t i = 0; i < e.n_pos_spans; i++) printf(" %d:%u", e.pos_spans[i].offset, e.pos_spans[i].length);
        printf("\npos_deltas");
        for (uint32_t i = 0; i < e.n_pos_deltas; i++) printf(" %lld", (long long)e.pos_deltas[i]);
        printf("\n");
        ki_histtab_destroy(t);
    }
    free(v);
    return 0;
}
