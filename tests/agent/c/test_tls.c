/* Unit test: the agent's TLS client (tls.c) against a real TLS server (tests/agent/test_agent_units.py
 * runs one on loopback). Usage: test_tls PORT CA_FILE HOST EXPECT, EXPECT "echo" (the handshake
 * verifies, a message goes there and back) or "refused" (the handshake fails with a reason). */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ki_test.h"
#include "ki_tls.h"

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

int main(int argc, char **argv) {
    CHECK_EQ(argc, 5);
    int port = atoi(argv[1]);
    const char *ca = argv[2], *host = argv[3], *expect = argv[4];
    char err[512] = "";
    /* A CA file that does not exist is a clear error at create. */
    CHECK(ki_tls_create("/nonexistent/ca.pem", err, sizeof err) == NULL);
    CHECK(err[0] != 0);
    ki_tls_destroy(NULL);
    struct ki_tls *t = ki_tls_create(ca, err, sizeof err);
    CHECK(t != NULL);
    int fd = connect_to(port);
    err[0] = 0;
    struct ki_tls_conn *c = ki_tls_connect(t, fd, host, 10000, err, sizeof err);
    if (!strcmp(expect, "refused")) {
        CHECK(c == NULL);
        CHECK(err[0] != 0);
        printf("ok refused: %s\n", err);
    } else {
        CHECK(c != NULL);
        static const char msg[] = "ping over tls";
        CHECK_EQ(ki_tls_write(t, c, msg, sizeof msg - 1), 0);
        char buf[64];
        size_t got = 0;
        while (got < sizeof msg - 1) {
            ssize_t n = ki_tls_read(t, c, buf + got, sizeof buf - got);
            CHECK(n > 0);
            got += (size_t)n;
        }
        CHECK_EQ(got, sizeof msg - 1);
        CHECK(!memcmp(buf, msg, got));
        CHECK_EQ(ki_tls_pending(t, c), 0);
        /* The server closes after the echo: the end of the stream reads as 0. */
        CHECK_EQ(ki_tls_read(t, c, buf, sizeof buf), 0);
        ki_tls_close(t, c);
        printf("ok echo\n");
    }
    close(fd);
    ki_tls_destroy(t);
    return 0;
}
