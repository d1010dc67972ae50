/* Unit test: the sender (send.c) against a real socket on loopback that this test answers by
 * hand: each status settles its batch as docs/wire.md says (stored, retried after Retry-After,
 * dead-lettered, authentication pause, a names batch in front after 424, one status per batch of
 * a request of several); and the retry delay (Retry-After clamped, jitter, equal-jitter backoff). */
#include "agent_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "ki_batch.h"
#include "ki_send.h"

static void retry_delay(void) {
    const uint64_t lo = 100 * KI_NS_PER_MS, hi = 30 * KI_NS_PER_S;
    uint64_t backoff = 0;
    /* Retry-After: its seconds plus up to 10% (a fleet told the same value spreads out) ... */
    CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, 2, 0), 2 * KI_NS_PER_S);
    CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, 2, 2 * KI_NS_PER_S / 10), 2 * KI_NS_PER_S + 2 * KI_NS_PER_S / 10);
    CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, 2, 2 * KI_NS_PER_S / 10 + 1), 2 * KI_NS_PER_S);
    /* ... trusted only up to backoff_max; 0 is a value (retry now, jitter of none). */
    CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, 86400, 0), hi);
    CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, 0, 12345), 0);
    /* Without it: the backoff doubles from backoff_min to backoff_max, half of it fixed, half random. */
    backoff = 0;
    uint64_t want = lo;
    for (int i = 0; i < 12; i++) {
        uint64_t prev = backoff;
        CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, -1, 0), want / 2); /* the least random */
        CHECK_EQ(backoff, want);
        backoff = prev;
        CHECK_EQ(ki_send_retry_delay(&backoff, lo, hi, -1, want / 2), want); /* the most */
        want = want * 2 > hi ? hi : want * 2;
    }
    CHECK_EQ(backoff, hi);
}

/* The collector's side: one kept-alive connection, read a request whole, answer it. */
struct peer {
    int listen_fd, fd;
    char head[4096]; /* the last request's head */
    size_t body;     /* its body's bytes */
};

static void peer_open(struct peer *p, int *port) {
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(p->listen_fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(p->listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(listen(p->listen_fd, 4), 0);
    socklen_t sl = sizeof sa;
    CHECK_EQ(getsockname(p->listen_fd, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
}

static int readable(int fd, int ms) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    return poll(&pfd, 1, ms) == 1;
}

/* Read one request (the agent sent it before returning: it is in the socket already). */
static void peer_read(struct peer *p) {
    if (p->fd < 0) {
        CHECK(readable(p->listen_fd, 30000));
        p->fd = accept(p->listen_fd, NULL, NULL);
        CHECK(p->fd >= 0);
    }
    size_t got = 0;
    char *end = NULL;
    while (!end) {
        CHECK(got < sizeof p->head - 1);
        CHECK(readable(p->fd, 30000));
        ssize_t r = read(p->fd, p->head + got, sizeof p->head - 1 - got);
        CHECK(r > 0);
        got += (size_t)r;
        p->head[got] = '\0';
        end = strstr(p->head, "\r\n\r\n");
    }
    const char *cl = strstr(p->head, "Content-Length: ");
    CHECK(cl != NULL);
    size_t len = strtoul(cl + 16, NULL, 10), have = got - (size_t)(end + 4 - p->head);
    *end = '\0';
    static char sink[1 << 16];
    while (have < len) {
        CHECK(readable(p->fd, 30000));
        size_t want = len - have < sizeof sink ? len - have : sizeof sink;
        ssize_t r = read(p->fd, sink, want);
        CHECK(r > 0);
        have += (size_t)r;
    }
    p->body = len;
}

static void peer_answer(struct peer *p, const char *status_and_headers) {
    char out[512];
    int n = snprintf(out, sizeof out, "HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n", status_and_headers);
    CHECK_EQ(write(p->fd, out, (size_t)n), n);
}

/* One request through ki_send_spool: sent (unless the agent sent one already), answered by the
 * peer, settled; returns once nothing is in flight or the agent sent the next request at once. */
static void exchange(struct fixture *f, struct peer *p, const char *answer) {
    struct ki_agent *a = f->agent;
    if (!a->send.in_flight) {
        a->send.next_send_ns = 0;
        ki_send_spool(a, 20 * KI_NS_PER_MS); /* sends, waits 20 ms at most for the answer */
    }
    CHECK(a->send.in_flight);
    peer_read(p);
    peer_answer(p, answer);
    for (int i = 0; i < 3000 && a->send.in_flight && !readable(p->fd, 0); i++) ki_send_spool(a, 10 * KI_NS_PER_MS);
    CHECK(!a->send.in_flight || readable(p->fd, 0));
}

static void one_batch(struct fixture *f) {
    fixture_produce(f, 3);
    CHECK_EQ(ki_batch_drain(f->agent), 0);
}

static void statuses(const char *dir) {
    struct peer p;
    int port;
    peer_open(&p, &port);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    struct fixture f;
    const char *extra[] = {"--no-histograms", "--backoff-max-ms", "10000", NULL};
    fixture_start(&f, dir, url, extra);
    struct ki_agent *a = f.agent;
    const uint64_t *ctr = a->ctr.v;
    one_batch(&f);
    CHECK_EQ(fixture_spooled(&f), 1);

    /* 503 with Retry-After: kept, retried no sooner than it says, no later than 10% after. */
    uint64_t t0 = ki_ring_mono_ns();
    exchange(&f, &p, "503 Service Unavailable\r\nRetry-After: 2");
    uint64_t t1 = ki_ring_mono_ns();
    CHECK_EQ(fixture_spooled(&f), 1);
    CHECK_EQ(ctr[KI_CTR_BATCHES_RETRIED], 1);
    CHECK(a->send.failing);
    CHECK(a->send.next_send_ns >= t0 + 2 * KI_NS_PER_S && a->send.next_send_ns <= t1 + 2200 * KI_NS_PER_MS);
    CHECK(strstr(p.head, "POST /v1/ingest HTTP/1.1") == p.head);
    /* Nothing goes before then. */
    ki_send_spool(a, 10 * KI_NS_PER_MS);
    CHECK(!a->send.in_flight);
    /* 429 past backoff_max: the wait is backoff_max's. */
    t0 = ki_ring_mono_ns();
    exchange(&f, &p, "429 Too Many Requests\r\nRetry-After: 3600");
    CHECK(a->send.next_send_ns >= t0 + 10 * KI_NS_PER_S && a->send.next_send_ns <= ki_ring_mono_ns() + 11 * KI_NS_PER_S);
    CHECK_EQ(ctr[KI_CTR_BATCHES_RETRIED], 2);

    /* 200: removed from the spool, sending is healthy again. */
    exchange(&f, &p, "200 OK");
    CHECK_EQ(fixture_spooled(&f), 0);
    CHECK_EQ(ctr[KI_CTR_BATCHES_SENT], 1);
    CHECK(!a->send.failing);
    CHECK_EQ(a->send.backoff_ns, 0);

    /* 409 (a duplicate): as 200. */
    one_batch(&f);
    exchange(&f, &p, "409 Conflict");
    CHECK_EQ(fixture_spooled(&f), 0);
    CHECK_EQ(ctr[KI_CTR_BATCHES_SENT], 2);

    /* 422: refused for good, set aside in the dead-letter file, never retried. */
    one_batch(&f);
    exchange(&f, &p, "422 Unprocessable Entity");
    CHECK_EQ(fixture_spooled(&f), 0);
    CHECK_EQ(ctr[KI_CTR_BATCHES_FAILED], 1);
    CHECK_EQ(ctr[KI_CTR_BATCHES_DEAD_LETTERED], 1);

    /* 401: kept, sending paused for auth_retry_s (or until SIGHUP). */
    one_batch(&f);
    uint64_t before = ki_ring_mono_ns();
    exchange(&f, &p, "401 Unauthorized");
    CHECK_EQ(fixture_spooled(&f), 1);
    CHECK_EQ(ctr[KI_CTR_AUTH_FAILURES], 1);
    CHECK(a->send.auth_blocked);
    CHECK(a->send.auth_until_ns >= before + (uint64_t)f.cfg.auth_retry_s * KI_NS_PER_S);
    ki_send_spool(a, 10 * KI_NS_PER_MS);
    CHECK(!a->send.in_flight);
    /* SIGHUP (the same key file): the pause ends. */
    ki_send_reload_key(a);
    CHECK(!a->send.auth_blocked);

    /* 424: kept; the next request carries a names batch in front of it, one status per batch. */
    exchange(&f, &p, "424 Failed Dependency");
    CHECK_EQ(fixture_spooled(&f), 1);
    CHECK(a->send.names_wanted);
    CHECK(a->send.in_flight); /* sent again at once, behind the names batch */
    exchange(&f, &p, "200 OK\r\nKI-Batch-Status: 200, 200");
    CHECK(strstr(p.head, "Content-Type: application/x-ki-batches") != NULL);
    CHECK_EQ(fixture_spooled(&f), 0);
    CHECK(!a->send.names_wanted);

    /* Several batches waiting go in one request; each settles by its own status. */
    for (int i = 0; i < 3; i++) CHECK_EQ(ki_batch_seal(a, 0), 0); /* heartbeats: batches as any other */
    uint64_t sent = ctr[KI_CTR_BATCHES_SENT], failed = ctr[KI_CTR_BATCHES_FAILED];
    CHECK_EQ(fixture_spooled(&f), 3);
    exchange(&f, &p, "200 OK\r\nKI-Batch-Status: 200, 503, 400");
    CHECK(strstr(p.head, "Content-Type: application/x-ki-batches") != NULL);
    CHECK_EQ(ctr[KI_CTR_BATCHES_SENT], sent + 1);
    CHECK_EQ(ctr[KI_CTR_BATCHES_FAILED], failed + 1);
    CHECK_EQ(fixture_spooled(&f), 1); /* the 503 one */
    /* An answer to several batches as a whole, without statuses (an older collector's 415): sent
     * again at once, one per request. */
    CHECK_EQ(ki_batch_seal(a, 0), 0);
    CHECK_EQ(fixture_spooled(&f), 2);
    exchange(&f, &p, "415 Unsupported Media Type");
    CHECK(strstr(p.head, "x-ki-batches") != NULL);
    CHECK(a->send.single_until_ns > ki_ring_mono_ns());
    CHECK(a->send.in_flight); /* the first batch again, alone */
    exchange(&f, &p, "200 OK");
    CHECK(strstr(p.head, "x-ki-batches") == NULL);
    CHECK_EQ(fixture_spooled(&f), 1);

    fixture_stop(&f);
    if (p.fd >= 0) close(p.fd);
    close(p.listen_fd);
}

int main(int argc, char **argv) {
    CHECK(argc == 2); /* a scratch directory */
    retry_delay();
    statuses(argv[1]);
    printf("ok\n");
    return 0;
}
