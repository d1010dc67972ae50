/*
 * ki_varint.h - LEB128 varints and zigzag, as docs/wire.md defines them (canonical, at most 10 bytes).
 */
#ifndef KI_VARINT_H
#define KI_VARINT_H

#include <stddef.h>
#include <stdint.h>

#define KI_VARINT_MAX 10u

/* Write v at p (which has room for KI_VARINT_MAX bytes); returns the bytes written. */
static inline size_t ki_varint_put(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static inline uint64_t ki_zigzag(uint64_t v) { return (v << 1) ^ (uint64_t)((int64_t)v >> 63); }

static inline uint64_t ki_unzigzag(uint64_t z) { return (z >> 1) ^ (uint64_t)(-(int64_t)(z & 1)); }

/* Read a canonical varint from [*p, end); returns 0 and advances *p, or -EINVAL (-22). */
static inline int ki_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    const uint8_t *q = *p;
    for (unsigned k = 0; k < KI_VARINT_MAX; k++) {
        if (q >= end) return -22;
        uint8_t b = *q++;
        if (k == 9 && b > 1) return -22;
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (!(b & 0x80)) {
            if (k && b == 0) return -22;
            *p = q;
            *out = v;
            return 0;
        }
    }
    return -22;
}

#endif /* KI_VARINT_H */
