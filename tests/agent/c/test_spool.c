/* Unit test: the on-disk spool (spool.c): order, bound, drops, re-indexing after a restart. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "ki_seal.h"
#include "ki_spool.h"
#include "ki_test.h"

static size_t frame(uint8_t *buf, uint32_t epoch, uint64_t seq, uint32_t count, size_t len) {
    memset(buf, 0xAB, len);
    memcpy(buf, "KIWB", 4);
    memcpy(buf + 28, &epoch, 4);
    memcpy(buf + 32, &seq, 8);
    memcpy(buf + 56, &count, 4);
    return len;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char err[256];
    uint8_t buf[4096], got[4096];
    struct ki_spool *sp = ki_spool_create(argv[1], 3000, 0, err, sizeof err);
    CHECK(sp != NULL);
    struct ki_spool_id id;
    size_t len;
    struct ki_spool_mark m = {111, 5000}, m2 = {111, 6000}, got_mark;
    CHECK_EQ(ki_spool_last_mark(sp, &got_mark), -ENOENT);
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), -ENOENT);
    for (uint64_t s = 0; s < 3; s++) CHECK_EQ(ki_spool_put(sp, buf, frame(buf, 7, s, 10 + (uint32_t)s, 976), &m), 0);
    struct ki_spool_stats st;
    ki_spool_stats(sp, &st);
    CHECK_EQ(st.batches, 3);
    CHECK_EQ(st.bytes, 3000);
    /* A fourth batch does not fit: the oldest (seq 0, 10 records) is dropped and counted. */
    CHECK_EQ(ki_spool_put(sp, buf, frame(buf, 7, 3, 13, 976), &m), 0);
    ki_spool_stats(sp, &st);
    CHECK_EQ(st.dropped_batches, 1);
    CHECK_EQ(st.dropped_records, 10);
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), 0);
    CHECK_EQ(id.seq, 1);
    CHECK_EQ(len, 976);
    frame(buf, 7, 1, 11, 976);
    CHECK(!memcmp(got, buf, 976));
    CHECK_EQ(ki_spool_peek(sp, got, 10, &len, &id), -EMSGSIZE);
    CHECK_EQ(ki_spool_remove(sp, id), 0);
    /* Larger than the whole bound: dropped itself. */
    CHECK_EQ(ki_spool_put(sp, buf, frame(buf, 7, 4, 99, 4000), &m), 0);
    ki_spool_stats(sp, &st);
    CHECK_EQ(st.dropped_records, 10 + 99);
    ki_spool_destroy(sp);
    /* A new run (new epoch) finds seq 2 and 3 of epoch 7 first, then its own. */
    sp = ki_spool_create(argv[1], 1 << 20, 1, err, sizeof err);
    CHECK(sp != NULL);
    /* The newest batch's ring mark survives the restart. */
    CHECK_EQ(ki_spool_last_mark(sp, &got_mark), 0);
    CHECK_EQ(got_mark.ring_created_ns, 111);
    CHECK_EQ(got_mark.next_pos, 5000);
    CHECK_EQ(ki_spool_put(sp, buf, frame(buf, 8, 0, 1, 500), &m2), 0);
    uint64_t want[][2] = {{7, 2}, {7, 3}, {8, 0}};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), 0);
        CHECK_EQ(id.epoch, want[i][0]);
        CHECK_EQ(id.seq, want[i][1]);
        CHECK_EQ(ki_spool_remove(sp, id), 0);
    }
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), -ENOENT);
    ki_spool_stats(sp, &st);
    CHECK_EQ(st.batches, 0);
    CHECK_EQ(st.bytes, 0);
    ki_spool_destroy(sp);
    ki_spool_destroy(NULL);
    puts("ok");
    return 0;
}
