/*
 * ring_tool.c - create and drain a ring on the GPU machine without the Python package
 * (bench/gpu/check.sh): the check reads the CUPTI probe's records through ki_ring.h itself.
 *
 *   ring_tool create NAME CAPACITY   (mode 0600; an existing ring is kept)
 *   ring_tool drain NAME             one line per record read:
 *       K name_id start_ns end_ns correlation pid       a KERNEL
 *       L pid tid correlation                            a LAUNCH_SPAN
 *       S metric value aux                               a GPU_SAMPLE
 *       O type                                           anything else
 */
#include "ki_ring.h"

#include <stdlib.h>

int main(int argc, char **argv) {
    char err[256];
    if (argc == 4 && !strcmp(argv[1], "create")) {
        struct ki_ring r;
        struct ki_ring_options o = {strtoull(argv[3], NULL, 10), 0600, (gid_t)-1, NULL};
        if (ki_ring_create(&r, argv[2], &o, 0, err, sizeof err) < 0 &&
            ki_ring_attach(&r, argv[2], 0, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        ki_ring_close(&r);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "drain")) {
        struct ki_ring_consumer c;
        if (ki_ring_consumer_open(&c, argv[2], 0, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        static struct ki_record out[4096];
        size_t n;
        while ((n = ki_ring_consume(&c, out, 4096, ki_ring_mono_ns())) > 0) {
            for (size_t i = 0; i < n; i++) {
                const struct ki_rec *r = &out[i].rec;
                if (r->type == KI_REC_KERNEL)
                    printf("K %u %llu %llu %llu %u\n", r->id, (unsigned long long)r->ts_ns,
                           (unsigned long long)r->u.kernel.end_ns, (unsigned long long)r->u.kernel.correlation,
                           r->u.kernel.pid);
                else if (r->type == KI_REC_LAUNCH && (r->flags & KI_FLAG_LAUNCH_SPAN))
                    printf("L %u %u %llu\n", r->u.launch.pid, r->u.launch.tid,
                           (unsigned long long)r->u.launch.grid[0] | (unsigned long long)r->u.launch.grid[1] << 32);
                else if (r->type == KI_REC_GPU_SAMPLE)
                    printf("S %u %.17g %llu\n", r->id, r->u.sample.value, (unsigned long long)r->u.sample.aux);
                else
                    printf("O %u\n", r->type);
            }
        }
        ki_ring_consumer_close(&c);
        return 0;
    }
    fprintf(stderr, "usage: ring_tool create NAME CAPACITY | ring_tool drain NAME\n");
    return 2;
}
