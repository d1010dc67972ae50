/* batch.c - building batches from drained records (ki_batch.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ki_resident.h"
#include "ki_ring.h"

int ki_batch_create(struct ki_agent *a, char *err, size_t errlen) {
    const struct ki_config *cfg = a->cfg;
    a->batch.staging_cap = (size_t)cfg->batch_records;
    a->batch.staging = malloc(a->batch.staging_cap * sizeof *a->batch.staging);
    /* With histograms on, staged records are kept spans and the types not folded (and the STRINGs
     * of a burst of new names): batches of a quarter of batch_records touch a quarter of staging,
     * body, frame and zstd's context (~0.5 MB less at 10,000 new names). */
    a->batch.batch_max = cfg->histograms && a->batch.staging_cap / 4 >= 64 ? a->batch.staging_cap / 4 : a->batch.staging_cap;
    a->batch.enc = ki_encoder_create(a->batch.staging_cap, a->names);
    if (!a->batch.staging || !a->batch.enc) {
        snprintf(err, errlen, "out of memory for batch buffers (batch_records %lld)", (long long)cfg->batch_records);
        return -1;
    }
    if (cfg->histograms) {
        struct ki_kstats_config kc = {
            .hist = {.schema = (int32_t)cfg->histogram_schema,
                     .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD,
                     .max_buckets = (uint32_t)cfg->histogram_max_buckets,
                     .max_keys = (uint32_t)cfg->histogram_max_keys},
            .interval_ns = (uint64_t)cfg->histogram_interval_s * KI_NS_PER_S,
            .span_sample_rate = (uint32_t)cfg->span_sample_rate,
            .span_tail_rate = (uint32_t)cfg->span_tail_rate,
            .tail_quantile = (double)cfg->span_tail_permille / 1000.0,
            .tail_min_count = 100,
            .section_max = KI_BATCH_HIST_SECTION_MAX,
            .snapshot_ns = (uint64_t)cfg->histogram_snapshot_s * KI_NS_PER_S,
            .idle_ns = (uint64_t)cfg->histogram_idle_s * KI_NS_PER_S,
        };
        while (!(a->ks = ki_kstats_create(&kc)) && errno == EINVAL && kc.section_max < (1u << 22))
            kc.section_max *= 2; /* a histogram of many buckets needs a bigger section */
        if (!a->ks) {
            snprintf(err, errlen, "cannot create the kernel histograms: %s", strerror(errno));
            return -1;
        }
        a->batch.hist_cap = ki_kstats_section_bound(a->ks);
        a->batch.hist = malloc(a->batch.hist_cap);
        if (!a->batch.hist) {
            snprintf(err, errlen, "out of memory for the histogram section");
            return -1;
        }
        ki_encoder_reserve(a->batch.enc, a->batch.hist_cap);
    }
    a->batch.body_cap = ki_encoder_bound(a->batch.enc) + KI_CAPTURE_SECTION_MAX + a->labels.len;
    a->batch.frame_cap = KI_HEADER_BYTES + ki_compress_bound(a->batch.body_cap) + KI_TAG_BYTES;
    a->batch.body = malloc(a->batch.body_cap);
    a->batch.frame = malloc(a->batch.frame_cap);
    /* zstd's context sized once for a full body: a catch-up's full batches allocate nothing. */
    a->batch.zc = ki_compress_create((int)cfg->zstd_level, a->batch.body_cap);
    if (!a->batch.body || !a->batch.frame || !a->batch.zc) {
        snprintf(err, errlen, "out of memory for batch buffers");
        return -1;
    }
    return 0;
}

void ki_batch_destroy(struct ki_agent *a) {
    ki_encoder_destroy(a->batch.enc);
    ki_compress_destroy(a->batch.zc);
    free(a->batch.hist);
    free(a->batch.staging);
    free(a->batch.body);
    free(a->batch.frame);
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
    c->v[KI_CTR_SPOOL_DROPPED_BATCHES] = ss.dropped_batches + a->batch.lost_batches;
    c->v[KI_CTR_SPOOL_DROPPED_RECORDS] = ss.dropped_records + a->batch.lost_records;
    c->v[KI_CTR_SPOOL_BYTES] = ss.bytes;
    c->v[KI_CTR_SPOOL_BATCHES] = ss.batches;
    c->v[KI_CTR_BATCHES_SEALED] += 1;
    c->v[KI_CTR_NAMES_RESET] = ki_names_resets(a->names);
    c->v[KI_CTR_NAMES_TRUNCATED] = ki_names_truncated(a->names);
    uint64_t now = ki_ring_now_ns();
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
    int rc = ki_spool_put(a->spool, a->batch.frame, a->batch.pending_len, &a->batch.pending_mark);
    if (rc < 0) {
        a->ctr.v[KI_CTR_SPOOL_WRITE_ERRORS]++;
        if (-rc != a->batch.spool_errno)
            ki_log_error(a->log,
                         "cannot write to the spool %s: %s; records stay in the ring until it can (batches already "
                         "spooled are still sent)",
                         a->cfg->spool_dir, strerror(-rc));
        a->batch.spool_errno = -rc;
        return rc;
    }
    if (a->batch.spool_errno) ki_log_info(a->log, "the spool %s takes batches again", a->cfg->spool_dir);
    a->batch.spool_errno = 0;
    a->batch.pending = 0;
    ki_agent_commit_slots(a);
    /* Names are registered once per producer: keep them for the next run (only when a name completed). */
    int saved = ki_names_save(a->names, a->names_path, ki_drain_ring_created_ns(a->drain));
    if (saved < 0 && -saved != a->batch.names_errno)
        ki_log_warn(a->log, "cannot save names to %s: %s", a->names_path, strerror(-saved));
    if (saved >= 0 && a->batch.names_errno) ki_log_info(a->log, "names are saved to %s again", a->names_path);
    a->batch.names_errno = saved < 0 ? -saved : 0;
    return 0;
}

/* A kernel histogram of this batch: its name travels with it (the STRINGS section). */
static void mark_name(void *arg, uint32_t producer, uint32_t id) {
    struct ki_agent *a = arg;
    if (!ki_names_mark(a->names, producer, id, a->batch.mark)) ki_encoder_unnamed(a->batch.enc);
}

/* Whether a histogram export is due (ki_kstats_want). Idle keys are not evicted while a batch
 * waits to be settled (in the spool, or sealed and not yet spooled): it may carry an idle key's
 * last change, and if it is refused for good only a key still in the table is re-sent
 * (docs/agent.md, "Idle keys are evicted"). */
static int export_due(struct ki_agent *a, uint64_t mono) {
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    ki_kstats_hold_sweep(a->ks, ss.batches > 0 || a->batch.pending);
    return ki_kstats_want(a->ks, mono, ki_ring_now_ns());
}

/* Encode, compress, seal and spool the n staged records (n may be 0: a heartbeat). */
int ki_batch_seal(struct ki_agent *a, size_t n) {
    if (++a->batch.mark == 0) a->batch.mark = 1;
    size_t blen, clen, flen, hlen = 0;
    uint64_t hist_ts = 0;
    struct ki_batch_info info;
    if (a->ks) {
        /* Body v2: this batch's KERNEL records are the kept spans; the kernels are counted in
         * the histograms, shipped every histogram_interval_s (in parts when there are many). */
        if (export_due(a, a->stopping ? UINT64_MAX : ki_ring_mono_ns())) {
            /* Increments build on the collector's copy of the previous export: while batches are not
             * getting through, every histogram goes whole (docs/wire.md, "Increments"). Not after a
             * mere reconnect: a collector closes an idle kept-alive connection (uvicorn: after 5 s),
             * so at a 10 s interval with no spans every export would go over a new one; a collector
             * that lacks a base says so (KI-Histogram-Snapshot). */
            a->send.snapshot_asked = 0; /* this export answers an earlier request for snapshots */
            if (a->send.failing || a->send.auth_blocked) ki_kstats_snapshot(a->ks, 0);
            ki_kstats_encode(a->ks, a->batch.hist, a->batch.hist_cap, &hlen, &hist_ts, mark_name, a);
        }
        /* Body v3, or v4 when the HISTOGRAMS section may hold increments. */
        ki_encoder_set_extra(a->batch.enc, ki_kstats_increments(a->ks) ? KI_BODY_VERSION_INCREMENTS : KI_BODY_VERSION_PDELTA,
                             KI_SECTION_HISTOGRAMS, a->batch.hist, hlen);
    }
    /* Names once (docs/wire.md): only while batches get through, so a batch sealed while the
     * collector is away (it waits in the spool, and may reach another collector) resolves alone. */
    ki_encoder_set_names_once(a->batch.enc, a->send.names_ok && !a->send.failing && !a->send.auth_blocked);
    ki_captures_count(&a->caps, a->batch.staging, n);
    int rc = ki_encode_body(a->batch.enc, a->batch.staging, n, a->names, a->batch.mark, &a->ctr, update_counters, a, a->batch.body,
                            a->batch.body_cap - KI_CAPTURE_SECTION_MAX - a->labels.len, &blen, &info);
    if (rc == 0) blen += ki_captures_section(&a->caps, ki_ring_now_ns(), a->batch.body + blen, a->batch.body_cap - blen);
    if (rc == 0) blen += ki_labels_section(&a->labels, a->batch.body + blen, a->batch.body_cap - blen);
    if (rc == 0)
        rc = ki_compress_run(a->batch.zc, a->batch.body, blen, a->batch.frame + KI_HEADER_BYTES,
                             a->batch.frame_cap - KI_HEADER_BYTES - KI_TAG_BYTES, &clen);
    if (rc < 0) {
        /* Cannot happen with buffers sized by the encoder's bound; if it does, the loss is counted. */
        ki_agent_commit_slots(a);
        a->batch.lost_batches++;
        a->batch.lost_records += n;
        ki_log_error(a->log, "cannot encode a batch of %zu records: %s (records dropped, counted as spool drops)", n,
                     strerror(-rc));
        return rc;
    }
    a->ctr.v[KI_CTR_BYTES_RAW] += blen;
    a->ctr.v[KI_CTR_BYTES_COMPRESSED] += clen;
    uint64_t t_min = info.t_min, t_max = info.t_max;
    if (!info.shipped) t_min = t_max = hlen ? hist_ts : ki_ring_now_ns();
    if (hlen && hist_ts < t_min) t_min = hist_ts; /* the histograms' time lies in the batch's range too */
    if (hlen && hist_ts > t_max) t_max = hist_ts;
    /* The collector stamps this batch's counters at t_max (docs/metrics.md): one batch is one
     * sample of each, so t_max is at least 1 ms (the store's resolution) after the previous
     * batch's. Batches sharing a time (the parts of one export, sealed back to back at SIGTERM;
     * a heartbeat right after a batch of fresh records) would otherwise give every counter two
     * values at one timestamp; the collector keeps them apart too, but only within one process,
     * and this holds across its restarts. Every record still lies in [t_min, t_max]. */
    if (a->batch.last_t_max_ns && t_max < a->batch.last_t_max_ns + KI_NS_PER_MS) t_max = a->batch.last_t_max_ns + KI_NS_PER_MS;
    a->batch.pending_mark = (struct ki_spool_mark){ki_drain_ring_created_ns(a->drain), ki_drain_read_pos(a->drain)};
    rc = ki_seal_frame(&a->seal, a->batch.frame, clen, KI_COMPRESSION_ZSTD, t_min, t_max, info.shipped, &flen);
    if (rc < 0) {
        ki_agent_commit_slots(a);
        a->batch.lost_batches++;
        a->batch.lost_records += info.shipped;
        ki_log_error(a->log, "cannot seal a batch of %u records: %s (counted as spool drops)", info.shipped,
                     strerror(-rc));
        return rc;
    }
    a->batch.last_t_max_ns = t_max;
    a->batch.pending = 1;
    a->batch.pending_len = flen;
    a->batch.pending_records = info.shipped;
    a->batch.last_seal_ns = ki_ring_mono_ns();
    ki_log_debug(a->log, "sealed batch %u/%llu: %u records, %zu names (%zu left out), %zu -> %zu bytes",
                 a->seal.epoch, (unsigned long long)a->seal.next_seq - 1, info.shipped, (size_t)info.names,
                 (size_t)info.omitted, blen, flen);
    return spool_pending(a);
}

/* Whether staged records may wait for more: while batches queue up in the spool (the collector
 * is away or slower than the producers), a batch gathers records for up to KI_BATCH_BACKLOG_SEAL_NS
 * instead of one tick, so the backlog is fewer, larger batches that the collector takes in
 * fewer steps. The records stay in the ring meanwhile, so a batch is sealed at once when
 * the ring is half full or the agent is stopping. */
static int hold_back(struct ki_agent *a) {
    if (a->stopping || ki_ring_mono_ns() - a->batch.staged_since_ns >= KI_BATCH_BACKLOG_SEAL_NS) return 0;
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    if (!a->send.failing && ss.batches < 2) return 0;
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
    return a->ks && !a->stopping && n < a->batch.batch_max &&
           ki_ring_mono_ns() - a->batch.staged_since_ns < (uint64_t)a->cfg->span_seal_ms * KI_NS_PER_MS;
}

/* Capture windows bypass span sampling: hand each GPU's "capture until" to the sampler
 * (while windows run, and once more after the last ends to clear them). */
static void sync_captures(struct ki_agent *a) {
    int running = ki_captures_running(&a->caps);
    if (!running && !a->batch.captures_synced) return;
    for (int g = 0; g < KI_KSTATS_MAX_GPUS; g++) ki_kstats_capture(a->ks, g, ki_captures_until(&a->caps, (uint32_t)g));
    a->batch.captures_synced = running;
}

/* Consume everything the ring holds, sealing a batch per batch_records records. */
int ki_batch_drain(struct ki_agent *a) {
    if (a->batch.pending && spool_pending(a) < 0) return 0; /* the spool still refuses: read nothing more */
    if (a->ks) sync_captures(a);
    size_t n = a->batch.staged;
    int read_any = 0;
    a->ring.read_at_commit = ki_drain_read_pos(a->drain);
    for (;;) {
        size_t want = a->batch.staging_cap - n, got, read;
        if (a->ks) {
            /* Records go from their slots straight into the histograms; only kept spans (and the
             * types not folded) are copied into staging. Read up to the next free of slots. */
            uint64_t since = ki_drain_read_pos(a->drain) - a->ring.read_at_commit;
            size_t left = since < a->ring.fold_commit ? (size_t)(a->ring.fold_commit - since) : KI_BATCH_FOLD_READ;
            if (want > left) want = left;
            got = ki_drain_poll_keep(a->drain, a->batch.staging + n, want, ki_kstats_fold, a->ks, &read);
            read_any |= read > 0;
        } else {
            got = read = ki_drain_poll(a->drain, a->batch.staging + n, want);
        }
        a->ctr.v[KI_CTR_RECORDS_READ] += read;
        int more = read > 0;
        if (got && n == 0) a->batch.staged_since_ns = ki_ring_mono_ns();
        n += got;
        if (n >= a->batch.batch_max) {
            size_t full = n;
            n = a->batch.staged = 0;
            if (ki_batch_seal(a, full) < 0 && a->batch.pending) return 0;
            continue;
        }
        if (!more) break;
        if (a->ks && !a->batch.pending && ki_drain_read_pos(a->drain) - a->ring.read_at_commit >= a->ring.fold_commit) {
            /* A backlog folds into histograms without filling a batch: seal the few kept spans so
             * the slots read so far are freed (and their pages dropped) now, not when the ring is
             * empty: the producer need not wait on a full ring, and the agent maps a 64th of it
             * at most instead of all of it. */
            if (n && !hold_kept(a, n)) {
                a->batch.staged = 0;
                int rc = ki_batch_seal(a, n);
                n = 0;
                if (rc < 0 && a->batch.pending) return 0;
            } else {
                ki_agent_commit_slots(a); /* what is staged waits in memory (hold_kept) */
            }
            a->ring.read_at_commit = ki_drain_read_pos(a->drain);
        }
    }
    a->batch.staged = n;
    if (n > 0) {
        if (hold_back(a)) return 0;
        if (!hold_kept(a, n)) {
            a->batch.staged = 0;
            return ki_batch_seal(a, n);
        }
    }
    /* A histogram export, a heartbeat, or a capture window's final report (due even when its
     * GPU is idle): seal now, with whatever waits in staging. */
    if ((a->ks && export_due(a, ki_ring_mono_ns())) ||
        ki_ring_mono_ns() - a->batch.last_seal_ns >= (uint64_t)a->cfg->heartbeat_s * KI_NS_PER_S || ki_captures_due(&a->caps, ki_ring_now_ns())) {
        a->batch.staged = 0;
        return ki_batch_seal(a, n);
    }
    /* Everything read went into histograms or waits in staging: nothing to spool now, so the
     * slots are free now. */
    if (read_any && !a->batch.pending) ki_agent_commit_slots(a);
    return 0;
}

int ki_batch_seal_names(struct ki_agent *a, uint8_t *buf, size_t cap, size_t *len) {
    size_t blen, clen, k;
    int rc = ki_encode_names_body(a->batch.enc, a->names, a->batch.body, a->batch.body_cap, &blen, &k);
    if (rc == 0 && KI_HEADER_BYTES + KI_TAG_BYTES > cap) rc = -ENOBUFS;
    if (rc == 0)
        rc = ki_compress_run(a->batch.zc, a->batch.body, blen, buf + KI_HEADER_BYTES,
                             cap - KI_HEADER_BYTES - KI_TAG_BYTES, &clen);
    uint64_t t = ki_ring_now_ns();
    if (a->batch.last_t_max_ns && t < a->batch.last_t_max_ns + KI_NS_PER_MS) t = a->batch.last_t_max_ns + KI_NS_PER_MS;
    if (rc == 0) rc = ki_seal_frame(&a->seal, buf, clen, KI_COMPRESSION_ZSTD, t, t, 0, len);
    if (rc < 0) return rc;
    a->batch.last_t_max_ns = t;
    ki_log_debug(a->log, "names batch %u/%llu: %zu names, %zu -> %zu bytes", a->seal.epoch,
                 (unsigned long long)a->seal.next_seq - 1, k, blen, *len);
    return 0;
}
