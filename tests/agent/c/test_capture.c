/* test_capture.c - capture windows: one run per id, coverage per GPU and time, span counts,
 * and the CAPTURES section (its final report ends the window). Writes the sections to argv[1]
 * for the Python decoder to read back. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ki_capture.h"
#include "ki_ring.h"
#include "ki_test.h"

#define S 1000000000ULL

static struct ki_record kernel(uint16_t gpu, uint64_t ts) {
    struct ki_record r;
    memset(&r, 0, sizeof r);
    r.rec.type = KI_REC_KERNEL;
    r.rec.device = gpu;
    r.rec.ts_ns = ts;
    return r;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    static struct ki_captures c; /* zeroed */
    const uint64_t t0 = 1700000000ULL * S;
    struct ki_capture_offer a = {0xabcdef, 1, 10}, b = {0x42, 0, 2};
    CHECK_EQ(ki_captures_running(&c), 0);
    CHECK_EQ(ki_captures_start(&c, &a, t0), 1);
    CHECK_EQ(ki_captures_start(&c, &a, t0 + S), 0); /* offered again (another collector): runs once */
    CHECK_EQ(ki_captures_start(&c, &b, t0 + S), 1);
    CHECK_EQ(ki_captures_running(&c), 2);
    CHECK(ki_captures_covers(&c, 1, t0));
    CHECK(!ki_captures_covers(&c, 1, t0 - 1));
    CHECK(!ki_captures_covers(&c, 1, t0 + 10 * S)); /* the end is exclusive */
    CHECK(!ki_captures_covers(&c, 2, t0 + S));
    CHECK_EQ(ki_captures_until(&c, 1), t0 + 10 * S);
    CHECK_EQ(ki_captures_until(&c, 0), t0 + 3 * S);
    CHECK_EQ(ki_captures_until(&c, 7), 0);

    struct ki_record recs[6] = {kernel(1, t0), kernel(1, t0 + 9 * S), kernel(1, t0 + 10 * S),
                                kernel(0, t0 + S), kernel(0, t0 + 2 * S), kernel(3, t0 + S)};
    recs[5].rec.type = KI_REC_MEMOP; /* not a kernel span */
    recs[5].rec.device = 1;
    ki_captures_count(&c, recs, 6);

    FILE *f = fopen(argv[1], "wb");
    CHECK(f != NULL);
    uint8_t sec[KI_CAPTURE_SECTION_MAX];
    CHECK_EQ(ki_captures_section(&c, t0 + 2 * S, sec, 10), 0); /* no room: nothing written */
    CHECK(!ki_captures_due(&c, t0 + 3 * S));
    CHECK(ki_captures_due(&c, t0 + 4 * S)); /* b's end plus the settle time */
    size_t n = ki_captures_section(&c, t0 + 4 * S, sec, sizeof sec); /* a running, b final */
    CHECK(n > 0 && sec[0] == KI_SECTION_CAPTURES);
    fwrite(&n, sizeof n, 1, f);
    fwrite(sec, 1, n, f);
    CHECK_EQ(ki_captures_running(&c), 1);
    CHECK_EQ(ki_captures_start(&c, &b, t0 + 5 * S), 0); /* finished ids are not run again */
    n = ki_captures_section(&c, t0 + 11 * S, sec, sizeof sec); /* a final */
    fwrite(&n, sizeof n, 1, f);
    fwrite(sec, 1, n, f);
    fclose(f);
    CHECK_EQ(ki_captures_running(&c), 0);
    CHECK_EQ(ki_captures_section(&c, t0 + 12 * S, sec, sizeof sec), 0);

    /* A full table refuses more (the offer comes again with a later answer). */
    for (uint64_t i = 1; i <= KI_CAPTURE_MAX; i++) {
        struct ki_capture_offer o = {0x1000 + i, 0, 5};
        CHECK_EQ(ki_captures_start(&c, &o, t0), 1);
    }
    struct ki_capture_offer more = {0x9999, 0, 5};
    CHECK_EQ(ki_captures_start(&c, &more, t0), -ENOSPC);
    printf("ok\n");
    return 0;
}
