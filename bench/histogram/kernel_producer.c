/*
 * kernel_producer - writes long-tailed KERNEL records into a ring, as a CUDA probe would
 * (make bench-histogram, tests/agent/test_agent_histograms.py).
 *
 *   kernel_producer RING COUNT KERNELS RATE SEED [DURATIONS_FILE|-] [NAMES_FILE]
 *
 * COUNT kernels over KERNELS names, RATE per second (0: as fast as the ring
 * takes them). Durations: lognormal body around 20 us (sigma 0.5) times a per-kernel scale,
 * one in 200 a Pareto(1.3) straggler up to 1000x: the tail users hunt. Ring full: the record
 * waits (nothing is dropped, so the exact durations are known). With DURATIONS_FILE every
 * duration is written there (u64 ns, little-endian) for the exact quantiles ("-": not written).
 * Names: kernel_0 .. by default (9 bytes: what the wire's STRINGS cost is hidden by); with
 * NAMES_FILE, its lines in turn (bench/histogram/kernel_names.txt: PyTorch, cuBLAS, cutlass,
 * flash-attention, Triton and NCCL kernels as Nsight Systems shows them, 181 bytes on average),
 * kernel k taking line k mod lines, with " #<k / lines>" appended past the first round so that
 * every name stays distinct. Prints "written <n>" at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ki_ring.h"

static uint64_t state;
static double uniform(void) { /* xorshift64*, (0, 1) */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return ((double)((state * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) * 0x1.0p-53;
}

static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: kernel_producer RING COUNT KERNELS RATE SEED [DURATIONS_FILE|-] [NAMES_FILE]\n");
        return 2;
    }
    const char *name = argv[1];
    uint64_t count = strtoull(argv[2], NULL, 10), rate = strtoull(argv[4], NULL, 10);
    uint32_t kernels = (uint32_t)strtoul(argv[3], NULL, 10);
    state = strtoull(argv[5], NULL, 10) * 0x9E3779B97F4A7C15ULL + 1;
    const int want_out = argc > 6 && strcmp(argv[6], "-") != 0;
    FILE *out = want_out ? fopen(argv[6], "wb") : NULL;
    if (want_out && !out) {
        perror(argv[6]);
        return 1;
    }
    static char lines[1 << 16]; /* the names file, its lines NUL-terminated in place */
    const char *line_at[1024];
    uint32_t nlines = 0;
    if (argc > 7) {
        FILE *nf = fopen(argv[7], "rb");
        if (!nf) {
            perror(argv[7]);
            return 1;
        }
        size_t got = fread(lines, 1, sizeof lines - 1, nf);
        fclose(nf);
        lines[got] = '\0';
        for (char *p = lines; *p && nlines < 1024;) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = '\0';
            if (*p) line_at[nlines++] = p;
            if (!nl) break;
            p = nl + 1;
        }
        if (nlines == 0) {
            fprintf(stderr, "%s: no names\n", argv[7]);
            return 1;
        }
    }
    if (kernels == 0) kernels = 1;
    struct ki_ring r;
    char err[256];
    if (ki_ring_attach(&r, name, KI_RING_PRODUCER, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    char kname[1100];
    for (uint32_t k = 0; k < kernels; k++) {
        int len = !nlines        ? snprintf(kname, sizeof kname, "kernel_%u", k)
                  : k < nlines ? snprintf(kname, sizeof kname, "%.1000s", line_at[k])
                               : snprintf(kname, sizeof kname, "%.1000s #%u", line_at[k % nlines], k / nlines);
        while (ki_ring_string(&r, k + 1, kname, (size_t)len) != 0) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    const uint64_t t0 = ki_ring_mono_ns();
    const uint64_t real0 = ki_ring_now_ns();
    uint64_t now = real0;
    for (uint64_t i = 0; i < count; i++) {
        if (rate && (i & 1023) == 0) { /* pace in steps of 1024 kernels */
            uint64_t due = t0 + (uint64_t)((double)i * 1e9 / (double)rate);
            struct timespec ts = {(time_t)(due / 1000000000ULL), (long)(due % 1000000000ULL)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
        /* Paced, kernel i starts at its due time (real kernels do not share a start, and a shared
         * one would flatter the timestamp column of the shipped spans); unpaced, the clock is
         * read every 256 kernels. */
        if (rate) now = real0 + (uint64_t)((double)i * 1e9 / (double)rate);
        else if ((i & 255) == 0) now = ki_ring_now_ns();
        uint32_t k = (uint32_t)(uniform() * kernels);
        if (k >= kernels) k = kernels - 1;
        double scale = 1.0 + (double)(k % 16); /* kernels differ in speed */
        double d = 20000.0 * scale * exp(0.5 * normal());
        if (uniform() < 0.005) d *= fmin(1000.0, pow(uniform(), -1.0 / 1.3)); /* stragglers */
        uint64_t dur = (uint64_t)d + 1;
        if (out) fwrite(&dur, sizeof dur, 1, out);
        while (ki_ring_kernel(&r, k + 1, 0, now, now + dur, 7, i) != 0) {
            struct timespec us = {0, 200000};
            nanosleep(&us, NULL); /* ring full: wait for the agent */
        }
    }
    if (out) fclose(out);
    ki_ring_close(&r);
    printf("written %" PRIu64 "\n", count);
    return 0;
}
