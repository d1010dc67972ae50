/*
 * ki_transport.h - HTTP/1.1 POST of one batch over a kept-alive TCP connection.
 *
 * Plain http:// only for now; an https:// collector URL is refused at start
 * with a clear message (TLS is planned: docs/agent.md). Timeouts bound every
 * step, so a silent collector cannot stall the drain loop for long.
 */
#ifndef KI_TRANSPORT_H
#define KI_TRANSPORT_H

#include <stddef.h>

struct ki_http;

/* The answer to one POST. */
struct ki_http_result {
    int status;      /* HTTP status code */
    int retry_after; /* Retry-After in seconds, -1 when absent */
};

/* Parse url (http://host[:port][/prefix]) and prepare; connects lazily. NULL with err on a bad URL or ENOMEM. */
struct ki_http *ki_http_create(const char *url, const char *path, int connect_timeout_ms, int io_timeout_ms, char *err,
                               size_t errlen);

/* Close the connection and free; accepts NULL. */
void ki_http_destroy(struct ki_http *h);

/* POST body; 0 with the answer in res, or a negative errno when no answer came
 * (connection refused, reset, timed out). A dead kept-alive connection is
 * reopened once transparently. */
int ki_http_post(struct ki_http *h, const void *body, size_t len, struct ki_http_result *res);

/* "host:port" for logs. */
const char *ki_http_target(const struct ki_http *h);

#endif /* KI_TRANSPORT_H */
