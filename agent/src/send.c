/* send.c - shipping the spool to the collector and settling each batch by its status (ki_send.h). */
#define _POSIX_C_SOURCE 200809L
#include "ki_send.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "ki_batch.h"
#include "ki_ring.h"
#include "ki_status.h"

int ki_send_create(struct ki_agent *a, char *err, size_t errlen) {
    a->send.request_max = (size_t)a->cfg->request_max_kb << 10;
    a->send.cap = a->batch.frame_cap > a->send.request_max ? a->batch.frame_cap : a->send.request_max;
    a->send.request_budget = a->send.request_max;
    a->send.buf = malloc(a->send.cap); /* pages are touched only as far as requests reach */
    if (!a->send.buf) {
        snprintf(err, errlen, "out of memory for the request buffer");
        return -1;
    }
    return 0;
}

void ki_send_destroy(struct ki_agent *a) {
    free(a->send.buf);
    sodium_memzero(a->send.prev_key, sizeof a->send.prev_key);
}


static uint64_t next_random(struct ki_agent *a) {
    uint64_t x = a->send.rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return a->send.rng = x;
}

uint64_t ki_send_retry_delay(uint64_t *backoff_ns, uint64_t lo_ns, uint64_t hi_ns, int retry_after_s, uint64_t random) {
    *backoff_ns = *backoff_ns ? *backoff_ns * 2 : lo_ns;
    if (*backoff_ns > hi_ns) *backoff_ns = hi_ns;
    if (retry_after_s >= 0) {
        uint64_t delay = (uint64_t)retry_after_s * KI_NS_PER_S;
        if (delay > hi_ns) delay = hi_ns; /* a collector's word is trusted only up to the longest backoff */
        return delay + random % (delay / 10 + 1); /* spread a fleet told the same Retry-After */
    }
    return *backoff_ns / 2 + random % (*backoff_ns / 2 + 1); /* "equal jitter" */
}

void ki_send_backoff(struct ki_agent *a, int retry_after_s) {
    uint64_t lo = (uint64_t)a->cfg->backoff_min_ms * KI_NS_PER_MS, hi = (uint64_t)a->cfg->backoff_max_ms * KI_NS_PER_MS;
    uint64_t delay = ki_send_retry_delay(&a->send.backoff_ns, lo, hi, retry_after_s, next_random(a));
    a->send.next_send_ns = ki_ring_mono_ns() + delay;
}

enum frame_verdict { FRAME_DONE, FRAME_RETRY, FRAME_AUTH, FRAME_NAMES };

/* The collector may lack texts this agent left out (a request failed, a batch was refused): the
 * next batches carry every name's text again until batches get through (names_ok). */
static void names_lost(struct ki_agent *a) {
    if (a->send.names_ok) ki_names_forget(a->names);
    a->send.names_ok = 0;
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
    if (a->send.names_settled) return 0;
    if (!a->send.names_wanted)
        ki_log_info(a->log, "collector lacks names batch %u/%llu left out: sending every name, then the batch again",
                    f->id.epoch, (unsigned long long)f->id.seq);
    a->send.names_wanted = 1;
    return 1;
}

/* Settle one batch of the request from its status. */
static enum frame_verdict settle_frame(struct ki_agent *a, const struct ki_flight *f, int s) {
    struct ki_spool_id id = f->id;
    uint8_t *frame = a->send.buf + f->off;
    enum ki_status_class c = ki_status_classify(s);
    if (f->names) { /* the names batch: nothing in the spool; when it did not get through, the next request carries one */
        /* Stored, or refused for good (a collector that can never take it: the batches behind it
         * would otherwise go round forever and hold up the spool). */
        a->send.names_settled = c == KI_STATUS_STORED || c == KI_STATUS_PERMANENT;
        if (a->send.names_settled) a->send.names_wanted = 0;
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
        if (a->send.have_prev_key && ki_seal_reseal(&a->seal, a->send.prev_key, frame, f->len, &flen) == 0) {
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
        if (!a->send.auth_blocked)
            ki_log_error(a->log,
                         "collector refused batch %u/%llu with %d (%s): sending stopped, batches are kept in the "
                         "spool; fix the key file and send SIGHUP (next try in %llds)",
                         id.epoch, (unsigned long long)id.seq, s,
                         s == 401 ? "authentication failed: wrong key" : "agent unknown or revoked",
                         (long long)a->cfg->auth_retry_s);
        a->send.auth_blocked = 1;
        a->send.auth_until_ns = ki_ring_mono_ns() + (uint64_t)a->cfg->auth_retry_s * KI_NS_PER_S;
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
    int rc = ki_spool_dead_letter(a->spool, id, frame, f->len, s, ki_ring_now_ns());
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
        int rc = ki_captures_start(&a->caps, o, ki_ring_now_ns());
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
    int n = a->send.nflight;
    a->send.in_flight = 0;
    a->send.nflight = 0;
    enum ki_status_answer answer = ki_status_answer(rc, res, n);
    if (answer == KI_ANSWER_SINGLE) {
        ki_log_warn(a->log, "collector answered %d to a request of %d batches: sending one batch per request",
                    res->status, n);
        a->send.single_until_ns = ki_ring_mono_ns() + KI_SEND_SINGLE_NS;
        return 1;
    }
    if (answer == KI_ANSWER_UNSPLIT) {
        rc = -EPROTO; /* an answer that does not settle each batch: retried, one per request */
        snprintf(a->send.proto_error, sizeof a->send.proto_error, "answer %d without one status per batch",
                 res->status);
        a->send.single_until_ns = ki_ring_mono_ns() + KI_SEND_SINGLE_NS;
    }
    if (rc < 0) {
        if (a->ks) ki_kstats_snapshot(a->ks, 0); /* its batches may reach another collector, or one that restarted */
        names_lost(a);
        a->ctr.v[KI_CTR_BATCHES_RETRIED] += (uint64_t)n;
        a->ctr.v[KI_CTR_REQUESTS_FAILED]++;
        if (!a->send.failing)
            ki_log_warn(a->log, "collector %s unreachable (%s): spooling and retrying with backoff",
                        ki_http_target(a->http),
                        a->send.proto_error[0]          ? a->send.proto_error
                        : *ki_http_error(a->http) ? ki_http_error(a->http)
                                                  : strerror(-rc));
        a->send.proto_error[0] = '\0';
        a->send.failing = 1;
        ki_send_backoff(a, -1);
        return 0;
    }
    if (res->ncaptures || res->bad_captures) start_captures(a, res);
    if (res->snapshot && a->ks) {
        ki_log_info(a->log, "collector asked for histogram snapshots (it lacked a base): the next export is cumulative");
        ki_kstats_snapshot(a->ks, 1);
        a->send.snapshot_asked = 1;
    }
    int retry = 0, auth = 0, done = 0, retry_status = 0, names = 0;
    a->send.names_settled = 0; /* a names batch leads its request: settled first, it vouches for this request only */
    for (int i = 0; i < n; i++) {
        int s = ki_status_of(res, n, i); /* its KI-Batch-Status entry, or the one answer for the whole request */
        enum frame_verdict v = settle_frame(a, &a->send.flight[i], s);
        if (v == FRAME_RETRY) retry_status = s;
        retry += v == FRAME_RETRY;
        auth += v == FRAME_AUTH;
        done += v == FRAME_DONE && !a->send.flight[i].names;
        names += v == FRAME_NAMES;
    }
    if (retry || auth) names_lost(a);
    if (retry) {
        if (a->ks) ki_kstats_snapshot(a->ks, 0);
        if (!a->send.failing) {
            if (res->retry_after >= 0)
                ki_log_warn(a->log, "collector answered %d (retry after %ds): retrying with backoff", retry_status,
                            res->retry_after);
            else
                ki_log_warn(a->log, "collector answered %d (no Retry-After): retrying with backoff", retry_status);
        }
        a->send.failing = 1;
        ki_send_backoff(a, res->retry_after);
        return 0;
    }
    if (auth) return 0;
    if (a->send.failing || a->send.auth_blocked) ki_log_info(a->log, "collector %s accepts batches again", ki_http_target(a->http));
    a->send.failing = 0;
    a->send.auth_blocked = 0;
    a->send.backoff_ns = 0;
    if (!names && done) a->send.names_ok = 1;
    return done > 0 || names > 0;
}

/* Fill the request buffer with the oldest spooled batches, up to request_max bytes and KI_HTTP_MAX_FRAMES
 * batches (one while the collector takes only one). Returns the number, 0 when the spool is
 * empty, or a negative errno when it cannot be read. */
static int build_request(struct ki_agent *a) {
    int max = ki_ring_mono_ns() < a->send.single_until_ns ? 1 : KI_HTTP_MAX_FRAMES;
    size_t off = 0;
    a->send.nflight = 0;
    int names = 0; /* a names batch leads the request */
    if (a->send.names_wanted) {
        size_t len;
        int rc = ki_batch_seal_names(a, a->send.buf, a->send.cap, &len);
        if (rc < 0) {
            ki_log_error(a->log, "cannot seal a names batch: %s (the batch goes without)", strerror(-rc));
            a->send.names_wanted = 0;
        } else {
            a->send.flight[0] = (struct ki_flight){.off = 0, .len = len, .names = 1};
            names = 1;
            off = len;
            a->send.nflight = 1;
        }
    }
    while (a->send.nflight < max || (names && a->send.nflight == 1)) { /* one batch behind a names batch even when single */
        struct ki_flight *f = &a->send.flight[a->send.nflight];
        size_t cap = a->send.nflight ? (a->send.request_budget > off ? a->send.request_budget - off : 0) : a->send.cap;
        if (a->send.nflight == names) cap = a->send.cap - off; /* the first batch is sent whatever its size */
        f->names = 0;
        int rc = a->send.nflight > names ? ki_spool_peek_after(a->spool, a->send.flight[a->send.nflight - 1].id, a->send.buf + off,
                                                          cap, &f->len, &f->id)
                                    : ki_spool_peek(a->spool, a->send.buf + off, cap, &f->len, &f->id);
        if (rc == -ENOENT || (a->send.nflight && rc == -EMSGSIZE)) break; /* no more, or the next does not fit */
        if (rc == -EMSGSIZE || rc == -EBADMSG) {
            ki_log_error(a->log, "spooled batch %u/%llu is %s: dropped", f->id.epoch, (unsigned long long)f->id.seq,
                         rc == -EMSGSIZE ? "larger than this agent's buffers" : "damaged");
            a->ctr.v[KI_CTR_BATCHES_FAILED]++;
            ki_spool_remove(a->spool, f->id);
            continue;
        }
        if (rc < 0) {
            if (a->send.nflight > names) break;
            return rc;
        }
        f->off = off;
        off += f->len;
        a->send.nflight++;
        if (off >= a->send.request_budget) break;
    }
    return a->send.nflight;
}

/* Send spooled batches oldest first, one request in flight at a time, for up to budget_ns:
 * waiting for an answer never holds up the next drain for longer than the budget. A backlog
 * goes as requests of several batches, so a collector that was away catches up at its full rate. */
void ki_send_spool(struct ki_agent *a, uint64_t budget_ns) {
    const uint64_t end = ki_ring_mono_ns() + budget_ns;
    for (;;) {
        uint64_t now = ki_ring_mono_ns();
        if (a->send.in_flight) {
            struct ki_http_result res;
            int wait_ms = now < end ? (int)((end - now + KI_NS_PER_MS - 1) / KI_NS_PER_MS) : 0;
            int rc = ki_http_wait(a->http, wait_ms, &res);
            if (rc == -EAGAIN) {
                if (ki_ring_mono_ns() < a->send.deadline_ns) return; /* still waiting: drain first */
                ki_http_reset(a->http);
                rc = -ETIMEDOUT;
                snprintf(a->send.proto_error, sizeof a->send.proto_error, "no answer within %lld ms to a request of %d batches",
                         (long long)a->cfg->io_timeout_ms, a->send.nflight);
                if (a->send.nflight > 1) a->send.request_budget /= 2; /* too much for the collector in io_timeout_ms */
            } else if (rc == 0 && ki_ring_mono_ns() - a->send.sent_ns < (uint64_t)a->cfg->io_timeout_ms * KI_NS_PER_MS / 4) {
                a->send.request_budget = a->send.request_budget < a->send.request_max / 2 ? a->send.request_budget * 2 : a->send.request_max;
                if (a->send.request_budget < 1024) a->send.request_budget = 1024;
            }
            if (!settle(a, rc, &res)) return;
            continue;
        }
        if (now >= end || now < a->send.next_send_ns) return;
        if (a->send.auth_blocked && now < a->send.auth_until_ns) return;
        int n = build_request(a);
        if (n == 0) return;
        if (n < 0) {
            ki_log_error(a->log, "cannot read the spool: %s", strerror(-n));
            ki_send_backoff(a, -1);
            return;
        }
        const struct ki_flight *last = &a->send.flight[n - 1];
        a->send.in_flight = 1;
        a->ctr.v[KI_CTR_REQUESTS_SENT]++;
        a->send.sent_ns = ki_ring_mono_ns();
        a->send.deadline_ns = a->send.sent_ns + (uint64_t)a->cfg->io_timeout_ms * KI_NS_PER_MS;
        int rc = ki_http_send(a->http, a->send.buf, last->off + last->len, n > 1 ? KI_SEND_FRAMES_CONTENT_TYPE : NULL);
        if (rc < 0 && !settle(a, rc, NULL)) return;
    }
}


void ki_send_reload_key(struct ki_agent *a) {
    char err[256];
    struct ki_seal fresh = a->seal;
    if (ki_seal_load_key(&fresh, a->cfg->key_file, err, sizeof err) < 0) {
        ki_log_error(a->log, "SIGHUP: %s (keeping the current key)", err);
        return;
    }
    int same_agent = !memcmp(fresh.agent_id, a->seal.agent_id, KI_AGENT_ID_BYTES);
    if (sodium_memcmp(fresh.key, a->seal.key, KI_KEY_BYTES) != 0) {
        memcpy(a->send.prev_key, a->seal.key, KI_KEY_BYTES);
        a->send.have_prev_key = 1;
    }
    a->seal = fresh;
    ki_seal_wipe(&fresh);
    a->send.auth_blocked = 0;
    a->send.next_send_ns = 0;
    ki_log_info(a->log, "SIGHUP: key file reloaded (key %u%s); sending resumes", a->seal.key_id,
                same_agent ? "" : ", new agent id");
}
