/* transport.c - minimal HTTP/1.1 client for one endpoint (ki_transport.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_transport.h"

#include "ki_tls.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RESPONSE_MAX 8192u

struct ki_http {
    char host[256];          /* collector host */
    char port[8];            /* collector port */
    char path[512];          /* request path */
    char target[270];        /* host:port for logs */
    int connect_timeout_ms;  /* connect bound */
    int io_timeout_ms;       /* send/receive bound */
    int fd;                  /* connection, -1 when closed */
    const void *body;        /* body of the request in flight */
    size_t len;              /* its length */
    int hlen;                /* its head's length (in head) */
    size_t sent;             /* bytes of head + body sent so far (plain TCP sends without blocking) */
    int reused;              /* the request went out on a kept-alive connection */
    struct ki_tls *tls;      /* TLS library and context for https, else NULL */
    struct ki_tls_conn *conn; /* TLS session on fd */
    char error[256];         /* words for the last failure */
    char head[1024];         /* request head being built */
    char resp[RESPONSE_MAX]; /* response bytes */
};

struct ki_http *ki_http_create(const char *url, const char *path, const char *ca_file, int connect_timeout_ms,
                               int io_timeout_ms, char *err, size_t errlen) {
    int https = !strncmp(url, "https://", 8);
    if (!https && strncmp(url, "http://", 7)) {
        snprintf(err, errlen, "collector URL %s must start with http:// or https://", url);
        return NULL;
    }
    struct ki_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->fd = -1;
    h->connect_timeout_ms = connect_timeout_ms;
    h->io_timeout_ms = io_timeout_ms;
    const char *p = url + (https ? 8 : 7), *slash = strchr(p, '/');
    size_t hostport = slash ? (size_t)(slash - p) : strlen(p);
    const char *prefix = slash ? slash : "";
    size_t plen = strlen(prefix);
    while (plen && prefix[plen - 1] == '/') plen--;
    const char *colon = memchr(p, ':', hostport);
    if (p[0] == '[') colon = NULL; /* IPv6 literals are not supported: use a name */
    size_t hl = colon ? (size_t)(colon - p) : hostport;
    size_t pl = colon ? hostport - hl - 1 : 2;
    if (hl == 0 || hl >= sizeof h->host || pl == 0 || pl >= sizeof h->port ||
        plen + strlen(path) >= sizeof h->path) {
        snprintf(err, errlen, "collector URL %s: cannot parse host and port", url);
        free(h);
        return NULL;
    }
    memcpy(h->host, p, hl);
    if (colon) memcpy(h->port, colon + 1, pl);
    else strcpy(h->port, https ? "443" : "80");
    for (const char *c = h->port; *c; c++)
        if (!isdigit((unsigned char)*c)) {
            snprintf(err, errlen, "collector URL %s: the port must be a number", url);
            free(h);
            return NULL;
        }
    snprintf(h->path, sizeof h->path, "%.*s%s", (int)plen, prefix, path);
    snprintf(h->target, sizeof h->target, "%s:%s", h->host, h->port);
    if (https && !(h->tls = ki_tls_create(ca_file, err, errlen))) {
        free(h);
        return NULL;
    }
    return h;
}

const char *ki_http_error(const struct ki_http *h) { return h->error; }

static void disconnect(struct ki_http *h) {
    ki_tls_close(h->tls, h->conn);
    h->conn = NULL;
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
}

void ki_http_destroy(struct ki_http *h) {
    if (!h) return;
    disconnect(h);
    ki_tls_destroy(h->tls);
    free(h);
}

const char *ki_http_target(const struct ki_http *h) { return h->target; }


static int wait_fd(int fd, short events, int timeout_ms) {
    struct pollfd p = {fd, events, 0};
    int r;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return -ETIMEDOUT;
    if (r < 0) return -errno;
    return 0;
}

static int connect_now(struct ki_http *h) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(h->host, h->port, &hints, &res);
    if (g != 0) return -EHOSTUNREACH;
    int rc = -ECONNREFUSED;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int c = connect(fd, a->ai_addr, a->ai_addrlen);
        if (c < 0 && errno == EINPROGRESS) {
            c = wait_fd(fd, POLLOUT, h->connect_timeout_ms);
            if (c == 0) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                c = soerr ? -soerr : 0;
            }
        } else if (c < 0) {
            c = -errno;
        }
        if (c == 0) {
            fcntl(fd, F_SETFL, fl);
            struct timeval tv = {h->io_timeout_ms / 1000, (h->io_timeout_ms % 1000) * 1000};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (h->tls && !(h->conn = ki_tls_connect(h->tls, fd, h->host, h->io_timeout_ms, h->error, sizeof h->error))) {
                close(fd);
                rc = -EPROTO;
                break; /* a TLS failure is not a reason to try the next address */
            }
            h->fd = fd;
            rc = 0;
            break;
        }
        close(fd);
        rc = c;
    }
    freeaddrinfo(res);
    return rc;
}

static int send_all_tls(struct ki_http *h) {
    int rc = ki_tls_write(h->tls, h->conn, h->head, (size_t)h->hlen);
    if (rc == 0) rc = ki_tls_write(h->tls, h->conn, h->body, h->len);
    if (rc == 0) h->sent = (size_t)h->hlen + h->len;
    return rc;
}

/* Send what the socket takes now of the request, without blocking: a large request to a
 * collector that reads slowly never holds up the drain loop (TLS writes block, bounded by
 * io_timeout_ms). Returns 0 (all sent, or the socket is full) or a negative errno. */
static int pump(struct ki_http *h) {
    size_t total = (size_t)h->hlen + h->len;
    if (h->conn) return h->sent < total ? send_all_tls(h) : 0;
    while (h->sent < total) {
        struct iovec iov[2];
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        if (h->sent < (size_t)h->hlen) {
            iov[0] = (struct iovec){h->head + h->sent, (size_t)h->hlen - h->sent};
            iov[1] = (struct iovec){(void *)h->body, h->len};
            msg.msg_iovlen = 2;
        } else {
            iov[0] = (struct iovec){(char *)h->body + (h->sent - (size_t)h->hlen), total - h->sent};
            msg.msg_iovlen = 1;
        }
        ssize_t w = sendmsg(h->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w < 0) return -errno;
        h->sent += (size_t)w;
    }
    return 0;
}

static ssize_t recv_some(struct ki_http *h, char *buf, size_t len) {
    if (h->conn) return ki_tls_read(h->tls, h->conn, buf, len);
    for (;;) {
        ssize_t r = recv(h->fd, buf, len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno == EAGAIN ? -ETIMEDOUT : -errno;
        return r;
    }
}

/* Find header name (case-insensitive) in [start, end); returns its value and its length in *vlen, or NULL. */
static const char *header_value(const char *start, const char *end, const char *name, size_t *vlen) {
    size_t n = strlen(name);
    for (const char *p = start; p < end;) {
        const char *eol = p;
        while (eol + 1 < end && !(eol[0] == '\r' && eol[1] == '\n')) eol++;
        if (eol + 1 >= end) eol = end;
        if ((size_t)(eol - p) > n && !strncasecmp(p, name, n) && p[n] == ':') {
            const char *v = p + n + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            *vlen = (size_t)(ve - v);
            return v;
        }
        p = eol + 2;
    }
    return NULL;
}

/* Every KI-Capture value in [start, end): header lines of that name, each value or comma-separated list. */
static void parse_captures(const char *start, const char *end, struct ki_http_result *res) {
    static const char name[] = "KI-Capture";
    const size_t n = sizeof name - 1;
    for (const char *p = start; p < end;) {
        const char *eol = p;
        while (eol + 1 < end && !(eol[0] == '\r' && eol[1] == '\n')) eol++;
        if (eol + 1 >= end) eol = end;
        if ((size_t)(eol - p) > n && !strncasecmp(p, name, n) && p[n] == ':') {
            for (const char *v = p + n + 1; v < eol;) {
                const char *comma = memchr(v, ',', (size_t)(eol - v));
                const char *ve = comma ? comma : eol;
                while (v < ve && (*v == ' ' || *v == '\t')) v++;
                const char *vt = ve;
                while (vt > v && (vt[-1] == ' ' || vt[-1] == '\t')) vt--;
                struct ki_capture_offer o;
                if (vt > v && res->ncaptures < KI_CAPTURE_OFFERS && ki_capture_parse(v, (size_t)(vt - v), &o) == 0)
                    res->captures[res->ncaptures++] = o;
                else if (vt > v)
                    res->bad_captures++;
                v = comma ? comma + 1 : eol;
            }
        }
        p = eol + 2;
    }
}

/* A non-negative decimal of at most 18 digits (so it cannot overflow) filling [v, v+len); -1 otherwise. */
static long long parse_count(const char *v, size_t len) {
    if (len == 0 || len > 18) return -1;
    char buf[20];
    memcpy(buf, v, len);
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)buf[i])) return -1;
    char *endp;
    errno = 0;
    long long x = strtoll(buf, &endp, 10);
    if (errno || *endp || x < 0) return -1;
    return x;
}

/* KI-Batch-Status: "200, 409, 503": statuses 100..599, separated by commas. */
static int parse_frame_status(const char *v, size_t len, struct ki_http_result *res) {
    const char *p = v, *end = v + len;
    int n = 0;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t')) p++;
        const char *q = p;
        while (q < end && isdigit((unsigned char)*q)) q++;
        long long s = parse_count(p, (size_t)(q - p));
        if (s < 100 || s > 599 || n == KI_HTTP_MAX_FRAMES) return -EPROTO;
        res->frame_status[n++] = (uint16_t)s;
        while (q < end && (*q == ' ' || *q == '\t')) q++;
        if (q < end && *q != ',') return -EPROTO;
        p = q < end ? q + 1 : q;
        if (q < end && p == end) return -EPROTO; /* a trailing comma */
    }
    if (n == 0) return -EPROTO;
    res->nframes = n;
    return 0;
}

int ki_http_parse_head(const char *head, size_t len, struct ki_http_result *res, long long *content_length, int *keep) {
    const char *end = head + len;
    res->retry_after = -1;
    res->nframes = -1;
    res->ncaptures = 0;
    res->bad_captures = 0;
    res->snapshot = 0;
    *content_length = -1;
    *keep = 0;
    /* "HTTP/1.x SSS" */
    if (len < 12 || memcmp(head, "HTTP/1.", 7) || !isdigit((unsigned char)head[7]) || head[8] != ' ') return -EPROTO;
    long long status = parse_count(head + 9, 3);
    if (status < 100 || status > 599 || (len > 12 && head[12] != ' ' && head[12] != '\r')) return -EPROTO;
    res->status = (int)status;
    const char *hdr = head;
    while (hdr + 1 < end && !(hdr[0] == '\r' && hdr[1] == '\n')) hdr++;
    hdr += 2;
    if (hdr > end) hdr = end;
    size_t vl;
    const char *v = header_value(hdr, end, "Retry-After", &vl);
    if (v) {
        /* delta-seconds only (an HTTP date counts as absent); a huge value is clamped, not trusted */
        long long ra = parse_count(v, vl);
        if (ra < 0 && vl > 18) {
            size_t i = 0;
            while (i < vl && isdigit((unsigned char)v[i])) i++;
            if (i == vl) ra = KI_HTTP_RETRY_AFTER_MAX;
        }
        if (ra >= 0) res->retry_after = ra > KI_HTTP_RETRY_AFTER_MAX ? KI_HTTP_RETRY_AFTER_MAX : (int)ra;
    }
    v = header_value(hdr, end, "KI-Batch-Status", &vl);
    if (v && parse_frame_status(v, vl, res) < 0) res->nframes = -2;
    parse_captures(hdr, end, res);
    v = header_value(hdr, end, "KI-Histogram-Snapshot", &vl);
    res->snapshot = v && vl == 1 && v[0] == '1';
    v = header_value(hdr, end, "Connection", &vl);
    *keep = !(v && vl >= 5 && !strncasecmp(v, "close", 5)) && head[7] != '0';
    const char *te = header_value(hdr, end, "Transfer-Encoding", &vl);
    v = header_value(hdr, end, "Content-Length", &vl);
    if (v) {
        *content_length = parse_count(v, vl);
        if (*content_length < 0) return -EPROTO;
    }
    if (te || !v || *content_length > KI_HTTP_BODY_SKIP_MAX) *keep = 0; /* no length to skip to, or too much */
    return 0;
}

/* Read one response: status, Retry-After, KI-Batch-Status, and the body (discarded). */
static int read_response(struct ki_http *h, struct ki_http_result *res, int *keep) {
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have >= sizeof h->resp - 1) return -EPROTO;
        ssize_t r = recv_some(h, h->resp + have, sizeof h->resp - 1 - have);
        if (r < 0) return (int)r;
        if (r == 0) return have ? -EPROTO : -ECONNRESET;
        have += (size_t)r;
        h->resp[have] = '\0';
        end = strstr(h->resp, "\r\n\r\n");
    }
    long long body;
    int rc = ki_http_parse_head(h->resp, (size_t)(end - h->resp), res, &body, keep);
    if (rc < 0) return rc;
    if (!*keep) return 0; /* the connection ends with this answer: its body is not needed */
    long long got = (long long)(have - (size_t)(end + 4 - h->resp));
    if (got > body) {
        *keep = 0; /* more bytes than announced: the stream cannot be trusted for the next answer */
        return 0;
    }
    while (got < body) {
        char skip[1024];
        size_t want = (size_t)(body - got) < sizeof skip ? (size_t)(body - got) : sizeof skip;
        ssize_t r = recv_some(h, skip, want);
        if (r <= 0) {
            *keep = 0;
            return 0;
        }
        got += r;
    }
    return 0;
}

void ki_http_reset(struct ki_http *h) { disconnect(h); }

/* A kept-alive connection the server has closed shows as readable (EOF) while idle. */
static int idle_conn_alive(struct ki_http *h) {
    struct pollfd p = {h->fd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
}

static int transmit(struct ki_http *h) {
    h->reused = h->fd >= 0;
    if (h->reused && !idle_conn_alive(h)) {
        disconnect(h);
        h->reused = 0;
    }
    if (h->fd < 0) {
        int rc = connect_now(h);
        if (rc < 0) return rc;
    }
    h->sent = 0;
    int rc = pump(h);
    if (rc < 0 && h->reused) {
        disconnect(h); /* closed under us: one fresh connection */
        h->reused = 0;
        if ((rc = connect_now(h)) < 0) return rc;
        h->sent = 0;
        rc = pump(h);
    }
    if (rc < 0) disconnect(h);
    return rc;
}

int ki_http_send(struct ki_http *h, const void *body, size_t len, const char *content_type) {
    h->error[0] = '\0';
    h->hlen = snprintf(h->head, sizeof h->head,
                       "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: ki-agent/0.1\r\n"
                       "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                       h->path, h->target, content_type ? content_type : "application/x-ki-batch", len);
    if (h->hlen < 0 || (size_t)h->hlen >= sizeof h->head) return -EINVAL;
    h->body = body;
    h->len = len;
    return transmit(h);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send the rest of the request as the socket takes it, until timeout_ms: 0 when all is sent
 * or an answer is already readable (an early 413, or the server closing), -EAGAIN when time
 * ran out first, or a negative errno. */
static int finish_send(struct ki_http *h, int timeout_ms, int *left_ms) {
    int64_t deadline = now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    while (h->sent < (size_t)h->hlen + h->len) {
        int64_t left = deadline - now_ms();
        struct pollfd p = {h->fd, POLLOUT | POLLIN, 0};
        int r;
        do {
            r = poll(&p, 1, left > 0 ? (int)left : 0);
        } while (r < 0 && errno == EINTR);
        if (r < 0) return -errno;
        if (r == 0) return -EAGAIN;
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) break; /* read what the server says */
        int rc = pump(h);
        if (rc < 0) return rc;
    }
    int64_t left = deadline - now_ms();
    *left_ms = left > 0 ? (int)left : 0;
    return 0;
}

/* The request again, once, on a fresh connection: -EAGAIN (wait for its answer) or a negative errno. */
static int resend_fresh(struct ki_http *h) {
    h->reused = 0;
    int rc = connect_now(h);
    if (rc < 0) return rc;
    h->sent = 0;
    if ((rc = pump(h)) < 0) {
        disconnect(h);
        return rc;
    }
    return -EAGAIN;
}

int ki_http_wait(struct ki_http *h, int timeout_ms, struct ki_http_result *res) {
    if (h->fd < 0) return -ENOTCONN;
    int left_ms = timeout_ms < 0 ? 0 : timeout_ms;
    int rc = finish_send(h, timeout_ms, &left_ms);
    if (rc == -EAGAIN) return rc;
    if (rc < 0) {
        disconnect(h);
        /* The server closed the kept-alive connection as the request went out: send it again once. */
        return h->reused && (rc == -EPIPE || rc == -ECONNRESET) ? resend_fresh(h) : rc;
    }
    int pending = h->conn && ki_tls_pending(h->tls, h->conn) > 0;
    rc = pending ? 0 : wait_fd(h->fd, POLLIN, left_ms);
    if (rc == -ETIMEDOUT) return -EAGAIN;
    if (rc < 0) {
        disconnect(h);
        return rc;
    }
    int keep = 0;
    rc = read_response(h, res, &keep);
    if (rc == 0) {
        if (!keep) disconnect(h);
        return 0;
    }
    disconnect(h);
    /* The server closed the kept-alive connection as the request arrived: send it again once. */
    return h->reused && rc == -ECONNRESET ? resend_fresh(h) : rc;
}

int ki_http_post(struct ki_http *h, const void *body, size_t len, struct ki_http_result *res) {
    int rc = ki_http_send(h, body, len, NULL);
    if (rc < 0) return rc;
    for (int i = 0; i < 2; i++) {
        rc = ki_http_wait(h, h->io_timeout_ms, res);
        if (rc != -EAGAIN) return rc;
    }
    disconnect(h);
    return -ETIMEDOUT;
}
