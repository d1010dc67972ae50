/*
 * ki_tls.h - TLS for the transport through a dlopen'ed libssl (OpenSSL 1.1 or 3).
 *
 * The binary does not link libssl: an agent that talks plain http never loads
 * it (and never pays its resident memory). The server certificate is verified
 * against the system's trust store, or against ca_file, and its name against
 * the collector's host name.
 */
#ifndef KI_TLS_H
#define KI_TLS_H

#include <stddef.h>
#include <sys/types.h>

struct ki_tls;      /* the library and one client context */
struct ki_tls_conn; /* one TLS connection */

/* Load libssl and make a verifying client context (TLS 1.2 or newer). NULL with err. */
struct ki_tls *ki_tls_create(const char *ca_file, char *err, size_t errlen);

/* Free the context and unload; accepts NULL. */
void ki_tls_destroy(struct ki_tls *t);

/* Handshake on a connected blocking socket (its timeouts bound it), verifying host;
 * later reads and writes wait at most timeout_ms for the socket. NULL with err on failure. */
struct ki_tls_conn *ki_tls_connect(struct ki_tls *t, int fd, const char *host, int timeout_ms, char *err,
                                   size_t errlen);

/* Close the TLS session (not the socket); accepts NULL. */
void ki_tls_close(struct ki_tls *t, struct ki_tls_conn *c);

/* Write all of buf; 0 or a negative errno. */
int ki_tls_write(struct ki_tls *t, struct ki_tls_conn *c, const void *buf, size_t len);

/* Read up to len bytes: the count, 0 at the end of the stream, or a negative errno. */
ssize_t ki_tls_read(struct ki_tls *t, struct ki_tls_conn *c, void *buf, size_t len);

/* Bytes already decrypted and waiting (a poll on the socket would not see them). */
int ki_tls_pending(struct ki_tls *t, struct ki_tls_conn *c);

#endif /* KI_TLS_H */
