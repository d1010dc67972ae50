/* Unit test: STRING chunk reassembly (names.c). */
#define _POSIX_C_SOURCE 200809L
#include <string.h>

#include "ki_encode.h"
#include "ki_names.h"
#include "ki_ring.h"
#include "ki_test.h"

static struct ki_record chunk(uint32_t producer, uint32_t id, uint16_t index, const char *text, int last) {
    struct ki_record r;
    memset(&r, 0, sizeof r);
    r.producer = producer;
    r.rec.type = KI_REC_STRING;
    r.rec.id = id;
    r.rec.device = index;
    r.rec.flags = last ? KI_FLAG_STRING_LAST : 0;
    memcpy(r.rec.u.string.text, text, strlen(text) < 32 ? strlen(text) : 32);
    return r;
}

static int is(const struct ki_names *n, uint32_t p, uint32_t id, const char *want) {
    size_t len;
    const char *got = ki_names_get(n, p, id, &len);
    return got && len == strlen(want) && !memcmp(got, want, len);
}

int main(int argc, char **argv) {
    CHECK(argc == 2); /* a scratch file for save/load */
    struct ki_names *n = ki_names_create(16, 4096, 40);
    CHECK(n != NULL);
    /* One chunk, then two interleaved multi-chunk names from two producers. */
    struct ki_record r = chunk(1, 5, 0, "gemm", 1);
    ki_names_add(n, &r, 1);
    CHECK(is(n, 1, 5, "gemm"));
    struct ki_record a0 = chunk(1, 6, 0, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 0);
    struct ki_record b0 = chunk(2, 6, 0, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 0);
    struct ki_record a1 = chunk(1, 6, 1, "A", 1), b1 = chunk(2, 6, 1, "B", 1);
    ki_names_add(n, &a0, 2);
    ki_names_add(n, &b0, 2);
    ki_names_add(n, &a1, 2);
    ki_names_add(n, &b1, 2);
    CHECK(is(n, 1, 6, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaA"));
    CHECK(is(n, 2, 6, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbB"));
    /* A missing chunk: the name is not completed from the wrong pieces; a complete name survives stray chunks. */
    struct ki_record c0 = chunk(3, 1, 0, "cccccccccccccccccccccccccccccccc", 0), c2 = chunk(3, 1, 2, "x", 1);
    ki_names_add(n, &c0, 3);
    ki_names_add(n, &c2, 3);
    CHECK(ki_names_get(n, 3, 1, &(size_t){0}) == NULL);
    struct ki_record stray = chunk(1, 5, 3, "zz", 1);
    ki_names_add(n, &stray, 3);
    CHECK(is(n, 1, 5, "gemm"));
    /* Names longer than name_max (40) are cut and counted. */
    struct ki_record l0 = chunk(4, 1, 0, "0123456789012345678901234567890123", 0), l1 = chunk(4, 1, 1, "abcdefghijklmnopq", 1);
    ki_names_add(n, &l0, 4);
    ki_names_add(n, &l1, 4);
    CHECK(is(n, 4, 1, "01234567890123456789012345678901abcdefgh"));
    CHECK_EQ(ki_names_truncated(n), 1);
    /* Emission: only names marked with the batch's mark. */
    uint8_t out[1024];
    size_t len, count;
    CHECK_EQ(ki_names_emit(n, 2, out, sizeof out, &len, &count), 0);
    CHECK_EQ(count, 2);
    CHECK(ki_names_mark(n, 1, 5, 9) == 1);
    CHECK(ki_names_mark(n, 9, 9, 9) == 0);
    CHECK_EQ(ki_names_emit(n, 9, out, sizeof out, &len, &count), 0);
    CHECK_EQ(count, 1);
    CHECK_EQ(len, 1 + 3 + 4);
    CHECK_EQ(ki_names_emit(n, 9, out, 3, &len, &count), -ENOBUFS);
    /* Filling the table resets it (counted), and the new name is kept. */
    for (uint32_t i = 0; i < 20; i++) {
        struct ki_record f = chunk(7, 100 + i, 0, "f", 1);
        ki_names_add(n, &f, 5);
    }
    CHECK(ki_names_resets(n) >= 1);
    CHECK(is(n, 7, 119, "f"));
    /* Save and load: the same ring gets its names back, another ring does not. */
    CHECK_EQ(ki_names_save(n, argv[1], 1234), 0);
    struct ki_names *m = ki_names_create(16, 4096, 40);
    CHECK(ki_names_load(m, argv[1], 1234) >= 1);
    CHECK(is(m, 7, 119, "f"));
    ki_names_destroy(m);
    m = ki_names_create(16, 4096, 40);
    CHECK_EQ(ki_names_load(m, argv[1], 999), 0);
    CHECK(ki_names_get(m, 7, 119, &(size_t){0}) == NULL);
    ki_names_destroy(m);
    ki_names_destroy(n);
    ki_names_destroy(NULL);

    /* Names once: a text goes into one batch, later batches leave it out and say so in the digest. */
    n = ki_names_create(16, 4096, 256);
    CHECK(n != NULL);
    struct ki_record g = chunk(1, 5, 0, "gemm", 1), h = chunk(2, 7, 0, "flash_fwd", 1);
    ki_names_add(n, &g, 1);
    ki_names_add(n, &h, 1);
    const uint64_t hg = ki_names_hash(1, 5, "gemm", 4), hh = ki_names_hash(2, 7, "flash_fwd", 9);
    CHECK(hg != hh && hg == ki_names_hash(1, 5, "gemm", 4) && hg != ki_names_hash(1, 6, "gemm", 4));
    struct ki_names_once once;
    CHECK_EQ(ki_names_emit_once(n, 1, out, sizeof out, &len, &count, &once), 0);
    CHECK_EQ(count, 2);
    CHECK_EQ(once.omitted, 0);
    CHECK(once.digest == (hg ^ hh));
    CHECK(ki_names_mark(n, 1, 5, 2) && ki_names_mark(n, 2, 7, 2));
    CHECK_EQ(ki_names_emit_once(n, 2, out, sizeof out, &len, &count, &once), 0);
    CHECK_EQ(count, 0); /* both sent before: left out, and counted in the digest */
    CHECK_EQ(once.omitted, 2);
    CHECK(once.digest == (hg ^ hh));
    CHECK_EQ(len, 1);
    /* ki_names_emit (names once off) always carries every text and marks nothing as sent. */
    CHECK_EQ(ki_names_emit(n, 2, out, sizeof out, &len, &count), 0);
    CHECK_EQ(count, 2);
    /* A registration again (new text) goes out even though the old text went. */
    struct ki_record g2 = chunk(1, 5, 0, "gemm_v2", 1);
    ki_names_add(n, &g2, 3);
    CHECK(ki_names_mark(n, 2, 7, 3));
    CHECK_EQ(ki_names_emit_once(n, 3, out, sizeof out, &len, &count, &once), 0);
    CHECK_EQ(count, 1);
    CHECK_EQ(once.omitted, 1);
    CHECK(once.digest == (ki_names_hash(1, 5, "gemm_v2", 7) ^ hh));
    /* Forgotten (a failed request): every text goes again, once. */
    ki_names_forget(n);
    CHECK(ki_names_mark(n, 1, 5, 4) && ki_names_mark(n, 2, 7, 4));
    CHECK_EQ(ki_names_emit_once(n, 4, out, sizeof out, &len, &count, &once), 0);
    CHECK_EQ(count, 2);
    CHECK_EQ(once.omitted, 0);
    /* 300 forgets wrap the 8-bit generation: no old mark may match by accident. */
    for (int i = 0; i < 300; i++) ki_names_forget(n);
    CHECK(ki_names_mark(n, 1, 5, 5));
    CHECK_EQ(ki_names_emit_once(n, 5, out, sizeof out, &len, &count, &once), 0);
    CHECK_EQ(count, 1);
    /* The names batch: every complete name, whatever its marks. */
    CHECK_EQ(ki_names_emit_all(n, out, sizeof out, &len, &count), 0);
    CHECK_EQ(count, 2);
    ki_names_destroy(n);
    /* The encoder: version 4 becomes 5; a text goes once; a batch using a name the table does not
     * hold leaves nothing out (the collector may hold that name and count it in the digest). */
    n = ki_names_create(16, 4096, 256);
    ki_names_add(n, &g, 1);
    struct ki_encoder *e = ki_encoder_create(4, n);
    CHECK(n && e);
    static uint8_t body[1 << 16];
    struct ki_batch_info bi;
    struct ki_counters ctr;
    memset(&ctr, 0, sizeof ctr);
    struct ki_record k[2];
    memset(k, 0, sizeof k);
    k[0].producer = k[1].producer = 1;
    k[0].rec.type = k[1].rec.type = KI_REC_KERNEL;
    k[0].rec.id = 5;
    k[1].rec.id = 6; /* never registered */
    k[0].rec.ts_ns = k[1].rec.ts_ns = 10;
    for (uint32_t batch = 2; batch <= 4; batch++) {
        ki_encoder_set_extra(e, 4, 0, NULL, 0);
        ki_encoder_set_names_once(e, 1);
        size_t nrec = batch == 4 ? 2 : 1;
        CHECK_EQ(ki_encode_body(e, k, nrec, n, batch, &ctr, NULL, NULL, body, sizeof body, &len, &bi), 0);
        CHECK_EQ(body[0], 5);
        CHECK_EQ(bi.names + bi.omitted, 1);
        CHECK_EQ(bi.omitted, batch == 3); /* sent with batch 2, left out of 3; 4 uses an unknown name */
    }
    ki_encoder_set_extra(e, 3, 0, NULL, 0); /* version 3 (no increments): names once does not apply */
    ki_encoder_set_names_once(e, 1);
    CHECK_EQ(ki_encode_body(e, k, 1, n, 5, &ctr, NULL, NULL, body, sizeof body, &len, &bi), 0);
    CHECK(body[0] == 3 && bi.omitted == 0 && bi.names == 1);
    ki_encoder_destroy(e);
    ki_names_destroy(n);
    /* The hash the Python decoder must compute too (tests/agent/test_agent_units.py). */
    printf("ok hash(1,5,gemm)=%016llx\n", (unsigned long long)hg);
    return 0;
}
