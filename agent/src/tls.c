/* tls.c - libssl loaded at run time (ki_tls.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_tls.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few OpenSSL constants used (stable across 1.1 and 3). */
#define SSL_VERIFY_PEER 1
#define SSL_CTRL_SET_TLSEXT_HOSTNAME 55
#define SSL_CTRL_SET_MIN_PROTO_VERSION 123
#define TLSEXT_NAMETYPE_host_name 0
#define TLS1_2_VERSION 0x0303
#define SSL_ERROR_WANT_READ 2
#define SSL_ERROR_WANT_WRITE 3
#define SSL_ERROR_SYSCALL 5
#define SSL_ERROR_ZERO_RETURN 6

struct ki_tls {
    void *lib;  /* dlopen handle of libssl */
    void *ctx;  /* SSL_CTX * */
    int (*init)(uint64_t, const void *);
    const void *(*client_method)(void);
    void *(*ctx_new)(const void *);
    void (*ctx_free)(void *);
    int (*ctx_default_paths)(void *);
    int (*ctx_load_locations)(void *, const char *, const char *);
    void (*ctx_set_verify)(void *, int, void *);
    long (*ctx_ctrl)(void *, int, long, void *);
    void *(*ssl_new)(void *);
    void (*ssl_free)(void *);
    int (*set_fd)(void *, int);
    int (*set1_host)(void *, const char *);
    long (*ssl_ctrl)(void *, int, long, void *);
    int (*ssl_connect)(void *);
    int (*ssl_write)(void *, const void *, int);
    int (*ssl_read)(void *, void *, int);
    int (*ssl_pending)(const void *);
    int (*get_error)(const void *, int);
    int (*ssl_shutdown)(void *);
    long (*verify_result)(const void *);
    const char *(*verify_string)(long);
};

struct ki_tls_conn {
    void *ssl;      /* SSL * */
    int fd;         /* its socket */
    int timeout_ms; /* how long one read or write may wait for the socket */
};

/* After WANT_READ / WANT_WRITE (a post-handshake message such as a session
 * ticket was processed, or the socket had nothing yet): wait, then retry. */
static int wait_again(struct ki_tls_conn *c, int want) {
    struct pollfd p = {c->fd, (short)(want == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN), 0};
    int r;
    do {
        r = poll(&p, 1, c->timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0 ? 0 : -ETIMEDOUT;
}

static int load(struct ki_tls *t, char *err, size_t errlen) {
    static const char *const NAMES[] = {"libssl.so.3", "libssl.so.1.1", "libssl.so"};
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0] && !t->lib; i++) t->lib = dlopen(NAMES[i], RTLD_NOW | RTLD_LOCAL);
    if (!t->lib) {
        snprintf(err, errlen, "https needs libssl (OpenSSL 1.1 or 3), which cannot be loaded: %s", dlerror());
        return -ENOENT;
    }
#define SYM(field, name)                                                                   \
    do {                                                                                   \
        *(void **)(&t->field) = dlsym(t->lib, name);                                       \
        if (!t->field) {                                                                   \
            snprintf(err, errlen, "libssl lacks %s: OpenSSL 1.1 or newer is needed", name); \
            return -ENOSYS;                                                                \
        }                                                                                  \
    } while (0)
    SYM(init, "OPENSSL_init_ssl");
    SYM(client_method, "TLS_client_method");
    SYM(ctx_new, "SSL_CTX_new");
    SYM(ctx_free, "SSL_CTX_free");
    SYM(ctx_default_paths, "SSL_CTX_set_default_verify_paths");
    SYM(ctx_load_locations, "SSL_CTX_load_verify_locations");
    SYM(ctx_set_verify, "SSL_CTX_set_verify");
    SYM(ctx_ctrl, "SSL_CTX_ctrl");
    SYM(ssl_new, "SSL_new");
    SYM(ssl_free, "SSL_free");
    SYM(set_fd, "SSL_set_fd");
    SYM(set1_host, "SSL_set1_host");
    SYM(ssl_ctrl, "SSL_ctrl");
    SYM(ssl_connect, "SSL_connect");
    SYM(ssl_write, "SSL_write");
    SYM(ssl_read, "SSL_read");
    SYM(ssl_pending, "SSL_pending");
    SYM(get_error, "SSL_get_error");
    SYM(ssl_shutdown, "SSL_shutdown");
    SYM(verify_result, "SSL_get_verify_result");
    SYM(verify_string, "X509_verify_cert_error_string");
#undef SYM
    return 0;
}

struct ki_tls *ki_tls_create(const char *ca_file, char *err, size_t errlen) {
    struct ki_tls *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (load(t, err, errlen) < 0) {
        ki_tls_destroy(t);
        return NULL;
    }
    t->init(0, NULL);
    t->ctx = t->ctx_new(t->client_method());
    if (!t->ctx) {
        snprintf(err, errlen, "cannot create a TLS context");
        ki_tls_destroy(t);
        return NULL;
    }
    t->ctx_ctrl(t->ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
    t->ctx_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    int ok = ca_file && *ca_file ? t->ctx_load_locations(t->ctx, ca_file, NULL) : t->ctx_default_paths(t->ctx);
    if (ok != 1) {
        snprintf(err, errlen, "cannot load trusted certificates%s%s", ca_file && *ca_file ? " from " : "",
                 ca_file && *ca_file ? ca_file : " (system defaults)");
        ki_tls_destroy(t);
        return NULL;
    }
    return t;
}

void ki_tls_destroy(struct ki_tls *t) {
    if (!t) return;
    if (t->ctx) t->ctx_free(t->ctx);
    if (t->lib) dlclose(t->lib);
    free(t);
}

struct ki_tls_conn *ki_tls_connect(struct ki_tls *t, int fd, const char *host, int timeout_ms, char *err,
                                   size_t errlen) {
    struct ki_tls_conn *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->fd = fd;
    c->timeout_ms = timeout_ms;
    c->ssl = t->ssl_new(t->ctx);
    if (!c->ssl || t->set_fd(c->ssl, fd) != 1 || t->set1_host(c->ssl, host) != 1) {
        snprintf(err, errlen, "cannot set up a TLS session");
        ki_tls_close(t, c);
        return NULL;
    }
    t->ssl_ctrl(c->ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, (void *)host);
    int r = t->ssl_connect(c->ssl);
    if (r != 1) {
        long v = t->verify_result(c->ssl);
        if (v != 0)
            snprintf(err, errlen, "TLS: the collector's certificate is not trusted: %s", t->verify_string(v));
        else
            snprintf(err, errlen, "TLS handshake failed (error %d)", t->get_error(c->ssl, r));
        ki_tls_close(t, c);
        return NULL;
    }
    return c;
}

void ki_tls_close(struct ki_tls *t, struct ki_tls_conn *c) {
    if (!c) return;
    if (c->ssl) t->ssl_free(c->ssl);
    free(c);
}

int ki_tls_write(struct ki_tls *t, struct ki_tls_conn *c, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int w = t->ssl_write(c->ssl, p, chunk);
        if (w <= 0) {
            int e = t->get_error(c->ssl, w);
            if (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ) return -ECONNRESET;
            if (wait_again(c, e) < 0) return -ETIMEDOUT;
            continue;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

ssize_t ki_tls_read(struct ki_tls *t, struct ki_tls_conn *c, void *buf, size_t len) {
    for (;;) {
        int r = t->ssl_read(c->ssl, buf, len > (1u << 30) ? (1 << 30) : (int)len);
        if (r > 0) return r;
        int e = t->get_error(c->ssl, r);
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            if (wait_again(c, e) < 0) return -ETIMEDOUT;
            continue;
        }
        if (e == SSL_ERROR_SYSCALL && r == 0) return 0; /* the peer closed without close_notify */
        return -ECONNRESET;
    }
}

int ki_tls_pending(struct ki_tls *t, struct ki_tls_conn *c) { return t->ssl_pending(c->ssl); }
