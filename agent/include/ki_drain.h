/*
 * ki_drain.h - the agent's side of the ring: attach as the single consumer, copy records out.
 *
 * Two phases, so that a record leaves the ring only once it is in the spool:
 * ki_drain_poll copies published records out but keeps their slots
 * (ki_ring_peek); ki_drain_commit, called after the batch is spooled, frees
 * them and moves the ring's tail (ki_ring_commit). An agent killed in between
 * finds the records again at its next start (not those read by ki_drain_poll_keep, the
 * histogram path, which frees slots as it reads them); those an earlier run had already
 * spooled are skipped by position (skip_before, from the spool's newest mark). Pages of the ring the agent has read are handed back to the
 * kernel (MADV_DONTNEED on the consumer's mapping; the shared memory stays),
 * so the ring's size does not count in the agent's resident memory, unless the
 * agent keeps them (ki_drain_keep_pages: the ring fits its memory bound whole).
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
    uint64_t cupti_dropped; /* records CUPTI dropped, as the CUPTI probe counted them in the header */
    uint64_t cupti_refused; /* records the CUPTI probe could not write, likewise */
    uint64_t backlog;   /* records waiting (head - tail), read but not yet freed ones included */
    uint64_t capacity;  /* the ring's slots */
};

/* Attach to ring name as its consumer (creating it with capacity slots when create is set).
 * NULL with a negative errno in *rc (-ENOENT: no such ring) and a message in err.
 * The other functions accept a NULL drain (no ring yet): nothing to read, zero counters. */
struct ki_drain *ki_drain_create(const char *name, int create, uint64_t capacity, int *rc, char *err, size_t errlen);

/* Records at positions below pos are not handed out (an earlier run spooled them),
 * provided the ring is the one created at ring_created_ns. */
void ki_drain_skip_before(struct ki_drain *d, uint64_t ring_created_ns, uint64_t pos);

/* The ring's identity and the position after the last record handed out (for the spool mark). */
uint64_t ki_drain_ring_created_ns(const struct ki_drain *d);
uint64_t ki_drain_read_pos(const struct ki_drain *d);

/* Free the slots of everything read so far (call once it is spooled). */
void ki_drain_commit(struct ki_drain *d);

/* keep 1: pages read stay mapped (no MADV_DONTNEED, no fault when the next lap reads them: the
 * ring then counts whole in the agent's resident memory); keep 0 (the start): pages read are
 * handed back, and a switch from 1 hands back the whole ring's at once. */
void ki_drain_keep_pages(struct ki_drain *d, int keep);

/* Records skipped because an earlier run had spooled them. */
uint64_t ki_drain_skipped(const struct ki_drain *d);

/* Give up the consumer role and unmap; accepts NULL. */
void ki_drain_destroy(struct ki_drain *d);

/* Copy up to max published records into out, keeping their slots until ki_drain_commit; returns the count. */
size_t ki_drain_poll(struct ki_drain *d, struct ki_record *out, size_t max);

/* ki_drain_poll through a filter: up to max records read, handed to keep(arg, recs, n)
 * (ki_kstats_fold) a block at a time as they leave their slots, and only those it keeps (moved
 * to the front of recs) stay in out, so records folded into histograms are not copied into a
 * batch. Unlike ki_drain_poll, each slot is freed as it is read (ki_ring_consume_keep): a
 * folded record needs nothing more from the ring, and the histogram path already lets kept ones
 * wait in memory with their slots freed (batch.c, hold_kept); ki_drain_commit then moves tail
 * without a second pass over the slots. An agent killed before that commit does not read these
 * records again. *read is the number read (skipped ones, spooled by an earlier run, not counted
 * and not handed to keep); returns the number kept. */
size_t ki_drain_poll_keep(struct ki_drain *d, struct ki_record *out, size_t max,
                          size_t (*keep)(void *arg, struct ki_record *recs, size_t n), void *arg, size_t *read);

/* The ring header's counters. */
void ki_drain_stats(const struct ki_drain *d, struct ki_drain_stats *out);

#endif /* KI_DRAIN_H */
