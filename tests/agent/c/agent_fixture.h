/*
 * agent_fixture.h - a real agent for the unit tests of its files (batch.c, send.c, loop.c): a key
 * file, a spool directory and a ring of its own (created by the agent, unlinked at exit), the
 * configuration read by ki_config_load from flags, and a producer attached to the ring.
 */
#ifndef AGENT_FIXTURE_H
#define AGENT_FIXTURE_H
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ki_agent.h"
#include "ki_agent_state.h"
#include "ki_ring.h"
#include "ki_test.h"

struct fixture {
    struct ki_config cfg;
    struct ki_log log;
    struct ki_agent *agent;
    struct ki_ring ring; /* the producer's side */
    char ring_name[64];
    char dir[512];
};

static char fixture_ring_to_unlink[64];
static void fixture_unlink(void) {
    if (fixture_ring_to_unlink[0]) ki_ring_unlink(fixture_ring_to_unlink);
}

/* Start an agent in dir (created) sending to collector; extra: more flags, NULL-terminated. */
static inline void fixture_start(struct fixture *f, const char *dir, const char *collector, const char *const *extra) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    mkdir(dir, 0700);
    snprintf(f->ring_name, sizeof f->ring_name, "/ki_test_agent.%d", (int)getpid());
    ki_ring_unlink(f->ring_name);
    snprintf(fixture_ring_to_unlink, sizeof fixture_ring_to_unlink, "%s", f->ring_name);
    atexit(fixture_unlink);
    char key[600], spool[600];
    snprintf(key, sizeof key, "%s/agent.key", dir);
    snprintf(spool, sizeof spool, "%s/spool", dir);
    FILE *k = fopen(key, "w");
    CHECK(k != NULL);
    fputs("agent_id = 000102030405060708090a0b0c0d0e0f\nkey_id = 3\n"
          "key = 6465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f80818283\n",
          k);
    fclose(k);
    CHECK_EQ(chmod(key, 0600), 0);
    const char *argv[64] = {"ki-agent", "--ring", f->ring_name, "--ring-create", "--ring-capacity", "1024",
                            "--collector", collector, "--key-file", key, "--spool-dir", spool,
                            "--log-level", "error"};
    int argc = 14;
    for (int i = 0; extra && extra[i]; i++) argv[argc++] = extra[i];
    char *none[] = {NULL};
    char err[512];
    FILE *devnull = fopen("/dev/null", "w");
    int rc = ki_config_load(&f->cfg, argc, (char **)argv, none, devnull, err, sizeof err);
    fclose(devnull);
    if (rc != 0) fprintf(stderr, "config: %s\n", err);
    CHECK_EQ(rc, 0);
    ki_log_init(&f->log, ki_log_level_parse("error"), 2);
    f->agent = ki_agent_create(&f->cfg, &f->log, err, sizeof err);
    if (!f->agent) fprintf(stderr, "agent: %s\n", err);
    CHECK(f->agent != NULL);
    CHECK_EQ(ki_ring_attach(&f->ring, f->ring_name, KI_RING_PRODUCER, err, sizeof err), 0);
}

static inline void fixture_stop(struct fixture *f) {
    ki_ring_close(&f->ring);
    ki_agent_destroy(f->agent);
    ki_ring_unlink(f->ring_name);
    fixture_ring_to_unlink[0] = '\0';
}

/* Write n records of type LAUNCH (never folded into histograms: each one is staged and shipped). */
static inline void fixture_produce(struct fixture *f, int n) {
    for (int i = 0; i < n; i++) {
        struct ki_rec rec;
        memset(&rec, 0, sizeof rec);
        rec.type = KI_REC_LAUNCH;
        rec.id = 7;
        rec.ts_ns = ki_ring_now_ns();
        CHECK_EQ(ki_ring_write(&f->ring, &rec), 0);
    }
}

static inline uint64_t fixture_spooled(const struct fixture *f) {
    struct ki_spool_stats ss;
    ki_spool_stats(f->agent->spool, &ss);
    return ss.batches;
}

#endif /* AGENT_FIXTURE_H */
