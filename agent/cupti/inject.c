/* inject.c - InitializeInjection: what the CUDA driver calls at cuInit in a library named by
 * CUDA_INJECTION64_PATH. Loads CUPTI by name, subscribes, enables the activity kinds, flushes on a
 * period and at exit; every failure is said once on stderr and the probe steps aside. */
#define _GNU_SOURCE
#include "ki_cupti.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>

struct ki_cupti ki_cupti_g;

static uint64_t logged; /* keys said already */

void ki_cupti_log(int key, const char *fmt, ...) {
    if (key >= 0) {
        uint64_t bit = 1ULL << (key & 63);
        if (__atomic_fetch_or(&logged, bit, __ATOMIC_RELAXED) & bit) return;
    }
    const char *quiet = getenv("KI_CUPTI_QUIET");
    if (quiet && quiet[0] == '1') return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ki-cupti: %s\n", line);
}

static size_t env_size(const char *name, size_t def, size_t lo, size_t hi) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x < lo || x > hi) {
        ki_cupti_log(-1, "%s=%s is not a number in [%zu, %zu]: using %zu", name, v, lo, hi, def);
        return def;
    }
    return (size_t)x;
}

/* CUPTI: KI_CUPTI_LIBRARY when set; else one the process has already loaded; else by name, as the
 * loader finds it (a wheel's nvidia/cuda_cupti/lib on LD_LIBRARY_PATH, the toolkit's). */
static void *load_cupti(void) {
    const char *named = getenv("KI_CUPTI_LIBRARY");
    const char *candidates[] = {named, "libcupti.so.13", "libcupti.so.12", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                                "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"};
    size_t n = sizeof candidates / sizeof *candidates;
    /* One the process has loaded already (PyTorch links its wheel's): two CUPTIs in one process
     * would fight over the driver's callbacks. */
    for (size_t i = named && *named ? 0 : 1; i < n; i++) {
        void *h = candidates[i] ? dlopen(candidates[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) : NULL;
        if (h) return h;
        if (i == 0) break; /* a named one is the only choice */
    }
    for (size_t i = 0; i < n; i++) {
        if (!candidates[i] || !*candidates[i]) continue;
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_GLOBAL);
        if (h) return h;
        if (i == 0) ki_cupti_log(-1, "KI_CUPTI_LIBRARY=%s: %s", named, dlerror());
    }
    return NULL;
}

#define KI_RESOLVE(g, field, sym)                                  \
    do {                                                           \
        void *p_ = dlsym((g)->lib, sym);                           \
        if (!p_) {                                                 \
            ki_cupti_log(-1, "%s not found in CUPTI: stepping aside", sym); \
            return -1;                                             \
        }                                                          \
        memcpy(&(g)->api.field, &p_, sizeof p_);                   \
    } while (0)

static int resolve(struct ki_cupti *g) {
    KI_RESOLVE(g, GetVersion, "cuptiGetVersion");
    KI_RESOLVE(g, GetResultString, "cuptiGetResultString");
    KI_RESOLVE(g, Subscribe, "cuptiSubscribe");
    KI_RESOLVE(g, Unsubscribe, "cuptiUnsubscribe");
    KI_RESOLVE(g, EnableCallback, "cuptiEnableCallback");
    KI_RESOLVE(g, EnableDomain, "cuptiEnableDomain");
    KI_RESOLVE(g, ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks");
    KI_RESOLVE(g, ActivityEnable, "cuptiActivityEnable");
    KI_RESOLVE(g, ActivityDisable, "cuptiActivityDisable");
    KI_RESOLVE(g, ActivityFlushAll, "cuptiActivityFlushAll");
    KI_RESOLVE(g, ActivityFlushPeriod, "cuptiActivityFlushPeriod");
    KI_RESOLVE(g, ActivityGetNextRecord, "cuptiActivityGetNextRecord");
    KI_RESOLVE(g, ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
    KI_RESOLVE(g, GetTimestamp, "cuptiGetTimestamp");
    return 0;
}

static const char *result_text(struct ki_cupti *g, CUptiResult rc) {
    const char *s = NULL;
    if (g->api.GetResultString && g->api.GetResultString(rc, &s) == CUPTI_SUCCESS && s) return s;
    return "unknown CUPTI error";
}

static const struct {
    CUpti_ActivityKind kind;
    const char *name;
    int required; /* without it the probe has nothing to do */
} kinds[] = {
    {CUPTI_ACTIVITY_KIND_CONTEXT, "CONTEXT", 0},
    {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL", 1},
    {CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY", 0},
    {CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET", 0},
    {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "SYNCHRONIZATION", 0},
};

static volatile int flusher_stop;
static uint32_t flush_ms;

static void *flusher(void *arg) {
    struct ki_cupti *g = arg;
    while (!flusher_stop && __atomic_load_n(&g->active, __ATOMIC_RELAXED)) {
        struct timespec ts = {flush_ms / 1000, (long)(flush_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (flusher_stop || g->forked_child) break;
        g->api.ActivityFlushAll(0);
    }
    return NULL;
}

/* At exit: hand in what CUPTI holds and wait (100 ms at most) for every buffer to come back, so
 * one another thread took from CUPTI just before (a racing flush) is written too; then the
 * counts. The rings stay mapped and the probe active: a completion later still (CUPTI's own exit
 * flush) is written as well, and an exit that cuts one short leaves a reserved slot the agent
 * skips once the process is gone (docs/ring.md). */
static void at_exit(void) {
    struct ki_cupti *g = &ki_cupti_g;
    if (g->forked_child || !__atomic_load_n(&g->active, __ATOMIC_ACQUIRE)) return;
    flusher_stop = 1;
    g->api.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&g->pool_lock);
        int back = g->free_count == g->buffers;
        pthread_mutex_unlock(&g->pool_lock);
        if (back) break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&g->lock);
    ki_cupti_activity_report(g);
    pthread_mutex_unlock(&g->lock);
}

/* A forked child has the parent's probe but not its CUDA (nor its threads, nor their locks): it
 * writes nothing, and its exit flushes nothing. */
static void in_child(void) {
    struct ki_cupti *g = &ki_cupti_g;
    g->forked_child = 1;
    __atomic_store_n(&g->active, 0, __ATOMIC_RELEASE);
    pthread_mutex_init(&g->lock, NULL);
    pthread_mutex_init(&g->pool_lock, NULL);
}

static int start(struct ki_cupti *g) {
    const char *off = getenv("KI_CUPTI_DISABLE");
    if (off && off[0] == '1') return -1;
    const char *prefix = getenv("KI_PROBE_LABEL_PREFIX");
    snprintf(g->prefix, sizeof g->prefix, "%s", prefix ? prefix : "");
    g->name_max = (uint32_t)env_size("KI_CUPTI_NAME_MAX", KI_CUPTI_NAME_MAX_DEFAULT, 32, 1000);
    flush_ms = (uint32_t)env_size("KI_CUPTI_FLUSH_MS", 100, 1, 60000);
    size_t buffers = env_size("KI_CUPTI_BUFFERS", 8, 2, 1024);
    size_t buffer_kb = env_size("KI_CUPTI_BUFFER_KB", 256, 4, 65536);
    g->pid = (uint32_t)getpid();
    g->lib = load_cupti();
    if (!g->lib) {
        ki_cupti_log(-1, "CUPTI not found (libcupti.so.13; KI_CUPTI_LIBRARY names one): stepping aside");
        return -1;
    }
    if (resolve(g) < 0) return -1;
    uint32_t version = 0;
    if (g->api.GetVersion(&version) != CUPTI_SUCCESS || version < KI_CUPTI_MIN_API) {
        ki_cupti_log(-1, "CUPTI API version %u is older than CUDA 12's (%u), whose record layouts this probe reads: "
                     "stepping aside", version, KI_CUPTI_MIN_API);
        return -1;
    }
    if (ki_cupti_activity_init(g, buffers, buffer_kb * 1024) < 0) {
        ki_cupti_log(-1, "no memory for %zu activity buffers of %zu KiB: stepping aside", buffers, buffer_kb);
        return -1;
    }
    CUptiResult rc = g->api.Subscribe(&g->subscriber, ki_cupti_callback, g);
    if (rc != CUPTI_SUCCESS) {
        g->subscriber = NULL;
        ki_cupti_log(-1, "cuptiSubscribe: %s (another CUPTI tool?): kernels without their launches' thread and time",
                     result_text(g, rc));
    } else if (ki_cupti_callbacks_enable(g) == 0) {
        ki_cupti_log(-1, "no launch callback could be enabled: kernels without their launches' thread and time");
    }
    rc = g->api.ActivityRegisterCallbacks(ki_cupti_buffer_requested, ki_cupti_buffer_completed);
    if (rc != CUPTI_SUCCESS) {
        ki_cupti_log(-1, "cuptiActivityRegisterCallbacks: %s: stepping aside", result_text(g, rc));
        if (g->subscriber) g->api.Unsubscribe(g->subscriber);
        return -1;
    }
    __atomic_store_n(&g->active, 1, __ATOMIC_RELEASE);
    int enabled = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        rc = g->api.ActivityEnable(kinds[i].kind);
        if (rc == CUPTI_SUCCESS) {
            enabled += kinds[i].required;
            continue;
        }
        ki_cupti_log(KI_LOG_KIND + (int)i, "activity kind %s refused: %s; going on without it", kinds[i].name,
                     result_text(g, rc));
    }
    if (!enabled) {
        ki_cupti_log(-1, "no kernel activity: stepping aside");
        __atomic_store_n(&g->active, 0, __ATOMIC_RELEASE);
        for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) g->api.ActivityDisable(kinds[i].kind);
        if (g->subscriber) g->api.Unsubscribe(g->subscriber);
        return -1;
    }
    if (g->api.ActivityFlushPeriod(flush_ms) != CUPTI_SUCCESS) {
        pthread_t t;
        if (pthread_create(&t, NULL, flusher, g) == 0) pthread_detach(t);
        else ki_cupti_log(-1, "no flush thread: records come when CUPTI's buffers fill and at exit");
    }
    atexit(at_exit);
    pthread_atfork(NULL, NULL, in_child);
    return 0;
}

/* The driver's entry point (CUDA_INJECTION64_PATH). Always 1: a probe that cannot run says so once
 * and lets the workload go on as if it were not there. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
    static int called;
    if (__atomic_exchange_n(&called, 1, __ATOMIC_ACQ_REL)) return 1;
    start(&ki_cupti_g);
    return 1;
}
