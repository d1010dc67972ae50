/*
 * bench_histogram_core: CPU per observation into the agent's native-histogram table
 * (agent/src/histogram.c) with 10,000 distinct keys, and the table's memory.
 *
 * Observations are pre-generated (durations lognormal around 50 us with 1% stragglers
 * 10-1000x slower) and fed in ticks of 100,000 (one 100 ms drain tick at 1M observations/s)
 * for `seconds` simulated seconds, twice: keys uniform over the 10,000 (the cache's worst
 * case), then Zipf-distributed (s = 1.1: a few hot kernels, a long tail of rare ones, as
 * a training step launches them). Prints key=value pairs; bench/histogram turns them into
 * the BENCH line.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ki_histogram.h"

#define KEYS 10000
#define POOL (1u << 20)
#define TICK 100000

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static long hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 10;
    int schema = argc > 2 ? atoi(argv[2]) : 3;
    unsigned max_buckets = argc > 3 ? (unsigned)atoi(argv[3]) : 160;
    static struct ki_histogram_key keys[KEYS];
    for (uint32_t i = 0; i < KEYS; i++)
        keys[i] = (struct ki_histogram_key){1000 + i % 4, 0, i % 8 == 7 ? KI_HISTOGRAM_NO_STREAM : i % 8, i};
    uint16_t *kidx = malloc(POOL * sizeof *kidx), *zidx = malloc(POOL * sizeof *zidx);
    double *dur = malloc(POOL * sizeof *dur), *cdf = malloc(KEYS * sizeof *cdf);
    if (!kidx || !zidx || !dur || !cdf) return 1;
    double acc = 0;
    for (uint32_t i = 0; i < KEYS; i++) cdf[i] = acc += pow(i + 1, -1.1);
    for (uint32_t i = 0; i < POOL; i++) {
        double u = urand() * acc;
        uint32_t lo = 0, hi = KEYS - 1;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        zidx[i] = (uint16_t)((lo * 7919u) % KEYS); /* hot keys scattered over the table */
        kidx[i] = (uint16_t)(urand() * KEYS);
        double z = sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand());
        dur[i] = 50e-6 * exp(0.6 * z) * (urand() < 0.01 ? 10 + 990 * urand() : 1);
    }
    long hwm0 = hwm_kb();
    struct ki_histogram_config cfg = {schema, KI_HISTOGRAM_DEFAULT_ZERO_THRESHOLD, max_buckets, 0, KEYS};
    struct ki_histtab *t = ki_histtab_create(&cfg);
    if (!t) return 1;
    /* Warm-up: every key seen once (the table's steady state), not timed. */
    for (uint32_t i = 0; i < KEYS; i++) ki_histtab_observe(t, &keys[i], dur[i]);
    uint64_t n = 0, pos = 0;
    double best_tick = 1e9, c0 = cpu_s();
    for (int s = 0; s < seconds * 10; s++) {
        double t0 = cpu_s();
        for (int i = 0; i < TICK; i++) {
            ki_histtab_observe(t, &keys[kidx[pos]], dur[pos]);
            pos = (pos + 1) & (POOL - 1);
        }
        double dt = cpu_s() - t0;
        if (dt < best_tick) best_tick = dt;
        n += TICK;
    }
    double total = cpu_s() - c0;
    double z0 = cpu_s();
    for (int s = 0; s < seconds * 10; s++)
        for (int i = 0; i < TICK; i++) {
            ki_histtab_observe(t, &keys[zidx[pos]], dur[pos]);
            pos = (pos + 1) & (POOL - 1);
        }
    double zipf = cpu_s() - z0;
    struct ki_histtab_stats st;
    ki_histtab_stats(t, &st);
    printf("ns_per_obs=%.1f zipf_ns_per_obs=%.1f best_tick_ns_per_obs=%.1f table_kb=%llu hwm_growth_kb=%ld keys=%llu obs=%llu "
           "schema=%d max_buckets=%u refused=%llu\n",
           total / (double)n * 1e9, zipf / (double)n * 1e9, best_tick / TICK * 1e9, (unsigned long long)(st.bytes / 1024),
           hwm_kb() - hwm0, (unsigned long long)st.keys, (unsigned long long)n, schema, max_buckets,
           (unsigned long long)(st.obs_refused + st.bucket_refused));
    ki_histtab_destroy(t);
    free(kidx);
    free(zidx);
    free(cdf);
    free(dur);
    return 0;
}
