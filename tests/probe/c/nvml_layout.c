/*
 * nvml_layout.c - prints the size and field offsets of every NVML struct the stand-in
 * (fake_nvml.c) reads or fills, compiled either against NVIDIA's nvml.h (-DKI_REAL_NVML) or
 * against the stand-in's own fake_nvml_types.h; tests/probe/test_nvml_layout.py compares the two.
 */
#include <stddef.h>
#include <stdio.h>
#ifdef KI_REAL_NVML
#include <nvml.h>
#else
#include "fake_nvml_types.h"
#endif

#define F(type, field) printf("%s.%s %zu\n", #type, #field, offsetof(type, field))
#define S(type) printf("sizeof %s %zu\n", #type, sizeof(type))

int main(void) {
    S(nvmlMemory_t); F(nvmlMemory_t, total); F(nvmlMemory_t, free); F(nvmlMemory_t, used);
    S(nvmlMemory_v2_t); F(nvmlMemory_v2_t, version); F(nvmlMemory_v2_t, total); F(nvmlMemory_v2_t, reserved);
    F(nvmlMemory_v2_t, free); F(nvmlMemory_v2_t, used);
    S(nvmlUtilization_t); F(nvmlUtilization_t, gpu); F(nvmlUtilization_t, memory);
    S(nvmlValue_t);
    S(nvmlFieldValue_t); F(nvmlFieldValue_t, fieldId); F(nvmlFieldValue_t, scopeId); F(nvmlFieldValue_t, timestamp);
    F(nvmlFieldValue_t, latencyUsec); F(nvmlFieldValue_t, valueType); F(nvmlFieldValue_t, nvmlReturn);
    F(nvmlFieldValue_t, value);
    S(nvmlProcessInfo_t); F(nvmlProcessInfo_t, pid); F(nvmlProcessInfo_t, usedGpuMemory);
    F(nvmlProcessInfo_t, gpuInstanceId); F(nvmlProcessInfo_t, computeInstanceId);
    S(nvmlPciInfo_t); F(nvmlPciInfo_t, busIdLegacy); F(nvmlPciInfo_t, domain); F(nvmlPciInfo_t, busId);
    S(nvmlEventData_t); F(nvmlEventData_t, device); F(nvmlEventData_t, eventType); F(nvmlEventData_t, eventData);
    F(nvmlEventData_t, gpuInstanceId); F(nvmlEventData_t, computeInstanceId);
    S(nvmlGpmMetric_t); F(nvmlGpmMetric_t, metricId); F(nvmlGpmMetric_t, nvmlReturn); F(nvmlGpmMetric_t, value);
    F(nvmlGpmMetric_t, metricInfo);
    /* not its size: the metrics array's length is NVML_GPM_METRIC_MAX, which grows by release */
    F(nvmlGpmMetricsGet_t, version); F(nvmlGpmMetricsGet_t, numMetrics); F(nvmlGpmMetricsGet_t, sample1);
    F(nvmlGpmMetricsGet_t, sample2); F(nvmlGpmMetricsGet_t, metrics);
    S(nvmlGpmSupport_t); F(nvmlGpmSupport_t, version); F(nvmlGpmSupport_t, isSupportedDevice);
    return 0;
}
