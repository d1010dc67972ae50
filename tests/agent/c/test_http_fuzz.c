/* Fuzz: ki_http against a server answering with random and mutated responses: only clean results. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ki_test.h"
#include "ki_transport.h"

#define ROUNDS 3000

static const char *const SEEDS[] = {
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n",
    "HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "HTTP/1.0 401 Unauthorized\r\n\r\n",
    "HTTP/1.1 200 OK\r\nKI-Batch-Status: 200, 409, 503\r\nRetry-After: 99999999999999999999\r\nContent-Length: 2\r\n\r\n{}",
    "HTTP/1.1 503 Busy\r\nRetry-After: -1\r\nContent-Length: -5\r\n\r\n",
    "HTTP/1.1 200 OK\r\nKI-Capture: 00000000000000ff;gpu=3;seconds=10\r\nKI-Capture: 0123456789abcdef;gpu=0;seconds=1, "
    "0000000000000001;gpu=1;seconds=60\r\nContent-Length: 2\r\n\r\n{}",
};
#define NSEEDS (sizeof SEEDS / sizeof SEEDS[0])

static int listener;
static unsigned long long rng = 88172645463325252ULL;

static unsigned next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)rng;
}

static void *serve(void *arg) {
    (void)arg;
    char req[65536], resp[2048];
    for (int i = 0; i < ROUNDS; i++) {
        int c = accept(listener, NULL, NULL);
        if (c < 0) break;
        (void)!read(c, req, sizeof req); /* the request (small, one read on loopback) */
        const char *seed = SEEDS[next_rand() % NSEEDS];
        size_t n = strlen(seed);
        memcpy(resp, seed, n);
        unsigned kind = next_rand() % 4;
        if (kind == 0) { /* random bytes */
            n = next_rand() % sizeof resp;
            for (size_t j = 0; j < n; j++) resp[j] = (char)next_rand();
        } else if (kind == 1) { /* flip bytes */
            for (int k = 0; k < 4; k++) resp[next_rand() % n] = (char)next_rand();
        } else if (kind == 2) { /* truncate */
            n = next_rand() % (n + 1);
        } else { /* grow a header past the buffer */
            memcpy(resp, "HTTP/1.1 200 OK\r\nX: ", 20);
            memset(resp + 20, 'a', sizeof resp - 20);
            n = sizeof resp;
        }
        (void)!write(c, resp, n);
        if (kind == 3) /* more header bytes than the client's buffer */
            for (int k = 0; k < 6; k++) (void)!write(c, resp + 20, sizeof resp - 20);
        shutdown(c, SHUT_WR);
        close(c);
    }
    return NULL;
}

/* Known answers of the head parser: numbers are validated and clamped, never trusted. */
static void parse_cases(void) {
    struct ki_http_result r;
    long long cl;
    int keep;
    const char *h = "HTTP/1.1 200 OK\r\nKI-Batch-Status: 200, 409,503 ,422\r\nContent-Length: 12\r\nRetry-After: 3";
    CHECK_EQ(ki_http_parse_head(h, strlen(h), &r, &cl, &keep), 0);
    CHECK_EQ(r.status, 200);
    CHECK_EQ(r.nframes, 4);
    CHECK_EQ(r.frame_status[0], 200);
    CHECK_EQ(r.frame_status[2], 503);
    CHECK_EQ(r.frame_status[3], 422);
    CHECK_EQ(cl, 12);
    CHECK_EQ(keep, 1);
    CHECK_EQ(r.retry_after, 3);
    CHECK_EQ(r.snapshot, 0);
    const char *snap = "HTTP/1.1 200 OK\r\nki-histogram-snapshot: 1\r\nContent-Length: 0";
    CHECK_EQ(ki_http_parse_head(snap, strlen(snap), &r, &cl, &keep), 0);
    CHECK_EQ(r.snapshot, 1); /* the collector lacked a histogram's base: snapshots next */
    const char *other = "HTTP/1.1 200 OK\r\nKI-Histogram-Snapshot: yes\r\nContent-Length: 0";
    CHECK_EQ(ki_http_parse_head(other, strlen(other), &r, &cl, &keep), 0);
    CHECK_EQ(r.snapshot, 0); /* only "1" asks */
    const char *huge = "HTTP/1.1 503 x\r\nRetry-After: 184467440737095516160\r\nContent-Length: 0";
    CHECK_EQ(ki_http_parse_head(huge, strlen(huge), &r, &cl, &keep), 0);
    CHECK_EQ(r.retry_after, KI_HTTP_RETRY_AFTER_MAX);
    const char *neg = "HTTP/1.1 503 x\r\nRetry-After: -1\r\nContent-Length: 0";
    CHECK_EQ(ki_http_parse_head(neg, strlen(neg), &r, &cl, &keep), 0);
    CHECK_EQ(r.retry_after, -1);
    const char *date = "HTTP/1.1 503 x\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\nContent-Length: 0";
    CHECK_EQ(ki_http_parse_head(date, strlen(date), &r, &cl, &keep), 0);
    CHECK_EQ(r.retry_after, -1);
    const char *badlen[] = {"HTTP/1.1 200 OK\r\nContent-Length: -1", "HTTP/1.1 200 OK\r\nContent-Length: 1x",
                            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999", "HTTP/1.1 2000 OK",
                            "HTTP/1.1 099 OK", "HTTX/1.1 200 OK"};
    for (size_t i = 0; i < sizeof badlen / sizeof badlen[0]; i++)
        CHECK_EQ(ki_http_parse_head(badlen[i], strlen(badlen[i]), &r, &cl, &keep), -EPROTO);
    const char *big = "HTTP/1.1 200 OK\r\nContent-Length: 900000000";
    CHECK_EQ(ki_http_parse_head(big, strlen(big), &r, &cl, &keep), 0);
    CHECK_EQ(keep, 0); /* a body too long to skip ends the connection */
    const char *badframes[] = {"HTTP/1.1 200 OK\r\nKI-Batch-Status: 200,", "HTTP/1.1 200 OK\r\nKI-Batch-Status: 2000",
                               "HTTP/1.1 200 OK\r\nKI-Batch-Status: ", "HTTP/1.1 200 OK\r\nKI-Batch-Status: 200;201"};
    for (size_t i = 0; i < sizeof badframes / sizeof badframes[0]; i++) {
        CHECK_EQ(ki_http_parse_head(badframes[i], strlen(badframes[i]), &r, &cl, &keep), 0);
        CHECK_EQ(r.nframes, -2);
    }
    /* KI-Capture: one value per line or comma-separated; anything else is counted and ignored. */
    const char *cap = "HTTP/1.1 200 OK\r\nki-capture: 00000000000000ff;gpu=3;seconds=10\r\nContent-Length: 0\r\n"
                      "KI-Capture:0123456789abcdef;gpu=65535;seconds=3600 , 0123456789abcdeF;gpu=0;seconds=1,\r\n"
                      "KI-Capture: 0000000000000002;gpu=65536;seconds=1\r\nKI-Capture: 0000000000000003;gpu=0;seconds=0\r\n"
                      "KI-Capture: 0000000000000004;gpu=0;seconds=1;x=1\r\nKI-Capture: 000000000000005;gpu=0;seconds=1";
    CHECK_EQ(ki_http_parse_head(cap, strlen(cap), &r, &cl, &keep), 0);
    CHECK_EQ(r.ncaptures, 2);
    CHECK_EQ(r.bad_captures, 5);
    CHECK_EQ(r.captures[0].id, 0xff);
    CHECK_EQ(r.captures[0].gpu, 3);
    CHECK_EQ(r.captures[0].seconds, 10);
    CHECK_EQ(r.captures[1].id, 0x0123456789abcdefULL);
    CHECK_EQ(r.captures[1].gpu, 65535);
    CHECK_EQ(r.captures[1].seconds, 3600);
    char many[1024] = "HTTP/1.1 200 OK\r\nKI-Capture: ";
    for (int i = 1; i <= 6; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s%016x;gpu=0;seconds=5", i > 1 ? ", " : "", i);
    CHECK_EQ(ki_http_parse_head(many, strlen(many), &r, &cl, &keep), 0);
    CHECK_EQ(r.ncaptures, KI_CAPTURE_OFFERS); /* the rest come with the next answers */
    CHECK_EQ(r.captures[3].id, 4);
    /* Random heads: any result is clean (0 or -EPROTO), statuses in range. */
    char buf[512];
    for (int i = 0; i < 200000; i++) {
        size_t n = next_rand() % sizeof buf;
        const char *seed = SEEDS[next_rand() % NSEEDS];
        size_t sl = strlen(seed);
        memcpy(buf, seed, sl < sizeof buf ? sl : sizeof buf);
        if (next_rand() % 2)
            for (size_t j = 0; j < n; j++) buf[j] = (char)next_rand();
        else
            for (int k = 0; k < 4; k++) buf[next_rand() % sizeof buf] = (char)next_rand();
        int rc = ki_http_parse_head(buf, n, &r, &cl, &keep);
        CHECK(rc == 0 || rc == -EPROTO);
        if (rc == 0) {
            CHECK(r.status >= 100 && r.status <= 599);
            CHECK(r.retry_after >= -1 && r.retry_after <= KI_HTTP_RETRY_AFTER_MAX);
            CHECK(r.nframes >= -2 && r.nframes <= KI_HTTP_MAX_FRAMES && r.nframes != 0);
            for (int j = 0; j < r.nframes; j++) CHECK(r.frame_status[j] >= 100 && r.frame_status[j] <= 599);
            CHECK(r.ncaptures >= 0 && r.ncaptures <= KI_CAPTURE_OFFERS);
            for (int j = 0; j < r.ncaptures; j++)
                CHECK(r.captures[j].id && r.captures[j].gpu <= 65535 && r.captures[j].seconds >= 1 &&
                      r.captures[j].seconds <= KI_CAPTURE_MAX_SECONDS);
        }
    }
}

int main(void) {
    parse_cases();
    signal(SIGPIPE, SIG_IGN); /* the server side writes to clients that gave up */
    listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK(listen(listener, 16) == 0);
    socklen_t len = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &len);
    char url[64], err[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(addr.sin_port));
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    struct ki_http *h = ki_http_create(url, "/v1/ingest", NULL, 1000, 1000, err, sizeof err);
    CHECK(h != NULL);
    int ok = 0, failed = 0;
    for (int i = 0; i < ROUNDS; i++) {
        struct ki_http_result res;
        int rc = ki_http_post(h, "body", 4, &res);
        if (rc == 0) {
            CHECK(res.status >= 100 && res.status <= 599);
            ok++;
        } else {
            CHECK(rc < 0);
            failed++;
        }
        ki_http_reset(h); /* the server closes after each answer */
    }
    pthread_join(t, NULL);
    ki_http_destroy(h);
    close(listener);
    /* Bad URLs are refused at creation. */
    CHECK(ki_http_create("https://", "/p", NULL, 1, 1, err, sizeof err) == NULL);
    CHECK(ki_http_create("https://h", "/p", "/nonexistent/ca.pem", 1, 1, err, sizeof err) == NULL);
    CHECK(strstr(err, "trusted certificates") != NULL);
    CHECK(ki_http_create("ftp://x", "/p", NULL, 1, 1, err, sizeof err) == NULL);
    CHECK(ki_http_create("http://:80", "/p", NULL, 1, 1, err, sizeof err) == NULL);
    CHECK(ki_http_create("http://host:8x", "/p", NULL, 1, 1, err, sizeof err) == NULL);
    printf("ok answered=%d failed=%d\n", ok, failed);
    CHECK(ok > ROUNDS / 50);
    CHECK(failed > ROUNDS / 10);
    return 0;
}
