/*
 * bench_cupti.c - the CUPTI probe's buffer-completed path, timed (make bench-cupti; docs/probes.md).
 *
 * The probe's sources are compiled in; InitializeInjection loads the stand-in CUPTI
 * (KI_CUPTI_LIBRARY) as it would the real one. The launch callbacks run first for every kernel, as
 * on the workload's threads (timed apart), then buffers of CUpti_ActivityKernel10 records in the
 * stand-in's framing go through ki_cupti_buffer_completed, the function CUPTI calls: each kernel
 * becomes a LAUNCH_SPAN and a KERNEL record in the ring, which this program drains between rounds.
 *
 *   bench_cupti RING RECORDS ROUNDS    ->  one JSON line
 */
#define _GNU_SOURCE
#include "ki_cupti.h"

#include <dlfcn.h>
#include <stdlib.h>

int InitializeInjection(void);

static const char *names[] = {
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
    "_ZN7cutlass7Kernel2I66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8EEvNT_6ParamsE",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffEEjfLi4EEEEEvT1_",
    "triton_poi_fused_add_mul_0",
    "triton_red_fused__softmax_1",
    "_ZN2at6native12_GLOBAL__N_138nll_loss_forward_reduce_cuda_kernel_2dIflEEvPT_S4_PKT0_l",
    "flash_fwd_kernel",
};
#define NNAMES (sizeof names / sizeof *names)

static uint64_t mono(void) { return ki_ring_mono_ns(); }

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench_cupti RING RECORDS ROUNDS\n");
        return 2;
    }
    const char *ring = argv[1];
    size_t n = strtoull(argv[2], NULL, 10);
    int rounds = atoi(argv[3]);
    InitializeInjection();
    struct ki_cupti *g = &ki_cupti_g;
    if (!g->active) {
        fprintf(stderr, "the probe did not start\n");
        return 1;
    }
    size_t (*frame)(uint8_t *, size_t, size_t, const void *, size_t) = NULL;
    void *p = dlsym(g->lib, "kifake_cupti_frame");
    if (!p) {
        fprintf(stderr, "KI_CUPTI_LIBRARY is not the stand-in (no kifake_cupti_frame)\n");
        return 1;
    }
    memcpy(&frame, &p, sizeof p);

    /* The activity: buffers as CUPTI fills them (the probe's buffer size). */
    size_t bsize = g->buffer_bytes, nbuf = 1, used = 0;
    uint8_t **bufs = malloc(sizeof *bufs * (n + 1));
    size_t *valid = calloc(n + 1, sizeof *valid), *first = calloc(n + 2, sizeof *first);
    bufs[0] = aligned_alloc(8, bsize);
    uint64_t ts = 0;
    g->api.GetTimestamp(&ts);
    for (size_t i = 0; i < n; i++) {
        CUpti_ActivityKernel10 k;
        memset(&k, 0, sizeof k);
        k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.start = ts + i * 2000;
        k.end = k.start + 1500;
        k.deviceId = 0;
        k.contextId = 1;
        k.streamId = 7 + (uint32_t)(i % 4);
        k.gridX = 128;
        k.gridY = k.gridZ = 1;
        k.blockX = 256;
        k.blockY = k.blockZ = 1;
        k.registersPerThread = 64;
        k.correlationId = (uint32_t)(i + 1);
        k.name = names[i % NNAMES];
        size_t after = frame(bufs[nbuf - 1], bsize, used, &k, sizeof k);
        if (!after) {
            valid[nbuf - 1] = used;
            first[nbuf] = i;
            bufs[nbuf++] = aligned_alloc(8, bsize);
            used = 0;
            after = frame(bufs[nbuf - 1], bsize, used, &k, sizeof k);
        }
        used = after;
    }
    valid[nbuf - 1] = used;
    first[nbuf] = n;

    struct ki_ring_consumer c;
    char err[256];
    if (ki_ring_consumer_open(&c, ring, 0, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct ki_record *out = malloc(sizeof *out * 4096);
    uint64_t *per = calloc((size_t)rounds, sizeof *per);
    size_t written_first = 0;
    uint64_t callbacks_ns = 0;
    for (int r = 0; r < rounds; r++) {
        g->cupti_dropped_total = 0;
        size_t got = 0, m;
        for (size_t b = 0; b < nbuf; b++) {
            /* The buffer's launches first, as CUPTI calls back on the launching thread (enter, exit). */
            uint64_t a = mono();
            for (size_t i = first[b]; i < first[b + 1]; i++) {
                uint64_t data = 0;
                CUpti_CallbackData cb;
                memset(&cb, 0, sizeof cb);
                cb.correlationId = (uint32_t)(i + 1);
                cb.correlationData = &data;
                cb.callbackSite = CUPTI_API_ENTER;
                ki_cupti_callback(g, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
                cb.callbackSite = CUPTI_API_EXIT;
                ki_cupti_callback(g, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
            }
            uint64_t z = mono();
            callbacks_ns += z - a;
            ki_cupti_buffer_completed(NULL, 0, bufs[b], bsize, valid[b]);
            per[r] += mono() - z;
            while ((m = ki_ring_consume(&c, out, 4096, ki_ring_mono_ns())) > 0) got += m; /* the agent's part */
        }
        if (r == 0) written_first = got;
    }
    double callback_ns = (double)callbacks_ns / (double)n / rounds;
    qsort(per, (size_t)rounds, sizeof *per, cmp_u64);
    uint64_t refused = g->devices[0].counts[KI_CUPTI_RING_REFUSED];
    printf("{\"records\": %zu, \"buffers\": %zu, \"buffer_bytes\": %zu, \"ring_records_first_round\": %zu, "
           "\"refused\": %llu, \"ns_per_record_median\": %.2f, \"ns_per_record_min\": %.2f, "
           "\"callback_ns_per_launch\": %.2f}\n",
           n, nbuf, bsize, written_first, (unsigned long long)refused, (double)per[rounds / 2] / (double)n,
           (double)per[0] / (double)n, callback_ns);
    ki_ring_consumer_close(&c);
    return 0;
}
