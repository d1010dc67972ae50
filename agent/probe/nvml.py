"""The NVML sampler: the GPU's own state once a second, critical events as ERROR records.

Reads NVML through ``pynvml`` (PyPI ``nvidia-ml-py``, NVIDIA's binding) and
writes GPU_SAMPLE records with the metric ids of docs/metrics.md, values
already in the metric's unit, and (unless ``dcgm_names`` is off) the same readings again as
dcgm-exporter's series in DCGM's units (agent/dcgm.py).  A metric the device does not support is asked
once and then skipped, so an old or virtual GPU costs no repeated failing calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no py.typed

from kernel_insight.agent.dcgm import dcgm_id, dcgm_samples, host_name
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.probe.kubelet import (
    UNASSIGNED,
    Attribution,
    KubeletUnavailable,
    PodResources,
    attribution_of,
)
from kernel_insight.agent.records import ErrorKind, FingerprintField
from kernel_insight.agent.ring import Ring, ring_name

__all__ = ["EVENT_MASK", "NvmlSampler", "NvmlUnavailable"]

_S = 1_000_000_000
_MAX_LINKS = 18  # NVLink 4 (H100): 18 links; the first link NVML refuses ends the scan

#: Event types the sampler registers (those a device does not support are left out).
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)

# NVML errors that mean "this metric is not available here": skip it from now on.
_UNAVAILABLE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NO_DATA,
}


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine (no library, no driver, no such GPU); the message says which."""


@dataclass(slots=True)
class _Device:
    index: int
    handle: Any
    ring: Ring
    links: list[int] = field(default_factory=list)  # active NVLink indices
    gpm: list[Any] = field(default_factory=list)  # two GPM samples (previous, current) when supported
    gpm_primed: bool = False
    last_xid: int = 0  # the last Xid event's code (DCGM_FI_DEV_XID_ERRORS); 0 before any
    uuid: str = ""  # how the kubelet names the GPU (or by index)
    owner: Attribution = UNASSIGNED  # the pod holding the GPU, as last written
    skip: set[str] = field(default_factory=set)  # metrics found unsupported
    lost: bool = False


def _load_library(path: str | None) -> None:
    """Make pynvml use ``path``: loading it first under its soname makes pynvml's own load find it."""
    if path is None:
        return
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise NvmlUnavailable(f"cannot load NVML library {path}: {e}") from None


def _init(library: str | None) -> None:
    _load_library(library)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        code = e.value
        if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlUnavailable(
                "NVML not found: libnvidia-ml.so.1 is not installed on this machine (no NVIDIA driver?); "
                "install the driver or pass --library PATH"
            ) from None
        if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            raise NvmlUnavailable(
                "NVML found but the NVIDIA driver is not loaded (is there a GPU?)"
            ) from None
        raise NvmlUnavailable(f"NVML initialisation failed: {_text(e)}") from None


def _text(e: pynvml.NVMLError) -> str:
    try:
        return str(e)
    except Exception:  # the library may be unable to name its own error
        return f"NVML error {e.value}"


def _str(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlSampler:
    """Samples every chosen GPU into that GPU's ring.

    Example::

        with NvmlSampler.open(gpus=[0]) as sampler:
            sampler.sample_once()
    """

    def __init__(
        self,
        devices: list[_Device],
        interval_s: float,
        fingerprint_every_s: float,
        clock: Callable[[], int] = time.time_ns,
        dcgm_names: bool = True,
        kubelet: PodResources | None = None,
        pods_every_s: float = 10.0,
    ) -> None:
        self._devices = devices
        self.dcgm_names = dcgm_names
        self._kubelet = kubelet
        self.pods_every_s = pods_every_s
        self._next_pods = 0
        self.kubelet_error = ""  # why the last PodResources call failed ("" when it answered)
        self._gpm_wanted = list(_GPM_DCGM) if dcgm_names else [pynvml.NVML_GPM_METRIC_SM_UTIL]
        self.interval_s = interval_s
        self.fingerprint_every_s = fingerprint_every_s
        self._clock = clock
        self._next_fingerprint = 0
        self._stop = threading.Event()
        self._events: threading.Thread | None = None
        self._closed = False
        self.samples_written = 0

    @classmethod
    def open(
        cls,
        gpus: Sequence[int] | None = None,
        *,
        library: str | None = None,
        label_prefix: str = "",
        interval_s: float = 1.0,
        fingerprint_every_s: float = 60.0,
        events: bool = True,
        clock: Callable[[], int] = time.time_ns,
        dcgm_names: bool = True,
        kubelet_socket: str | None = None,
        pods_every_s: float = 10.0,
    ) -> Self:
        """Initialise NVML and attach (creating if needed) the ring of each GPU; ``None`` means all GPUs.

        ``dcgm_names`` (on by default) also writes dcgm-exporter's series (docs/metrics.md).
        ``kubelet_socket``: ask the kubelet's PodResources API there, every ``pods_every_s``,
        which pod holds each GPU, and write it as FINGERPRINT POD/NAMESPACE/CONTAINER on change.
        """
        if interval_s <= 0 or fingerprint_every_s <= 0 or pods_every_s <= 0:
            raise ValueError("nvml: interval, fingerprint and pod periods must be positive")
        _init(library)
        try:
            count = pynvml.nvmlDeviceGetCount()
            indices = list(range(count)) if gpus is None else list(gpus)
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise NvmlUnavailable(f"no GPU {bad[0]}: NVML sees {count} GPU(s) (indices 0..{count - 1})")
            if not indices:
                raise NvmlUnavailable("NVML sees no GPU on this machine")
            devices = []
            for i in indices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                ring = Ring.attach(ring_name(f"{label_prefix}{i}"), create=True)
                devices.append(_Device(i, handle, ring, _active_links(handle), _gpm_samples(handle)))
                with contextlib.suppress(pynvml.NVMLError):
                    devices[-1].uuid = _str(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML: {_text(e)}") from None
        except BaseException:
            pynvml.nvmlShutdown()
            raise
        kubelet = PodResources(kubelet_socket) if kubelet_socket else None
        sampler = cls(devices, interval_s, fingerprint_every_s, clock, dcgm_names, kubelet, pods_every_s)
        if events:
            sampler._start_events()
        return sampler

    @property
    def indices(self) -> list[int]:
        return [d.index for d in self._devices]

    # ---- sampling -------------------------------------------------------------

    def run(self, seconds: float | None = None) -> None:
        """Sample every interval until ``seconds`` pass or close(); the schedule does not drift."""
        start = time.monotonic()
        tick = 0
        while not self._stop.is_set():
            self.sample_once()
            tick += 1
            due = start + tick * self.interval_s
            if seconds is not None and due - start > seconds:
                return
            self._stop.wait(max(0.0, due - time.monotonic()))

    def sample_once(self) -> int:
        """One sample of every GPU (and a FINGERPRINT when due); returns records written."""
        ts = self._clock()
        written = 0
        if ts >= self._next_fingerprint:
            for d in self._devices:
                written += self._fingerprint(d, ts)
            self._next_fingerprint = ts + int(self.fingerprint_every_s * _S)
        if self._kubelet is not None and ts >= self._next_pods:
            written += self._pods(ts)
            self._next_pods = ts + int(self.pods_every_s * _S)
        for d in self._devices:
            if not d.lost:
                written += self._sample(d, ts)
        self.samples_written += written
        return written

    def _read(self, d: _Device, name: str, fn: Callable[[], Any]) -> Any:
        """One NVML call; None when unsupported (remembered) or when the GPU is lost (reported once)."""
        if name in d.skip:
            return None
        try:
            return fn()
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                if not d.lost:
                    d.lost = True
                    detail = d.ring.intern(f"NVML: GPU {d.index} is lost (reading {name})")
                    d.ring.error(ErrorKind.OTHER, d.index, self._clock(), e.value, 0, 0, detail)
                return None
            if e.value in _UNAVAILABLE:
                d.skip.add(name)
            return None

    def _sample(self, d: _Device, ts: int) -> int:
        h = d.handle
        out: list[tuple[int, float, int]] = []
        mem = self._read(d, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            out += [(MetricId.MEMORY_USED, mem.used, 0), (MetricId.MEMORY_FREE, mem.free, 0)]
            out.append((MetricId.MEMORY_TOTAL, mem.total, 0))
        temp = self._read(d, "temperature", lambda: _temperature(h))
        if temp is not None:
            out.append((MetricId.TEMPERATURE, temp, 0))
        for name, metric, fn, scale in (
            ("power", MetricId.POWER, pynvml.nvmlDeviceGetPowerUsage, 1e-3),
            ("power_limit", MetricId.POWER_LIMIT, pynvml.nvmlDeviceGetEnforcedPowerLimit, 1e-3),
            ("energy", MetricId.ENERGY, pynvml.nvmlDeviceGetTotalEnergyConsumption, 1e-3),
            ("fan", MetricId.FAN_SPEED, pynvml.nvmlDeviceGetFanSpeed, 1e-2),
            ("throttle", MetricId.THROTTLE_REASONS, _throttle_reasons, 1),
        ):
            v = self._read(d, name, functools.partial(fn, h))
            if v is not None:
                out.append((metric, v * scale, 0))
        util = self._read(d, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out += [(MetricId.GPU_UTIL, util.gpu / 100, 0), (MetricId.MEMORY_UTIL, util.memory / 100, 0)]
        for name, metric, arg in (
            ("clock_sm", MetricId.SM_CLOCK, pynvml.NVML_CLOCK_SM),
            ("clock_mem", MetricId.MEMORY_CLOCK, pynvml.NVML_CLOCK_MEM),
        ):
            v = self._read(d, name, functools.partial(pynvml.nvmlDeviceGetClockInfo, h, arg))
            if v is not None:
                out.append((metric, v * 1e6, 0))
        for name, metric, arg in (
            ("pcie_tx", MetricId.PCIE_TX, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            ("pcie_rx", MetricId.PCIE_RX, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        ):
            v = self._read(d, name, functools.partial(pynvml.nvmlDeviceGetPcieThroughput, h, arg))
            if v is not None:
                out.append((metric, v * 1024.0, 0))  # NVML reports KB/s
        for name, metric, arg in (
            ("ecc_corrected", MetricId.ECC_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", MetricId.ECC_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            ecc = functools.partial(pynvml.nvmlDeviceGetTotalEccErrors, h, arg, pynvml.NVML_VOLATILE_ECC)
            v = self._read(d, name, ecc)
            if v is not None:
                out.append((metric, v, 0))
        pages = self._read(d, "retired_pages", functools.partial(_retired_pages, h))
        if pages is not None:
            out.append((MetricId.RETIRED_PAGES, pages[0], 0))
        procs = self._read(d, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        for p in procs or []:
            if p.usedGpuMemory is not None:
                out.append((MetricId.PROCESS_MEMORY, p.usedGpuMemory, p.pid))
        out += self._fields(d)
        gpm = self._read(d, "gpm", functools.partial(_gpm_metrics, d, self._gpm_wanted)) if d.gpm else None
        if gpm and pynvml.NVML_GPM_METRIC_SM_UTIL in gpm:
            out.append((MetricId.SM_UTIL, gpm[pynvml.NVML_GPM_METRIC_SM_UTIL] / 100.0, 0))
        if self.dcgm_names:
            out += self._dcgm(d, out, pages[1] if pages is not None else None, gpm or {})
        ring = d.ring
        for mid, value, aux in out:
            ring.sample(mid, d.index, ts, float(value), aux)
        return len(out)

    def _dcgm(
        self,
        d: _Device,
        ours: list[tuple[int, float, int]],
        rows: tuple[int, int, int] | None,
        gpm: dict[int, float],
    ) -> list[tuple[int, float, int]]:
        """dcgm-exporter's series: our readings of this instant in DCGM's units, and the fields only DCGM names."""
        h = d.handle
        out = dcgm_samples(ours)
        for name, fid, fn in (
            ("enc_util", 206, pynvml.nvmlDeviceGetEncoderUtilization),
            ("dec_util", 207, pynvml.nvmlDeviceGetDecoderUtilization),
        ):
            v = self._read(d, name, functools.partial(fn, h))
            if v is not None:
                out.append((dcgm_id(fid), float(v[0]), 0))
        mem = self._read(
            d, "memory_v2", functools.partial(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2)
        )
        if mem is not None:
            out.append((dcgm_id(253), float(int(mem.reserved) >> 20), 0))
        if rows is not None:
            corr, unc, failed = rows
            out += [
                (dcgm_id(393), float(unc), 0),
                (dcgm_id(394), float(corr), 0),
                (dcgm_id(395), float(failed), 0),
            ]
        out.append((dcgm_id(230), float(d.last_xid), d.last_xid))
        for metric, (fid, scale) in _GPM_DCGM.items():
            if metric in gpm:
                out.append((dcgm_id(fid), gpm[metric] * scale, 0))
        return out

    def _fields(self, d: _Device) -> list[tuple[int, float, int]]:
        """Field values in one call: memory temperature, PCIe replays, NVLink counters per active link."""
        wanted: list[tuple[int, int, MetricId, float]] = [
            (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0, MetricId.MEMORY_TEMPERATURE, 1.0),
            (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0, MetricId.PCIE_REPLAYS, 1.0),
        ]
        for link in d.links:
            wanted.append((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link, MetricId.NVLINK_TX, 1024.0))
            wanted.append((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link, MetricId.NVLINK_RX, 1024.0))
        wanted = [w for w in wanted if f"field{w[0]}.{w[1]}" not in d.skip]
        if not wanted:
            return []
        values = self._read(
            d, "fields", lambda: pynvml.nvmlDeviceGetFieldValues(d.handle, [(f, s) for f, s, _, _ in wanted])
        )
        if values is None:
            return []
        out: list[tuple[int, float, int]] = []
        for (fid, scope, metric, scale), v in zip(wanted, values, strict=True):
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                if v.nvmlReturn in _UNAVAILABLE:
                    d.skip.add(f"field{fid}.{scope}")
                continue
            out.append((metric, _field_value(v) * scale, scope if metric in _PER_LINK else 0))
        return out

    def _pods(self, ts: int) -> int:
        """Ask the kubelet which pod holds each GPU; write the ones that changed. A kubelet that does
        not answer changes nothing (its reason is in ``kubelet_error``)."""
        assert self._kubelet is not None
        try:
            assigned = self._kubelet.gpus()
        except KubeletUnavailable as e:
            self.kubelet_error = str(e)
            return 0
        self.kubelet_error = ""
        n = 0
        for d in self._devices:
            owner = attribution_of(assigned, d.uuid, d.index)
            if owner != d.owner:
                d.owner = owner
                n += self._owner(d, ts)
        return n

    def _owner(self, d: _Device, ts: int) -> int:
        """The GPU's pod, namespace and container as FINGERPRINT strings ("" each when no pod holds it)."""
        ring = d.ring
        o = d.owner
        for fid, text in (
            (FingerprintField.POD, o.pod),
            (FingerprintField.NAMESPACE, o.namespace),
            (FingerprintField.CONTAINER, o.container),
        ):
            ring.fingerprint(fid, d.index, ts, ring.intern(text), 1)
        return 3

    def _fingerprint(self, d: _Device, ts: int) -> int:
        h = d.handle
        ring = d.ring
        n = 0
        strings: list[tuple[int, str, Callable[[], Any]]] = [
            (FingerprintField.NAME, "name", lambda: pynvml.nvmlDeviceGetName(h)),
            (FingerprintField.UUID, "uuid", lambda: pynvml.nvmlDeviceGetUUID(h)),
            (FingerprintField.DRIVER_VERSION, "driver", pynvml.nvmlSystemGetDriverVersion),
            (FingerprintField.PCI_BUS_ID, "pci", lambda: pynvml.nvmlDeviceGetPciInfo(h).busId),
            (FingerprintField.HOSTNAME, "hostname", host_name),
        ]
        for fid, name, fn in strings:
            v = self._read(d, name, fn)
            if v is not None:
                ring.fingerprint(fid, d.index, ts, ring.intern(_str(v)), 1)
                n += 1
        numbers: list[tuple[int, str, Callable[[], Any]]] = [
            (FingerprintField.CUDA_VERSION, "cuda", pynvml.nvmlSystemGetCudaDriverVersion),
            (FingerprintField.MEMORY_TOTAL, "memory_total", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total),
            (FingerprintField.COMPUTE_CAPABILITY, "cc", lambda: _compute_capability(h)),
            (FingerprintField.NVLINK_LINKS, "links", lambda: len(d.links)),
            (FingerprintField.NVLINK_BANDWIDTH, "nvlink_bw", lambda: _nvlink_bandwidth(h, len(d.links))),
        ]
        for fid, name, fn in numbers:
            v = self._read(d, name, fn)
            if v is not None:
                ring.fingerprint(fid, d.index, ts, int(v))
                n += 1
        if self._kubelet is not None:
            n += self._owner(d, ts)  # a collector that restarted learns the pod again
        return n

    # ---- events ---------------------------------------------------------------

    def _start_events(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return  # no event support: sampling still works
        by_handle: dict[int, _Device] = {}
        for d in self._devices:
            try:
                mask = pynvml.nvmlDeviceGetSupportedEventTypes(d.handle) & EVENT_MASK
                if mask:
                    pynvml.nvmlDeviceRegisterEvents(d.handle, mask, event_set)
                    by_handle[_address(d.handle)] = d
            except pynvml.NVMLError:
                continue
        if not by_handle:
            pynvml.nvmlEventSetFree(event_set)
            return
        self._events = threading.Thread(
            target=self._event_loop, args=(event_set, by_handle), name="ki-nvml-events", daemon=True
        )
        self._events.start()

    def _event_loop(self, event_set: Any, by_handle: dict[int, _Device]) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait(event_set, 200)
                except pynvml.NVMLError as e:
                    if e.value == pynvml.NVML_ERROR_TIMEOUT:
                        continue
                    if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                        time.sleep(0.2)
                        continue
                    return
                d = by_handle.get(_address(data.device))
                if d is not None:
                    self._event(d, int(data.eventType), int(data.eventData))
        finally:
            pynvml.nvmlEventSetFree(event_set)

    def _event(self, d: _Device, etype: int, edata: int) -> None:
        ts = self._clock()
        if etype == pynvml.nvmlEventTypeXidCriticalError:
            kind, what = ErrorKind.XID, f"Xid {edata}"
            d.last_xid = edata
        elif etype in (pynvml.nvmlEventTypeDoubleBitEccError, pynvml.nvmlEventTypeSingleBitEccError):
            bit = "double" if etype == pynvml.nvmlEventTypeDoubleBitEccError else "single"
            kind, what = ErrorKind.ECC, f"{bit} bit ECC error"
        else:
            kind, what = ErrorKind.OTHER, f"NVML event 0x{etype:x}"
        detail = d.ring.intern(f"{what} on GPU {d.index} (NVML event)")
        d.ring.error(kind, d.index, ts, edata, etype, 0, detail)

    # ---- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Stop the event thread, close the rings and shut NVML down; safe twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._events is not None:
            self._events.join(timeout=2.0)
        if self._kubelet is not None:
            self._kubelet.close()
        for d in self._devices:
            d.ring.close()
            for sample in d.gpm:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_PER_LINK = {MetricId.NVLINK_TX, MetricId.NVLINK_RX}


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _temperature(h: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU))
    except pynvml.NVMLError as e:
        if e.value not in (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED):
            raise
    return int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))  # before driver 535


def _throttle_reasons(h: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    except pynvml.NVMLError as e:
        if e.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))  # older drivers' name


def _gpm_samples(h: Any) -> list[Any]:
    """Two GPM sample buffers when the GPU supports GPM (Hopper and later), else none."""
    try:
        if not pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            return []
        return [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    except pynvml.NVMLError:
        return []


#: GPM metrics read for DCGM's profiling fields: NVML's GPM metric id -> (DCGM field id, factor from
#: NVML's unit: percent to DCGM's ratio, MiB/s to bytes/s). SM_UTIL also feeds gpu_sm_utilization_ratio.
_GPM_DCGM: dict[int, tuple[int, float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: (1001, 0.01),
    pynvml.NVML_GPM_METRIC_SM_UTIL: (1002, 0.01),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: (1003, 0.01),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: (1004, 0.01),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: (1005, 0.01),
    pynvml.NVML_GPM_METRIC_FP64_UTIL: (1006, 0.01),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: (1007, 0.01),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: (1008, 0.01),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: (1009, float(1 << 20)),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: (1010, float(1 << 20)),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (1011, float(1 << 20)),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: (1012, float(1 << 20)),
}


def _gpm_metrics(d: _Device, wanted: Sequence[int]) -> dict[int, float] | None:
    """GPM metrics (NVML's units) between the previous sample and now, in one call; None on the first call.

    A metric the GPU does not provide is left out; all of them failing is "GPM unsupported".
    """
    prev, cur = d.gpm
    pynvml.nvmlGpmSampleGet(d.handle, cur)
    d.gpm.reverse()  # this sample is the next call's previous one
    if not d.gpm_primed:
        d.gpm_primed = True
        return None
    get = pynvml.c_nvmlGpmMetricsGet_t()
    get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(wanted)
    get.sample1, get.sample2 = prev, cur
    for i, metric in enumerate(wanted):
        get.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(get)
    out: dict[int, float] = {}
    status = pynvml.NVML_SUCCESS
    for i, metric in enumerate(wanted):
        m = get.metrics[i]
        if m.nvmlReturn == pynvml.NVML_SUCCESS:
            out[metric] = float(m.value)
        else:
            status = m.nvmlReturn
    if not out:
        raise pynvml.NVMLError(status)
    return out


def _retired_pages(h: Any) -> tuple[int, tuple[int, int, int] | None]:
    """Rows remapped (Ampere and later) with the (correctable, uncorrectable, failed) rows; before
    that, pages retired for single- and double-bit errors, and None."""
    try:
        corr, unc, _pending, failed = pynvml.nvmlDeviceGetRemappedRows(h)
        return int(corr) + int(unc), (int(corr), int(unc), int(failed))
    except pynvml.NVMLError as e:
        if e.value not in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            raise
    causes = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    return sum(len(pynvml.nvmlDeviceGetRetiredPages(h, c)) for c in causes), None


def _compute_capability(h: Any) -> int:
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
    return int(major) * 10 + int(minor)


def _nvlink_bandwidth(h: Any, links: int) -> int:
    """Bytes per second in one direction over all active links (NVML gives the per-link speed in MB/s)."""
    if links == 0:
        return 0
    (v,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])
    if v.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(v.nvmlReturn)
    return int(_field_value(v)) * 1_000_000 * links


def _field_value(v: Any) -> float:
    kind = v.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.value.dVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.value.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.value.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.value.sllVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.value.siVal)
    return float(v.value.ullVal)


def _active_links(h: Any) -> list[int]:
    links = []
    for link in range(_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                links.append(link)
        except pynvml.NVMLError:
            break
    return links
