/* agent.c - the drain / seal / spool / send loop (ki_agent.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "ki_capture.h"
#include "ki_labels.h"
#include "ki_compress.h"
#include "ki_drain.h"
#include "ki_encode.h"
#include "ki_kstats.h"
#include "ki_names.h"
#include "ki_resident.h"
#include "ki_ring.h"
#include "ki_seal.h"
#include "ki_spool.h"
#include "ki_status.h"
#include "ki_transport.h"

#define NS_PER_MS 1000000ULL
#define NS_PER_S 1000000000ULL
#define INGEST_PATH "/v1/ingest"

#define MULTI_RETRY_NS (300 * NS_PER_S)
#define BACKLOG_SEAL_NS NS_PER_S /* while a backlog waits, a batch gathers up to this long (fewer, larger batches) */ /* after a refused request of several batches, send one per request this long */
#define FRAMES_CONTENT_TYPE "application/x-ki-batches"
/* Bytes of histograms per batch (more go in the next ones): small bodies keep the buffers small.
 * A table of more than 1,024 keys exports in quarter sections (ki_kstats_encode: 16 KiB, ~0.3 MB
 * less peak memory at 10,000 keys); smaller ones in one section (16 KiB cost 100 kernels' exports
 * ~20% more wire bytes in two parts). Doubled at start until one histogram of
 * histogram_max_buckets fits. */
#define HIST_SECTION_MAX (64u << 10)
#define FOLD_READ 256u /* records read from the ring at a time while histograms take them and slots cannot be freed */
#define FOLD_COMMIT_MIN 1024u /* records read between frees while folding a backlog, at least */
#define KEEP_GROWTH (16u << 10) /* table and names growth that makes a kept ring's agent look at its resident memory at once */

/* One batch of the request in flight. */
struct ki_flight {
    struct ki_spool_id id; /* its spool id */
    size_t off;            /* where it starts in send_buf */
    size_t len;            /* its frame length */
    int names;             /* the names batch in front of the request: not in the spool */
};

struct ki_agent {
    const struct ki_config *cfg; /* settings */
    const struct ki_log *log;    /* logger */
    struct ki_drain *drain;      /* ring consumer */
    struct ki_names *names;      /* name table */
    struct ki_encoder *enc;      /* body encoder */
    struct ki_kstats *ks;        /* kernel histograms and kept spans (NULL: histograms off, wire body v1) */
    uint8_t *hist;               /* the HISTOGRAMS section of the batch being sealed */
    int captures_synced;         /* the sampler holds capture windows (cleared once none runs) */
    size_t hist_cap;             /* its bytes */
    struct ki_compress *zc;      /* zstd */
    struct ki_spool *spool;      /* on-disk spool */
    struct ki_http *http;        /* collector connection */
    struct ki_seal seal;         /* key, epoch, sequence */
    uint8_t prev_key[KI_KEY_BYTES]; /* the key before the last SIGHUP reload */
    int have_prev_key;           /* prev_key holds a key that differs from the current one */
    struct ki_counters ctr;      /* self-metrics */
    struct ki_record *staging;   /* records of the batch being built */
    size_t staging_cap;          /* batch_records */
    size_t batch_max;            /* records that seal a batch: batch_records, a quarter of it with histograms on */
    size_t staged;               /* records in staging, read from the ring (slots kept) but not yet sealed */
    uint64_t read_at_commit;     /* ring read position when this drain started or last freed slots */
    uint64_t fold_commit;        /* records read between frees while folding a backlog: a 64th of the ring, >= FOLD_COMMIT_MIN */
    uint64_t busy_records;       /* records that make a drain due before the tick: half the ring */
    int ring_kept;               /* the ring's pages stay mapped (ring_keep_kb; keep_ring) */
    uint64_t keep_check_ns;      /* while kept: monotonic time of the next look at the resident memory */
    uint64_t keep_bytes;         /* histogram table and name bytes at the last look (growth_bytes) */
    uint64_t pace_read;          /* records_read at the last drain (drain_and_pace) */
    uint64_t pace_dropped;       /* the ring's dropped count then */
    uint64_t pace_ns;            /* monotonic time of the last drain */
    uint64_t staged_since_ns;    /* monotonic time the first of them was read */
    int stopping;                /* SIGTERM: seal everything now */
    uint8_t *body;               /* encoded body */
    size_t body_cap;             /* its bytes */
    uint8_t *frame;              /* header + sealed payload of the batch being sealed */
    size_t frame_cap;            /* its bytes */
    uint8_t *send_buf;           /* the spooled batches of the request being sent, back to back */
    size_t send_cap;             /* its bytes: max(frame_cap, request_max) */
    size_t request_max;          /* request_max_kb in bytes: more batches join a request up to this */
    size_t request_budget;       /* what a request may carry now: halved after a request timed out,
                                    doubled back (up to request_max) after quick answers */
    uint64_t flight_sent_ns;     /* when the request in flight went out */
    int in_flight;               /* a request is out, its answer not yet in */
    struct ki_flight flight[KI_HTTP_MAX_FRAMES]; /* the batches in flight, in body order */
    int nflight;                 /* how many */
    uint64_t flight_deadline_ns; /* give up waiting for its answer then */
    uint64_t single_until_ns;    /* the collector refused a request of several batches: one per request until then */
    int pending;                 /* a sealed batch (in frame) is not yet in the spool: its records stay in the ring */
    size_t pending_len;          /* its frame length */
    uint32_t pending_records;    /* its records */
    struct ki_spool_mark pending_mark; /* its ring mark */
    int spool_errno;             /* the last spool write error (positive), 0 while writes succeed: logged on change */
    int names_errno;             /* the same for saving the name table */
    char proto_error[96];        /* words for a failed request that errno does not say (no answer in time, an
                                    answer that does not settle each batch) */
    uint32_t mark;               /* batch mark for the name table */
    uint64_t last_seal_ns;       /* monotonic time of the last sealed batch */
    uint64_t last_t_max_ns;      /* header t_max of the last sealed batch (0: none yet) */
    uint64_t next_send_ns;       /* monotonic time before which nothing is sent (backoff) */
    uint64_t backoff_ns;         /* current backoff, 0 when healthy */
    int failing;                 /* last attempt failed (log transitions only) */
    int auth_blocked;            /* 401/403 seen: paused until auth_until_ns or SIGHUP */
    uint64_t auth_until_ns;      /* end of the authentication pause */
    uint64_t rng;                /* xorshift state for jitter */
    uint64_t lost_batches;       /* batches that could not be spooled (disk errors) */
    int snapshot_asked;          /* a collector asked for histogram snapshots (KI-Histogram-Snapshot) */
    int names_ok;                /* batches got through since the last failure: texts already sent may be left out */
    int names_wanted;            /* the collector lacked names (424): a names batch goes in front of the next request */
    int names_settled;           /* the names batch of the request being settled was stored (or refused for good) */
    uint64_t lost_records;       /* records in them */
    struct ki_labels labels;     /* the configuration's instance labels, sent in every batch (LABELS) */
    struct ki_captures caps;     /* capture windows the collector asked for: their kernel spans bypass span
                                    sampling (ki_captures_covers), batches report on them (CAPTURES) */
    char ring_name[300];         /* shm name */
    char names_path[KI_CONFIG_PATH + 8]; /* where names survive a restart */
};

static uint64_t mono_ns(void) { return ki_ring_mono_ns(); }
static uint64_t real_ns(void) { return ki_ring_now_ns(); }

static uint64_t next_random(struct ki_agent *a) {
    uint64_t x = a->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return a->rng = x;
}

/* Whether the ring's pages stay mapped: handing pages back (MADV_DONTNEED, then a page fault when
 * the next lap reads them) costs about a third of the agent's CPU a record at 1M records/s
 * (docs/benchmarks.md), so a ring that fits under ring_keep_kb with everything else stays mapped
 * whole. Decided at attach from the resident memory then; from there on commit_slots stops
 * keeping for good once the resident memory passes the bound (keys, names and exports grew),
 * and the peak ends at most one step of growth above it: ring_keep_kb is 512 kB under the 5 MB
 * the agent is held to, for that step. (Not getrusage's ru_maxrss: Linux carries the peak of
 * the process that exec'd the agent into it.) */
static void keep_ring(struct ki_agent *a, uint64_t slots) {
    uint64_t limit = (uint64_t)a->cfg->ring_keep_kb, ring_kb = slots * KI_RING_RECORD_SIZE / 1024;
    uint64_t now = ki_resident_kb();
    a->ring_kept = limit && now + ring_kb <= limit;
    a->keep_check_ns = 0;
    ki_drain_keep_pages(a->drain, a->ring_kept);
    if (a->ring_kept)
        ki_log_info(a->log, "the ring's %llu KiB stay mapped (resident %llu kB with it, ring_keep_kb %llu)",
                    (unsigned long long)ring_kb, (unsigned long long)(now + ring_kb), (unsigned long long)limit);
    else if (limit)
        ki_log_info(a->log, "the ring's pages are handed back as read (%llu KiB of ring and %llu kB resident exceed ring_keep_kb %llu)",
                    (unsigned long long)ring_kb, (unsigned long long)now, (unsigned long long)limit);
}

/* Bytes of the histogram table and the names: what grows with new keys, names and wider
 * histograms, watched by loads rather than by reading /proc. */
static uint64_t growth_bytes(const struct ki_agent *a) {
    uint64_t b = ki_names_bytes(a->names);
    if (a->ks) {
        struct ki_kstats_stats st;
        ki_kstats_stats(a->ks, &st);
        b += st.table.bytes;
    }
    return b;
}

/* Free the slots read so far; while the ring is kept, look at the resident memory (a read of
 * /proc/self/statm, a few us) once a tick, and at once when table and names grew by KEEP_GROWTH bytes
 * since the last look, and stop keeping once it passed ring_keep_kb. */
static void commit_slots(struct ki_agent *a) {
    ki_drain_commit(a->drain);
    if (!a->ring_kept) return;
    uint64_t now = mono_ns(), bytes = growth_bytes(a);
    if (now < a->keep_check_ns && bytes < a->keep_bytes + KEEP_GROWTH) return;
    a->keep_check_ns = now + (uint64_t)a->cfg->drain_interval_ms * NS_PER_MS;
    a->keep_bytes = bytes;
    uint64_t rss = ki_resident_kb();
    if (rss <= (uint64_t)a->cfg->ring_keep_kb) return;
    a->ring_kept = 0;
    ki_drain_keep_pages(a->drain, 0);
    ki_log_info(a->log, "resident memory reached %llu kB (ring_keep_kb %lld): the ring's pages are handed back as read from now on",
                (unsigned long long)rss, (long long)a->cfg->ring_keep_kb);
}

static int mkdirs(const char *path) {
    char tmp[KI_CONFIG_PATH];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST) return -errno;
    return 0;
}

/* Become the ring's consumer; names and the restart mark of the spool apply from here. */
static int attach_ring(struct ki_agent *a, char *err, size_t errlen) {
    int rc = 0;
    a->drain = ki_drain_create(a->ring_name, (int)a->cfg->ring_create, (uint64_t)a->cfg->ring_capacity, &rc, err,
                               errlen);
    if (!a->drain) return rc < 0 ? rc : -EIO;
    struct ki_drain_stats ds;
    ki_drain_stats(a->drain, &ds);
    a->fold_commit = ds.capacity / 64 > FOLD_COMMIT_MIN ? ds.capacity / 64 : FOLD_COMMIT_MIN;
    a->busy_records = ds.capacity / 2;
    keep_ring(a, ds.capacity);
    a->pace_read = a->ctr.v[KI_CTR_RECORDS_READ];
    a->pace_dropped = ds.dropped;
    a->pace_ns = mono_ns();
    uint64_t created = ki_drain_ring_created_ns(a->drain);
    int loaded = ki_names_load(a->names, a->names_path, created);
    if (loaded > 0) ki_log_info(a->log, "%d names of this ring remembered from the previous run", loaded);
    struct ki_spool_mark mark;
    if (ki_spool_last_mark(a->spool, &mark) == 0 && mark.ring_created_ns == created) {
        /* Records an earlier run spooled but had not yet freed in the ring (it was killed) are not sent twice. */
        ki_drain_skip_before(a->drain, mark.ring_created_ns, mark.next_pos);
        if (mark.next_pos > ki_drain_read_pos(a->drain))
            ki_log_info(a->log, "ring records %llu..%llu were spooled by the previous run: not read again",
                        (unsigned long long)ki_drain_read_pos(a->drain), (unsigned long long)mark.next_pos - 1);
    }
    return 0;
}

struct ki_agent *ki_agent_create(const struct ki_config *cfg, const struct ki_log *log, char *err, size_t errlen) {
    struct ki_agent *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    a->cfg = cfg;
    a->log = log;
    a->rng = real_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    if (ki_labels_parse(&a->labels, cfg->labels, err, errlen) < 0) goto fail;
    if (ki_seal_load_key(&a->seal, cfg->key_file, err, errlen) < 0) goto fail;
    int rc = mkdirs(cfg->spool_dir);
    if (rc < 0) {
        snprintf(err, errlen, "cannot create spool directory %s: %s", cfg->spool_dir, strerror(-rc));
        goto fail;
    }
    if (ki_seal_next_epoch(&a->seal, cfg->spool_dir, (uint32_t)(real_ns() / NS_PER_S), err, errlen) < 0) goto fail;
    a->spool = ki_spool_create(cfg->spool_dir, (uint64_t)cfg->spool_max_mb << 20, (uint64_t)cfg->dead_letter_max_mb << 20,
                               (int)cfg->spool_fsync, err, errlen);
    if (!a->spool) goto fail;
    a->http = ki_http_create(cfg->collector, INGEST_PATH, cfg->tls_ca_file, (int)cfg->connect_timeout_ms,
                             (int)cfg->io_timeout_ms, err, errlen);
    if (!a->http) goto fail;
    a->names = ki_names_create((size_t)cfg->names_max, (size_t)cfg->names_bytes, (size_t)cfg->name_max);
    a->staging_cap = (size_t)cfg->batch_records;
    a->staging = malloc(a->staging_cap * sizeof *a->staging);
    /* With histograms on, staged records are kept spans and the types not folded (and the STRINGs
     * of a burst of new names): batches of a quarter of batch_records touch a quarter of staging,
     * body, frame and zstd's context (~0.5 MB less at 10,000 new names). */
    a->batch_max = cfg->histograms && a->staging_cap / 4 >= 64 ? a->staging_cap / 4 : a->staging_cap;
    a->enc = a->names ? ki_encoder_create(a->staging_cap, a->names) : NULL;
    a->zc = ki_compress_create((int)cfg->zstd_level);
    if (!a->names || !a->staging || !a->enc || !a->zc) {
        snprintf(err, errlen, "out of memory for batch buffers (batch_records %lld)", (long long)cfg->batch_records);
        goto fail;
    }
    if (cfg->histograms) {
        struct ki_kstats_config kc = {
            .hist = {.schema = (int32_t)cfg->histogram_schema,
                     .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD,
                     .max_buckets = (uint32_t)cfg->histogram_max_buckets,
                     .max_keys = (uint32_t)cfg->histogram_max_keys},
            .interval_ns = (uint64_t)cfg->histogram_interval_s * NS_PER_S,
            .span_sample_rate = (uint32_t)cfg->span_sample_rate,
            .span_tail_rate = (uint32_t)cfg->span_tail_rate,
            .tail_quantile = (double)cfg->span_tail_permille / 1000.0,
            .tail_min_count = 100,
            .section_max = HIST_SECTION_MAX,
            .snapshot_ns = (uint64_t)cfg->histogram_snapshot_s * NS_PER_S,
            .idle_ns = (uint64_t)cfg->histogram_idle_s * NS_PER_S,
        };
        while (!(a->ks = ki_kstats_create(&kc)) && errno == EINVAL && kc.section_max < (1u << 22))
            kc.section_max *= 2; /* a histogram of many buckets needs a bigger section */
        if (!a->ks) {
            snprintf(err, errlen, "cannot create the kernel histograms: %s", strerror(errno));
            goto fail;
        }
        a->hist_cap = ki_kstats_section_bound(a->ks);
        a->hist = malloc(a->hist_cap);
        if (!a->hist) {
            snprintf(err, errlen, "out of memory for the histogram section");
            goto fail;
        }
        ki_encoder_reserve(a->enc, a->hist_cap);
    }
    a->body_cap = ki_encoder_bound(a->enc) + KI_CAPTURE_SECTION_MAX + a->labels.len;
    a->frame_cap = KI_HEADER_BYTES + ki_compress_bound(a->body_cap) + KI_TAG_BYTES;
    a->body = malloc(a->body_cap);
    a->frame = malloc(a->frame_cap);
    a->request_max = (size_t)cfg->request_max_kb << 10;
    a->send_cap = a->frame_cap > a->request_max ? a->frame_cap : a->request_max;
    a->request_budget = a->request_max;
    a->send_buf = malloc(a->send_cap); /* pages are touched only as far as requests reach */
    if (!a->body || !a->frame || !a->send_buf) {
        snprintf(err, errlen, "out of memory for batch buffers");
        goto fail;
    }
    ki_config_ring_name(cfg, a->ring_name, sizeof a->ring_name);
    snprintf(a->names_path, sizeof a->names_path, "%s/names", cfg->spool_dir);
    rc = attach_ring(a, err, errlen);
    if (rc == -ENOENT && !cfg->ring_create) {
        ki_log_warn(log, "%s: waiting for a producer to create it (or start with --ring-create)", err);
    } else if (rc < 0) {
        goto fail;
    }
    a->last_seal_ns = mono_ns();
    return a;
fail:
    ki_agent_destroy(a);
    return NULL;
}

void ki_agent_destroy(struct ki_agent *a) {
    if (!a) return;
    ki_drain_destroy(a->drain);
    ki_http_destroy(a->http);
    ki_spool_destroy(a->spool);
    ki_encoder_destroy(a->enc);
    ki_kstats_destroy(a->ks);
    free(a->hist);
    ki_compress_destroy(a->zc);
    ki_names_destroy(a->names);
    free(a->staging);
    free(a->body);
    free(a->frame);
    free(a->send_buf);
    ki_seal_wipe(&a->seal);
    sodium_memzero(a->prev_key, sizeof a->prev_key);
    free(a);
}

const struct ki_counters *ki_agent_counters(const struct ki_agent *a) { return &a->ctr; }

void ki_agent_capture(struct ki_agent *a, int gpu, uint64_t until_real_ns) {
    if (a->ks) ki_kstats_capture(a->ks, gpu, until_real_ns);
}

/* Fill the counters a batch carries, after its records were counted. */
static void update_counters(struct ki_counters *c, const struct ki_batch_info *info, void *arg) {
    struct ki_agent *a = arg;
    struct ki_drain_stats ds;
    struct ki_spool_stats ss;
    ki_drain_stats(a->drain, &ds);
    ki_spool_stats(a->spool, &ss);
    c->v[KI_CTR_RECORDS_SHIPPED] += info->shipped;
    c->v[KI_CTR_GARBAGE_SKIPPED] += info->garbage;
    c->v[KI_CTR_RING_DROPPED] = ds.dropped;
    c->v[KI_CTR_RING_TORN] = ds.torn;
    c->v[KI_CTR_RING_ABANDONED] = ds.abandoned;
    c->v[KI_CTR_RING_LOST] = ds.lost;
    c->v[KI_CTR_CUPTI_DROPPED] = ds.cupti_dropped;
    c->v[KI_CTR_CUPTI_REFUSED] = ds.cupti_refused;
    c->v[KI_CTR_RING_BACKLOG] = ds.backlog;
    c->v[KI_CTR_SPOOL_DROPPED_BATCHES] = ss.dropped_batches + a->lost_batches;
    c->v[KI_CTR_SPOOL_DROPPED_RECORDS] = ss.dropped_records + a->lost_records;
    c->v[KI_CTR_SPOOL_BYTES] = ss.bytes;
    c->v[KI_CTR_SPOOL_BATCHES] = ss.batches;
    c->v[KI_CTR_BATCHES_SEALED] += 1;
    c->v[KI_CTR_NAMES_RESET] = ki_names_resets(a->names);
    c->v[KI_CTR_NAMES_TRUNCATED] = ki_names_truncated(a->names);
    uint64_t now = real_ns();
    c->v[KI_CTR_DRAIN_LAG_NS] = info->shipped && now > info->t_min ? now - info->t_min : 0;
    c->v[KI_CTR_RSS_KB] = ki_resident_kb();
    if (a->ks) {
        struct ki_kstats_stats ks;
        ki_kstats_stats(a->ks, &ks);
        c->v[KI_CTR_KERNELS_AGGREGATED] = ks.aggregated;
        c->v[KI_CTR_SPANS_TAIL] = ks.spans_tail;
        c->v[KI_CTR_SPANS_SAMPLED] = ks.spans_sampled;
        c->v[KI_CTR_SPANS_CAPTURED] = ks.spans_captured;
        c->v[KI_CTR_HISTOGRAMS_SHIPPED] = ks.histograms_exported;
        c->v[KI_CTR_HISTOGRAM_KEYS] = ks.table.keys;
        c->v[KI_CTR_HISTOGRAM_REFUSED] = ks.table.obs_refused + ks.table.bucket_refused + ks.table.pool_refused;
        c->v[KI_CTR_HISTOGRAM_INCREMENTS] = ks.increments_exported;
        c->v[KI_CTR_HISTOGRAM_EVICTED] = ks.table.evicted;
    }
}

/* Write the sealed batch to the spool; only then are its ring slots freed. While the spool
 * cannot take it (disk full, read-only, ...) it stays pending and its records stay in the
 * ring (producers see a full ring, counted, only once the ring itself is full); the error is
 * logged once per change, not per attempt. Returns 0 or the spool's negative errno. */
static int spool_pending(struct ki_agent *a) {
    int rc = ki_spool_put(a->spool, a->frame, a->pending_len, &a->pending_mark);
    if (rc < 0) {
        a->ctr.v[KI_CTR_SPOOL_WRITE_ERRORS]++;
        if (-rc != a->spool_errno)
            ki_log_error(a->log,
                         "cannot write to the spool %s: %s; records stay in the ring until it can (batches already "
                         "spooled are still sent)",
                         a->cfg->spool_dir, strerror(-rc));
        a->spool_errno = -rc;
        return rc;
    }
    if (a->spool_errno) ki_log_info(a->log, "the spool %s takes batches again", a->cfg->spool_dir);
    a->spool_errno = 0;
    a->pending = 0;
    commit_slots(a);
    /* Names are registered once per producer: keep them for the next run (only when a name completed). */
    int saved = ki_names_save(a->names, a->names_path, ki_drain_ring_created_ns(a->drain));
    if (saved < 0 && -saved != a->names_errno)
        ki_log_warn(a->log, "cannot save names to %s: %s", a->names_path, strerror(-saved));
    if (saved >= 0 && a->names_errno) ki_log_info(a->log, "names are saved to %s again", a->names_path);
    a->names_errno = saved < 0 ? -saved : 0;
    return 0;
}

/* A kernel histogram of this batch: its name travels with it (the STRINGS section). */
static void mark_name(void *arg, uint32_t producer, uint32_t id) {
    struct ki_agent *a = arg;
    if (!ki_names_mark(a->names, producer, id, a->mark)) ki_encoder_unnamed(a->enc);
}

/* Whether a histogram export is due (ki_kstats_want). Idle keys are not evicted while a batch
 * waits to be settled (in the spool, or sealed and not yet spooled): it may carry an idle key's
 * last change, and if it is refused for good only a key still in the table is re-sent
 * (docs/agent.md, "Idle keys are evicted"). */
static int export_due(struct ki_agent *a, uint64_t mono) {
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    ki_kstats_hold_sweep(a->ks, ss.batches > 0 || a->pending);
    return ki_kstats_want(a->ks, mono, real_ns());
}

/* Encode, compress, seal and spool the n staged records (n may be 0: a heartbeat). */
static int seal_batch(struct ki_agent *a, size_t n) {
    if (++a->mark == 0) a->mark = 1;
    size_t blen, clen, flen, hlen = 0;
    uint64_t hist_ts = 0;
    struct ki_batch_info info;
    if (a->ks) {
        /* Body v2: this batch's KERNEL records are the kept spans; the kernels are counted in
         * the histograms, shipped every histogram_interval_s (in parts when there are many). */
        if (export_due(a, a->stopping ? UINT64_MAX : mono_ns())) {
            /* Increments build on the collector's copy of the previous export: while batches are not
             * getting through, every histogram goes whole (docs/wire.md, "Increments"). Not after a
             * mere reconnect: a collector closes an idle kept-alive connection (uvicorn: after 5 s),
             * so at a 10 s interval with no spans every export would go over a new one; a collector
             * that lacks a base says so (KI-Histogram-Snapshot). */
            a->snapshot_asked = 0; /* this export answers an earlier request for snapshots */
            if (a->failing || a->auth_blocked) ki_kstats_snapshot(a->ks, 0);
            ki_kstats_encode(a->ks, a->hist, a->hist_cap, &hlen, &hist_ts, mark_name, a);
        }
        /* Body v3, or v4 when the HISTOGRAMS section may hold increments. */
        ki_encoder_set_extra(a->enc, ki_kstats_increments(a->ks) ? KI_BODY_VERSION_INCREMENTS : KI_BODY_VERSION_PDELTA,
                             KI_SECTION_HISTOGRAMS, a->hist, hlen);
    }
    /* Names once (docs/wire.md): only while batches get through, so a batch sealed while the
     * collector is away (it waits in the spool, and may reach another collector) resolves alone. */
    ki_encoder_set_names_once(a->enc, a->names_ok && !a->failing && !a->auth_blocked);
    ki_captures_count(&a->caps, a->staging, n);
    int rc = ki_encode_body(a->enc, a->staging, n, a->names, a->mark, &a->ctr, update_counters, a, a->body,
                            a->body_cap - KI_CAPTURE_SECTION_MAX - a->labels.len, &blen, &info);
    if (rc == 0) blen += ki_captures_section(&a->caps, real_ns(), a->body + blen, a->body_cap - blen);
    if (rc == 0) blen += ki_labels_section(&a->labels, a->body + blen, a->body_cap - blen);
    if (rc == 0)
        rc = ki_compress_run(a->zc, a->body, blen, a->frame + KI_HEADER_BYTES,
                             a->frame_cap - KI_HEADER_BYTES - KI_TAG_BYTES, &clen);
    if (rc < 0) {
        /* Cannot happen with buffers sized by the encoder's bound; if it does, the loss is counted. */
        commit_slots(a);
        a->lost_batches++;
        a->lost_records += n;
        ki_log_error(a->log, "cannot encode a batch of %zu records: %s (records dropped, counted as spool drops)", n,
                     strerror(-rc));
        return rc;
    }
    a->ctr.v[KI_CTR_BYTES_RAW] += blen;
    a->ctr.v[KI_CTR_BYTES_COMPRESSED] += clen;
    uint64_t t_min = info.t_min, t_max = info.t_max;
    if (!info.shipped) t_min = t_max = hlen ? hist_ts : real_ns();
    if (hlen && hist_ts < t_min) t_min = hist_ts; /* the histograms' time lies in the batch's range too */
    if (hlen && hist_ts > t_max) t_max = hist_ts;
    /* The collector stamps this batch's counters at t_max (docs/metrics.md): one batch is one
     * sample of each, so t_max is at least 1 ms (the store's resolution) after the previous
     * batch's. Batches sharing a time (the parts of one export, sealed back to back at SIGTERM;
     * a heartbeat right after a batch of fresh records) would otherwise give every counter two
     * values at one timestamp; the collector keeps them apart too, but only within one process,
     * and this holds across its restarts. Every record still lies in [t_min, t_max]. */
    if (a->last_t_max_ns && t_max < a->last_t_max_ns + NS_PER_MS) t_max = a->last_t_max_ns + NS_PER_MS;
    a->pending_mark = (struct ki_spool_mark){ki_drain_ring_created_ns(a->drain), ki_drain_read_pos(a->drain)};
    rc = ki_seal_frame(&a->seal, a->frame, clen, KI_COMPRESSION_ZSTD, t_min, t_max, info.shipped, &flen);
    if (rc < 0) {
        commit_slots(a);
        a->lost_batches++;
        a->lost_records += info.shipped;
        ki_log_error(a->log, "cannot seal a batch of %u records: %s (counted as spool drops)", info.shipped,
                     strerror(-rc));
        return rc;
    }
    a->last_t_max_ns = t_max;
    a->pending = 1;
    a->pending_len = flen;
    a->pending_records = info.shipped;
    a->last_seal_ns = mono_ns();
    ki_log_debug(a->log, "sealed batch %u/%llu: %u records, %zu names (%zu left out), %zu -> %zu bytes",
                 a->seal.epoch, (unsigned long long)a->seal.next_seq - 1, info.shipped, (size_t)info.names,
                 (size_t)info.omitted, blen, flen);
    return spool_pending(a);
}

/* Whether staged records may wait for more: while batches queue up in the spool (the collector
 * is away or slower than the producers), a batch gathers records for up to BACKLOG_SEAL_NS
 * instead of one tick, so the backlog is fewer, larger batches that the collector takes in
 * fewer steps. The records stay in the ring meanwhile, so a batch is sealed at once when
 * the ring is half full or the agent is stopping. */
static int hold_back(struct ki_agent *a) {
    if (a->stopping || mono_ns() - a->staged_since_ns >= BACKLOG_SEAL_NS) return 0;
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    if (!a->failing && ss.batches < 2) return 0;
    struct ki_drain_stats ds;
    ki_drain_stats(a->drain, &ds);
    return ds.backlog < ds.capacity / 2;
}

/* With histograms on, the staged records (kept spans, and the record types not folded into
 * histograms) wait in memory up to span_seal_ms and go out together, with the histograms when
 * an export is due: about one batch a second instead of one per drain tick, so the header,
 * counters, labels and the names the spans refer to are paid once, and zstd sees the spans
 * together (docs/wire.md, "Batches and sizes"). Their ring slots are freed meanwhile, so a
 * crash loses at most span_seal_ms of kept spans, as it loses the last interval of
 * histogram growth; SIGTERM seals them. */
static int hold_kept(const struct ki_agent *a, size_t n) {
    return a->ks && !a->stopping && n < a->batch_max &&
           mono_ns() - a->staged_since_ns < (uint64_t)a->cfg->span_seal_ms * NS_PER_MS;
}

/* Capture windows bypass span sampling: hand each GPU's "capture until" to the sampler
 * (while windows run, and once more after the last ends to clear them). */
static void sync_captures(struct ki_agent *a) {
    int running = ki_captures_running(&a->caps);
    if (!running && !a->captures_synced) return;
    for (int g = 0; g < KI_KSTATS_MAX_GPUS; g++) ki_kstats_capture(a->ks, g, ki_captures_until(&a->caps, (uint32_t)g));
    a->captures_synced = running;
}

/* Consume everything the ring holds, sealing a batch per batch_records records. */
static int drain_ring(struct ki_agent *a) {
    if (a->pending && spool_pending(a) < 0) return 0; /* the spool still refuses: read nothing more */
    if (a->ks) sync_captures(a);
    size_t n = a->staged;
    int read_any = 0;
    a->read_at_commit = ki_drain_read_pos(a->drain);
    for (;;) {
        size_t want = a->staging_cap - n, got, read;
        if (a->ks) {
            /* Records go from their slots straight into the histograms; only kept spans (and the
             * types not folded) are copied into staging. Read up to the next free of slots. */
            uint64_t since = ki_drain_read_pos(a->drain) - a->read_at_commit;
            size_t left = since < a->fold_commit ? (size_t)(a->fold_commit - since) : FOLD_READ;
            if (want > left) want = left;
            got = ki_drain_poll_keep(a->drain, a->staging + n, want, ki_kstats_fold, a->ks, &read);
            read_any |= read > 0;
        } else {
            got = read = ki_drain_poll(a->drain, a->staging + n, want);
        }
        a->ctr.v[KI_CTR_RECORDS_READ] += read;
        int more = read > 0;
        if (got && n == 0) a->staged_since_ns = mono_ns();
        n += got;
        if (n >= a->batch_max) {
            size_t full = n;
            n = a->staged = 0;
            if (seal_batch(a, full) < 0 && a->pending) return 0;
            continue;
        }
        if (!more) break;
        if (a->ks && !a->pending && ki_drain_read_pos(a->drain) - a->read_at_commit >= a->fold_commit) {
            /* A backlog folds into histograms without filling a batch: seal the few kept spans so
             * the slots read so far are freed (and their pages dropped) now, not when the ring is
             * empty: the producer need not wait on a full ring, and the agent maps a 64th of it
             * at most instead of all of it. */
            if (n && !hold_kept(a, n)) {
                a->staged = 0;
                int rc = seal_batch(a, n);
                n = 0;
                if (rc < 0 && a->pending) return 0;
            } else {
                commit_slots(a); /* what is staged waits in memory (hold_kept) */
            }
            a->read_at_commit = ki_drain_read_pos(a->drain);
        }
    }
    a->staged = n;
    if (n > 0) {
        if (hold_back(a)) return 0;
        if (!hold_kept(a, n)) {
            a->staged = 0;
            return seal_batch(a, n);
        }
    }
    /* A histogram export, a heartbeat, or a capture window's final report (due even when its
     * GPU is idle): seal now, with whatever waits in staging. */
    if ((a->ks && export_due(a, mono_ns())) ||
        mono_ns() - a->last_seal_ns >= (uint64_t)a->cfg->heartbeat_s * NS_PER_S || ki_captures_due(&a->caps, real_ns())) {
        a->staged = 0;
        return seal_batch(a, n);
    }
    /* Everything read went into histograms or waits in staging: nothing to spool now, so the
     * slots are free now. */
    if (read_any && !a->pending) commit_slots(a);
    return 0;
}

static void schedule_retry(struct ki_agent *a, int retry_after_s) {
    uint64_t lo = (uint64_t)a->cfg->backoff_min_ms * NS_PER_MS, hi = (uint64_t)a->cfg->backoff_max_ms * NS_PER_MS;
    a->backoff_ns = a->backoff_ns ? a->backoff_ns * 2 : lo;
    if (a->backoff_ns > hi) a->backoff_ns = hi;
    uint64_t delay;
    if (retry_after_s >= 0) {
        delay = (uint64_t)retry_after_s * NS_PER_S;
        if (delay > hi) delay = hi; /* a collector's word is trusted only up to the longest backoff */
        delay += next_random(a) % (delay / 10 + 1); /* spread a fleet told the same Retry-After */
    } else {
        delay = a->backoff_ns / 2 + next_random(a) % (a->backoff_ns / 2 + 1); /* "equal jitter" */
    }
    a->next_send_ns = mono_ns() + delay;
}

enum frame_verdict { FRAME_DONE, FRAME_RETRY, FRAME_AUTH, FRAME_NAMES };

/* The collector may lack texts this agent left out (a request failed, a batch was refused): the
 * next batches carry every name's text again until batches get through (names_ok). */
static void names_lost(struct ki_agent *a) {
    if (a->names_ok) ki_names_forget(a->names);
    a->names_ok = 0;
}

/* Status 424: the collector does not hold every name this batch left out (docs/wire.md, "Names
 * once"). The batch stays in the spool and goes again behind a names batch. Only a 424 answered in
 * the same request as a stored names batch is final: that collector has just learned every name
 * this agent knows and still cannot match the batch, so the agent no longer knows the names it
 * left out (a batch of an earlier run over another ring): it is set aside as any refused batch. A
 * 424 in a later request (the names batch went to another collector of the tier, or to one that
 * restarted since, while the batch behind it was retried) starts another round: the batch is
 * never lost for that. */
static int names_refused(struct ki_agent *a, const struct ki_flight *f) {
    names_lost(a);
    if (a->names_settled) return 0;
    if (!a->names_wanted)
        ki_log_info(a->log, "collector lacks names batch %u/%llu left out: sending every name, then the batch again",
                    f->id.epoch, (unsigned long long)f->id.seq);
    a->names_wanted = 1;
    return 1;
}

/* Settle one batch of the request from its status. */
static enum frame_verdict settle_frame(struct ki_agent *a, const struct ki_flight *f, int s) {
    struct ki_spool_id id = f->id;
    uint8_t *frame = a->send_buf + f->off;
    enum ki_status_class c = ki_status_classify(s);
    if (f->names) { /* the names batch: nothing in the spool; when it did not get through, the next request carries one */
        /* Stored, or refused for good (a collector that can never take it: the batches behind it
         * would otherwise go round forever and hold up the spool). */
        a->names_settled = c == KI_STATUS_STORED || c == KI_STATUS_PERMANENT;
        if (a->names_settled) a->names_wanted = 0;
        if (c == KI_STATUS_PERMANENT)
            ki_log_error(a->log, "collector refused the names batch with %d: a batch that left names out and is "
                         "refused with 424 behind it is set aside", s);
        return FRAME_DONE;
    }
    if (c == KI_STATUS_NAMES) {
        if (names_refused(a, f)) return FRAME_NAMES;
        c = KI_STATUS_PERMANENT; /* the collector has every name and still cannot match it */
    }
    if (c == KI_STATUS_STORED) {
        a->ctr.v[KI_CTR_BATCHES_SENT]++;
        ki_spool_remove(a->spool, id);
        return FRAME_DONE;
    }
    if (c == KI_STATUS_AUTH) {
        a->ctr.v[KI_CTR_AUTH_FAILURES]++;
        size_t flen;
        if (a->have_prev_key && ki_seal_reseal(&a->seal, a->prev_key, frame, f->len, &flen) == 0) {
            /* Sealed under the key that was replaced: it goes again under the current key, as a new batch. */
            struct ki_spool_mark mark = {ki_drain_ring_created_ns(a->drain), ki_drain_read_pos(a->drain)};
            if (ki_spool_put(a->spool, frame, flen, &mark) == 0) {
                ki_spool_remove(a->spool, id);
                ki_log_info(a->log, "batch %u/%llu re-sealed under key %u as %u/%llu", id.epoch,
                            (unsigned long long)id.seq, a->seal.key_id, a->seal.epoch,
                            (unsigned long long)a->seal.next_seq - 1);
                return FRAME_DONE;
            }
        }
        if (!a->auth_blocked)
            ki_log_error(a->log,
                         "collector refused batch %u/%llu with %d (%s): sending stopped, batches are kept in the "
                         "spool; fix the key file and send SIGHUP (next try in %llds)",
                         id.epoch, (unsigned long long)id.seq, s,
                         s == 401 ? "authentication failed: wrong key" : "agent unknown or revoked",
                         (long long)a->cfg->auth_retry_s);
        a->auth_blocked = 1;
        a->auth_until_ns = mono_ns() + (uint64_t)a->cfg->auth_retry_s * NS_PER_S;
        return FRAME_AUTH;
    }
    if (c == KI_STATUS_RETRY) {
        a->ctr.v[KI_CTR_BATCHES_RETRIED]++;
        return FRAME_RETRY;
    }
    /* Refused for good (any other 4xx): this batch can never be stored. Keep it for a person, go on with the next
     * (its histograms' increments are lost with it: the next export is cumulative; the texts it
     * carried are lost too: the next batches carry them again). */
    a->ctr.v[KI_CTR_BATCHES_FAILED]++;
    if (a->ks) ki_kstats_snapshot(a->ks, 1);
    names_lost(a);
    int rc = ki_spool_dead_letter(a->spool, id, frame, f->len, s, real_ns());
    if (rc == 0) {
        a->ctr.v[KI_CTR_BATCHES_DEAD_LETTERED]++;
        ki_log_error(a->log, "collector rejected batch %u/%llu with %d: moved to %s/dead-letter, going on", id.epoch,
                     (unsigned long long)id.seq, s, a->cfg->spool_dir);
    } else {
        ki_log_error(a->log, "collector rejected batch %u/%llu with %d: dropped (cannot write the dead-letter file: %s)",
                     id.epoch, (unsigned long long)id.seq, s, strerror(-rc));
    }
    return FRAME_DONE;
}

/* Start the capture windows an answer asks for (docs/wire.md); a repeated offer of one id runs once. */
static void start_captures(struct ki_agent *a, const struct ki_http_result *res) {
    if (res->bad_captures)
        ki_log_warn(a->log, "collector sent %d KI-Capture values this agent cannot read: ignored", res->bad_captures);
    for (int i = 0; i < res->ncaptures; i++) {
        const struct ki_capture_offer *o = &res->captures[i];
        int rc = ki_captures_start(&a->caps, o, real_ns());
        if (rc > 0)
            ki_log_info(a->log, "capture %016llx: every kernel span of GPU %u for %u s", (unsigned long long)o->id,
                        o->gpu, o->seconds);
        else if (rc < 0)
            ki_log_warn(a->log, "capture %016llx not started: %d windows run already (it is offered again)",
                        (unsigned long long)o->id, KI_CAPTURE_MAX);
    }
}

/* Settle the request in flight from the collector's answer (rc < 0: no answer). Returns 1 to keep sending. */
static int settle(struct ki_agent *a, int rc, const struct ki_http_result *res) {
    int n = a->nflight, multi = n > 1;
    a->in_flight = 0;
    a->nflight = 0;
    if (rc == 0 && multi && res->nframes != n) {
        int s = res->status;
        enum ki_status_class c = ki_status_classify(s);
        if (res->nframes == -1 && s >= 400 && c != KI_STATUS_AUTH && c != KI_STATUS_RETRY) {
            /* A collector that does not take several batches per request (docs/wire.md): one per request. */
            ki_log_warn(a->log, "collector answered %d to a request of %d batches: sending one batch per request", s,
                        n);
            a->single_until_ns = mono_ns() + MULTI_RETRY_NS;
            return 1;
        }
        if (res->nframes != -1 || (s >= 200 && s < 300)) {
            rc = -EPROTO; /* an answer that does not settle each batch: retried, one per request */
            snprintf(a->proto_error, sizeof a->proto_error, "answer %d without one status per batch", s);
            a->single_until_ns = mono_ns() + MULTI_RETRY_NS;
        }
    }
    if (rc < 0) {
        if (a->ks) ki_kstats_snapshot(a->ks, 0); /* its batches may reach another collector, or one that restarted */
        names_lost(a);
        a->ctr.v[KI_CTR_BATCHES_RETRIED] += (uint64_t)n;
        a->ctr.v[KI_CTR_REQUESTS_FAILED]++;
        if (!a->failing)
            ki_log_warn(a->log, "collector %s unreachable (%s): spooling and retrying with backoff",
                        ki_http_target(a->http),
                        a->proto_error[0]          ? a->proto_error
                        : *ki_http_error(a->http) ? ki_http_error(a->http)
                                                  : strerror(-rc));
        a->proto_error[0] = '\0';
        a->failing = 1;
        schedule_retry(a, -1);
        return 0;
    }
    if (res->ncaptures || res->bad_captures) start_captures(a, res);
    if (res->snapshot && a->ks) {
        ki_log_info(a->log, "collector asked for histogram snapshots (it lacked a base): the next export is cumulative");
        ki_kstats_snapshot(a->ks, 1);
        a->snapshot_asked = 1;
    }
    int retry = 0, auth = 0, done = 0, retry_status = 0, names = 0;
    a->names_settled = 0; /* a names batch leads its request: settled first, it vouches for this request only */
    int per_frame = multi && res->nframes == n; /* else one answer for the whole request (503 from a proxy, ...) */
    for (int i = 0; i < n; i++) {
        int s = per_frame ? res->frame_status[i] : res->status;
        enum frame_verdict v = settle_frame(a, &a->flight[i], s);
        if (v == FRAME_RETRY) retry_status = s;
        retry += v == FRAME_RETRY;
        auth += v == FRAME_AUTH;
        done += v == FRAME_DONE && !a->flight[i].names;
        names += v == FRAME_NAMES;
    }
    if (retry || auth) names_lost(a);
    if (retry) {
        if (a->ks) ki_kstats_snapshot(a->ks, 0);
        if (!a->failing) {
            if (res->retry_after >= 0)
                ki_log_warn(a->log, "collector answered %d (retry after %ds): retrying with backoff", retry_status,
                            res->retry_after);
            else
                ki_log_warn(a->log, "collector answered %d (no Retry-After): retrying with backoff", retry_status);
        }
        a->failing = 1;
        schedule_retry(a, res->retry_after);
        return 0;
    }
    if (auth) return 0;
    if (a->failing || a->auth_blocked) ki_log_info(a->log, "collector %s accepts batches again", ki_http_target(a->http));
    a->failing = 0;
    a->auth_blocked = 0;
    a->backoff_ns = 0;
    if (!names && done) a->names_ok = 1;
    return done > 0 || names > 0;
}

/* Seal the names batch (every name this agent knows, body version 5) into send_buf at off as
 * flight f: it is not spooled (lost, it is simply made again). Returns 0 or a negative errno. */
static int build_names_frame(struct ki_agent *a, struct ki_flight *f, size_t off) {
    size_t blen, clen, flen, k;
    int rc = ki_encode_names_body(a->enc, a->names, a->body, a->body_cap, &blen, &k);
    if (rc == 0 && off + KI_HEADER_BYTES + KI_TAG_BYTES > a->send_cap) rc = -ENOBUFS;
    if (rc == 0)
        rc = ki_compress_run(a->zc, a->body, blen, a->send_buf + off + KI_HEADER_BYTES,
                             a->send_cap - off - KI_HEADER_BYTES - KI_TAG_BYTES, &clen);
    uint64_t t = real_ns();
    if (a->last_t_max_ns && t < a->last_t_max_ns + NS_PER_MS) t = a->last_t_max_ns + NS_PER_MS;
    if (rc == 0) rc = ki_seal_frame(&a->seal, a->send_buf + off, clen, KI_COMPRESSION_ZSTD, t, t, 0, &flen);
    if (rc < 0) return rc;
    a->last_t_max_ns = t;
    *f = (struct ki_flight){.off = off, .len = flen, .names = 1};
    ki_log_debug(a->log, "names batch %u/%llu: %zu names, %zu -> %zu bytes", a->seal.epoch,
                 (unsigned long long)a->seal.next_seq - 1, k, blen, flen);
    return 0;
}

/* Fill send_buf with the oldest spooled batches, up to request_max bytes and KI_HTTP_MAX_FRAMES
 * batches (one while the collector takes only one). Returns the number, 0 when the spool is
 * empty, or a negative errno when it cannot be read. */
static int build_request(struct ki_agent *a) {
    int max = mono_ns() < a->single_until_ns ? 1 : KI_HTTP_MAX_FRAMES;
    size_t off = 0;
    a->nflight = 0;
    int names = 0; /* a names batch leads the request */
    if (a->names_wanted) {
        int rc = build_names_frame(a, &a->flight[0], 0);
        if (rc < 0) {
            ki_log_error(a->log, "cannot seal a names batch: %s (the batch goes without)", strerror(-rc));
            a->names_wanted = 0;
        } else {
            names = 1;
            off = a->flight[0].len;
            a->nflight = 1;
        }
    }
    while (a->nflight < max || (names && a->nflight == 1)) { /* one batch behind a names batch even when single */
        struct ki_flight *f = &a->flight[a->nflight];
        size_t cap = a->nflight ? (a->request_budget > off ? a->request_budget - off : 0) : a->send_cap;
        if (a->nflight == names) cap = a->send_cap - off; /* the first batch is sent whatever its size */
        f->names = 0;
        int rc = a->nflight > names ? ki_spool_peek_after(a->spool, a->flight[a->nflight - 1].id, a->send_buf + off,
                                                          cap, &f->len, &f->id)
                                    : ki_spool_peek(a->spool, a->send_buf + off, cap, &f->len, &f->id);
        if (rc == -ENOENT || (a->nflight && rc == -EMSGSIZE)) break; /* no more, or the next does not fit */
        if (rc == -EMSGSIZE || rc == -EBADMSG) {
            ki_log_error(a->log, "spooled batch %u/%llu is %s: dropped", f->id.epoch, (unsigned long long)f->id.seq,
                         rc == -EMSGSIZE ? "larger than this agent's buffers" : "damaged");
            a->ctr.v[KI_CTR_BATCHES_FAILED]++;
            ki_spool_remove(a->spool, f->id);
            continue;
        }
        if (rc < 0) {
            if (a->nflight > names) break;
            return rc;
        }
        f->off = off;
        off += f->len;
        a->nflight++;
        if (off >= a->request_budget) break;
    }
    return a->nflight;
}

/* Send spooled batches oldest first, one request in flight at a time, for up to budget_ns:
 * waiting for an answer never holds up the next drain for longer than the budget. A backlog
 * goes as requests of several batches, so a collector that was away catches up at its full rate. */
static void send_spool(struct ki_agent *a, uint64_t budget_ns) {
    const uint64_t end = mono_ns() + budget_ns;
    for (;;) {
        uint64_t now = mono_ns();
        if (a->in_flight) {
            struct ki_http_result res;
            int wait_ms = now < end ? (int)((end - now + NS_PER_MS - 1) / NS_PER_MS) : 0;
            int rc = ki_http_wait(a->http, wait_ms, &res);
            if (rc == -EAGAIN) {
                if (mono_ns() < a->flight_deadline_ns) return; /* still waiting: drain first */
                ki_http_reset(a->http);
                rc = -ETIMEDOUT;
                snprintf(a->proto_error, sizeof a->proto_error, "no answer within %lld ms to a request of %d batches",
                         (long long)a->cfg->io_timeout_ms, a->nflight);
                if (a->nflight > 1) a->request_budget /= 2; /* too much for the collector in io_timeout_ms */
            } else if (rc == 0 && mono_ns() - a->flight_sent_ns < (uint64_t)a->cfg->io_timeout_ms * NS_PER_MS / 4) {
                a->request_budget = a->request_budget < a->request_max / 2 ? a->request_budget * 2 : a->request_max;
                if (a->request_budget < 1024) a->request_budget = 1024;
            }
            if (!settle(a, rc, &res)) return;
            continue;
        }
        if (now >= end || now < a->next_send_ns) return;
        if (a->auth_blocked && now < a->auth_until_ns) return;
        int n = build_request(a);
        if (n == 0) return;
        if (n < 0) {
            ki_log_error(a->log, "cannot read the spool: %s", strerror(-n));
            schedule_retry(a, -1);
            return;
        }
        const struct ki_flight *last = &a->flight[n - 1];
        a->in_flight = 1;
        a->ctr.v[KI_CTR_REQUESTS_SENT]++;
        a->flight_sent_ns = mono_ns();
        a->flight_deadline_ns = a->flight_sent_ns + (uint64_t)a->cfg->io_timeout_ms * NS_PER_MS;
        int rc = ki_http_send(a->http, a->send_buf, last->off + last->len, n > 1 ? FRAMES_CONTENT_TYPE : NULL);
        if (rc < 0 && !settle(a, rc, NULL)) return;
    }
}

int ki_agent_tick(struct ki_agent *a) {
    int rc = drain_ring(a);
    send_spool(a, (uint64_t)a->cfg->drain_interval_ms * NS_PER_MS / 2 + NS_PER_MS);
    return rc;
}

static void sleep_until(uint64_t mono_deadline) {
    uint64_t now = mono_ns();
    if (mono_deadline <= now) return;
    uint64_t d = mono_deadline - now;
    struct timespec ts = {(time_t)(d / NS_PER_S), (long)(d % NS_PER_S)};
    nanosleep(&ts, NULL); /* a signal ends it early, which is what we want */
}

/* Drain, and when to drain next before the tick: once producers, at the rate they wrote since the
 * last drain, will have filled half the ring (UINT64_MAX: no records, the tick is soon enough).
 * What they wrote counts what a full ring dropped: read alone, a ring that overflowed would give
 * its capacity over the time since the last drain, a rate too low, and the next drain would come
 * too late again. */
static uint64_t drain_and_pace(struct ki_agent *a) {
    drain_ring(a);
    if (!a->drain) return UINT64_MAX;
    struct ki_drain_stats ds;
    ki_drain_stats(a->drain, &ds);
    uint64_t now = mono_ns(), read = a->ctr.v[KI_CTR_RECORDS_READ];
    uint64_t wrote = read - a->pace_read + (ds.dropped - a->pace_dropped), dt = now - a->pace_ns;
    a->pace_read = read;
    a->pace_dropped = ds.dropped;
    a->pace_ns = now;
    if (!wrote) return UINT64_MAX;
    double wait = (double)a->busy_records * (double)dt / (double)wrote;
    const double hour = 3600.0 * (double)NS_PER_S; /* later than any tick, and the cast stays defined */
    return now + (wait < (double)NS_PER_MS ? NS_PER_MS : wait > hour ? (uint64_t)hour : (uint64_t)wait);
}

/* Drain, then send (or wait for answers) until the next tick is due, with drains before it when
 * producers write fast: the default 32 Ki-slot ring holds 33 ms of records at 1M kernels/s, less than a
 * 100 ms tick, and a producer drops what a full ring cannot take. Paced by the rate seen, not
 * polled: a wake-up costs ~18 us of CPU on a VM, what ~1,000 records cost to fold. Half a ring,
 * not less: records read soon after they were written cost the agent more (measured: a quarter
 * 2-4 ns a kernel more than a half at 1M/s, docs/benchmarks.md). */
static void tick_until(struct ki_agent *a, uint64_t next_tick_ns, volatile sig_atomic_t *stop,
                       volatile sig_atomic_t *reload) {
    uint64_t early = drain_and_pace(a);
    for (;;) {
        uint64_t now = mono_ns();
        if (now >= next_tick_ns || *stop || *reload) return;
        uint64_t wake = early < next_tick_ns ? early : next_tick_ns;
        send_spool(a, wake > now ? wake - now : 0);
        sleep_until(wake); /* at once when send_spool waited for an answer that long */
        if (early < next_tick_ns && mono_ns() >= early) {
            a->ctr.v[KI_CTR_BUSY_DRAINS]++;
            early = drain_and_pace(a);
        }
    }
}

static void reload_key(struct ki_agent *a) {
    char err[256];
    struct ki_seal fresh = a->seal;
    if (ki_seal_load_key(&fresh, a->cfg->key_file, err, sizeof err) < 0) {
        ki_log_error(a->log, "SIGHUP: %s (keeping the current key)", err);
        return;
    }
    int same_agent = !memcmp(fresh.agent_id, a->seal.agent_id, KI_AGENT_ID_BYTES);
    if (sodium_memcmp(fresh.key, a->seal.key, KI_KEY_BYTES) != 0) {
        memcpy(a->prev_key, a->seal.key, KI_KEY_BYTES);
        a->have_prev_key = 1;
    }
    a->seal = fresh;
    ki_seal_wipe(&fresh);
    a->auth_blocked = 0;
    a->next_send_ns = 0;
    ki_log_info(a->log, "SIGHUP: key file reloaded (key %u%s); sending resumes", a->seal.key_id,
                same_agent ? "" : ", new agent id");
}

int ki_agent_run(struct ki_agent *a, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload) {
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    ki_log_info(a->log, "started: ring %s, collector %s, epoch %u, agent key %u, spool %s (%llu batches waiting)",
                a->ring_name, ki_http_target(a->http), a->seal.epoch, a->seal.key_id, a->cfg->spool_dir,
                (unsigned long long)ss.batches);
    const uint64_t interval = (uint64_t)a->cfg->drain_interval_ms * NS_PER_MS;
    uint64_t next = mono_ns(), next_attach = 0;
    uint64_t shed_text_ns = next + NS_PER_S; /* 0: done */
    while (!*stop) {
        if (shed_text_ns && mono_ns() >= shed_text_ns) {
            /* The code only the start ran (settings, keys, the spool's scan, the first connection):
             * ~0.4 MB of the text resident after start (docs/agent.md, "Memory"). */
            shed_text_ns = 0;
            long shed = ki_resident_shed_text();
            if (shed < 0) ki_log_debug(a->log, "cannot hand back the start's text: %s", strerror((int)-shed));
            else ki_log_debug(a->log, "text handed back after start: %ld KiB (%llu kB resident now)", shed / 1024,
                              (unsigned long long)ki_resident_kb());
        }
        if (*reload) {
            *reload = 0;
            reload_key(a);
        }
        if (!a->drain && mono_ns() >= next_attach) {
            char err[512];
            int rc = attach_ring(a, err, sizeof err);
            if (rc == 0) ki_log_info(a->log, "ring %s is there now: draining it", a->ring_name);
            else if (rc != -ENOENT) ki_log_error(a->log, "%s", err);
            next_attach = mono_ns() + NS_PER_S;
        }
        next += interval;
        uint64_t now = mono_ns();
        if (next < now) next = now;
        tick_until(a, next, stop, reload);
    }
    /* SIGTERM: what is in the ring and in memory goes to the spool, then try to deliver it. */
    a->stopping = 1;
    drain_ring(a);
    if (!a->pending) seal_batch(a, 0); /* a last batch carries the final counters (and histograms) */
    while (a->ks && !a->pending && ki_kstats_pending(a->ks)) seal_batch(a, 0); /* the rest of a big export */
    uint64_t deadline = mono_ns() + (uint64_t)a->cfg->shutdown_timeout_s * NS_PER_S;
    for (;;) {
        ki_spool_stats(a->spool, &ss);
        uint64_t now = mono_ns();
        if (!ss.batches || now >= deadline || (a->auth_blocked && a->auth_until_ns > deadline)) break;
        if (!a->in_flight && a->next_send_ns > now)
            sleep_until(a->next_send_ns < deadline ? a->next_send_ns : deadline);
        now = mono_ns();
        send_spool(a, deadline > now ? deadline - now : 0);
        if (a->snapshot_asked && a->ks && !a->pending && !a->in_flight) {
            /* An increment of the last batches lacked its base: one more export, every histogram
             * whole, so the stored values end exact (the collector asks once per miss). */
            a->snapshot_asked = 0;
            seal_batch(a, 0);
            while (!a->pending && ki_kstats_pending(a->ks)) seal_batch(a, 0);
        }
    }
    ki_spool_stats(a->spool, &ss);
    ki_log_info(a->log, "stopped: %llu records read, %llu batches sent, %llu left in the spool for the next start",
                (unsigned long long)a->ctr.v[KI_CTR_RECORDS_READ], (unsigned long long)a->ctr.v[KI_CTR_BATCHES_SENT],
                (unsigned long long)ss.batches);
    return 0;
}
