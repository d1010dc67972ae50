"""Reads of one GPU's window for timelines and trace exports: kernel spans, per-call rows, events.

collector/spans.py, trace.py and perfetto_trace.py call these. Every read is bounded by
``(instance, gpu, start)``, the sort key of ``kernel_spans`` and ``gpu_calls``, so a window reads
only its own granules whatever the table holds (docs/storage.md). The Chrome trace's span and
launch events are formatted here, in SQL: a 60 s window can hold a million spans, too many to
build as Python dicts in time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import Params, ns_time, qualified
from kernel_insight.kql.regex import anchored

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store
    from kernel_insight.collector.spans import SpanWindow

__all__ = [
    "call_rows",
    "event_rows",
    "kernel_aggregate_rows",
    "perfetto_span_columns",
    "slowest_span_rows",
    "span_page_rows",
    "span_where",
    "trace_head",
    "trace_launch_events",
    "trace_span_events",
]

_NS = "toUnixTimestamp64Nano"

_SPAN_COLUMNS = (
    f"stream, kernel, {_NS}(start) AS start_ns, {_NS}(end) AS end_ns, duration_ns, correlation, pid,"
    " launch_ns, launch_host_ns, tid, pod, namespace, container, nvtx_range"
)


def span_where(window: SpanWindow, p: Params) -> str:
    """The window's SQL condition (its values as parameters in ``p``): the sort-key prefix first,
    then the filters."""
    parts = [
        f"instance = {p(window.instance, 'String')}",
        f"gpu = {window.gpu}",
        f"start >= {ns_time(window.start_ns)}",
        f"start < {ns_time(window.end_ns)}",
    ]
    if window.stream is not None:
        parts.append(f"stream = {window.stream}")
    if window.kernel is not None:
        parts.append(f"match(kernel, {p(anchored(window.kernel), 'String')})")
    if window.min_duration_ns:
        parts.append(f"duration_ns >= {window.min_duration_ns}")
    for name, value in window.holder().items():
        parts.append(f"{name} = {p(value, 'String')}")
    return " AND ".join(parts)


def span_page_rows(
    store: Store, window: SpanWindow, limit: int, after: tuple[int, int, int] | None
) -> list[dict[str, Any]]:
    """Spans after ``after`` (start_ns, stream, correlation) in ``start`` order: at most ``limit + 1``
    and, when more follow, every span sharing the last one's start (unsorted within a start).

    Ordered by the ``start`` column alone, so ClickHouse reads the window's granules in key
    order and stops after the page: ordering by (start, stream, correlation) makes it read and
    sort the whole window (``make bench-timeline``, bench/results/timeline.md). The spans sharing
    the page's last start are then read by that start (the key).
    """
    table = qualified(store.database, "kernel_spans")
    p = Params()
    where = span_where(window, p)
    if after is not None:
        start_ns, stream, correlation = after
        at = ns_time(start_ns)
        where += (
            f" AND start >= {at} AND (start, stream, correlation) >"
            f" ({at}, toUInt64({int(stream)}), toUInt64({int(correlation)}))"
        )
    rows = store.query_rows(
        f"SELECT {_SPAN_COLUMNS} FROM {table} WHERE {where} ORDER BY start LIMIT {int(limit) + 1}", p
    )
    if len(rows) > limit:  # more follow: take every span of the last start, however many
        last = int(rows[-1]["start_ns"])
        rows = [r for r in rows if int(r["start_ns"]) < last]
        rows += store.query_rows(
            f"SELECT {_SPAN_COLUMNS} FROM {table} WHERE {where} AND start = {ns_time(last)}", p
        )
    return rows


def kernel_aggregate_rows(
    store: Store, window: SpanWindow, keep: int, limit: int | None
) -> list[dict[str, Any]]:
    """Per kernel, by span time (``total``) descending, the first ``limit`` (None: all): ``n``,
    ``total``, quantiles ``q`` (0.5, 0.9, 0.99), ``mx``, ``top`` (its ``keep`` longest durations,
    negated, ascending), and the window's ``all_total`` and ``all_n`` on every row.

    ``groupArraySorted`` of one number is cheap; sorting whole rows per group cost 4-6x as much
    over a 1M-span capture.
    """
    p = Params()
    cut = "" if limit is None else f" LIMIT {int(limit)}"
    return store.query_rows(
        "SELECT kernel, count() AS n, sum(duration_ns) AS total,"
        " quantiles(0.5, 0.9, 0.99)(duration_ns) AS q, max(duration_ns) AS mx,"
        f" groupArraySorted({int(keep)})(-toInt64(duration_ns)) AS top,"
        " sum(sum(duration_ns)) OVER () AS all_total, sum(count()) OVER () AS all_n"
        f" FROM {qualified(store.database, 'kernel_spans')} WHERE {span_where(window, p)}"
        f" GROUP BY kernel ORDER BY total DESC, kernel{cut}",
        p,
    )


def slowest_span_rows(
    store: Store, window: SpanWindow, names: Sequence[str], floors: Sequence[int], slowest: int
) -> list[dict[str, Any]]:
    """Each kernel of ``names``' ``slowest`` longest spans, those at or above its floor (``floors``,
    in the same order): ``LIMIT ... BY kernel``."""
    p = Params()
    where = span_where(window, p)
    return store.query_rows(
        f"SELECT {_SPAN_COLUMNS} FROM {qualified(store.database, 'kernel_spans')}"
        f" WHERE {where} AND kernel IN {p(list(names), 'Array(String)')}"
        f" AND duration_ns >= transform(toString(kernel), {p(list(names), 'Array(String)')},"
        f" {p(list(floors), 'Array(UInt64)')}, toUInt64(0))"
        f" ORDER BY kernel, duration_ns DESC, start, stream, correlation LIMIT {int(slowest)} BY kernel",
        p,
    )


def _gpu_window(window: SpanWindow, column: str, p: Params) -> str:
    """The SQL condition of rows of the window's GPU whose time ``column`` is in the window."""
    return (
        f"instance = {p(window.instance, 'String')} AND gpu = {window.gpu}"
        f" AND {column} >= {ns_time(window.start_ns)} AND {column} < {ns_time(window.end_ns)}"
    )


def event_rows(store: Store, window: SpanWindow, limit: int) -> list[dict[str, Any]]:
    """The GPU's events in the window (``ts`` as ``ts_ns``), oldest first."""
    p = Params()
    return store.query_rows(
        f"SELECT {_NS}(ts) AS ts_ns, kind, code, aux, pid, message FROM {qualified(store.database, 'events')}"
        f" WHERE {_gpu_window(window, 'ts', p)} ORDER BY ts_ns LIMIT {int(limit)}",
        p,
    )


def call_rows(
    store: Store, window: SpanWindow, track: str, fields: Sequence[str], limit: int
) -> list[dict[str, Any]]:
    """One track of the GPU's ``gpu_calls`` in the window, oldest first: ``ts_ns``, ``op`` and
    ``fields`` (column names of the table), at most ``limit`` rows."""
    p = Params()
    return store.query_rows(
        f"SELECT {_NS}(start) AS ts_ns, op, {', '.join(fields)} FROM {qualified(store.database, 'gpu_calls')}"
        f" WHERE {_gpu_window(window, 'start', p)} AND track = {p(track, 'String')}"
        f" ORDER BY start LIMIT {int(limit)}",
        p,
    )


def perfetto_span_columns(store: Store, window: SpanWindow, limit: int) -> dict[str, list[Any]]:
    """The window's spans by column, in (start, stream) order, at most ``limit``; ``s`` is the start
    in ns and ``d`` the duration."""
    p = Params()
    columns: dict[str, list[Any]] = store.query(
        "SELECT stream, kernel, toUnixTimestamp64Nano(start) AS s, duration_ns AS d, correlation, pid,"
        " launch_ns, launch_host_ns, tid, pod, namespace, container, nvtx_range"
        f" FROM {qualified(store.database, 'kernel_spans')} WHERE {span_where(window, p)}"
        f" ORDER BY start, stream LIMIT {int(limit)}",
        p,
    ).to_pydict()
    return columns


def _us(ns: str) -> str:
    """SQL: nanoseconds (an Int64 expression) as microseconds with three decimals, as text."""
    return f"concat(toString(intDiv({ns}, 1000)), '.', leftPad(toString({ns} % 1000), 3, '0'))"


def trace_head(store: Store, window: SpanWindow) -> dict[str, Any]:
    """What a Chrome trace of the window needs first: its spans (``n``), ``streams``, how many have a
    host side (``launches``), the earliest launch (``first_launch``), the host ``threads`` (pid, tid)."""
    p = Params()
    spans, where = qualified(store.database, "kernel_spans"), span_where(window, p)
    return store.query_rows(
        "SELECT count() AS n, groupUniqArray(stream) AS streams, countIf(launch_ns != 0) AS launches,"
        " minIf(launch_ns, launch_ns != 0) AS first_launch,"
        " groupUniqArrayIf((pid, tid), launch_ns != 0) AS threads"
        f" FROM {spans} WHERE {where}",
        p,
    )[0]


def trace_span_events(store: Store, window: SpanWindow, origin: int, tids: dict[int, int]) -> bytes:
    """The window's spans as Chrome trace ``ph: "X"`` events (``ts`` from ``origin``; ``tids``:
    stream -> track id), each ending in a comma, back to back: RawBLOB, no Arrow encoding, decoding
    and joining of a result of a million strings that is only ever sent on (docs/api.md)."""
    p = Params()
    spans, where = qualified(store.database, "kernel_spans"), span_where(window, p)
    keys = ", ".join(str(s) for s in tids)
    values = ", ".join(str(t) for t in tids.values())
    start, dur = "toUnixTimestamp64Nano(start)", "toInt64(duration_ns)"
    rel = f"({start} - toInt64({origin}))"
    span_sql = (
        'SELECT concat(\'{"ph":"X","cat":"kernel","pid":\', toString(gpu),'
        f" ',\"tid\":', toString(transform(stream, [{keys}], [{values}], 0)),"
        f" ',\"ts\":', {_us(rel)}, ',\"dur\":', {_us(dur)},"
        " ',\"name\":', toJSONString(toString(kernel)),"
        # args: the exact absolute start; dur is exact to the ns already, the stream is the track's name
        f' \',"args":{{"start_ns":\', toString({start}),'
        " ',\"correlation\":', toString(correlation),"
        " ',\"pid\":', toString(pid),"
        # the Kubernetes pod that held the GPU, where one did
        " if(pod = '', '', concat(',\"pod\":', toJSONString(toString(pod)),"
        " ',\"namespace\":', toJSONString(toString(namespace)),"
        " ',\"container\":', toJSONString(toString(container)))),"
        # the NVTX range enclosing the launch (CUPTI probe), where one did
        " if(nvtx_range = '', '', concat(',\"nvtx_range\":', toJSONString(toString(nvtx_range)))), '}},') AS e"
        # No ORDER BY: the trace event format does not ask for time order (readers sort), and
        # reading in key order costs a third of this query over a 1M-span capture.
        f" FROM {spans} WHERE {where}"
    )
    return store.query_blob(span_sql, p)


def trace_launch_events(store: Store, window: SpanWindow, origin: int, tids: dict[int, int]) -> bytes:
    """The launch slice and flow of each span with a host side, as :func:`trace_span_events`."""
    p = Params()
    spans, where = qualified(store.database, "kernel_spans"), span_where(window, p)
    return store.query_blob(_launch_sql(spans, where, origin, tids), p)


def _launch_sql(spans: str, where: str, origin: int, tids: dict[int, int]) -> str:
    """Per span with a host side: its launch slice on the host thread and the flow to the kernel.

    The flow starts (``s``) where the launch slice starts and ends (``f``, ``bp: "e"``: bound to
    the enclosing slice) where the kernel starts, so both ends sit inside their slices.
    """
    keys = ", ".join(str(s) for s in tids)
    values = ", ".join(str(t) for t in tids.values())
    launch, start = "launch_ns", "toUnixTimestamp64Nano(start)"
    dur = "greatest(toInt64(launch_host_ns), 1)"
    lrel, krel = f"({launch} - toInt64({origin}))", f"({start} - toInt64({origin}))"
    host = "',\"pid\":', toString(pid), ',\"tid\":', toString(tid)"
    sql = (
        'SELECT concat(\'{"ph":"X","cat":"launch"\','
        f" {host}, ',\"ts\":', {_us(lrel)}, ',\"dur\":', {_us(dur)},"
        " ',\"name\":', toJSONString(toString(kernel)),"
        f' \',"args":{{"start_ns":\', toString({launch}),'
        ' \',"stream":"\', toString(stream), \'","correlation":\', toString(correlation),'
        ' \',"pid":\', toString(pid), \'}},{"ph":"s","cat":"launch","id":\', toString(n),'
        f" {host}, ',\"ts\":', {_us(lrel)}, ',\"name\":', toJSONString(toString(kernel)),"
        ' \'},{"ph":"f","bp":"e","cat":"launch","id":\', toString(n),'
        " ',\"pid\":', toString(gpu),"
        f" ',\"tid\":', toString(transform(stream, [{keys}], [{values}], 0)),"
        f" ',\"ts\":', {_us(krel)}, ',\"name\":', toJSONString(toString(kernel)), '}},') AS e"
        f" FROM (SELECT *, rowNumberInAllBlocks() + 1 AS n FROM (SELECT gpu, stream, kernel, start,"
        f" correlation, pid, tid, launch_ns, launch_host_ns FROM {spans} WHERE {where} AND launch_ns != 0"
        " ORDER BY start, stream))"
    )
    return sql
