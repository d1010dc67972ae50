"""The collector's own metrics, served as Prometheus text at ``GET /metrics`` (docs/metrics.md).

One :class:`CollectorMetrics` per app holds every family on its own registry (two apps in
one process never mix their figures); the composition root hands it to each stage, which
records into its attributes. Values that cost a query (parts per table) are refreshed in
the background and only read by a scrape.

Example::

    metrics = CollectorMetrics()
    metrics.ingest_batches.labels(outcome="stored").inc()
    text = metrics.exposition()[0]
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel_insight.collector.batcher import FLUSH_ROWS_BOUNDS, INSERT_SECONDS_BOUNDS, Batcher
from kernel_insight.collector.defaults import DEFAULT_STORE_STATS_INTERVAL_S
from kernel_insight.collector.derive import (
    AGENT_COUNTERS,
    DROP_REASONS,
    DROP_STATS,
    DropStats,
    scale_agent_counter,
)
from kernel_insight.collector.head import Head
from kernel_insight.collector.hist_base import BaseBudget
from kernel_insight.collector.periodic import Periodic
from kernel_insight.collector.relabel import Relabeler

__all__ = [
    "DEFAULT_AGENT_TTL_S",
    "DEFAULT_STORE_STATS_INTERVAL_S",
    "AgentStates",
    "CollectorMetrics",
    "RelabelFigures",
    "RequestMetrics",
    "StoreStats",
]

log = logging.getLogger(__name__)

#: An agent that sent nothing for this long leaves /metrics (a fleet's churn must not grow it forever).
DEFAULT_AGENT_TTL_S = 15 * 60.0

#: Seconds: from a 304 of the health snapshot (the fastest answer) to a slow kql range query.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Rows per insert or flush: one agent batch (tens) to a large import chunk (millions).
ROWS_BUCKETS = (1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0, 10_000_000.0)


@dataclass(slots=True)
class _AgentState:
    received_s: float
    lag_s: float
    counters: dict[str, float]


class AgentStates(Collector):
    """Per agent: when its newest batch arrived, how late that batch was, and the counters it carried.

    An agent's counters (docs/wire.md, COUNTERS) are exported under the names of the stored
    ``ki_agent_*`` series, labelled ``agent`` (the agent id, the ``instance`` of the stored
    series; ``instance`` itself is the label Prometheus gives the scrape target).
    """

    def __init__(self, ttl_s: float = DEFAULT_AGENT_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._agents: dict[str, _AgentState] = {}
        #: Each agent's exposition lines by metric name, rendered when its batch arrives: a scrape
        #: of a thousand agents then joins bytes instead of formatting 30,000 samples (``make
        #: bench-metrics``, bench/results/metrics.md).
        self._lines: dict[str, dict[str, bytes]] = {}
        self._headers: dict[str, bytes] = {
            _LAG: _header(_LAG, _LAG_HELP, "gauge"),
            _SEEN: _header(_SEEN, _SEEN_HELP, "gauge"),
        }

    def observe(self, agent: str, t_max_ns: int, counters: Mapping[str, float], received_s: float) -> None:
        """One stored batch: ``t_max_ns`` is its newest record's (producer) time, ``counters`` by name."""
        lag = max(0.0, received_s - t_max_ns / 1e9)
        with self._lock:
            state = self._agents.get(agent)
            if state is None or received_s >= state.received_s:
                merged = dict(state.counters) if state is not None else {}
                merged.update(counters)
                state = self._agents[agent] = _AgentState(received_s, lag, merged)
                self._lines[agent] = self._render(agent, state)

    def _render(self, agent: str, state: _AgentState) -> dict[str, bytes]:
        label = '{agent="' + _escape(agent) + '"} '
        lines = {
            _LAG: f"{_LAG}{label}{_num(state.lag_s)}\n".encode(),
            _SEEN: f"{_SEEN}{label}{_num(state.received_s)}\n".encode(),
        }
        for counter, value in state.counters.items():
            name, kind, scale = _agent_metric(counter, AGENT_COUNTERS)
            if name not in self._headers:
                self._headers[name] = _header(name, _counter_help(counter), kind)
            lines[name] = f"{name}{label}{_num(scale_agent_counter(value, scale))}\n".encode()
        return lines

    def _expire(self) -> list[str]:
        """Forget agents not heard for ``ttl_s``; the live ones, sorted (call with the lock held)."""
        now = self.clock()
        for agent in [a for a, s in self._agents.items() if now - s.received_s > self.ttl_s]:
            del self._agents[agent]
            del self._lines[agent]
        return sorted(self._agents)

    def render_text(self) -> bytes:
        """These metrics in the text format 0.0.4, one family after another (as the format requires)."""
        with self._lock:
            agents = self._expire()
            by_name: dict[str, list[bytes]] = {}
            for agent in agents:
                for name, line in self._lines[agent].items():
                    by_name.setdefault(name, []).append(line)
            headers = dict(self._headers)
        out = []
        for name in (_LAG, _SEEN, *sorted(n for n in by_name if n not in (_LAG, _SEEN))):
            out.append(headers[name])
            out.extend(by_name.get(name, ()))
        return b"".join(out)

    def lag_s(self, agent: str) -> float | None:
        with self._lock:
            state = self._agents.get(agent)
            return None if state is None else state.lag_s

    def collect(self) -> Iterable[Metric]:
        """The same figures as prometheus_client families (any registry or format can use them)."""
        with self._lock:
            agents = [(a, self._agents[a]) for a in self._expire()]
        lag = GaugeMetricFamily(_LAG, _LAG_HELP, labels=["agent"])
        seen = GaugeMetricFamily(_SEEN, _SEEN_HELP, labels=["agent"])
        for agent, state in agents:
            lag.add_metric([agent], state.lag_s)
            seen.add_metric([agent], state.received_s)
        yield lag
        yield seen
        specs = AGENT_COUNTERS
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for agent, state in agents:
            for counter, value in sorted(state.counters.items()):
                name, kind, scale = _agent_metric(counter, specs)
                family = families.get(name)
                if family is None:
                    help_text = _counter_help(counter)
                    family = families[name] = (
                        CounterMetricFamily(name.removesuffix("_total"), help_text, labels=["agent"])
                        if kind == "counter"
                        else GaugeMetricFamily(name, help_text, labels=["agent"])
                    )
                family.add_metric([agent], scale_agent_counter(value, scale))
        yield from families.values()


_LAG = "ki_collector_agent_ingest_lag_seconds"
_LAG_HELP = "Receive time of the agent's newest batch minus that batch's newest record time (t_max)"
_SEEN = "ki_collector_agent_last_batch_timestamp_seconds"
_SEEN_HELP = "When the collector stored the agent's newest batch (unix seconds, collector clock)"


def _counter_help(counter: str) -> str:
    return f"The agent's {counter} counter, as its newest batch carried it (docs/wire.md)"


def _num(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's formatting), so both renderings agree."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _header(name: str, help_text: str, kind: str) -> bytes:
    escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n".encode()


def _agent_metric(counter: str, specs: Mapping[str, tuple[str, str, float]]) -> tuple[str, str, float]:
    spec = specs.get(counter)
    if spec is not None:
        return spec
    safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in counter.lower())
    return f"ki_agent_{safe}", "gauge", 1.0


class _DroppedRecords(Collector):
    """Records derivation left out, by reason (docs/metrics.md, "Dropped records")."""

    def __init__(self, stats: DropStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "ki_collector_records_dropped",
            "Records left out at derivation because a field cannot be stored, by reason; the rest of the batch is stored",
            labels=["reason"],
        )
        counts = self.stats.snapshot()
        for reason in sorted(set(DROP_REASONS) | set(counts)):
            family.add_metric([reason], counts.get(reason, 0))
        yield family


class RelabelFigures(Collector):
    """What ``--relabel-config`` dropped (collector/relabel.py), read at scrape time."""

    def __init__(self, relabeler: Relabeler) -> None:
        self.relabeler = relabeler

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "ki_collector_relabel_dropped_samples",
            "Remote-written samples whose series a relabel rule dropped (keep/drop, or the metric name removed)",
            value=self.relabeler.dropped_samples,
        )


class _HistogramBaseFigures(Collector):
    """The histogram bases held for increments (collector/hist_base.py ``BaseBudget``), read at scrape time."""

    def __init__(self, budget: BaseBudget) -> None:
        self.budget = budget

    def collect(self) -> Iterable[Metric]:
        b = self.budget
        for name, help_text, value in (
            (
                "bytes",
                "Estimated bytes of the histogram bases held for agents' increments, all agents",
                b.bytes,
            ),
            ("limit_bytes", "The bound on those bytes (--histogram-base-mb)", b.max_bytes),
            ("series", "Histogram series whose bases are held", b.series),
        ):
            yield GaugeMetricFamily(f"ki_collector_increment_base_{name}", help_text, value=float(value))
        yield CounterMetricFamily(
            "ki_collector_increment_base_evictions",
            "Series whose bases were dropped (least recently used first) to keep the bound",
            value=float(b.evictions),
        )


class _HeadFigures(Collector):
    """The head's ``HeadStats`` (collector/head.py), read at scrape time."""

    def __init__(self, head: Head) -> None:
        self.head = head

    def collect(self) -> Iterable[Metric]:
        h = self.head.stats()
        for name, help_text, value in (
            ("series", "Series the head holds (postings and recent samples)", h.series),
            ("samples", "Float samples the head holds", h.samples),
            ("bytes", "Estimated bytes of the head's samples and series", h.bytes),
            ("limit_bytes", "The bound on those bytes (--head-mb)", self.head.max_bytes),
            ("blocks", "Sealed sample blocks in the head", h.blocks),
            ("ready", "1 once the head is loaded from ClickHouse and answers reads", int(h.ready)),
            (
                "coverage_start_seconds",
                "Samples at or after this time are all in the head (0: every sample ever written)",
                (h.coverage_start_ms or 0) / 1000,
            ),
        ):
            yield GaugeMetricFamily(f"ki_head_{name}", help_text, value=float(value))
        evicted = CounterMetricFamily(
            "ki_head_evicted_blocks",
            "Sample blocks dropped from the head: past --head-minutes (window) or past --head-mb (budget)",
            labels=["reason"],
        )
        evicted.add_metric(["window"], float(h.evicted_blocks - h.evicted_for_budget))
        evicted.add_metric(["budget"], float(h.evicted_for_budget))
        yield evicted
        yield CounterMetricFamily(
            "ki_head_late_samples",
            "Samples written with a time before the head's coverage (kept in ClickHouse only)",
            value=float(h.late_samples),
        )


class _BatcherFigures(Collector):
    """The group-commit batcher's ``BatcherStats`` (collector/batcher.py), read at scrape time."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    def collect(self) -> Iterable[Metric]:
        s = self.batcher.stats
        for name, help_text, value in (
            (
                "queue_batches",
                "Agent batches waiting for a flush, the one being written included",
                s.queue_batches,
            ),
            ("queue_rows", "Rows waiting for a flush", s.queue_rows),
            (
                "eager_senders",
                "remote_write connections seen sending lately: a group of theirs waits for each",
                s.eager_senders,
            ),
        ):
            gauge = GaugeMetricFamily(f"ki_collector_batcher_{name}", help_text)
            gauge.add_metric([], float(value))
            yield gauge
        for name, help_text, value in (
            ("flushes", "Groups written (a group split after a refusal counts once per part)", s.flushes),
            ("flushed_batches", "Agent batches written by flushes", s.flushed_batches),
            ("flushed_rows", "Rows written by flushes, all tables", s.flushed_rows),
            ("duplicates", "Batches found already stored at flush time (answered 409)", s.duplicates),
            ("retries", "Flush attempts that found the store unavailable and were retried", s.retries),
            ("refused_batches", "Batches the engine refused (answered with the error)", s.refused_batches),
            ("partial_batches", "Refused batches some of whose tables had landed", s.partial_batches),
            ("queue_full", "Batches refused with 503 because the queue held its row limit", s.queue_full),
            (
                "early_flushes",
                "Groups written before their delay: their senders had gone quiet or all waited on them",
                s.early_flushes,
            ),
            ("wal_files", "Write-ahead files written, one per group of agent batches", s.wal_files),
            ("wal_bytes", "Bytes of the write-ahead files written", s.wal_bytes),
        ):
            counter = CounterMetricFamily(f"ki_collector_batcher_{name}", help_text)
            counter.add_metric([], float(value))
            yield counter
        wal_cpu = CounterMetricFamily(
            "ki_collector_batcher_wal_cpu_seconds", "The flusher's CPU seconds writing write-ahead files"
        )
        wal_cpu.add_metric([], s.wal_cpu_seconds)
        yield wal_cpu
        yield _histogram(
            "ki_collector_batcher_flush_rows",
            "Rows in one flush (all tables of the group)",
            FLUSH_ROWS_BOUNDS,
            s.flush_rows_counts,
            float(s.flushed_rows),
        )
        yield _histogram(
            "ki_collector_batcher_flush_duration_seconds",
            "Time to write one group, every table's insert and the batches rows",
            INSERT_SECONDS_BOUNDS,
            s.insert_seconds_counts,
            s.insert_seconds_total,
        )


def _histogram(
    name: str, help_text: str, bounds: Sequence[float], counts: Sequence[int], total: float
) -> HistogramMetricFamily:
    """A histogram from per-bucket (not cumulative) counts, the last one for +Inf."""
    cumulative = list(itertools.accumulate(counts))
    buckets = [(_le(b), float(n)) for b, n in zip(bounds, cumulative, strict=False)]
    buckets.append(("+Inf", float(cumulative[-1] if cumulative else 0)))
    family = HistogramMetricFamily(name, help_text)
    family.add_metric([], buckets, total)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


class StoreStats(Collector):
    """Active parts, rows and bytes on disk per table, read from ``system.parts`` every ``interval_s``.

    A scrape only reads the last answer, so a slow or unreachable store never slows a scrape;
    ``start()``/``shutdown()`` follow the pipeline contract (shutdown safe without start, and twice).
    """

    def __init__(self, store: Any, interval_s: float = DEFAULT_STORE_STATS_INTERVAL_S) -> None:
        self.store = store
        self.interval_s = interval_s
        self.last_error: BaseException | None = None
        self._tables: list[dict[str, Any]] = []
        self._refreshed_s = 0.0
        self._background = Periodic(self.tick, lambda: self.interval_s, "ki-store-stats")

    def refresh(self) -> None:
        """Read the figures now (blocking)."""
        self._tables = self.store.table_stats()
        self._refreshed_s = time.time()

    def tick(self) -> bool:
        """One background iteration: read the figures, or log the failure and keep the last ones."""
        try:
            self.refresh()
        except Exception as exc:  # keep the last figures; the store may come back
            self.last_error = exc
            log.warning("store statistics for /metrics: %s", exc)
            return False
        self.last_error = None
        return True

    def start(self) -> None:
        self._background.start()

    def shutdown(self) -> None:
        self._background.shutdown()

    def collect(self) -> Iterable[Metric]:
        parts = GaugeMetricFamily(
            "ki_store_active_parts", "Active data parts of the table (system.parts)", labels=["table"]
        )
        rows = GaugeMetricFamily("ki_store_rows", "Rows in the table's active parts", labels=["table"])
        size = GaugeMetricFamily(
            "ki_store_disk_bytes", "Compressed bytes on disk of the table's active parts", labels=["table"]
        )
        for t in self._tables:
            parts.add_metric([t["table"]], float(t["parts"]))
            rows.add_metric([t["table"]], float(t["rows"] or 0))
            size.add_metric([t["table"]], float(t["bytes"] or 0))
        refreshed = GaugeMetricFamily(
            "ki_store_stats_timestamp_seconds",
            "When the ki_store_* figures were last read from the store (0: not yet)",
        )
        refreshed.add_metric([], self._refreshed_s)
        yield from (parts, rows, size, refreshed)


class CollectorMetrics:
    """Every metric family the collector exports; the stages record into these attributes.

    Families fed by a stage that is not in the running collector export no series (they are
    labelled), so an absent series means "not measured", never a fake zero.
    """

    def __init__(
        self,
        *,
        agent_ttl_s: float = DEFAULT_AGENT_TTL_S,
        clock: Callable[[], float] = time.time,
        process: bool = True,
        drop_stats: DropStats | None = None,
    ) -> None:
        # The *_created series prometheus_client adds by default are noise for Prometheus and cost a
        # series per child. This switch is process-wide; the collector owns its process.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # HTTP (the request middleware)
        self.http_requests = Counter(
            "ki_collector_http_requests",
            "HTTP requests answered, by endpoint (route template), method and status code",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "ki_collector_http_request_duration_seconds",
            "Time from request start to the end of the answer, by endpoint (route template)",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        #: (endpoint, method, status) -> the two children observe_request records into
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        # Agent ingest (the ingest router)
        self.ingest_batches = Counter(
            "ki_collector_ingest_batches",
            "Agent batches by outcome (stored, duplicate, rejected, unauthenticated, forbidden, unavailable, busy, failed)",
            ["outcome"],
            registry=r,
        )
        self.ingest_records = Counter(
            "ki_collector_ingest_records",
            "Records in agent batches by outcome (stored, or the reason the batch was not)",
            ["outcome"],
            registry=r,
        )
        # The store (every insert of every path: agent batches, remote_write, import)
        self.rows = Counter(
            "ki_collector_rows",
            "Rows handed to ClickHouse, by table and outcome (stored, failed)",
            ["table", "outcome"],
            registry=r,
        )
        self.insert_duration = Histogram(
            "ki_collector_insert_duration_seconds",
            "Time of one INSERT into ClickHouse, by table",
            ["table"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Derivation (collector/derive.py counts its drops in a DropStats; read at scrape time)
        r.register(_DroppedRecords(drop_stats if drop_stats is not None else DROP_STATS))
        # Agents (their counters as carried on the wire) and the store's parts
        self.agents = AgentStates(agent_ttl_s, clock)  # rendered apart: see exposition()
        self.store_stats: StoreStats | None = None
        if process:
            ProcessCollector(registry=r)

    def watch_store(self, store: Any, interval_s: float = DEFAULT_STORE_STATS_INTERVAL_S) -> StoreStats:
        """Export ``store``'s parts, rows and bytes per table (refreshed by ``StoreStats.start()``)."""
        if self.store_stats is not None:
            self.registry.unregister(self.store_stats)
        self.store_stats = StoreStats(store, interval_s)
        self.registry.register(self.store_stats)
        return self.store_stats

    def watch_histogram_bases(self, budget: BaseBudget) -> None:
        """Export the bytes and series of histogram bases held, their bound, and evictions."""
        self.registry.register(_HistogramBaseFigures(budget))

    def watch_head(self, head: Head) -> None:
        """Export the head's series, samples, bytes and bound, coverage and evictions."""
        self.registry.register(_HeadFigures(head))

    def watch_batcher(self, batcher: Batcher) -> None:
        """Export the group-commit batcher's figures (queue depth, flush sizes and times)."""
        self.registry.register(_BatcherFigures(batcher))

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        """One HTTP answer (RequestMetrics, and the query endpoints' path ahead of the middleware:
        api/app.py ``QueryFastPath``). The children of each label set are looked up once: their
        ``labels()`` validation was a noticeable share of a small query (``make bench-kql``)."""
        key = (endpoint, method if method in _METHODS else "other", status)
        children = self._request_children.get(key)
        if children is None:
            if len(self._request_children) >= _REQUEST_CHILDREN:
                self._request_children.clear()
            children = self._request_children[key] = (
                self.http_requests.labels(endpoint=key[0], method=key[1], status=str(status)),
                self.http_duration.labels(endpoint=endpoint),
            )
        children[0].inc()
        children[1].observe(seconds)

    def observe_insert(self, table: str, rows: int, seconds: float, ok: bool) -> None:
        """One INSERT: the store calls this for every table it writes (``Store.insert_observer``)."""
        self.rows.labels(table=table, outcome="stored" if ok else "failed").inc(rows)
        if ok:
            self.insert_duration.labels(table=table).observe(seconds)

    def register(self, collector: Collector) -> None:
        """Add a custom collector (for figures computed at scrape time from another stage's state)."""
        self.registry.register(collector)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) for a scrape, in the text format 0.0.4 whatever the scraper prefers:
        every Prometheus reads it, and the per-agent section is pre-rendered text (``AgentStates``)."""
        return generate_latest(self.registry) + self.agents.render_text(), CONTENT_TYPE_PLAIN_0_0_4


#: Methods counted under their own name; anything else (a client may send any token) is "other".
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: Label sets whose children CollectorMetrics.observe_request keeps (endpoints are route
#: templates, so they are few; the bound is for statuses and methods alike).
_REQUEST_CHILDREN = 1024


class RequestMetrics:
    """ASGI middleware: every HTTP answer counted by route template, method and status, and timed.

    The endpoint label is the matched route's template (``/v1/instances/{instance_id}``), never
    the raw path, and ``other`` when no route matched: label values stay bounded whatever
    clients send.
    """

    def __init__(self, app: ASGIApp, metrics: CollectorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception that escapes every handler ends as a 500 from the server

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            endpoint = str(getattr(route, "path", "")) or "other"
            self.metrics.observe_request(
                endpoint, scope.get("method", ""), status, time.perf_counter() - start
            )
