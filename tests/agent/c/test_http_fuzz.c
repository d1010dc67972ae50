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
};

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
        const char *seed = SEEDS[next_rand() % 5];
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

int main(void) {
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
