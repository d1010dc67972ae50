/* histinc.c - per-slot bases of shipped histograms and increments against them (ki_histinc.h). */
#include "ki_histinc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ki_varint.h"

/* A base in the arena: u32 slot, u32 generation, u32 payload bytes, then the payload: i32 schema,
 * f64 zero threshold, varints zero count, count, negative and positive bucket counts, then per
 * bucket (negatives first) varint(count << 1 | 1) when its index is the previous one's + 1 (most
 * buckets of a distribution's body: one byte less each), else varint(count << 1) and
 * zigzag(index - previous index of its side). Read and written with memcpy: records are not
 * aligned. */
#define REC_HEAD 12u
#define PAY_FIXED 12u
#define COMPACT_MIN (64u << 10) /* garbage below this is never worth a compaction */

struct ki_histinc {
    uint32_t max_keys;
    uint32_t gen;        /* bases of an older generation are forgotten (garbage) */
    uint32_t *off;       /* per slot: offset + 1 of its base, 0: none */
    uint8_t *arena;
    size_t cap, used, live;
    uint8_t *scratch;    /* one record being built */
    size_t scratch_cap;
    uint64_t bases, compactions, refused;
};

struct ki_histinc *ki_histinc_create(uint32_t max_keys, size_t room, size_t arena_bytes) {
    if (max_keys == 0 || room == 0 || arena_bytes < 4096 || arena_bytes > UINT32_MAX - 1) {
        errno = EINVAL;
        return NULL;
    }
    struct ki_histinc *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->max_keys = max_keys;
    b->gen = 1;
    b->cap = arena_bytes;
    b->scratch_cap = REC_HEAD + PAY_FIXED + 4 * KI_VARINT_MAX + room * 2 * KI_VARINT_MAX;
    b->off = calloc(max_keys, sizeof *b->off); /* zero pages: touched only for slots with a base */
    b->arena = malloc(arena_bytes);             /* touched only as bases are written */
    b->scratch = malloc(b->scratch_cap);
    if (!b->off || !b->arena || !b->scratch) {
        ki_histinc_destroy(b);
        errno = ENOMEM;
        return NULL;
    }
    return b;
}

void ki_histinc_destroy(struct ki_histinc *b) {
    if (!b) return;
    free(b->off);
    free(b->arena);
    free(b->scratch);
    free(b);
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* slot's base record, or NULL. */
static const uint8_t *base_of(const struct ki_histinc *b, uint32_t slot) {
    uint32_t o = b->off[slot];
    if (!o) return NULL;
    const uint8_t *r = b->arena + (o - 1);
    return get_u32(r) == slot && get_u32(r + 4) == b->gen ? r : NULL;
}

static void drop(struct ki_histinc *b, uint32_t slot) {
    const uint8_t *r = base_of(b, slot);
    if (r) {
        b->live -= REC_HEAD + get_u32(r + 8);
        b->bases--;
    }
    b->off[slot] = 0;
}

void ki_histinc_forget(struct ki_histinc *b, uint32_t slot) {
    if (slot < b->max_keys) drop(b, slot);
}

void ki_histinc_forget_all(struct ki_histinc *b) {
    b->gen++;
    b->live = 0;
    b->bases = 0;
}

/* Slide the live bases down over the garbage, in arena order. */
static void compact(struct ki_histinc *b) {
    size_t w = 0;
    for (size_t p = 0; p < b->used;) {
        uint32_t slot = get_u32(b->arena + p), len = REC_HEAD + get_u32(b->arena + p + 8);
        if (slot < b->max_keys && b->off[slot] == p + 1 && get_u32(b->arena + p + 4) == b->gen) {
            if (w != p) memmove(b->arena + w, b->arena + p, len);
            b->off[slot] = (uint32_t)w + 1;
            w += len;
        }
        p += len;
    }
    b->used = w;
    b->compactions++;
}

/* A side's populated buckets from spans and deltas, in index order. */
struct walk {
    const struct ki_histogram_span *sp;
    const int64_t *d;
    uint32_t ns, si, left, di;
    int64_t idx, run;
};

static int walk_next(struct walk *w, int64_t *i, int64_t *c) {
    for (;;) {
        while (w->left == 0) {
            if (w->si == w->ns) return 0;
            w->idx += w->sp[w->si].offset;
            w->left = w->sp[w->si].length;
            w->si++;
        }
        w->run += w->d[w->di++];
        int64_t at = w->idx++;
        w->left--;
        if (w->run) {
            *i = at;
            *c = w->run;
            return 1;
        }
    }
}

/* client_golang makeBuckets, one populated bucket at a time (gaps of up to two filled with zeros). */
struct emit {
    struct ki_histogram_span *sp;
    int64_t *d;
    uint32_t ns, nd;
    int64_t prev, next;
};

static void emit(struct emit *e, int64_t i, int64_t c) {
    int64_t gap = i - e->next;
    if (e->ns == 0 || gap > 2) {
        e->sp[e->ns].offset = (int32_t)gap;
        e->sp[e->ns].length = 0;
        e->ns++;
    } else {
        for (int64_t j = 0; j < gap; j++) {
            e->sp[e->ns - 1].length++;
            e->d[e->nd++] = -e->prev;
            e->prev = 0;
        }
    }
    e->sp[e->ns - 1].length++;
    e->d[e->nd++] = c - e->prev;
    e->prev = c;
    e->next = i + 1;
}

/* The next bucket of a base: *bi (the previous index, 0 before the first) moves to its index. */
static int get_bucket(const uint8_t **p, const uint8_t *end, int64_t *bi, uint64_t *bc) {
    uint64_t v, z;
    if (ki_varint_get(p, end, &v) < 0) return -1;
    *bc = v >> 1;
    if (v & 1) {
        *bi += 1;
        return 0;
    }
    if (ki_varint_get(p, end, &z) < 0) return -1;
    *bi += (int64_t)ki_unzigzag(z);
    return 0;
}

/* The buckets of one side that grew since the base (nb entries at *p): into out. 0, or -1 when the
 * base does not fit under cur (a bucket gone or smaller: never for one series of one run). */
static int diff_side(struct walk *w, const uint8_t **p, const uint8_t *end, uint64_t nb, struct emit *out) {
    int64_t bi = 0, i, c;
    uint64_t bc = 0;
    int have = 0;
    if (nb) {
        if (get_bucket(p, end, &bi, &bc) < 0) return -1;
        have = 1;
        nb--;
    }
    while (walk_next(w, &i, &c)) {
        int64_t add = c;
        if (have && bi < i) return -1;
        if (have && bi == i) {
            if ((uint64_t)c < bc) return -1;
            add = c - (int64_t)bc;
            have = 0;
            if (nb) {
                if (get_bucket(p, end, &bi, &bc) < 0) return -1;
                have = 1;
                nb--;
            }
        }
        if (add) emit(out, i, add);
    }
    return have ? -1 : 0;
}

/* Encode one side's populated buckets after the record's fixed part; returns bytes written. Counts
 * below 2^62 (store checks the total): count << 1 fits a varint. */
static size_t put_side(uint8_t *q, const struct ki_histogram_span *sp, uint32_t ns, const int64_t *d, uint32_t *n) {
    struct walk w = {sp, d, ns, 0, 0, 0, 0, 0};
    int64_t i, c, prev = 0;
    size_t o = 0;
    *n = 0;
    while (walk_next(&w, &i, &c)) {
        int next = i == prev + 1;
        o += ki_varint_put(q + o, (uint64_t)c << 1 | (uint64_t)next);
        if (!next) o += ki_varint_put(q + o, ki_zigzag((uint64_t)(i - prev)));
        prev = i;
        (*n)++;
    }
    return o;
}

static uint32_t populated(const struct ki_histogram_span *sp, uint32_t ns, const int64_t *d) {
    struct walk w = {sp, d, ns, 0, 0, 0, 0, 0};
    int64_t i, c;
    uint32_t n = 0;
    while (walk_next(&w, &i, &c)) n++;
    return n;
}

/* cur becomes slot's base (or slot goes without one). */
static void store(struct ki_histinc *b, uint32_t slot, const struct ki_histogram_export *cur) {
    drop(b, slot);
    uint32_t nneg = populated(cur->neg_spans, cur->n_neg_spans, cur->neg_deltas);
    uint32_t npos = populated(cur->pos_spans, cur->n_pos_spans, cur->pos_deltas);
    if (nneg + npos < KI_HISTINC_MIN_BUCKETS || cur->count < KI_HISTINC_MIN_COUNT || cur->count >= (1ULL << 62)) return;
    uint8_t *q = b->scratch + REC_HEAD;
    memcpy(q, &cur->schema, 4);
    memcpy(q + 4, &cur->zero_threshold, 8);
    size_t o = PAY_FIXED;
    o += ki_varint_put(q + o, cur->zero_count);
    o += ki_varint_put(q + o, cur->count);
    o += ki_varint_put(q + o, nneg);
    o += ki_varint_put(q + o, npos);
    uint32_t n;
    o += put_side(q + o, cur->neg_spans, cur->n_neg_spans, cur->neg_deltas, &n);
    o += put_side(q + o, cur->pos_spans, cur->n_pos_spans, cur->pos_deltas, &n);
    size_t len = REC_HEAD + o;
    size_t garbage = b->used - b->live;
    if (b->used + len > b->cap || (garbage > COMPACT_MIN && garbage > b->live)) compact(b);
    if (b->used + len > b->cap) {
        b->refused++;
        return;
    }
    uint32_t pay = (uint32_t)o;
    memcpy(b->scratch, &slot, 4);
    memcpy(b->scratch + 4, &b->gen, 4);
    memcpy(b->scratch + 8, &pay, 4);
    memcpy(b->arena + b->used, b->scratch, len);
    b->off[slot] = (uint32_t)b->used + 1;
    b->used += len;
    b->live += len;
    b->bases++;
}

int ki_histinc_next(struct ki_histinc *b, uint32_t slot, const struct ki_histogram_export *cur,
                    struct ki_histogram_export *inc, uint64_t *count_inc) {
    int res = 0;
    const uint8_t *r = slot < b->max_keys ? base_of(b, slot) : NULL;
    if (r) {
        const uint8_t *p = r + REC_HEAD, *end = p + get_u32(r + 8);
        int32_t schema;
        double zt;
        uint64_t zc, count, nneg, npos;
        memcpy(&schema, p, 4);
        memcpy(&zt, p + 4, 8);
        p += PAY_FIXED;
        if (schema == cur->schema && !memcmp(&zt, &cur->zero_threshold, 8) && ki_varint_get(&p, end, &zc) == 0 &&
            ki_varint_get(&p, end, &count) == 0 && ki_varint_get(&p, end, &nneg) == 0 &&
            ki_varint_get(&p, end, &npos) == 0 && zc <= cur->zero_count && count < cur->count) {
            struct walk wn = {cur->neg_spans, cur->neg_deltas, cur->n_neg_spans, 0, 0, 0, 0, 0};
            struct walk wp = {cur->pos_spans, cur->pos_deltas, cur->n_pos_spans, 0, 0, 0, 0, 0};
            struct emit en = {inc->neg_spans, inc->neg_deltas, 0, 0, 0, 0};
            struct emit ep = {inc->pos_spans, inc->pos_deltas, 0, 0, 0, 0};
            if (diff_side(&wn, &p, end, nneg, &en) == 0 && diff_side(&wp, &p, end, npos, &ep) == 0) {
                inc->schema = cur->schema;
                inc->zero_threshold = cur->zero_threshold;
                inc->zero_count = cur->zero_count - zc;
                inc->count = cur->count;
                inc->sum = cur->sum;
                inc->n_neg_spans = en.ns;
                inc->n_neg_deltas = en.nd;
                inc->n_pos_spans = ep.ns;
                inc->n_pos_deltas = ep.nd;
                *count_inc = cur->count - count;
                res = 1;
            }
        }
    }
    if (slot < b->max_keys) store(b, slot, cur);
    return res;
}

void ki_histinc_stats(const struct ki_histinc *b, struct ki_histinc_stats *out) {
    out->bases = b->bases;
    out->live_bytes = b->live;
    out->used_bytes = b->used;
    out->compactions = b->compactions;
    out->refused = b->refused;
}
