/*
 * ring_bench: producer cost per record and consumer drain rate of ki_ring.h.
 *   ring_bench NAME RECORDS ROUNDS
 * prints "c_producer_ns=<median ns/record> drain_mrps=<median M records/s>"
 */
#define _POSIX_C_SOURCE 200809L
#include "ki_ring.h"

#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const char *name = argv[1];
    uint64_t n = strtoull(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    char err[256];
    struct ki_ring p;
    struct ki_ring_consumer c;
    if (ki_ring_attach(&p, name, KI_RING_PRODUCER, err, sizeof err) < 0 ||
        ki_ring_consumer_open(&c, name, 0, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (p.hdr->capacity < n) return 3;
    struct ki_record *out = malloc(4096 * sizeof *out);
    double prod[64], drain[64];
    for (int r = 0; r < rounds && r < 64; r++) {
        uint64_t t0 = ki_ring_mono_ns();
        for (uint64_t i = 0; i < n; i++)
            if (ki_ring_kernel(&p, 7, 0, i, i + 1000, 3, i) != 0) return 4;
        uint64_t t1 = ki_ring_mono_ns();
        uint64_t got = 0;
        while (got < n) got += ki_ring_consume(&c, out, 4096, 0);
        uint64_t t2 = ki_ring_mono_ns();
        prod[r] = (double)(t1 - t0) / (double)n;
        drain[r] = (double)n / ((double)(t2 - t1) / 1e9) / 1e6;
    }
    qsort(prod, (size_t)rounds, sizeof(double), cmp);
    qsort(drain, (size_t)rounds, sizeof(double), cmp);
    printf("c_producer_ns=%.1f drain_mrps=%.1f\n", prod[rounds / 2], drain[rounds / 2]);
    free(out);
    ki_ring_consumer_close(&c);
    ki_ring_close(&p);
    return 0;
}
