/*
 * probe_spans.c - spans through ki_probe.h (CPU clock back end here; with nvcc
 * the same calls time CUDA events).  Usage: probe_spans RING_NAME
 * Pattern: "outer" around 5 x "inner_sleep_2ms" (2 ms of sleep each), then 200 x "tiny".
 */
#include "ki_probe.h"

#include <stdio.h>
#include <stdlib.h>

static struct ki_probe probe; /* 128 KiB of span slots: static, not on the stack */

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: probe_spans RING_NAME\n");
        return 2;
    }
    char err[256];
    if (ki_probe_init(&probe, 3, argv[1], err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint32_t outer = ki_probe_name(&probe, "outer");
    uint32_t inner = ki_probe_name(&probe, "inner_sleep_2ms");
    uint32_t tiny = ki_probe_name(&probe, "tiny");
    int o = ki_probe_begin(&probe, outer, (ki_probe_stream)(uintptr_t)7);
    for (int i = 0; i < 5; i++) {
        int s = ki_probe_begin(&probe, inner, (ki_probe_stream)(uintptr_t)7);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        ki_probe_end(&probe, s);
    }
    ki_probe_end(&probe, o);
    for (int i = 0; i < 200; i++) ki_probe_end(&probe, ki_probe_begin(&probe, tiny, 0));
    ki_probe_close(&probe);
    printf("written=%llu dropped=%llu\n", (unsigned long long)probe.written, (unsigned long long)probe.dropped);
    return 0;
}
