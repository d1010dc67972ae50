/* agent.c - the agent's parts put together (ki_agent.h): settings, key, spool, connection, the ring
 * and its memory; the batch builder is batch.c, the sender send.c, the loop loop.c. */
#define _POSIX_C_SOURCE 200809L
#include "ki_agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ki_agent_state.h"
#include "ki_batch.h"
#include "ki_resident.h"
#include "ki_ring.h"
#include "ki_send.h"

#define INGEST_PATH "/v1/ingest"
#define KEEP_GROWTH (16u << 10) /* table and names growth that makes a kept ring's agent look at its resident memory at once */


/* Whether the ring's pages stay mapped: handing pages back (MADV_DONTNEED, then a page fault when
 * the next lap reads them) is a large share of the agent's CPU a record at high rates
 * (`make bench-histogram`, bench/results/histogram.md), so a ring that fits under ring_keep_kb with everything else stays mapped
 * whole. Decided at attach from the resident memory then; from there on ki_agent_commit_slots stops
 * keeping for good once the resident memory passes the bound (keys, names and exports grew),
 * and the peak ends at most one step of growth above it: ring_keep_kb is 512 kB under the 5 MB
 * the agent is held to, for that step. (Not getrusage's ru_maxrss: Linux carries the peak of
 * the process that exec'd the agent into it.) */
static void keep_ring(struct ki_agent *a, uint64_t slots) {
    uint64_t limit = (uint64_t)a->cfg->ring_keep_kb, ring_kb = slots * KI_RING_RECORD_SIZE / 1024;
    uint64_t now = ki_resident_kb();
    a->ring.kept = limit && now + ring_kb <= limit;
    a->ring.keep_check_ns = 0;
    ki_drain_keep_pages(a->drain, a->ring.kept);
    if (a->ring.kept)
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
void ki_agent_commit_slots(struct ki_agent *a) {
    ki_drain_commit(a->drain);
    if (!a->ring.kept) return;
    uint64_t now = ki_ring_mono_ns(), bytes = growth_bytes(a);
    if (now < a->ring.keep_check_ns && bytes < a->ring.keep_bytes + KEEP_GROWTH) return;
    a->ring.keep_check_ns = now + (uint64_t)a->cfg->drain_interval_ms * KI_NS_PER_MS;
    a->ring.keep_bytes = bytes;
    uint64_t rss = ki_resident_kb();
    if (rss <= (uint64_t)a->cfg->ring_keep_kb) return;
    a->ring.kept = 0;
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
int ki_agent_attach(struct ki_agent *a, char *err, size_t errlen) {
    int rc = 0;
    a->drain = ki_drain_create(a->ring_name, (int)a->cfg->ring_create, (uint64_t)a->cfg->ring_capacity, &rc, err,
                               errlen);
    if (!a->drain) return rc < 0 ? rc : -EIO;
    struct ki_drain_stats ds;
    ki_drain_stats(a->drain, &ds);
    a->ring.fold_commit = ds.capacity / 64 > KI_BATCH_FOLD_COMMIT_MIN ? ds.capacity / 64 : KI_BATCH_FOLD_COMMIT_MIN;
    a->ring.busy_records = ds.capacity / 2;
    keep_ring(a, ds.capacity);
    a->ring.pace_read = a->ctr.v[KI_CTR_RECORDS_READ];
    a->ring.pace_dropped = ds.dropped;
    a->ring.pace_ns = ki_ring_mono_ns();
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
    a->send.rng = ki_ring_now_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    if (ki_labels_parse(&a->labels, cfg->labels, err, errlen) < 0) goto fail;
    if (ki_seal_load_key(&a->seal, cfg->key_file, err, errlen) < 0) goto fail;
    int rc = mkdirs(cfg->spool_dir);
    if (rc < 0) {
        snprintf(err, errlen, "cannot create spool directory %s: %s", cfg->spool_dir, strerror(-rc));
        goto fail;
    }
    if (ki_seal_next_epoch(&a->seal, cfg->spool_dir, (uint32_t)(ki_ring_now_ns() / KI_NS_PER_S), err, errlen) < 0) goto fail;
    a->spool = ki_spool_create(cfg->spool_dir, (uint64_t)cfg->spool_max_mb << 20, (uint64_t)cfg->dead_letter_max_mb << 20,
                               (int)cfg->spool_fsync, err, errlen);
    if (!a->spool) goto fail;
    a->http = ki_http_create(cfg->collector, INGEST_PATH, cfg->tls_ca_file, (int)cfg->connect_timeout_ms,
                             (int)cfg->io_timeout_ms, err, errlen);
    if (!a->http) goto fail;
    a->names = ki_names_create((size_t)cfg->names_max, (size_t)cfg->names_bytes, (size_t)cfg->name_max);
    if (!a->names) {
        snprintf(err, errlen, "out of memory for the name table");
        goto fail;
    }
    if (ki_batch_create(a, err, errlen) < 0 || ki_send_create(a, err, errlen) < 0) goto fail;
    ki_config_ring_name(cfg, a->ring_name, sizeof a->ring_name);
    snprintf(a->names_path, sizeof a->names_path, "%s/names", cfg->spool_dir);
    rc = ki_agent_attach(a, err, errlen);
    if (rc == -ENOENT && !cfg->ring_create) {
        ki_log_warn(log, "%s: waiting for a producer to create it (or start with --ring-create)", err);
    } else if (rc < 0) {
        goto fail;
    }
    a->batch.last_seal_ns = ki_ring_mono_ns();
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
    ki_batch_destroy(a);
    ki_send_destroy(a);
    ki_kstats_destroy(a->ks);
    ki_names_destroy(a->names);
    ki_seal_wipe(&a->seal);
    free(a);
}

const struct ki_counters *ki_agent_counters(const struct ki_agent *a) { return &a->ctr; }

void ki_agent_capture(struct ki_agent *a, int gpu, uint64_t until_real_ns) {
    if (a->ks) ki_kstats_capture(a->ks, gpu, until_real_ns);
}
