"""GPU_SAMPLE metric ids: what the NVML sampler writes into a record's ``id`` field (docs/metrics.md).

The table is the contract between the sampler and the collector: the sampler writes
values already in the metric's unit (bytes, watts, hertz, ratios 0..1), and ``aux``
carries the one extra label the metric names (an NVLink index, a process id).
Ids are append-only: a retired id is never reused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernel_insight.agent.dcgm import DCGM_FIELDS

__all__ = ["METRIC_SPECS", "THROTTLE_REASONS", "MetricId", "MetricSpec", "spec"]


class MetricId(enum.IntEnum):
    """GPU_SAMPLE ids; append-only, the NVML sampler writes them (docs/metrics.md)."""

    MEMORY_USED = 1
    MEMORY_FREE = 2
    MEMORY_TOTAL = 3
    TEMPERATURE = 4
    MEMORY_TEMPERATURE = 5
    POWER = 6
    POWER_LIMIT = 7
    ENERGY = 8
    GPU_UTIL = 9
    SM_UTIL = 10
    MEMORY_UTIL = 11
    SM_CLOCK = 12
    MEMORY_CLOCK = 13
    PCIE_TX = 14
    PCIE_RX = 15
    NVLINK_TX = 16
    NVLINK_RX = 17
    ECC_CORRECTED = 18
    ECC_UNCORRECTED = 19
    THROTTLE_REASONS = 20
    PROCESS_MEMORY = 21
    FAN_SPEED = 22
    PCIE_REPLAYS = 23
    RETIRED_PAGES = 24
    LAUNCH_CALLS = 25
    LAUNCH_HOST_TIME = 26
    LAUNCH_HOST_LATENCY_BUCKET = 27
    CUDA_ALLOCATED_BYTES = 28
    CUPTI_RECORDS = 29
    CUPTI_DROPPED = 30
    CUPTI_RING_REFUSED = 31
    CUPTI_POOL_EXHAUSTED = 32


@dataclass(frozen=True, slots=True)
class MetricSpec:
    id: int  # a MetricId, or a DCGM series' id (agent/dcgm.py)
    name: str
    type: str  # "gauge" or "counter"
    unit: str
    help: str
    aux_label: str | None = None  # the label ``aux`` becomes, or None when aux is unused
    #: How aux reads: "value" (the label's value as is), "string" (low 32 bits: a string id the
    #: producer registered), "string_log2_bucket" (low 32 bits a string id, high 32 bits a log2
    #: bucket index b, the bucket's upper bound 2**(b+1) ns).
    aux_kind: str = "value"
    #: A dcgm-exporter series (agent/dcgm.py): it also carries dcgm-exporter's labels (UUID, modelName...).
    dcgm: bool = False


METRIC_SPECS: dict[int, MetricSpec] = {
    s.id: s
    for s in (
        MetricSpec(MetricId.MEMORY_USED, "gpu_memory_used_bytes", "gauge", "bytes", "Device memory in use."),
        MetricSpec(MetricId.MEMORY_FREE, "gpu_memory_free_bytes", "gauge", "bytes", "Device memory free."),
        MetricSpec(
            MetricId.MEMORY_TOTAL, "gpu_memory_total_bytes", "gauge", "bytes", "Device memory in all."
        ),
        MetricSpec(
            MetricId.TEMPERATURE, "gpu_temperature_celsius", "gauge", "celsius", "GPU die temperature."
        ),
        MetricSpec(
            MetricId.MEMORY_TEMPERATURE,
            "gpu_memory_temperature_celsius",
            "gauge",
            "celsius",
            "HBM temperature.",
        ),
        MetricSpec(MetricId.POWER, "gpu_power_watts", "gauge", "watts", "Board power draw."),
        MetricSpec(MetricId.POWER_LIMIT, "gpu_power_limit_watts", "gauge", "watts", "Enforced power limit."),
        MetricSpec(
            MetricId.ENERGY, "gpu_energy_joules_total", "counter", "joules", "Energy since driver load."
        ),
        MetricSpec(
            MetricId.GPU_UTIL,
            "gpu_utilization_ratio",
            "gauge",
            "ratio",
            "Fraction of time a kernel was running.",
        ),
        MetricSpec(MetricId.SM_UTIL, "gpu_sm_utilization_ratio", "gauge", "ratio", "Fraction of SMs busy."),
        MetricSpec(
            MetricId.MEMORY_UTIL,
            "gpu_memory_bandwidth_utilization_ratio",
            "gauge",
            "ratio",
            "Fraction of time device memory was read or written.",
        ),
        MetricSpec(MetricId.SM_CLOCK, "gpu_sm_clock_hertz", "gauge", "hertz", "SM clock."),
        MetricSpec(MetricId.MEMORY_CLOCK, "gpu_memory_clock_hertz", "gauge", "hertz", "Memory clock."),
        MetricSpec(
            MetricId.PCIE_TX, "gpu_pcie_tx_bytes_per_second", "gauge", "bytes/s", "PCIe transmit throughput."
        ),
        MetricSpec(
            MetricId.PCIE_RX, "gpu_pcie_rx_bytes_per_second", "gauge", "bytes/s", "PCIe receive throughput."
        ),
        MetricSpec(
            MetricId.NVLINK_TX, "gpu_nvlink_tx_bytes_total", "counter", "bytes", "NVLink bytes sent.", "link"
        ),
        MetricSpec(
            MetricId.NVLINK_RX,
            "gpu_nvlink_rx_bytes_total",
            "counter",
            "bytes",
            "NVLink bytes received.",
            "link",
        ),
        MetricSpec(
            MetricId.ECC_CORRECTED,
            "gpu_ecc_corrected_errors_total",
            "counter",
            "errors",
            "Corrected ECC errors.",
        ),
        MetricSpec(
            MetricId.ECC_UNCORRECTED,
            "gpu_ecc_uncorrected_errors_total",
            "counter",
            "errors",
            "Uncorrected ECC errors.",
        ),
        MetricSpec(
            MetricId.THROTTLE_REASONS,
            "gpu_throttle_reasons_bitmask",
            "gauge",
            "bitmask",
            "NVML clock event reasons; also expanded to gpu_throttled{reason}.",
        ),
        MetricSpec(
            MetricId.PROCESS_MEMORY,
            "gpu_process_memory_used_bytes",
            "gauge",
            "bytes",
            "Device memory used by one process.",
            "pid",
        ),
        MetricSpec(
            MetricId.FAN_SPEED, "gpu_fan_speed_ratio", "gauge", "ratio", "Fan speed, fraction of maximum."
        ),
        MetricSpec(
            MetricId.PCIE_REPLAYS, "gpu_pcie_replays_total", "counter", "replays", "PCIe replay events."
        ),
        MetricSpec(
            MetricId.RETIRED_PAGES,
            "gpu_retired_pages",
            "gauge",
            "pages",
            "Memory pages retired or rows remapped.",
        ),
        # Launch aggregates counted in the kernel by the eBPF tracer (exact even when per-launch
        # LAUNCH records are sampled); cumulative since the tracer started.
        MetricSpec(
            MetricId.LAUNCH_CALLS,
            "cuda_launch_api_calls_total",
            "counter",
            "calls",
            "Launch API calls of one kernel, counted in the kernel by the eBPF tracer.",
            "kernel",
            "string",
        ),
        MetricSpec(
            MetricId.LAUNCH_HOST_TIME,
            "cuda_launch_host_seconds_total",
            "counter",
            "seconds",
            "Host time the launching threads spent inside launch API calls of one kernel.",
            "kernel",
            "string",
        ),
        MetricSpec(
            MetricId.LAUNCH_HOST_LATENCY_BUCKET,
            "cuda_launch_host_seconds_bucket",
            "counter",
            "calls",
            "Histogram of host time per launch call (classic le buckets; +Inf from the call count).",
            "kernel",
            "string_log2_bucket",
        ),
        MetricSpec(
            MetricId.CUDA_ALLOCATED_BYTES,
            "cuda_allocated_bytes",
            "gauge",
            "bytes",
            "Device memory a process allocated through the driver and has not freed (eBPF).",
            "pid",
        ),
        # The CUPTI probe's own counts, cumulative per process (aux); process-wide ones (dropped,
        # pool exhausted) on the lowest GPU the process writes to (docs/probes.md).
        MetricSpec(
            MetricId.CUPTI_RECORDS,
            "ki_cupti_records_total",
            "counter",
            "records",
            "Ring records the CUPTI probe wrote for one process.",
            "pid",
        ),
        MetricSpec(
            MetricId.CUPTI_DROPPED,
            "ki_cupti_dropped_records_total",
            "counter",
            "records",
            "Activity records CUPTI dropped in one process (cuptiActivityGetNumDroppedRecords).",
            "pid",
        ),
        MetricSpec(
            MetricId.CUPTI_RING_REFUSED,
            "ki_cupti_ring_refused_records_total",
            "counter",
            "records",
            "Records the CUPTI probe could not write: the ring was full or did not exist.",
            "pid",
        ),
        MetricSpec(
            MetricId.CUPTI_POOL_EXHAUSTED,
            "ki_cupti_buffer_pool_exhausted_total",
            "counter",
            "requests",
            "CUPTI buffer requests the probe's pool could not answer (CUPTI then drops records).",
            "pid",
        ),
    )
}
# dcgm-exporter's series (agent/dcgm.py).
METRIC_SPECS.update(
    (f.id, MetricSpec(f.id, f.name, f.type, f.unit, f.help, f.aux_label, dcgm=True)) for f in DCGM_FIELDS
)

#: NVML clock event reason bits, as ``gpu_throttled{reason}`` names them.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def spec(metric_id: int) -> MetricSpec | None:
    """The spec of a metric id, or None for ids newer than this collector (the sample is counted, not stored)."""
    return METRIC_SPECS.get(metric_id)
