/*
 * fake_nvml_types.h - the NVML stand-in's structs, laid out as NVIDIA's nvml.h lays them out
 * (tests/probe/test_nvml_layout.py compiles tests/probe/c/nvml_layout.c against this header and
 * against the real nvml.h and compares every size and offset the stand-in relies on).
 */
#ifndef KI_FAKE_NVML_TYPES_H
#define KI_FAKE_NVML_TYPES_H

typedef unsigned int nvmlReturn_t;
struct fake_dev { int index; };
typedef struct fake_dev *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; } nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
struct fake_gpm_sample { int dev; unsigned long long seq; };
typedef struct fake_gpm_sample *nvmlGpmSample_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[477]; /* pynvml's NVML_GPM_METRIC_MAX; nvml.h's may be smaller: numMetrics is read */
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

#endif
