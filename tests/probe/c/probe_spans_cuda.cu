// probe_spans_cuda.cu - ki_probe.h on a real GPU: 20 x "spin_1ms" around a kernel that spins ~1 ms,
// and 1000 x "empty" around an empty kernel, timing the probe's host cost per span.
// Usage: probe_spans_cuda RING_NAME   (prints host_ns_per_span=...)
#include "ki_probe.h"

#include <cstdio>

static ki_probe probe;

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void empty() {}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    char err[256];
    if (ki_probe_init(&probe, 0, argv[1], err, sizeof err) < 0) {
        std::fprintf(stderr, "%s\n", err);
        return 1;
    }
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    cudaStream_t s;
    cudaStreamCreate(&s);
    uint32_t spin_id = ki_probe_name(&probe, "spin_1ms");
    uint32_t empty_id = ki_probe_name(&probe, "empty");
    for (int i = 0; i < 20; i++) {
        ki::Span span(probe, spin_id, s);
        spin<<<1, 1, 0, s>>>((long long)khz);  // khz cycles = 1 ms
    }
    // host cost: the same launches with and without spans
    cudaStreamSynchronize(s);
    uint64_t t0 = ki_ring_mono_ns();
    for (int i = 0; i < 1000; i++) empty<<<1, 1, 0, s>>>();
    uint64_t t1 = ki_ring_mono_ns();
    cudaStreamSynchronize(s);
    uint64_t t2 = ki_ring_mono_ns();
    for (int i = 0; i < 1000; i++) {
        ki::Span span(probe, empty_id, s);
        empty<<<1, 1, 0, s>>>();
    }
    uint64_t t3 = ki_ring_mono_ns();
    ki_probe_close(&probe);
    std::printf("host_ns_per_span=%.0f written=%llu dropped=%llu\n", ((double)(t3 - t2) - (double)(t1 - t0)) / 1000.0,
                (unsigned long long)probe.written, (unsigned long long)probe.dropped);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
