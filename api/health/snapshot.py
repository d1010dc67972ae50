"""One immutable snapshot: each instance's record judged by the rule, pre-encoded, with an ETag over the content."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel_insight.api.health.rule import ERROR_WINDOW_MS, HealthRule, InstanceFacts
from kernel_insight.api.health.serving import serving_record

__all__ = ["Snapshot", "build_snapshot", "encode_json", "instance_record", "served_models"]


#: The snapshot's gzip level: 1 already compresses its repetitive JSON most of the way, at the least
#: CPU a rebuild; higher levels buy little here (bench/results/fleet.md, the GPU fleet's snapshot).
GZIP_LEVEL = 1


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
    """The models an instance serves: its ``model`` label, and its ``models`` label split at commas.

    Both are instance labels (enrolment, or the series of a remote-written instance):
    ``model=llama-70b`` for one, ``models=llama-70b,mistral-7b`` for several.
    """
    names = [labels.get("model", ""), *labels.get("models", "").split(",")]
    return sorted({m.strip() for m in names if m.strip()})


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
        "name": facts.name,
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
        "serving": serving_record(facts.serving),
        "last_seen_ms": int(facts.last_seen_ms),
        "last_heard_ms": None if facts.last_heard_ms is None else int(facts.last_heard_ms),
        "ingest_lag_s": None if lag is None or not math.isfinite(lag) else round(max(0.0, lag), 3),
        "healthy": healthy,
        "stale": stale,
        "lagging": lagging,
        "reasons": reasons,
        "pods": gpu_pods(facts.attributes),
    }


def gpu_pods(attributes: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each GPU held by a pod, from the instance's FINGERPRINT attributes (``gpu<N>.pod``...), by GPU."""
    out = []
    for key, pod in attributes.items():
        gpu, _, name = key.partition(".")
        if name == "pod" and pod and gpu.startswith("gpu") and gpu[3:].isdigit():
            out.append(
                {
                    "gpu": int(gpu[3:]),
                    "pod": pod,
                    "namespace": attributes.get(f"{gpu}.namespace", ""),
                    "container": attributes.get(f"{gpu}.container", ""),
                }
            )
    return sorted(out, key=lambda p: p["gpu"])


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
    body_gzip: bytes  # ``body`` gzip-compressed once per snapshot, for clients that accept it
    index: Mapping[str, int]
    healthy: np.ndarray[Any, np.dtype[np.bool_]]
    free_bytes: np.ndarray[Any, np.dtype[np.float64]]  # -1 where unknown
    by_model: Mapping[str, np.ndarray[Any, np.dtype[np.intp]]]

    def select(
        self,
        model: str | None,
        min_free_bytes: int | None,
        healthy: bool | None,
        pod: str | None = None,
        namespace: str | None = None,
    ) -> list[int]:
        """Positions of the records passing every given filter, in id order."""
        keep = np.ones(len(self.records), dtype=np.bool_)
        if pod is not None or namespace is not None:
            keep &= np.array(
                [
                    any(
                        (pod is None or p["pod"] == pod)
                        and (namespace is None or p["namespace"] == namespace)
                        for p in r["pods"]
                    )
                    for r in self.records
                ],
                dtype=np.bool_,
            )
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
        body_gzip=b"",
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
    body = snap._head() + b",".join(fragments) + b"]}"
    object.__setattr__(snap, "body", body)
    # On the rebuild's thread, so a poll only sends bytes: 10,000 instances are ~9 MB of JSON, ~1 MB gzipped.
    object.__setattr__(snap, "body_gzip", gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0))
    return snap
