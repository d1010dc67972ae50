/*
 * ki_send.h - shipping the spool (send.c): requests of the oldest spooled batches (several per
 * request while a backlog waits), one in flight at a time, each batch settled by the collector's
 * status through the one classifier (ki_status.h): removed, retried with backoff, dead-lettered,
 * re-sealed under the new key, or sent again behind a names batch.
 */
#ifndef KI_SEND_H
#define KI_SEND_H

#include <stdint.h>

#include "ki_agent_state.h"

/* After a refused request of several batches, send one per request this long. */
#define KI_SEND_SINGLE_NS (300 * KI_NS_PER_S)
#define KI_SEND_FRAMES_CONTENT_TYPE "application/x-ki-batches"

/* Allocate the request buffer (max(frame_cap, request_max_kb)); 0, or -1 with err. */
int ki_send_create(struct ki_agent *a, char *err, size_t errlen);
void ki_send_destroy(struct ki_agent *a);

/* Send spooled batches oldest first, one request in flight at a time, for up to budget_ns (waiting
 * for an answer never holds the next drain up for longer). */
void ki_send_spool(struct ki_agent *a, uint64_t budget_ns);

/* The wait before the next try: Retry-After (retry_after_s >= 0) clamped to hi_ns plus up to 10%
 * jitter, else *backoff_ns doubled from lo_ns up to hi_ns with "equal jitter" (half fixed, half
 * random). random: a random number. Pure. */
uint64_t ki_send_retry_delay(uint64_t *backoff_ns, uint64_t lo_ns, uint64_t hi_ns, int retry_after_s, uint64_t random);

/* Nothing is sent for ki_send_retry_delay from now (the configured backoff, a's jitter). */
void ki_send_backoff(struct ki_agent *a, int retry_after_s);

/* SIGHUP: re-read the key file; batches sealed under the old key are re-sealed when refused;
 * ends an authentication pause. */
void ki_send_reload_key(struct ki_agent *a);

#endif /* KI_SEND_H */
