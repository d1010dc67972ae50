/* histogram.c - native-histogram accumulators in a fixed-capacity table (ki_histogram.h). */
#include "ki_histogram.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ki_histogram_bounds.h"
#include "ki_histogram_index.h"

/* Positive and negative buckets share one sorted array of int32 sort keys: a
 * positive bucket i is i, a negative one i - NEG_OFF. Indexes stay within
 * +-(1075 << 8) < 2^19, so every negative key sorts before every positive one. */
#define NEG_OFF (1 << 22)
#define NEG_LIMIT (-(1 << 21))

/* One histogram's record: key and state (80 bytes). Its buckets live in a chunk of the shared
 * pool, dense or sparse, whichever is smaller when the chunk is taken:
 * - dense (kw 0): cap counts of cw bytes, slot i for sort key base + i (zero: not populated).
 *   An observation is one subtraction and one increment: no search.
 * - sparse: cap counts of cw bytes, then cap sorted bucket keys of kw bytes. Narrow keys (kw 2)
 *   are offsets from base; wide ones (kw 4) the sort keys themselves, for the rare histogram
 *   whose buckets lie more than 65535 indexes apart (both signs, or 2^256 of range at schema 8).
 * Counts start at one byte and widen (2, 4, 8) when one would overflow: most buckets of a kernel
 * hold few observations between agent restarts, so a bucket costs 1-3 bytes instead of 12. */
struct ki_hist {
    struct { /* the key but its kind (below): 24 bytes, not 32 */
        uint32_t pid, gpu;
        uint64_t stream;
        uint32_t name_id, producer;
    } key;
    double zero_threshold;
    double sum;
    uint64_t zero_count, count;
    int32_t base;   /* kw 2: a bucket's sort key is base + its offset */
    uint32_t chunk; /* offset of its chunk in the pool, in 8-byte units */
    uint16_t n;     /* populated buckets */
    uint16_t cap;   /* bucket slots of its chunk (0: none yet) */
    uint16_t hint;  /* last bucket position touched */
    int8_t schema;
    uint8_t kw, cw; /* bytes of a bucket key (0: dense, 2, 4) and of a count (1, 2, 4, 8) */
    uint8_t cls;    /* size class of its chunk */
    uint8_t kind;   /* the key's kind */
    uint8_t freed;  /* evicted: no key, on the free slots' list (chunk links the next) */
};

/* Chunk size classes in bytes: 16, 24, ..., 64, then four steps per doubling (at most 25% unused),
 * the last one exactly room slots of the widest kind. A chunk that grows takes the smallest class
 * that holds one more bucket; the old one goes to its class's free list, unless it is the last
 * chunk of the pool, which grows in place. */
#define MAX_CLASSES 96
#define MAX_ROOM 65535u

_Static_assert(sizeof(struct ki_hist) == 80, "a histogram's record is 80 bytes");

struct ki_histtab {
    struct ki_histogram_config cfg;
    uint32_t room;       /* bucket slots per histogram: max_buckets + 1 */
    uint32_t used;       /* slots handed out: histograms in use and free (evicted) slots */
    uint32_t hash_mask;
    void *hash;          /* slot + 1, 0 = empty: 2-byte entries below 65,535 keys (half the lines
                          * to touch; 32 KiB less at the default 12,288), else 4-byte */
    uint8_t hash_wide;   /* 4-byte entries */
    struct ki_hist *recs;
    uint8_t *pool;       /* bucket chunks, bump-allocated, pages touched as used */
    size_t pool_bytes, pool_used;
    uint32_t nclasses;
    uint32_t class_bytes[MAX_CLASSES];
    uint64_t free_head[MAX_CLASSES]; /* offset + 1 of a free chunk (its first 8 bytes link the next), 0: none */
    size_t free_bytes;   /* bytes of the chunks on free lists */
    uint32_t *order;     /* compaction scratch: slots by chunk offset */
    uint64_t compactions;
    uint64_t keys_refused, obs_refused, bucket_refused, pool_refused, bytes, evicted;
    /* last: the fields the lookups read keep their offsets and cache lines */
    uint32_t free_slot;  /* slot + 1 of the last slot evicted (its record's chunk: the next one + 1), 0: none */
    uint32_t nfree;      /* free slots */
    /* The mantissas of ki_histogram_bounds[cfg.schema] (schema > 0; every bound is in [0.5, 1), one
     * exponent, so a bound is below a frac in [0.5, 1) exactly when its mantissa is below the
     * frac's: an integer comparison, no frac built) and one more entry, 2^52, above every
     * mantissa: ki_histtab_observe_slots compares mant_ext[lo] for every lo in 0..2^schema that
     * the first-bucket table gives, without hist_index's lo < 2^schema test and mask */
    uint64_t mant_ext[(1u << KI_HISTOGRAM_SCHEMA_MAX) + 1];
};

static int32_t floor_shift(int32_t k, int sh) { /* k >> sh, rounding toward -inf like Go's >> */
    return k >= 0 ? k >> sh : -(int32_t)(((uint32_t)-k + ((1u << sh) - 1)) >> sh);
}

/* The general case: zero, subnormal and infinite values, and schemas 0 and below. */
static int32_t index_slow(double v, int32_t schema) {
    int inf = isinf(v);
    int exp;
    double frac;
    uint64_t bits;
    double a = fabs(v);
    memcpy(&bits, &a, sizeof bits);
    uint32_t biased = (uint32_t)(bits >> 52);
    if (biased != 0 && biased != 0x7FF) { /* a normal number: frexp from its bits, no libm call */
        exp = (int)biased - 1022;
        bits = (bits & 0x000FFFFFFFFFFFFFULL) | (1022ULL << 52);
        memcpy(&frac, &bits, sizeof frac);
    } else {
        frac = frexp(inf ? DBL_MAX : a, &exp);
    }
    int32_t key;
    if (schema > 0) {
        /* sort.SearchFloat64s (first bound >= frac) without the search: the schema+1 leading mantissa
         * bits of frac leave at most one bound to compare with (ki_histogram_index.h). */
        const double *b = ki_histogram_bounds[schema];
        uint64_t fb;
        memcpy(&fb, &frac, sizeof fb);
        uint32_t m = (uint32_t)((fb & 0x000FFFFFFFFFFFFFULL) >> (51 - schema));
        int32_t lo = ki_histogram_first[KI_HISTOGRAM_FIRST_OFF(schema) + m];
        if (lo < (1 << schema) && b[lo] < frac) lo++;
        key = lo + (exp - 1) * (1 << schema);
    } else {
        key = exp;
        if (frac == 0.5) key--;
        key = floor_shift(key + ((1 << -schema) - 1), -schema);
    }
    return inf ? key + 1 : key;
}

/* ki_histogram_index inlined into the observation path: a normal value at a positive schema (every
 * kernel duration at the default schema 3) takes no branch on its value: frexp from the bits, one
 * table entry, one bound compared without a jump (whether the value lies above it is as random as
 * the durations, so a branch mispredicts often). */
static inline int32_t hist_index(double v, int32_t schema) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits &= 0x7FFFFFFFFFFFFFFFULL; /* |v| */
    uint32_t biased = (uint32_t)(bits >> 52);
    if (__builtin_expect(schema <= 0 || biased - 1u >= 0x7FEu, 0)) return index_slow(v, schema);
    uint64_t fb = (bits & 0x000FFFFFFFFFFFFFULL) | (1022ULL << 52); /* frac in [0.5, 1) */
    double frac;
    memcpy(&frac, &fb, sizeof frac);
    const int32_t n = 1 << schema;
    uint32_t m = (uint32_t)((bits & 0x000FFFFFFFFFFFFFULL) >> (51 - schema));
    int32_t lo = ki_histogram_first[KI_HISTOGRAM_FIRST_OFF(schema) + m];
    lo += (lo < n) & (ki_histogram_bounds[schema][lo & (n - 1)] < frac); /* sort.SearchFloat64s, as index_slow */
    return lo + ((int32_t)biased - 1023) * n;
}

int32_t ki_histogram_index(double v, int32_t schema) { return hist_index(v, schema); }

double ki_histogram_upper(int32_t index, int32_t schema) {
    if (schema < 0) {
        int32_t exp = index * (1 << -schema);
        if (exp == 1024) return DBL_MAX;
        return ldexp(1, exp);
    }
    double frac = ki_histogram_bounds[schema][(uint32_t)index & ((1u << schema) - 1)];
    int32_t exp = floor_shift(index, schema) + 1;
    if (frac == 0.5 && exp == 1025) return DBL_MAX;
    return ldexp(frac, exp);
}

/* Keys as three words (pid | gpu << 32, stream, name_id | producer << 32: the layout of a
 * record's key on a little-endian machine) and a kind: hashed and compared without a branch
 * per field. */
static inline uint64_t word_at(const void *p, size_t i) {
    uint64_t w;
    memcpy(&w, (const char *)p + 8 * i, sizeof w);
    return w;
}

/* Multiply-shift over the words; the high half of the product indexes the table. */
static inline uint32_t key_hash(uint64_t w0, uint64_t w1, uint64_t w2, uint32_t kind) {
    uint64_t h = (w0 * 0x9E3779B97F4A7C15ULL + (w1 ^ ((uint64_t)kind << 56))) * 0xC2B2AE3D27D4EB4FULL;
    h = (h + w2) * 0x165667B19E3779F9ULL;
    return (uint32_t)(h >> 32);
}

static inline int key_eq(const struct ki_hist *h, uint64_t w0, uint64_t w1, uint64_t w2, uint32_t kind) {
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "key words assume little-endian");
    _Static_assert(offsetof(struct ki_hist, key) == 0 && sizeof h->key == 24, "ki_hist key layout");
    return ((word_at(&h->key, 0) ^ w0) | (word_at(&h->key, 1) ^ w1) | (word_at(&h->key, 2) ^ w2) |
            (uint64_t)(h->kind ^ kind)) == 0;
}

/* Buckets of a chunk of cls bytes for kw-byte keys and cw-byte counts: a multiple of 4, so the
 * keys after the counts stay aligned. */
static uint32_t cap_of(uint32_t bytes, uint32_t kw, uint32_t cw) {
    uint32_t c = (bytes / (kw + cw)) & ~3u;
    return c < MAX_ROOM ? c : MAX_ROOM;
}

struct ki_histtab *ki_histtab_create(const struct ki_histogram_config *cfg) {
    if (!cfg || cfg->schema < KI_HISTOGRAM_SCHEMA_MIN || cfg->schema > KI_HISTOGRAM_SCHEMA_MAX ||
        !(cfg->zero_threshold >= 0) || !(cfg->max_zero_threshold >= 0) || cfg->max_buckets == 0 ||
        cfg->max_buckets >= MAX_ROOM - 4 || cfg->max_keys == 0 || cfg->max_keys > (1u << 24)) {
        errno = EINVAL;
        return NULL;
    }
    struct ki_histtab *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->cfg = *cfg;
    if (cfg->schema > 0) {
        uint32_t per = 1u << cfg->schema;
        for (uint32_t i = 0; i < per; i++) {
            uint64_t b;
            memcpy(&b, &ki_histogram_bounds[cfg->schema][i], sizeof b);
            t->mant_ext[i] = b & 0x000FFFFFFFFFFFFFULL;
        }
        t->mant_ext[per] = 1ULL << 52;
    }
    t->room = cfg->max_buckets + 1;
    uint32_t hsize = 2;
    while (hsize < 2 * cfg->max_keys) hsize <<= 1;
    t->hash_mask = hsize - 1;
    uint32_t last = ((t->room + 3) & ~3u) * 12; /* room slots of 4-byte keys and 8-byte counts */
    for (uint32_t b = 16; b < last && t->nclasses < MAX_CLASSES - 1;) {
        t->class_bytes[t->nclasses++] = b;
        b += b < 64 ? 8 : (uint32_t)1 << (29 - __builtin_clz(b)); /* 64, 80, 96, 112, 128, 160, ... */
    }
    t->class_bytes[t->nclasses++] = last;
    /* Every key at the largest class: after a compaction the pool holds only live chunks, so
     * this is never spent before max_keys histograms are each full. */
    t->pool_bytes = cfg->pool_buckets ? ((size_t)cfg->pool_buckets * 3 + 7) & ~(size_t)7 : (size_t)cfg->max_keys * last;
    t->hash_wide = cfg->max_keys >= UINT16_MAX;
    size_t hw = t->hash_wide ? sizeof(uint32_t) : sizeof(uint16_t);
    t->hash = calloc(hsize, hw);
    t->recs = calloc(cfg->max_keys, sizeof *t->recs);
    t->pool = calloc(1, t->pool_bytes + 8); /* zero pages: touched only as chunks are handed out */
    t->order = calloc(cfg->max_keys, sizeof *t->order); /* touched only by a compaction */
    if (!t->hash || !t->recs || !t->pool || !t->order || t->pool_bytes / 8 > UINT32_MAX) {
        ki_histtab_destroy(t);
        errno = ENOMEM;
        return NULL;
    }
    t->bytes = sizeof *t + (uint64_t)hsize * hw + (uint64_t)cfg->max_keys * sizeof *t->recs;
    return t;
}

void ki_histtab_destroy(struct ki_histtab *t) {
    if (!t) return;
    free(t->hash);
    free(t->recs);
    free(t->pool);
    free(t->order);
    free(t);
}

static struct ki_hist *rec(const struct ki_histtab *t, uint32_t slot) { return &t->recs[slot]; }
static inline uint8_t *chunk_at(const struct ki_histtab *t, const struct ki_hist *h) {
    return t->pool + (size_t)h->chunk * 8;
}
static inline uint8_t *keys_at(const struct ki_histtab *t, const struct ki_hist *h) {
    return chunk_at(t, h) + (size_t)h->cap * h->cw;
}
/* Positions of a histogram's buckets: n sorted ones (sparse), or cap slots (dense, zeros skipped). */
static inline uint32_t ends(const struct ki_hist *h) { return h->kw ? h->n : h->cap; }
static inline int32_t key_get(const struct ki_histtab *t, const struct ki_hist *h, uint32_t p) {
    const uint8_t *k = keys_at(t, h);
    if (h->kw == 0) return h->base + (int32_t)p;
    if (h->kw == 2) return h->base + ((const uint16_t *)(const void *)k)[p];
    return ((const int32_t *)(const void *)k)[p];
}
static inline void key_set(const struct ki_histtab *t, const struct ki_hist *h, uint32_t p, int32_t sk) {
    uint8_t *k = keys_at(t, h);
    if (h->kw == 0) return;
    if (h->kw == 2)
        ((uint16_t *)(void *)k)[p] = (uint16_t)(sk - h->base);
    else
        ((int32_t *)(void *)k)[p] = sk;
}
static inline uint64_t count_get(const struct ki_histtab *t, const struct ki_hist *h, uint32_t p) {
    const void *c = chunk_at(t, h);
    switch (h->cw) {
    case 1: return ((const uint8_t *)c)[p];
    case 2: return ((const uint16_t *)c)[p];
    case 4: return ((const uint32_t *)c)[p];
    default: return ((const uint64_t *)c)[p];
    }
}
static inline void count_set(const struct ki_histtab *t, const struct ki_hist *h, uint32_t p, uint64_t v) {
    void *c = chunk_at(t, h);
    switch (h->cw) {
    case 1: ((uint8_t *)c)[p] = (uint8_t)v; break;
    case 2: ((uint16_t *)c)[p] = (uint16_t)v; break;
    case 4: ((uint32_t *)c)[p] = (uint32_t)v; break;
    default: ((uint64_t *)c)[p] = v; break;
    }
}
/* Bytes of a count that holds v. */
static uint8_t width_for(uint64_t v) { return v <= UINT8_MAX ? 1 : v <= UINT16_MAX ? 2 : v <= UINT32_MAX ? 4 : 8; }

/* In-place heapsort of slots by chunk offset: glibc's qsort may malloc a merge buffer, and the
 * drain loop allocates nothing. */
static void sift(const struct ki_hist *r, uint32_t *a, size_t i, size_t n) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && r[a[c + 1]].chunk > r[a[c]].chunk) c++;
        if (r[a[i]].chunk >= r[a[c]].chunk) return;
        uint32_t t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

static void sort_by_chunk(const struct ki_hist *r, uint32_t *a, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift(r, a, i, n);
    for (size_t end = n; end-- > 1;) {
        uint32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift(r, a, 0, end);
    }
}

/* Slide every histogram's chunk down over the free ones, in pool order, so the pool's touched
 * part is what histograms hold: without it the chunks histograms outgrew stay on free lists
 * nobody takes when every key grows at once. Moves memory, allocates nothing; run when the free
 * lists hold a quarter of the pool, or when the pool is spent. */
static void compact(struct ki_histtab *t) {
    uint32_t n = 0;
    for (uint32_t s = 0; s < t->used; s++)
        if (t->recs[s].cap) t->order[n++] = s;
    sort_by_chunk(t->recs, t->order, n);
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ki_hist *h = &t->recs[t->order[i]];
        size_t bytes = t->class_bytes[h->cls];
        if ((size_t)h->chunk * 8 != off) memmove(t->pool + off, chunk_at(t, h), bytes);
        h->chunk = (uint32_t)(off / 8);
        off += bytes;
    }
    t->pool_used = off;
    t->free_bytes = 0;
    memset(t->free_head, 0, sizeof t->free_head);
    t->compactions++;
}

/* h's chunk is the pool's last one and the pool has room: grow it to class c in place (same
 * widths, so only the keys move up). 1 when done. */
static int grow_in_place(struct ki_histtab *t, struct ki_hist *h, uint32_t c, uint32_t cap) {
    size_t old = t->class_bytes[h->cls], end = (size_t)h->chunk * 8 + old;
    if (!h->cap || end != t->pool_used || t->pool_bytes - t->pool_used < t->class_bytes[c] - old) return 0;
    uint8_t *ch = chunk_at(t, h);
    if (h->kw == 0) /* dense: the new slots are empty (the pool past its end may hold moved data) */
        memset(ch + (size_t)h->cap * h->cw, 0, (size_t)(cap - h->cap) * h->cw);
    else
        memmove(ch + (size_t)cap * h->cw, ch + (size_t)h->cap * h->cw, (size_t)h->n * h->kw);
    t->pool_used += t->class_bytes[c] - old;
    h->cls = (uint8_t)c;
    h->cap = (uint16_t)cap;
    return 1;
}

/* A free chunk of class c: from its free list, else from the pool's end. -ENOBUFS when spent. */
static int take(struct ki_histtab *t, uint32_t c, size_t *off) {
    size_t bytes = t->class_bytes[c];
    if (t->free_head[c]) {
        *off = t->free_head[c] - 1;
        memcpy(&t->free_head[c], t->pool + *off, sizeof t->free_head[c]);
        t->free_bytes -= bytes;
        return 0;
    }
    if (t->pool_bytes - t->pool_used < bytes) return -ENOBUFS;
    *off = t->pool_used;
    t->pool_used += bytes;
    return 0;
}

/* h's chunk (if any) onto its class's free list: h moved to another chunk, or was evicted. */
static void give_back(struct ki_histtab *t, const struct ki_hist *h) {
    if (!h->cap) return;
    uint64_t link = t->free_head[h->cls];
    memcpy(chunk_at(t, h), &link, sizeof link);
    t->free_head[h->cls] = (size_t)h->chunk * 8 + 1;
    t->free_bytes += t->class_bytes[h->cls];
}

/* Give h a chunk for at least need buckets of kw-byte keys (narrow ones from base; kw 0: need
 * dense slots from base) and cw-byte counts, its buckets converted. Returns 0, or -ENOBUFS when
 * the pool is spent (h unchanged). */
static int rechunk(struct ki_histtab *t, struct ki_hist *h, uint32_t need, uint8_t kw, uint8_t cw, int32_t base) {
    uint32_t c = 0;
    while (c < t->nclasses && cap_of(t->class_bytes[c], kw, cw) < need) c++;
    if (c == t->nclasses) return -ENOBUFS;
    uint32_t cap = cap_of(t->class_bytes[c], kw, cw);
    int same = h->cap && kw == h->kw && cw == h->cw && (kw == 4 || base == h->base);
    if (same && grow_in_place(t, h, c, cap)) return 0;
    size_t bytes = t->class_bytes[c], off;
    if (!t->free_head[c] && t->free_bytes >= bytes && t->free_bytes * 4 >= t->pool_used)
        compact(t); /* the free chunks are of other sizes: reclaim them before the pool grows */
    if (take(t, c, &off) < 0) {
        if (!t->free_bytes) return -ENOBUFS;
        compact(t);
        if (same && grow_in_place(t, h, c, cap)) return 0;
        if (take(t, c, &off) < 0) return -ENOBUFS;
    }
    struct ki_hist nh = *h;
    nh.chunk = (uint32_t)(off / 8);
    nh.cls = (uint8_t)c;
    nh.cap = (uint16_t)cap;
    nh.kw = kw;
    nh.cw = cw;
    nh.base = base;
    nh.hint = 0;
    if (kw == 0) memset(chunk_at(t, &nh), 0, (size_t)cap * cw);
    for (uint32_t i = 0, w = 0, e = ends(h); i < e; i++) { /* widths only grow: every value fits */
        uint64_t v = count_get(t, h, i);
        if (!v) continue; /* an empty dense slot */
        int32_t sk = key_get(t, h, i);
        uint32_t q = kw ? w++ : (uint32_t)(sk - base);
        count_set(t, &nh, q, v);
        key_set(t, &nh, q, sk);
    }
    give_back(t, h);
    *h = nh;
    return 0;
}

static inline uint32_t hash_get(const struct ki_histtab *t, uint32_t i) {
    return t->hash_wide ? ((const uint32_t *)t->hash)[i] : ((const uint16_t *)t->hash)[i];
}
static inline void hash_put(struct ki_histtab *t, uint32_t i, uint32_t v) {
    if (t->hash_wide)
        ((uint32_t *)t->hash)[i] = v;
    else
        ((uint16_t *)t->hash)[i] = (uint16_t)v;
}

static inline int lookup(const struct ki_histtab *t, uint64_t w0, uint64_t w1, uint64_t w2, uint32_t kind,
                         uint32_t *pos) {
    uint32_t i = key_hash(w0, w1, w2, kind) & t->hash_mask;
    for (;;) {
        uint32_t s = hash_get(t, i);
        if (s == 0) {
            *pos = i;
            return -ENOENT;
        }
        if (key_eq(rec(t, s - 1), w0, w1, w2, kind)) return (int)(s - 1);
        i = (i + 1) & t->hash_mask;
    }
}

#define KEY_WORDS(k) (k)->pid | (uint64_t)(k)->gpu << 32, (k)->stream, (k)->name_id | (uint64_t)(k)->producer << 32, (k)->kind

int ki_histtab_find(const struct ki_histtab *t, const struct ki_histogram_key *key) {
    uint32_t pos;
    return lookup(t, KEY_WORDS(key), &pos);
}

/* Where the hash entry of the key in slot s would go with nothing in the way. */
static inline uint32_t home_of(const struct ki_histtab *t, uint32_t s) {
    const struct ki_hist *h = rec(t, s);
    return key_hash(word_at(&h->key, 0), word_at(&h->key, 1), word_at(&h->key, 2), h->kind) & t->hash_mask;
}

int ki_histtab_evict(struct ki_histtab *t, uint32_t slot) {
    if (slot >= t->used || rec(t, slot)->freed) return -ENOENT;
    /* Backward-shift deletion (linear probing without tombstones): every entry after the hole in
     * its probe run moves into it unless its home lies cyclically in (hole, entry], so that each
     * key stays reachable from its home through occupied entries only. */
    uint32_t i = home_of(t, slot);
    while (hash_get(t, i) != slot + 1) i = (i + 1) & t->hash_mask;
    for (uint32_t j = (i + 1) & t->hash_mask;; j = (j + 1) & t->hash_mask) {
        uint32_t e = hash_get(t, j);
        if (!e) break;
        uint32_t home = home_of(t, e - 1);
        if (((j - home) & t->hash_mask) >= ((j - i) & t->hash_mask)) { /* home at or before the hole */
            hash_put(t, i, e);
            i = j;
        }
    }
    hash_put(t, i, 0);
    struct ki_hist *h = rec(t, slot);
    give_back(t, h);
    *h = (struct ki_hist){0};
    h->freed = 1;
    h->chunk = t->free_slot;
    t->free_slot = slot + 1;
    t->nfree++;
    t->evicted++;
    return 0;
}

int ki_histtab_key(const struct ki_histtab *t, uint32_t slot, struct ki_histogram_key *out) {
    if (slot >= t->used || rec(t, slot)->freed) return -ENOENT;
    const struct ki_hist *h = rec(t, slot);
    *out = (struct ki_histogram_key){h->key.pid, h->key.gpu, h->key.stream, h->key.name_id, h->key.producer, h->kind, 0};
    return 0;
}

/* Position of key sk in the sorted keys bk[0..n), or where it goes (*found = 0); hint first.
 * Bucket keys are distinct integers: fewer than sk - bk[0] of them lie below sk, and at most
 * bk[n-1] - sk + 1 at or above it. That pins the position to one slot where the buckets are
 * contiguous (most of a histogram), and to a few around gaps: a short search, not log2(n) steps. */
#define BUCKET_POS(NAME, T)                                                                  \
    static inline uint32_t NAME(const T *bk, uint32_t n, uint32_t hint, int32_t sk, int *found) { \
        if (hint < n && bk[hint] == sk) {                                                    \
            *found = 1;                                                                      \
            return hint;                                                                     \
        }                                                                                    \
        if (n == 0 || sk <= (int32_t)bk[0]) {                                                \
            *found = n > 0 && bk[0] == sk;                                                   \
            return 0;                                                                        \
        }                                                                                    \
        if (sk > (int32_t)bk[n - 1]) {                                                       \
            *found = 0;                                                                      \
            return n;                                                                        \
        }                                                                                    \
        uint32_t below = (uint32_t)(sk - (int32_t)bk[0]), above = (uint32_t)((int32_t)bk[n - 1] - sk); \
        uint32_t lo = above < n - 1 ? n - 1 - above : 1, hi = below < n - 1 ? below : n - 1; \
        while (lo < hi) {                                                                    \
            uint32_t mid = (lo + hi) >> 1;                                                   \
            if ((int32_t)bk[mid] < sk)                                                       \
                lo = mid + 1;                                                                \
            else                                                                             \
                hi = mid;                                                                    \
        }                                                                                    \
        *found = lo < n && bk[lo] == sk;                                                     \
        return lo;                                                                           \
    }
BUCKET_POS(pos16, uint16_t)
BUCKET_POS(pos32, int32_t)

/* Sparse histograms only (dense ones are indexed directly). */
static inline uint32_t bucket_pos(const struct ki_histtab *t, const struct ki_hist *h, int32_t sk, int *found) {
    if (h->kw == 2) {
        int64_t off = (int64_t)sk - h->base;
        *found = 0;
        if (off < 0) return 0;
        if (off > 65535) return h->n;
        return pos16((const uint16_t *)(const void *)keys_at(t, h), h->n, h->hint, (int32_t)off, found);
    }
    return pos32((const int32_t *)(const void *)keys_at(t, h), h->n, h->hint, sk, found);
}

static void bucket_remove(const struct ki_histtab *t, struct ki_hist *h, uint32_t p) {
    uint8_t *c = chunk_at(t, h), *k = keys_at(t, h);
    memmove(c + (size_t)p * h->cw, c + (size_t)(p + 1) * h->cw, (size_t)(h->n - p - 1) * h->cw);
    memmove(k + (size_t)p * h->kw, k + (size_t)(p + 1) * h->kw, (size_t)(h->n - p - 1) * h->kw);
    h->n--;
    h->hint = 0;
}

/* client_golang maybeWidenZeroBucket: merge the bucket(s) nearest zero into the zero bucket. */
static int widen_zero(const struct ki_histtab *t, struct ki_hist *h) {
    if (h->zero_threshold >= t->cfg.max_zero_threshold || h->n == 0) return 0;
    int32_t smallest = INT32_MAX;
    if (key_get(t, h, 0) < NEG_LIMIT) smallest = key_get(t, h, 0) + NEG_OFF; /* smallest negative index */
    for (uint32_t i = 0; i < h->n; i++)
        if (key_get(t, h, i) >= NEG_LIMIT) { /* smallest positive index */
            if (key_get(t, h, i) < smallest) smallest = key_get(t, h, i);
            break;
        }
    double zt = ki_histogram_upper(smallest, h->schema);
    if (zt > t->cfg.max_zero_threshold) return 0;
    h->zero_threshold = zt;
    int32_t targets[2] = {smallest - NEG_OFF, smallest};
    for (int k = 0; k < 2; k++) {
        int found;
        uint32_t p = bucket_pos(t, h, targets[k], &found);
        if (found) {
            h->zero_count += count_get(t, h, p);
            bucket_remove(t, h, p);
        }
    }
    return 1;
}

/* client_golang doubleBucketWidth: schema - 1, buckets merged pairwise. The counts are wide enough
 * for any sum (the caller made them hold count). Narrow keys get a new base: the range halves. */
static void halve(const struct ki_histtab *t, struct ki_hist *h) {
    struct ki_hist old = *h;
    uint32_t w = 0;
    for (uint32_t r = 0; r < old.n; r++) {
        int32_t k = key_get(t, &old, r);
        int neg = k < NEG_LIMIT;
        int32_t i = neg ? k + NEG_OFF : k;
        if (i > 0) i++;
        i /= 2; /* truncates toward zero, like Go */
        int32_t sk = neg ? i - NEG_OFF : i;
        if (r == 0) h->base = sk - 16384;
        if (w > 0 && key_get(t, h, w - 1) == sk) {
            count_set(t, h, w - 1, count_get(t, h, w - 1) + count_get(t, &old, r));
        } else {
            uint64_t c = count_get(t, &old, r);
            key_set(t, h, w, sk);
            count_set(t, h, w, c);
            w++;
        }
    }
    h->n = (uint16_t)w;
    h->schema--;
    h->hint = 0;
}

inline int ki_histtab_slot_words(struct ki_histtab *t, uint64_t pid_gpu, uint64_t stream, uint64_t name_producer,
                          uint32_t kind) {
    uint32_t pos = 0;
    int slot = lookup(t, pid_gpu, stream, name_producer, kind, &pos);
    if (slot >= 0) return slot;
    if (t->free_slot) { /* an evicted key's slot */
        slot = (int)t->free_slot - 1;
        t->free_slot = rec(t, (uint32_t)slot)->chunk;
        t->nfree--;
    } else if (t->used == t->cfg.max_keys) {
        t->keys_refused++;
        return -ENOSPC;
    } else {
        slot = (int)t->used++;
    }
    hash_put(t, pos, (uint32_t)slot + 1);
    struct ki_hist *nh = rec(t, (uint32_t)slot);
    *nh = (struct ki_hist){0}; /* a reused slot holds its evicted key's leftovers */
    uint64_t w[3] = {pid_gpu, stream, name_producer};
    memcpy(&nh->key, w, sizeof nh->key);
    nh->kind = (uint8_t)kind;
    nh->schema = (int8_t)t->cfg.schema;
    nh->zero_threshold = t->cfg.zero_threshold;
    nh->kw = 0; /* dense until sparse is smaller */
    nh->cw = 1;
    return slot;
}

int ki_histtab_slot(struct ki_histtab *t, const struct ki_histogram_key *key) {
    return ki_histtab_slot_words(t, KEY_WORDS(key));
}

void ki_histtab_refused(struct ki_histtab *t, uint64_t n) { t->obs_refused += n; }

uint64_t ki_histtab_count(const struct ki_histtab *t, uint32_t slot) {
    return slot < t->used ? rec(t, slot)->count : 0;
}

double ki_histtab_quantile_upper(const struct ki_histtab *t, uint32_t slot, double q) {
    if (slot >= t->used || !rec(t, slot)->count) return INFINITY;
    const struct ki_hist *h = rec(t, slot);
    uint64_t rank = (uint64_t)ceil(q * (double)h->count), seen = h->zero_count;
    uint32_t i = 0;
    uint32_t e = ends(h);
    for (; i < e && key_get(t, h, i) < NEG_LIMIT; i++) seen += count_get(t, h, i); /* negatives sort first */
    if (seen >= rank) return 0;
    for (; i < e; i++) {
        seen += count_get(t, h, i);
        if (seen >= rank) return ki_histogram_upper(key_get(t, h, i), h->schema);
    }
    return INFINITY; /* NaN observations counted but in no bucket */
}

int ki_histtab_observe(struct ki_histtab *t, const struct ki_histogram_key *key, double v) {
    int slot = ki_histtab_slot(t, key);
    if (slot < 0) {
        t->obs_refused++;
        return slot;
    }
    return ki_histtab_observe_slot(t, (uint32_t)slot, v);
}

/* Add one to the count at p, widening the counts when it would overflow. 0 or -ENOBUFS. */
static inline int count_inc(struct ki_histtab *t, struct ki_hist *h, uint32_t p) {
    void *c = chunk_at(t, h);
    switch (h->cw) {
    case 1:
        if (((uint8_t *)c)[p] != UINT8_MAX) return ((uint8_t *)c)[p]++, 0;
        break;
    case 2:
        if (((uint16_t *)c)[p] != UINT16_MAX) return ((uint16_t *)c)[p]++, 0;
        break;
    case 4:
        if (((uint32_t *)c)[p] != UINT32_MAX) return ((uint32_t *)c)[p]++, 0;
        break;
    default: return ((uint64_t *)c)[p]++, 0;
    }
    uint64_t v = count_get(t, h, p) + 1;
    if (rechunk(t, h, h->kw ? h->n : h->cap, h->kw, (uint8_t)(h->cw * 2), h->base) < 0) return -ENOBUFS;
    count_set(t, h, p, v);
    return 0;
}

/* Whether dense slots over range keys cost no more than n sparse buckets (plus a little: no search). */
static int dense_pays(int64_t range, uint32_t n, uint32_t cw) {
    return range <= (int64_t)MAX_ROOM && (uint64_t)range * cw <= (uint64_t)n * (2 + cw) + 8;
}

/* Lowest and highest populated sort keys (n > 0). */
static void key_range(const struct ki_histtab *t, const struct ki_hist *h, int32_t *lo, int32_t *hi) {
    uint32_t a = 0, b = ends(h) - 1;
    if (h->kw == 0) {
        while (!count_get(t, h, a)) a++;
        while (!count_get(t, h, b)) b--;
    }
    *lo = key_get(t, h, a);
    *hi = key_get(t, h, b);
}

/* Add a bucket of key sk holding 1, making room: a bigger chunk, dense or sparse, whichever is
 * smaller; narrow keys rebased or widened when sk is out of their range; counts wide enough for
 * the merges that follow when the insert goes past max_buckets (those work on sparse buckets).
 * 0 or -ENOBUFS (nothing changed). */
static int bucket_insert(struct ki_histtab *t, struct ki_hist *h, int32_t sk) {
    uint32_t n1 = h->n + 1u;
    int reduce = n1 > t->cfg.max_buckets;
    uint8_t cw = h->cw;
    if (reduce && width_for(h->count + 1) > cw) cw = width_for(h->count + 1);
    int32_t lo = sk, hi = sk;
    if (h->n) {
        key_range(t, h, &lo, &hi);
        if (sk < lo) lo = sk;
        if (sk > hi) hi = sk;
    }
    int64_t range = (int64_t)hi - lo + 1;
    int fits = h->cap && sk >= h->base && (int64_t)sk - h->base < (h->kw ? 65536 : (int64_t)h->cap);
    if (h->kw == 0 && !reduce && fits && cw == h->cw) { /* an empty slot of a dense chunk */
        count_set(t, h, (uint32_t)(sk - h->base), 1);
        h->n++;
        return 0;
    }
    if (!reduce && (h->kw == 0 || h->n == h->cap) && dense_pays(range, n1, cw)) {
        uint32_t c = 0;
        while (c < t->nclasses && cap_of(t->class_bytes[c], 0, cw) < range) c++;
        if (c == t->nclasses) return -ENOBUFS;
        int64_t cap = cap_of(t->class_bytes[c], 0, cw);
        int32_t base;
        if (h->n == 0) base = sk - (int32_t)(cap / 2);                       /* room both ways */
        else if (h->kw == 0 && h->base <= lo && hi - h->base < cap) base = h->base; /* grows in place */
        else if (sk == lo) base = hi - (int32_t)cap + 1;                    /* room below, where it grows */
        else base = lo;                                                      /* room above */
        if (rechunk(t, h, (uint32_t)cap, 0, cw, base) < 0) return -ENOBUFS;
        count_set(t, h, (uint32_t)(sk - h->base), 1);
        h->n++;
        return 0;
    }
    /* Sparse. */
    uint8_t kw = h->kw ? h->kw : 2;
    int32_t base = h->base;
    if (h->kw == 0 || (kw == 2 && !fits)) {
        if (range <= 65536)
            base = lo - (int32_t)((65536 - range) / 2);
        else
            kw = 4;
    }
    if (h->kw == 0 || h->n == h->cap || kw != h->kw || cw != h->cw) {
        if (rechunk(t, h, n1, kw, cw, base) < 0) return -ENOBUFS;
    } else if (base != h->base) { /* same chunk, keys shifted into the new range */
        uint16_t *k = (uint16_t *)(void *)keys_at(t, h);
        for (uint32_t i = 0; i < h->n; i++) k[i] = (uint16_t)(k[i] + (h->base - base));
        h->base = base;
    }
    int found;
    uint32_t p = bucket_pos(t, h, sk, &found);
    uint8_t *c = chunk_at(t, h), *k = keys_at(t, h);
    memmove(c + (size_t)(p + 1) * h->cw, c + (size_t)p * h->cw, (size_t)(h->n - p) * h->cw);
    memmove(k + (size_t)(p + 1) * h->kw, k + (size_t)p * h->kw, (size_t)(h->n - p) * h->kw);
    h->n++;
    key_set(t, h, p, sk);
    count_set(t, h, p, 1);
    h->hint = (uint16_t)p;
    return 0;
}

/* The common case in one pass: a value above the zero threshold into a populated bucket of a
 * dense histogram whose count does not reach its width's limit. 1 when counted, 0 for the
 * general path (which computes the index again: a new bucket or a wider count is rare). */
static inline int observe_dense(const struct ki_histtab *t, struct ki_hist *h, double v) {
    if (h->kw != 0 || !(v > h->zero_threshold)) return 0;
    uint32_t p = (uint32_t)(hist_index(v, h->schema) - h->base);
    if (p >= h->cap) return 0;
    void *c = chunk_at(t, h);
    switch (h->cw) {
    case 1: {
        uint8_t *x = (uint8_t *)c + p;
        if ((uint8_t)(*x + 1u) < 2u) return 0; /* empty, or full */
        ++*x;
        break;
    }
    case 2: {
        uint16_t *x = (uint16_t *)c + p;
        if ((uint16_t)(*x + 1u) < 2u) return 0;
        ++*x;
        break;
    }
    case 4: {
        uint32_t *x = (uint32_t *)c + p;
        if (*x + 1u < 2u) return 0;
        ++*x;
        break;
    }
    default: return 0;
    }
    h->count++;
    h->sum += v;
    return 1;
}

/* Every other observation: zero bucket, sparse buckets, a new bucket, a wider count, NaN. Out
 * of line, so that the common case keeps its registers. */
__attribute__((noinline)) static int observe_general(struct ki_histtab *t, struct ki_hist *h, double v) {
    if (!isnan(v)) {
        int32_t sk;
        if (v > h->zero_threshold)
            sk = hist_index(v, h->schema);
        else if (v < -h->zero_threshold)
            sk = hist_index(v, h->schema) - NEG_OFF;
        else {
            h->zero_count++;
            goto counted;
        }
        int found;
        uint32_t p;
        if (h->kw == 0) { /* dense: the slot, or none */
            p = (uint32_t)(sk - h->base);
            found = p < h->cap && count_get(t, h, p) != 0;
        } else {
            p = bucket_pos(t, h, sk, &found);
        }
        if (found) {
            if (count_inc(t, h, p) < 0) {
                t->pool_refused++;
                return -ENOBUFS;
            }
            h->hint = (uint16_t)p;
            goto counted;
        }
        if (bucket_insert(t, h, sk) < 0) {
            t->pool_refused++;
            return -ENOBUFS;
        }
        while (h->n > t->cfg.max_buckets) {
            if (widen_zero(t, h)) continue;
            if (h->schema > KI_HISTOGRAM_SCHEMA_MIN) {
                halve(t, h);
                continue;
            }
            /* Nothing merged since the insert, so the new bucket still holds only v: take it out. */
            int32_t i = ki_histogram_index(v, h->schema);
            p = bucket_pos(t, h, v > 0 ? i : i - NEG_OFF, &found);
            if (found && count_get(t, h, p) == 1) bucket_remove(t, h, p);
            t->bucket_refused++;
            return -ERANGE;
        }
    }
counted:
    h->count++;
    h->sum += v;
    return 0;
}

int ki_histtab_observe_slot(struct ki_histtab *t, uint32_t slot, double v) {
    struct ki_hist *h = rec(t, slot);
    return observe_dense(t, h, v) ? 0 : observe_general(t, h, v);
}

/* The common observation of a block in one loop: a normal positive value into an existing dense
 * bucket of a histogram still at the table's schema (every kernel duration once its histogram has
 * seen its range). The schema's index tables, its shift and the pool are looked up once per call
 * instead of per value (hist_index's arithmetic on h->schema, a third of observe_dense's
 * instructions); the bucket index is hist_index's, bit for bit, with the bound compared by its
 * mantissa (mant_ext). Any other observation (a new bucket, a full count, another histogram or
 * value) leaves the loop for observe_dense and observe_general, out of it so that the loop keeps
 * its constants in registers. Its tests branch: each is as predictable as the values are alike,
 * and a compare-and-branch is one fused instruction where a bitwise & of flags took several. */
__attribute__((always_inline)) static inline size_t observe_slots(struct ki_histtab *t, const int32_t *slots,
                                                                   const double *v, size_t n, const int32_t schema) {
    size_t counted = 0, i = 0;
    int dense_failed; /* the observation that left the loop failed observe_dense's test: observe_general */
    /* fast: a positive schema (hist_index's fast path); -128, which no histogram holds, otherwise */
    const int8_t fast = schema > 0 ? (int8_t)schema : INT8_MIN;
    const unsigned sh = schema > 0 ? (unsigned)schema : 0;
    const unsigned shift = schema > 0 ? (unsigned)(51 - schema) : 0;
    const uint16_t *first = schema > 0 ? ki_histogram_first + KI_HISTOGRAM_FIRST_OFF(schema) : NULL;
    for (;;) {
        /* The common observations, up to the next other one: a loop without a call, so that its
         * constants stay in registers. */
        const uint64_t *mant_ext = t->mant_ext;
        struct ki_hist *const recs = t->recs;
        uint8_t *const pool = t->pool;
        for (dense_failed = 0; i < n; i++) {
            const int32_t s = slots[i];
            if (s < 0) continue;
            struct ki_hist *h = &recs[s];
            const double x = v[i];
            uint64_t bits;
            memcpy(&bits, &x, sizeof bits);
            const uint32_t biased = (uint32_t)(bits >> 52); /* sign included: a negative x is not fast */
            if (!(h->schema == fast && h->kw == 0 && biased - 1u < 0x7FEu && x > h->zero_threshold)) break;
            const uint64_t mant = bits & 0x000FFFFFFFFFFFFFULL;
            uint32_t lo = first[mant >> shift];
            lo += mant_ext[lo] < mant; /* hist_index's (lo < per) & (bounds[lo & (per - 1)] < frac) */
            /* lo + (biased - 1023) * 2^schema - base, in unsigned arithmetic (the same bits) */
            const uint32_t p = lo + ((biased - 1023u) << sh) - (uint32_t)h->base;
            dense_failed = 1; /* (each break below: where observe_dense fails too) */
            if (p >= h->cap) break;
            uint8_t *c = pool + (size_t)h->chunk * 8;
            if (h->cw == 2) {
                uint16_t *b = (uint16_t *)(void *)c + p;
                if ((uint16_t)(*b + 1u) < 2u) break; /* empty, or full */
                ++*b;
            } else if (h->cw == 4) {
                uint32_t *b = (uint32_t *)(void *)c + p;
                if (*b + 1u < 2u) break;
                ++*b;
            } else if (h->cw == 1) {
                if ((uint8_t)(c[p] + 1u) < 2u) break;
                ++c[p];
            } else {
                break;
            }
            dense_failed = 0;
            h->count++;
            h->sum += x;
            counted++;
        }
        if (i == n) return counted;
        struct ki_hist *h = &t->recs[slots[i]];
        counted += dense_failed ? observe_general(t, h, v[i]) == 0 : observe_dense(t, h, v[i]) || observe_general(t, h, v[i]) == 0;
        i++;
    }
}

size_t ki_histtab_observe_slots(struct ki_histtab *t, const int32_t *slots, const double *v, size_t n) {
    /* The default schema's loop with its shifts as constants (cl is then free, nothing spilled) */
    if (t->cfg.schema == 3) return observe_slots(t, slots, v, n, 3);
    return observe_slots(t, slots, v, n, t->cfg.schema);
}

size_t ki_histtab_export_room(const struct ki_histtab *t) { return 3 * (size_t)t->room; }

/* client_golang makeBuckets: spans with gaps of up to two buckets filled with zeros, counts as deltas. */
static void make_buckets(const struct ki_histtab *t, const struct ki_hist *h, uint32_t from, uint32_t to, int32_t off,
                         struct ki_histogram_span *spans, uint32_t *nspans, int64_t *deltas, uint32_t *ndeltas) {
    uint32_t ns = 0, nd = 0;
    int64_t prev = 0;
    int32_t next = 0;
    for (uint32_t r = from; r < to; r++) {
        int64_t c = (int64_t)count_get(t, h, r);
        if (!c) continue; /* an empty dense slot */
        int32_t i = key_get(t, h, r) + off;
        int32_t gap = i - next;
        if (ns == 0 || gap > 2) {
            spans[ns].offset = gap;
            spans[ns].length = 0;
            ns++;
        } else {
            for (int32_t j = 0; j < gap; j++) {
                spans[ns - 1].length++;
                deltas[nd++] = -prev;
                prev = 0;
            }
        }
        spans[ns - 1].length++;
        deltas[nd++] = c - prev;
        prev = c;
        next = i + 1;
    }
    *nspans = ns;
    *ndeltas = nd;
}

int ki_histtab_export(const struct ki_histtab *t, uint32_t slot, struct ki_histogram_export *out) {
    if (slot >= t->used || rec(t, slot)->freed) return -ENOENT;
    const struct ki_hist *h = rec(t, slot);
    out->schema = h->schema;
    out->zero_threshold = h->zero_threshold;
    out->zero_count = h->zero_count;
    out->count = h->count;
    out->sum = h->sum;
    uint32_t nneg = 0, e = ends(h);
    while (nneg < e && key_get(t, h, nneg) < NEG_LIMIT) nneg++;
    make_buckets(t, h, 0, nneg, NEG_OFF, out->neg_spans, &out->n_neg_spans, out->neg_deltas, &out->n_neg_deltas);
    make_buckets(t, h, nneg, e, 0, out->pos_spans, &out->n_pos_spans, out->pos_deltas, &out->n_pos_deltas);
    return 0;
}

void ki_histtab_stats(const struct ki_histtab *t, struct ki_histtab_stats *out) {
    out->keys = t->used - t->nfree;
    out->slots = t->used;
    out->evicted = t->evicted;
    out->keys_refused = t->keys_refused;
    out->obs_refused = t->obs_refused;
    out->bucket_refused = t->bucket_refused;
    out->pool_refused = t->pool_refused;
    out->bytes = t->bytes + t->pool_used;
    out->compactions = t->compactions;
}
