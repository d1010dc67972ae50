/* test_compress.c - compress.c: one workspace reserved at creation, nothing allocated after it.
 *
 * The agent compresses quarter-size batches while its collector answers and full-size ones while
 * it catches up after an outage. zstd sizes its context from each input; a context that grew for a
 * catch-up was shrunk by zstd 128 compressions later and regrown at the next catch-up, so the
 * agent's memory moved with every outage (bench/results/soak-20min-seed1-own-warmup.log). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <zstd.h>

#include "ki_compress.h"
#include "ki_test.h"

#if defined(__SANITIZE_ADDRESS__)
size_t __sanitizer_get_current_allocated_bytes(void); /* ASan's own count: its malloc is not glibc's */
static size_t heap_bytes(void) { return __sanitizer_get_current_allocated_bytes(); }
#else
static size_t heap_bytes(void) {
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}
#endif

/* Bytes that compress like a batch body: short runs from a small alphabet, an LCG's choice. */
static void fill(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)((x >> 24) & 0x1f);
    }
}

static void round_trip(struct ki_compress *c, const uint8_t *src, size_t n, uint8_t *dst, size_t cap, uint8_t *back) {
    size_t clen = 0;
    CHECK_EQ(ki_compress_run(c, src, n, dst, cap, &clen), 0);
    CHECK(clen > 0 && clen <= cap);
    CHECK_EQ(ZSTD_getFrameContentSize(dst, clen), n); /* docs/wire.md: every frame says its size */
    CHECK_EQ(ZSTD_decompress(back, n, dst, clen), n);
    CHECK(memcmp(src, back, n) == 0);
}

static size_t at_most(size_t n, size_t max) { return n < max ? n : max; }

static void check_level(int level, size_t max_src) {
    struct ki_compress *c = ki_compress_create(level, max_src);
    CHECK(c != NULL);
    size_t reserved = ki_compress_footprint(c);
    CHECK(reserved > 0);
    size_t cap = ki_compress_bound(max_src);
    uint8_t *src = malloc(max_src), *dst = malloc(cap), *back = malloc(max_src);
    CHECK(src && dst && back);
    fill(src, max_src, 7);
    round_trip(c, src, at_most(900, max_src), dst, cap, back); /* a small batch first, as an agent starts */
    size_t heap = heap_bytes();
    for (int outage = 0; outage < 3; outage++) {
        round_trip(c, src, max_src, dst, cap, back); /* a catch-up's full batch */
        round_trip(c, src, at_most(max_src / 3 + 1, max_src), dst, cap, back);
        for (int i = 0; i < 200; i++) /* past zstd's 128 compressions before it shrinks a context */
            round_trip(c, src, at_most(700 + (size_t)i * 13, max_src), dst, cap, back);
        CHECK_EQ(heap_bytes(), heap);
        CHECK_EQ(ki_compress_footprint(c), reserved);
    }
    size_t out = 0;
    CHECK_EQ(ki_compress_run(c, src, max_src, dst, cap, &out), 0);
    CHECK_EQ(heap_bytes(), heap);
    free(src), free(dst), free(back);
    ki_compress_destroy(c);
}

int main(void) {
    check_level(1, 256 * 1024 + 17); /* the agent's default level, a body cap that is no power of two */
    check_level(3, 256 * 1024);
    check_level(19, 64 * 1024);
    check_level(1, 1); /* the smallest input still gets a working context */

    struct ki_compress *c = ki_compress_create(1, 4096);
    CHECK(c != NULL);
    uint8_t big[8192] = {0}, dst[16384];
    size_t out = 0;
    CHECK_EQ(ki_compress_run(c, big, sizeof big, dst, sizeof dst, &out), -EINVAL); /* over max_src */
    ki_compress_destroy(c);
    errno = 0;
    CHECK(ki_compress_create(ZSTD_maxCLevel() + 1, 4096) == NULL && errno == EINVAL);
    CHECK(ki_compress_create(1, 0) == NULL && errno == EINVAL);
    ki_compress_destroy(NULL);
    printf("ok\n");
    return 0;
}
