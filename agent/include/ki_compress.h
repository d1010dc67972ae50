/*
 * ki_compress.h - one zstd context, made once, reused for every batch.
 */
#ifndef KI_COMPRESS_H
#define KI_COMPRESS_H

#include <stddef.h>

struct ki_compress;

/* A compressor at the given zstd level; NULL on ENOMEM. */
struct ki_compress *ki_compress_create(int level);

/* Free; accepts NULL. */
void ki_compress_destroy(struct ki_compress *c);

/* Worst-case compressed size of n bytes. */
size_t ki_compress_bound(size_t n);

/* Compress src into one zstd frame with its content size (docs/wire.md). Returns 0 or -EIO. */
int ki_compress_run(struct ki_compress *c, const void *src, size_t n, void *dst, size_t cap, size_t *out);

#endif /* KI_COMPRESS_H */
