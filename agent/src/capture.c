/* capture.c - capture windows: offers, running windows, CAPTURES reports (ki_capture.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_capture.h"

#include <errno.h>
#include <string.h>

#include "ki_ring.h"
#include "ki_varint.h"

/* A decimal of 1..5 digits in [p, end) up to a ';' or the end; its value in *out, the next byte in *next. */
static int parse_small(const char *p, const char *end, uint32_t *out, const char **next) {
    uint32_t v = 0;
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9' && q - p < 6) v = v * 10 + (uint32_t)(*q++ - '0');
    if (q == p || q - p > 5 || (q < end && *q != ';')) return -EPROTO;
    *out = v;
    *next = q;
    return 0;
}

int ki_capture_parse(const char *v, size_t len, struct ki_capture_offer *out) {
    const char *p = v, *end = v + len;
    if (len < 16 + 5 + 1 + 9 + 1) return -EPROTO;
    uint64_t id = 0;
    for (int i = 0; i < 16; i++) {
        char ch = p[i];
        unsigned d;
        if (ch >= '0' && ch <= '9') d = (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') d = (unsigned)(ch - 'a' + 10);
        else return -EPROTO;
        id = id << 4 | d;
    }
    p += 16;
    if ((size_t)(end - p) < 5 || memcmp(p, ";gpu=", 5)) return -EPROTO;
    uint32_t gpu, seconds;
    if (parse_small(p + 5, end, &gpu, &p) < 0 || gpu > 65535) return -EPROTO;
    if ((size_t)(end - p) < 9 || memcmp(p, ";seconds=", 9)) return -EPROTO;
    if (parse_small(p + 9, end, &seconds, &p) < 0 || p != end) return -EPROTO;
    if (seconds < 1 || seconds > KI_CAPTURE_MAX_SECONDS || id == 0) return -EPROTO;
    out->id = id;
    out->gpu = gpu;
    out->seconds = seconds;
    return 0;
}

int ki_captures_start(struct ki_captures *c, const struct ki_capture_offer *o, uint64_t now_ns) {
    for (unsigned i = 0; i < KI_CAPTURE_RECENT; i++)
        if (c->recent[i] == o->id) return 0;
    struct ki_capture *slot = NULL;
    for (int i = 0; i < KI_CAPTURE_MAX; i++) {
        if (c->w[i].id == o->id) return 0;
        if (!c->w[i].id && !slot) slot = &c->w[i];
    }
    if (!slot) return -ENOSPC;
    *slot = (struct ki_capture){o->id, now_ns, now_ns + (uint64_t)o->seconds * 1000000000ULL, 0, o->gpu};
    return 1;
}

int ki_captures_covers(const struct ki_captures *c, uint32_t gpu, uint64_t ts_ns) {
    for (int i = 0; i < KI_CAPTURE_MAX; i++) {
        const struct ki_capture *w = &c->w[i];
        if (w->id && w->gpu == gpu && ts_ns >= w->start_ns && ts_ns < w->end_ns) return 1;
    }
    return 0;
}

uint64_t ki_captures_until(const struct ki_captures *c, uint32_t gpu) {
    uint64_t until = 0;
    for (int i = 0; i < KI_CAPTURE_MAX; i++)
        if (c->w[i].id && c->w[i].gpu == gpu && c->w[i].end_ns > until) until = c->w[i].end_ns;
    return until;
}

int ki_captures_running(const struct ki_captures *c) {
    int n = 0;
    for (int i = 0; i < KI_CAPTURE_MAX; i++) n += c->w[i].id != 0;
    return n;
}

int ki_captures_due(const struct ki_captures *c, uint64_t now_ns) {
    for (int i = 0; i < KI_CAPTURE_MAX; i++)
        if (c->w[i].id && now_ns >= c->w[i].end_ns + KI_CAPTURE_SETTLE_NS) return 1;
    return 0;
}

void ki_captures_count(struct ki_captures *c, const struct ki_record *recs, size_t n) {
    if (!ki_captures_running(c)) return;
    for (size_t r = 0; r < n; r++) {
        const struct ki_rec *rec = &recs[r].rec;
        if (rec->type != KI_REC_KERNEL) continue;
        for (int i = 0; i < KI_CAPTURE_MAX; i++) {
            struct ki_capture *w = &c->w[i];
            if (w->id && w->gpu == rec->device && rec->ts_ns >= w->start_ns && rec->ts_ns < w->end_ns) w->spans++;
        }
    }
}

size_t ki_captures_section(struct ki_captures *c, uint64_t now_ns, uint8_t *out, size_t cap) {
    uint8_t body[KI_CAPTURE_SECTION_MAX];
    size_t len = 0;
    unsigned k = 0;
    for (int i = 0; i < KI_CAPTURE_MAX; i++) k += c->w[i].id != 0;
    if (!k || cap < KI_CAPTURE_SECTION_MAX) return 0;
    len += ki_varint_put(body + len, k);
    for (int i = 0; i < KI_CAPTURE_MAX; i++) {
        struct ki_capture *w = &c->w[i];
        if (!w->id) continue;
        int final = now_ns >= w->end_ns + KI_CAPTURE_SETTLE_NS;
        for (int b = 0; b < 8; b++) body[len++] = (uint8_t)(w->id >> (8 * b));
        len += ki_varint_put(body + len, w->gpu);
        len += ki_varint_put(body + len, w->start_ns);
        len += ki_varint_put(body + len, w->end_ns);
        len += ki_varint_put(body + len, w->spans);
        body[len++] = (uint8_t)final;
        if (final) {
            c->recent[c->nrecent++ % KI_CAPTURE_RECENT] = w->id;
            memset(w, 0, sizeof *w);
        }
    }
    size_t off = 0;
    out[off++] = KI_SECTION_CAPTURES;
    off += ki_varint_put(out + off, len);
    memcpy(out + off, body, len);
    return off + len;
}
