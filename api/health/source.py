"""The snapshot's facts from the collector's store: the latest GPU gauges through kql, the rest in SQL."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kernel_insight.api.health.rule import ERROR_WINDOW_MS, InstanceFacts
from kernel_insight.collector.derive import INGEST_LAG_METRIC
from kernel_insight.collector.sql import Params, qualified
from kernel_insight.kql.engine import Engine, EngineLimits
from kernel_insight.kql.storage import Matcher

__all__ = ["StoreSource"]


#: How GAUGES combine an instance's GPUs (kql's sum, max and avg by instance).
_COMBINE: Mapping[str, Callable[[list[float]], float]] = {"total": sum, "top": max, "mean": statistics.fmean}


def _ms(ms: int) -> str:
    return f"fromUnixTimestamp64Milli(toInt64({int(ms)}), 'UTC')"


class StoreSource:
    """Facts from the collector's store: the instances table, the latest GPU gauges, NCCL latencies, events.

    The gauges and the heartbeat come from kql's instant selector at ``now`` over
    ``store.storage()`` (``Engine.latest``: each series' newest sample within the 5-minute
    lookback, staleness markers meaning absent), so its rules live in kql alone; NaN readings
    are left out, then ``sum``/``max``/``mean`` by instance. kql's grid push-down reads all
    six metrics in one ClickHouse pass: 1,000 instances x 8 GPUs x 5 gauges took ~250 ms a
    rebuild on dev-2c (the SQL it replaced: ~60 ms), on the background thread every 5 s. The
    NCCL latency quantiles (over every sample of the window) and the labels stay SQL.
    """

    #: metric -> (field of InstanceFacts, aggregation over the instance's GPUs)
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

    def __init__(self, store: Any) -> None:
        self.store = store

    def _table(self, name: str) -> str:
        return qualified(self.store.database, name)

    def _series(self, p: Params, metrics: Sequence[str], start_ms: int, now_ms: int) -> str:
        return (
            f"SELECT DISTINCT fingerprint, metric, labels['instance'] AS instance FROM {self._table('series')}"
            f" WHERE metric IN {p(list(metrics), 'Array(String)')}"
            f" AND date >= toDate({_ms(start_ms)}) AND date <= toDate({_ms(now_ms)})"
        )

    @staticmethod
    def _metric_in(p: Params, metrics: Sequence[str]) -> str:
        """The samples key leads with metric: this filter skips every other metric's granules."""
        return f"s.metric IN {p(list(metrics), 'Array(String)')}"

    def collect(self, now_ms: int) -> list[InstanceFacts]:
        rows = self.store.query(
            "SELECT id, hardware_fingerprint, gpu_count, gpu_model, memory_total_bytes, labels, attributes,"
            f" toUnixTimestamp64Milli(last_seen) AS last_seen_ms FROM {self._table('instances')} FINAL"
        ).to_pylist()
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
        window = f"s.ts >= {_ms(start)} AND s.ts <= {_ms(now_ms)}"
        samples = self._table("samples")
        self._latest(facts, now_ms)
        self._series_labels(facts, start, now_ms)
        p = Params()
        latencies = self.store.query(
            "SELECT f.instance AS instance, quantilesExactInclusive(0.5, 0.9, 0.99)(s.value) AS q, count() AS n"
            f" FROM {samples} AS s INNER JOIN ({self._series(p, [self.LATENCY_METRIC], start, now_ms)}) AS f"
            f" ON s.fingerprint = f.fingerprint WHERE {window} AND {self._metric_in(p, [self.LATENCY_METRIC])}"
            " AND isFinite(s.value) GROUP BY instance",
            p,
        ).to_pylist()
        for lat in latencies:
            if lat["instance"] in facts:
                p50, p90, p99 = (float(x) for x in lat["q"])
                facts[lat["instance"]].nccl_quantiles = (p50, p90, p99, int(lat["n"]))
        errors = self.store.query(
            f"SELECT instance, kind, count() AS n FROM {self._table('events')} WHERE ts >= {_ms(start)}"
            " GROUP BY instance, kind"
        ).to_pylist()
        for e in errors:
            if e["instance"] in facts:
                counts = dict(facts[e["instance"]].errors_by_kind)
                counts[e["kind"]] = int(e["n"])
                facts[e["instance"]].errors_by_kind = counts
        return list(facts.values())

    def _latest(self, facts: dict[str, InstanceFacts], now_ms: int) -> None:
        """The gauges and the heartbeat from each series' newest sample, as kql's instant selector
        at ``now_ms`` finds it (``Engine.latest``: one read for all these metrics, pushed down)."""
        engine = Engine(self.store.storage(), EngineLimits(lookback_ms=ERROR_WINDOW_MS))
        names = [*self.GAUGES, self.HEARTBEAT_METRIC]
        found = engine.latest(
            [Matcher("__name__", "=~", "|".join(map(re.escape, names))), Matcher("instance", "!=", "")],
            now_ms,
        )
        assert found.sample_ts is not None
        gauges: dict[tuple[str, str], list[float]] = {}
        seen: dict[str, int] = {}
        heard: dict[str, tuple[int, float]] = {}  # instance -> (time, lag) of its newest heartbeat
        rows = np.flatnonzero(found.present[:, 0])
        values, times = found.values[rows, 0].tolist(), found.sample_ts[rows, 0].tolist()
        for i, value, at in zip(rows.tolist(), values, times, strict=True):
            metric = instance = ""
            for k, v in found.labels[i]:
                if k == "__name__":
                    metric = v
                elif k == "instance":
                    instance = v
            if metric == self.HEARTBEAT_METRIC:
                if instance not in heard or at > heard[instance][0]:
                    heard[instance] = (at, value)
            elif not math.isnan(value):  # a NaN reading says nothing
                gauges.setdefault((instance, metric), []).append(value)
                seen[instance] = max(seen.get(instance, 0), at)
        for (instance, metric), values in gauges.items():
            f = facts.get(instance)
            if f is None:
                f = facts[instance] = InstanceFacts(id=instance, last_seen_ms=0)
            f.last_seen_ms = max(f.last_seen_ms, seen[instance])
            name, how = self.GAUGES[metric]
            setattr(f, name, float(_COMBINE[how](values)))
        for instance, (at, lag) in heard.items():
            if instance in facts:
                facts[instance].last_heard_ms = at
                facts[instance].ingest_lag_s = lag

    def _series_labels(self, facts: dict[str, InstanceFacts], start_ms: int, now_ms: int) -> None:
        """Each instance's labels from its newest-day ``gpu_memory_free_bytes`` series, under its own.

        This is how data that no enrolled agent sent (remote_write, ``ki import``) gets labels:
        the series' ``instance`` label names the instance, and the series' other labels but
        :attr:`SERIES_ONLY_LABELS` (``model``, ``rack``, ``host``, ...) become the instance's.
        Enrolment labels win where both say something. One series per instance (the lowest
        fingerprint) so the answer does not change between rebuilds.
        """
        p = Params()
        rows = self.store.query(
            "SELECT labels['instance'] AS instance, argMin(labels, fingerprint) AS l"
            f" FROM {self._table('series')} WHERE metric = {p(self.LABELS_METRIC, 'String')}"
            f" AND date >= toDate({_ms(start_ms)}) AND date <= toDate({_ms(now_ms)})"
            " AND labels['instance'] != '' GROUP BY instance",
            p,
        ).to_pylist()
        for r in rows:
            own = {k: v for k, v in dict(r["l"] or []).items() if k not in self.SERIES_ONLY_LABELS and v}
            if not own:
                continue
            f = facts.get(r["instance"])
            if f is not None:  # an instance with neither a row nor recent samples is not in the snapshot
                f.labels = dict(sorted({**own, **f.labels}.items()))

    def recent_errors(self, instance_id: str, limit: int) -> list[dict[str, Any]]:
        p = Params()
        rows = self.store.query(
            "SELECT toUnixTimestamp64Milli(ts) AS ts_ms, gpu, kind, code, message"
            f" FROM {self._table('events')} WHERE instance = {p(instance_id, 'String')}"
            f" ORDER BY ts DESC LIMIT {int(limit)}",
            p,
        ).to_pylist()
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
