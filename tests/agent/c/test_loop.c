/* Unit test: the loop (loop.c) as far as it runs without a collector (its address refuses
 * connections): the pace of early drains follows the producers' rate, a tick drains, seals and
 * tries to send, a tick waits for its time and ends at once on stop, and ki_agent_run, stopped,
 * seals a last batch and returns. */
#include "agent_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include "ki_loop.h"

static void pause_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    CHECK(argc == 2); /* a scratch directory */
    /* A port that refuses: bound, not listening. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(sa.sin_port));
    struct fixture f;
    const char *extra[] = {"--no-histograms", "--shutdown-timeout-s", "0", NULL};
    fixture_start(&f, argv[1], url, extra);
    struct ki_agent *a = f.agent;
    CHECK_EQ(a->ring.busy_records, 512); /* half the 1,024-slot ring */

    /* Nothing written: the tick is soon enough. */
    CHECK_EQ(ki_loop_drain_and_pace(a), UINT64_MAX);
    /* 100 records in >= 10 ms: half the ring fills in >= 51 ms at that rate; the next drain is
     * due then, after now, and within the hour. */
    fixture_produce(&f, 100);
    pause_ms(10);
    uint64_t t0 = ki_ring_mono_ns();
    uint64_t early = ki_loop_drain_and_pace(a);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], 100);
    CHECK(early >= t0 + 51 * KI_NS_PER_MS);
    CHECK(early <= ki_ring_mono_ns() + 3600 * KI_NS_PER_S);
    /* What a full ring dropped counts as written: the rate is not underestimated. */
    for (int i = 0; i < 1100; i++) {
        struct ki_rec rec;
        memset(&rec, 0, sizeof rec);
        rec.type = KI_REC_LAUNCH;
        rec.ts_ns = ki_ring_now_ns();
        ki_ring_write(&f.ring, &rec); /* the last 76 find the ring full */
    }
    uint64_t drop_before = a->ring.pace_dropped;
    early = ki_loop_drain_and_pace(a);
    CHECK(a->ring.pace_dropped > drop_before);
    CHECK(early != UINT64_MAX);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], 1124);

    /* A tick: drains what came, tries to send the spooled batches (refused), backs off. */
    fixture_produce(&f, 5);
    ki_agent_tick(a);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], 1129);
    CHECK(fixture_spooled(&f) >= 1);
    CHECK(a->ctr.v[KI_CTR_REQUESTS_FAILED] >= 1);
    CHECK(a->send.failing);
    CHECK(a->send.next_send_ns > ki_ring_mono_ns() - KI_NS_PER_S);

    /* ki_loop_tick_until returns once the tick is due, and not before ... */
    volatile sig_atomic_t stop = 0, reload = 0;
    uint64_t next = ki_ring_mono_ns() + 30 * KI_NS_PER_MS;
    ki_loop_tick_until(a, next, &stop, &reload);
    CHECK(ki_ring_mono_ns() >= next);
    /* ... and at once when asked to stop (after its first drain). */
    fixture_produce(&f, 3);
    uint64_t read = a->ctr.v[KI_CTR_RECORDS_READ];
    stop = 1;
    ki_loop_tick_until(a, ki_ring_mono_ns() + 3600 * KI_NS_PER_S, &stop, &reload);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], read + 3);

    /* Stopped: what the ring and memory hold is sealed into the spool, a last batch carries the
     * final counters, and with shutdown_timeout_s 0 it returns without waiting for the collector. */
    fixture_produce(&f, 4);
    uint64_t spooled = fixture_spooled(&f);
    uint64_t sealed = a->ctr.v[KI_CTR_BATCHES_SEALED];
    CHECK_EQ(ki_agent_run(a, &stop, &reload), 0);
    CHECK_EQ(a->ctr.v[KI_CTR_RECORDS_READ], read + 7);
    CHECK(a->ctr.v[KI_CTR_BATCHES_SEALED] >= sealed + 1);
    CHECK(fixture_spooled(&f) >= spooled + 1);
    CHECK_EQ(a->batch.staged, 0);
    CHECK_EQ(a->batch.pending, 0);

    fixture_stop(&f);
    close(fd);
    printf("ok\n");
    return 0;
}
