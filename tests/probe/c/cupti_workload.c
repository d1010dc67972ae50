/*
 * cupti_workload.c - a CUDA program for the CUPTI probe's tests, linked against the stand-in
 * libcuda.so.1 (fake_cuda_inject.c). It knows nothing of the probe: the driver loads it.
 *
 *   cupti_workload [--gpus N] [--steps N] [--threads N] [--kernel NAME]... [--nvtx] [--fork]
 *                  [--flush-race] [--fuzz SEED:COUNT] [--no-init] [--rss]
 *
 * Each step, on each GPU and thread: every kernel once (grid x = 1 + its index, so 1, 2, ... us),
 * a 4096-byte copy, a 256-byte memset and a stream sync; with --nvtx inside the ranges "step" >
 * "layer.<index>". Prints one JSON line of what it did (--rss: with its VmRSS, VmHWM and RssAnon/File/Shmem, kB).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <dlfcn.h>

void kifake_nvtx_push(const char *message);
void kifake_nvtx_pop(void);
void kifake_fuzz(unsigned seed, unsigned count);

static int gpus = 1, steps = 10, threads = 1, nvtx, use_fork, flush_race, no_init, rss;
static unsigned fuzz_seed, fuzz_count;
static const char *kernel_names[32];
static int nkernels;
static CUfunction funcs[32];

#define CHECK(x)                                                            \
    do {                                                                    \
        CUresult rc_ = (x);                                                 \
        if (rc_ != CUDA_SUCCESS) {                                          \
            fprintf(stderr, "%s failed: %d\n", #x, (int)rc_);               \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static void *run(void *arg) {
    int gpu = (int)(intptr_t)arg % gpus;
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, gpu));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream stream = (CUstream)(uintptr_t)(100 + (intptr_t)arg);
    char layer[32];
    for (int s = 0; s < steps; s++) {
        if (nvtx) kifake_nvtx_push("step");
        for (int k = 0; k < nkernels; k++) {
            if (nvtx) {
                snprintf(layer, sizeof layer, "layer.%d", k);
                kifake_nvtx_push(layer);
            }
            CHECK(cuLaunchKernel(funcs[k], (unsigned)(1 + k), 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
            if (nvtx) kifake_nvtx_pop();
        }
        CHECK(cuMemcpyHtoDAsync(0x1000, layer, 4096, stream));
        CHECK(cuMemsetD8Async(0x2000, 0, 256, stream));
        CHECK(cuStreamSynchronize(stream));
        if (nvtx) kifake_nvtx_pop();
    }
    return NULL;
}

static void *flusher(void *arg) {
    (void)arg;
    void *p = dlsym(RTLD_DEFAULT, "cuptiActivityFlushAll");
    int (*flush)(unsigned) = NULL;
    if (p) memcpy(&flush, &p, sizeof p);
    for (;;) {
        if (flush) flush(0);
        usleep(50);
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpus") && i + 1 < argc) gpus = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc && nkernels < 32) kernel_names[nkernels++] = argv[++i];
        else if (!strcmp(argv[i], "--nvtx")) nvtx = 1;
        else if (!strcmp(argv[i], "--fork")) use_fork = 1;
        else if (!strcmp(argv[i], "--flush-race")) flush_race = 1;
        else if (!strcmp(argv[i], "--no-init")) no_init = 1;
        else if (!strcmp(argv[i], "--rss")) rss = 1;
        else if (!strcmp(argv[i], "--fuzz") && i + 1 < argc) sscanf(argv[++i], "%u:%u", &fuzz_seed, &fuzz_count);
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (no_init) { /* a program that never initialises CUDA */
        printf("{\"pid\": %d, \"kernels\": 0}\n", (int)getpid());
        return 0;
    }
    if (nkernels == 0) kernel_names[nkernels++] = "triton_poi_fused_add_0";
    CHECK(cuInit(0));
    for (int k = 0; k < nkernels; k++) CHECK(cuModuleGetFunction(&funcs[k], NULL, kernel_names[k]));
    if (fuzz_count) {
        CUdevice dev;
        CUcontext ctx;
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CHECK(cuCtxSetCurrent(ctx));
        kifake_fuzz(fuzz_seed, fuzz_count);
    }
    if (flush_race) {
        pthread_t t;
        pthread_create(&t, NULL, flusher, NULL);
        pthread_detach(t);
    }
    int workers = threads * gpus;
    pthread_t tids[256];
    for (int i = 0; i < workers && i < 256; i++) pthread_create(&tids[i], NULL, run, (void *)(intptr_t)i);
    int child_status = -1;
    if (use_fork) { /* a child forked while the parent's threads launch: it must exit at once, writing nothing */
        pid_t pid = fork();
        if (pid == 0) exit(0);
        waitpid(pid, &child_status, 0);
    }
    for (int i = 0; i < workers && i < 256; i++) pthread_join(tids[i], NULL);
    long per = (long)steps * workers, vmrss = 0, vmhwm = 0, anon = 0, file = 0, shmem = 0;
    if (rss) {
        char line[256];
        FILE *f = fopen("/proc/self/status", "r");
        while (f && fgets(line, sizeof line, f)) {
            sscanf(line, "VmRSS: %ld", &vmrss);
            sscanf(line, "VmHWM: %ld", &vmhwm);
            sscanf(line, "RssAnon: %ld", &anon);
            sscanf(line, "RssFile: %ld", &file);
            sscanf(line, "RssShmem: %ld", &shmem);
        }
        if (f) fclose(f);
    }
    printf("{\"pid\": %d, \"kernels\": %ld, \"memcpy\": %ld, \"memset\": %ld, \"syncs\": %ld, \"child_status\": %d, "
           "\"vmrss_kb\": %ld, \"vmhwm_kb\": %ld, \"rss_anon_kb\": %ld, \"rss_file_kb\": %ld, \"rss_shmem_kb\": %ld}\n",
           (int)getpid(), per * nkernels, per, per, per, child_status, vmrss, vmhwm, anon, file, shmem);
    fflush(stdout);
    return 0; /* exit: the probe flushes what CUPTI still holds */
}
