"""The serving engines' own load metrics (vLLM, SGLang, TGI, TensorRT-LLM) and how the snapshot reads them.

:data:`SERVING_METRICS` is the one table: exposition name -> (the snapshot field, the engine).
The store source reads every name in it with the GPU gauges (one ``Engine.latest`` pass), and
:func:`combine` folds an instance's series into the snapshot's ``serving`` object; docs/api.md
("Serving load") shows the table, generated from here by ``tests/api/test_api_serving.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SERVING_FIELDS",
    "SERVING_METRICS",
    "ServingFacts",
    "ServingMetric",
    "combine",
    "markdown_table",
    "serving_record",
]


@dataclass(frozen=True, slots=True)
class ServingMetric:
    """One engine metric: which snapshot field it feeds, and how an instance's series combine."""

    field: str
    engine: str
    note: str = ""


#: field -> (how several series of one instance combine, meaning). Several series: an instance
#: running more than one engine process (tensor-parallel groups, one server per GPU pair).
SERVING_FIELDS: Mapping[str, tuple[str, str]] = {
    "requests_waiting": ("sum", "requests queued, not yet scheduled"),
    "requests_running": ("sum", "requests in the running batch"),
    "kv_cache_usage_ratio": (
        "max",
        "share of the KV cache held by running requests, 0-1 (the fullest engine)",
    ),
    "prefix_cache_hits": (
        "sum",
        "prompt tokens found in the prefix cache (counter, since the engine started)",
    ),
    "prefix_cache_queries": ("sum", "prompt tokens looked up in the prefix cache (counter)"),
    "prefix_cache_hit_ratio": ("mean", "share of looked-up prompt tokens found in the prefix cache, 0-1"),
}

#: exposition name -> what it is. Names as the engines export them (a remote-written counter keeps
#: its ``_total``). The equivalents follow the Gateway API Inference Extension's model-server
#: protocol table (docs/proposals/003-model-server-protocol) where it has one.
SERVING_METRICS: Mapping[str, ServingMetric] = {
    "vllm:num_requests_waiting": ServingMetric("requests_waiting", "vllm"),
    "vllm:num_requests_running": ServingMetric("requests_running", "vllm"),
    "vllm:kv_cache_usage_perc": ServingMetric(
        "kv_cache_usage_ratio", "vllm", "0-1 despite the name (vLLM V1)"
    ),
    "vllm:gpu_cache_usage_perc": ServingMetric("kv_cache_usage_ratio", "vllm", "its name before V1; 0-1"),
    "vllm:prefix_cache_hits_total": ServingMetric("prefix_cache_hits", "vllm", "tokens (V1)"),
    "vllm:prefix_cache_queries_total": ServingMetric("prefix_cache_queries", "vllm", "tokens (V1)"),
    "vllm:gpu_prefix_cache_hit_rate": ServingMetric("prefix_cache_hit_ratio", "vllm", "V0 gauge"),
    "sglang:num_queue_reqs": ServingMetric("requests_waiting", "sglang"),
    "sglang:num_running_reqs": ServingMetric("requests_running", "sglang"),
    "sglang:token_usage": ServingMetric("kv_cache_usage_ratio", "sglang", "KV tokens in use / capacity"),
    "sglang:cache_hit_rate": ServingMetric("prefix_cache_hit_ratio", "sglang", "radix cache"),
    "tgi_queue_size": ServingMetric("requests_waiting", "tgi"),
    "tgi_batch_current_size": ServingMetric("requests_running", "tgi", "TGI exports no KV usage"),
    "trtllm_num_requests_waiting": ServingMetric("requests_waiting", "trtllm-serve"),
    "trtllm_num_requests_running": ServingMetric("requests_running", "trtllm-serve"),
    "trtllm_kv_cache_utilization": ServingMetric("kv_cache_usage_ratio", "trtllm-serve"),
}


@dataclass(slots=True)
class ServingFacts:
    """One instance's serving load as read: each field's combined value, and the newest sample's time."""

    values: dict[str, float]
    engines: tuple[str, ...]
    sample_ms: int  # the newest of its samples' own timestamps (the scrape time)


def combine(rows: Iterable[tuple[str, float, int]]) -> ServingFacts | None:
    """``(metric name, value, sample ms)`` rows of one instance -> its :class:`ServingFacts`; None
    when no row is a finite reading of a known metric. NaN readings say nothing."""
    groups: dict[str, list[float]] = {}
    engines: set[str] = set()
    newest = None
    for name, value, ts in rows:
        metric = SERVING_METRICS.get(name)
        if metric is None or not math.isfinite(value):
            continue
        groups.setdefault(metric.field, []).append(value)
        engines.add(metric.engine)
        newest = ts if newest is None else max(newest, ts)
    if newest is None:
        return None
    values: dict[str, float] = {}
    for name, vals in groups.items():
        how = SERVING_FIELDS[name][0]
        values[name] = sum(vals) if how == "sum" else max(vals) if how == "max" else sum(vals) / len(vals)
    return ServingFacts(values, tuple(sorted(engines)), int(newest))


def serving_record(facts: ServingFacts | None) -> dict[str, Any] | None:
    """The snapshot's ``serving`` object (``models.ServingLoad``): null without serving metrics."""
    if facts is None:
        return None
    v = facts.values
    waiting, running = v.get("requests_waiting"), v.get("requests_running")
    ratio = v.get("prefix_cache_hit_ratio")
    hits, queries = v.get("prefix_cache_hits"), v.get("prefix_cache_queries")
    if hits is not None and queries:
        ratio = hits / queries
    kv = v.get("kv_cache_usage_ratio")
    return {
        "engines": list(facts.engines),
        "requests_waiting": None if waiting is None else round(waiting),
        "requests_running": None if running is None else round(running),
        "kv_cache_usage_ratio": None if kv is None else min(1.0, max(0.0, kv)),
        "prefix_cache_hit_ratio": None if ratio is None else min(1.0, max(0.0, ratio)),
        "sample_ms": facts.sample_ms,
    }


def markdown_table() -> str:
    """The mapping as docs/api.md shows it (a test keeps the two the same)."""
    lines = [
        "| metric | engine | snapshot field | combined over an instance's series | note |",
        "|---|---|---|---|---|",
    ]
    for name, m in SERVING_METRICS.items():
        lines.append(f"| `{name}` | {m.engine} | `{m.field}` | {SERVING_FIELDS[m.field][0]} | {m.note} |")
    return "\n".join(lines)
