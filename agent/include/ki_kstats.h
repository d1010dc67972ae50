/*
 * ki_kstats.h - kernel statistics in the drain loop: records fold into native histograms
 * (ki_histogram.h), and only the raw kernel spans the timelines need are kept.
 *
 * The agent hands the records it reads to ki_kstats_fold (ki_kstats_feed), a block at a time, which
 *   - adds every KERNEL record's duration (end_ns - ts_ns, seconds) to the histogram of
 *     (pid, gpu, stream, producer, kernel name id): kernel_duration_seconds;
 *   - every COLLECTIVE record's duration_ns (seconds) to the histogram of (gpu, op):
 *     nccl_op_duration_seconds;
 *   - every MEMOP record of kind memcpy (5) its bytes to the histogram of (gpu):
 *     memcpy_bytes;
 *   - and removes from the batch every KERNEL record it does not keep. Kept are: spans
 *     slower than their histogram's running tail quantile (span_tail_quantile, default
 *     p99, from the histogram as of its last export, once it holds tail_min_count
 *     observations; at most span_tail_rate per second, each candidate kept with probability
 *     span_tail_rate / the previous second's candidates, so a capped tail spreads over the
 *     second), a uniform sample of the rest
 *     (span_sample_rate per second, as a probability set from the previous second's
 *     kernel rate, and never more than twice the rate in one second), every span of a GPU inside a capture window (ki_kstats_capture:
 *     the timeline's KI-Capture hook, it bypasses both limits), and every FAILED one.
 *     Every other record type is kept (errors included).
 * Every interval ki_kstats_encode writes the histograms that changed since their last
 * export as a HISTOGRAMS section (docs/wire.md), cut into parts of at most section_max
 * bytes when there are many (ki_kstats_pending says a part is left). With snapshot_ns set, a
 * histogram that holds a base (ki_histinc.h) is written as an increment over its previous
 * export, and as a snapshot at least every snapshot_ns and after ki_kstats_snapshot.
 *
 * With idle_ns set, the start of an export at least idle_ns after the previous sweep evicts the
 * keys whose histograms shipped no change since that sweep and hold nothing unshipped
 * (ki_histtab_evict): a key is evicted between idle_ns and twice that (plus an interval) after its
 * last change, never before that change was exported. A key seen again later is a new series: its
 * first export is flagged a counter reset (0x01), as after an agent restart. No clock of its own:
 * the exports' monotonic times (ki_kstats_want).
 *
 * Everything is allocated by ki_kstats_create; feed and encode allocate nothing.
 * Not thread-safe: the drain loop owns it.
 */
#ifndef KI_KSTATS_H
#define KI_KSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "ki_histogram.h"

struct ki_record;
struct ki_kstats;

#define KI_KSTATS_MAX_GPUS 64 /* capture windows are per GPU index below this */

struct ki_kstats_config {
    struct ki_histogram_config hist; /* schema, bucket and key limits */
    uint64_t interval_ns;            /* histogram export period */
    uint32_t span_sample_rate;       /* uniform kernel spans kept per second (0: none) */
    uint32_t span_tail_rate;         /* most tail spans kept per second */
    double tail_quantile;            /* spans above this quantile of their kernel are kept */
    uint32_t tail_min_count;         /* observations a histogram needs before its tail counts */
    size_t section_max;              /* bytes of one HISTOGRAMS section (>= 4096) */
    uint64_t snapshot_ns;            /* increments (wire body version 4) with a snapshot of every histogram
                                      * at least this often; 0: cumulative histograms only (version 3) */
    size_t base_bytes;               /* arena of the increments' bases (ki_histinc.h); 0: a default */
    uint64_t idle_ns;                /* evict a key that shipped no change for this long (0: never; below) */
};

struct ki_kstats_stats {
    uint64_t aggregated;   /* records folded into histograms (all three kinds) */
    uint64_t spans_tail;   /* kernel spans kept as tail */
    uint64_t spans_sampled; /* kernel spans kept by the uniform sample */
    uint64_t spans_captured; /* kernel spans kept by a capture window (or FAILED) */
    uint64_t histograms_exported; /* histogram samples written into sections */
    uint64_t increments_exported; /* of them, increments (body version 4) */
    struct ki_histtab_stats table; /* the histogram table's counters */
};

/* NULL with errno EINVAL (bad setting) or ENOMEM. */
struct ki_kstats *ki_kstats_create(const struct ki_kstats_config *cfg);

/* Free; accepts NULL. */
void ki_kstats_destroy(struct ki_kstats *ks);

/* Fold recs[0..n) into the histograms and remove the kernel spans not kept (in place, order
 * kept). Returns the records left. */
size_t ki_kstats_feed(struct ki_kstats *ks, struct ki_record *recs, size_t n);

/* ki_kstats_feed with arg the ki_kstats: the keep filter of ki_drain_poll_keep, so that the
 * agent reads records from the ring straight into the histograms, a block at a time. */
size_t ki_kstats_fold(void *arg, struct ki_record *recs, size_t n);

/* Whether a HISTOGRAMS section should go into the next batch: an export is due at mono_ns
 * (it starts one, stamped real_ns) or a part of the last one is left. */
int ki_kstats_want(struct ki_kstats *ks, uint64_t mono_ns, uint64_t real_ns);

/* Write the next part of the export (the section's content, without tag and length) into out.
 * *len = 0 when no histogram changed; *ts_ns is the export's time. name (may be NULL) is called
 * with (arg, producer, name id) of every kernel histogram written, so the batch can ship its
 * name. Returns 0 or -ENOBUFS (cap below ki_kstats_section_bound). */
int ki_kstats_encode(struct ki_kstats *ks, uint8_t *out, size_t cap, size_t *len, uint64_t *ts_ns,
                     void (*name)(void *arg, uint32_t producer, uint32_t id), void *arg);

/* Whether HISTOGRAMS sections hold increments: the batch body is version 4 (else 3). */
int ki_kstats_increments(const struct ki_kstats *ks);

/* Every histogram's next export is a snapshot (cumulative): after a failed request or a reconnect
 * (all 0: the histograms that change); with all, the next export also re-sends every histogram that
 * did not change, as a snapshot: after a collector's KI-Histogram-Snapshot or a batch refused for
 * good, an increment that was left out may have been an idle histogram's last export
 * (docs/wire.md, "Increments"). */
void ki_kstats_snapshot(struct ki_kstats *ks, int all);

/* While hold is set, exports skip the sweep for idle keys (it runs at the first export after):
 * the agent holds it while its spool is not empty, since a batch still to be settled may carry an
 * idle key's last change, and only a key still in the table can be re-sent if that batch is
 * refused for good (docs/agent.md, "Idle keys are evicted"). */
void ki_kstats_hold_sweep(struct ki_kstats *ks, int hold);

/* Whether part of the current export is still to be encoded. */
int ki_kstats_pending(const struct ki_kstats *ks);

/* Bytes ki_kstats_encode may write at most. */
size_t ki_kstats_section_bound(const struct ki_kstats *ks);

/* Keep every kernel span of gpu (or of every GPU when gpu < 0) whose start is before
 * until_real_ns: the capture-window hook (docs/wire.md, KI-Capture). */
void ki_kstats_capture(struct ki_kstats *ks, int gpu, uint64_t until_real_ns);

void ki_kstats_stats(const struct ki_kstats *ks, struct ki_kstats_stats *out);

#endif /* KI_KSTATS_H */
