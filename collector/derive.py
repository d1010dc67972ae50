"""Ring records -> storage rows: kernel spans, metric samples, events and instance facts (docs/metrics.md).

A :class:`Deriver` belongs to one instance (one agent) and keeps the little state that
derivation needs across batches: names, GPU models, memory totals and running counter
totals. Every record type is handled as numpy columns over the whole batch; Python runs
once per series (or per event), never per record. Records whose fields cannot be stored
are dropped and counted by reason before any state is touched (docs/metrics.md, "Dropped
records").
"""

from __future__ import annotations

import bisect
import hashlib
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.agent.counters import SPECS
from kernel_insight.agent.dcgm import dcgm_labels
from kernel_insight.agent.metric_ids import METRIC_SPECS, THROTTLE_REASONS, MetricId
from kernel_insight.agent.records import (
    PAYLOAD_DTYPES,
    RECORD_DTYPE,
    CollectiveOp,
    ErrorKind,
    FingerprintField,
    MemopKind,
    RecordFlag,
    RecordType,
    StringRecord,
    StringTable,
    SyncKind,
    decode_record,
)
from kernel_insight.collector.defaults import SYNC_KEEP_NS, SYNC_SAMPLE_EVERY
from kernel_insight.collector.hist_base import BaseBudget, HistogramBases
from kernel_insight.collector.rows import (
    MAX_TS_MS,
    CallBatch,
    Event,
    HistogramBatch,
    InstanceInfo,
    Labels,
    SampleBatch,
    SampleBuilder,
    SpanBatch,
    canonical_labels,
)
from kernel_insight.collector.wire import BODY_VERSION_INCREMENTS, name_hash
from kernel_insight.collector.wire_hist import FLAG_FIRST, HistKind, WireHistograms

__all__ = [
    "AGENT_COUNTERS",
    "DROP_REASONS",
    "DROP_STATS",
    "INGEST_LAG_METRIC",
    "KERNEL_DURATION_METRIC",
    "MAX_FINGERPRINT_FIELDS",
    "MAX_FINGERPRINT_GPUS",
    "MAX_OWNER_CHANGES",
    "MEMCPY_BYTES_METRIC",
    "NAMES_MAX_BYTES",
    "NCCL_DURATION_METRIC",
    "SYNC_KEEP_NS",
    "SYNC_SAMPLE_EVERY",
    "Derived",
    "Deriver",
    "DropStats",
    "agent_metric_name",
    "scale_agent_counter",
]

#: The native histograms a version 2 agent ships (docs/metrics.md, "Native histograms").
KERNEL_DURATION_METRIC = "kernel_duration_seconds"
NCCL_DURATION_METRIC = "nccl_op_duration_seconds"
MEMCPY_BYTES_METRIC = "memcpy_bytes"

_NS_PER_MS = 1_000_000
_LABEL_CACHE_MAX = 200_000
#: The last nanosecond the schema can store (rows.MAX_TS_MS, 2149-06-06): later times are dropped.
_MAX_TS_NS = (MAX_TS_MS + 1) * _NS_PER_MS - 1
#: A GPU's memory above this (256 TiB) is not a GPU: the FINGERPRINT or sample is dropped, so the
#: instance's summed memory always fits the UInt64 column.
_MAX_GPU_MEMORY = 1 << 48
#: Characters of names (kernel names, error details...) remembered per agent; an agent may send
#: 65,536 names of 64 KiB per batch, so without a bound one agent could fill the collector's memory.
NAMES_MAX_BYTES = 64 << 20
#: What one agent's fingerprint may hold: GPUs, and fields per GPU (10 are defined; newer
#: producers may add a few). The instance row carries them all, so they are bounded.
MAX_FINGERPRINT_GPUS = 1024
MAX_FINGERPRINT_FIELDS = 64
#: Latency buckets are log2 of nanoseconds: 2**64 ns is 584 years, so higher indices are garbage.
_MAX_BUCKET = 63

# Payload layouts of ki_ring.h (docs/ring.md): records.PAYLOAD_DTYPES, the one table.
_KERNEL_DTYPE = PAYLOAD_DTYPES[RecordType.KERNEL]
_LAUNCH_DTYPE = PAYLOAD_DTYPES[RecordType.LAUNCH]
#: Host launches (ring flag LAUNCH_SPAN) held for a kernel record in a later batch, per agent.
MAX_OPEN_LAUNCHES = 65_536
_MEMOP_DTYPE = PAYLOAD_DTYPES[RecordType.MEMOP]
_COLLECTIVE_DTYPE = PAYLOAD_DTYPES[RecordType.COLLECTIVE]
_SYNC_DTYPE = PAYLOAD_DTYPES[RecordType.SYNC]
_SAMPLE_DTYPE = PAYLOAD_DTYPES[RecordType.GPU_SAMPLE]
#: The Kubernetes labels of a GPU's series, from its FINGERPRINT (agent/probe/kubelet.py).
_POD_LABELS = ("pod", "namespace", "container")
_POD_FIELDS = frozenset((FingerprintField.POD, FingerprintField.NAMESPACE, FingerprintField.CONTAINER))
#: Changes of holder remembered per GPU, so that a span arriving late still gets the pod that held
#: the GPU when it ran (the probe asks the kubelet every 10 s: 256 changes cover 40 minutes of churn).
MAX_OWNER_CHANGES = 256
_NO_OWNER = ("", "", "")
#: FINGERPRINT fields that change without the hardware changing: left out of ``hardware_fingerprint``.
_NOT_HARDWARE = tuple(
    f".{f.name.lower()}"
    for f in (
        FingerprintField.DRIVER_VERSION,
        FingerprintField.CUDA_VERSION,
        FingerprintField.HOSTNAME,
        FingerprintField.POD,
        FingerprintField.NAMESPACE,
        FingerprintField.CONTAINER,
    )
)
#: The GPU_SAMPLE metric ids this collector knows (made once, not per batch).
_KNOWN_METRIC_IDS = np.array(sorted(METRIC_SPECS), dtype=np.uint32)
_FINGERPRINT_DTYPE = PAYLOAD_DTYPES[RecordType.FINGERPRINT]
_ERROR_DTYPE = PAYLOAD_DTYPES[RecordType.ERROR]


#: Why a record was dropped instead of stored (``ki_collector_records_dropped_total{reason}``).
DROP_REASONS: dict[str, str] = {
    "timestamp_out_of_range": "the record's time is after 2149-06-06, the last day the schema stores",
    "end_out_of_range": "a KERNEL record's end time is after 2149-06-06",
    "bucket_out_of_range": "a latency-bucket sample's log2 bucket index is above 63",
    "value_out_of_range": "a throttle bitmask or memory total that is not a finite, non-negative number",
    "fingerprint_out_of_range": "a FINGERPRINT memory total above 256 TiB",
    "batch_time_out_of_range": "the batch header's time is after 2149-06-06 (counters stamped with now)",
    "fingerprint_over_limit": "a FINGERPRINT past 1,024 GPUs or 64 fields per GPU for one agent",
    "names_over_limit": "not a record: a name past the agent's 64 Mi characters of names (kept as unknown_<id>)",
    "histogram_without_base": "not a record: a histogram increment whose base this collector does not hold "
    "(the agent is asked for a snapshot)",
}

#: Per agent batch, at the collector's receive time: receive time minus the batch's t_max. Its newest
#: sample is the agent's heartbeat as the store knows it (api/health.py judges staleness by it).
INGEST_LAG_METRIC = "ki_ingest_lag_seconds"

#: Agent self-metrics (docs/wire.md, COUNTERS): name -> (metric name, type, scale to the metric's unit).
AGENT_COUNTERS: dict[str, tuple[str, str, float]] = {
    c.name.lower(): (spec.metric, spec.kind, spec.scale) for c, spec in SPECS.items()
}

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


def _cut(lengths: npt.NDArray[np.integer[Any]]) -> I32:
    """Offsets (len + 1 entries from 0) of consecutive runs of ``lengths``: an Arrow list column's."""
    return np.concatenate(([0], np.cumsum(lengths.astype(np.int64)))).astype(np.int32)


def agent_metric_name(counter: str) -> tuple[str, float]:
    """Metric name and scale for an agent counter; counters newer than this table keep their raw name."""
    known = AGENT_COUNTERS.get(counter)
    if known is not None:
        return known[0], known[2]
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in counter.lower())
    return f"ki_agent_{safe}", 1.0


def _next_stamp_ms(ts_ns: int, last_ms: int) -> int:
    """The millisecond to stamp a batch's agent series at: its own time, or 1 ms after the
    agent's previous batch when that is later.

    One batch is one sample of each of these series, so two batches must never share a
    millisecond (the store's resolution): batches share a header time (the parts of one
    histogram export, sealed back to back at SIGTERM) or arrive within one (a backlog request of
    several batches), and each would write every counter a second time at one timestamp with
    another value, a duplicate sample Prometheus refuses and a value queries pick at random.
    Batches arrive in the order the agent sealed them, so stamps in arrival order also keep a
    counter from seeming to go back (a reset) when a batch's newest record is older than the
    previous batch's.

    >>> _next_stamp_ms(5_000_000, -1), _next_stamp_ms(5_900_000, 5), _next_stamp_ms(9_000_000, 5)
    (5, 6, 9)
    """
    return max(ts_ns // _NS_PER_MS, last_ms + 1)


class DropStats:
    """Records dropped by reason since start, summed over every deriver: the collector's metrics read it.

    >>> s = DropStats()
    >>> s.add({"bucket_out_of_range": 2})
    >>> s.snapshot()["bucket_out_of_range"]
    2
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(DROP_REASONS, 0)

    def add(self, dropped: Mapping[str, int]) -> None:
        with self._lock:
            for reason, n in dropped.items():
                self._counts[reason] = self._counts.get(reason, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


#: Where every :class:`Deriver` counts its drops unless given its own :class:`DropStats`.
DROP_STATS = DropStats()


@dataclass(slots=True)
class Derived:
    """What one call to :meth:`Deriver.derive` produced, ready for ``Store.insert_batch``."""

    samples: SampleBatch
    spans: SpanBatch
    events: list[Event] = field(default_factory=list)
    instances: list[InstanceInfo] = field(default_factory=list)
    unknown_records: int = 0  # records of a type or metric id this collector does not know
    dropped: dict[str, int] = field(default_factory=dict)  # records refused, by DROP_REASONS key
    histograms: HistogramBatch = field(default_factory=HistogramBatch.empty)  # native histogram samples
    calls: CallBatch = field(default_factory=CallBatch.empty)  # NCCL, memory and sync calls, one row each


def _kind(enum_cls: type[MemopKind] | type[SyncKind] | type[CollectiveOp] | type[ErrorKind], v: int) -> str:
    try:
        return enum_cls(v).name.lower()
    except ValueError:
        return f"unknown_{v}"


def _payload(recs: npt.NDArray[np.void], dtype: np.dtype[np.void]) -> npt.NDArray[np.void]:
    return np.ascontiguousarray(recs["payload"]).view(dtype)


def _group_rows(cols: Sequence[npt.NDArray[np.generic]]) -> tuple[list[tuple[int, ...]], I64]:
    """Distinct rows of the integer columns and, per record, the index of its row."""
    if len(cols) == 1:
        uniq, inv = np.unique(cols[0], return_inverse=True)
        return [(int(u),) for u in uniq.tolist()], inv.reshape(-1).astype(np.int64)
    stacked = np.stack([np.asarray(c).astype(np.uint64) for c in cols], axis=1)
    rows, inv = np.unique(stacked, axis=0, return_inverse=True)
    return [tuple(r) for r in rows.tolist()], inv.reshape(-1).astype(np.int64)


def scale_agent_counter(value: float, scale: float) -> float:
    """An agent counter in its metric's unit. A scale below 1 (1e-9: ns to seconds) divides by its
    inverse, one correctly rounded division, so a whole number of ns becomes the decimal the
    store keeps as an integer mantissa; ``value * 1e-9`` is off that decimal by an ulp about
    half the time (1e-9 is not exact in binary), and such floats cost ~7 bytes a sample."""
    return value * scale if scale >= 1 else value / round(1 / scale)


def _mean_s(total_ns: float, n: float) -> float:
    """A mean of nanosecond durations in seconds, to the nanosecond (the measurement's own
    precision): ``round(mean_ns) / 1e9`` is a decimal the store keeps as an integer mantissa."""
    return round(total_ns / n) / 1e9


class Deriver:
    """Turns one instance's ring records into rows; feed it every batch of that instance in order.

    Counters (``*_total``) are running totals kept here, so they restart from zero when the
    collector restarts; PromQL's ``rate()`` and ``increase()`` read that as a counter reset.

    >>> d = Deriver("host-1")
    >>> d.derive(np.zeros(0, dtype=RECORD_DTYPE)).spans.start_ns.size
    0
    """

    def __init__(
        self,
        instance: str,
        labels: Mapping[str, str] | None = None,
        *,
        stats: DropStats | None = None,
        sync_keep_ns: int = SYNC_KEEP_NS,
        sync_sample_every: int = SYNC_SAMPLE_EVERY,
        base_budget: BaseBudget | None = None,
    ) -> None:
        if sync_sample_every < 1:
            raise ValueError("sync_sample_every must be at least 1")
        self.instance = instance
        self.sync_keep_ns = sync_keep_ns
        self.sync_sample_every = sync_sample_every
        self._short_syncs = 0  # syncs under sync_keep_ns seen so far: every sync_sample_every-th is kept
        self.labels = dict(labels or {})
        self._enrolled = dict(self.labels)  # enrolment labels: they win over the agent's own
        self.strings = StringTable()
        self.stats = DROP_STATS if stats is None else stats
        self._names: dict[tuple[int, int], str] = {}
        self._names_chars = 0  # characters held in _names
        # wire.name_hash of the names in _names, as their bytes were sent (body version 5)
        self._name_hashes: dict[tuple[int, int], int] = {}
        self._totals: dict[Labels, float] = defaultdict(float)
        self._label_cache: dict[tuple[str, int | None, Labels, Labels], Labels] = {}
        self._key_cache: dict[tuple[str, tuple[int, ...]], Labels] = {}
        self._fingerprint: dict[int, dict[str, str]] = defaultdict(dict)
        # gpu -> (times, holders): from each time (FINGERPRINT ts_ns, ascending) on, the GPU's
        # (pod, namespace, container); a span gets the holder of its start (_span_owners).
        self._owners: dict[int, tuple[list[int], list[tuple[str, str, str]]]] = {}
        self._memory_total: dict[int, float] = {}
        # (gpu, pid, correlation) -> (launch ns, host ns, tid, NVTX range): launches whose kernel is not in yet
        self._open_launches: dict[tuple[int, int, int], tuple[int, int, int, str]] = {}
        # The last millisecond the agent's own series were stamped at (its COUNTERS, the ingest
        # lag): each batch's are stamped at least 1 ms later (_next_stamp_ms).
        self._counters_ms = -1
        self._lag_ms = -1
        # Version 4 bodies: the cumulative histograms the agent's increments build on (hist_base.py),
        # under the collector's bound on all agents' bases (base_budget), and whether an increment
        # lacked its base since the agent was last told (snapshot_wanted).
        self.hist_bases = HistogramBases(budget=base_budget)
        self.snapshot_wanted = False

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

    def _gpu_labels(self, gpu: int) -> tuple[tuple[str, str], ...]:
        """The labels a GPU's FINGERPRINT gives every series of the GPU: ``gpu_product``, and the
        Kubernetes ``pod``, ``namespace``, ``container`` while a pod holds the GPU."""
        fields = self._fingerprint.get(gpu, {})
        out = [("gpu_product", fields.get("name", ""))]
        if fields.get("pod"):
            out += [(k, fields.get(k, "")) for k in _POD_LABELS]
        return tuple(out)

    def _labels(self, metric: str, gpu: int | None, **extra: str) -> Labels:
        """The series' canonical labels, built once per (metric, gpu, the GPU's labels, extra labels).

        ``model`` is the served model, an instance label (enrolment); the GPU's product name
        is ``gpu_product``, so the two never overwrite each other.
        """
        gpu_labels = self._gpu_labels(gpu) if gpu is not None else ()
        key = (metric, gpu, gpu_labels, tuple(extra.items()))
        labels = self._label_cache.get(key)
        if labels is None:
            out = {**self.labels, "__name__": metric, "instance": self.instance}
            if gpu is not None:
                out["gpu"] = str(gpu)
                out.update(gpu_labels)
            out.update(extra)
            labels = canonical_labels(out)
            if len(self._label_cache) > _LABEL_CACHE_MAX:
                self._label_cache.clear()
            self._label_cache[key] = labels
        return labels

    def _agent_labels(self, metric: str) -> Labels:
        """Labels of the agent's own series (its counters, its ingest lag): facts about the agent
        process, which is never simulated, so without ``simulated``. With it, an agent whose first
        batch came before the simulator's first record had every ``ki_agent_*`` series twice."""
        key = (metric, -1, (), ())
        labels = self._label_cache.get(key)
        if labels is None:
            out = {k: v for k, v in self.labels.items() if k != "simulated"}
            out.update({"__name__": metric, "instance": self.instance})
            labels = self._label_cache[key] = canonical_labels(out)
        return labels

    def _count(self, out: SampleBuilder, labels: Labels, delta: float, ts_ms: int) -> None:
        total = self._totals[labels] = self._totals[labels] + delta
        out.add_canonical(labels, ts_ms, total)

    def _count_ns(self, out: SampleBuilder, labels: Labels, delta_ns: float, ts_ms: int) -> None:
        """A counter of seconds kept in whole nanoseconds: the running total is an integer (exact
        in a float below 2**53 ns, 104 days), and each sample is that total / 1e9, a decimal of 9
        places the store keeps as an integer mantissa (collector/valuecodec.py) instead of a
        full-precision float sum of float seconds (~7 bytes a sample whatever the codec)."""
        total = self._totals[labels] = self._totals[labels] + delta_ns
        out.add_canonical(labels, ts_ms, total / 1e9)

    def _series_groups(
        self, tag: str, cols: Sequence[npt.NDArray[np.generic]], make: Callable[[tuple[int, ...]], Labels]
    ) -> tuple[list[Labels], I64]:
        """Records grouped by the series they feed: ``make`` builds the labels of one distinct key row.

        Labels are remembered per (tag, key row) until a name, GPU product or instance label changes, so
        a steady stream costs one dict lookup per distinct key and batch. Two keys can name one
        series (two producers' ids for one kernel name), so the groups are the distinct labels,
        not the distinct keys.
        """
        rows, inv = _group_rows(cols)
        if len(self._key_cache) > _LABEL_CACHE_MAX:
            self._key_cache.clear()
        series: list[Labels] = []
        index: dict[Labels, int] = {}
        remap = np.empty(len(rows), dtype=np.int64)
        cache = self._key_cache
        for j, row in enumerate(rows):
            labels = cache.get((tag, row))
            if labels is None:
                labels = cache[(tag, row)] = make(row)
            k = index.get(labels)
            if k is None:
                k = index[labels] = len(series)
                series.append(labels)
            remap[j] = k
        return series, remap[inv]

    def _by_kind(
        self,
        metric: str,
        label: str,
        kinds: type[MemopKind] | type[SyncKind] | type[CollectiveOp] | type[ErrorKind],
    ) -> Callable[[tuple[int, ...]], Labels]:
        """Labels of a (gpu, kind id) key row: the kind id named by its enum."""
        return lambda g: self._labels(metric, g[0], **{label: _kind(kinds, g[1])})

    def _with_label(self, metric: str, label: str, value: str) -> Callable[[tuple[int, ...]], Labels]:
        """Labels of a (gpu,) key row with one fixed extra label."""
        return lambda g: self._labels(metric, g[0], **{label: value})

    def set_agent_labels(self, labels: Mapping[str, str]) -> None:
        """The labels of the agent's configuration (its batches' LABELS section), under the
        enrolment labels, which win: an operator's enrolment overrides what a node says of itself.
        Series derived from now on carry them (a changed set starts new series, as in Prometheus)."""
        merged = {**labels, **self._enrolled}
        if "simulated" in self.labels:
            merged["simulated"] = self.labels["simulated"]
        if merged != self.labels:
            self.labels = merged
            self._forget_labels()

    def _forget_labels(self) -> None:
        self._label_cache.clear()
        self._key_cache.clear()

    def _accumulate(
        self, out: SampleBuilder, series: list[Labels], idx: I64, ts_ms: I64, deltas: F64
    ) -> None:
        """Counters: one sample per record, the series' running total after it (in record order).

        Each total starts from the one kept across batches and adds its records one at a time in
        record order (so it rounds exactly as a per-record loop would); the loop runs over the
        k-th record of every series at once, so it turns as many times as the busiest series has
        records in this batch.
        """
        n = len(idx)
        acc = np.fromiter((self._totals.get(s, 0.0) for s in series), dtype=np.float64, count=len(series))
        order = np.argsort(idx, kind="stable")
        counts = np.bincount(idx, minlength=len(series))
        first = np.cumsum(counts) - counts
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - first[idx[order]]
        by_rank = np.argsort(rank, kind="stable")
        bounds = np.searchsorted(rank[by_rank], np.arange(int(counts.max()) + 1))
        running = np.empty(n, dtype=np.float64)
        for k in range(len(bounds) - 1):
            at = by_rank[bounds[k] : bounds[k + 1]]  # the k-th record of each series that has one
            g = idx[at]
            acc[g] += deltas[at]
            running[at] = acc[g]
        for s, total in zip(series, acc.tolist(), strict=True):
            self._totals[s] = total
        out.add_columns(series, idx, ts_ms, running)

    # ---- the one entry point ---------------------------------------------------------

    def derive(
        self,
        records: npt.NDArray[np.void],
        *,
        strings: Mapping[tuple[int, int], str] | None = None,
        counters: Mapping[str, float] | None = None,
        now_ns: int | None = None,
        received_ns: int | None = None,
        histograms: WireHistograms | None = None,
        body_version: int = 1,
        epoch: int = 0,
        string_hashes: Mapping[tuple[int, int], int] | None = None,
    ) -> Derived:
        """Rows for one batch: ``records`` in RECORD_DTYPE (in ring order within each record type;
        the order across types does not matter, each type is derived on its own), names the wire batch carried,
        and the agent's counters by name (docs/wire.md, lower-case).
        ``now_ns`` is the batch's t_max; with ``received_ns`` (when the collector got it) the
        batch's ingest lag is recorded.

        Records that cannot be stored are left out and counted in ``Derived.dropped`` (and in
        ``self.stats``); nothing of theirs reaches the deriver's state.
        """
        if records.dtype != RECORD_DTYPE:
            raise TypeError("derive() needs an array of RECORD_DTYPE")
        dropped: dict[str, int] = {}
        if now_ns is None or not 0 <= now_ns <= _MAX_TS_NS:
            if now_ns is not None:
                dropped["batch_time_out_of_range"] = 1
            now_ns = time.time_ns()
        if strings and any(self._names.get(k) != v for k, v in strings.items()):
            self._learn_names(strings, dropped)
            self._key_cache.clear()  # a kernel label may read differently now
        if string_hashes:
            names = self._names
            self._name_hashes.update((k, h) for k, h in string_hashes.items() if k in names)
        types = records["type"]
        stamped = (types != RecordType.STRING) & (types != RecordType.FINGERPRINT)
        late = stamped & (records["ts_ns"] > np.uint64(_MAX_TS_NS))
        if late.any():
            dropped["timestamp_out_of_range"] = int(late.sum())
            records = records[~late]
            types = records["type"]
        samples = SampleBuilder()
        if "simulated" not in self.labels and np.any(records["flags"] & RecordFlag.SIMULATED):
            # Simulated data must never pass for real: from the first simulated record on, every
            # series and the instance itself carry simulated="true" (erring on the safe side if a
            # real producer shares the instance).
            self.labels["simulated"] = "true"
            self._forget_labels()
        # Names and fingerprints first, so this batch's records can use them (rare: a loop is fine).
        for i in np.flatnonzero(types == RecordType.STRING).tolist():
            rec = decode_record(records[i].tobytes())
            assert isinstance(rec, StringRecord)
            if self.strings.add(rec) is not None:
                self._key_cache.clear()
        fp_changed = self._fingerprints(records[types == RecordType.FINGERPRINT], dropped)
        if fp_changed:
            self._key_cache.clear()  # a GPU's gpu_product label may read differently now
        launches = records[types == RecordType.LAUNCH]
        of_span = (launches["flags"] & RecordFlag.LAUNCH_SPAN) != 0
        if of_span.any():
            self._span_launches(launches[of_span])
            launches = launches[~of_span]  # the host side of a span, not a driver launch call
        # Bodies of version 2 and later carry a sample of the kernels as records; every kernel is counted in
        # the HISTOGRAMS sections, so the per-kernel counters come from those instead.
        sampled = body_version >= 2
        spans = self._kernels(records[types == RecordType.KERNEL], samples, dropped, count=not sampled)
        if histograms is not None and body_version >= BODY_VERSION_INCREMENTS:
            histograms, unresolved = self.hist_bases.resolve(histograms, epoch)
            if unresolved:
                dropped["histogram_without_base"] = unresolved
                self.snapshot_wanted = True
        hist = HistogramBatch.empty() if histograms is None else self._histograms(histograms, epoch, samples)
        if self._open_launches and len(spans):
            self._attach_launches(spans)
        self._launches(launches, samples)
        memops = records[types == RecordType.MEMOP]
        collectives = records[types == RecordType.COLLECTIVE]
        syncs = records[types == RecordType.SYNC]
        self._memops(memops, samples)
        self._collectives(collectives, samples)
        self._syncs(syncs, samples)
        calls = self._calls(memops, collectives, syncs)
        unknown = self._gpu_samples(records[types == RecordType.GPU_SAMPLE], samples, dropped)
        events = self._errors(records[types == RecordType.ERROR], samples)
        unknown += int(np.count_nonzero((types == 0) | (types > max(RecordType))))
        if counters:
            ts_ms = self._counters_ms = _next_stamp_ms(now_ns, self._counters_ms)
            for name, value in counters.items():
                metric, scale = agent_metric_name(name)
                samples.add_canonical(
                    self._agent_labels(metric), ts_ms, scale_agent_counter(float(value), scale)
                )
        if received_ns is not None:
            lag_s = (received_ns - now_ns) / 1e9
            self._lag_ms = _next_stamp_ms(received_ns, self._lag_ms)
            samples.add_canonical(self._agent_labels(INGEST_LAG_METRIC), self._lag_ms, lag_s)
        instances = []
        if fp_changed or len(records) or counters:
            instances.append(self._instance(now_ns))
        if dropped:
            self.stats.add(dropped)
        return Derived(samples.build(), spans, events, instances, unknown, dropped, hist, calls)

    def _learn_names(self, strings: Mapping[tuple[int, int], str], dropped: dict[str, int]) -> None:
        """Remember the batch's names, up to NAMES_MAX_BYTES per agent: past that a new name is
        dropped (its records keep the id, ``unknown_<id>``), so no agent can grow this without end."""
        names = self._names
        for key, name in strings.items():
            old = names.get(key)
            if old == name:
                continue
            grow = len(name) - (len(old) if old is not None else 0)
            if self._names_chars + grow > NAMES_MAX_BYTES:
                dropped["names_over_limit"] = dropped.get("names_over_limit", 0) + 1
                continue
            names[key] = name
            self._names_chars += grow
            self._name_hashes.pop(key, None)  # a new text: its hash is the batch's, or made from it

    def names_match(
        self,
        records: npt.NDArray[np.void],
        strings: Mapping[tuple[int, int], str],
        string_hashes: Mapping[tuple[int, int], int],
        histograms: WireHistograms | None,
        digest: int,
    ) -> bool:
        """Whether a version 5 batch's names resolve as its agent meant (docs/wire.md, "Names
        once"): the XOR of wire.name_hash over every name the batch uses (its records' and kernel
        histograms' keys and its STRINGS entries), each text taken from the batch or else from what
        this agent sent before, equals the batch's NAMES_USED digest. A name neither side knows
        counts on neither side; any other difference (a name this collector never got, or holds
        another text of) and the batch is answered 424."""
        keys: set[tuple[int, int]] = set(strings)
        types = records["type"]
        named = records[(types == RecordType.KERNEL) | (types == RecordType.LAUNCH)]
        keys.update(zip(named["producer"].tolist(), named["id"].tolist(), strict=True))
        errors = records[types == RecordType.ERROR]
        if len(errors):
            detail = _payload(errors, _ERROR_DTYPE)["detail_id"]
            keys.update(zip(errors["producer"].tolist(), detail.tolist(), strict=True))
        fps = records[(types == RecordType.FINGERPRINT) & ((records["flags"] & RecordFlag.FP_STRING) != 0)]
        if len(fps):
            # The string id is the value's low 32 bits, as agent/src/encode.c's use_name takes it.
            value = _payload(fps, _FINGERPRINT_DTYPE)["value"] & np.uint64(0xFFFFFFFF)
            keys.update(zip(fps["producer"].tolist(), value.tolist(), strict=True))
        if histograms is not None:
            kernel = histograms.kind == HistKind.KERNEL
            keys.update(
                zip(histograms.producer[kernel].tolist(), histograms.id[kernel].tolist(), strict=True)
            )
        acc = 0
        for key in keys:
            h = string_hashes.get(key)
            if h is None and key not in strings:
                h = self._name_hashes.get(key)
                if h is None:
                    name = self._names.get(key)
                    if name is None:
                        continue
                    h = self._name_hashes[key] = name_hash(key[0], key[1], name.encode())
            elif h is None:
                h = name_hash(key[0], key[1], strings[key].encode())
            acc ^= h
        return acc == digest

    # ---- KERNEL: spans and per-kernel metrics ------------------------------------------

    def _kernels(
        self, k: npt.NDArray[np.void], out: SampleBuilder, dropped: dict[str, int], *, count: bool = True
    ) -> SpanBatch:
        if len(k) == 0:
            return SpanBatch.empty()
        payload = _payload(k, _KERNEL_DTYPE)
        late = payload["end_ns"] > np.uint64(_MAX_TS_NS)
        if late.any():
            dropped["end_out_of_range"] = int(late.sum())
            k, payload = k[~late], payload[~late]
            if len(k) == 0:
                return SpanBatch.empty()
        start = k["ts_ns"].astype(np.int64)
        end = payload["end_ns"].astype(np.int64)
        key = (k["producer"].astype(np.uint64) << np.uint64(32)) | k["id"].astype(np.uint64)
        uniq, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.reshape(-1)
        names_u = [self._kernel_name(int(u) >> 32, int(u) & 0xFFFFFFFF) for u in uniq.tolist()]
        # Two keys can name one kernel (two producers' ids): codes index the distinct names.
        distinct: dict[str, int] = {}
        code_of_key = np.fromiter(
            (distinct.setdefault(n, len(distinct)) for n in names_u), dtype=np.int32, count=len(names_u)
        )
        name_ids = code_of_key[inverse]
        names = list(distinct)
        gpu = k["device"].astype(np.uint16)
        spans = SpanBatch(
            instance=[self.instance] * len(k),
            gpu=gpu,
            stream=payload["stream"].astype(np.uint64),
            kernel=np.array(names, dtype=object)[name_ids].tolist(),
            start_ns=start,
            end_ns=end,
            correlation=payload["correlation"].astype(np.uint64),
            pid=payload["pid"].astype(np.uint32),
            kernel_dict=(name_ids, names),
            owners=self._span_owners(gpu, start),
        )
        if not count:
            return spans
        # Per (gpu, kernel name): launches, busy time, and the mean execution time in this batch,
        # in whole nanoseconds (sums of integers, exact in a float below 2**53): see _count_ns.
        dur = np.maximum(end - start, 0).astype(np.float64)
        group = gpu.astype(np.int64) * (len(names) + 1) + name_ids
        _, ginv = np.unique(group, return_inverse=True)
        ginv = ginv.reshape(-1)
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
            self._count_ns(
                out, self._labels("kernel_execution_time_seconds_total", gpu_i, kernel=kernel), total, ts_ms
            )
            out.add_canonical(
                self._labels("kernel_execution_time_seconds", gpu_i, kernel=kernel), ts_ms, _mean_s(total, n)
            )
        return spans

    # ---- LAUNCH_SPAN: the host side of CUDA-event spans -----------------------------------

    def _span_launches(self, r: npt.NDArray[np.void]) -> None:
        """Hold each launch until its kernel record arrives (the probe writes it just before), with
        the NVTX range enclosing it (block x: a string id of the launch's producer, 0 none)."""
        p = _payload(r, _LAUNCH_DTYPE)
        corr = p["grid"][:, 0].astype(np.uint64) | (p["grid"][:, 1].astype(np.uint64) << np.uint64(32))
        held = self._open_launches
        for gpu, pid, c, ts, host, tid, producer, rng in zip(
            r["device"].tolist(),
            p["pid"].tolist(),
            corr.tolist(),
            r["ts_ns"].tolist(),
            p["grid"][:, 2].tolist(),
            p["tid"].tolist(),
            r["producer"].tolist(),
            p["block"][:, 0].tolist(),
            strict=True,
        ):
            nvtx = (self._name(producer, rng) or "") if rng else ""
            held[(gpu, pid, c)] = (min(ts, _MAX_TS_NS), host, tid, nvtx)
        while len(held) > MAX_OPEN_LAUNCHES:  # kernels that never came: forget the oldest
            del held[next(iter(held))]

    def _attach_launches(self, spans: SpanBatch) -> None:
        """Fill the spans' host side and NVTX range from the held launches (each taken once)."""
        held = self._open_launches
        ranges: dict[str, int] = {"": 0}
        codes: npt.NDArray[np.int32] | None = None
        for i, key in enumerate(
            zip(spans.gpu.tolist(), spans.pid.tolist(), spans.correlation.tolist(), strict=True)
        ):
            hit = held.pop(key, None)
            if hit is not None:
                spans.launch_ns[i], spans.launch_host_ns[i], spans.tid[i], nvtx = hit
                if nvtx:
                    if codes is None:
                        codes = np.zeros(len(spans), np.int32)
                    codes[i] = ranges.setdefault(nvtx, len(ranges))
        if codes is not None:
            spans.nvtx = (codes, list(ranges))

    # ---- HISTOGRAMS (body versions 2 to 5): native histograms, and the kernel counters

    def _histograms(self, h: WireHistograms, epoch: int, out: SampleBuilder) -> HistogramBatch:
        """The section's histograms as samples of kernel_duration_seconds, nccl_op_duration_seconds
        and memcpy_bytes; kernel_launches_total and kernel_execution_time_seconds(_total) from the
        kernel histograms' growth since their last sample (docs/metrics.md).

        Columnar: labels once per distinct key (cached like the records' series), bucket deltas
        to absolute counts with one cumulative sum, so a section of thousands of histograms costs
        a few numpy calls plus one dict step per kernel histogram for its counters. The last
        count and sum of each kernel histogram are kept in the running totals under keys no
        series has, so a batch that is not stored is undone with the counters.
        """
        n = len(h)
        ts_ms = h.ts_ns // _NS_PER_MS

        def labels_of(row: tuple[int, ...]) -> Labels:
            kind, producer, ident, gpu, pid, stream = row
            if kind == HistKind.KERNEL:
                extra = {"kernel": self._kernel_name(producer, ident), "pid": str(pid)}
                if stream:
                    extra["stream"] = str(stream - 1)
                return self._labels(KERNEL_DURATION_METRIC, gpu, **extra)
            if kind == HistKind.NCCL:
                return self._labels(NCCL_DURATION_METRIC, gpu, op=_kind(CollectiveOp, ident))
            return self._labels(MEMCPY_BYTES_METRIC, gpu)

        cols = (h.kind.astype(np.uint64), h.producer, h.id, h.gpu, h.pid, h.stream)
        series, idx = self._series_groups("hist", cols, labels_of)

        def side(n_spans: U64, span_len: U64, deltas: I64) -> tuple[I32, F64, I32]:
            span_offsets = _cut(n_spans)
            row_of_span = np.repeat(np.arange(n), n_spans.astype(np.int64))
            per_row = np.bincount(row_of_span, weights=span_len.astype(np.float64), minlength=n).astype(
                np.int64
            )
            bucket_offsets = _cut(per_row)
            run = np.cumsum(deltas)  # absolute counts: a cumulative sum restarted at each row
            before = np.concatenate(([0], run))[bucket_offsets[:-1]]
            counts = (run - np.repeat(before, per_row)).astype(np.float64)
            return span_offsets, counts, bucket_offsets

        pso, pos, pbo = side(h.n_pos_spans, h.pos_span_length, h.pos_delta)
        nso, neg, nbo = side(h.n_neg_spans, h.neg_span_length, h.neg_delta)
        batch = HistogramBatch(
            series,
            idx.astype(np.int32),
            np.full(n, ts_ms, dtype=np.int64),
            h.schema.astype(np.int32),
            h.zero_threshold,
            h.zero_count.astype(np.float64),
            h.count.astype(np.float64),
            h.sum,
            np.where(h.flags & FLAG_FIRST, 1, 0).astype(np.uint8),
            h.pos_span_offset.astype(np.int32),
            h.pos_span_length.astype(np.uint32),
            pso,
            pos,
            pbo,
            h.neg_span_offset.astype(np.int32),
            h.neg_span_length.astype(np.uint32),
            nso,
            neg,
            nbo,
            np.zeros(0, dtype=np.float64),
            np.zeros(n + 1, dtype=np.int32),
        )
        grown: dict[tuple[int, str], list[float]] = {}
        for i in np.flatnonzero(h.kind == HistKind.KERNEL).tolist():
            producer, ident, gpu = int(h.producer[i]), int(h.id[i]), int(h.gpu[i])
            # The sum in whole nanoseconds (the agent's float seconds, rounded): see _count_ns.
            count, total = float(h.count[i]), float(round(float(h.sum[i]) * 1e9))
            key_c: Labels = (
                ("__hist_count__", f"{epoch}/{producer}/{ident}/{gpu}/{h.pid[i]}/{h.stream[i]}"),
            )
            key_s: Labels = (("__hist_sum__", key_c[0][1]),)
            last_c, last_s = self._totals.get(key_c), self._totals.get(key_s, 0.0)
            if last_c is None or count < last_c:  # first sample of this agent run, or a reset
                last_c, last_s = 0.0, 0.0
            acc = grown.setdefault((gpu, self._kernel_name(producer, ident)), [0.0, 0.0])
            acc[0] += count - last_c
            acc[1] += total - last_s
            self._totals[key_c], self._totals[key_s] = count, total
        for (gpu, kernel), (grew, busy) in grown.items():
            self._count(out, self._labels("kernel_launches_total", gpu, kernel=kernel), grew, ts_ms)
            self._count_ns(
                out, self._labels("kernel_execution_time_seconds_total", gpu, kernel=kernel), busy, ts_ms
            )
            if grew > 0:
                out.add_canonical(
                    self._labels("kernel_execution_time_seconds", gpu, kernel=kernel),
                    ts_ms,
                    _mean_s(busy, grew),
                )
        return batch

    # ---- LAUNCH, MEMOP, COLLECTIVE, SYNC: counters per record ---------------------------

    def _launches(self, r: npt.NDArray[np.void], out: SampleBuilder) -> None:
        if len(r) == 0:
            return
        series, idx = self._series_groups(
            "launch",
            (r["device"], r["producer"], r["id"]),
            lambda g: self._labels("cuda_launch_calls_total", g[0], kernel=self._kernel_name(g[1], g[2])),
        )
        self._accumulate(out, series, idx, _ts_ms(r), np.ones(len(r)))

    def _memops(self, r: npt.NDArray[np.void], out: SampleBuilder) -> None:
        if len(r) == 0:
            return
        ts_ms = _ts_ms(r)
        device, kind = r["device"], r["id"]
        series, idx = self._series_groups(
            "memop",
            (device, kind),
            lambda g: self._labels("gpu_memory_operations_total", g[0], kind=_kind(MemopKind, g[1])),
        )
        self._accumulate(out, series, idx, ts_ms, np.ones(len(r)))
        failed = (r["flags"] & RecordFlag.FAILED) != 0
        if failed.any():
            series, idx = self._series_groups(
                "memop_failed",
                (device[failed], kind[failed]),
                lambda g: self._labels(
                    "gpu_memory_operation_failures_total", g[0], kind=_kind(MemopKind, g[1])
                ),
            )
            self._accumulate(out, series, idx, ts_ms[failed], np.ones(int(failed.sum())))
        alloc = ~failed & np.isin(kind, (MemopKind.ALLOC, MemopKind.ALLOC_ASYNC))
        if alloc.any():
            series, idx = self._series_groups(
                "alloc", (device[alloc],), lambda g: self._labels("gpu_memory_allocated_bytes_total", g[0])
            )
            nbytes = _payload(r[alloc], _MEMOP_DTYPE)["bytes"].astype(np.float64)
            self._accumulate(out, series, idx, ts_ms[alloc], nbytes)

    def _collectives(self, r: npt.NDArray[np.void], out: SampleBuilder) -> None:
        if len(r) == 0:
            return
        ts_ms = _ts_ms(r)
        p = _payload(r, _COLLECTIVE_DTYPE)
        seconds = p["duration_ns"].astype(np.float64) / 1e9
        device, op = r["device"], r["id"]
        keys = (device, op)
        for metric, deltas in (
            ("nccl_ops_total", np.ones(len(r))),
            ("nccl_bytes_total", p["bytes"].astype(np.float64)),
            ("nccl_op_time_seconds_total", seconds),
        ):
            series, idx = self._series_groups(
                f"nccl:{metric}",
                keys,
                self._by_kind(metric, "op", CollectiveOp),
            )
            self._accumulate(out, series, idx, ts_ms, deltas)
        series, idx = self._series_groups(
            "nccl_latency",
            keys,
            lambda g: self._labels("nccl_op_latency_seconds", g[0], op=_kind(CollectiveOp, g[1])),
        )
        out.add_columns(series, idx, ts_ms, seconds)
        failed = (r["flags"] & RecordFlag.FAILED) != 0
        if failed.any():
            series, idx = self._series_groups(
                "nccl_failed",
                (device[failed], op[failed]),
                lambda g: self._labels("nccl_op_failures_total", g[0], op=_kind(CollectiveOp, g[1])),
            )
            self._accumulate(out, series, idx, ts_ms[failed], np.ones(int(failed.sum())))

    def _syncs(self, r: npt.NDArray[np.void], out: SampleBuilder) -> None:
        if len(r) == 0:
            return
        ts_ms = _ts_ms(r)
        seconds = _payload(r, _SYNC_DTYPE)["duration_ns"].astype(np.float64) / 1e9
        for metric, deltas in (
            ("cuda_syncs_total", np.ones(len(r))),
            ("cuda_sync_time_seconds_total", seconds),
        ):
            series, idx = self._series_groups(
                f"sync:{metric}",
                (r["device"], r["id"]),
                self._by_kind(metric, "kind", SyncKind),
            )
            self._accumulate(out, series, idx, ts_ms, deltas)

    # ---- the same records, one row per call (gpu_calls) ----------------------------------

    def _calls(
        self, memops: npt.NDArray[np.void], collectives: npt.NDArray[np.void], syncs: npt.NDArray[np.void]
    ) -> CallBatch:
        """NCCL collectives, memory operations and the syncs worth keeping, as ``gpu_calls`` rows.

        Every collective and memory operation is kept (they are rare next to kernels); syncs are
        kept when they waited at least ``sync_keep_ns``, and 1 in ``sync_sample_every`` of the
        rest (counted across batches, so the sample is uniform whatever the batch sizes).
        """
        parts: list[CallBatch] = []
        if len(collectives):
            p = _payload(collectives, _COLLECTIVE_DTYPE)
            parts.append(
                self._call_rows(
                    collectives,
                    "nccl",
                    CollectiveOp,
                    p["duration_ns"],
                    p["bytes"],
                    p["comm"],
                    rank=p["rank"],
                    nranks=p["nranks"],
                )
            )
        if len(memops):
            p = _payload(memops, _MEMOP_DTYPE)
            parts.append(
                self._call_rows(
                    memops,
                    "memory",
                    MemopKind,
                    np.zeros(len(memops), np.uint64),
                    p["bytes"],
                    p["address"],
                    pid=p["pid"],
                    tid=p["tid"],
                    status=p["status"],
                )
            )
        if len(syncs):
            p = _payload(syncs, _SYNC_DTYPE)
            dur = p["duration_ns"]
            short = np.flatnonzero(dur < np.uint64(self.sync_keep_ns))
            rank = self._short_syncs + np.arange(len(short))
            self._short_syncs += len(short)
            keep = np.ones(len(syncs), dtype=bool)
            keep[short[rank % self.sync_sample_every != 0]] = False
            if keep.any():
                syncs, p = syncs[keep], p[keep]
                parts.append(
                    self._call_rows(
                        syncs,
                        "sync",
                        SyncKind,
                        p["duration_ns"],
                        np.zeros(len(syncs), np.uint64),
                        p["handle"],
                        pid=p["pid"],
                        tid=p["tid"],
                    )
                )
        return CallBatch.concat(parts)

    def _call_rows(
        self,
        r: npt.NDArray[np.void],
        track: str,
        kinds: type[MemopKind] | type[SyncKind] | type[CollectiveOp],
        duration: npt.NDArray[np.generic],
        nbytes: npt.NDArray[np.generic],
        handle: npt.NDArray[np.generic],
        *,
        pid: npt.NDArray[np.generic] | None = None,
        tid: npt.NDArray[np.generic] | None = None,
        rank: npt.NDArray[np.generic] | None = None,
        nranks: npt.NDArray[np.generic] | None = None,
        status: npt.NDArray[np.generic] | None = None,
    ) -> CallBatch:
        n = len(r)
        ids = r["id"]
        uniq, inv = np.unique(ids, return_inverse=True)
        names = np.array([_kind(kinds, int(u)) for u in uniq.tolist()], dtype=object)[inv.reshape(-1)]
        zeros = np.zeros(n, np.uint32)
        return CallBatch(
            instance=[self.instance] * n,
            gpu=r["device"].astype(np.uint16),
            track=[track] * n,
            op=names.tolist(),
            start_ns=r["ts_ns"].astype(np.int64),
            duration_ns=np.asarray(duration, np.uint64),
            bytes=np.asarray(nbytes, np.uint64),
            handle=np.asarray(handle, np.uint64),
            pid=zeros if pid is None else np.asarray(pid, np.uint32),
            tid=zeros if tid is None else np.asarray(tid, np.uint32),
            rank=zeros if rank is None else np.asarray(rank, np.uint32),
            nranks=zeros if nranks is None else np.asarray(nranks, np.uint32),
            status=np.zeros(n, np.int32) if status is None else np.asarray(status, np.int32),
            failed=((r["flags"] & RecordFlag.FAILED) != 0).astype(np.uint8),
        )

    # ---- GPU_SAMPLE: the metric-id table -----------------------------------------------

    def _gpu_samples(self, r: npt.NDArray[np.void], out: SampleBuilder, dropped: dict[str, int]) -> int:
        """Gauges and counters of the NVML sampler and the eBPF tracer; returns the unknown-id count."""
        if len(r) == 0:
            return 0
        metric = r["id"]
        known = np.isin(metric, _KNOWN_METRIC_IDS)
        unknown = int(len(r) - known.sum())
        p = _payload(r, _SAMPLE_DTYPE)
        value, aux = p["value"], p["aux"]
        bucket = metric == MetricId.LAUNCH_HOST_LATENCY_BUCKET
        bad_bucket = known & bucket & ((aux >> np.uint64(32)) > np.uint64(_MAX_BUCKET))
        with np.errstate(invalid="ignore"):
            throttle = metric == MetricId.THROTTLE_REASONS
            bad_throttle = throttle & ~(np.isfinite(value) & (value >= 0) & (value < 2.0**64))
            mtotal = metric == MetricId.MEMORY_TOTAL
            bad_total = mtotal & ~(np.isfinite(value) & (value <= _MAX_GPU_MEMORY))
        for reason, bad in (
            ("bucket_out_of_range", bad_bucket),
            ("value_out_of_range", bad_throttle | bad_total),
        ):
            if bad.any():
                dropped[reason] = dropped.get(reason, 0) + int(bad.sum())
        keep = known & ~bad_bucket & ~bad_throttle & ~bad_total
        if not keep.all():
            r, metric, value, aux = r[keep], metric[keep], value[keep], aux[keep]
            if len(r) == 0:
                return unknown
        ts_ms = _ts_ms(r)
        device = r["device"]
        series, idx = self._series_groups("sample", (metric, device, r["producer"], aux), self._sample_labels)
        out.add_columns(series, idx, ts_ms, value)
        calls = metric == MetricId.LAUNCH_CALLS  # the histogram's +Inf bucket is the call count
        if calls.any():
            series, idx = self._series_groups(
                "sample_inf",
                (device[calls], r["producer"][calls], aux[calls]),
                lambda g: self._labels(
                    "cuda_launch_host_seconds_bucket",
                    g[0],
                    le="+Inf",
                    kernel=self._kernel_name(g[1], g[2] & 0xFFFFFFFF),
                ),
            )
            out.add_columns(series, idx, ts_ms[calls], value[calls])
        self._free_ratio(metric, device, ts_ms, value, out)
        throttle = metric == MetricId.THROTTLE_REASONS
        if throttle.any():
            bits = value[throttle].astype(np.uint64)
            gpus, t_ms = device[throttle], ts_ms[throttle]
            for bit, reason in THROTTLE_REASONS.items():
                series, idx = self._series_groups(
                    f"throttle:{reason}",
                    (gpus,),
                    self._with_label("gpu_throttled", "reason", reason),
                )
                flag = ((bits & np.uint64(bit)) != 0).astype(np.float64)
                out.add_columns(series, idx, t_ms, flag)
        return unknown

    def _sample_labels(self, g: tuple[int, ...]) -> Labels:
        metric, gpu, producer, aux = g
        s = METRIC_SPECS[metric]
        extra: dict[str, str] = {}
        if s.aux_label and s.aux_kind == "value":
            extra[s.aux_label] = str(aux)
        elif s.aux_label:
            extra[s.aux_label] = self._kernel_name(producer, aux & 0xFFFFFFFF)
            if s.aux_kind == "string_log2_bucket":
                extra["le"] = repr(2.0 ** ((aux >> 32) + 1) / 1e9)
        if s.dcgm:
            extra.update(dcgm_labels(gpu, self._fingerprint.get(gpu, {})))
        return self._labels(s.name, gpu, **extra)

    def _free_ratio(
        self,
        metric: npt.NDArray[np.uint32],
        device: npt.NDArray[np.uint16],
        ts_ms: I64,
        value: F64,
        out: SampleBuilder,
    ) -> None:
        """``gpu_memory_free_ratio``: each free sample over the GPU's latest total before it (record order)."""
        free = metric == MetricId.MEMORY_FREE
        total = (metric == MetricId.MEMORY_TOTAL) & (value > 0)
        if not (free.any() or total.any()):
            return
        ratios: list[tuple[int, npt.NDArray[np.intp], F64]] = []
        for gpu in np.unique(device[free | total]).tolist():
            mine = np.flatnonzero((device == gpu) & (free | total))
            is_total = total[mine]
            last = np.maximum.accumulate(np.where(is_total, np.arange(len(mine)), -1))
            before = self._memory_total.get(gpu, 0.0)
            totals = np.where(last >= 0, value[mine][np.maximum(last, 0)], before)
            if is_total.any():
                self._memory_total[gpu] = float(value[mine][is_total][-1])
            f = ~is_total & (totals != 0)
            if f.any():
                ratios.append((gpu, mine[f], value[mine][f] / totals[f]))
        for gpu, at, ratio in ratios:
            out.add_series_canonical(self._labels("gpu_memory_free_ratio", gpu), ts_ms[at], ratio)

    # ---- ERROR: events and a counter ----------------------------------------------------

    def _errors(self, r: npt.NDArray[np.void], out: SampleBuilder) -> list[Event]:
        if len(r) == 0:
            return []
        p = _payload(r, _ERROR_DTYPE)
        events = []
        for gpu, ts_ns, kind, producer, code, aux, pid, detail in zip(
            r["device"].tolist(),
            r["ts_ns"].tolist(),
            r["id"].tolist(),
            r["producer"].tolist(),
            p["code"].tolist(),
            p["aux"].tolist(),
            p["pid"].tolist(),
            p["detail_id"].tolist(),
            strict=True,
        ):
            message = (self._name(producer, detail) if detail else None) or ""
            events.append(
                Event(
                    self.instance,
                    gpu,
                    ts_ns,
                    _kind(ErrorKind, kind),
                    code=code,
                    aux=aux,
                    pid=pid,
                    message=message,
                )
            )
        series, idx = self._series_groups(
            "error",
            (r["device"], r["id"]),
            lambda g: self._labels("kernel_errors_total", g[0], kind=_kind(ErrorKind, g[1])),
        )
        self._accumulate(out, series, idx, _ts_ms(r), np.ones(len(r)))
        return events

    # ---- FINGERPRINT: what the instance is ---------------------------------------------

    def _fingerprints(self, r: npt.NDArray[np.void], dropped: dict[str, int]) -> bool:
        changed = False
        values = _payload(r, _FINGERPRINT_DTYPE)["value"].tolist()
        for producer, flags, gpu, fid, value, ts in zip(
            r["producer"].tolist(),
            r["flags"].tolist(),
            r["device"].tolist(),
            r["id"].tolist(),
            values,
            r["ts_ns"].tolist(),
            strict=True,
        ):
            is_string = bool(flags & RecordFlag.FP_STRING)
            if fid == FingerprintField.MEMORY_TOTAL and not is_string and value > _MAX_GPU_MEMORY:
                dropped["fingerprint_out_of_range"] = dropped.get("fingerprint_out_of_range", 0) + 1
                continue
            try:
                key = FingerprintField(fid).name.lower()
            except ValueError:
                key = f"field_{fid}"
            text = (self._name(producer, value) or "") if is_string else str(value)
            if gpu not in self._fingerprint and len(self._fingerprint) >= MAX_FINGERPRINT_GPUS:
                dropped["fingerprint_over_limit"] = dropped.get("fingerprint_over_limit", 0) + 1
                continue
            fields = self._fingerprint[gpu]
            if fields.get(key) == text:
                continue
            if key not in fields and len(fields) >= MAX_FINGERPRINT_FIELDS:
                dropped["fingerprint_over_limit"] = dropped.get("fingerprint_over_limit", 0) + 1
                continue
            fields[key] = text
            changed = True
            if fid == FingerprintField.MEMORY_TOTAL and not is_string and value > 0:
                self._memory_total[gpu] = float(value)
            if fid in _POD_FIELDS:
                self._owner_changed(gpu, ts, fields)
        return changed

    def _owner_changed(self, gpu: int, ts: int, fields: Mapping[str, str]) -> None:
        """The GPU's holder from ``ts`` on is what ``fields`` say now (the probe writes a change as
        three FINGERPRINT records of one time: the last of them leaves the whole holder)."""
        holder = (fields.get("pod", ""), fields.get("namespace", ""), fields.get("container", ""))
        times, holders = self._owners.setdefault(gpu, ([], []))
        i = bisect.bisect_right(times, ts)
        if i and times[i - 1] == ts:
            holders[i - 1] = holder
            return
        times.insert(i, ts)
        holders.insert(i, holder)
        if len(times) > MAX_OWNER_CHANGES:  # the oldest change goes: spans before it read no holder
            del times[0], holders[0]

    def _span_owners(
        self, gpu: npt.NDArray[np.uint16], start: I64
    ) -> tuple[npt.NDArray[np.int32], list[tuple[str, str, str]]] | None:
        """Each span's holder at its start (per GPU, one binary search over the GPU's changes);
        None while no GPU of the instance ever had one."""
        if not self._owners:
            return None
        codes = np.zeros(len(gpu), np.int32)
        index = {_NO_OWNER: 0}
        for g in np.unique(gpu).tolist():
            timeline = self._owners.get(g)
            if timeline is None:
                continue
            times, holders = timeline
            rows = np.flatnonzero(gpu == g)
            at = np.searchsorted(np.asarray(times, np.int64), start[rows], side="right") - 1
            code_of = np.array([index.setdefault(h, len(index)) for h in holders], np.int32)
            codes[rows] = np.where(at >= 0, code_of[np.maximum(at, 0)], 0)
        return codes, list(index)

    def _instance(self, now_ns: int) -> InstanceInfo:
        attributes = {
            f"gpu{g}.{k}": v for g, fields in sorted(self._fingerprint.items()) for k, v in fields.items()
        }
        stable = sorted((k, v) for k, v in attributes.items() if not k.endswith(_NOT_HARDWARE))
        hw = hashlib.sha256(repr(stable).encode()).hexdigest()[:32] if stable else ""
        models = [f.get("name", "") for f in self._fingerprint.values() if f.get("name")]
        memory = sum(_memory_of(f) for f in self._fingerprint.values())
        return InstanceInfo(
            id=self.instance,
            last_seen_ms=now_ns // _NS_PER_MS,
            hardware_fingerprint=hw,
            gpu_count=len(self._fingerprint),
            gpu_model=max(set(models), key=models.count) if models else "",
            memory_total_bytes=min(memory, (1 << 64) - 1),
            labels=dict(self.labels),
            attributes=attributes,
        )


def _memory_of(fields: Mapping[str, str]) -> int:
    """One GPU's memory total from its fingerprint text (a string-flagged total is not a number: 0)."""
    try:
        value = float(fields.get("memory_total", "0") or 0)
    except ValueError:
        return 0
    return int(value) if math.isfinite(value) and 0 <= value <= _MAX_GPU_MEMORY else 0


def _ts_ms(r: npt.NDArray[np.void]) -> I64:
    return (r["ts_ns"] // np.uint64(_NS_PER_MS)).astype(np.int64)
