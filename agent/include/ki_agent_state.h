/*
 * ki_agent_state.h - the agent's state, shared by the files of the loop (agent.c, batch.c, send.c,
 * loop.c) and their unit tests; nothing else includes it (ki_agent.h is the public face).
 *
 * One struct per responsibility: the ring consumer's pacing and memory (ki_agent_ring), the batch
 * being built and sealed (ki_batcher), the requests to the collector (ki_sender); the parts they
 * all use (settings, ring, names, spool, key, counters) sit at the top.
 */
#ifndef KI_AGENT_STATE_H
#define KI_AGENT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "ki_capture.h"
#include "ki_compress.h"
#include "ki_config.h"
#include "ki_counters.h"
#include "ki_drain.h"
#include "ki_encode.h"
#include "ki_kstats.h"
#include "ki_labels.h"
#include "ki_log.h"
#include "ki_names.h"
#include "ki_seal.h"
#include "ki_spool.h"
#include "ki_transport.h"

#define KI_NS_PER_MS 1000000ULL
#define KI_NS_PER_S 1000000000ULL

/* The ring consumer: when to free slots, whether the ring's pages stay mapped, when to drain next. */
struct ki_agent_ring {
    uint64_t read_at_commit; /* ring read position when this drain started or last freed slots */
    uint64_t fold_commit;    /* records read between frees while folding a backlog: a 64th of the ring, >= KI_BATCH_FOLD_COMMIT_MIN */
    uint64_t busy_records;   /* records that make a drain due before the tick: half the ring */
    int kept;                /* the ring's pages stay mapped (ring_keep_kb; keep_ring in agent.c) */
    uint64_t keep_check_ns;  /* while kept: monotonic time of the next look at the resident memory */
    uint64_t keep_bytes;     /* histogram table and name bytes at the last look (growth_bytes in agent.c) */
    uint64_t pace_read;      /* records_read at the last drain (ki_loop_drain_and_pace) */
    uint64_t pace_dropped;   /* the ring's dropped count then */
    uint64_t pace_ns;        /* monotonic time of the last drain */
};

/* The batch being built: records staged from the ring, encoded, compressed, sealed, spooled. */
struct ki_batcher {
    struct ki_encoder *enc;  /* body encoder */
    struct ki_compress *zc;  /* zstd */
    uint8_t *hist;           /* the HISTOGRAMS section of the batch being sealed */
    size_t hist_cap;         /* its bytes */
    int captures_synced;     /* the sampler holds capture windows (cleared once none runs) */
    struct ki_record *staging; /* records of the batch being built */
    size_t staging_cap;      /* batch_records */
    size_t batch_max;        /* records that seal a batch: batch_records, a quarter of it with histograms on */
    size_t staged;           /* records in staging, read from the ring (slots kept) but not yet sealed */
    uint64_t staged_since_ns; /* monotonic time the first of them was read */
    uint8_t *body;           /* encoded body */
    size_t body_cap;         /* its bytes */
    uint8_t *frame;          /* header + sealed payload of the batch being sealed */
    size_t frame_cap;        /* its bytes */
    int pending;             /* a sealed batch (in frame) is not yet in the spool: its records stay in the ring */
    size_t pending_len;      /* its frame length */
    uint32_t pending_records; /* its records */
    struct ki_spool_mark pending_mark; /* its ring mark */
    int spool_errno;         /* the last spool write error (positive), 0 while writes succeed: logged on change */
    int names_errno;         /* the same for saving the name table */
    uint32_t mark;           /* batch mark for the name table */
    uint64_t last_seal_ns;   /* monotonic time of the last sealed batch */
    uint64_t last_t_max_ns;  /* header t_max of the last sealed batch (0: none yet) */
    uint64_t lost_batches;   /* batches that could not be spooled (disk errors) */
    uint64_t lost_records;   /* records in them */
};

/* One batch of the request in flight. */
struct ki_flight {
    struct ki_spool_id id; /* its spool id */
    size_t off;            /* where it starts in buf */
    size_t len;            /* its frame length */
    int names;             /* the names batch in front of the request: not in the spool */
};

/* The requests to the collector: what is in flight, backoff, the authentication pause, names once. */
struct ki_sender {
    uint8_t *buf;            /* the spooled batches of the request being sent, back to back */
    size_t cap;              /* its bytes: max(frame_cap, request_max) */
    size_t request_max;      /* request_max_kb in bytes: more batches join a request up to this */
    size_t request_budget;   /* what a request may carry now: halved after a request timed out,
                                doubled back (up to request_max) after quick answers */
    int in_flight;           /* a request is out, its answer not yet in */
    struct ki_flight flight[KI_HTTP_MAX_FRAMES]; /* the batches in flight, in body order */
    int nflight;             /* how many */
    uint64_t sent_ns;        /* when the request in flight went out */
    uint64_t deadline_ns;    /* give up waiting for its answer then */
    uint64_t single_until_ns; /* the collector refused a request of several batches: one per request until then */
    char proto_error[96];    /* words for a failed request that errno does not say (no answer in time, an
                                answer that does not settle each batch) */
    uint64_t next_send_ns;   /* monotonic time before which nothing is sent (backoff) */
    uint64_t backoff_ns;     /* current backoff, 0 when healthy */
    uint64_t rng;            /* xorshift state for jitter */
    int failing;             /* last attempt failed (log transitions only) */
    int auth_blocked;        /* 401/403 seen: paused until auth_until_ns or SIGHUP */
    uint64_t auth_until_ns;  /* end of the authentication pause */
    uint8_t prev_key[KI_KEY_BYTES]; /* the key before the last SIGHUP reload */
    int have_prev_key;       /* prev_key holds a key that differs from the current one */
    int snapshot_asked;      /* a collector asked for histogram snapshots (KI-Histogram-Snapshot) */
    int names_ok;            /* batches got through since the last failure: texts already sent may be left out */
    int names_wanted;        /* the collector lacked names (424): a names batch goes in front of the next request */
    int names_settled;       /* the names batch of the request being settled was stored (or refused for good) */
};

struct ki_agent {
    const struct ki_config *cfg; /* settings */
    const struct ki_log *log;    /* logger */
    struct ki_drain *drain;      /* ring consumer (NULL until the ring exists) */
    struct ki_names *names;      /* name table */
    struct ki_kstats *ks;        /* kernel histograms and kept spans (NULL: histograms off, wire body v1) */
    struct ki_spool *spool;      /* on-disk spool */
    struct ki_http *http;        /* collector connection */
    struct ki_seal seal;         /* key, epoch, sequence */
    struct ki_counters ctr;      /* self-metrics */
    struct ki_labels labels;     /* the configuration's instance labels, sent in every batch (LABELS) */
    struct ki_captures caps;     /* capture windows the collector asked for: their kernel spans bypass span
                                    sampling (ki_captures_covers), batches report on them (CAPTURES) */
    int stopping;                /* SIGTERM: seal everything now */
    struct ki_agent_ring ring;   /* agent.c, loop.c */
    struct ki_batcher batch;     /* batch.c */
    struct ki_sender send;       /* send.c */
    char ring_name[300];         /* shm name */
    char names_path[KI_CONFIG_PATH + 8]; /* where names survive a restart */
};

/* Become the ring's consumer; the names and the spool's restart mark of that ring apply from here.
 * Returns 0 or a negative errno with err (-ENOENT: no ring yet) (agent.c). */
int ki_agent_attach(struct ki_agent *a, char *err, size_t errlen);

/* Free the ring slots read so far; while the ring is kept, stop keeping it once the resident
 * memory passed ring_keep_kb (agent.c). */
void ki_agent_commit_slots(struct ki_agent *a);

#endif /* KI_AGENT_STATE_H */
