/* compress.c - zstd in a workspace reserved once (ki_compress.h). */
#define _POSIX_C_SOURCE 200809L
/* The static-workspace API (ZSTD_initStaticCCtx, ZSTD_estimateCCtxSize_usingCParams) is zstd's
 * "experimental" section: fine here because libzstd is linked statically (agent/src/Makefile), so
 * the version the agent was built against is the one it runs. */
#define ZSTD_STATIC_LINKING_ONLY
#include "ki_compress.h"

#include <errno.h>
#include <stdlib.h>
#include <zstd.h>

struct ki_compress {
    ZSTD_CCtx *cctx; /* lives inside workspace: zstd can neither grow nor shrink it */
    void *workspace;
    size_t workspace_len;
    size_t max_src;
};

/* zstd picks its parameters from each input's size (ZSTD_compress2 knows it); the workspace must
 * fit the largest set any input up to max_src can get. The sizes zstd's parameter tables switch at
 * are powers of two, so every power of two up to max_src and max_src itself cover them all. */
static size_t workspace_for(int level, size_t max_src) {
    size_t most = 0;
    for (size_t n = 1024;; n *= 2) {
        size_t s = n < max_src ? n : max_src;
        size_t need = ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, s, 0));
        if (need > most) most = need;
        if (s == max_src) break;
    }
    return most;
}

struct ki_compress *ki_compress_create(int level, size_t max_src) {
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || max_src == 0) {
        errno = EINVAL;
        return NULL;
    }
    struct ki_compress *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->max_src = max_src;
    c->workspace_len = workspace_for(level, max_src);
    /* Pages zstd never touches (the parts only a large input's tables use) stay out of the
     * resident set until an input that large comes. */
    c->workspace = malloc(c->workspace_len);
    if (c->workspace) c->cctx = ZSTD_initStaticCCtx(c->workspace, c->workspace_len);
    if (!c->cctx || ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 0))) {
        ki_compress_destroy(c);
        errno = ENOMEM;
        return NULL;
    }
    return c;
}

void ki_compress_destroy(struct ki_compress *c) {
    if (!c) return;
    free(c->workspace); /* a static context is freed with its workspace */
    free(c);
}

size_t ki_compress_bound(size_t n) { return ZSTD_compressBound(n); }

size_t ki_compress_footprint(const struct ki_compress *c) { return c->workspace_len; }

int ki_compress_run(struct ki_compress *c, const void *src, size_t n, void *dst, size_t cap, size_t *out) {
    if (n > c->max_src) return -EINVAL;
    size_t r = ZSTD_compress2(c->cctx, dst, cap, src, n);
    if (ZSTD_isError(r)) return -EIO;
    *out = r;
    return 0;
}
