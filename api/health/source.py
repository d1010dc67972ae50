"""The snapshot's facts from the collector's store: the latest GPU gauges through kql, the rest from collector/clickhouse/health.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kernel_insight.api.health.rule import ERROR_WINDOW_MS, InstanceFacts
from kernel_insight.api.health.serving import SERVING_METRICS, combine
from kernel_insight.collector.clickhouse.health import (
    event_counts,
    instance_rows,
    instance_series_labels,
    quantiles_by_instance,
    recent_events,
)
from kernel_insight.collector.derive import INGEST_LAG_METRIC
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.limits import EngineLimits
from kernel_insight.kql.storage import Labels, Matcher

__all__ = ["StoreSource"]


#: The newest samples are read as of this much after the rebuild's clock. A batch received while
#: a rebuild runs is stamped (its heartbeat: the receive time, at least 1 ms after the agent's
#: previous one) after the clock the rebuild read at its start, yet stored before its read:
#: without the slack its NVML gauges (stamped earlier, by the agent) would show and its heartbeat
#: would not. It also covers agents whose clocks run a little ahead of the collector's.
CLOCK_SLACK_MS = 1_000


class _Rows(NamedTuple):
    """The newest samples read, one row each: metric code, instance code, value, sample time."""

    metric: npt.NDArray[np.intp]
    instance: npt.NDArray[np.intp]
    values: npt.NDArray[np.float64]
    times: npt.NDArray[np.int64]

    def where(self, mask: npt.NDArray[np.bool_]) -> _Rows:
        return _Rows(self.metric[mask], self.instance[mask], self.values[mask], self.times[mask])


class StoreSource:
    """Facts from the collector's store: the instances table, the latest GPU gauges, NCCL latencies, events.

    The gauges and the heartbeat come from kql's instant selector at ``now`` over
    ``store.storage()`` (``Engine.latest``: each series' newest sample within the 5-minute
    lookback, staleness markers meaning absent), so its rules live in kql alone; NaN readings
    are left out, then ``sum``/``max``/``mean`` by instance. The storage reads all six metrics
    in one pass of the samples and remembers which series match (docs/kql.md, "Instant
    selectors"); the grouping by instance is numpy over codes kept per label set, far cheaper
    than the grid path (``make bench-api``: the snapshot rebuild's figure, docs/benchmarks.md); it
    runs on the background thread every 5 s. The NCCL latency quantiles
    (over every sample of the window) and the labels stay SQL.
    """

    #: metric -> (field of InstanceFacts, how the instance's GPUs combine: kql's sum, max, avg by instance)
    GAUGES: Mapping[str, tuple[str, str]] = {
        "gpu_memory_free_bytes": ("gpu_memory_free_bytes", "total"),
        "gpu_memory_total_bytes": ("gpu_memory_total_bytes", "total"),
        "gpu_temperature_celsius": ("temperature_celsius", "top"),
        "gpu_power_watts": ("power_watts", "total"),
        "gpu_sm_utilization_ratio": ("sm_utilization_ratio", "mean"),
    }
    LATENCY_METRIC = "nccl_op_latency_seconds"
    #: The series whose labels an instance takes as its own (relabelling, docs/api.md).
    LABELS_METRIC = "gpu_memory_free_bytes"
    #: Labels of a series that describe the series (one GPU), not the instance.
    SERIES_ONLY_LABELS = frozenset({"instance", "gpu", "gpu_product", "le"})
    #: One sample per stored agent batch, at its receive time (collector/derive.py): the heartbeat.
    HEARTBEAT_METRIC = INGEST_LAG_METRIC

    def __init__(self, store: Any, name_of: Callable[[str], str | None] | None = None) -> None:
        self.store = store
        #: An instance's enrolment name (the key store's ``name_of``); None without a key store.
        self.name_of: Callable[[str], str | None] = name_of or (lambda instance: None)
        #: GAUGES, the heartbeat, then the serving engines' metrics (serving.py), in this order: codes.
        self._metrics = [*self.GAUGES, self.HEARTBEAT_METRIC, *SERVING_METRICS]
        #: id(label set) -> (that label set, metric code, instance code); see _keys.
        self._known: dict[int, tuple[Labels, int, int]] = {}
        self._instances: list[str] = []
        self._instance_codes: dict[str, int] = {}
        #: The last label list read and its codes (_keys), while the storage hands back that list.
        self._seen: tuple[list[Labels], npt.NDArray[np.intp], npt.NDArray[np.intp]] | None = None

    def collect(self, now_ms: int) -> list[InstanceFacts]:
        rows = instance_rows(self.store)
        facts: dict[str, InstanceFacts] = {}
        for r in rows:
            facts[r["id"]] = InstanceFacts(
                id=r["id"],
                last_seen_ms=int(r["last_seen_ms"]),
                labels=dict(r["labels"] or []),
                attributes=dict(r["attributes"] or []),
                hardware_fingerprint=r["hardware_fingerprint"],
                gpu_model=r["gpu_model"],
                gpu_count=int(r["gpu_count"]),
                memory_total_bytes=int(r["memory_total_bytes"]),
            )
        start = now_ms - ERROR_WINDOW_MS
        self._latest(facts, now_ms + CLOCK_SLACK_MS)
        self._series_labels(facts, start, now_ms)
        latencies = quantiles_by_instance(self.store, self.LATENCY_METRIC, start, now_ms)
        for lat in latencies:
            if lat["instance"] in facts:
                p50, p90, p99 = (float(x) for x in lat["q"])
                facts[lat["instance"]].nccl_quantiles = (p50, p90, p99, int(lat["n"]))
        errors = event_counts(self.store, start)
        for e in errors:
            if e["instance"] in facts:
                counts = dict(facts[e["instance"]].errors_by_kind)
                counts[e["kind"]] = int(e["n"])
                facts[e["instance"]].errors_by_kind = counts
        for f in facts.values():
            f.name = self.name_of(f.id)
        return list(facts.values())

    def _latest(self, facts: dict[str, InstanceFacts], now_ms: int) -> None:
        """The gauges and the heartbeat from each series' newest sample, as kql's instant selector
        at ``now_ms`` finds it (``Engine.latest``: one read for all these metrics, pushed down),
        combined by instance in numpy: ~40,000 series a rebuild at 1,000 instances."""
        engine = Engine(self.store.storage(), EngineLimits(lookback_ms=ERROR_WINDOW_MS))
        found = engine.latest(
            [
                Matcher("__name__", "=~", "|".join(map(re.escape, self._metrics))),
                Matcher("instance", "!=", ""),
            ],
            now_ms,
        )
        assert found.sample_ts is not None
        rows = np.flatnonzero(found.present[:, 0])
        if len(rows) == 0:
            return
        seen = self._seen
        if seen is None or seen[0] is not found.labels:  # the storage's list: the same while its series are
            seen = self._seen = (found.labels, *self._keys(found.labels))
        metric, instance = seen[1][rows], seen[2][rows]
        values, times = found.values[rows, 0], found.sample_ts[rows, 0]
        names = self._instances
        beat = metric == len(self.GAUGES)
        serving = metric > len(self.GAUGES)
        if beat.any():  # each instance's newest heartbeat: the last of its rows in time order
            order = np.argsort(times[beat], kind="stable")
            inst, at, lag = instance[beat][order], times[beat][order], values[beat][order]
            last = len(inst) - 1 - np.unique(inst[::-1], return_index=True)[1]
            for i, t, v in zip(inst[last].tolist(), at[last].tolist(), lag[last].tolist(), strict=True):
                if names[i] in facts:
                    facts[names[i]].last_heard_ms = int(t)
                    facts[names[i]].ingest_lag_s = float(v)
        gauge = ~beat & ~serving & ~np.isnan(values)  # a NaN reading says nothing
        read = _Rows(metric, instance, values, times)
        if gauge.any():
            self._gauges(facts, gauge, read)
        if serving.any():  # after the gauges, which may add instances seen only in samples
            self._serving(facts, read.where(serving))

    def _gauges(self, facts: dict[str, InstanceFacts], gauge: npt.NDArray[np.bool_], read: _Rows) -> None:
        """The GPU gauges combined by instance (GAUGES' sum, max or mean); instances seen only in
        samples join ``facts``."""
        metric, instance, values, times = read
        names = self._instances
        count = len(names)
        newest = np.full(count, np.iinfo(np.int64).min)
        np.maximum.at(newest, instance[gauge], times[gauge])
        combined: list[tuple[str, npt.NDArray[np.bool_], npt.NDArray[np.float64]]] = []
        for code, (field, how) in enumerate(self.GAUGES.values()):
            mine = gauge & (metric == code)
            inst, vals = instance[mine], values[mine]
            has = np.bincount(inst, minlength=count) > 0
            if how == "top":
                out = np.full(count, -np.inf)
                np.maximum.at(out, inst, vals)
            else:
                # Row by row, as Python's sum adds them (bincount does not pair them up).
                out = np.bincount(inst, weights=vals, minlength=count)
                if how == "mean":
                    out = out / np.maximum(np.bincount(inst, minlength=count), 1)
            combined.append((field, has, out))
        for i in np.unique(instance[gauge]).tolist():
            f = facts.get(names[i])
            if f is None:
                f = facts[names[i]] = InstanceFacts(id=names[i], last_seen_ms=0)
            f.last_seen_ms = max(f.last_seen_ms, int(newest[i]))
            for field, has, out in combined:
                if has[i]:
                    setattr(f, field, float(out[i]))

    def _serving(self, facts: dict[str, InstanceFacts], read: _Rows) -> None:
        """The serving engines' load by instance (serving.combine), for instances the snapshot has:
        serving metrics alone do not make an instance (its capacity would be unknown)."""
        rows: dict[int, list[tuple[str, float, int]]] = {}
        names = self._metrics
        for m, i, v, t in zip(*(a.tolist() for a in read), strict=True):
            rows.setdefault(i, []).append((names[m], v, t))
        for i, mine in rows.items():
            f = facts.get(self._instances[i])
            if f is not None:
                f.serving = combine(mine)

    def _keys(self, labels: list[Labels]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """Per series: the metric (its position in GAUGES, then the heartbeat) and the instance
        (its position in ``_instances``). Remembered per label set: the storage hands the same
        label tuples back every rebuild, and reading each one's labels again was a large part of a
        rebuild (``make bench-api``)."""
        if len(self._known) > 4 * len(labels) + 100_000:  # series come and go: start afresh
            self._known.clear()
            self._instances.clear()
            self._instance_codes.clear()
        known, codes = self._known, self._instance_codes
        metrics, instances = [], []
        for lab in labels:
            hit = known.get(id(lab))
            if hit is None or hit[0] is not lab:
                values = dict(lab)
                name = values.get("instance", "")
                code = codes.get(name)
                if code is None:
                    code = codes[name] = len(self._instances)
                    self._instances.append(name)
                hit = known[id(lab)] = (lab, self._metrics.index(values["__name__"]), code)
            metrics.append(hit[1])
            instances.append(hit[2])
        return np.array(metrics, dtype=np.intp), np.array(instances, dtype=np.intp)

    def _series_labels(self, facts: dict[str, InstanceFacts], start_ms: int, now_ms: int) -> None:
        """Each instance's labels from its newest-day ``gpu_memory_free_bytes`` series, under its own.

        This is how data that no enrolled agent sent (remote_write, ``ki import``) gets labels:
        the series' ``instance`` label names the instance, and the series' other labels but
        :attr:`SERIES_ONLY_LABELS` (``model``, ``rack``, ``host``, ...) become the instance's.
        Enrolment labels win where both say something. One series per instance (the lowest
        fingerprint) so the answer does not change between rebuilds.
        """
        rows = instance_series_labels(self.store, self.LABELS_METRIC, start_ms, now_ms)
        for r in rows:
            own = {k: v for k, v in dict(r["l"] or []).items() if k not in self.SERIES_ONLY_LABELS and v}
            if not own:
                continue
            f = facts.get(r["instance"])
            if f is not None:  # an instance with neither a row nor recent samples is not in the snapshot
                f.labels = dict(sorted({**own, **f.labels}.items()))

    def recent_errors(self, instance_id: str, limit: int) -> list[dict[str, Any]]:
        rows = recent_events(self.store, instance_id, limit)
        return [
            {
                "ts_ms": int(r["ts_ms"]),
                "gpu": int(r["gpu"]),
                "kind": r["kind"],
                "code": int(r["code"]),
                "message": r["message"],
            }
            for r in rows
        ]
