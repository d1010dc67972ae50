/* encode.c - columnar batch bodies (ki_encode.h, docs/wire.md). */
#define _POSIX_C_SOURCE 200809L
#include "ki_encode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ki_names.h"
#include "ki_ring.h"
#include "ki_varint.h"
#include "ki_wire.h"

#define SHIPPED_TYPES KI_WIRE_SHIPPED_TYPES
#define MAX_COLS (KI_WIRE_COMMON_COLS + KI_WIRE_MAX_PAYLOAD_COLS)
#define MAX_RECORD_BYTES 80 /* worst case of all columns of one record, see docs/wire.md */

/* The wire's column tables (ki_wire.h, generated from collector/wire.py): the common columns,
 * then the payload columns by type. */
static const struct ki_wire_col COMMON[KI_WIRE_COMMON_COLS] = KI_WIRE_COMMON_COLUMNS;
static const struct ki_wire_col PAYLOAD[SHIPPED_TYPES + 1][KI_WIRE_MAX_PAYLOAD_COLS] = KI_WIRE_PAYLOAD_COLUMNS;
static const uint8_t NPAYLOAD[SHIPPED_TYPES + 1] = KI_WIRE_PAYLOAD_NCOLS;
/* Body version 3 (and later): KERNEL correlation as the delta of (correlation - pos). A probe
 * numbers its kernels as the ring numbers its records, so the difference hardly moves and the
 * column costs next to nothing where a plain delta costs as much as the pos column. */
static const struct ki_wire_col KERNEL_CORRELATION_V3 = KI_WIRE_KERNEL_PDELTA_COLUMN;

struct ki_encoder {
    size_t max_records;   /* batch size */
    uint32_t *order;      /* record indexes grouped by type */
    uint8_t *section;     /* one RECORDS or STRINGS section being built */
    size_t section_cap;   /* its bytes */
    uint8_t *column;      /* one column being built */
    size_t column_cap;    /* its bytes */
    size_t bound;         /* worst-case body size */
    uint8_t version;      /* body version of the next batch */
    uint8_t extra_tag;    /* extra section of the next batch (0: none) */
    uint8_t names_once;   /* the next batch may leave out names already sent (version 4 -> 5) */
    uint32_t unnamed;     /* names the next batch uses that the table does not hold (complete) */
    const uint8_t *extra; /* its bytes */
    size_t extra_len;
};

struct ki_encoder *ki_encoder_create(size_t max_records, const struct ki_names *names) {
    struct ki_encoder *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    size_t strings = ki_names_emit_bound(names);
    size_t records = KI_VARINT_MAX + max_records * MAX_RECORD_BYTES + MAX_COLS * (KI_VARINT_MAX + 1);
    e->max_records = max_records;
    e->section_cap = records > strings ? records : strings;
    e->column_cap = max_records * 8 + KI_VARINT_MAX * max_records;
    e->bound = 1 + SHIPPED_TYPES * (1 + KI_VARINT_MAX + records) + (1 + KI_VARINT_MAX + strings) + (2 + 8) +
               (1 + KI_VARINT_MAX + KI_VARINT_MAX + (KI_CTR_MAX + 1) * 2 * KI_VARINT_MAX);
    e->order = malloc(max_records * sizeof *e->order);
    e->section = malloc(e->section_cap);
    e->column = malloc(e->column_cap);
    if (!e->order || !e->section || !e->column) {
        ki_encoder_destroy(e);
        return NULL;
    }
    return e;
}

void ki_encoder_destroy(struct ki_encoder *e) {
    if (!e) return;
    free(e->order);
    free(e->section);
    free(e->column);
    free(e);
}

size_t ki_encoder_bound(const struct ki_encoder *e) { return e->bound; }

void ki_encoder_reserve(struct ki_encoder *e, size_t bytes) { e->bound += 1 + KI_VARINT_MAX + bytes; }

void ki_encoder_set_extra(struct ki_encoder *e, uint8_t body_version, uint8_t tag, const uint8_t *section, size_t len) {
    e->version = body_version;
    e->extra_tag = tag;
    e->extra = section;
    e->extra_len = len;
}

static int put_section(uint8_t *out, size_t cap, size_t *off, uint8_t tag, const uint8_t *data, size_t len);

void ki_encoder_set_names_once(struct ki_encoder *e, int on) { e->names_once = on != 0; }

void ki_encoder_unnamed(struct ki_encoder *e) { e->unnamed++; }

/* Mark a name the batch uses; one the table does not hold is counted (see ki_encoder_unnamed). */
static void use_name(struct ki_encoder *e, struct ki_names *names, uint32_t producer, uint32_t id, uint32_t mark) {
    if (!ki_names_mark(names, producer, id, mark)) e->unnamed++;
}

int ki_encode_names_body(struct ki_encoder *e, const struct ki_names *names, uint8_t *out, size_t cap, size_t *len,
                         size_t *count) {
    size_t slen, off = 0;
    int rc = ki_names_emit_all(names, e->section, e->section_cap, &slen, count);
    if (rc < 0) return rc;
    if (cap < 1) return -ENOBUFS;
    out[off++] = KI_BODY_VERSION_NAMES_ONCE;
    if (*count && (rc = put_section(out, cap, &off, KI_SECTION_STRINGS, e->section, slen)) < 0) return rc;
    *len = off;
    return 0;
}

static inline uint64_t load(const struct ki_record *r, const struct ki_wire_col *c) {
    uint64_t v = 0;
    memcpy(&v, (const uint8_t *)r + c->off, c->width); /* little-endian hosts only (x86-64, ARM64) */
    return v;
}

/* Encode one column of the records idx[0..n) into e->column; returns its length. */
static size_t encode_column(struct ki_encoder *e, const struct ki_record *recs, const uint32_t *idx, size_t n,
                            const struct ki_wire_col *c) {
    uint8_t *p = e->column;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ki_record *r = &recs[idx[i]];
        uint64_t v = load(r, c);
        switch (c->enc) {
        case KI_ENC_U8:
            *p++ = (uint8_t)v;
            break;
        case KI_ENC_F64:
            memcpy(p, &v, 8);
            p += 8;
            break;
        case KI_ENC_DELTA:
            p += ki_varint_put(p, ki_zigzag(v - prev));
            prev = v;
            break;
        case KI_ENC_REL:
            p += ki_varint_put(p, ki_zigzag(v - r->rec.ts_ns));
            break;
        case KI_ENC_PDELTA:
            v -= r->pos;
            p += ki_varint_put(p, ki_zigzag(v - prev));
            prev = v;
            break;
        case KI_ENC_SV:
            if (c->width == 4) v = (uint64_t)(int64_t)(int32_t)(uint32_t)v;
            p += ki_varint_put(p, ki_zigzag(v));
            break;
        default:
            p += ki_varint_put(p, v);
            break;
        }
    }
    return (size_t)(p - e->column);
}

static int put_section(uint8_t *out, size_t cap, size_t *off, uint8_t tag, const uint8_t *data, size_t len) {
    if (*off + 1 + KI_VARINT_MAX + len > cap) return -ENOBUFS;
    out[(*off)++] = tag;
    *off += ki_varint_put(out + *off, len);
    memcpy(out + *off, data, len);
    *off += len;
    return 0;
}

int ki_encode_body(struct ki_encoder *e, const struct ki_record *recs, size_t n, struct ki_names *names, uint32_t mark,
                   struct ki_counters *counters, void (*update)(struct ki_counters *, const struct ki_batch_info *, void *),
                   void *update_arg, uint8_t *out, size_t cap, size_t *len, struct ki_batch_info *info) {
    memset(info, 0, sizeof *info);
    if (n > e->max_records) return -E2BIG;
    info->t_min = UINT64_MAX;
    size_t count[SHIPPED_TYPES + 1] = {0};
    /* Pass 1: names first (a record may use a name registered later in the same batch), count types. */
    for (size_t i = 0; i < n; i++) {
        uint8_t t = recs[i].rec.type;
        if (t == KI_REC_STRING) {
            ki_names_add(names, &recs[i], mark);
            info->strings++;
        } else if (t >= 1 && t <= SHIPPED_TYPES) {
            count[t]++;
        } else {
            info->garbage++;
        }
    }
    /* Pass 2: group indexes by type (counting sort keeps ring order), mark used names, time range. */
    size_t start[SHIPPED_TYPES + 2] = {0};
    for (int t = 1; t <= SHIPPED_TYPES; t++) start[t + 1] = start[t] + count[t];
    size_t fill[SHIPPED_TYPES + 2];
    memcpy(fill, start, sizeof fill);
    for (size_t i = 0; i < n; i++) {
        const struct ki_rec *r = &recs[i].rec;
        if (r->type < 1 || r->type > SHIPPED_TYPES) continue;
        e->order[fill[r->type]++] = (uint32_t)i;
        if (r->ts_ns < info->t_min) info->t_min = r->ts_ns;
        if (r->ts_ns > info->t_max) info->t_max = r->ts_ns;
        switch (r->type) {
        case KI_REC_KERNEL:
        case KI_REC_LAUNCH:
            use_name(e, names, recs[i].producer, r->id, mark);
            break;
        case KI_REC_ERROR:
            use_name(e, names, recs[i].producer, r->u.error.detail_id, mark);
            break;
        case KI_REC_FINGERPRINT:
            if (r->flags & KI_FLAG_FP_STRING) use_name(e, names, recs[i].producer, (uint32_t)r->u.fingerprint.value, mark);
            break;
        default:
            break;
        }
        info->shipped++;
    }
    if (!info->shipped) info->t_min = info->t_max = 0;
    size_t off = 0;
    if (cap < 1) return -ENOBUFS;
    /* A name the batch uses but the table lost (it filled up and was cleared, or its chunks went
     * missing) may still be known to the collector, which would then count it in the digest where
     * this agent cannot: such a batch carries every text it uses instead (version 5, no NAMES_USED). */
    const int v5 = e->names_once && e->version == KI_BODY_VERSION_NAMES_ONCE - 1;
    const int once = v5 && !e->unnamed;
    const uint8_t version = v5 ? KI_BODY_VERSION_NAMES_ONCE : e->version ? e->version : KI_BODY_VERSION;
    e->names_once = 0;
    e->unnamed = 0;
    out[off++] = version;
    int rc;
    if (e->extra_tag && e->extra_len &&
        (rc = put_section(out, cap, &off, e->extra_tag, e->extra, e->extra_len)) < 0)
        return rc;
    e->version = e->extra_tag = 0;
    e->extra_len = 0;
    for (int t = 1; t <= SHIPPED_TYPES; t++) {
        if (!count[t]) continue;
        const uint32_t *idx = e->order + start[t];
        size_t s = ki_varint_put(e->section, count[t]);
        for (int c = 0; c < KI_WIRE_COMMON_COLS + NPAYLOAD[t]; c++) {
            const struct ki_wire_col *col = c < KI_WIRE_COMMON_COLS ? &COMMON[c] : &PAYLOAD[t][c - KI_WIRE_COMMON_COLS];
            if (t == KI_REC_KERNEL && c == KI_WIRE_COMMON_COLS + KI_WIRE_KERNEL_PDELTA_COL && version >= KI_BODY_VERSION_PDELTA) col = &KERNEL_CORRELATION_V3;
            size_t clen = encode_column(e, recs, idx, count[t], col);
            s += ki_varint_put(e->section + s, clen);
            memcpy(e->section + s, e->column, clen);
            s += clen;
        }
        if ((rc = put_section(out, cap, &off, (uint8_t)(KI_SECTION_RECORDS + t), e->section, s)) < 0) return rc;
    }
    size_t slen, k;
    struct ki_names_once left = {0};
    rc = once ? ki_names_emit_once(names, mark, e->section, e->section_cap, &slen, &k, &left)
              : ki_names_emit(names, mark, e->section, e->section_cap, &slen, &k);
    if (rc < 0) return rc;
    info->names = (uint32_t)k;
    info->omitted = (uint32_t)left.omitted;
    if (k && (rc = put_section(out, cap, &off, KI_SECTION_STRINGS, e->section, slen)) < 0) return rc;
    if (left.omitted) { /* the collector checks its copies of the texts left out against this */
        uint8_t digest[8];
        memcpy(digest, &left.digest, 8);
        if ((rc = put_section(out, cap, &off, KI_SECTION_NAMES_USED, digest, 8)) < 0) return rc;
    }
    if (update) update(counters, info, update_arg);
    size_t c = 0, nc = 0;
    for (int id = 1; id <= KI_CTR_MAX; id++) nc += id <= KI_CTR_ALWAYS_SENT_LAST || counters->v[id];
    c += ki_varint_put(e->section + c, nc);
    for (int id = 1; id <= KI_CTR_MAX; id++) {
        if (id > KI_CTR_ALWAYS_SENT_LAST && !counters->v[id]) continue;
        c += ki_varint_put(e->section + c, (uint64_t)id);
        c += ki_varint_put(e->section + c, counters->v[id]);
    }
    if ((rc = put_section(out, cap, &off, KI_SECTION_COUNTERS, e->section, c)) < 0) return rc;
    *len = off;
    return 0;
}
