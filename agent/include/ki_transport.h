/*
 * ki_transport.h - HTTP/1.1 POST of one batch over a kept-alive TCP connection.
 *
 * http:// or https:// (TLS through a dlopen'ed libssl, ki_tls.h: verified
 * against the system trust store or ca_file). Timeouts bound every step, so a
 * silent collector cannot stall the drain loop for long.
 */
#ifndef KI_TRANSPORT_H
#define KI_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ki_capture.h"
#include "ki_wire.h"

struct ki_http;

#define KI_HTTP_MAX_FRAMES 64          /* most frames one request carries (KI-Batch-Status entries) */
#define KI_HTTP_RETRY_AFTER_MAX 86400  /* Retry-After values are clamped to this many seconds */
#define KI_HTTP_BODY_SKIP_MAX (1 << 20) /* an answer body longer than this ends the connection instead */

/* The answer to one POST. */
struct ki_http_result {
    int status;      /* HTTP status code */
    int retry_after; /* Retry-After in seconds (delta-seconds only, clamped to [0, KI_HTTP_RETRY_AFTER_MAX]), -1 when absent or invalid */
    int nframes;     /* entries in frame_status: -1 without a KI-Batch-Status header, -2 when it was malformed */
    uint16_t frame_status[KI_HTTP_MAX_FRAMES]; /* KI-Batch-Status: one status per frame, in body order */
    int ncaptures;   /* entries in captures: the KI-Capture values (one per header line or comma-separated) */
    int bad_captures; /* KI-Capture values that did not parse, or beyond KI_CAPTURE_OFFERS: ignored */
    struct ki_capture_offer captures[KI_CAPTURE_OFFERS]; /* capture windows the collector asks for */
    int snapshot;    /* KI-Histogram-Snapshot: 1: the collector lacked a base, send histogram snapshots */
};

/* Parse a response head (status line and headers, up to but excluding the blank line):
 * fills res, *content_length (-1 when absent) and *keep (the connection stays usable).
 * Every number is checked (digits only, no overflow, in range); returns 0 or -EPROTO.
 * Pure: exposed for the fuzz test. */
int ki_http_parse_head(const char *head, size_t len, struct ki_http_result *res, long long *content_length, int *keep);

/* Parse url (http[s]://host[:port][/prefix]) and prepare; connects lazily. ca_file
 * ("" or NULL: system trust store) is used for https. NULL with err on a bad URL,
 * missing libssl or ENOMEM. */
struct ki_http *ki_http_create(const char *url, const char *path, const char *ca_file, int connect_timeout_ms,
                               int io_timeout_ms, char *err, size_t errlen);

/* Why the last failed call failed, in words (TLS verification, ...), or "" when errno says it all. */
const char *ki_http_error(const struct ki_http *h);

/* Close the connection and free; accepts NULL. */
void ki_http_destroy(struct ki_http *h);

/* Send a POST of body (which must stay valid until the answer is in); 0 or a
 * negative errno (connection refused, reset, timed out). content_type NULL:
 * application/x-ki-batch (one frame). */
int ki_http_send(struct ki_http *h, const void *body, size_t len, const char *content_type);

/* Wait up to timeout_ms for the answer to the request sent: 0 with the answer in
 * res, -EAGAIN when it has not come yet (call again), or a negative errno. A
 * kept-alive connection the server had closed is reopened and the request
 * resent once, transparently. */
int ki_http_wait(struct ki_http *h, int timeout_ms, struct ki_http_result *res);

/* Send and wait up to io_timeout_ms: the two above in one call. */
int ki_http_post(struct ki_http *h, const void *body, size_t len, struct ki_http_result *res);

/* Drop the connection (after a timeout, so a late answer is never taken for the next request's). */
void ki_http_reset(struct ki_http *h);

/* "host:port" for logs. */
const char *ki_http_target(const struct ki_http *h);

#endif /* KI_TRANSPORT_H */
