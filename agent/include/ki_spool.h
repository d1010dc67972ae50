/*
 * ki_spool.h - the bounded on-disk spool of sealed batches (docs/agent.md, "Spool").
 *
 * Every sealed batch is written here before it is sent and removed when the
 * collector settles it, so a batch survives a collector outage and an agent
 * SIGKILL. One file per batch, named <epoch>-<seq>.kib (hex, fixed width, so
 * names sort in send order); written under a temporary name and renamed into
 * place, so a crash never leaves half a batch under a real name. Within an
 * epoch batches are contiguous, so the spool is indexed by a few runs
 * (epoch, first seq, end seq): memory does not grow with its size.
 */
#ifndef KI_SPOOL_H
#define KI_SPOOL_H

#include <stddef.h>
#include <stdint.h>

#define KI_SPOOL_MAX_RUNS 256u /* epochs with batches on disk; older ones are dropped past this */

struct ki_spool_id {
    uint32_t epoch; /* batch epoch */
    uint64_t seq;   /* batch sequence number */
};

struct ki_spool_run {
    uint32_t epoch; /* run epoch */
    uint64_t first; /* oldest seq that may still be on disk */
    uint64_t end;   /* one past the newest seq */
};

/* Which ring records a spooled batch holds, kept in a 24-byte trailer after the frame
 * (never sent): after a SIGKILL the agent skips ring records an earlier run spooled. */
struct ki_spool_mark {
    uint64_t ring_created_ns; /* identity of the ring (its header's created_ns) */
    uint64_t next_pos;        /* one past the last ring position the batch covers */
};

struct ki_spool_stats {
    uint64_t bytes;           /* bytes on disk now */
    uint64_t batches;         /* batches on disk now */
    uint64_t dropped_batches; /* batches dropped to stay within the bound */
    uint64_t dropped_records; /* records in them */
};

struct ki_spool;

/* Open (creating) the spool directory and index what an earlier run left. dead_max_bytes bounds
 * the dead-letter file (ki_spool_dead_letter). NULL with err on failure. */
struct ki_spool *ki_spool_create(const char *dir, uint64_t max_bytes, uint64_t dead_max_bytes, int do_fsync, char *err,
                                 size_t errlen);

/* Close; accepts NULL. Batches stay on disk for the next run. */
void ki_spool_destroy(struct ki_spool *sp);

/* Store a sealed frame with its ring mark, first dropping the oldest batches (counted)
 * until it fits. A frame larger than the whole bound is itself dropped (counted).
 * Returns 0 or a negative errno. */
int ki_spool_put(struct ki_spool *sp, const uint8_t *frame, size_t len, const struct ki_spool_mark *mark);

/* The mark of the newest batch on disk when the spool was opened; -ENOENT if none. */
int ki_spool_last_mark(const struct ki_spool *sp, struct ki_spool_mark *mark);

/* Copy the oldest batch's frame into buf. Returns 0, -ENOENT when the spool is empty,
 * -EMSGSIZE when it does not fit or -EBADMSG when the file is damaged (its length is not the
 * header's; the caller removes it). */
int ki_spool_peek(struct ki_spool *sp, uint8_t *buf, size_t cap, size_t *len, struct ki_spool_id *id);

/* Like ki_spool_peek, for the oldest batch after `after` (building a request of several batches).
 * Holes (batches already removed) are skipped. */
int ki_spool_peek_after(struct ki_spool *sp, struct ki_spool_id after, uint8_t *buf, size_t cap, size_t *len,
                        struct ki_spool_id *id);

/* Move a batch the collector refused for good to the dead-letter file <dir>/dead-letter and remove it
 * from the spool. Each entry: "KIDL", u16 status, u16 0, u64 unix time ns, u32 frame length, u32 0,
 * then the frame (docs/agent.md). When the file would pass dead_max_bytes it is renamed to
 * dead-letter.1 (replacing the older one) and a new one started. The batch leaves the spool even
 * when the entry cannot be written (returns that error; -EFBIG: larger than the bound). */
int ki_spool_dead_letter(struct ki_spool *sp, struct ki_spool_id id, const uint8_t *frame, size_t len, int status,
                         uint64_t now_ns);

/* Remove a batch (normally the one peek returned). Returns 0 or a negative errno. */
int ki_spool_remove(struct ki_spool *sp, struct ki_spool_id id);

/* Current size and drop counts. */
void ki_spool_stats(const struct ki_spool *sp, struct ki_spool_stats *out);

#endif /* KI_SPOOL_H */
