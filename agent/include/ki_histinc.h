/*
 * ki_histinc.h - what the agent last shipped of each histogram, and increments against it
 * (docs/wire.md, "Increments": wire body version 4).
 *
 * A cumulative histogram's export grows with the agent's uptime (its counts grow and the long
 * tail keeps opening buckets); an increment carries only the zero count and the buckets that grew
 * since the series' previous export. To compute one, the agent keeps that previous export (its
 * base) per slot: populated bucket indexes and counts as varints, in one arena written as a log
 * (a new base is appended, the old one becomes garbage) and compacted in place when the garbage
 * outweighs the live bases. No allocation after create.
 *
 * A base is kept only for a histogram of at least KI_HISTINC_MIN_BUCKETS populated buckets and
 * KI_HISTINC_MIN_COUNT observations: a smaller or quieter one is sent cumulative every time (its
 * counts are small, so an increment would save a few bytes, and its base would cost memory:
 * bench-histogram's 10,000 kernel names of ~200 kernels each would add ~0.3 MB to the agent's
 * peak, over its 5 MB target).
 * When the arena cannot take a base even after compaction, that slot goes without (its next
 * export is a snapshot again) and the refusal is counted.
 *
 * Not thread-safe: the drain loop owns it (through ki_kstats).
 */
#ifndef KI_HISTINC_H
#define KI_HISTINC_H

#include <stddef.h>
#include <stdint.h>

#include "ki_histogram.h"

#define KI_HISTINC_MIN_BUCKETS 8
#define KI_HISTINC_MIN_COUNT 4096

struct ki_histinc;

struct ki_histinc_stats {
    uint64_t bases;       /* slots holding a base */
    uint64_t live_bytes;  /* bytes of those bases in the arena */
    uint64_t used_bytes;  /* arena bytes written (live and garbage) */
    uint64_t compactions; /* times the arena was compacted */
    uint64_t refused;     /* bases not kept for want of room */
};

/* Bases for max_keys slots of histograms of up to room elements per export array
 * (ki_histtab_export_room), in an arena of arena_bytes (pages touched only as used).
 * NULL with errno EINVAL or ENOMEM. */
struct ki_histinc *ki_histinc_create(uint32_t max_keys, size_t room, size_t arena_bytes);

/* Free; accepts NULL. */
void ki_histinc_destroy(struct ki_histinc *b);

/* Forget slot's base (its key was evicted: the slot's next histogram is another key's). */
void ki_histinc_forget(struct ki_histinc *b, uint32_t slot);

/* Forget every base: each histogram's next export is a snapshot (after a failed request, a
 * reconnect, a collector's KI-Histogram-Snapshot, or every histogram_snapshot_s). */
void ki_histinc_forget_all(struct ki_histinc *b);

/* cur is slot's cumulative export. When slot holds a base of the same schema and zero threshold,
 * write the increment over it into inc (its arrays provided by the caller, room elements each;
 * count and sum stay cumulative), set *count_inc = cur->count - the base's count and return 1;
 * otherwise return 0 (ship cur). Either way cur becomes slot's base (when it has enough buckets and
 * the arena has room). */
int ki_histinc_next(struct ki_histinc *b, uint32_t slot, const struct ki_histogram_export *cur,
                    struct ki_histogram_export *inc, uint64_t *count_inc);

void ki_histinc_stats(const struct ki_histinc *b, struct ki_histinc_stats *out);

#endif /* KI_HISTINC_H */
