/* Unit test: encode + compress + seal a known batch; the Python decoder checks the output file. */
#define _POSIX_C_SOURCE 200809L
#include <sodium.h>
#include <string.h>

#include "ki_compress.h"
#include "ki_encode.h"
#include "ki_names.h"
#include "ki_ring.h"
#include "ki_seal.h"
#include "ki_test.h"

static void update(struct ki_counters *c, const struct ki_batch_info *info, void *arg) {
    (void)arg;
    c->v[KI_CTR_RECORDS_SHIPPED] += info->shipped;
    c->v[KI_CTR_GARBAGE_SKIPPED] += info->garbage;
}

int main(int argc, char **argv) {
    CHECK(argc == 3); /* input: raw 64-byte records; output: the sealed frame */
    CHECK(sodium_init() >= 0);
    static struct ki_record recs[4096];
    FILE *in = fopen(argv[1], "rb");
    CHECK(in != NULL);
    size_t n = fread(recs, sizeof recs[0], 4096, in);
    fclose(in);
    struct ki_names *names = ki_names_create(64, 4096, 1024);
    struct ki_encoder *e = ki_encoder_create(4096, names);
    struct ki_compress *z = ki_compress_create(3);
    CHECK(names && e && z);
    size_t cap = ki_encoder_bound(e);
    uint8_t *body = malloc(cap);
    size_t fcap = KI_HEADER_BYTES + ki_compress_bound(cap) + KI_TAG_BYTES;
    uint8_t *frame = malloc(fcap);
    struct ki_counters ctr;
    memset(&ctr, 0, sizeof ctr);
    ctr.v[KI_CTR_RECORDS_READ] = n;
    struct ki_batch_info info;
    size_t blen, clen, flen;
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, update, NULL, body, cap, &blen, &info), 0);
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, update, NULL, body, 8, &blen, &info), -ENOBUFS);
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, NULL, NULL, body, cap, &blen, &info), 0);
    CHECK_EQ(ki_compress_run(z, body, blen, frame + KI_HEADER_BYTES, fcap - KI_HEADER_BYTES - KI_TAG_BYTES, &clen), 0);
    struct ki_seal s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < 16; i++) s.agent_id[i] = (uint8_t)i;
    for (int i = 0; i < 32; i++) s.key[i] = (uint8_t)(100 + i);
    s.key_id = 3;
    s.epoch = 77;
    s.next_seq = 5;
    CHECK_EQ(ki_seal_frame(&s, frame, clen, KI_COMPRESSION_ZSTD, info.shipped ? info.t_min : 1,
                           info.shipped ? info.t_max : 1, info.shipped, &flen), 0);
    CHECK_EQ(s.next_seq, 6);
    /* Re-sealing under a new key opens with the old one and takes the next sequence number. */
    uint8_t old_key[32];
    memcpy(old_key, s.key, 32);
    uint8_t wrong[32] = {0};
    uint8_t *copy = malloc(flen);
    memcpy(copy, frame, flen);
    CHECK_EQ(ki_seal_reseal(&s, wrong, copy, flen, &flen), -EBADMSG);
    CHECK(!memcmp(copy, frame, flen));
    s.key[0] ^= 1;
    CHECK_EQ(ki_seal_reseal(&s, old_key, copy, flen, &flen), 0);
    CHECK_EQ(s.next_seq, 7);
    s.key[0] ^= 1;
    FILE *out = fopen(argv[2], "wb");
    CHECK(out != NULL);
    CHECK_EQ(fwrite(frame, 1, flen, out), flen);
    fclose(out);
    printf("ok shipped=%u garbage=%u strings=%u names=%u\n", info.shipped, info.garbage, info.strings, info.names);
    free(copy);
    free(body);
    free(frame);
    ki_encoder_destroy(e);
    ki_compress_destroy(z);
    ki_names_destroy(names);
    return 0;
}
