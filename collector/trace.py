"""One GPU's window as a Chrome trace event JSON file, which Perfetto and chrome://tracing open.

Layout (docs/api.md, "Timeline export"): one process per GPU, one thread (track) per stream,
``ph: "X"`` complete events for spans (``ts``/``dur`` in microseconds with three decimals, so
nanoseconds survive; the exact absolute start again in ``args``), ``ph: "C"`` counters for memory and SM
utilisation, ``ph: "i"`` instant events for errors. A span whose host side the CUDA-event probe
recorded (ring flag LAUNCH_SPAN) also has its launch: a ``cat: "launch"`` slice on the host
process's thread and a flow (``ph: "s"`` there, ``ph: "f"`` bound to the kernel) from one to the
other. ``ts`` counts from the window's start, or from the earliest launch of its spans if that is
earlier (``otherData.origin_ns``): microseconds since 1970 with nanosecond decimals need 19 digits, more
than a double (what every JSON reader parses ``ts`` into) holds. The span events are formatted inside
ClickHouse: a 60 s window can hold a million spans, too many to build as Python dicts in time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kernel_insight.collector.clickhouse.timeline import trace_head, trace_launch_events, trace_span_events
from kernel_insight.collector.spans import SpanWindow, read_calls, read_counters, read_events

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "MAX_EXPORT_CALLS",
    "MAX_EXPORT_SPANS",
    "CallTracks",
    "TraceTooLarge",
    "call_tracks",
    "chrome_trace",
    "chrome_trace_parts",
    "stream_tids",
]

#: The most spans one export writes (about 200 MB of JSON); a larger window is refused, not cut.
MAX_EXPORT_SPANS = 2_000_000
#: Events (errors) per export.
MAX_EXPORT_EVENTS = 100_000
#: NCCL operations, and memory operations, per export (each); a larger window is refused, not cut.
MAX_EXPORT_CALLS = 200_000


class TraceTooLarge(ValueError):
    """The window holds more spans than :data:`MAX_EXPORT_SPANS`; the message says how many."""


@dataclass(frozen=True, slots=True)
class CallTracks:
    """The window's NCCL operations laid on tracks, and its memory operations (``gpu_calls``).

    ``nccl`` is one ``(track name, calls)`` per communicator, in communicator order; calls of
    one communicator that overlap (two threads, or an op issued before the last returned) go
    to a second track of it, ``"NCCL comm 0x.. (2)"``, so slices on a track never overlap
    (what Perfetto needs to stack them).
    """

    nccl: list[tuple[str, list[dict[str, Any]]]]
    memory: list[dict[str, Any]]
    syncs: list[tuple[str, list[dict[str, Any]]]]  # "syncs", and "syncs (2)"... where waits overlap


def call_tracks(store: Store, window: SpanWindow, *, max_calls: int = MAX_EXPORT_CALLS) -> CallTracks:
    """The window's NCCL, memory and (kept) sync calls for an export; TraceTooLarge past
    ``max_calls`` of any of them."""
    read = {}
    for track, what in (("nccl", "NCCL operations"), ("memory", "memory operations"), ("sync", "syncs")):
        rows, more = read_calls(store, window, track, max_calls)
        if more:
            raise TraceTooLarge(
                f"the window holds more than {max_calls} {what}, the most an export takes: narrow the window"
            )
        read[track] = rows
    nccl = [
        (f"NCCL comm {comm:#x}" + (f" ({n + 1})" if n else ""), calls)
        for comm, lanes in sorted(_lanes(read["nccl"], lambda c: int(c["handle"])).items())
        for n, calls in enumerate(lanes)
    ]
    syncs = [
        ("syncs" + (f" ({n + 1})" if n else ""), calls)
        for n, calls in enumerate(_lanes(read["sync"]).get(0, []))
    ]
    return CallTracks(nccl, read["memory"], syncs)


def _lanes(calls: list[dict[str, Any]], key: Any = lambda c: 0) -> dict[int, list[list[dict[str, Any]]]]:
    """Calls (oldest first) by ``key``, each group on as few tracks as keep its calls from overlapping:
    a call goes on the first track whose last call has ended."""
    out: dict[int, list[tuple[int, list[dict[str, Any]]]]] = {}
    for call in calls:
        end = call["ts_ns"] + call["duration_ns"]
        mine = out.setdefault(key(call), [])
        for n, (busy_until, rows) in enumerate(mine):
            if busy_until <= call["ts_ns"]:
                mine[n] = (end, rows)
                rows.append(call)
                break
        else:
            mine.append((end, [call]))
    return {k: [rows for _, rows in lanes] for k, lanes in out.items()}


def stream_tids(streams: list[int]) -> dict[int, int]:
    """Streams to small track ids (1, 2, ... in stream order): JSON readers hold numbers as doubles."""
    return {s: i + 1 for i, s in enumerate(sorted(streams))}


def chrome_trace(store: Store, window: SpanWindow, *, max_spans: int = MAX_EXPORT_SPANS) -> bytes:
    """The trace of ``window`` (its filters apply to spans only); raises TraceTooLarge past ``max_spans``."""
    return b"".join(chrome_trace_parts(store, window, max_spans=max_spans))


def chrome_trace_parts(
    store: Store, window: SpanWindow, *, max_spans: int = MAX_EXPORT_SPANS
) -> list[bytes | memoryview]:
    """:func:`chrome_trace` as the pieces that make it, in order, never joined: the span events
    are views of the buffers ClickHouse filled, so a 200 MB export is not copied three more
    times before it is sent (the API streams the pieces)."""
    head = trace_head(store, window)
    if int(head["n"]) > max_spans:
        raise TraceTooLarge(
            f"the window holds {head['n']} spans; an export takes at most {max_spans}: narrow the window or filter"
        )
    tids = stream_tids([int(s) for s in head["streams"]])
    pid = window.gpu
    launches = int(head["launches"])
    origin = min(window.start_ns, int(head["first_launch"])) if launches else window.start_ns
    meta: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"{window.instance} GPU {window.gpu}"},
        },
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "GPU"}},
    ]
    for stream, tid in tids.items():
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"stream {stream}"}}
        )
        meta.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    calls = call_tracks(store, window)
    call_tids: list[int] = []  # per NCCL track, the memory track, per syncs track: tids after the streams'
    names = (
        [name for name, _ in calls.nccl] + (["memory"] if calls.memory else []) + [n for n, _ in calls.syncs]
    )
    for n, name in enumerate(names):
        tid = len(tids) + 1 + n
        call_tids.append(tid)
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    threads = sorted((int(t["1"]), int(t["2"])) for t in head["threads"]) if launches else []
    for host_pid in sorted({hp for hp, _ in threads}):
        name = f"{window.instance} process {host_pid} (host)"
        meta.append({"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0, "args": {"name": name}})
    for host_pid, tid in threads:
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": host_pid, "tid": tid, "args": {"name": f"thread {tid}"}}
        )
    parts: list[bytes | memoryview] = [orjson.dumps(m) for m in meta]
    if tids:
        parts.extend(_pieces(trace_span_events(store, window, origin, tids)))
    if launches:
        parts.extend(_pieces(trace_launch_events(store, window, origin, tids)))
    parts.extend(_call_events(calls, call_tids, pid, origin))
    for ev in read_events(store, window, MAX_EXPORT_EVENTS):
        parts.append(
            orjson.dumps(
                {
                    "ph": "i",
                    "s": "p",
                    "cat": "error",
                    "pid": pid,
                    "tid": 0,
                    "ts": (ev["ts_ns"] - origin) / 1000,
                    "name": f"{ev['kind']} {ev['code']}",
                    "args": {
                        "ts_ns": ev["ts_ns"],
                        "message": ev["message"],
                        "pid": ev["pid"],
                        "aux": ev["aux"],
                    },
                }
            )
        )
    for name, points in read_counters(store, window).items():
        parts.extend(
            orjson.dumps(
                {
                    "ph": "C",
                    "pid": pid,
                    "tid": 0,
                    "name": name,
                    "ts": (ts_ms * 1_000_000 - origin) / 1000,
                    "args": {"value": v},
                }
            )
            for ts_ms, v in points
        )
    other = orjson.dumps({"origin_ns": str(origin), "instance": window.instance, "gpu": window.gpu})
    out: list[bytes | memoryview] = [b'{"displayTimeUnit":"ns","otherData":' + other + b',"traceEvents":[']
    for i, part in enumerate(parts):
        if i:
            out.append(b",")
        out.append(part)
    out.append(b"]}")
    return out


def _call_events(calls: CallTracks, tids: list[int], pid: int, origin: int) -> list[bytes]:
    """NCCL operations as ``cat: "nccl"`` slices on their communicator's track, memory operations
    as ``cat: "memory"`` thread-scoped instants on the memory track (they have no duration), syncs
    as ``cat: "sync"`` slices on the syncs track(s)."""
    out = []
    memory_tid = [tids[len(calls.nccl)]] if calls.memory else []
    sync_tids = tids[len(calls.nccl) + len(memory_tid) :]
    for tracks, track_tids, cat in ((calls.nccl, tids, "nccl"), (calls.syncs, sync_tids, "sync")):
        for (_, rows), tid in zip(tracks, track_tids, strict=False):
            for c in rows:
                args = {"start_ns": c["ts_ns"], "dur_ns": c["duration_ns"]}
                if cat == "nccl":
                    args.update(bytes=c["bytes"], comm=str(c["handle"]), rank=c["rank"], nranks=c["nranks"])
                    args["failed"] = c["failed"]
                else:
                    args.update(handle=str(c["handle"]), pid=c["pid"], tid=c["tid"])
                event = {"ph": "X", "cat": cat, "pid": pid, "tid": tid, "ts": (c["ts_ns"] - origin) / 1000}
                event.update(dur=c["duration_ns"] / 1000, name=c["op"], args=args)
                out.append(orjson.dumps(event))
    for tid in memory_tid:
        for c in calls.memory:
            args = {"ts_ns": c["ts_ns"], "bytes": c["bytes"], "address": str(c["handle"]), "pid": c["pid"]}
            args.update(tid=c["tid"], status=c["status"])
            event = {"ph": "i", "s": "t", "cat": "memory", "pid": pid, "tid": tid}
            event.update(ts=(c["ts_ns"] - origin) / 1000, name=f"{c['op']} {c['bytes']} B", args=args)
            out.append(orjson.dumps(event))
    return out


def _pieces(blob: bytes) -> list[memoryview]:
    """Events formatted in SQL, each ending in a comma, as one piece without the last comma: a
    view, so not copied again."""
    return [memoryview(blob)[:-1]] if blob else []
