/*
 * ki_compress.h - one zstd context, made once for the largest input, reused for every batch.
 */
#ifndef KI_COMPRESS_H
#define KI_COMPRESS_H

#include <stddef.h>

struct ki_compress;

/* A compressor at the given zstd level for inputs of at most max_src bytes; NULL on ENOMEM or
 * EINVAL (a level zstd refuses). Its working memory is reserved here, once, for the largest input
 * (docs/agent.md "Memory"): compressing never allocates, so a catch-up's full-size batches
 * neither grow the agent's memory nor leave zstd to shrink and regrow its context afterwards. */
struct ki_compress *ki_compress_create(int level, size_t max_src);

/* Free; accepts NULL. */
void ki_compress_destroy(struct ki_compress *c);

/* Worst-case compressed size of n bytes. */
size_t ki_compress_bound(size_t n);

/* Bytes of working memory reserved at creation (the same for the compressor's whole life). */
size_t ki_compress_footprint(const struct ki_compress *c);

/* Compress src (n <= max_src) into one zstd frame with its content size (docs/wire.md). Returns 0,
 * -EINVAL when n is over max_src, or -EIO. */
int ki_compress_run(struct ki_compress *c, const void *src, size_t n, void *dst, size_t cap, size_t *out);

#endif /* KI_COMPRESS_H */
