/*
 * fake_nvml.c - a stand-in libnvidia-ml.so.1 for the NVML sampler tests.
 *
 * Exports the NVML entry points the sampler calls (through pynvml) with the
 * real names and ABI, and answers from a script file named by the environment
 * variable KI_FAKE_NVML_SCRIPT, re-read whenever it changes:
 *
 *     count 2                      devices
 *     0.memory_used 1073741824     device 0's value for a key
 *     0.power NS                   NVML_ERROR_NOT_SUPPORTED for that key
 *     0.temperature LOST           NVML_ERROR_GPU_IS_LOST
 *     0.name NVIDIA H100           strings: name uuid bus_id; global: driver
 *     event 0 8 79                 an event for device 0: type 8 (XID), data 79 (delivered once)
 *     init DRIVER_NOT_LOADED       nvmlInit fails that way
 *     0.util_enc 12                encoder (util_dec: decoder) utilisation, percent
 *     0.memory_reserved 536870912  nvmlDeviceGetMemoryInfo_v2's reserved bytes
 *     0.remap_failure 1            nvmlDeviceGetRemappedRows' failure flag (absent: 0)
 *     0.gpm_supported 1            GPM; 0.gpm<id> VALUE is GPM metric <id> between two samples
 *
 * A key absent from the script is NVML_ERROR_NOT_SUPPORTED.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define MAX_LINES 512
#define MAX_DEV 8
#define EXPORT __attribute__((visibility("default")))

#include "fake_nvml_types.h"
typedef struct fake_set { unsigned long long mask[MAX_DEV]; } *nvmlEventSet_t;

static struct fake_dev devs[MAX_DEV] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static char lines[MAX_LINES][160];
static int nlines;
static int delivered[MAX_LINES]; /* events already handed out */
static struct timespec loaded_mtime;
static off_t loaded_size = -1;
static char loaded_path[512];
static int initialised;

static void load(void) {
    const char *path = getenv("KI_FAKE_NVML_SCRIPT");
    struct stat st;
    if (!path || stat(path, &st) < 0) { nlines = 0; return; }
    int same_file = strcmp(path, loaded_path) == 0;
    if (same_file && st.st_size == loaded_size && st.st_mtim.tv_sec == loaded_mtime.tv_sec && st.st_mtim.tv_nsec == loaded_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    int n = 0;
    while (n < MAX_LINES && fgets(lines[n], sizeof lines[n], f)) {
        lines[n][strcspn(lines[n], "\n")] = 0;
        if (lines[n][0] && lines[n][0] != '#') n++;
    }
    fclose(f);
    /* Appended events keep their delivered mark: only lines beyond the old count are new. */
    for (int i = same_file ? nlines : 0; i < n; i++) delivered[i] = 0;
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    nlines = n;
    loaded_size = st.st_size;
    loaded_mtime = st.st_mtim;
}

/* The text after "key " for a global key, or "<dev>.key " for a device key. */
static const char *lookup(int dev, const char *key) {
    char want[96];
    if (dev < 0) snprintf(want, sizeof want, "%s ", key);
    else snprintf(want, sizeof want, "%d.%s ", dev, key);
    size_t n = strlen(want);
    for (int i = nlines - 1; i >= 0; i--) /* the last line for a key wins */
        if (strncmp(lines[i], want, n) == 0) return lines[i] + n;
    return NULL;
}

static nvmlReturn_t status_of(const char *v) {
    if (!v) return NVML_ERROR_NOT_SUPPORTED;
    if (strcmp(v, "NS") == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (strcmp(v, "LOST") == 0) return NVML_ERROR_GPU_IS_LOST;
    if (strcmp(v, "UNKNOWN") == 0) return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

static nvmlReturn_t num(nvmlDevice_t d, const char *key, unsigned long long *out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!d) return NVML_ERROR_INVALID_ARGUMENT;
    load();
    const char *v = lookup(d->index, key);
    nvmlReturn_t rc = status_of(v);
    if (rc == NVML_SUCCESS) *out = strtoull(v, NULL, 0);
    return rc;
}

static nvmlReturn_t str(int dev, const char *key, char *buf, unsigned int len) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    load();
    const char *v = lookup(dev, key);
    nvmlReturn_t rc = status_of(v);
    if (rc != NVML_SUCCESS) return rc;
    if (strlen(v) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load();
    const char *v = lookup(-1, "init");
    if (v && strcmp(v, "DRIVER_NOT_LOADED") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised = 1;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlShutdown(void) { initialised = 0; return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    load();
    const char *v = lookup(-1, "count");
    *count = v ? (unsigned int)strtoul(v, NULL, 0) : 1;
    if (*count > MAX_DEV) *count = MAX_DEV;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    unsigned int count;
    nvmlReturn_t rc = nvmlDeviceGetCount_v2(&count);
    if (rc) return rc;
    if (index >= count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devs[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t rc = num(d, "memory_total", &m->total);
    if (!rc) rc = num(d, "memory_used", &m->used);
    if (!rc) m->free = m->total - m->used;
    return rc;
}

#define U32_GETTER(fn, key)                                          \
    EXPORT nvmlReturn_t fn(nvmlDevice_t d, unsigned int *out) {      \
        unsigned long long v = 0;                                    \
        nvmlReturn_t rc = num(d, key, &v);                           \
        if (!rc) *out = (unsigned int)v;                             \
        return rc;                                                   \
    }
U32_GETTER(nvmlDeviceGetPowerUsage, "power_mw")
U32_GETTER(nvmlDeviceGetEnforcedPowerLimit, "power_limit_mw")
U32_GETTER(nvmlDeviceGetFanSpeed, "fan_pct")

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *out) {
    unsigned long long v = 0;
    nvmlReturn_t rc = sensor == 0 ? num(d, "temperature", &v) : NVML_ERROR_NOT_SUPPORTED;
    if (!rc) *out = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    return num(d, "energy_mj", mj);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    unsigned long long g = 0, m = 0;
    nvmlReturn_t rc = num(d, "util_gpu", &g);
    if (!rc) rc = num(d, "util_memory", &m);
    if (!rc) { u->gpu = (unsigned int)g; u->memory = (unsigned int)m; }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
    unsigned long long v = 0;
    nvmlReturn_t rc = num(d, type == 1 ? "clock_sm_mhz" : type == 2 ? "clock_mem_mhz" : "clock_other", &v);
    if (!rc) *mhz = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs) {
    unsigned long long v = 0;
    nvmlReturn_t rc = num(d, counter == 0 ? "pcie_tx_kbs" : "pcie_rx_kbs", &v);
    if (!rc) *kbs = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *out) {
    if (counter != 0) return NVML_ERROR_NOT_SUPPORTED; /* the sampler reads volatile counters */
    return num(d, type == 0 ? "ecc_corrected" : "ecc_uncorrected", out);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return num(d, "throttle", reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    unsigned long long c = 0, u = 0, f = 0;
    nvmlReturn_t rc = num(d, "remapped_corr", &c);
    if (!rc) rc = num(d, "remapped_unc", &u);
    if (!rc && num(d, "remap_failure", &f) != NVML_SUCCESS) f = 0;
    if (!rc) { *corr = (unsigned int)c; *unc = (unsigned int)u; *pending = 0; *failure = (unsigned int)f; }
    return rc;
}

/* nvmlMemory_v2_t as nvml.h has it: a version word, then total, reserved, free, used. */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (m->version != NVML_MEMORY_V2) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    unsigned long long reserved = 0;
    nvmlReturn_t rc = num(d, "memory_total", &m->total);
    if (!rc) rc = num(d, "memory_used", &m->used);
    if (!rc) rc = num(d, "memory_reserved", &reserved);
    if (!rc) { m->reserved = reserved; m->free = m->total - m->used - reserved; }
    return rc;
}

/* Encoder and decoder utilisation: percent, and the sampling period in microseconds. */
EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *period_us) {
    unsigned long long v = 0;
    nvmlReturn_t rc = num(d, "util_enc", &v);
    if (!rc) { *util = (unsigned int)v; *period_us = 167000; }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *util, unsigned int *period_us) {
    unsigned long long v = 0;
    nvmlReturn_t rc = num(d, "util_dec", &v);
    if (!rc) { *util = (unsigned int)v; *period_us = 167000; }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    unsigned long long links = 0;
    nvmlReturn_t rc = num(d, "nvlink_links", &links);
    if (rc) return rc;
    if (link >= 18) return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < links;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *f = &values[i];
        char key[48];
        snprintf(key, sizeof key, "field%u.%u", f->fieldId, f->scopeId);
        unsigned long long v = 0;
        f->nvmlReturn = num(d, key, &v);
        f->valueType = 3; /* unsigned long long */
        f->value.ullVal = v;
        f->timestamp = (long long)time(NULL) * 1000000;
        f->latencyUsec = 0;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    load();
    /* "<dev>.process PID BYTES" lines, one per process */
    char want[32];
    snprintf(want, sizeof want, "%d.process ", d->index);
    unsigned int n = 0;
    for (int i = 0; i < nlines; i++)
        if (strncmp(lines[i], want, strlen(want)) == 0) {
            if (out && n < *count) {
                char *end;
                out[n].pid = (unsigned int)strtoul(lines[i] + strlen(want), &end, 0);
                out[n].usedGpuMemory = strtoull(end, NULL, 0);
                out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFFu;
            }
            n++;
        }
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!out || n > *count) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { return str(d->index, "name", name, len); }
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) { return str(d->index, "uuid", uuid, len); }
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { return str(-1, "driver", v, len); }

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    load();
    const char *s = lookup(-1, "cuda");
    if (status_of(s)) return status_of(s);
    *v = (int)strtol(s, NULL, 0);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    return str(d->index, "bus_id", pci->busId, sizeof pci->busId);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    unsigned long long cc = 0;
    nvmlReturn_t rc = num(d, "compute_capability", &cc);
    if (!rc) { *major = (int)(cc / 10); *minor = (int)(cc % 10); }
    return rc;
}

/* ---- GPM (Hopper and later): SM utilisation between two samples ---------- */

static unsigned long long gpm_seq;

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    unsigned long long v = 0;
    nvmlReturn_t rc = num(d, "gpm_supported", &v);
    if (rc == NVML_ERROR_NOT_SUPPORTED) v = 0, rc = NVML_SUCCESS;
    if (!rc) s->isSupportedDevice = (unsigned int)v;
    return rc;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    *s = calloc(1, sizeof **s);
    return *s ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) { free(s); return NVML_SUCCESS; }

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    s->dev = d->index;
    s->seq = ++gpm_seq;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (m->version != 1 || !m->sample1 || !m->sample2 || m->sample1->seq >= m->sample2->seq)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics && i < 477; i++) {
        char key[32];
        snprintf(key, sizeof key, "gpm%u", m->metrics[i].metricId);
        load();
        const char *v = lookup(m->sample2->dev, key);
        m->metrics[i].nvmlReturn = status_of(v);
        m->metrics[i].value = v && !status_of(v) ? strtod(v, NULL) : 0.0;
    }
    return NVML_SUCCESS;
}

/* ---- events ------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    (void)d;
    *types = 0x1 | 0x2 | 0x4 | 0x8 | 0x10; /* single/double bit ECC, pstate, XID, clock */
    return initialised ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    if (!set || !d) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[d->index] |= types;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    /* Poll the script every 50 ms until an undelivered event for a registered device shows up (the
     * real call blocks in the driver: the stand-in's polling is kept cheap, as make bench-probe
     * measures the sampler's CPU with it). */
    for (unsigned int waited = 0;; waited += 50) {
        load();
        for (int i = 0; i < nlines; i++) {
            int dev;
            unsigned long long type, payload;
            if (delivered[i] || lines[i][0] != 'e') continue;
            if (sscanf(lines[i], "event %d %llu %llu", &dev, &type, &payload) != 3) continue;
            if (dev < 0 || dev >= MAX_DEV || !(set->mask[dev] & type)) continue;
            delivered[i] = 1;
            memset(data, 0, sizeof *data);
            data->device = &devs[dev];
            data->eventType = type;
            data->eventData = payload;
            return NVML_SUCCESS;
        }
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}
