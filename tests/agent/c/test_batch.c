/* Unit test: the batch builder (batch.c) on a real ring and spool, no collector: records drained
 * are sealed into batches of at most batch_records, spooled, and their slots freed; a heartbeat
 * when nothing came; batch times strictly increase; the names batch; histograms fold kernels. */
#include "agent_fixture.h"

#include <errno.h>

#include "ki_batch.h"
#include "ki_seal.h"

/* The record counts of the spooled batches, oldest first. */
static int spooled_counts(const struct fixture *f, uint32_t *counts, int max) {
    static uint8_t buf[1 << 20];
    struct ki_spool_id id;
    size_t len;
    int n = 0;
    int rc = ki_spool_peek(f->agent->spool, buf, sizeof buf, &len, &id);
    while (rc == 0 && n < max) {
        uint32_t epoch, count;
        uint64_t seq;
        CHECK_EQ(ki_seal_peek_header(buf, len, &epoch, &seq, &count), 0);
        CHECK_EQ(epoch, id.epoch);
        CHECK_EQ(seq, id.seq);
        counts[n++] = count;
        rc = ki_spool_peek_after(f->agent->spool, id, buf, sizeof buf, &len, &id);
    }
    CHECK_EQ(rc, -ENOENT);
    return n;
}

static uint64_t backlog(const struct fixture *f) {
    struct ki_drain_stats ds;
    ki_drain_stats(f->agent->drain, &ds);
    return ds.backlog;
}

static void records_become_batches(const char *dir) {
    struct fixture f;
    const char *extra[] = {"--no-histograms", "--batch-records", "64", NULL};
    fixture_start(&f, dir, "http://127.0.0.1:9", extra);
    struct ki_agent *a = f.agent;
    CHECK_EQ(a->batch.batch_max, 64); /* histograms off: batch_records whole */
    /* Nothing yet, and a batch was sealed a moment ago (at start): no batch. */
    CHECK_EQ(ki_batch_drain(a), 0);
    CHECK_EQ(fixture_spooled(&f), 0);
    /* 150 records: two full batches at once; with those two waiting in the spool (a backlog), the
     * rest gathers records while the ring is less than half full ... */
    fixture_produce(&f, 150);
    CHECK_EQ(ki_batch_drain(a), 0);
    uint32_t counts[16];
    CHECK_EQ(spooled_counts(&f, counts, 16), 2);
    CHECK_EQ(counts[0], 64);
    CHECK_EQ(counts[1], 64);
    CHECK_EQ(a->batch.staged, 22);
    CHECK_EQ(backlog(&f), 22); /* read, not freed: they are in no spooled batch yet */
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], 150);
    /* ... and is sealed once it waited a second. */
    a->batch.staged_since_ns -= KI_BATCH_BACKLOG_SEAL_NS;
    CHECK_EQ(ki_batch_drain(a), 0);
    CHECK_EQ(spooled_counts(&f, counts, 16), 3);
    CHECK_EQ(counts[2], 22);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_SHIPPED], 150);
    CHECK_EQ(a->ctr.v[KI_CTR_BATCHES_SEALED], 3);
    CHECK_EQ(a->batch.staged, 0);
    CHECK_EQ(a->batch.pending, 0);
    CHECK_EQ(backlog(&f), 0); /* spooled: the slots are free */
    /* No records, heartbeat_s since the last batch: a batch of none, carrying the counters. */
    uint64_t t_max = a->batch.last_t_max_ns;
    a->batch.last_seal_ns -= (uint64_t)f.cfg.heartbeat_s * KI_NS_PER_S;
    CHECK_EQ(ki_batch_drain(a), 0);
    CHECK_EQ(spooled_counts(&f, counts, 16), 4);
    CHECK_EQ(counts[3], 0);
    CHECK(a->batch.last_t_max_ns >= t_max + KI_NS_PER_MS); /* one sample per counter per ms */
    /* The names batch: sealed into the caller's buffer, not spooled, its time after the last batch's. */
    static uint8_t buf[1 << 16];
    size_t len = 0;
    t_max = a->batch.last_t_max_ns;
    CHECK_EQ(ki_batch_seal_names(a, buf, sizeof buf, &len), 0);
    CHECK(len > KI_HEADER_BYTES + KI_TAG_BYTES);
    uint32_t epoch, count;
    uint64_t seq;
    CHECK_EQ(ki_seal_peek_header(buf, len, &epoch, &seq, &count), 0);
    CHECK_EQ(count, 0);
    CHECK(a->batch.last_t_max_ns >= t_max + KI_NS_PER_MS);
    CHECK_EQ(fixture_spooled(&f), 4);
    CHECK_EQ(ki_batch_seal_names(a, buf, KI_HEADER_BYTES, &len), -ENOBUFS);
    fixture_stop(&f);
}

/* Histograms on: kernels fold into histograms from their slots, the records not folded wait in
 * memory up to span_seal_ms (their slots freed) and go out together; stopping seals them. */
static void kernels_fold(const char *dir) {
    struct fixture f;
    /* Long enough that no wait ends between two calls however loaded the machine is. */
    const char *extra[] = {"--span-seal-ms", "3600000", "--histogram-interval-s", "3600", NULL};
    fixture_start(&f, dir, "http://127.0.0.1:9", extra);
    struct ki_agent *a = f.agent;
    CHECK(a->ks != NULL);
    CHECK_EQ(ki_batch_drain(a), 0); /* the first histogram export is due at once: sealed, empty */
    CHECK_EQ(fixture_spooled(&f), 1);
    for (int i = 0; i < 200; i++) {
        uint64_t t = ki_ring_now_ns();
        CHECK_EQ(ki_ring_kernel(&f.ring, 1 + (uint32_t)(i % 4), 0, t, t + 1000 + (uint64_t)i, 7, (uint64_t)i), 0);
    }
    fixture_produce(&f, 5);
    uint64_t before = fixture_spooled(&f);
    CHECK_EQ(ki_batch_drain(a), 0);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], 205);
    CHECK(a->batch.staged >= 5 && a->batch.staged < 205); /* the launches and the kept spans, not every kernel */
    CHECK_EQ(backlog(&f), 0);
    CHECK_EQ(fixture_spooled(&f), before);
    a->stopping = 1;
    CHECK_EQ(ki_batch_drain(a), 0);
    CHECK_EQ(a->batch.staged, 0);
    CHECK_EQ(fixture_spooled(&f), before + 1);
    CHECK_EQ(a->ctr.v[KI_CTR_KERNELS_AGGREGATED], 200);
    fixture_stop(&f);
}

int main(int argc, char **argv) {
    CHECK(argc == 2); /* a scratch directory */
    char dir[600];
    mkdir(argv[1], 0700);
    snprintf(dir, sizeof dir, "%s/off", argv[1]);
    records_become_batches(dir);
    snprintf(dir, sizeof dir, "%s/on", argv[1]);
    kernels_fold(dir);
    printf("ok\n");
    return 0;
}
