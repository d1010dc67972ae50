/* compress.c - zstd (ki_compress.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_compress.h"

#include <errno.h>
#include <stdlib.h>
#include <zstd.h>

struct ki_compress {
    ZSTD_CCtx *cctx; /* reused context: its tables are allocated once */
};

struct ki_compress *ki_compress_create(int level) {
    struct ki_compress *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cctx = ZSTD_createCCtx();
    if (!c->cctx || ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 0))) {
        ki_compress_destroy(c);
        return NULL;
    }
    return c;
}

void ki_compress_destroy(struct ki_compress *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    free(c);
}

size_t ki_compress_bound(size_t n) { return ZSTD_compressBound(n); }

int ki_compress_run(struct ki_compress *c, const void *src, size_t n, void *dst, size_t cap, size_t *out) {
    size_t r = ZSTD_compress2(c->cctx, dst, cap, src, n);
    if (ZSTD_isError(r)) return -EIO;
    *out = r;
    return 0;
}
