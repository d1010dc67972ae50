/*
 * ki_status.h - what a collector's answer means for the batches of a request: the one classifier
 * (status.c), used for every batch, the names batch and requests of several batches.
 *
 * As OpenTelemetry's consumererror: a batch is settled (stored, or a duplicate), refused for good
 * (permanent: it can never be stored, it is set aside), or to be sent again (retryable); two
 * answers ask for something first: the agent's key (401/403) or the names it left out (424).
 * The statuses are the collector's (docs/wire.md, "Statuses").
 */
#ifndef KI_STATUS_H
#define KI_STATUS_H

#include "ki_transport.h"

enum ki_status_class {
    KI_STATUS_STORED,    /* 2xx, and 409: the collector has the batch */
    KI_STATUS_AUTH,      /* 401, 403: wrong key, or the agent unknown or revoked */
    KI_STATUS_NAMES,     /* 424: the collector lacks names the batch left out (docs/wire.md) */
    KI_STATUS_RETRY,     /* 408, 429, 5xx, and anything not 2xx or 4xx: try again later */
    KI_STATUS_PERMANENT, /* any other 4xx: this batch can never be stored */
};

/* One batch's status. */
enum ki_status_class ki_status_classify(int status);

/* What an answer (or its absence) to a request of n batches says before each batch is settled. */
enum ki_status_answer {
    KI_ANSWER_EACH,    /* settle each batch by ki_status_classify(ki_status_of(res, n, i)) */
    KI_ANSWER_NONE,    /* no answer (rc < 0: network, timeout): every batch retried with backoff */
    KI_ANSWER_UNSPLIT, /* several batches, an answer that does not settle each (a 2xx without
                          KI-Batch-Status, or one whose count differs): retried with backoff,
                          one batch per request for KI_SEND_SINGLE_NS */
    KI_ANSWER_SINGLE,  /* several batches refused as a whole without KI-Batch-Status (4xx other than
                          401/403/408/429: an older collector, a proxy): sent again at once, one
                          batch per request for KI_SEND_SINGLE_NS */
};

/* rc: ki_http_wait's (0: res holds the answer). */
enum ki_status_answer ki_status_answer(int rc, const struct ki_http_result *res, int n);

/* Batch i's status in an answer of class KI_ANSWER_EACH to n batches: its KI-Batch-Status entry
 * when the request had several and the header one per batch, else the answer's status. */
int ki_status_of(const struct ki_http_result *res, int n, int i);

#endif /* KI_STATUS_H */
