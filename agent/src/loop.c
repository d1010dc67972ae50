/* loop.c - the agent's tick: drain, send between drains, shut down (ki_loop.h, ki_agent.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_loop.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "ki_agent.h"
#include "ki_batch.h"
#include "ki_resident.h"
#include "ki_ring.h"
#include "ki_send.h"

int ki_agent_tick(struct ki_agent *a) {
    int rc = ki_batch_drain(a);
    ki_send_spool(a, (uint64_t)a->cfg->drain_interval_ms * KI_NS_PER_MS / 2 + KI_NS_PER_MS);
    return rc;
}

static void sleep_until(uint64_t mono_deadline) {
    uint64_t now = ki_ring_mono_ns();
    if (mono_deadline <= now) return;
    uint64_t d = mono_deadline - now;
    struct timespec ts = {(time_t)(d / KI_NS_PER_S), (long)(d % KI_NS_PER_S)};
    nanosleep(&ts, NULL); /* a signal ends it early, which is what we want */
}

/* Drain, and when to drain next before the tick: once producers, at the rate they wrote since the
 * last drain, will have filled half the ring (UINT64_MAX: no records, the tick is soon enough).
 * What they wrote counts what a full ring dropped: read alone, a ring that overflowed would give
 * its capacity over the time since the last drain, a rate too low, and the next drain would come
 * too late again. */
uint64_t ki_loop_drain_and_pace(struct ki_agent *a) {
    ki_batch_drain(a);
    if (!a->drain) return UINT64_MAX;
    struct ki_drain_stats ds;
    ki_drain_stats(a->drain, &ds);
    uint64_t now = ki_ring_mono_ns(), read = a->ctr.v[KI_CTR_RECORDS_READ];
    uint64_t wrote = read - a->ring.pace_read + (ds.dropped - a->ring.pace_dropped), dt = now - a->ring.pace_ns;
    a->ring.pace_read = read;
    a->ring.pace_dropped = ds.dropped;
    a->ring.pace_ns = now;
    if (!wrote) return UINT64_MAX;
    double wait = (double)a->ring.busy_records * (double)dt / (double)wrote;
    const double hour = 3600.0 * (double)KI_NS_PER_S; /* later than any tick, and the cast stays defined */
    return now + (wait < (double)KI_NS_PER_MS ? KI_NS_PER_MS : wait > hour ? (uint64_t)hour : (uint64_t)wait);
}

/* Drain, then send (or wait for answers) until the next tick is due, with drains before it when
 * producers write fast: the default 32 Ki-slot ring holds 33 ms of records at 1M kernels/s, less than a
 * 100 ms tick, and a producer drops what a full ring cannot take. Paced by the rate seen, not
 * polled: a wake-up costs as much CPU as folding about a thousand records. Half a ring, not less:
 * records read soon after they were written cost the agent more CPU a kernel (`make
 * bench-histogram`, bench/results/histogram.md). */
void ki_loop_tick_until(struct ki_agent *a, uint64_t next_tick_ns, volatile sig_atomic_t *stop,
                       volatile sig_atomic_t *reload) {
    uint64_t early = ki_loop_drain_and_pace(a);
    for (;;) {
        uint64_t now = ki_ring_mono_ns();
        if (now >= next_tick_ns || *stop || *reload) return;
        uint64_t wake = early < next_tick_ns ? early : next_tick_ns;
        ki_send_spool(a, wake > now ? wake - now : 0);
        sleep_until(wake); /* at once when send_spool waited for an answer that long */
        if (early < next_tick_ns && ki_ring_mono_ns() >= early) {
            a->ctr.v[KI_CTR_BUSY_DRAINS]++;
            early = ki_loop_drain_and_pace(a);
        }
    }
}

int ki_agent_run(struct ki_agent *a, volatile sig_atomic_t *stop, volatile sig_atomic_t *reload) {
    struct ki_spool_stats ss;
    ki_spool_stats(a->spool, &ss);
    ki_log_info(a->log, "started: ring %s, collector %s, epoch %u, agent key %u, spool %s (%llu batches waiting)",
                a->ring_name, ki_http_target(a->http), a->seal.epoch, a->seal.key_id, a->cfg->spool_dir,
                (unsigned long long)ss.batches);
    const uint64_t interval = (uint64_t)a->cfg->drain_interval_ms * KI_NS_PER_MS;
    uint64_t next = ki_ring_mono_ns(), next_attach = 0;
    uint64_t shed_text_ns = next + KI_NS_PER_S; /* 0: done */
    while (!*stop) {
        if (shed_text_ns && ki_ring_mono_ns() >= shed_text_ns) {
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
            ki_send_reload_key(a);
        }
        if (!a->drain && ki_ring_mono_ns() >= next_attach) {
            char err[512];
            int rc = ki_agent_attach(a, err, sizeof err);
            if (rc == 0) ki_log_info(a->log, "ring %s is there now: draining it", a->ring_name);
            else if (rc != -ENOENT) ki_log_error(a->log, "%s", err);
            next_attach = ki_ring_mono_ns() + KI_NS_PER_S;
        }
        next += interval;
        uint64_t now = ki_ring_mono_ns();
        if (next < now) next = now;
        ki_loop_tick_until(a, next, stop, reload);
    }
    /* SIGTERM: what is in the ring and in memory goes to the spool, then try to deliver it. */
    a->stopping = 1;
    ki_batch_drain(a);
    if (!a->batch.pending) ki_batch_seal(a, 0); /* a last batch carries the final counters (and histograms) */
    while (a->ks && !a->batch.pending && ki_kstats_pending(a->ks)) ki_batch_seal(a, 0); /* the rest of a big export */
    uint64_t deadline = ki_ring_mono_ns() + (uint64_t)a->cfg->shutdown_timeout_s * KI_NS_PER_S;
    for (;;) {
        ki_spool_stats(a->spool, &ss);
        uint64_t now = ki_ring_mono_ns();
        if (!ss.batches || now >= deadline || (a->send.auth_blocked && a->send.auth_until_ns > deadline)) break;
        if (!a->send.in_flight && a->send.next_send_ns > now)
            sleep_until(a->send.next_send_ns < deadline ? a->send.next_send_ns : deadline);
        now = ki_ring_mono_ns();
        ki_send_spool(a, deadline > now ? deadline - now : 0);
        if (a->send.snapshot_asked && a->ks && !a->batch.pending && !a->send.in_flight) {
            /* An increment of the last batches lacked its base: one more export, every histogram
             * whole, so the stored values end exact (the collector asks once per miss). */
            a->send.snapshot_asked = 0;
            ki_batch_seal(a, 0);
            while (!a->batch.pending && ki_kstats_pending(a->ks)) ki_batch_seal(a, 0);
        }
    }
    ki_spool_stats(a->spool, &ss);
    ki_log_info(a->log, "stopped: %llu records read, %llu batches sent, %llu left in the spool for the next start",
                (unsigned long long)a->ctr.v[KI_CTR_RECORDS_READ], (unsigned long long)a->ctr.v[KI_CTR_BATCHES_SENT],
                (unsigned long long)ss.batches);
    return 0;
}
