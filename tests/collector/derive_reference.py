"""The per-record Deriver as it was before the columnar rewrite: the reference the property test compares against.

Kept verbatim (apart from this docstring) so a change of semantics in collector/derive.py shows up as a test failure;
changed only where the semantics changed on purpose: kernel busy time and mean execution time are
counted in whole nanoseconds (docs/metrics.md), 2026-12-01.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kernel_insight.agent.metric_ids import THROTTLE_REASONS, MetricId, spec
from kernel_insight.agent.records import (
    RECORD_DTYPE,
    CollectiveOp,
    CollectiveRecord,
    ErrorKind,
    ErrorRecord,
    FingerprintField,
    FingerprintRecord,
    KernelRecord,
    LaunchRecord,
    MemopKind,
    MemopRecord,
    RecordFlag,
    RecordType,
    SampleRecord,
    StringRecord,
    StringTable,
    SyncKind,
    SyncRecord,
    decode_record,
)
from kernel_insight.collector.rows import (
    Event,
    InstanceInfo,
    Labels,
    SampleBatch,
    SampleBuilder,
    SpanBatch,
    canonical_labels,
)

__all__ = ["AGENT_COUNTERS", "Derived", "Deriver", "agent_metric_name"]

_KERNEL_DTYPE = np.dtype([("end", "<u8"), ("stream", "<u8"), ("corr", "<u8"), ("pid", "<u4"), ("_r", "<u4")])
_NS_PER_MS = 1_000_000
_LABEL_CACHE_MAX = 200_000

#: Agent self-metrics (docs/wire.md, COUNTERS): name -> (metric name, type, scale to the metric's unit).
AGENT_COUNTERS: dict[str, tuple[str, str, float]] = {
    "records_read": ("ki_agent_records_read_total", "counter", 1.0),
    "records_shipped": ("ki_agent_records_shipped_total", "counter", 1.0),
    "garbage_skipped": ("ki_agent_garbage_skipped_total", "counter", 1.0),
    "ring_dropped": ("ki_agent_ring_dropped_total", "counter", 1.0),
    "ring_torn": ("ki_agent_ring_torn_total", "counter", 1.0),
    "ring_abandoned": ("ki_agent_ring_abandoned_total", "counter", 1.0),
    "ring_lost": ("ki_agent_ring_lost_total", "counter", 1.0),
    "spool_dropped_batches": ("ki_agent_spool_dropped_batches_total", "counter", 1.0),
    "spool_dropped_records": ("ki_agent_spool_dropped_records_total", "counter", 1.0),
    "batches_sealed": ("ki_agent_batches_sealed_total", "counter", 1.0),
    "batches_sent": ("ki_agent_batches_sent_total", "counter", 1.0),
    "batches_retried": ("ki_agent_batches_retried_total", "counter", 1.0),
    "batches_failed": ("ki_agent_batches_failed_total", "counter", 1.0),
    "bytes_raw": ("ki_agent_bytes_raw_total", "counter", 1.0),
    "bytes_compressed": ("ki_agent_bytes_compressed_total", "counter", 1.0),
    "drain_lag_ns": ("ki_agent_drain_lag_seconds", "gauge", 1e-9),
    "ring_backlog": ("ki_agent_ring_backlog_records", "gauge", 1.0),
    "names_reset": ("ki_agent_names_reset_total", "counter", 1.0),
    "auth_failures": ("ki_agent_auth_failures_total", "counter", 1.0),
    "spool_bytes": ("ki_agent_spool_bytes", "gauge", 1.0),
    "spool_batches": ("ki_agent_spool_batches", "gauge", 1.0),
    "rss_kb": ("ki_agent_resident_memory_bytes", "gauge", 1024.0),
    "names_truncated": ("ki_agent_names_truncated_total", "counter", 1.0),
    "batches_dead_lettered": ("ki_agent_batches_dead_lettered_total", "counter", 1.0),
    "spool_write_errors": ("ki_agent_spool_write_errors_total", "counter", 1.0),
    "requests_sent": ("ki_agent_requests_sent_total", "counter", 1.0),
    "requests_failed": ("ki_agent_requests_failed_total", "counter", 1.0),
}


def agent_metric_name(counter: str) -> tuple[str, float]:
    """Metric name and scale for an agent counter; counters newer than this table keep their raw name."""
    known = AGENT_COUNTERS.get(counter)
    if known is not None:
        return known[0], known[2]
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in counter.lower())
    return f"ki_agent_{safe}", 1.0


@dataclass(slots=True)
class Derived:
    """What one call to :meth:`Deriver.derive` produced, ready for ``Store.insert_batch``."""

    samples: SampleBatch
    spans: SpanBatch
    events: list[Event] = field(default_factory=list)
    instances: list[InstanceInfo] = field(default_factory=list)
    unknown_records: int = 0  # records of a type or metric id this collector does not know


def _kind(enum_cls: type[MemopKind] | type[SyncKind] | type[CollectiveOp] | type[ErrorKind], v: int) -> str:
    try:
        return enum_cls(v).name.lower()
    except ValueError:
        return f"unknown_{v}"


class Deriver:
    """Turns one instance's ring records into rows; feed it every batch of that instance in order.

    Counters (``*_total``) are running totals kept here, so they restart from zero when the
    collector restarts; PromQL's ``rate()`` and ``increase()`` read that as a counter reset.

    >>> d = Deriver("host-1")
    >>> d.derive(np.zeros(0, dtype=RECORD_DTYPE)).spans.start_ns.size
    0
    """

    def __init__(self, instance: str, labels: Mapping[str, str] | None = None) -> None:
        self.instance = instance
        self.labels = dict(labels or {})
        self.strings = StringTable()
        self._names: dict[tuple[int, int], str] = {}
        self._totals: dict[Labels, float] = defaultdict(float)
        self._label_cache: dict[tuple[str, int | None, str, tuple[tuple[str, str], ...]], Labels] = {}
        self._fingerprint: dict[int, dict[str, str]] = defaultdict(dict)
        self._memory_total: dict[int, float] = {}

    # ---- undo ------------------------------------------------------------------------

    def checkpoint(self) -> dict[Labels, float]:
        """The running totals, to hand back to :meth:`rollback` if the derived rows are not stored.

        Without it a batch that failed to store (and will be retried) would be counted twice.
        Names, fingerprints and memory totals need no undo: learning them twice is harmless.
        """
        return dict(self._totals)

    def rollback(self, checkpoint: dict[Labels, float]) -> None:
        self._totals = defaultdict(float, checkpoint)

    # ---- helpers ---------------------------------------------------------------------

    def _name(self, producer: int, string_id: int) -> str | None:
        return self._names.get((producer, string_id)) or self.strings.get(producer, string_id)

    def _kernel_name(self, producer: int, string_id: int) -> str:
        return self._name(producer, string_id) or f"unknown_{string_id}"

    def _model(self, gpu: int) -> str:
        return self._fingerprint.get(gpu, {}).get("name", "")

    def _labels(self, metric: str, gpu: int | None, **extra: str) -> Labels:
        """The series' canonical labels, built once per (metric, gpu, model, extra labels)."""
        model = self._model(gpu) if gpu is not None else ""
        key = (metric, gpu, model, tuple(extra.items()))
        labels = self._label_cache.get(key)
        if labels is None:
            out = {**self.labels, "__name__": metric, "instance": self.instance}
            if gpu is not None:
                out["gpu"] = str(gpu)
                out["gpu_product"] = model
            out.update(extra)
            labels = canonical_labels(out)
            if len(self._label_cache) > _LABEL_CACHE_MAX:
                self._label_cache.clear()
            self._label_cache[key] = labels
        return labels

    def _count(self, out: SampleBuilder, labels: Labels, delta: float, ts_ms: int) -> None:
        total = self._totals[labels] = self._totals[labels] + delta
        out.add_canonical(labels, ts_ms, total)

    # ---- the one entry point ---------------------------------------------------------

    def derive(
        self,
        records: npt.NDArray[np.void],
        *,
        strings: Mapping[tuple[int, int], str] | None = None,
        counters: Mapping[str, float] | None = None,
        now_ns: int | None = None,
    ) -> Derived:
        """Rows for one batch: ``records`` in RECORD_DTYPE (ring order), names the wire batch carried,
        and the agent's counters by name (docs/wire.md, lower-case)."""
        if records.dtype != RECORD_DTYPE:
            raise TypeError("derive() needs an array of RECORD_DTYPE")
        now_ns = time.time_ns() if now_ns is None else now_ns
        if strings:
            self._names.update(strings)
        samples = SampleBuilder()
        events: list[Event] = []
        unknown = 0
        types = records["type"]
        if "simulated" not in self.labels and np.any(records["flags"] & RecordFlag.SIMULATED):
            # Simulated data must never pass for real: from the first simulated record on, every
            # series and the instance itself carry simulated="true" (erring on the safe side if a
            # real producer shares the instance).
            self.labels["simulated"] = "true"
            self._label_cache.clear()
        # Names and fingerprints first, so this batch's records can use them.
        for i in np.flatnonzero(types == RecordType.STRING).tolist():
            rec = decode_record(records[i].tobytes())
            assert isinstance(rec, StringRecord)
            self.strings.add(rec)
        fp_changed = False
        for i in np.flatnonzero(types == RecordType.FINGERPRINT).tolist():
            fp_changed |= self._fingerprint_record(records[i])
        spans = self._kernels(records[types == RecordType.KERNEL], samples)
        for i in np.flatnonzero((types != RecordType.KERNEL) & (types != RecordType.STRING)).tolist():
            rtype = int(types[i])
            if rtype == RecordType.FINGERPRINT:
                continue
            if rtype not in RecordType._value2member_map_:
                unknown += 1
                continue
            unknown += self._one(records[i], samples, events)
        if counters:
            ts_ms = now_ns // _NS_PER_MS
            for name, value in counters.items():
                metric, scale = agent_metric_name(name)
                samples.add(
                    self._labels(metric, None),
                    ts_ms,
                    float(value) * scale if scale >= 1 else float(value) / round(1 / scale),
                )
        instances = []
        if fp_changed or len(records) or counters:
            instances.append(self._instance(now_ns))
        return Derived(samples.build(), spans, events, instances, unknown)

    # ---- KERNEL: spans and per-kernel metrics, as columns ------------------------------

    def _kernels(self, k: npt.NDArray[np.void], out: SampleBuilder) -> SpanBatch:
        if len(k) == 0:
            return SpanBatch.empty()
        payload = np.ascontiguousarray(k["payload"]).view(_KERNEL_DTYPE)
        start = k["ts_ns"].astype(np.int64)
        end = payload["end"].astype(np.int64)
        key = (k["producer"].astype(np.uint64) << np.uint64(32)) | k["id"].astype(np.uint64)
        uniq, inverse = np.unique(key, return_inverse=True)
        names_u = [self._kernel_name(int(u) >> 32, int(u) & 0xFFFFFFFF) for u in uniq.tolist()]
        names = np.array(names_u, dtype=object)[inverse]
        inverse = inverse.ravel()
        gpu = k["device"].astype(np.uint16)
        spans = SpanBatch(
            instance=[self.instance] * len(k),
            gpu=gpu,
            stream=payload["stream"].astype(np.uint64),
            kernel=names.tolist(),
            start_ns=start,
            end_ns=end,
            correlation=payload["corr"].astype(np.uint64),
            pid=payload["pid"].astype(np.uint32),
        )
        # Per (gpu, kernel name): launches, busy time, and the mean execution time in this batch (ns).
        dur = np.maximum(end - start, 0).astype(np.float64)
        name_ids = np.unique(np.asarray(names_u, dtype=object), return_inverse=True)[1][inverse]
        group = gpu.astype(np.int64) * (len(names_u) + 1) + name_ids
        _, ginv = np.unique(group, return_inverse=True)
        counts = np.bincount(ginv)
        sums = np.bincount(ginv, weights=dur)
        order = np.argsort(ginv, kind="stable")
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        last_end = np.maximum.reduceat(end[order], starts)
        first = order[starts]
        for i, last, n, total in zip(
            first.tolist(), last_end.tolist(), counts.tolist(), sums.tolist(), strict=True
        ):
            ts_ms = last // _NS_PER_MS
            gpu_i = int(gpu[i])
            kernel = names_u[inverse[i]]
            self._count(out, self._labels("kernel_launches_total", gpu_i, kernel=kernel), float(n), ts_ms)
            busy_labels = self._labels("kernel_execution_time_seconds_total", gpu_i, kernel=kernel)
            busy = self._totals[busy_labels] = self._totals[busy_labels] + total  # whole ns
            out.add_canonical(busy_labels, ts_ms, busy / 1e9)
            out.add_canonical(
                self._labels("kernel_execution_time_seconds", gpu_i, kernel=kernel),
                ts_ms,
                round(total / n) / 1e9,
            )
        return spans

    # ---- the other record types, one at a time ----------------------------------------

    def _one(self, raw: np.void, out: SampleBuilder, events: list[Event]) -> int:
        rec = decode_record(raw.tobytes())
        if isinstance(rec, KernelRecord | StringRecord | FingerprintRecord):
            return 0  # handled in bulk before
        ts_ms = rec.ts_ns // _NS_PER_MS
        failed = bool(rec.flags & RecordFlag.FAILED)
        match rec:
            case LaunchRecord():
                kernel = self._kernel_name(rec.producer, rec.function_id)
                self._count(out, self._labels("cuda_launch_calls_total", rec.device, kernel=kernel), 1, ts_ms)
            case MemopRecord():
                kind = _kind(MemopKind, rec.kind)
                self._count(out, self._labels("gpu_memory_operations_total", rec.device, kind=kind), 1, ts_ms)
                if failed:
                    labels = self._labels("gpu_memory_operation_failures_total", rec.device, kind=kind)
                    self._count(out, labels, 1, ts_ms)
                elif rec.kind in (MemopKind.ALLOC, MemopKind.ALLOC_ASYNC):
                    labels = self._labels("gpu_memory_allocated_bytes_total", rec.device)
                    self._count(out, labels, float(rec.nbytes), ts_ms)
            case CollectiveRecord():
                op = _kind(CollectiveOp, rec.op)
                seconds = rec.duration_ns / 1e9
                self._count(out, self._labels("nccl_ops_total", rec.device, op=op), 1, ts_ms)
                self._count(
                    out, self._labels("nccl_bytes_total", rec.device, op=op), float(rec.nbytes), ts_ms
                )
                self._count(
                    out, self._labels("nccl_op_time_seconds_total", rec.device, op=op), seconds, ts_ms
                )
                out.add_canonical(self._labels("nccl_op_latency_seconds", rec.device, op=op), ts_ms, seconds)
                if failed:
                    self._count(out, self._labels("nccl_op_failures_total", rec.device, op=op), 1, ts_ms)
            case SyncRecord():
                kind = _kind(SyncKind, rec.kind)
                seconds = rec.duration_ns / 1e9
                self._count(out, self._labels("cuda_syncs_total", rec.device, kind=kind), 1, ts_ms)
                self._count(
                    out, self._labels("cuda_sync_time_seconds_total", rec.device, kind=kind), seconds, ts_ms
                )
            case SampleRecord():
                return self._sample(rec, out)
            case ErrorRecord():
                kind = _kind(ErrorKind, rec.kind)
                detail = self._name(rec.producer, rec.detail_id) if rec.detail_id else None
                events.append(
                    Event(
                        self.instance,
                        rec.device,
                        rec.ts_ns,
                        kind,
                        code=rec.code,
                        aux=rec.aux,
                        pid=rec.pid,
                        message=detail or "",
                    )
                )
                self._count(out, self._labels("kernel_errors_total", rec.device, kind=kind), 1, ts_ms)
            case _:
                return 1
        return 0

    def _sample(self, rec: SampleRecord, out: SampleBuilder) -> int:
        s = spec(rec.metric)
        if s is None:
            return 1
        ts_ms = rec.ts_ns // _NS_PER_MS
        extra: dict[str, str] = {}
        if s.aux_label and s.aux_kind == "value":
            extra[s.aux_label] = str(rec.aux)
        elif s.aux_label:
            extra[s.aux_label] = self._kernel_name(rec.producer, rec.aux & 0xFFFFFFFF)
            if s.aux_kind == "string_log2_bucket":
                extra["le"] = repr(2.0 ** ((rec.aux >> 32) + 1) / 1e9)
        out.add_canonical(self._labels(s.name, rec.device, **extra), ts_ms, rec.value)
        if rec.metric == MetricId.LAUNCH_CALLS:  # the histogram's +Inf bucket is the call count
            labels = self._labels("cuda_launch_host_seconds_bucket", rec.device, le="+Inf", **extra)
            out.add_canonical(labels, ts_ms, rec.value)
        if rec.metric == MetricId.MEMORY_TOTAL and rec.value > 0:
            self._memory_total[rec.device] = rec.value
        elif rec.metric == MetricId.MEMORY_FREE:
            total = self._memory_total.get(rec.device)
            if total:
                out.add_canonical(self._labels("gpu_memory_free_ratio", rec.device), ts_ms, rec.value / total)
        elif rec.metric == MetricId.THROTTLE_REASONS:
            bits = int(rec.value)
            for bit, reason in THROTTLE_REASONS.items():
                out.add_canonical(
                    self._labels("gpu_throttled", rec.device, reason=reason),
                    ts_ms,
                    1.0 if bits & bit else 0.0,
                )
        return 0

    # ---- FINGERPRINT: what the instance is ---------------------------------------------

    def _fingerprint_record(self, raw: np.void) -> bool:
        rec = decode_record(raw.tobytes())
        assert isinstance(rec, FingerprintRecord)
        try:
            key = FingerprintField(rec.field).name.lower()
        except ValueError:
            key = f"field_{rec.field}"
        value = (self._name(rec.producer, rec.value) or "") if rec.is_string else str(rec.value)
        fields = self._fingerprint[rec.device]
        if fields.get(key) == value:
            return False
        fields[key] = value
        if rec.field == FingerprintField.MEMORY_TOTAL and not rec.is_string and rec.value > 0:
            self._memory_total[rec.device] = float(rec.value)
        return True

    def _instance(self, now_ns: int) -> InstanceInfo:
        attributes = {
            f"gpu{g}.{k}": v for g, fields in sorted(self._fingerprint.items()) for k, v in fields.items()
        }
        stable = sorted(
            (k, v) for k, v in attributes.items() if not k.endswith((".driver_version", ".cuda_version"))
        )
        hw = hashlib.sha256(repr(stable).encode()).hexdigest()[:32] if stable else ""
        models = [f.get("name", "") for f in self._fingerprint.values() if f.get("name")]
        memory = sum(int(float(f.get("memory_total", "0") or 0)) for f in self._fingerprint.values())
        return InstanceInfo(
            id=self.instance,
            last_seen_ms=now_ns // _NS_PER_MS,
            hardware_fingerprint=hw,
            gpu_count=len(self._fingerprint),
            gpu_model=max(set(models), key=models.count) if models else "",
            memory_total_bytes=memory,
            labels=dict(self.labels),
            attributes=attributes,
        )
