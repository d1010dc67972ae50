"""Reads of kernel spans for timelines: one window of one GPU, paged, summarised, lined up with events and samples.

Every read is bounded by ``(instance, gpu, start)``, the kernel_spans sort key, so a window
reads only its own granules whatever the table holds (docs/storage.md).
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kernel_insight.collector.clickhouse.timeline import (
    call_rows,
    event_rows,
    kernel_aggregate_rows,
    slowest_span_rows,
    span_page_rows,
)
from kernel_insight.kql.histogram import FloatHistogram, histogram_quantile
from kernel_insight.kql.regex import RegexError, compile_anchored
from kernel_insight.kql.storage import Matcher, is_stale_value

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "COUNTER_METRICS",
    "MAX_WINDOW_NS",
    "SpanCursor",
    "SpanQueryError",
    "SpanWindow",
    "kernel_histograms",
    "read_calls",
    "read_counters",
    "read_events",
    "read_spans",
    "summarize",
]

#: The longest window one read may cover (a day): longer ones are refused with a message.
MAX_WINDOW_NS = 86_400 * 1_000_000_000
#: NVML samples drawn next to spans: metric name -> the short name used in views and traces.
COUNTER_METRICS = {"gpu_memory_used_bytes": "memory_used_bytes", "gpu_sm_utilization_ratio": "sm_utilization"}


class SpanQueryError(ValueError):
    """A window, filter or cursor the caller must fix (the API answers 400 with this message)."""


@dataclass(frozen=True, slots=True)
class SpanWindow:
    """One GPU's window ``[start_ns, end_ns)`` with optional filters; spans are those *starting* in it.

    Example::

        SpanWindow("node-1", 0, t0, t0 + 10**10, kernel="gemm.*", min_duration_ns=50_000)
    """

    instance: str
    gpu: int
    start_ns: int
    end_ns: int
    stream: int | None = None
    kernel: str | None = None  # RE2, anchored as a PromQL matcher
    min_duration_ns: int = 0
    #: Kubernetes: only spans that ran while this pod / namespace / container held the GPU (exact).
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        if not self.instance:
            raise SpanQueryError("instance must not be empty")
        if not 0 <= self.gpu <= 65535:
            raise SpanQueryError(f"gpu must be 0..65535, got {self.gpu}")
        if self.end_ns <= self.start_ns:
            raise SpanQueryError("the window's end must be after its start")
        if self.end_ns - self.start_ns > MAX_WINDOW_NS:
            raise SpanQueryError(
                f"the window is {(self.end_ns - self.start_ns) / 1e9:.0f} s; at most {MAX_WINDOW_NS // 10**9} s"
            )
        if self.stream is not None and not 0 <= self.stream < 2**64:
            raise SpanQueryError(f"stream must be 0..2^64-1, got {self.stream}")
        if self.min_duration_ns < 0:
            raise SpanQueryError("min_duration must not be negative")
        if self.kernel is not None:
            try:
                compile_anchored(self.kernel)
            except RegexError as exc:
                raise SpanQueryError(f"invalid kernel regex: {exc}") from None

    def holder(self) -> dict[str, str]:
        """The pod, namespace and container filters that are set (label name -> value)."""
        wanted = (("pod", self.pod), ("namespace", self.namespace), ("container", self.container))
        return {name: value for name, value in wanted if value is not None}


@dataclass(frozen=True, slots=True)
class SpanCursor:
    """Where the next page starts: after this (start, stream, correlation), the page order."""

    start_ns: int
    stream: int
    correlation: int

    def encode(self) -> str:
        raw = f"{self.start_ns}.{self.stream}.{self.correlation}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> SpanCursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            a, b, c = (int(x) for x in raw.split("."))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise SpanQueryError(f"invalid cursor {text[:40]!r}: pass back next_cursor unchanged") from None
        if a < 0 or not 0 <= b < 2**64 or not 0 <= c < 2**64:
            raise SpanQueryError(f"invalid cursor {text[:40]!r}: out of range")
        return cls(a, b, c)


def _span(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "stream": int(row["stream"]),
        "kernel": row["kernel"],
        "start_ns": int(row["start_ns"]),
        "end_ns": int(row["end_ns"]),
        "duration_ns": int(row["duration_ns"]),
        "correlation": int(row["correlation"]),
        "pid": int(row["pid"]),
        "launch_ns": int(row["launch_ns"]),
        "launch_host_ns": int(row["launch_host_ns"]),
        "tid": int(row["tid"]),
        "pod": row["pod"],
        "namespace": row["namespace"],
        "container": row["container"],
        "nvtx_range": row["nvtx_range"],
    }


def read_spans(
    store: Store, window: SpanWindow, limit: int, cursor: SpanCursor | None = None
) -> tuple[list[dict[str, Any]], SpanCursor | None]:
    """One page of spans in (start, stream, correlation) order and the cursor of the next (None: no more).

    Ordered by the ``start`` column alone, so ClickHouse reads the window's granules in key
    order and stops after the page: ordering by (start, stream, correlation) makes it read and
    sort the whole window (``make bench-timeline``, bench/results/timeline.md). The spans sharing
    the page's last start are then read by that start (the key) and the page sorted fully.
    """
    after = None if cursor is None else (cursor.start_ns, cursor.stream, cursor.correlation)
    rows = span_page_rows(store, window, limit, after)
    spans = sorted((_span(r) for r in rows), key=lambda x: (x["start_ns"], x["stream"], x["correlation"]))
    page = spans[:limit]
    if len(spans) <= limit or not page:
        return page, None
    last_span = page[-1]
    return page, SpanCursor(last_span["start_ns"], last_span["stream"], last_span["correlation"])


#: The agent's per-kernel native histogram (docs/metrics.md): every launch, whatever spans it kept.
KERNEL_HISTOGRAM_METRIC = "kernel_duration_seconds"
#: How far before a window the histogram at its start is looked for (agents export every second).
_HISTOGRAM_LOOKBACK_MS = 5 * 60_000


def _launches(hs: list[FloatHistogram], base: FloatHistogram | None) -> FloatHistogram | None:
    """What cumulative histograms ``hs`` (in time order) add to ``base``: a counter reset (an agent
    restart) ends one run and starts the next from zero, as PromQL's ``increase`` treats it."""
    total: FloatHistogram | None = None
    start, prev = base, base
    for h in hs:
        if prev is not None and h.detect_reset(prev):
            run = prev if start is None else prev.sub(start).histogram
            total = run if total is None else total.add(run).histogram
            start = None
        prev = h
    if prev is None or prev is base:
        return total
    run = prev if start is None else prev.sub(start).histogram
    return run if total is None else total.add(run).histogram


def kernel_histograms(store: Store, window: SpanWindow) -> dict[str, FloatHistogram]:
    """Each kernel's launches in the window, from its native histograms (``kernel_duration_seconds``
    of the window's GPU, summed over pid and stream): the histograms' growth between the last export
    at or before the window's start and the last one before its end. Empty when the agent ships no
    histograms (wire body v1) or a filter histograms cannot apply (stream, minimum duration)."""
    if window.stream is not None or window.min_duration_ns:
        return {}
    matchers = [
        Matcher("__name__", "=", KERNEL_HISTOGRAM_METRIC),
        Matcher("instance", "=", window.instance),
        Matcher("gpu", "=", str(window.gpu)),
    ]
    if window.kernel is not None:
        matchers.append(Matcher("kernel", "=~", window.kernel))
    matchers += [Matcher(name, "=", value) for name, value in window.holder().items()]
    start_ms, end_ms = window.start_ns // 1_000_000, -(-window.end_ns // 1_000_000)
    out: dict[str, FloatHistogram] = {}
    for series in store.storage().select(matchers, start_ms - _HISTOGRAM_LOOKBACK_MS, end_ms):
        ts = np.asarray(series.hist_timestamps)
        first = int(np.searchsorted(ts, start_ms, side="right"))  # exports after the window began
        last = int(np.searchsorted(ts, end_ms, side="left"))  # ... and before it ended
        live = [h for h in series.histograms[first:last] if not is_stale_value(h.sum)]
        base = series.histograms[first - 1] if first > 0 else None
        if base is not None and is_stale_value(base.sum):
            base = None
        grown = _launches(live, base)
        if grown is None or grown.count <= 0:
            continue
        kernel = dict(series.labels).get("kernel", "")
        have = out.get(kernel)
        out[kernel] = grown if have is None else have.add(grown).histogram
    return out


def _highest_bound(h: FloatHistogram) -> float:
    """The upper bound of the histogram's highest populated bucket (a bound on its largest value)."""
    top = max(
        (b.upper for b in h.buckets() if b.count > 0), default=h.zero_threshold if h.zero_count else 0.0
    )
    return top if math.isfinite(top) else 0.0


def summarize(store: Store, window: SpanWindow, kernels: int, slowest: int) -> dict[str, Any]:
    """Per kernel: count, total and share of GPU time, p50/p90/p99/max, and its slowest spans.

    Each kernel's figures come from one source: its native histograms where they grew in the
    window (``source: histograms``, every launch; see :func:`kernel_histograms`), else its kept
    spans (``source: spans``). An agent can ship histograms for some kernels only (a full
    histogram table refuses new keys, a window shorter than the export interval), so the sources
    can differ from kernel to kernel: ``total_ns`` is then the sum of every kernel's total from
    its own source, listed or not, and ``share`` (a kernel's part of the GPU's kernel time) is in
    [0, 1] and adds up to 1 over all the window's kernels. Streams overlap, so the sum of
    durations can exceed the window; ``busy_ratio`` compares it to the window.

    Two reads: the aggregates, the window's totals (window functions over the groups) and each
    kernel's ``slowest`` longest durations (``groupArraySorted`` of one number, cheap); then the
    rows of the listed kernels at or above their threshold, ``LIMIT ... BY kernel``.
    Sorting whole rows per group in the first pass cost 4-6x as much over a 1M-span capture.
    """
    keep = max(1, int(slowest))
    hists = kernel_histograms(store, window)
    # Without histograms the first `kernels` by span time are the answer. With them a kernel is
    # ranked by its histograms' total, which its kept spans can be far below, and the GPU's kernel
    # time must leave those spans out: every kernel's row is read then. ClickHouse aggregates every
    # group before a LIMIT anyway, so this costs their transfer only, where handing it the
    # histograms' kernels (thousands of names, as a URL parameter to a server) could fail.
    rows = kernel_aggregate_rows(store, window, keep, None if hists else int(kernels))
    listed: dict[str, dict[str, Any]] = {}
    for r in rows:
        q = [float(x) for x in r["q"]]
        listed[r["kernel"]] = {
            "kernel": r["kernel"],
            "count": int(r["n"]),
            "total_ns": int(r["total"]),
            "p50_ns": q[0],
            "p90_ns": q[1],
            "p99_ns": q[2],
            "max_ns": int(r["mx"]),
            "source": "spans",
            "slowest": [],
        }
    # Where the agent ships native histograms it keeps only some spans (the tail and a sample):
    # count, time and quantiles then come from the histograms, which saw every launch; the slowest
    # spans (kept: they are the tail) and the max stay the spans'.
    hist_totals = {name: round(h.sum * 1e9) for name, h in hists.items()}
    for name, h in hists.items():
        k = listed.setdefault(name, {"kernel": name, "max_ns": int(_highest_bound(h) * 1e9), "slowest": []})
        k.update(
            count=round(h.count),
            total_ns=hist_totals[name],
            p50_ns=histogram_quantile(0.5, h)[0] * 1e9,
            p90_ns=histogram_quantile(0.9, h)[0] * 1e9,
            p99_ns=histogram_quantile(0.99, h)[0] * 1e9,
            source="histograms",
        )
    out = sorted(listed.values(), key=lambda k: (-k["total_ns"], k["kernel"]))[: int(kernels)]
    # The GPU's kernel time is what the rows count, each kernel once from its own source: every
    # kept span but those of the histograms' kernels (all their rows are read), plus those
    # kernels' histograms.
    spans_total = int(rows[0]["all_total"]) if rows else 0
    in_hists = sum(int(r["total"]) for r in rows if r["kernel"] in hists)
    total_ns = spans_total - in_hists + sum(hist_totals.values())
    for k in out:
        k["share"] = k["total_ns"] / total_ns if total_ns else 0.0
    floors = {r["kernel"]: -int(r["top"][-1]) for r in rows}  # each kernel's slowest-th longest duration
    names = [k["kernel"] for k in out if k["kernel"] in floors]
    if names and slowest > 0:
        for t in slowest_span_rows(store, window, names, [floors[n] for n in names], slowest):
            listed[t["kernel"]]["slowest"].append(_span(t))
    return {
        "span_count": int(rows[0]["all_n"]) if rows else 0,
        "total_ns": total_ns,
        "busy_ratio": total_ns / (window.end_ns - window.start_ns),
        "kernels": out,
    }


def read_events(store: Store, window: SpanWindow, limit: int) -> list[dict[str, Any]]:
    """The GPU's events (errors, OOM, XID...) in the window, oldest first."""
    return [
        {
            "ts_ns": int(r["ts_ns"]),
            "kind": r["kind"],
            "code": int(r["code"]),
            "aux": int(r["aux"]),
            "pid": int(r["pid"]),
            "message": r["message"],
        }
        for r in event_rows(store, window, limit)
    ]


def read_counters(store: Store, window: SpanWindow) -> dict[str, list[tuple[int, float]]]:
    """NVML samples of the GPU in the window: short name -> [(ts_ms, value)] (:data:`COUNTER_METRICS`)."""
    storage = store.storage()
    start_ms = window.start_ns // 1_000_000
    end_ms = (window.end_ns - 1) // 1_000_000
    out: dict[str, list[tuple[int, float]]] = {}
    for metric, short in COUNTER_METRICS.items():
        matchers = [
            Matcher("__name__", "=", metric),
            Matcher("instance", "=", window.instance),
            Matcher("gpu", "=", str(window.gpu)),
        ]
        points: list[tuple[int, float]] = []
        for series in storage.select(matchers, start_ms, end_ms):
            points.extend(
                (int(t), float(v))
                for t, v in zip(series.timestamps, series.values, strict=True)
                if v == v  # stale markers are NaN
            )
        points.sort()
        out[short] = points
    return out


#: What each ``gpu_calls`` track lists in a view: the columns of its rows besides ``ts_ns``/``op``.
_CALL_FIELDS: dict[str, tuple[str, ...]] = {
    "nccl": ("duration_ns", "bytes", "handle", "rank", "nranks", "failed"),
    "memory": ("bytes", "handle", "pid", "tid", "status", "failed"),
    "sync": ("duration_ns", "handle", "pid", "tid"),
}


def read_calls(store: Store, window: SpanWindow, track: str, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """One track of the GPU's ``gpu_calls`` (``nccl``, ``memory`` or ``sync``) in the window, oldest
    first: at most ``limit`` calls, and whether the window holds more.

    ``handle`` is the communicator (nccl), the address (memory) or the stream/event handle (sync);
    syncs are the ones the collector kept (every long wait and a sample of the short ones,
    docs/storage.md). The read stays on the table's ``(instance, gpu, start)`` key.
    """
    fields = _CALL_FIELDS.get(track)
    if fields is None:
        raise SpanQueryError(f"unknown call track {track!r}: one of {', '.join(_CALL_FIELDS)}")
    rows = call_rows(store, window, track, fields, int(limit) + 1)
    out = [
        {"ts_ns": int(r["ts_ns"]), "op": r["op"], **{f: _call_value(f, r[f]) for f in fields}}
        for r in rows[:limit]
    ]
    return out, len(rows) > limit


def _call_value(name: str, value: Any) -> Any:
    return bool(value) if name == "failed" else int(value)
