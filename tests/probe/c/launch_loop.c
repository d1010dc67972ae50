/*
 * launch_loop.c - the eBPF benchmark's workload: N cuLaunchKernel calls on the
 * stand-in libcuda, optionally paced to a rate; prints the mean ns per call.
 * Usage: launch_loop N [calls_per_second]   (waits for a line on stdin first)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
int cuModuleGetFunction(CUfunction *, void *, const char *);
int cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **, void **);

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: launch_loop N [calls_per_second]\n");
        return 2;
    }
    long n = atol(argv[1]);
    double rate = argc > 2 ? atof(argv[2]) : 0;
    char line[16];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    CUfunction f;
    cuModuleGetFunction(&f, NULL, "bench_kernel");
    long long start = now_ns();
    for (long i = 0; i < n; i++) {
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (rate > 0 && (i & 255) == 255) {
            long long due = start + (long long)((i + 1) / rate * 1e9);
            while (now_ns() < due) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
    }
    long long took = now_ns() - start;
    printf("ns_per_call=%.1f\n", (double)took / (double)n);
    fflush(stdout);
    return 0;
}
