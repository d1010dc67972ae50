/*
 * ki_histogram.h - native-histogram accumulators (Prometheus' sparse exponential buckets),
 * one per key (pid, gpu, stream or none, kernel name id), in a fixed-capacity table.
 *
 * Bucket indexes are Prometheus' own (client_golang prometheus/histogram.go,
 * histogramCounts.observe): schema s in -4..8, base 2^(2^-s); bucket i holds
 * (base^(i-1), base^i] of |v|; values with |v| <= zero_threshold go to the zero
 * bucket; +-Inf go one bucket above the one of +-DBL_MAX; NaN is counted (count,
 * sum becomes NaN) but lands in no bucket. Buckets are exported as spans and deltas
 * exactly as client_golang's makeBuckets does (gaps of up to two buckets stay in the span).
 *
 * Bucket limit: when an observation makes a histogram hold more than max_buckets
 * populated buckets (both signs together), the zero bucket is widened to the upper
 * bound of the bucket nearest zero if that stays <= max_zero_threshold, else the
 * schema is decremented (buckets merged pairwise), as client_golang does; unlike
 * client_golang (one step per observation, "best effort") this repeats until the
 * histogram is within the limit, because storage is fixed. At schema -4 with no room
 * the observation is refused (counted in bucket_refused, not added anywhere, so
 * count, sum and buckets stay consistent). client_golang's time-based reset
 * (NativeHistogramMinResetDuration) is not implemented.
 *
 * Counter semantics and resets: every histogram is cumulative from the moment its key
 * was first seen by this agent process; count, zero count and buckets never decrease
 * while the process lives (a schema decrement or a wider zero bucket is not a reset
 * in Prometheus' sense). The table lives in process memory only: an agent restart
 * starts every histogram from zero, which Prometheus' rate()/increase() treat as a
 * counter reset (count decreased). When the table is full a new key is refused and
 * counted (keys_refused); its observations are lost, counted in obs_refused. The table
 * does not decide what to forget: its owner evicts a key (ki_histtab_evict: kstats.c
 * evicts keys idle for histogram_idle_s whose last change was exported), which frees the
 * slot and the buckets for new keys; a key that comes back after that starts from zero,
 * a new series (its first export flagged as a counter reset).
 *
 * Everything is allocated by ki_histtab_create; ki_histtab_observe allocates nothing.
 * Not thread-safe: one drain loop owns a table.
 */
#ifndef KI_HISTOGRAM_H
#define KI_HISTOGRAM_H

#include <stddef.h>
#include <stdint.h>

#define KI_HISTOGRAM_SCHEMA_MIN (-4)
#define KI_HISTOGRAM_SCHEMA_MAX 8
/* client_golang's DefNativeHistogramZeroThreshold: 2^-128, a bucket boundary in every schema. */
#define KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD 2.938735877055719e-39
/* The stream field of a key that has no stream. */
#define KI_HISTOGRAM_NO_STREAM UINT64_MAX

struct ki_histogram_config {
    int32_t schema;            /* initial schema, -4..8 */
    double zero_threshold;     /* initial zero threshold, >= 0 */
    uint32_t max_buckets;      /* populated buckets per histogram (>= 1); also its storage */
    double max_zero_threshold; /* widen the zero bucket up to this before lowering the schema (0: never) */
    uint32_t max_keys;         /* histograms in the table */
    uint64_t pool_buckets;     /* bucket slots shared by all histograms, of the narrowest kind (3 bytes:
                                * 16-bit key, 1-byte count; 0: enough for every key at max_buckets of the
                                * widest kind, reserved but touched only as used) */
};

struct ki_histogram_key {
    uint32_t pid;
    uint32_t gpu;
    uint64_t stream; /* KI_HISTOGRAM_NO_STREAM when not per stream */
    uint32_t name_id;  /* kernel name string id, or the op / kind id of the other name spaces */
    uint32_t producer; /* producer whose string table name_id is in (0 when not a string id) */
    uint32_t kind;     /* name space: KI_HIST_KERNEL, KI_HIST_NCCL, KI_HIST_MEMCPY (0 in unit tests; < 256) */
    uint32_t reserved; /* zero */
};

/* Name spaces of a key (the wire's HISTOGRAMS kind column, docs/wire.md). */
enum ki_hist_kind { KI_HIST_KERNEL = 1, KI_HIST_NCCL = 2, KI_HIST_MEMCPY = 3 };

struct ki_histogram_span {
    int32_t offset;  /* gap to the end of the previous span (first span: the first index) */
    uint32_t length; /* consecutive buckets */
};

/* One histogram as Prometheus exports it; the arrays are the caller's, of
 * ki_histtab_export_room() elements each. */
struct ki_histogram_export {
    int32_t schema;
    double zero_threshold;
    uint64_t zero_count;
    uint64_t count; /* every observation, NaN included */
    double sum;
    struct ki_histogram_span *pos_spans, *neg_spans;
    int64_t *pos_deltas, *neg_deltas; /* bucket counts, each as the difference to the previous one */
    uint32_t n_pos_spans, n_neg_spans, n_pos_deltas, n_neg_deltas;
};

struct ki_histtab_stats {
    uint64_t keys;          /* histograms in use */
    uint64_t keys_refused;  /* new keys refused because the table was full */
    uint64_t obs_refused;   /* observations lost with them */
    uint64_t bucket_refused; /* observations refused at schema -4 with max_buckets populated */
    uint64_t pool_refused;  /* observations refused because the bucket pool was spent */
    uint64_t bytes;         /* memory in use: records, hash, pool chunks handed out */
    uint64_t compactions;   /* times the pool was compacted (free chunks reclaimed) */
    uint64_t slots;         /* slot numbers handed out (0..slots-1): keys and free (evicted) slots */
    uint64_t evicted;       /* keys evicted (ki_histtab_evict) */
};

struct ki_histtab;

/* Bucket index of v (v not NaN, |v| above the zero threshold) in schema (-4..8),
 * exactly as client_golang computes it; the sign of v is ignored. */
int32_t ki_histogram_index(double v, int32_t schema);

/* Upper bound of bucket index in schema (client_golang getLe: DBL_MAX for the
 * last finite bucket, +Inf above). */
double ki_histogram_upper(int32_t index, int32_t schema);

/* A table for cfg->max_keys (<= 2^24) histograms of up to cfg->max_buckets (< 65531) buckets
 * each, their buckets in one pool of chunks (16, 24, ... bytes, four sizes per doubling past 64;
 * a histogram moves to a bigger chunk as it grows, or grows in place when its chunk is the
 * pool's last, and the smaller one is reused by others; dense (a count per index from a base)
 * or sparse (sorted 16-bit keys and counts), whichever is smaller; counts of 1 byte widen as
 * they grow).
 * NULL with errno EINVAL (bad setting) or ENOMEM. */
struct ki_histtab *ki_histtab_create(const struct ki_histogram_config *cfg);

/* Free; accepts NULL. */
void ki_histtab_destroy(struct ki_histtab *t);

/* Add one observation v under key. Returns 0, -ENOSPC if the key is new and the
 * table is full (counted), -ERANGE if no bucket could take it (counted), or
 * -ENOBUFS if it needed a new bucket and the pool is spent (counted). */
int ki_histtab_observe(struct ki_histtab *t, const struct ki_histogram_key *key, double v);

/* Slot of key, adding it when new: 0..max_keys-1 (an evicted key's slot first; stable until the
 * key is evicted), or -ENOSPC
 * when the table is full (counted in keys_refused; the caller counts the lost observation
 * through ki_histtab_refused). */
int ki_histtab_slot(struct ki_histtab *t, const struct ki_histogram_key *key);

/* ki_histtab_slot with the key as three words and its kind: pid | gpu << 32, stream,
 * name_id | producer << 32. The drain loop's form: the key stays in registers (a key stored
 * field by field and read back as words waits for the stores to retire: no store forwarding
 * from several stores to one load). */
int ki_histtab_slot_words(struct ki_histtab *t, uint64_t pid_gpu, uint64_t stream, uint64_t name_producer,
                          uint32_t kind);

/* Add one observation v to the histogram in slot (from ki_histtab_slot). Returns 0, -ERANGE or
 * -ENOBUFS as ki_histtab_observe. */
int ki_histtab_observe_slot(struct ki_histtab *t, uint32_t slot, double v);

/* ki_histtab_observe_slot for v[i] into slots[i], i < n, in order; a negative slot is passed
 * over. Returns the number counted (0 returned). The drain loop's form: one loop whose turns
 * the CPU overlaps (kstats.c, ki_kstats_feed). */
size_t ki_histtab_observe_slots(struct ki_histtab *t, const int32_t *slots, const double *v, size_t n);

/* Count n observations lost because their key was refused (obs_refused). */
void ki_histtab_refused(struct ki_histtab *t, uint64_t n);

/* Observations in slot (0 for a slot not in use). */
uint64_t ki_histtab_count(const struct ki_histtab *t, uint32_t slot);

/* Upper bound of the positive bucket holding the observation of rank ceil(q * count) (q in
 * (0, 1]): every observation above it is above the q-quantile. 0 when the rank falls in the
 * zero bucket or a negative one, +Inf when the slot is empty. */
double ki_histtab_quantile_upper(const struct ki_histtab *t, uint32_t slot, double q);

/* Slot of key (0..slots-1), or -ENOENT. */
int ki_histtab_find(const struct ki_histtab *t, const struct ki_histogram_key *key);

/* The key of a slot into *out: 0, or -ENOENT. (A copy: the table keeps keys packed.) */
int ki_histtab_key(const struct ki_histtab *t, uint32_t slot, struct ki_histogram_key *out);

/* Remove the key of slot: its hash entry (the entries after it in its probe run shifted back, so
 * every other key is found as before), its buckets (their chunk onto the pool's free lists) and
 * the slot itself, which the next new key takes. Returns 0, or -ENOENT when slot holds no key.
 * Not for the drain loop's hot path: its owner calls it between folds (kstats.c, at export). */
int ki_histtab_evict(struct ki_histtab *t, uint32_t slot);

/* Elements each array of a ki_histogram_export needs. */
size_t ki_histtab_export_room(const struct ki_histtab *t);

/* Fill out (arrays provided by the caller, ki_histtab_export_room() each) with the
 * histogram in slot. Returns 0 or -ENOENT. Allocates nothing. */
int ki_histtab_export(const struct ki_histtab *t, uint32_t slot, struct ki_histogram_export *out);

/* The table's counters. */
void ki_histtab_stats(const struct ki_histtab *t, struct ki_histtab_stats *out);

#endif /* KI_HISTOGRAM_H */
