/* Unit test: encode + compress + seal a known batch; the Python decoder checks the output file.
 *   test_encode_seal IN OUT       body version 1: every record
 *   test_encode_seal IN OUT v2    body version 2: kernels into a HISTOGRAMS section (no span
 *                                 kept: sample and tail rates 0), the other records as they are
 *   test_encode_seal IN OUT v3    body version 3: as v2, but every kernel span kept (sample rate
 *                                 1000/s), its correlation column as the delta of (correlation - pos)
 *   test_encode_seal IN OUT v4    body version 4: as v2, after an earlier export of 4,096 more
 *                                 kernels of IN's first kernel: that histogram goes as an increment */
#define _POSIX_C_SOURCE 200809L
#include <sodium.h>
#include <string.h>

#include "ki_compress.h"
#include "ki_encode.h"
#include "ki_kstats.h"
#include "ki_names.h"
#include "ki_ring.h"
#include "ki_seal.h"
#include "ki_test.h"

static void update(struct ki_counters *c, const struct ki_batch_info *info, void *arg) {
    (void)arg;
    c->v[KI_CTR_RECORDS_SHIPPED] += info->shipped;
    c->v[KI_CTR_GARBAGE_SKIPPED] += info->garbage;
}

static void mark(void *arg, uint32_t producer, uint32_t id) { ki_names_mark(arg, producer, id, 1); }

int main(int argc, char **argv) {
    CHECK(argc == 3 || (argc == 4 && (!strcmp(argv[3], "v2") || !strcmp(argv[3], "v3") || !strcmp(argv[3], "v4")))); /* input: raw 64-byte records; output: the sealed frame */
    int v2 = argc == 4, version = v2 ? argv[3][1] - '0' : 1;
    CHECK(sodium_init() >= 0);
    static struct ki_record recs[4096];
    FILE *in = fopen(argv[1], "rb");
    CHECK(in != NULL);
    size_t n = fread(recs, sizeof recs[0], 4096, in);
    fclose(in);
    struct ki_names *names = ki_names_create(64, 4096, 1024);
    struct ki_encoder *e = ki_encoder_create(4096, names);
    CHECK(names && e);
    struct ki_kstats *ks = NULL;
    uint8_t *hist = NULL;
    size_t hlen = 0;
    uint64_t hts = 0;
    if (v2) {
        struct ki_kstats_config kc = {
            .hist = {.schema = 3, .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD, .max_buckets = 160,
                     .max_keys = 64},
            .interval_ns = 1000000000ULL,
            .tail_quantile = 0.99,
            .tail_min_count = 100,
            .section_max = 64 << 10,
            .span_sample_rate = version == 3 ? 1000 : 0,
            .snapshot_ns = version == 4 ? 3600000000000ULL : 0,
        };
        ks = ki_kstats_create(&kc);
        CHECK(ks != NULL);
        CHECK_EQ(ki_kstats_increments(ks), version == 4);
        uint64_t last = 0;
        for (size_t i = 0; i < n; i++)
            if (recs[i].rec.type != KI_REC_STRING && recs[i].rec.ts_ns > last) last = recs[i].rec.ts_ns;
        size_t bound = ki_kstats_section_bound(ks);
        hist = malloc(bound);
        CHECK(hist != NULL);
        uint64_t mono = 1;
        if (version == 4) { /* an earlier export: the first kernel's histogram, 4,096 kernels in 12 buckets: a base */
            static struct ki_record more[4096];
            size_t k0 = 0;
            while (k0 < n && recs[k0].rec.type != KI_REC_KERNEL) k0++;
            CHECK(k0 < n);
            for (int j = 0; j < 4096; j++) {
                more[j] = recs[k0];
                more[j].rec.u.kernel.end_ns = more[j].rec.ts_ns + (2000ULL << (j % 12));
            }
            CHECK_EQ(ki_kstats_feed(ks, more, 4096), 0);
            CHECK(ki_kstats_want(ks, mono, last - 1000000));
            CHECK_EQ(ki_kstats_encode(ks, hist, bound, &hlen, &hts, NULL, NULL), 0);
            CHECK(hlen > 0 && !ki_kstats_pending(ks));
            mono += 1000000000ULL;
        }
        n = ki_kstats_feed(ks, recs, n);
        CHECK(ki_kstats_want(ks, mono, last)); /* stamped with the newest record's time */
        CHECK_EQ(ki_kstats_encode(ks, hist, bound, &hlen, &hts, mark, names), 0);
        CHECK(hlen > 0);
        ki_encoder_reserve(e, bound);
    }
#define EXTRA() \
    if (v2) ki_encoder_set_extra(e, (uint8_t)version, 0x04, hist, hlen)
    size_t cap = ki_encoder_bound(e);
    uint8_t *body = malloc(cap);
    size_t fcap = KI_HEADER_BYTES + ki_compress_bound(cap) + KI_TAG_BYTES;
    uint8_t *frame = malloc(fcap);
    struct ki_compress *z = ki_compress_create(3, cap);
    CHECK(z != NULL);
    struct ki_counters ctr;
    memset(&ctr, 0, sizeof ctr);
    ctr.v[KI_CTR_RECORDS_READ] = n;
    struct ki_batch_info info;
    size_t blen, clen, flen;
    EXTRA();
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, update, NULL, body, cap, &blen, &info), 0);
    EXTRA();
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, update, NULL, body, 8, &blen, &info), -ENOBUFS);
    EXTRA();
    CHECK_EQ(ki_encode_body(e, recs, n, names, 1, &ctr, NULL, NULL, body, cap, &blen, &info), 0);
    CHECK_EQ(ki_compress_run(z, body, blen, frame + KI_HEADER_BYTES, fcap - KI_HEADER_BYTES - KI_TAG_BYTES, &clen), 0);
    struct ki_seal s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < 16; i++) s.agent_id[i] = (uint8_t)i;
    for (int i = 0; i < 32; i++) s.key[i] = (uint8_t)(100 + i);
    s.key_id = 3;
    s.epoch = 77;
    s.next_seq = 5;
    uint64_t t_min = info.shipped ? info.t_min : 1, t_max = info.shipped ? info.t_max : 1;
    if (hlen && hts < t_min) t_min = hts; /* the histograms' time lies in the batch's range too */
    if (hlen && hts > t_max) t_max = hts;
    CHECK_EQ(ki_seal_frame(&s, frame, clen, KI_COMPRESSION_ZSTD, t_min, t_max, info.shipped, &flen), 0);
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
    ki_kstats_destroy(ks);
    free(hist);
    ki_compress_destroy(z);
    ki_names_destroy(names);
    return 0;
}
