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
    memcpy(buf, KI_WIRE_MAGIC, KI_WIRE_MAGIC_BYTES);
    memcpy(buf + 28, &epoch, 4);
    memcpy(buf + 32, &seq, 8);
    memcpy(buf + 56, &count, 4);
    uint32_t plen = (uint32_t)len - 64;
    memcpy(buf + 60, &plen, 4);
    return len;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char err[256];
    uint8_t buf[4096], got[4096];
    struct ki_spool *sp = ki_spool_create(argv[1], 3000, 1 << 20, 0, err, sizeof err);
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
    sp = ki_spool_create(argv[1], 1 << 20, 1 << 20, 1, err, sizeof err);
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
    /* A request of several batches: peek_after walks them in order, over holes left by batches
     * settled out of order (one answered 503 while the others were stored). */
    for (uint64_t s = 1; s <= 6; s++) CHECK_EQ(ki_spool_put(sp, buf, frame(buf, 8, s, 1, 200), &m2), 0);
    CHECK_EQ(ki_spool_remove(sp, (struct ki_spool_id){8, 2}), 0);
    CHECK_EQ(ki_spool_remove(sp, (struct ki_spool_id){8, 4}), 0);
    uint64_t walk[] = {1, 3, 5, 6};
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), 0);
    CHECK_EQ(id.seq, walk[0]);
    for (int i = 1; i < 4; i++) {
        CHECK_EQ(ki_spool_peek_after(sp, id, got, sizeof got, &len, &id), 0);
        CHECK_EQ(id.seq, walk[i]);
    }
    CHECK_EQ(ki_spool_peek_after(sp, id, got, sizeof got, &len, &id), -ENOENT);
    CHECK_EQ(ki_spool_peek_after(sp, (struct ki_spool_id){8, 3}, got, 100, &len, &id), -EMSGSIZE);
    /* A file whose length is not its header's is damaged, never sent. */
    frame(buf, 8, 7, 1, 300);
    uint32_t wrong = 10;
    memcpy(buf + 60, &wrong, 4);
    CHECK_EQ(ki_spool_put(sp, buf, 300, &m2), 0);
    struct ki_spool_id bad = {8, 6};
    CHECK_EQ(ki_spool_peek_after(sp, bad, got, sizeof got, &len, &id), -EBADMSG);
    CHECK_EQ(id.seq, 7);
    /* Dead letters: appended with their status, the batch leaves the spool; past the bound the
     * file rotates to dead-letter.1, so at most two bounds' worth stay on disk. */
    CHECK_EQ(ki_spool_dead_letter(sp, (struct ki_spool_id){8, 1}, buf, frame(buf, 8, 1, 1, 200), 400, 42), 0);
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), 0);
    CHECK_EQ(id.seq, 3);
    char path[512];
    snprintf(path, sizeof path, "%s/dead-letter", argv[1]);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    uint8_t entry[24 + 200];
    CHECK_EQ(fread(entry, 1, sizeof entry, f), sizeof entry);
    fclose(f);
    CHECK(!memcmp(entry, "KIDL", 4));
    uint16_t status;
    uint32_t elen;
    memcpy(&status, entry + 4, 2);
    memcpy(&elen, entry + 16, 4);
    CHECK_EQ(status, 400);
    CHECK_EQ(elen, 200);
    CHECK(!memcmp(entry + 24, buf, 200));
    ki_spool_destroy(sp);
    sp = ki_spool_create(argv[1], 1 << 20, 500, 0, err, sizeof err);
    CHECK(sp != NULL);
    for (uint64_t s = 3; s <= 6; s += 1) {
        if (s == 4) continue;
        CHECK_EQ(ki_spool_dead_letter(sp, (struct ki_spool_id){8, s}, buf, frame(buf, 8, s, 1, 200), 422, 42), 0);
    }
    struct stat dst, old;
    CHECK_EQ(stat(path, &dst), 0);
    snprintf(path, sizeof path, "%s/dead-letter.1", argv[1]);
    CHECK_EQ(stat(path, &old), 0);
    CHECK(dst.st_size <= 500 && old.st_size <= 500);
    CHECK_EQ(ki_spool_dead_letter(sp, (struct ki_spool_id){8, 7}, buf, frame(buf, 8, 7, 1, 600), 400, 42), -EFBIG);
    CHECK_EQ(ki_spool_peek(sp, got, sizeof got, &len, &id), -ENOENT);
    ki_spool_destroy(sp);
    ki_spool_destroy(NULL);
    puts("ok");
    return 0;
}
