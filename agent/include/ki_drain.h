/*
 * ki_drain.h - the agent's side of the ring: attach as the single consumer, copy records out.
 *
 * A consumed record's slot is free for producers at once, so the agent writes
 * what it consumed to the spool within the same tick (docs/agent.md,
 * "Delivery"). Pages of the ring the agent has read are handed back to the
 * kernel (MADV_DONTNEED on the consumer's mapping; the shared memory stays),
 * so the ring's size does not count in the agent's resident memory.
 */
#ifndef KI_DRAIN_H
#define KI_DRAIN_H

#include <stddef.h>
#include <stdint.h>

struct ki_record;
struct ki_drain;

/* Ring-wide counters from the ring header. */
struct ki_drain_stats {
    uint64_t dropped;   /* producers found the ring full */
    uint64_t torn;      /* records failing their checksum */
    uint64_t abandoned; /* slots never published */
    uint64_t lost;      /* late publications refused */
    uint64_t backlog;   /* records waiting (head - tail) */
};

/* Attach to ring name as its consumer (creating it with capacity slots when create is set). NULL with err. */
struct ki_drain *ki_drain_create(const char *name, int create, uint64_t capacity, char *err, size_t errlen);

/* Give up the consumer role and unmap; accepts NULL. */
void ki_drain_destroy(struct ki_drain *d);

/* Copy up to max published records into out; returns the count. */
size_t ki_drain_poll(struct ki_drain *d, struct ki_record *out, size_t max);

/* The ring header's counters. */
void ki_drain_stats(const struct ki_drain *d, struct ki_drain_stats *out);

#endif /* KI_DRAIN_H */
