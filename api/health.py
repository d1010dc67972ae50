"""The health snapshot: every instance's capacity and health, recomputed in the background, served as bytes.

A request never touches the store: :class:`Snapshotter` rebuilds an immutable
:class:`Snapshot` every few seconds (pre-encoded JSON per instance, an ETag over
the content), and the handler only filters and joins bytes. That is what keeps
p99 under 10 ms for 1,000 instances and makes ``If-None-Match`` -> 304 free.
The healthy/stale rule is :class:`HealthRule` (docs/api.md states it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.errors import ApiError
from kernel_insight.api.models import ErrorBody, HealthSnapshot
from kernel_insight.collector.derive import INGEST_LAG_METRIC

__all__ = [
    "CACHE_CONTROL",
    "ERROR_WINDOW_MS",
    "HealthRule",
    "HealthSource",
    "InstanceFacts",
    "Snapshot",
    "Snapshotter",
    "StoreSource",
    "build_snapshot",
    "etag_matches",
    "health_router",
]

log = logging.getLogger(__name__)

#: Clients may reuse a snapshot this long without asking; revalidation is a cheap 304.
CACHE_CONTROL = "max-age=30"
#: The window of the error count and the NCCL latency quantiles.
ERROR_WINDOW_MS = 5 * 60 * 1000
#: How often the background thread rebuilds the snapshot.
DEFAULT_INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class HealthRule:
    """When an instance is ``stale``, ``lagging`` and ``healthy`` (docs/api.md states it exactly).

    Two clocks: the producers' (``last_seen_ms``, the newest data's own timestamp) and the
    collector's (``last_heard_ms``, when the newest batch of its agent was stored: the
    heartbeat). ``fresh``: the newest data is at most ``stale_after_s`` old. ``lagging``: not
    fresh, but the agent was heard within ``stale_after_s`` and the newest data is at most
    ``max_data_age_s`` old: the agent is catching up on a backlog, which is no reason to stop
    routing to the instance. ``stale``: neither.
    ``healthy``: not stale, a free-memory sample within the last 5 minutes (when
    ``require_memory_data``), at most ``max_errors_5m`` errors and no error of a
    ``fatal_error_kinds`` kind in the last 5 minutes, and no GPU hotter than
    ``max_temperature_celsius``. Every failed condition is listed in ``reasons``.
    """

    stale_after_s: float = 60.0
    max_data_age_s: float = 300.0
    max_errors_5m: int = 10
    fatal_error_kinds: tuple[str, ...] = ("xid", "ecc")
    max_temperature_celsius: float = 90.0
    require_memory_data: bool = True

    def freshness(self, facts: InstanceFacts, now_ms: int) -> tuple[bool, bool, str | None]:
        """(stale, lagging, why stale)."""
        data_age_s = (now_ms - facts.last_seen_ms) / 1000.0
        if data_age_s <= self.stale_after_s:
            return False, False, None
        heard = (
            facts.last_heard_ms is not None and (now_ms - facts.last_heard_ms) / 1000.0 <= self.stale_after_s
        )
        if heard and data_age_s <= self.max_data_age_s:
            return False, True, None
        # No age in the text: it would change the snapshot, and its ETag, on every rebuild.
        if heard:
            return (
                True,
                False,
                (
                    f"stale: newest data older than {self.max_data_age_s:g} s although its agent is sending (ingest lag)"
                ),
            )
        return True, False, f"stale: nothing heard for more than {self.stale_after_s:g} s"

    def judge(self, facts: InstanceFacts, now_ms: int) -> tuple[bool, bool, list[str]]:
        """(healthy, stale, reasons)."""
        reasons: list[str] = []
        stale, _, why = self.freshness(facts, now_ms)
        if why is not None:
            reasons.append(why)
        if self.require_memory_data and facts.gpu_memory_free_bytes is None:
            reasons.append("no gpu_memory_free_bytes sample in the last 5 minutes")
        total = sum(facts.errors_by_kind.values())
        if total > self.max_errors_5m:
            reasons.append(f"{total} errors in the last 5 minutes (more than {self.max_errors_5m})")
        for kind in self.fatal_error_kinds:
            if facts.errors_by_kind.get(kind, 0):
                reasons.append(f"{facts.errors_by_kind[kind]} {kind} error(s) in the last 5 minutes")
        temp = facts.temperature_celsius
        if temp is not None and temp > self.max_temperature_celsius:
            reasons.append(f"temperature {temp:g} C above {self.max_temperature_celsius:g} C")
        return not reasons, stale, reasons

    def as_dict(self) -> dict[str, Any]:
        return {
            "stale_after_s": self.stale_after_s,
            "max_data_age_s": self.max_data_age_s,
            "max_errors_5m": self.max_errors_5m,
            "fatal_error_kinds": list(self.fatal_error_kinds),
            "max_temperature_celsius": self.max_temperature_celsius,
            "require_memory_data": self.require_memory_data,
        }


@dataclass(slots=True)
class InstanceFacts:
    """What a :class:`HealthSource` knows about one instance; None means no data."""

    id: str
    last_seen_ms: int  # producer clock: the newest data's own timestamp
    labels: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    hardware_fingerprint: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    memory_total_bytes: int = 0
    gpu_memory_free_bytes: float | None = None
    gpu_memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    sm_utilization_ratio: float | None = None
    nccl_latencies: Sequence[float] | np.ndarray[Any, Any] = ()  # raw durations, or:
    nccl_quantiles: tuple[float, float, float, int] | None = None  # (p50, p90, p99, count) computed elsewhere
    errors_by_kind: Mapping[str, int] = field(default_factory=dict)
    last_heard_ms: int | None = None  # collector clock: when its agent's newest batch was stored
    ingest_lag_s: float | None = None  # that batch's receive time minus its t_max


class HealthSource(Protocol):
    """Where the snapshot's facts come from (the store in production, a fake in tests)."""

    def collect(self, now_ms: int) -> list[InstanceFacts]: ...

    def recent_errors(self, instance_id: str, limit: int) -> list[dict[str, Any]]: ...


# ------------------------------------------------------------------------------ snapshot


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _gpu_attr(attributes: Mapping[str, str], name: str) -> str | None:
    """The value of ``gpu<N>.<name>`` for the lowest N that has it (GPU 0 nearly always)."""
    value = attributes.get(f"gpu0.{name}")
    if value is not None:
        return value
    best: tuple[int, str] | None = None
    for key, v in attributes.items():
        gpu, _, field_name = key.partition(".")
        if field_name == name and gpu.startswith("gpu") and gpu[3:].isdigit():
            n = int(gpu[3:])
            if best is None or n < best[0]:
                best = (n, v)
    return None if best is None else best[1]


def _nvlink_bandwidth(attributes: Mapping[str, str], gpu_count: int) -> float | None:
    """Summed over the GPUs; the fingerprint carries one value per GPU."""
    keys = (
        [f"gpu{g}.nvlink_bandwidth" for g in range(gpu_count)]
        if gpu_count
        else [k for k in attributes if k.endswith(".nvlink_bandwidth")]
    )
    values = []
    for key in keys:
        text = attributes.get(key)
        if text is not None:
            with contextlib.suppress(ValueError):
                values.append(float(text))
    return float(sum(values)) if values else None


def served_models(labels: Mapping[str, str]) -> list[str]:
    """The instance's ``models`` label, split at commas (set at enrolment, e.g. ``llama-70b,mistral-7b``)."""
    return sorted({m.strip() for m in labels.get("models", "").split(",") if m.strip()})


def instance_record(facts: InstanceFacts, rule: HealthRule, now_ms: int) -> dict[str, Any]:
    """The snapshot's JSON object for one instance (the shape of ``models.InstanceHealth``)."""
    healthy, stale, reasons = rule.judge(facts, now_ms)
    _, lagging, _ = rule.freshness(facts, now_ms)
    lag = facts.ingest_lag_s
    free = _num(facts.gpu_memory_free_bytes)
    total = _num(facts.gpu_memory_total_bytes)
    if total is None and facts.memory_total_bytes > 0:
        total = float(facts.memory_total_bytes)
    nccl = None
    if facts.nccl_quantiles is not None and facts.nccl_quantiles[3] > 0:
        p50, p90, p99, count = facts.nccl_quantiles
        nccl = {"p50": p50, "p90": p90, "p99": p99, "count": count}
    else:
        lat = np.asarray(facts.nccl_latencies, dtype=np.float64)
        lat = lat[np.isfinite(lat)]
        if len(lat):
            p50, p90, p99 = np.quantile(lat, [0.5, 0.9, 0.99]).tolist()
            nccl = {"p50": p50, "p90": p90, "p99": p99, "count": len(lat)}
    errors = int(sum(facts.errors_by_kind.values()))
    return {
        "id": facts.id,
        "models": served_models(facts.labels),
        "labels": dict(sorted(facts.labels.items())),
        "fingerprint": {
            "hardware_fingerprint": facts.hardware_fingerprint,
            "gpu_model": facts.gpu_model,
            "gpu_count": facts.gpu_count,
            "driver_version": _gpu_attr(facts.attributes, "driver_version"),
            "cuda_version": _gpu_attr(facts.attributes, "cuda_version"),
            "memory_total_bytes": facts.memory_total_bytes,
            "nvlink_bandwidth": _nvlink_bandwidth(facts.attributes, facts.gpu_count),
        },
        "gpu_memory_free_bytes": None if free is None else int(free),
        "gpu_memory_total_bytes": None if total is None else int(total),
        "gpu_memory_free_ratio": None if free is None or not total else free / total,
        "nccl_latency_seconds": nccl,
        "errors_5m": errors,
        "error_rate_per_s": errors / (ERROR_WINDOW_MS / 1000),
        "temperature_celsius": _num(facts.temperature_celsius),
        "power_watts": _num(facts.power_watts),
        "sm_utilization_ratio": _num(facts.sm_utilization_ratio),
        "last_seen_ms": int(facts.last_seen_ms),
        "last_heard_ms": None if facts.last_heard_ms is None else int(facts.last_heard_ms),
        "ingest_lag_s": None if lag is None or not math.isfinite(lag) else round(max(0.0, lag), 3),
        "healthy": healthy,
        "stale": stale,
        "lagging": lagging,
        "reasons": reasons,
    }


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """One immutable computation: the records, their encoded bytes, and what filters need."""

    as_of_ms: int
    computed_at_ms: int
    rule: HealthRule
    records: tuple[dict[str, Any], ...]
    attributes: tuple[Mapping[str, str], ...]  # raw fingerprint fields, kept out of the snapshot JSON
    fragments: tuple[bytes, ...]
    etag: str  # quoted: the content digest plus as_of, so equal ETags always mean equal bodies
    content_digest: str
    body: bytes
    index: Mapping[str, int]
    healthy: np.ndarray[Any, np.dtype[np.bool_]]
    free_bytes: np.ndarray[Any, np.dtype[np.float64]]  # -1 where unknown
    by_model: Mapping[str, np.ndarray[Any, np.dtype[np.intp]]]

    def select(self, model: str | None, min_free_bytes: int | None, healthy: bool | None) -> list[int]:
        """Positions of the records passing every given filter, in id order."""
        keep = np.ones(len(self.records), dtype=np.bool_)
        if model is not None:
            keep[:] = False
            keep[self.by_model.get(model, np.empty(0, dtype=np.intp))] = True
        if min_free_bytes is not None:
            keep &= self.free_bytes >= min_free_bytes
        if healthy is not None:
            keep &= self.healthy == healthy
        return np.flatnonzero(keep).tolist()

    def render(self, positions: Iterable[int] | None) -> bytes:
        """The snapshot JSON with only these records (all when None)."""
        if positions is None:
            return self.body
        return self._head() + b",".join(self.fragments[i] for i in positions) + b"]}"

    def _head(self) -> bytes:
        return (
            b'{"as_of_ms":'
            + str(self.as_of_ms).encode()
            + b',"rule":'
            + encode_json(self.rule.as_dict())
            + b',"instances":['
        )


def build_snapshot(
    facts: Sequence[InstanceFacts], rule: HealthRule, now_ms: int, previous: Snapshot | None = None
) -> Snapshot:
    """A snapshot of ``facts`` judged at ``now_ms``; keeps ``previous``'s as_of and ETag when nothing changed."""
    ordered = sorted(facts, key=lambda f: f.id)
    records = tuple(instance_record(f, rule, now_ms) for f in ordered)
    fragments = tuple(encode_json(r) for r in records)
    digest = hashlib.blake2b(digest_size=12)
    digest.update(encode_json(rule.as_dict()))
    for frag in fragments:
        digest.update(frag)
        digest.update(b"\n")
    content = digest.hexdigest()
    same = previous is not None and previous.content_digest == content
    as_of = previous.as_of_ms if previous is not None and same else now_ms
    etag = previous.etag if previous is not None and same else f'"{content}-{as_of:x}"'
    by_model: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        for m in r["models"]:
            by_model.setdefault(m, []).append(i)
    snap = Snapshot(
        as_of_ms=as_of,
        computed_at_ms=now_ms,
        rule=rule,
        records=records,
        attributes=tuple(dict(f.attributes) for f in ordered),
        fragments=fragments,
        etag=etag,
        content_digest=content,
        body=b"",
        index={r["id"]: i for i, r in enumerate(records)},
        healthy=np.array([r["healthy"] for r in records], dtype=np.bool_),
        free_bytes=np.array(
            [
                -1.0 if r["gpu_memory_free_bytes"] is None else float(r["gpu_memory_free_bytes"])
                for r in records
            ],
            dtype=np.float64,
        ),
        by_model={m: np.array(ix, dtype=np.intp) for m, ix in by_model.items()},
    )
    object.__setattr__(snap, "body", snap._head() + b",".join(fragments) + b"]}")
    return snap


class Snapshotter:
    """Rebuilds the snapshot every ``interval_s`` on a background thread.

    ``start()``/``shutdown()`` follow the pipeline contract: shutdown is safe without start
    and safe twice. A failed rebuild re-judges the previous facts at the new time (so
    instances age into ``stale``) and is logged; ``last_error`` holds it.
    """

    def __init__(
        self,
        source: HealthSource,
        rule: HealthRule | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.rule = rule or HealthRule()
        self.interval_s = interval_s
        self.clock = clock
        self.last_error: BaseException | None = None
        self._snapshot: Snapshot | None = None
        self._facts: list[InstanceFacts] | None = None
        self._lock = threading.Lock()  # one rebuild at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def refresh(self) -> Snapshot:
        """Rebuild now (blocking); raises what the source raises.

        When the source fails, the last facts are judged again at the new time before the
        error propagates, so instances turn ``stale`` while the store cannot be read: what
        nobody has heard from lately is not vouched for.
        """
        with self._lock:
            now_ms = int(self.clock() * 1000)
            try:
                facts = self.source.collect(now_ms)
            except Exception:
                if self._facts is not None:
                    self._snapshot = build_snapshot(self._facts, self.rule, now_ms, self._snapshot)
                raise
            self._facts = facts
            snap = build_snapshot(facts, self.rule, now_ms, self._snapshot)
            self._snapshot = snap
            self.last_error = None
            return snap

    def current(self) -> Snapshot:
        """The latest snapshot, built now if there is none yet."""
        snap = self._snapshot
        return snap if snap is not None else self.refresh()

    def tick(self) -> bool:
        """One background iteration: rebuild, or log the failure and keep the last snapshot."""
        try:
            self.refresh()
        except Exception as exc:  # keep serving the last snapshot; the store may come back
            self.last_error = exc
            log.warning("health snapshot rebuild failed: %s", exc)
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ki-health-snapshot", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)


# ------------------------------------------------------------------------------ store source


def _ms(ms: int) -> str:
    return f"fromUnixTimestamp64Milli(toInt64({int(ms)}), 'UTC')"


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class StoreSource:
    """Facts from the collector's store: the instances table, the latest GPU gauges, NCCL latencies, events.

    The per-instance figures are aggregated inside ClickHouse, one query each for
    gauges and latencies, because the rebuild shares the server's process: kql over
    ``store.storage()`` costs about 0.1 ms of Python per series, 6 s for 1,000
    instances x 8 GPUs x 6 gauges, and that time would hold the GIL the request
    handlers need. The semantics are kql's for an instant query at ``now``: each
    series' newest sample within the 5-minute lookback, staleness markers (NaN)
    meaning absent, then ``sum``/``max``/``avg`` by instance.
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
    #: One sample per stored agent batch, at its receive time (collector/derive.py): the heartbeat.
    HEARTBEAT_METRIC = INGEST_LAG_METRIC

    def __init__(self, store: Any) -> None:
        self.store = store

    def _series(self, metrics: Sequence[str], start_ms: int, now_ms: int) -> str:
        db = self.store.database
        names = ", ".join(_sql_string(m) for m in metrics)
        return (
            f"SELECT DISTINCT fingerprint, metric, labels['instance'] AS instance FROM {db}.series"
            f" WHERE metric IN ({names}) AND date >= toDate({_ms(start_ms)}) AND date <= toDate({_ms(now_ms)})"
        )

    @staticmethod
    def _metric_in(metrics: Sequence[str]) -> str:
        """The samples key leads with metric: this filter skips every other metric's granules."""
        return f"s.metric IN ({', '.join(_sql_string(m) for m in metrics)})"

    def collect(self, now_ms: int) -> list[InstanceFacts]:
        db = self.store.database
        rows = self.store.query(
            "SELECT id, hardware_fingerprint, gpu_count, gpu_model, memory_total_bytes, labels, attributes,"
            f" toUnixTimestamp64Milli(last_seen) AS last_seen_ms FROM {db}.instances FINAL"
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
        gauges = self.store.query(
            "SELECT instance, metric, sum(v) AS total, max(v) AS top, avg(v) AS mean, max(t) AS last_ms FROM ("
            " SELECT any(f.instance) AS instance, any(f.metric) AS metric, argMax(s.value, s.ts) AS v,"
            "  toUnixTimestamp64Milli(max(s.ts)) AS t"
            f" FROM {db}.samples AS s INNER JOIN ({self._series(list(self.GAUGES), start, now_ms)}) AS f"
            f" ON s.fingerprint = f.fingerprint WHERE {window} AND {self._metric_in(list(self.GAUGES))}"
            " GROUP BY s.fingerprint"
            ") WHERE NOT isNaN(v) AND instance != '' GROUP BY instance, metric"
        ).to_pylist()
        for g in gauges:
            f = facts.get(g["instance"])
            if f is None:
                f = facts[g["instance"]] = InstanceFacts(id=g["instance"], last_seen_ms=0)
            f.last_seen_ms = max(f.last_seen_ms, int(g["last_ms"]))
            name, how = self.GAUGES[g["metric"]]
            setattr(f, name, float(g[how]))
        latencies = self.store.query(
            "SELECT f.instance AS instance, quantilesExactInclusive(0.5, 0.9, 0.99)(s.value) AS q, count() AS n"
            f" FROM {db}.samples AS s INNER JOIN ({self._series([self.LATENCY_METRIC], start, now_ms)}) AS f"
            f" ON s.fingerprint = f.fingerprint WHERE {window} AND {self._metric_in([self.LATENCY_METRIC])}"
            " AND isFinite(s.value) GROUP BY instance"
        ).to_pylist()
        for lat in latencies:
            if lat["instance"] in facts:
                p50, p90, p99 = (float(x) for x in lat["q"])
                facts[lat["instance"]].nccl_quantiles = (p50, p90, p99, int(lat["n"]))
        heartbeats = self.store.query(
            "SELECT f.instance AS instance, toUnixTimestamp64Milli(max(s.ts)) AS heard_ms,"
            " argMax(s.value, s.ts) AS lag"
            f" FROM {db}.samples AS s INNER JOIN ({self._series([self.HEARTBEAT_METRIC], start, now_ms)}) AS f"
            f" ON s.fingerprint = f.fingerprint WHERE {window} AND {self._metric_in([self.HEARTBEAT_METRIC])}"
            " GROUP BY instance"
        ).to_pylist()
        for h in heartbeats:
            if h["instance"] in facts:
                facts[h["instance"]].last_heard_ms = int(h["heard_ms"])
                facts[h["instance"]].ingest_lag_s = float(h["lag"])
        errors = self.store.query(
            f"SELECT instance, kind, count() AS n FROM {db}.events WHERE ts >= {_ms(start)} GROUP BY instance, kind"
        ).to_pylist()
        for e in errors:
            if e["instance"] in facts:
                counts = dict(facts[e["instance"]].errors_by_kind)
                counts[e["kind"]] = int(e["n"])
                facts[e["instance"]].errors_by_kind = counts
        return list(facts.values())

    def recent_errors(self, instance_id: str, limit: int) -> list[dict[str, Any]]:
        rows = self.store.query(
            "SELECT toUnixTimestamp64Milli(ts) AS ts_ms, gpu, kind, code, message"
            f" FROM {self.store.database}.events WHERE instance = {_sql_string(instance_id)}"
            f" ORDER BY ts DESC LIMIT {int(limit)}"
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


# ------------------------------------------------------------------------------ router


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of an If-None-Match list against our ETag."""
    if not if_none_match:
        return False
    bare = etag.removeprefix("W/")
    for candidate in if_none_match.split(","):
        c = candidate.strip()
        if c == "*" or c.removeprefix("W/") == bare:
            return True
    return False


def _filtered_etag(etag: str, key: str) -> str:
    if not key:
        return etag
    return etag[:-1] + "-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest() + '"'


async def current_snapshot(snapshotter: Snapshotter) -> Snapshot:
    """The latest snapshot; a 503 with Retry-After when none could be built yet."""
    snap = snapshotter.snapshot
    if snap is not None:
        return snap
    try:
        return await run_in_threadpool(snapshotter.refresh)
    except Exception as exc:
        raise ApiError(
            503,
            "unavailable",
            f"no health snapshot yet: {exc}",
            {"Retry-After": str(max(1, int(snapshotter.interval_s)))},
        ) from None


def cached_json(request: Request, body: Callable[[], bytes], etag: str, snap: Snapshot) -> Response:
    """200 with ETag and Cache-Control, or 304 when the client already holds this ETag."""
    headers = {
        "ETag": etag,
        "Cache-Control": CACHE_CONTROL,
        "X-Ki-Computed-At-Ms": str(snap.computed_at_ms),
    }
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body(), media_type="application/json", headers=headers)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


def health_router(
    snapshotter: Snapshotter, auth: Authenticator, *, manage_lifecycle: bool = True
) -> APIRouter:
    """``GET /v1/health/snapshot``; starts and stops ``snapshotter`` with the app when ``manage_lifecycle``."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        snapshotter.start()
        try:
            yield
        finally:
            await run_in_threadpool(snapshotter.shutdown)

    router = APIRouter(tags=["health"], lifespan=lifespan if manage_lifecycle else None)

    @router.get(
        "/v1/health/snapshot",
        response_model=HealthSnapshot,
        responses={304: {"description": "Not modified (If-None-Match matched the ETag)"}, **ERROR_RESPONSES},
        summary="Every instance's capacity and health (cached; ETag)",
    )
    async def snapshot(
        request: Request,
        model: str | None = Query(None, description="only instances serving this model"),
        min_free_bytes: int | None = Query(
            None, ge=0, description="only instances with at least this much free GPU memory"
        ),
        healthy: bool | None = Query(None, description="only healthy (true) or unhealthy (false) instances"),
        _token: object = Depends(auth.require(Scope.READ)),
    ) -> Response:
        snap = await current_snapshot(snapshotter)
        if model is None and min_free_bytes is None and healthy is None:
            return cached_json(request, lambda: snap.body, snap.etag, snap)
        key = f"{model!r}|{min_free_bytes!r}|{healthy!r}"
        etag = _filtered_etag(snap.etag, key)
        return cached_json(
            request, lambda: snap.render(snap.select(model, min_free_bytes, healthy)), etag, snap
        )

    return router
