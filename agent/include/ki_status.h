/*
 * ki_status.h - what a collector's HTTP status means for a batch: the one classifier (status.c).
 *
 * As OpenTelemetry's consumererror: a batch is settled (stored, or a duplicate), refused for good
 * (permanent: it can never be stored, it is set aside), or to be sent again (retryable); two
 * answers ask for something first: the agent's key (401/403) or the names it left out (424).
 */
#ifndef KI_STATUS_H
#define KI_STATUS_H

enum ki_status_class {
    KI_STATUS_STORED,    /* 2xx, and 409: the collector has the batch */
    KI_STATUS_AUTH,      /* 401, 403: wrong key, or the agent unknown or revoked */
    KI_STATUS_NAMES,     /* 424: the collector lacks names the batch left out (docs/wire.md) */
    KI_STATUS_RETRY,     /* 408, 429, 5xx, and anything not 2xx or 4xx: try again later */
    KI_STATUS_PERMANENT, /* any other 4xx: this batch can never be stored */
};

enum ki_status_class ki_status_classify(int status);

#endif /* KI_STATUS_H */
