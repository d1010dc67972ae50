/*
 * bench_drain: the agent's CPU per record on its histogram path, ring read included, in one
 * process (issue 14): what bench.histogram's cpu phase measures, without the collector and
 * without another process's noise, and deterministic enough for callgrind's instruction counts.
 *
 *   bench_drain RING LAPS [THREADED [NAMES]]
 *
 * A 65,536-slot ring RING (created, unlinked at the end) gets the records of
 * bench/histogram/kernel_producer.c (NAMES kernel names, default 100, lognormal durations, one in
 * 200 a straggler, stream 7); the consumer drains it as ki-agent does with histograms on: reads of
 * 256 through ki_drain_poll_keep into ki_kstats_fold (the agent's default settings), a
 * ki_drain_commit every 1,024 records read (a 64th of the ring, which also hands the ring's read
 * pages back). Without THREADED one thread fills the ring's whole lap, then drains it, LAPS
 * times (the drain's instructions alone are exact under callgrind; the slots come from this
 * core's cache). With THREADED (1) a producer thread writes as fast as the ring takes records
 * while the consumer drains every 10 ms, as in the agent, whose slots come from another core;
 * THREADED 2 pins the consumer to CPU 0 and the producer to CPU 1 (the scheduler otherwise
 * puts them on one core in some runs and on two in others: on dev-2c 35 against 50 ns a record,
 * two figures that A/B runs must not mix).
 * Records are stamped 1 us apart (1M kernels/s of record time).
 * Prints the consumer thread's CPU ns per record (CLOCK_THREAD_CPUTIME_ID: user and kernel
 * time, page faults and MADV_DONTNEED included), min and median over the laps (drains).
 *
 * Built as the agent's unit tests are (-O2, as the shipped binary):
 *   make -C agent/src OUT=/tmp unit TEST=$PWD/bench/histogram/bench_drain.c && /tmp/bench_drain /bd 20
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ki_ring.h"
#include "ki_drain.h"
#include "ki_kstats.h"

#define CAP 65536u
static uint32_t kernels = 100;
#define READ 256u
#define COMMIT 1024u

static uint64_t state = 0x9E3779B97F4A7C15ULL;
static double uniform(void) { /* kernel_producer.c's xorshift64*, (0, 1) */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return ((double)((state * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) * 0x1.0p-53;
}

static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static uint32_t *kid;
static uint64_t *dur;
#define POOL (1u << 18)

static void make_pool(void) {
    kid = malloc(POOL * sizeof *kid);
    dur = malloc(POOL * sizeof *dur);
    if (!kid || !dur) exit(1);
    for (uint32_t i = 0; i < POOL; i++) {
        uint32_t k = (uint32_t)(uniform() * kernels);
        if (k >= kernels) k = kernels - 1;
        double d = 20000.0 * (1.0 + (double)(k % 16)) * exp(0.5 * normal());
        if (uniform() < 0.005) d *= fmin(1000.0, pow(uniform(), -1.0 / 1.3));
        kid[i] = k + 1;
        dur[i] = (uint64_t)d + 1;
    }
}

static double thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Start of record time, a whole second. Records are stamped 1 us apart from it (1M kernels/s)
 * rather than with the clock: the span sampler's per-second windows then hold the same records in
 * every run, so callgrind's counts depend neither on how fast the (slowed) producer ran nor on
 * where in a second it started. (The first second, whose rate is not known yet, keeps its first
 * 100 spans; a run of LAPS <= 14 stays in it. Later seconds sample at 50 / 1M kernels: since
 * session 10 by a geometric gap counted down, one random number per kept span, so a long run
 * (LAPS 45: 3 s) counts about the same instructions per record as a short one.) */
static uint64_t t0_ns;

struct prod {
    const char *name;
    int threaded;
    uint64_t count;
    volatile int done;
};

/* Write count records (or until the ring is full when count is 0), returns the number written. */
static uint64_t produce(struct ki_ring *r, uint64_t *i, uint64_t count, int wait) {
    uint64_t n = 0;
    while (!count || n < count) {
        uint32_t p = (uint32_t)(*i & (POOL - 1));
        uint64_t now = t0_ns + *i * 1000; /* record time: 1M kernels/s, whatever the real pace */
        int rc = ki_ring_kernel(r, kid[p], 0, now, now + dur[p], 7, *i);
        if (rc != 0) {
            if (!wait) break;
            struct timespec us = {0, 50000};
            nanosleep(&us, NULL);
            continue;
        }
        (*i)++;
        n++;
    }
    return n;
}

/* THREADED 2: the calling thread onto cpu. */
static void pin(int threaded, int cpu) {
    if (threaded != 2) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin to cpu %d\n", cpu);
        exit(1);
    }
}

static void *producer_main(void *arg) {
    struct prod *p = arg;
    pin(p->threaded, 1);
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, p->name, KI_RING_PRODUCER, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    uint64_t i = 0;
    produce(&r, &i, p->count, 1);
    ki_ring_close(&r);
    p->done = 1;
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Drain everything the ring holds as the agent does; returns the records read. */
static uint64_t drain(struct ki_drain *d, struct ki_kstats *ks, struct ki_record *staging) {
    uint64_t total = 0, since = 0;
    for (;;) {
        size_t read, want = READ;
        if (want > COMMIT - since) want = COMMIT - since;
        ki_drain_poll_keep(d, staging, want, ki_kstats_fold, ks, &read);
        total += read;
        since += read;
        if (since >= COMMIT || !read) {
            ki_drain_commit(d);
            since = 0;
        }
        if (!read) return total;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_drain RING LAPS [THREADED [NAMES]]\n");
        return 2;
    }
    const char *name = argv[1];
    int laps = atoi(argv[2]), threaded = argc > 3 ? atoi(argv[3]) : 0;
    if (argc > 4 && atoi(argv[4]) > 0) kernels = (uint32_t)atoi(argv[4]);
    make_pool();
    t0_ns = ki_ring_now_ns() / 1000000000ULL * 1000000000ULL;
    char err[256];
    int rc = 0;
    ki_ring_unlink(name);
    struct ki_drain *d = ki_drain_create(name, 1, CAP, &rc, err, sizeof err);
    if (!d) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct ki_kstats_config kc = {
        .hist = {.schema = 3, .zero_threshold = KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD, .max_buckets = 160,
                 .max_keys = 12288},
        .interval_ns = 7000000000ULL,
        .span_sample_rate = 50,
        .span_tail_rate = 200,
        .tail_quantile = 0.99,
        .tail_min_count = 100,
        .section_max = 1u << 16,
        .snapshot_ns = 300000000000ULL,
        .idle_ns = 300000000000ULL,
    };
    struct ki_kstats *ks = ki_kstats_create(&kc);
    struct ki_record *staging = malloc(READ * sizeof *staging);
    double *per = malloc((size_t)laps * sizeof *per);
    if (!ks || !staging || !per) return 1;
    uint64_t records = 0;
    int runs = 0;
    if (!threaded) {
        struct ki_ring r;
        if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        uint64_t i = 0;
        produce(&r, &i, 0, 0);
        drain(d, ks, staging); /* warm-up: every key seen, the ring's pages handed back once */
        for (int l = 0; l < laps; l++) {
            produce(&r, &i, 0, 0);
            double t0 = thread_ns();
            uint64_t n = drain(d, ks, staging);
            per[runs++] = (thread_ns() - t0) / (double)n;
            records += n;
        }
        ki_ring_close(&r);
    } else {
        struct prod p = {name, threaded, (uint64_t)laps * CAP, 0};
        pin(threaded, 0);
        pthread_t th;
        pthread_create(&th, NULL, producer_main, &p);
        while (!p.done) {
            struct timespec ms = {0, 10000000};
            nanosleep(&ms, NULL);
            double t0 = thread_ns();
            uint64_t n = drain(d, ks, staging);
            if (n >= 4096) per[runs < laps ? runs++ : laps - 1] = (thread_ns() - t0) / (double)n;
            records += n;
        }
        pthread_join(th, NULL);
        records += drain(d, ks, staging);
    }
    qsort(per, (size_t)runs, sizeof *per, cmp);
    struct ki_kstats_stats st;
    ki_kstats_stats(ks, &st);
    printf("ns_per_record_min=%.1f ns_per_record_median=%.1f drains=%d records=%llu aggregated=%llu\n",
           runs ? per[0] : NAN, runs ? per[runs / 2] : NAN, runs, (unsigned long long)records,
           (unsigned long long)st.aggregated);
    ki_kstats_destroy(ks);
    ki_drain_destroy(d);
    ki_ring_unlink(name);
    free(staging);
    free(per);
    free(kid);
    free(dur);
    return 0;
}
