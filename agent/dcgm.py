"""dcgm-exporter's series: DCGM field names, units and labels for what the NVML sampler reads (docs/metrics.md).

One table: each DCGM field the sampler can provide, its GPU_SAMPLE id (``DCGM_ID_BASE`` + the
DCGM field id, so the ids never meet the ones in ``MetricId``), its Prometheus type, unit and
help as dcgm-exporter's default counter set has them, and, for the fields that are the same
reading as one of our own series in another unit, that series and the factor.
"""

from __future__ import annotations

import functools
import math
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "DCGM_FIELDS",
    "DCGM_ID_BASE",
    "DcgmField",
    "dcgm_id",
    "dcgm_labels",
    "dcgm_samples",
    "host_name",
]

#: GPU_SAMPLE ids of DCGM series are this plus the DCGM field id (dcgm_fields.h).
DCGM_ID_BASE = 0x10000
_MIB = float(1 << 20)


@dataclass(frozen=True, slots=True)
class DcgmField:
    field_id: int  # the DCGM field id (dcgm_fields.h)
    name: str  # the series name, as dcgm-exporter exports it
    type: str  # "gauge" or "counter", as in dcgm-exporter's default-counters.csv
    unit: str  # the unit of the value (DCGM's own: MiB, MHz, W, mJ, percent...)
    help: str
    nvml: str  # where the value comes from (docs/metrics.md)
    #: The series of ours that is the same reading (a ``MetricId`` member's name: metric_ids.py
    #: builds its table from this module), and the factor from its unit to this one; None: the
    #: sampler reads it itself (no series of ours has it).
    source: str | None = None
    factor: float = 1.0
    #: "floor" or "round" for DCGM's integer fields (int64 in DCGM), "" for its doubles.
    integer: str = ""
    aux_label: str | None = None  # the label ``aux`` becomes

    @property
    def id(self) -> int:
        return DCGM_ID_BASE + self.field_id


def dcgm_id(field_id: int) -> int:
    """The GPU_SAMPLE id of a DCGM field."""
    return DCGM_ID_BASE + field_id


_F = DcgmField

#: dcgm-exporter's default counter set (etc/default-counters.csv) as far as NVML provides it,
#: plus the GPM profiling fields of dcgm-exporter's DCP set; docs/metrics.md lists the rest and why.
DCGM_FIELDS: tuple[DcgmField, ...] = (
    _F(
        100,
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "MHz",
        "SM clock frequency (in MHz).",
        "nvmlDeviceGetClockInfo(SM)",
        "SM_CLOCK",
        1e-6,
        "round",
    ),
    _F(
        101,
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "MHz",
        "Memory clock frequency (in MHz).",
        "nvmlDeviceGetClockInfo(MEM)",
        "MEMORY_CLOCK",
        1e-6,
        "round",
    ),
    _F(
        140,
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "C",
        "Memory temperature (in C).",
        "field NVML_FI_DEV_MEMORY_TEMP",
        "MEMORY_TEMPERATURE",
        1.0,
        "round",
    ),
    _F(
        150,
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "C",
        "GPU temperature (in C).",
        "nvmlDeviceGetTemperature(GPU)",
        "TEMPERATURE",
        1.0,
        "round",
    ),
    _F(
        155,
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "W",
        "Power draw (in W).",
        "nvmlDeviceGetPowerUsage (mW) / 1000",
        "POWER",
    ),
    _F(
        156,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "mJ",
        "Total energy consumption since boot (in mJ).",
        "nvmlDeviceGetTotalEnergyConsumption",
        "ENERGY",
        1e3,
        "round",
    ),
    _F(
        202,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "replays",
        "Total number of PCIe retries.",
        "field NVML_FI_DEV_PCIE_REPLAY_COUNTER",
        "PCIE_REPLAYS",
        1.0,
        "round",
    ),
    _F(
        203,
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "percent",
        "GPU utilization (in %).",
        "nvmlDeviceGetUtilizationRates .gpu",
        "GPU_UTIL",
        100.0,
        "round",
    ),
    _F(
        204,
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "percent",
        "Memory utilization (in %).",
        "nvmlDeviceGetUtilizationRates .memory",
        "MEMORY_UTIL",
        100.0,
        "round",
    ),
    _F(
        206,
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "percent",
        "Encoder utilization (in %).",
        "nvmlDeviceGetEncoderUtilization",
    ),
    _F(
        207,
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "percent",
        "Decoder utilization (in %).",
        "nvmlDeviceGetDecoderUtilization",
    ),
    _F(
        230,
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "xid",
        "Value of the last XID error encountered.",
        "the last nvmlEventTypeXidCriticalError event's data (0: none since the sampler started)",
        aux_label="err_code",
    ),
    _F(
        251,
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "MiB",
        "Framebuffer memory free (in MiB).",
        "nvmlDeviceGetMemoryInfo .free",
        "MEMORY_FREE",
        1 / _MIB,
        "floor",
    ),
    _F(
        252,
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "MiB",
        "Framebuffer memory used (in MiB).",
        "nvmlDeviceGetMemoryInfo .used",
        "MEMORY_USED",
        1 / _MIB,
        "floor",
    ),
    _F(
        253,
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "MiB",
        "Framebuffer memory reserved (in MiB).",
        "nvmlDeviceGetMemoryInfo_v2 .reserved",
    ),
    _F(
        393,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "Number of remapped rows for uncorrectable errors",
        "nvmlDeviceGetRemappedRows .uncorrectable",
    ),
    _F(
        394,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "Number of remapped rows for correctable errors",
        "nvmlDeviceGetRemappedRows .correctable",
    ),
    _F(
        395,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "boolean",
        "Whether remapping of rows has failed",
        "nvmlDeviceGetRemappedRows .failureOccurred",
    ),
    _F(
        449,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "KiB",
        "Total number of NVLink bandwidth counters for all lanes.",
        "fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX + _RX (KiB), summed over the active links",
    ),
    # Profiling (GPM, Hopper and later: nvmlGpmMetricsGet between two samples one interval apart).
    _F(
        1001,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of time the graphics engine is active.",
        "GPM NVML_GPM_METRIC_GRAPHICS_UTIL / 100",
    ),
    _F(
        1002,
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "ratio",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "GPM NVML_GPM_METRIC_SM_UTIL / 100",
    ),
    _F(
        1003,
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "ratio",
        "The ratio of number of warps resident on an SM.",
        "GPM NVML_GPM_METRIC_SM_OCCUPANCY / 100",
    ),
    _F(
        1004,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100",
    ),
    _F(
        1005,
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "GPM NVML_GPM_METRIC_DRAM_BW_UTIL / 100",
    ),
    _F(
        1006,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the fp64 pipes are active.",
        "GPM NVML_GPM_METRIC_FP64_UTIL / 100",
    ),
    _F(
        1007,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the fp32 pipes are active.",
        "GPM NVML_GPM_METRIC_FP32_UTIL / 100",
    ),
    _F(
        1008,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the fp16 pipes are active.",
        "GPM NVML_GPM_METRIC_FP16_UTIL / 100",
    ),
    _F(
        1009,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC (MiB/s) x 2^20",
    ),
    _F(
        1010,
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC (MiB/s) x 2^20",
    ),
    _F(
        1011,
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        "GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC (MiB/s) x 2^20",
    ),
    _F(
        1012,
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        "GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC (MiB/s) x 2^20",
    ),
)

_NVLINK_TOTAL = dcgm_id(449)


@functools.cache
def _by_source() -> tuple[dict[int, DcgmField], frozenset[int]]:
    """Our metric ids -> the DCGM field of the same reading, and the NVLink byte counters' ids."""
    from kernel_insight.agent.metric_ids import MetricId

    by = {int(MetricId[f.source]): f for f in DCGM_FIELDS if f.source is not None}
    return by, frozenset({int(MetricId.NVLINK_TX), int(MetricId.NVLINK_RX)})


def _convert(f: DcgmField, value: float) -> float:
    v = value * f.factor
    if f.integer == "floor":
        return float(math.floor(v))
    if f.integer == "round":
        return float(round(v))
    return v


def dcgm_samples(ours: Iterable[tuple[int, float, int]]) -> list[tuple[int, float, int]]:
    """The DCGM samples that are readings of ours in DCGM's units, from one GPU's samples of one instant.

    ``ours`` is (metric id, value in our unit, aux) as the sampler writes them; NVLink byte
    counters of every link add up to ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (KiB, both directions).
    """
    by_source, nvlinks = _by_source()
    out: list[tuple[int, float, int]] = []
    nvlink = 0.0
    links = False
    for mid, value, _aux in ours:
        f = by_source.get(mid)
        if f is not None:
            out.append((f.id, _convert(f, value), 0))
        elif mid in nvlinks:
            nvlink += value
            links = True
    if links:
        out.append((_NVLINK_TOTAL, float(round(nvlink / 1024.0)), 0))
    return out


def host_name() -> str:
    """The node's name for the ``Hostname`` label: ``NODE_NAME`` (a DaemonSet's downward API) or the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def dcgm_labels(gpu: int, fingerprint: Mapping[str, str]) -> dict[str, str]:
    """dcgm-exporter's labels of one GPU's series, from what the collector knows of the GPU (its FINGERPRINT).

    ``gpu`` itself is already a label of every GPU series. Both spellings of the host label are
    set: dcgm-exporter wrote ``Hostname`` up to 4.6 and ``hostname`` since.
    """
    out = {
        "UUID": fingerprint.get("uuid", ""),
        "pci_bus_id": fingerprint.get("pci_bus_id", ""),
        "device": f"nvidia{gpu}",
        "modelName": fingerprint.get("name", ""),
        "DCGM_FI_DRIVER_VERSION": fingerprint.get("driver_version", ""),
    }
    host = fingerprint.get("hostname", "")
    if host:
        out["Hostname"] = out["hostname"] = host
    return {k: v for k, v in out.items() if v}
