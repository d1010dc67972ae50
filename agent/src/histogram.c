/* histogram.c - native-histogram accumulators in a fixed-capacity table (ki_histogram.h). */
#include "ki_histogram.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ki_histogram_bounds.h"
#include "ki_histogram_index.h"

/* Positive and negative buckets share one sorted array of int32 sort keys: a
 * positive bucket i is i, a negative one i - NEG_OFF. Indexes stay within
 * +-(1075 << 8) < 2^19, so every negative key sorts before every positive one. */
#define NEG_OFF (1 << 22)
#define NEG_LIMIT (-(1 << 21))

/* One histogram's record: key and state. Its buckets live in a chunk of the shared
 * pool: cap sorted bucket keys, then their counts. */
struct ki_hist {
    struct ki_histogram_key key;
    int32_t schema;
    uint32_t n;     /* populated buckets */
    uint32_t hint;  /* last bucket position touched */
    uint32_t cap;   /* bucket slots of its chunk (0: none yet) */
    uint64_t chunk; /* byte offset of its chunk in the pool */
    double zero_threshold;
    uint64_t zero_count, count;
    double sum;
};

/* Chunk size classes: 8, 16, 32, ... bucket slots, the last one exactly room. A chunk
 * that grows moves to the next class; the old one goes to its class's free list. */
#define MAX_CLASSES 24
#define FIRST_CAP 8

struct ki_histtab {
    struct ki_histogram_config cfg;
    uint32_t room;       /* bucket slots per histogram: max_buckets + 1 */
    uint32_t used;       /* histograms in use */
    uint32_t hash_mask;
    uint32_t *hash;      /* slot + 1, 0 = empty */
    struct ki_hist *recs;
    uint8_t *pool;       /* bucket chunks, bump-allocated, pages touched as used */
    size_t pool_bytes, pool_used;
    uint32_t nclasses;
    uint32_t class_cap[MAX_CLASSES];
    uint64_t free_head[MAX_CLASSES]; /* offset + 1 of a free chunk (its first 8 bytes link the next), 0: none */
    size_t free_bytes;   /* bytes of the chunks on free lists */
    uint64_t *order;     /* compaction scratch: (chunk offset << 24 | slot) per histogram */
    uint64_t compactions;
    uint64_t keys_refused, obs_refused, bucket_refused, pool_refused, bytes;
};

static int32_t floor_shift(int32_t k, int sh) { /* k >> sh, rounding toward -inf like Go's >> */
    return k >= 0 ? k >> sh : -(int32_t)(((uint32_t)-k + ((1u << sh) - 1)) >> sh);
}

int32_t ki_histogram_index(double v, int32_t schema) {
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

static uint32_t key_hash(const struct ki_histogram_key *k) {
    uint64_t h = ((uint64_t)k->pid << 32 | k->gpu) * 0x9E3779B97F4A7C15ULL;
    h ^= (k->stream + 0x632BE59BD9B4E019ULL) * 0xC2B2AE3D27D4EB4FULL;
    h ^= ((uint64_t)k->producer << 32 | k->name_id) * 0x165667B19E3779F9ULL;
    h ^= (uint64_t)k->kind * 0x94D049BB133111EBULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    return (uint32_t)(h ^ (h >> 32));
}

static int key_eq(const struct ki_histogram_key *a, const struct ki_histogram_key *b) {
    return a->pid == b->pid && a->gpu == b->gpu && a->stream == b->stream && a->name_id == b->name_id &&
           a->producer == b->producer && a->kind == b->kind;
}

static size_t keys_bytes(uint32_t cap) { return ((size_t)cap * sizeof(int32_t) + 7) & ~(size_t)7; }
static size_t chunk_bytes(uint32_t cap) { return keys_bytes(cap) + (size_t)cap * sizeof(uint64_t); }

struct ki_histtab *ki_histtab_create(const struct ki_histogram_config *cfg) {
    if (!cfg || cfg->schema < KI_HISTOGRAM_SCHEMA_MIN || cfg->schema > KI_HISTOGRAM_SCHEMA_MAX ||
        !(cfg->zero_threshold >= 0) || !(cfg->max_zero_threshold >= 0) || cfg->max_buckets == 0 ||
        cfg->max_buckets > (1u << 20) || cfg->max_keys == 0 || cfg->max_keys > (1u << 28)) {
        errno = EINVAL;
        return NULL;
    }
    struct ki_histtab *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->cfg = *cfg;
    t->room = cfg->max_buckets + 1;
    uint32_t hsize = 2;
    while (hsize < 2 * cfg->max_keys) hsize <<= 1;
    t->hash_mask = hsize - 1;
    size_t worst = 0; /* one histogram's chunks of every class: what it can hold in the pool at most */
    for (uint32_t c = FIRST_CAP;; c *= 2) {
        uint32_t cap = c < t->room ? c : t->room;
        t->class_cap[t->nclasses++] = cap;
        worst += chunk_bytes(cap);
        if (cap == t->room) break;
    }
    t->pool_bytes = cfg->pool_buckets ? (size_t)cfg->pool_buckets * 12 + chunk_bytes(t->room)
                                      : (size_t)cfg->max_keys * worst;
    t->hash = calloc(hsize, sizeof *t->hash);
    t->recs = calloc(cfg->max_keys, sizeof *t->recs);
    t->pool = calloc(1, t->pool_bytes); /* zero pages: touched only as chunks are handed out */
    t->order = calloc(cfg->max_keys, sizeof *t->order); /* touched only by a compaction */
    if (!t->hash || !t->recs || !t->pool || !t->order) {
        ki_histtab_destroy(t);
        errno = ENOMEM;
        return NULL;
    }
    t->bytes = sizeof *t + (uint64_t)hsize * sizeof *t->hash + (uint64_t)cfg->max_keys * sizeof *t->recs;
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
static int32_t *rec_keys(const struct ki_histtab *t, const struct ki_hist *h) {
    return (int32_t *)(void *)(t->pool + h->chunk);
}
static uint64_t *rec_counts(const struct ki_histtab *t, const struct ki_hist *h) {
    return (uint64_t *)(void *)(t->pool + h->chunk + keys_bytes(h->cap));
}

/* In-place heapsort: glibc's qsort may malloc a merge buffer, and the drain loop allocates nothing. */
static void sift(uint64_t *a, size_t i, size_t n) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[i] >= a[c]) return;
        uint64_t t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

static void sort_u64(uint64_t *a, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift(a, i, n);
    for (size_t end = n; end-- > 1;) {
        uint64_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift(a, 0, end);
    }
}

/* Slide every histogram's chunk down over the free ones, in pool order, so the pool's touched
 * part is what histograms hold: without it the chunks histograms outgrew stay on free lists
 * nobody takes when every key grows at once (about half the pool). Moves memory, allocates
 * nothing; run when the free lists hold a quarter of the pool. */
static void compact(struct ki_histtab *t) {
    uint32_t n = 0;
    for (uint32_t s = 0; s < t->used; s++)
        if (t->recs[s].cap) t->order[n++] = t->recs[s].chunk << 24 | s;
    sort_u64(t->order, n);
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ki_hist *h = &t->recs[t->order[i] & 0xFFFFFF];
        size_t bytes = chunk_bytes(h->cap);
        if (h->chunk != off) memmove(t->pool + off, t->pool + h->chunk, bytes);
        h->chunk = off;
        off += bytes;
    }
    t->pool_used = off;
    t->free_bytes = 0;
    memset(t->free_head, 0, sizeof t->free_head);
    t->compactions++;
}

/* Move h's buckets to a chunk of the next class. Returns 0, or -ENOBUFS when the pool is spent. */
static int grow(struct ki_histtab *t, struct ki_hist *h) {
    uint32_t c = 0;
    while (c < t->nclasses && t->class_cap[c] <= h->cap) c++;
    if (c == t->nclasses) return -ENOBUFS;
    uint32_t cap = t->class_cap[c];
    size_t off;
    if (!t->free_head[c] && t->free_bytes >= chunk_bytes(cap) && t->free_bytes * 4 >= t->pool_used &&
        t->used <= 0xFFFFFF)
        compact(t); /* the free chunks are of other sizes: reclaim them before the pool grows */
    if (t->free_head[c]) {
        off = t->free_head[c] - 1;
        memcpy(&t->free_head[c], t->pool + off, sizeof t->free_head[c]);
        t->free_bytes -= chunk_bytes(cap);
    } else {
        if (t->pool_bytes - t->pool_used < chunk_bytes(cap)) return -ENOBUFS;
        off = t->pool_used;
        t->pool_used += chunk_bytes(cap);
    }
    if (h->cap) {
        memcpy(t->pool + off, rec_keys(t, h), h->n * sizeof(int32_t));
        memcpy(t->pool + off + keys_bytes(cap), rec_counts(t, h), h->n * sizeof(uint64_t));
        uint32_t old = 0;
        while (t->class_cap[old] != h->cap) old++;
        uint64_t link = t->free_head[old];
        memcpy(t->pool + h->chunk, &link, sizeof link);
        t->free_head[old] = h->chunk + 1;
        t->free_bytes += chunk_bytes(h->cap);
    }
    h->chunk = off;
    h->cap = cap;
    return 0;
}

static int lookup(const struct ki_histtab *t, const struct ki_histogram_key *key, uint32_t *pos) {
    uint32_t i = key_hash(key) & t->hash_mask;
    for (;;) {
        uint32_t s = t->hash[i];
        if (s == 0) {
            *pos = i;
            return -ENOENT;
        }
        if (key_eq(&rec(t, s - 1)->key, key)) return (int)(s - 1);
        i = (i + 1) & t->hash_mask;
    }
}

int ki_histtab_find(const struct ki_histtab *t, const struct ki_histogram_key *key) {
    uint32_t pos;
    return lookup(t, key, &pos);
}

const struct ki_histogram_key *ki_histtab_key(const struct ki_histtab *t, uint32_t slot) {
    return slot < t->used ? &rec(t, slot)->key : NULL;
}

/* Position of sort key sk in the histogram's sorted buckets, or where it goes (*found = 0). */
static uint32_t bucket_pos(const int32_t *bk, const struct ki_hist *h, int32_t sk, int *found) {
    if (h->hint < h->n && bk[h->hint] == sk) {
        *found = 1;
        return h->hint;
    }
    uint32_t n = h->n;
    if (n == 0 || sk <= bk[0]) {
        *found = n > 0 && bk[0] == sk;
        return 0;
    }
    if (sk > bk[n - 1]) {
        *found = 0;
        return n;
    }
    /* Bucket keys are distinct integers: fewer than sk - bk[0] of them lie below sk, and at most
     * bk[n-1] - sk + 1 at or above it. That pins the position to one slot where the buckets are
     * contiguous (most of a histogram), and to a few around gaps: a short search, not log2(n) steps. */
    uint32_t below = (uint32_t)(sk - bk[0]), above = (uint32_t)(bk[n - 1] - sk);
    uint32_t lo = above < n - 1 ? n - 1 - above : 1, hi = below < n - 1 ? below : n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) >> 1;
        if (bk[mid] < sk)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < h->n && bk[lo] == sk;
    return lo;
}

static void bucket_remove(int32_t *bk, uint64_t *bc, struct ki_hist *h, uint32_t p) {
    memmove(bk + p, bk + p + 1, (h->n - p - 1) * sizeof *bk);
    memmove(bc + p, bc + p + 1, (h->n - p - 1) * sizeof *bc);
    h->n--;
    h->hint = 0;
}

/* client_golang maybeWidenZeroBucket: merge the bucket(s) nearest zero into the zero bucket. */
static int widen_zero(const struct ki_histtab *t, int32_t *bk, uint64_t *bc, struct ki_hist *h) {
    if (h->zero_threshold >= t->cfg.max_zero_threshold || h->n == 0) return 0;
    int32_t smallest = INT32_MAX;
    if (bk[0] < NEG_LIMIT) smallest = bk[0] + NEG_OFF; /* smallest negative index */
    for (uint32_t i = 0; i < h->n; i++)
        if (bk[i] >= NEG_LIMIT) { /* smallest positive index */
            if (bk[i] < smallest) smallest = bk[i];
            break;
        }
    double zt = ki_histogram_upper(smallest, h->schema);
    if (zt > t->cfg.max_zero_threshold) return 0;
    h->zero_threshold = zt;
    int32_t targets[2] = {smallest - NEG_OFF, smallest};
    for (int k = 0; k < 2; k++) {
        int found;
        uint32_t p = bucket_pos(bk, h, targets[k], &found);
        if (found) {
            h->zero_count += bc[p];
            bucket_remove(bk, bc, h, p);
        }
    }
    return 1;
}

/* client_golang doubleBucketWidth: schema - 1, buckets merged pairwise. */
static void halve(int32_t *bk, uint64_t *bc, struct ki_hist *h) {
    uint32_t w = 0;
    for (uint32_t r = 0; r < h->n; r++) {
        int neg = bk[r] < NEG_LIMIT;
        int32_t i = neg ? bk[r] + NEG_OFF : bk[r];
        if (i > 0) i++;
        i /= 2; /* truncates toward zero, like Go */
        int32_t sk = neg ? i - NEG_OFF : i;
        if (w > 0 && bk[w - 1] == sk) {
            bc[w - 1] += bc[r];
        } else {
            bk[w] = sk;
            bc[w] = bc[r];
            w++;
        }
    }
    h->n = w;
    h->schema--;
    h->hint = 0;
}

int ki_histtab_slot(struct ki_histtab *t, const struct ki_histogram_key *key) {
    uint32_t pos;
    int slot = lookup(t, key, &pos);
    if (slot >= 0) return slot;
    if (t->used == t->cfg.max_keys) {
        t->keys_refused++;
        return -ENOSPC;
    }
    slot = (int)t->used++;
    t->hash[pos] = (uint32_t)slot + 1;
    struct ki_hist *nh = rec(t, (uint32_t)slot);
    nh->key = *key;
    nh->schema = t->cfg.schema;
    nh->zero_threshold = t->cfg.zero_threshold;
    return slot;
}

void ki_histtab_refused(struct ki_histtab *t, uint64_t n) { t->obs_refused += n; }

uint64_t ki_histtab_count(const struct ki_histtab *t, uint32_t slot) {
    return slot < t->used ? rec(t, slot)->count : 0;
}

double ki_histtab_quantile_upper(const struct ki_histtab *t, uint32_t slot, double q) {
    if (slot >= t->used || !rec(t, slot)->count) return INFINITY;
    const struct ki_hist *h = rec(t, slot);
    const int32_t *bk = rec_keys(t, h);
    const uint64_t *bc = rec_counts(t, h);
    uint64_t rank = (uint64_t)ceil(q * (double)h->count), seen = h->zero_count;
    uint32_t i = 0;
    for (; i < h->n && bk[i] < NEG_LIMIT; i++) seen += bc[i]; /* negatives sort first */
    if (seen >= rank) return 0;
    for (; i < h->n; i++) {
        seen += bc[i];
        if (seen >= rank) return ki_histogram_upper(bk[i], h->schema);
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

int ki_histtab_observe_slot(struct ki_histtab *t, uint32_t slot, double v) {
    struct ki_hist *h = rec(t, slot);
    if (!isnan(v)) {
        int32_t sk;
        if (v > h->zero_threshold)
            sk = ki_histogram_index(v, h->schema);
        else if (v < -h->zero_threshold)
            sk = ki_histogram_index(v, h->schema) - NEG_OFF;
        else {
            h->zero_count++;
            goto counted;
        }
        int found;
        int32_t *bk = rec_keys(t, h);
        uint64_t *bc = rec_counts(t, h);
        uint32_t p = bucket_pos(bk, h, sk, &found);
        if (found) {
            bc[p]++;
            h->hint = p;
            goto counted;
        }
        if (h->n == h->cap) {
            if (grow(t, h) < 0) {
                t->pool_refused++;
                return -ENOBUFS;
            }
            bk = rec_keys(t, h);
            bc = rec_counts(t, h);
        }
        memmove(bk + p + 1, bk + p, (h->n - p) * sizeof *bk);
        memmove(bc + p + 1, bc + p, (h->n - p) * sizeof *bc);
        bk[p] = sk;
        bc[p] = 1;
        h->n++;
        h->hint = p;
        while (h->n > t->cfg.max_buckets) {
            if (widen_zero(t, bk, bc, h)) continue;
            if (h->schema > KI_HISTOGRAM_SCHEMA_MIN) {
                halve(bk, bc, h);
                continue;
            }
            /* Nothing merged since the insert, so the new bucket still holds only v: take it out. */
            int32_t i = ki_histogram_index(v, h->schema);
            p = bucket_pos(bk, h, v > 0 ? i : i - NEG_OFF, &found);
            if (found && bc[p] == 1) bucket_remove(bk, bc, h, p);
            t->bucket_refused++;
            return -ERANGE;
        }
    }
counted:
    h->count++;
    h->sum += v;
    return 0;
}

size_t ki_histtab_export_room(const struct ki_histtab *t) { return 3 * (size_t)t->room; }

/* client_golang makeBuckets: spans with gaps of up to two buckets filled with zeros, counts as deltas. */
static void make_buckets(const int32_t *bk, const uint64_t *bc, uint32_t from, uint32_t to, int32_t off,
                         struct ki_histogram_span *spans, uint32_t *nspans, int64_t *deltas, uint32_t *ndeltas) {
    uint32_t ns = 0, nd = 0;
    int64_t prev = 0;
    int32_t next = 0;
    for (uint32_t r = from; r < to; r++) {
        int32_t i = bk[r] + off;
        int32_t gap = i - next;
        if (r == from || gap > 2) {
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
        deltas[nd++] = (int64_t)bc[r] - prev;
        prev = (int64_t)bc[r];
        next = i + 1;
    }
    *nspans = ns;
    *ndeltas = nd;
}

int ki_histtab_export(const struct ki_histtab *t, uint32_t slot, struct ki_histogram_export *out) {
    if (slot >= t->used) return -ENOENT;
    const struct ki_hist *h = rec(t, slot);
    const int32_t *bk = rec_keys(t, h);
    const uint64_t *bc = rec_counts(t, h);
    out->schema = h->schema;
    out->zero_threshold = h->zero_threshold;
    out->zero_count = h->zero_count;
    out->count = h->count;
    out->sum = h->sum;
    uint32_t nneg = 0;
    while (nneg < h->n && bk[nneg] < NEG_LIMIT) nneg++;
    make_buckets(bk, bc, 0, nneg, NEG_OFF, out->neg_spans, &out->n_neg_spans, out->neg_deltas, &out->n_neg_deltas);
    make_buckets(bk, bc, nneg, h->n, 0, out->pos_spans, &out->n_pos_spans, out->pos_deltas, &out->n_pos_deltas);
    return 0;
}

void ki_histtab_stats(const struct ki_histtab *t, struct ki_histtab_stats *out) {
    out->keys = t->used;
    out->keys_refused = t->keys_refused;
    out->obs_refused = t->obs_refused;
    out->bucket_refused = t->bucket_refused;
    out->pool_refused = t->pool_refused;
    out->bytes = t->bytes + t->pool_used;
    out->compactions = t->compactions;
}
