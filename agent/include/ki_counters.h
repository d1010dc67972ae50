/*
 * ki_counters.h - the agent's self-metrics, shipped in every batch (docs/wire.md, COUNTERS).
 *
 * Generated from agent/counters.py (python -m kernel_insight.agent.counters --write): edit that.
 * The ids are wire ids: never renumber one, only add.
 */
#ifndef KI_COUNTERS_H
#define KI_COUNTERS_H

#include <stdint.h>

enum ki_counter {
    KI_CTR_RECORDS_READ = 1,
    KI_CTR_RECORDS_SHIPPED = 2,
    KI_CTR_GARBAGE_SKIPPED = 3,
    KI_CTR_RING_DROPPED = 4,
    KI_CTR_RING_TORN = 5,
    KI_CTR_RING_ABANDONED = 6,
    KI_CTR_RING_LOST = 7,
    KI_CTR_SPOOL_DROPPED_BATCHES = 8,
    KI_CTR_SPOOL_DROPPED_RECORDS = 9,
    KI_CTR_BATCHES_SEALED = 10,
    KI_CTR_BATCHES_SENT = 11,
    KI_CTR_BATCHES_RETRIED = 12,
    KI_CTR_BATCHES_FAILED = 13,
    KI_CTR_BYTES_RAW = 14,
    KI_CTR_BYTES_COMPRESSED = 15,
    KI_CTR_DRAIN_LAG_NS = 16,
    KI_CTR_RING_BACKLOG = 17,
    KI_CTR_NAMES_RESET = 18,
    KI_CTR_AUTH_FAILURES = 19,
    KI_CTR_SPOOL_BYTES = 20,
    KI_CTR_SPOOL_BATCHES = 21,
    KI_CTR_RSS_KB = 22,
    KI_CTR_NAMES_TRUNCATED = 23,
    KI_CTR_BATCHES_DEAD_LETTERED = 24,
    KI_CTR_SPOOL_WRITE_ERRORS = 25,
    KI_CTR_REQUESTS_SENT = 26,
    KI_CTR_REQUESTS_FAILED = 27,
    /* From here on sent only when not zero (an agent without histograms sends the v1 set). */
    KI_CTR_KERNELS_AGGREGATED = 28, /* records folded into histograms (kernels, NCCL ops, memcpys) */
    KI_CTR_SPANS_TAIL = 29, /* kernel spans kept because slower than their kernel's tail quantile */
    KI_CTR_SPANS_SAMPLED = 30, /* kernel spans kept by the uniform sample */
    KI_CTR_SPANS_CAPTURED = 31, /* kernel spans kept by a capture window or because FAILED */
    KI_CTR_HISTOGRAMS_SHIPPED = 32, /* histogram samples sealed into HISTOGRAMS sections */
    KI_CTR_HISTOGRAM_KEYS = 33, /* gauge: histograms in the agent's table */
    KI_CTR_HISTOGRAM_REFUSED = 34, /* observations refused: table full, bucket limit at schema -4, pool spent */
    KI_CTR_HISTOGRAM_INCREMENTS = 35, /* of histograms_shipped, increments (wire body version 4) */
    KI_CTR_HISTOGRAM_EVICTED = 36, /* histogram keys evicted after histogram_idle_s without a change */
    KI_CTR_BUSY_DRAINS = 37, /* drains before their tick: producers would fill half the ring first */
    KI_CTR_CUPTI_DROPPED = 38, /* the ring header's cupti_dropped: records CUPTI dropped (CUPTI probe) */
    KI_CTR_CUPTI_REFUSED = 39, /* the ring header's cupti_refused: records the CUPTI probe could not write */
    KI_CTR_MAX = 39
};

/* Ids up to this one are in every batch; later ones only when not zero. */
#define KI_CTR_ALWAYS_SENT_LAST 27

struct ki_counters {
    uint64_t v[KI_CTR_MAX + 1]; /* indexed by enum ki_counter; v[0] unused */
};

#endif /* KI_COUNTERS_H */
