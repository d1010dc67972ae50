"""Typed values the SDK returns: health snapshot instances and kql query results.

Query values are ``array.array("d")``: numpy-friendly (``np.asarray(series.values)``
shares the buffer) without making numpy a dependency of the SDK.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Fingerprint",
    "GpuPod",
    "HealthSnapshot",
    "Histogram",
    "HistogramBucket",
    "Instance",
    "NcclLatency",
    "QueryResult",
    "Sample",
    "Series",
    "ServingLoad",
]


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True, slots=True)
class NcclLatency:
    """NCCL operation duration quantiles over the last 5 minutes, seconds."""

    p50: float
    p90: float
    p99: float
    count: int


@dataclass(frozen=True, slots=True)
class ServingLoad:
    """The serving engine's own load (vLLM, SGLang, TGI, TensorRT-LLM metrics; docs/api.md "Serving load").

    ``sample_ms`` is the newest sample's own timestamp (unix ms): :meth:`age_s` is how old the
    figures are now. None fields: the engine does not export that figure.
    """

    engines: tuple[str, ...]
    requests_waiting: int | None
    requests_running: int | None
    kv_cache_usage_ratio: float | None
    prefix_cache_hit_ratio: float | None
    sample_ms: int

    def age_s(self, now_s: float | None = None) -> float:
        """Seconds since the figures were sampled (``now_s``: unix seconds, default the wall clock)."""
        return max(0.0, (time.time() if now_s is None else now_s) - self.sample_ms / 1000.0)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ServingLoad | None:
        if not d:
            return None
        return cls(
            engines=tuple(d.get("engines") or ()),
            requests_waiting=_opt_int(d.get("requests_waiting")),
            requests_running=_opt_int(d.get("requests_running")),
            kv_cache_usage_ratio=_opt_float(d.get("kv_cache_usage_ratio")),
            prefix_cache_hit_ratio=_opt_float(d.get("prefix_cache_hit_ratio")),
            sample_ms=int(d.get("sample_ms", 0)),
        )


@dataclass(frozen=True, slots=True)
class Fingerprint:
    hardware_fingerprint: str
    gpu_model: str
    gpu_count: int
    driver_version: str | None
    cuda_version: str | None
    memory_total_bytes: int
    nvlink_bandwidth: float | None


@dataclass(frozen=True, slots=True)
class GpuPod:
    """The Kubernetes pod, namespace and container holding one GPU of an instance (the kubelet says)."""

    gpu: int
    pod: str
    namespace: str
    container: str


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance of the health snapshot (docs/api.md lists the fields and the healthy/stale rule).

    ``lagging``: its newest data is older than the rule's ``stale_after_s`` but its agent is
    heard and catching up (``ingest_lag_s`` says how far behind); it stays eligible.
    ``last_heard_ms`` and ``ingest_lag_s`` are None for data that no agent sent (remote_write).
    """

    id: str
    models: tuple[str, ...]
    labels: Mapping[str, str]
    fingerprint: Fingerprint
    gpu_memory_free_bytes: int | None
    gpu_memory_total_bytes: int | None
    gpu_memory_free_ratio: float | None
    nccl_latency_seconds: NcclLatency | None
    errors_5m: int
    error_rate_per_s: float
    temperature_celsius: float | None
    power_watts: float | None
    sm_utilization_ratio: float | None
    last_seen_ms: int
    healthy: bool
    stale: bool
    reasons: tuple[str, ...] = ()
    lagging: bool = False
    last_heard_ms: int | None = None
    ingest_lag_s: float | None = None
    name: str | None = None  # the enrolment name of its agent (None: data no enrolled agent sent)
    pods: tuple[GpuPod, ...] = ()  # the pod holding each of its GPUs (Kubernetes); empty elsewhere
    serving: ServingLoad | None = None

    def held_by(self, pod: str | None = None, namespace: str | None = None) -> bool:
        """Whether a GPU of the instance is held by ``pod`` of ``namespace`` (either may be None: any)."""
        return any(
            (pod is None or p.pod == pod) and (namespace is None or p.namespace == namespace)
            for p in self.pods
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Instance:
        fp = d.get("fingerprint") or {}
        nccl = d.get("nccl_latency_seconds")
        return cls(
            id=str(d["id"]),
            models=tuple(d.get("models") or ()),
            labels=dict(d.get("labels") or {}),
            fingerprint=Fingerprint(
                hardware_fingerprint=str(fp.get("hardware_fingerprint", "")),
                gpu_model=str(fp.get("gpu_model", "")),
                gpu_count=int(fp.get("gpu_count", 0)),
                driver_version=fp.get("driver_version"),
                cuda_version=fp.get("cuda_version"),
                memory_total_bytes=int(fp.get("memory_total_bytes", 0)),
                nvlink_bandwidth=_opt_float(fp.get("nvlink_bandwidth")),
            ),
            gpu_memory_free_bytes=_opt_int(d.get("gpu_memory_free_bytes")),
            gpu_memory_total_bytes=_opt_int(d.get("gpu_memory_total_bytes")),
            gpu_memory_free_ratio=_opt_float(d.get("gpu_memory_free_ratio")),
            nccl_latency_seconds=None
            if not nccl
            else NcclLatency(float(nccl["p50"]), float(nccl["p90"]), float(nccl["p99"]), int(nccl["count"])),
            errors_5m=int(d.get("errors_5m", 0)),
            error_rate_per_s=float(d.get("error_rate_per_s", 0.0)),
            temperature_celsius=_opt_float(d.get("temperature_celsius")),
            power_watts=_opt_float(d.get("power_watts")),
            sm_utilization_ratio=_opt_float(d.get("sm_utilization_ratio")),
            last_seen_ms=int(d.get("last_seen_ms", 0)),
            healthy=bool(d.get("healthy")),
            stale=bool(d.get("stale")),
            reasons=tuple(d.get("reasons") or ()),
            lagging=bool(d.get("lagging")),
            last_heard_ms=_opt_int(d.get("last_heard_ms")),
            ingest_lag_s=_opt_float(d.get("ingest_lag_s")),
            name=None if d.get("name") is None else str(d["name"]),
            pods=tuple(
                GpuPod(int(p["gpu"]), str(p["pod"]), str(p.get("namespace", "")), str(p.get("container", "")))
                for p in d.get("pods") or ()
            ),
            serving=ServingLoad.from_json(d.get("serving")),
        )


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """The server's snapshot as fetched: ``etag`` for revalidation, ``as_of_ms`` when its data last changed."""

    as_of_ms: int
    instances: tuple[Instance, ...]
    etag: str | None = None
    rule: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], etag: str | None) -> HealthSnapshot:
        return cls(
            as_of_ms=int(d.get("as_of_ms", 0)),
            instances=tuple(Instance.from_json(i) for i in d.get("instances", ())),
            etag=etag,
            rule=dict(d.get("rule") or {}),
        )

    def get(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def held_by(self, pod: str | None = None, namespace: str | None = None) -> tuple[Instance, ...]:
        """The instances with a GPU held by ``pod`` of ``namespace`` (Kubernetes; either may be None: any)."""
        return tuple(i for i in self.instances if i.held_by(pod, namespace))


# ------------------------------------------------------------------------------ query results


def _value(text: Any) -> float:
    """Prometheus writes sample values as strings: "1.5", "NaN", "+Inf"."""
    return float(text) if not isinstance(text, str) else float(text.replace("Inf", "inf"))


@dataclass(frozen=True, slots=True)
class HistogramBucket:
    """One bucket of a native histogram as the Prometheus API gives it: ``count`` observations
    between ``lower`` and ``upper``; ``boundary_rule`` says which ends are inclusive (0: upper
    only, 1: lower only, 2: neither, 3: both; the zero bucket is 3)."""

    boundary_rule: int
    lower: float
    upper: float
    count: float


@dataclass(frozen=True, slots=True)
class Histogram:
    """A native-histogram sample value (Prometheus' ``histogram`` in query results)."""

    count: float
    sum: float
    buckets: tuple[HistogramBucket, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Histogram:
        return cls(
            _value(raw["count"]),
            _value(raw["sum"]),
            tuple(
                HistogramBucket(int(b[0]), _value(b[1]), _value(b[2]), _value(b[3]))
                for b in raw.get("buckets") or ()
            ),
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """One instant-vector element (or a scalar, with no labels): ``timestamp`` in unix seconds.

    A native-histogram sample has its value in ``histogram`` and NaN in ``value``."""

    labels: Mapping[str, str]
    timestamp: float
    value: float
    histogram: Histogram | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """One range-vector series: ``timestamps`` (unix seconds) and ``values`` as ``array('d')``;
    its native-histogram samples, if any, in ``histograms`` as (unix seconds, value) pairs."""

    labels: Mapping[str, str]
    timestamps: array[float]
    values: array[float]
    histograms: tuple[tuple[float, Histogram], ...] = ()

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's answer. ``result_type`` is ``vector``, ``matrix``, ``scalar`` or ``string``.

    ``samples`` holds a vector (or the scalar, as one unlabelled sample), ``series`` a matrix,
    ``string`` a string result; ``warnings`` and ``infos`` are the server's annotations.
    """

    result_type: str
    samples: tuple[Sample, ...] = ()
    series: tuple[Series, ...] = ()
    string: str | None = None
    warnings: tuple[str, ...] = ()
    infos: tuple[str, ...] = ()

    @property
    def scalar(self) -> float:
        """The value of a scalar result (NaN when the result is not a scalar)."""
        return self.samples[0].value if self.result_type == "scalar" and self.samples else math.nan

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> QueryResult:
        data = body["data"]
        kind = str(data["resultType"])
        result = data["result"]
        warnings = tuple(body.get("warnings") or ())
        infos = tuple(body.get("infos") or ())
        if kind == "vector":
            samples = tuple(
                Sample(dict(r["metric"]), float(r["value"][0]), _value(r["value"][1]))
                if "value" in r
                else Sample(
                    dict(r["metric"]),
                    float(r["histogram"][0]),
                    math.nan,
                    Histogram.from_json(r["histogram"][1]),
                )
                for r in result
            )
            return cls(kind, samples=samples, warnings=warnings, infos=infos)
        if kind == "matrix":
            series = tuple(
                Series(
                    dict(r["metric"]),
                    array("d", (float(t) for t, _ in r.get("values") or ())),
                    array("d", (_value(v) for _, v in r.get("values") or ())),
                    tuple((float(t), Histogram.from_json(h)) for t, h in r.get("histograms") or ()),
                )
                for r in result
            )
            return cls(kind, series=series, warnings=warnings, infos=infos)
        if kind == "scalar":
            return cls(
                kind,
                samples=(Sample({}, float(result[0]), _value(result[1])),),
                warnings=warnings,
                infos=infos,
            )
        if kind == "string":
            return cls(kind, string=str(result[1]), warnings=warnings, infos=infos)
        raise ValueError(f"unknown resultType {kind!r}")
