/* Unit test: histogram increments against the previous export (histinc.c, ki_histinc.h).
 * Property: over random growing histograms, an increment holds exactly the buckets that grew, by
 * how much, and the zero count's and count's growth; a base is kept only when it is big enough,
 * and lost on a schema change, forget, forget_all; a small arena refuses and compacts, never
 * overflows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ki_histinc.h"
#include "ki_test.h"

#define SPAN 96 /* indexes -SPAN/2 .. SPAN/2-1 on each side */
#define ROOM (SPAN + 1)

struct hist {
    int32_t schema;
    uint64_t zero, pos[SPAN], neg[SPAN]; /* pos[i]: bucket index i - SPAN/2 */
};

struct arrays {
    struct ki_histogram_span ps[ROOM], ns[ROOM];
    int64_t pd[ROOM], nd[ROOM];
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* One side of a dense histogram as spans and deltas (empty buckets split spans). */
static void side_out(const uint64_t *c, struct ki_histogram_span *spans, int64_t *deltas, uint32_t *ns, uint32_t *nd) {
    int32_t end = 0; /* end of the previous span, as an index */
    int first = 1;
    int64_t prev = 0;
    *ns = *nd = 0;
    for (int i = 0; i < SPAN; i++) {
        if (!c[i]) continue;
        int32_t idx = i - SPAN / 2;
        if (first || idx != end) {
            spans[*ns].offset = first ? idx : idx - end;
            spans[*ns].length = 0;
            (*ns)++;
            first = 0;
        }
        spans[*ns - 1].length++;
        deltas[(*nd)++] = (int64_t)c[i] - prev;
        prev = (int64_t)c[i];
        end = idx + 1;
    }
}

static void export_of(const struct hist *h, struct arrays *a, struct ki_histogram_export *e) {
    memset(e, 0, sizeof *e);
    e->schema = h->schema;
    e->zero_threshold = 1e-128;
    e->zero_count = h->zero;
    e->count = h->zero;
    for (int i = 0; i < SPAN; i++) e->count += h->pos[i] + h->neg[i];
    e->sum = (double)e->count;
    e->pos_spans = a->ps;
    e->neg_spans = a->ns;
    e->pos_deltas = a->pd;
    e->neg_deltas = a->nd;
    side_out(h->pos, a->ps, a->pd, &e->n_pos_spans, &e->n_pos_deltas);
    side_out(h->neg, a->ns, a->nd, &e->n_neg_spans, &e->n_neg_deltas);
}

/* Spans and deltas back to dense counts (checks the encoding is well formed). */
static void side_in(const struct ki_histogram_span *spans, uint32_t ns, const int64_t *deltas, uint32_t nd, uint64_t *c) {
    memset(c, 0, SPAN * sizeof *c);
    int32_t idx = 0;
    int64_t v = 0;
    uint32_t k = 0;
    for (uint32_t s = 0; s < ns; s++) {
        idx += spans[s].offset;
        CHECK(s == 0 || spans[s].offset >= 0);
        for (uint32_t j = 0; j < spans[s].length; j++, idx++) {
            CHECK(k < nd);
            v += deltas[k++];
            CHECK(v >= 0);
            CHECK(idx >= -SPAN / 2 && idx < SPAN / 2);
            c[idx + SPAN / 2] = (uint64_t)v;
        }
    }
    CHECK_EQ(k, nd);
}

static void grow(struct hist *h, int buckets, uint64_t most) {
    h->zero += rnd() % 3;
    for (int k = 0; k < buckets; k++) {
        int i = (int)(rnd() % SPAN);
        uint64_t add = rnd() % (most + 1);
        if (rnd() & 1) h->pos[i] += add;
        else h->neg[i] += add;
    }
}

static int next(struct ki_histinc *b, uint32_t slot, const struct hist *h, struct hist *got, uint64_t *count_inc) {
    struct arrays ca, ia;
    struct ki_histogram_export cur, inc;
    export_of(h, &ca, &cur);
    memset(&inc, 0, sizeof inc);
    inc.pos_spans = ia.ps;
    inc.neg_spans = ia.ns;
    inc.pos_deltas = ia.pd;
    inc.neg_deltas = ia.nd;
    int r = ki_histinc_next(b, slot, &cur, &inc, count_inc);
    if (r) {
        CHECK_EQ(inc.schema, h->schema);
        CHECK_EQ(inc.count, cur.count); /* count and sum stay cumulative */
        CHECK(inc.sum == cur.sum);
        got->zero = inc.zero_count;
        side_in(inc.pos_spans, inc.n_pos_spans, inc.pos_deltas, inc.n_pos_deltas, got->pos);
        side_in(inc.neg_spans, inc.n_neg_spans, inc.neg_deltas, inc.n_neg_deltas, got->neg);
    }
    return r;
}

static struct hist big(int32_t schema) {
    struct hist h;
    memset(&h, 0, sizeof h);
    h.schema = schema;
    for (int i = 0; i < KI_HISTINC_MIN_BUCKETS + 2; i++) h.pos[i * 3] = KI_HISTINC_MIN_COUNT;
    return h;
}

int main(void) {
    CHECK(ki_histinc_create(0, ROOM, 1 << 20) == NULL);
    CHECK(ki_histinc_create(4, ROOM, 100) == NULL);
    struct ki_histinc *b = ki_histinc_create(64, ROOM, 1 << 20);
    CHECK(b != NULL);
    uint64_t ci = 0;
    struct hist got;

    /* The property, over 64 slots at once. */
    static struct hist hs[64];
    for (uint32_t s = 0; s < 64; s++) hs[s] = big((int32_t)(s % 3));
    for (uint32_t s = 0; s < 64; s++) CHECK_EQ(next(b, s, &hs[s], &got, &ci), 0); /* no base yet */
    for (int round = 0; round < 200; round++) {
        uint32_t s = (uint32_t)(rnd() % 64);
        struct hist before = hs[s];
        grow(&hs[s], (int)(rnd() % 12), 50);
        uint64_t cb = before.zero, ca = hs[s].zero;
        for (int i = 0; i < SPAN; i++) cb += before.pos[i] + before.neg[i], ca += hs[s].pos[i] + hs[s].neg[i];
        int r = next(b, s, &hs[s], &got, &ci);
        if (ca == cb) {
            CHECK_EQ(r, 0); /* nothing grew: an increment needs a larger count (cumulative is sent) */
            continue;
        }
        CHECK_EQ(r, 1);
        CHECK_EQ(ci, ca - cb);
        CHECK_EQ(got.zero, hs[s].zero - before.zero);
        for (int i = 0; i < SPAN; i++) {
            CHECK_EQ(got.pos[i], hs[s].pos[i] - before.pos[i]);
            CHECK_EQ(got.neg[i], hs[s].neg[i] - before.neg[i]);
        }
    }

    /* A schema change, forget and forget_all each lose the base: the next export is whole. */
    struct hist h = hs[0];
    grow(&h, 4, 9);
    h.pos[0] += 1;
    h.schema = 7;
    CHECK_EQ(next(b, 0, &h, &got, &ci), 0);
    h.pos[0] += 1;
    CHECK_EQ(next(b, 0, &h, &got, &ci), 1);
    ki_histinc_forget(b, 0);
    h.pos[0] += 1;
    CHECK_EQ(next(b, 0, &h, &got, &ci), 0);
    ki_histinc_forget_all(b);
    h.pos[0] += 1;
    CHECK_EQ(next(b, 0, &h, &got, &ci), 0);
    CHECK_EQ(next(b, 64, &h, &got, &ci), 0); /* a slot past the table: never a base */

    /* Too few buckets or observations: no base is kept. */
    struct hist small;
    memset(&small, 0, sizeof small);
    for (int i = 0; i < KI_HISTINC_MIN_BUCKETS - 1; i++) small.pos[i] = 1u << 20;
    CHECK_EQ(next(b, 1, &small, &got, &ci), 0);
    small.pos[0]++;
    CHECK_EQ(next(b, 1, &small, &got, &ci), 0);
    struct hist quiet;
    memset(&quiet, 0, sizeof quiet);
    for (int i = 0; i < KI_HISTINC_MIN_BUCKETS + 4; i++) quiet.pos[i] = 1;
    CHECK_EQ(next(b, 2, &quiet, &got, &ci), 0);
    quiet.pos[0]++;
    CHECK_EQ(next(b, 2, &quiet, &got, &ci), 0);
    ki_histinc_destroy(b);

    /* A small arena: bases that do not fit are refused (counted), the garbage is compacted, and
     * whatever was kept still gives right increments. */
    b = ki_histinc_create(64, ROOM, 4096);
    CHECK(b != NULL);
    for (int round = 0; round < 2000; round++) {
        uint32_t s = (uint32_t)(rnd() % 64);
        struct hist before = hs[s];
        grow(&hs[s], 3, 5);
        hs[s].zero++;
        if (next(b, s, &hs[s], &got, &ci) == 1) {
            CHECK_EQ(got.zero, hs[s].zero - before.zero);
            for (int i = 0; i < SPAN; i++) CHECK_EQ(got.pos[i], hs[s].pos[i] - before.pos[i]);
        }
    }
    struct ki_histinc_stats st;
    ki_histinc_stats(b, &st);
    CHECK(st.refused > 0);
    CHECK(st.compactions > 0);
    CHECK(st.used_bytes <= 4096);
    CHECK(st.live_bytes <= st.used_bytes);
    ki_histinc_destroy(b);
    ki_histinc_destroy(NULL);
    printf("ok\n");
    return 0;
}
