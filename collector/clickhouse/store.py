"""The store: inserts and queries against ClickHouse, embedded (chDB) or a server (clickhouse-connect).

Both back ends share every SQL statement (:class:`Store`); they differ only in how a statement or
an Arrow table reaches the engine, each in its own module: ``embedded`` (:class:`EmbeddedStore`)
and ``server`` (:class:`ServerStore`), both also names of this one. The store's other parts,
each a module of this package: ``errors`` (what to catch: ``StorageError``, and
``StorageUnavailable``, retryable), ``arrow_rows`` (batches as the Arrow tables inserted),
``series_index`` (which series rows are written), ``known_metrics`` (the metrics with
histograms or start timestamps), ``ingest_groups`` (prepared batches written together, their
write-ahead files), ``schema_sync`` (tables brought to the schema), ``head_load`` (the head
filled from the tables).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse import head_load, ingest_groups
from kernel_insight.collector.clickhouse.arrow_rows import (
    calls_table,
    check_ns_range,
    concat,
    dense_codes,
    events_table,
    histograms_table,
    instances_table,
    samples_table,
    spans_table,
    start_metrics,
)
from kernel_insight.collector.clickhouse.errors import StorageUnavailable
from kernel_insight.collector.clickhouse.ingest_groups import GROUP_ORDER, PreparedRows, batches_rows
from kernel_insight.collector.clickhouse.known_metrics import KnownMetrics
from kernel_insight.collector.clickhouse.schema import Retention, table
from kernel_insight.collector.clickhouse.schema_sync import sync_schema
from kernel_insight.collector.clickhouse.series_index import SeriesIndex, SeriesKey
from kernel_insight.collector.clickhouse.sql import Params, ident, is_store_url, literal, qualified
from kernel_insight.collector.head import DEFAULT_HEAD_BYTES, DEFAULT_HEAD_WINDOW_MS, Head
from kernel_insight.collector.ingest_wal import IngestWal, WalGroup
from kernel_insight.collector.rows import (
    CallBatch,
    Event,
    HistogramBatch,
    InstanceInfo,
    SampleBatch,
    SpanBatch,
)
from kernel_insight.collector.sample_cache import DEFAULT_CACHE_BYTES, SampleCache
from kernel_insight.kql.errors import StorageError

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.embedded import EmbeddedStore
    from kernel_insight.collector.clickhouse.query import ClickHouseStorage
    from kernel_insight.collector.clickhouse.server import ServerStore

__all__ = [
    "EmbeddedStore",
    "ServerStore",
    "StorageError",
    "StorageUnavailable",
    "Store",
    "is_store_url",
    "open_store",
    "quote",
]

log = logging.getLogger(__name__)

_MS_PER_DAY = 86_400_000
#: How long an engine's answer to ``Store.ping`` stands (seconds).
PING_FRESH_S = 1.0


#: A ClickHouse string literal: ``sql.literal`` under its older name. Values belong in parameters.
quote = literal


class Store(ABC):
    """Typed inserts and SQL reads, identical across back ends.

    Example::

        with EmbeddedStore("./ki-data") as store:
            store.insert_batch("agent-1:42", samples=batch)
            print(store.query("SELECT count() FROM ki.samples"))
    """

    #: Table settings of this back end beyond the schema's, by table (in the DDL of new tables,
    #: added to existing ones at start with the merge settings).
    _table_settings: Mapping[str, Mapping[str, int]] = {}

    def __init__(
        self, database: str = "ki", retention: Retention | None = None, cluster: str | None = None
    ) -> None:
        for what, name in (("database", database), ("cluster", cluster or "ki")):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"invalid {what} name {name!r}")
        self.database = database
        self.cluster = cluster
        self.retention = retention or Retention()
        self._closed = False
        self._pinged_at = float("-inf")  # monotonic time of the last ping the engine answered
        self._series_index = SeriesIndex()
        #: Decoded past hours for kql reads (collector/sample_cache.py); exact only while every
        #: write to the samples table passes through this object, so off unless a subclass or
        #: the operator knows that.
        self.sample_cache: SampleCache | None = None
        #: Recent float samples and the series' postings in memory (collector/head.py); exact only
        #: while every write passes through this object, like the sample cache: the embedded store's.
        self.head: Head | None = None
        self._head_loader: threading.Thread | None = None
        #: fingerprint -> (labels, sort key) for kql reads, shared by every ``storage()`` (the
        #: API asks for one per request); a fingerprint names one label set forever.
        self.labels_cache: dict[int, Any] = {}
        #: (metric, other matchers) -> (the metric's fingerprints in the cached hours, matching
        #: series' labels, their fingerprints in label order) for kql reads served by the sample
        #: cache: a dashboard asks the same selector again and again over the same series.
        self.selection_cache: dict[Any, Any] = {}
        #: ``storage()`` by ``use_cache``: a ClickHouseStorage holds no state of its own (its caches
        #: are the store's), and making one per request was a cost on every small query.
        self._storages: dict[bool, Any] = {}
        #: Told of every INSERT: (table, rows, seconds, succeeded); the collector's /metrics
        #: (``CollectorMetrics.observe_insert``) counts rows by table and times inserts with it.
        self.insert_observer: Callable[[str, int, float, bool], None] | None = None
        #: Metric names the histograms table holds, and those with start timestamps (samples or
        #: histograms), when this process can know them all (an embedded store: one process owns
        #: it, ``_track_metrics``); else unknown, so reads look every time.
        self._histogram_metrics = KnownMetrics(f"SELECT DISTINCT metric FROM {self._table('histograms')}")
        self._start_timestamp_metrics = KnownMetrics(
            f"SELECT DISTINCT metric FROM {self._table('samples')} WHERE st != 0 UNION DISTINCT "
            f"SELECT DISTINCT metric FROM {self._table('histograms')} WHERE st != 0"
        )
        self._track_metrics = False
        #: Write-ahead files of ingest groups (collector/ingest_wal.py), once ``open_ingest_wal``
        #: replayed what an earlier process left; None: groups are written without them.
        self.ingest_wal: IngestWal | None = None
        #: The done set of each group whose write-ahead file is on disk (``log_group`` ..
        #: ``unlog_group``), read by backups; ``_group_step`` is held over a table's insert and
        #: its entry in that set.
        self._groups_logged: dict[Path, set[str]] = {}
        self._group_step = threading.Lock()

    # ---- back-end primitives -------------------------------------------------------

    @abstractmethod
    def _command(self, sql: str, params: Params | None = None) -> None: ...

    @abstractmethod
    def _query(self, sql: str, params: Params | None = None) -> pa.Table: ...

    @abstractmethod
    def _query_blob(self, sql: str, params: Params | None = None) -> bytes: ...

    @abstractmethod
    def _insert(self, name: str, data: pa.Table, token: str | None) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...

    def _write(self, name: str, data: pa.Table, token: str | None) -> None:
        """``_insert``, reported to ``insert_observer``: every write of every path passes here."""
        observer = self.insert_observer
        if observer is None:
            self._insert(name, data, token)
            return
        start = time.perf_counter()
        try:
            self._insert(name, data, token)
        except BaseException:
            observer(name, data.num_rows, time.perf_counter() - start, False)
            raise
        observer(name, data.num_rows, time.perf_counter() - start, True)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageUnavailable("the store is closed")

    # ---- schema ----------------------------------------------------------------------

    def create_schema(self) -> None:
        """Create missing tables and bring their TTLs to the configured retention.

        With ``cluster`` set, the replicated ``*_local`` tables and the Distributed tables over
        them are created ON CLUSTER (deploy/clickhouse/README.md); reads and writes are unchanged.
        """
        sync_schema(self, self._table_settings)

    def command(self, sql: str, params: Params | None = None) -> None:
        """Run a statement; ``params`` holds the values of its ``{name:Type}`` placeholders (collector/clickhouse/sql.py)."""
        self._check_open()
        try:
            self._command(sql, params)
        finally:
            # Any statement may have written histograms or start timestamps: read again.
            self._histogram_metrics.forget()
            self._start_timestamp_metrics.forget()
            if self.sample_cache is not None:
                self.sample_cache.clear()  # any statement may have changed samples
            if self.head is not None and self._table("samples") in sql:
                self.start_head_load()  # a statement on the samples table may have changed them

    def query(self, sql: str, params: Params | None = None) -> pa.Table:
        """Run a read and return its result as an Arrow table; ``params`` as for ``command``."""
        self._check_open()
        return self._query(sql, params)

    def query_rows(self, sql: str, params: Params | None = None) -> list[dict[str, Any]]:
        """:meth:`query`'s rows as dicts (column name -> value), for small results."""
        rows: list[dict[str, Any]] = self.query(sql, params).to_pylist()
        return rows

    def query_blob(self, sql: str, params: Params | None = None) -> bytes:
        """Run a read of one String column and return its values back to back, nothing between
        (ClickHouse's RawBLOB format): for output formatted in SQL, such as a trace export, with
        no Arrow encoding and decoding of a result that is only ever sent on."""
        self._check_open()
        return self._query_blob(sql, params)

    def ping(self) -> None:
        """Raises StorageUnavailable unless the engine answers.

        An answer within the last ``PING_FRESH_S`` stands: /healthz is polled by load balancers,
        kubelets and clients on kept-alive connections, and each ``SELECT 1`` queues behind the
        engine's own work (chDB's queries and merges on a busy host), which a health check should not
        wait for or add to. A closed store still fails at once; an engine that stops answering is
        seen within ``PING_FRESH_S``.
        """
        self._check_open()
        if time.monotonic() - self._pinged_at < PING_FRESH_S:
            return
        self.query("SELECT 1")
        self._pinged_at = time.monotonic()

    def storage(self, *, use_cache: bool = True) -> ClickHouseStorage:
        """The kql storage protocol over this store (``use_cache=False``: never through ``sample_cache``);
        one object for every caller (it is stateless and safe across threads)."""
        storage = self._storages.get(use_cache)
        if storage is None:
            from kernel_insight.collector.clickhouse.query import ClickHouseStorage

            storage = self._storages[use_cache] = ClickHouseStorage(self, use_cache=use_cache)
        return storage

    # ---- inserts ---------------------------------------------------------------------

    def _table(self, name: str) -> str:
        return qualified(self.database, name)

    def _sample_rows(
        self, batch: SampleBatch
    ) -> tuple[pa.Table, pa.Table | None, list[str], np.ndarray[Any, Any], list[SeriesKey]]:
        """The samples table of ``batch``, the series rows for (series, day) pairs not written yet,
        the metric names and per-sample codes (for the sample cache) and the new series keys."""
        if batch.series_meta is not None:
            # Known to the maker (remote_write's SeriesCache): no lookup per series here.
            fps, series_codes, all_names = batch.series_meta
            used, codes = dense_codes(series_codes, len(all_names))
            names = np.array([all_names[c] for c in used.tolist()], dtype=object)
            metric_of: Sequence[str] | npt.NDArray[np.object_] = names[codes]  # read for new series only
        else:
            meta = [self._series_index.fingerprint(s) for s in batch.series]
            fps = np.fromiter((m[0] for m in meta), dtype=np.uint64, count=len(meta))
            metric_of = [m[1] for m in meta]
            names, inverse = np.unique(metric_of, return_inverse=True)
            codes = inverse.astype(np.int32).reshape(-1)
        series, keys = self._series_index.rows(batch, fps, metric_of)
        sample_codes = codes[batch.series_idx]
        data = samples_table(batch, fps, sample_codes, names.tolist())
        return data, series, names.tolist(), sample_codes, keys

    def _histogram_rows(
        self, batch: HistogramBatch
    ) -> tuple[pa.Table, pa.Table | None, list[str], list[SeriesKey]]:
        """The histograms table of ``batch``, its new series rows, its metric names and new series keys.

        The same series model as samples: one fingerprint per label set, series rows for
        (series, day) pairs not written yet, so selectors and label APIs find histogram series
        through the one series table.
        """
        meta = [self._series_index.fingerprint(s) for s in batch.series]
        fps = np.fromiter((m[0] for m in meta), dtype=np.uint64, count=len(meta))
        series, keys = self._series_index.rows(batch, fps, [m[1] for m in meta])
        names, codes = np.unique([m[1] for m in meta], return_inverse=True)
        data = histograms_table(batch, fps, codes.astype(np.int32), names.tolist())
        return data, series, names.tolist(), keys

    def insert_histograms(self, batch: HistogramBatch, *, dedup_token: str | None = None) -> int:
        """Insert native histogram samples and any series rows not yet written today; returns the count."""
        self._check_open()
        if len(batch) == 0:
            return 0
        data, series, names, keys = self._histogram_rows(batch)
        if series is not None:
            self._write("series", series, None if dedup_token is None else f"{dedup_token}:series")
            self._series_index.mark(keys)
        # Before the write: a reader must not miss rows that landed.
        self._histogram_metrics.note(names)
        self._start_timestamp_metrics.note(start_metrics(batch))
        self._write("histograms", data, None if dedup_token is None else f"{dedup_token}:histograms")
        return len(batch)

    def histogram_metrics(self) -> frozenset[str] | None:
        """The metric names that have native histogram samples, or None when this store cannot know
        them without asking (a server other collectors write to): then every read looks.

        Exact for a store whose writes all pass through this object (the embedded store): the
        table's metrics read once (again after any raw statement), plus every metric this
        process writes, noted before its write. Selectors of float-only metrics then never read
        the histograms table (docs/storage.md).
        """
        return self._histogram_metrics.get(self.query) if self._track_metrics else None

    def start_timestamp_metrics(self) -> frozenset[str] | None:
        """The metric names some of whose samples or histograms have a start timestamp, or None
        when this store cannot know them without asking; exact as :meth:`histogram_metrics` is.
        kql reads the ``st`` columns of these metrics only (docs/storage.md, "Start timestamps")."""
        return self._start_timestamp_metrics.get(self.query) if self._track_metrics else None

    def start_timestamp_metrics_seen(self) -> frozenset[str]:
        """The metrics this process has seen start timestamps of: written through this object, or
        found by kql's reads (:meth:`saw_start_timestamps`). On a server store, where
        :meth:`start_timestamp_metrics` is None, kql skips the grid pushdown of these at once
        instead of asking and then reading again (docs/storage.md, "Start timestamps")."""
        return self._start_timestamp_metrics.noted()

    def saw_start_timestamps(self, names: Iterable[str]) -> None:
        """Note metrics a read found start timestamps of (another collector wrote them)."""
        self._start_timestamp_metrics.note(names)

    def insert_samples(self, batch: SampleBatch, *, dedup_token: str | None = None) -> int:
        """Insert samples and any series rows not yet written today; returns the sample count."""
        self._check_open()
        if len(batch) == 0:
            return 0
        data, series, names, codes, keys = self._sample_rows(batch)
        if series is not None:
            self._write("series", series, None if dedup_token is None else f"{dedup_token}:series")
            self._series_index.mark(keys)
        self._start_timestamp_metrics.note(start_metrics(batch))  # before the write, as histogram metrics
        try:
            self._write("samples", data, None if dedup_token is None else f"{dedup_token}:samples")
        finally:
            if self.sample_cache is not None:  # after the write (or its failure), never before
                self.sample_cache.invalidate_samples(names, codes, batch.ts_ms)
        self._to_head(batch, data)  # after the write committed: what the head holds is acknowledged
        return len(batch)

    def _to_head(self, batch: SampleBatch, data: pa.Table) -> None:
        """Samples just written (``data``: their samples table rows) into the head, if there is one."""
        if self.head is None:
            return
        per_series = np.zeros(len(batch.series), np.uint64)  # series without samples are never read
        per_series[batch.series_idx] = data.column("fingerprint").to_numpy()
        self.head.append(batch.series, per_series, batch.series_idx, batch.ts_ms, batch.values)

    # ---- the head (collector/head.py) -------------------------------------------------

    def enable_head(
        self, max_bytes: int = DEFAULT_HEAD_BYTES, window_ms: int = DEFAULT_HEAD_WINDOW_MS
    ) -> None:
        """Keep recent samples and postings in memory for kql (only for a store every write passes
        through); filled from the samples table in the background, queries use it once loaded."""
        self.head = Head(window_ms=window_ms, max_bytes=max_bytes, ready=False)
        self.start_head_load()

    def start_head_load(self) -> None:
        """(Re)build the head from ClickHouse on a thread: reads go to ClickHouse until it is done."""
        head = self.head
        if head is None:
            return
        now = int(time.time() * 1000)
        first = now - head.window_ms
        try:
            first = head_load.load_start(self._query, self.database, first, head.max_bytes)
            coverage = first if head_load.samples_before(self._query, self.database, first) else None
        except Exception:  # the head stays unloaded: every read goes to ClickHouse, still exact
            head.reset(None)
            log.exception("head: cannot size the load from ClickHouse; kql reads go to ClickHouse")
            return
        head.reset(coverage)
        generation = head.generation
        thread = threading.Thread(
            target=head_load.load,
            args=(self._query, self.database, head, generation, first),
            name="ki-head-load",
            daemon=True,
        )
        self._head_loader = thread
        thread.start()

    def insert_spans(self, spans: SpanBatch, *, dedup_token: str | None = None) -> int:
        self._check_open()
        if len(spans) == 0:
            return 0
        self._write(
            "kernel_spans",
            spans_table(spans),
            None if dedup_token is None else f"{dedup_token}:kernel_spans",
        )
        return len(spans)

    def insert_calls(self, calls: CallBatch, *, dedup_token: str | None = None) -> int:
        """Write NCCL, memory and sync calls (``gpu_calls``); the collector writes them with a batch."""
        self._check_open()
        if len(calls) == 0:
            return 0
        check_ns_range(calls.start_ns, "call start")
        self._write(
            "gpu_calls", calls_table(calls), None if dedup_token is None else f"{dedup_token}:gpu_calls"
        )
        return len(calls)

    def insert_events(self, events: Sequence[Event], *, dedup_token: str | None = None) -> int:
        self._check_open()
        if not events:
            return 0
        self._write("events", events_table(events), None if dedup_token is None else f"{dedup_token}:events")
        return len(events)

    def upsert_instances(self, instances: Sequence[InstanceInfo], *, dedup_token: str | None = None) -> int:
        """Write instance rows; ReplacingMergeTree keeps the newest per id, ``FINAL`` reads see only that."""
        self._check_open()
        if not instances:
            return 0
        self._write(
            "instances",
            instances_table(instances),
            None if dedup_token is None else f"{dedup_token}:instances",
        )
        return len(instances)

    def insert_table(self, name: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        """Insert an Arrow table into one of this store's tables (as Arrow, never as SQL text,
        so values such as keys cannot appear in a statement or an engine error); a second
        insert under the same ``dedup_token`` is dropped (the rule lease relies on it)."""
        self._check_open()
        try:
            self._write(name, data, dedup_token)
        finally:
            if name == "histograms":
                self._histogram_metrics.forget()
            if name in ("samples", "histograms"):
                self._start_timestamp_metrics.forget()
            if name == "samples" and self.sample_cache is not None:
                self.sample_cache.clear()
            if name == "samples" and self.head is not None:
                self.start_head_load()

    def batches_seen(self, batch_ids: Sequence[str]) -> set[str]:
        """Which of ``batch_ids`` the batches table already records (one query for any number)."""
        if not batch_ids:
            return set()
        p = Params()
        result = self.query(
            f"SELECT DISTINCT batch_id FROM {self._table('batches')} "
            f"WHERE batch_id IN {p(list(batch_ids), 'Array(String)')}",
            p,
        )
        return {str(b) for b in result.column("batch_id").to_pylist()}

    def batch_seen(self, batch_id: str) -> bool:
        return batch_id in self.batches_seen([batch_id])

    def prepare(
        self,
        batch_id: str,
        *,
        agent_id: str = "",
        samples: SampleBatch | None = None,
        spans: SpanBatch | None = None,
        events: Sequence[Event] = (),
        instances: Sequence[InstanceInfo] = (),
        histograms: HistogramBatch | None = None,
        calls: CallBatch | None = None,
        record: bool = True,
    ) -> PreparedRows:
        """One batch's rows as Arrow tables: every conversion (and so every refusal of a value the
        schema cannot hold, as ValueError / OverflowError) happens here, before anything is written.

        ``record=False``: a batch id nobody sends twice, kept out of the ``batches`` table
        (``PreparedRows.record``)."""
        if not batch_id:
            raise ValueError("batch_id must not be empty")
        self._check_open()
        out = PreparedRows(batch_id, agent_id, record=record)
        if samples is not None and len(samples):
            data, series, out.metric_names, out.metric_codes, out.series_keys = self._sample_rows(samples)
            out.start_timestamp_metrics = start_metrics(samples)
            out.ts_ms = samples.ts_ms
            out.tables["samples"] = data
            out.samples = samples
            if series is not None:
                out.tables["series"] = series
            out.rows += len(samples)
        if histograms is not None and len(histograms):
            data, series, out.histogram_metrics, keys = self._histogram_rows(histograms)
            out.start_timestamp_metrics = [*out.start_timestamp_metrics, *start_metrics(histograms)]
            out.tables["histograms"] = data
            if series is not None:
                have = out.tables.get("series")
                out.tables["series"] = series if have is None else concat([have, series])
                out.series_keys = [*out.series_keys, *keys]
            out.rows += len(histograms)
        if spans is not None and len(spans):
            check_ns_range(spans.start_ns, "span start")
            check_ns_range(spans.end_ns, "span end")
            out.tables["kernel_spans"] = spans_table(spans)
            out.rows += len(spans)
        if calls is not None and len(calls):
            check_ns_range(calls.start_ns, "call start")
            out.tables["gpu_calls"] = calls_table(calls)
            out.rows += len(calls)
        if events:
            check_ns_range(np.fromiter((e.ts_ns for e in events), np.int64, len(events)), "event time")
            out.tables["events"] = events_table(events)
            out.rows += len(events)
        if instances:
            out.tables["instances"] = instances_table(instances)
            out.rows += len(instances)
        return out

    def insert_prepared(
        self, group: Sequence[PreparedRows], token: str, done: set[str] | None = None
    ) -> None:
        """Write a group of prepared batches together: one insert per table, then the ``batches``
        rows of those with ``record`` set.

        Table ``t`` is inserted with the dedup token ``<token>:<t>`` and then added to ``done``;
        tables already in ``done`` are skipped. So a failed call retried with the same group,
        token and ``done`` set writes each row exactly once: what landed is neither sent again nor,
        should it be sent again, stored twice (the engine drops a repeated token).
        """
        if not token:
            raise ValueError("token must not be empty")
        self._check_open()
        done = set() if done is None else done
        # Before any write: a reader must not miss start timestamps that landed.
        self._start_timestamp_metrics.note([m for p in group for m in p.start_timestamp_metrics])
        for name in GROUP_ORDER:
            if name in done:
                continue
            # A table's insert and its place in ``done`` at once: a backup (``writes_held``) reads
            # what a group has left to write (``ingest_groups_in_flight``) between the two never.
            with self._group_step:
                parts = [p.tables[name] for p in group if name in p.tables]
                if not parts:
                    done.add(name)
                    continue
                if name == "series":
                    data, keys = self._new_series(parts, group)
                    if data is not None:
                        self._write("series", data, f"{token}:series")
                    self._series_index.mark(keys)
                elif name == "samples":
                    try:
                        self._write("samples", concat(parts), f"{token}:samples")
                    finally:
                        if self.sample_cache is not None:  # after the write (or its failure), never before
                            for p in group:
                                if p.ts_ms is not None and p.metric_codes is not None:
                                    self.sample_cache.invalidate_samples(
                                        p.metric_names, p.metric_codes, p.ts_ms
                                    )
                    for p in group:  # after the write committed: what the head holds is acknowledged
                        if p.samples is not None and "samples" in p.tables:
                            self._to_head(p.samples, p.tables["samples"])
                else:
                    if name == "histograms":  # before the write: a reader must not miss rows that landed
                        self._histogram_metrics.note([m for p in group for m in p.histogram_metrics])
                    self._write(name, concat(parts), f"{token}:{name}")
                done.add(name)
            if name == ingest_groups.TEST_KILL_AFTER_TABLE and sum(p.record for p in group) > 1:
                os.kill(os.getpid(), signal.SIGKILL)
        recorded = [p for p in group if p.record]
        with self._group_step:
            if "batches" not in done and recorded:
                self._write("batches", batches_rows(recorded), f"{token}:batches")
            done.add("batches")

    # ---- the ingest write-ahead files (collector/ingest_wal.py) ------------------------

    def open_ingest_wal(self, directory: str | Path) -> int:
        """Replay the write-ahead files left in ``directory`` (``replay_ingest_wal``), then write a
        file for every group with recorded batches from now on (``log_group``); the number replayed.

        Call it before ingest is served: a replayed group's batches must be stored before an
        agent's retry of them asks."""
        try:
            wal = IngestWal(directory)
        except OSError as exc:
            raise StorageError(
                f"cannot use {directory} for the ingest write-ahead files: {exc} (ki collector --ingest-wal DIR)"
            ) from exc
        replayed = self.replay_ingest_wal(wal)
        self.ingest_wal = wal
        return replayed

    def log_group(self, group: Sequence[PreparedRows], token: str, done: set[str]) -> Path | None:
        """Write the group's tables not yet in ``done`` and its ``batches`` rows to a write-ahead
        file (before its first insert; ``unlog_group`` after its ``batches`` rows landed).

        None, and nothing written, without write-ahead files, for a group of no recorded batches
        (remote_write's: nothing to deduplicate) and once its ``batches`` rows landed. A file
        that cannot be written (a full disk) raises StorageUnavailable: the group is retried
        and its senders answered 503, and nothing of it was inserted."""
        wal = self.ingest_wal
        recorded = [p for p in group if p.record]
        if wal is None or not recorded or "batches" in done:
            return None
        tables = ingest_groups.wal_tables(group, done, lambda parts: self._new_series(parts, group)[0])
        try:
            path = wal.write(token, tables)
        except OSError as exc:
            raise StorageUnavailable(f"cannot write the ingest write-ahead file in {wal.dir}: {exc}") from exc
        with self._group_step:
            self._groups_logged[path] = done
        return path

    def unlog_group(self, path: Path | None) -> None:
        """Remove a group's write-ahead file (``log_group``) once its ``batches`` rows landed."""
        if path is not None and self.ingest_wal is not None:
            with self._group_step:
                self._groups_logged.pop(path, None)
            self.ingest_wal.remove(path)

    def ingest_groups_in_flight(self) -> list[WalGroup]:
        """Each group with a write-ahead file, as what it has left to write: its token and the
        tables not yet landed (``batches`` last). Call it with writes held (``writes_held``): a
        backup keeps these beside the tables it froze, and a store restored from it replays them
        at open, so the group lands whole there too (collector/backup.py)."""
        return ingest_groups.groups_left(self._groups_logged)

    def replay_ingest_wal(self, wal: IngestWal) -> int:
        """Store each group left in ``wal`` with its own token, ``batches`` rows last, and remove
        its file; the number of groups replayed.

        The engine drops the tables that had landed (their tokens survive restarts) and stores
        the rest. A file that does not read back whole, names a table that is not ingest's, holds
        batches of which some are stored already (another group stored them: replaying could
        store rows twice), or that storage refuses is set aside (``*.bad``, logged) and the store
        opens without it; a group whose batches are all stored had finished, and is removed.
        StorageUnavailable propagates: the store does not open until the files can be replayed."""
        return ingest_groups.replay(wal, self.batches_seen, self.insert_table)

    def _new_series(
        self, parts: list[pa.Table], group: Sequence[PreparedRows]
    ) -> tuple[pa.Table | None, list[SeriesKey]]:
        """The group's series rows without repeats and without pairs another group wrote since."""
        keys = [k for p in group for k in p.series_keys]
        return self._series_index.new_rows(parts, keys), keys

    def insert_batch(
        self,
        batch_id: str,
        *,
        agent_id: str = "",
        samples: SampleBatch | None = None,
        spans: SpanBatch | None = None,
        events: Sequence[Event] = (),
        instances: Sequence[InstanceInfo] = (),
        histograms: HistogramBatch | None = None,
        calls: CallBatch | None = None,
    ) -> bool:
        """Store one batch exactly once: False (and nothing written) when ``batch_id`` was stored before.

        Each table's insert carries the dedup token ``<batch_id>:<table>``, and the batch id is
        recorded last; a crash anywhere in between is repaired by the retry, whose inserts the
        engine drops as duplicates up to the last one that had not landed. The collector stores
        agent batches in groups instead (``insert_prepared``, collector/batcher.py).
        """
        if not batch_id:
            raise ValueError("batch_id must not be empty")
        self._check_open()
        if self.batch_seen(batch_id):
            return False
        prepared = self.prepare(
            batch_id,
            agent_id=agent_id,
            samples=samples,
            spans=spans,
            events=events,
            instances=instances,
            histograms=histograms,
            calls=calls,
        )
        self.insert_prepared([prepared], batch_id)
        return True

    # ---- housekeeping ----------------------------------------------------------------

    def disk_bytes(self, name: str) -> int:
        """Compressed bytes on disk of one table's active parts."""
        table(name)  # rejects names outside the schema
        p = Params()
        result = self.query(
            "SELECT sum(bytes_on_disk) AS b FROM system.parts WHERE active "
            f"AND database = {p(self.database, 'String')} AND table = {p(name, 'String')}",
            p,
        )
        value = result.column("b")[0].as_py()
        return int(value or 0)

    def row_count(self, name: str) -> int:
        """The rows one table of the schema holds (``count()``: a ReplacingMergeTree's rows as
        written, before merges replace any)."""
        table(name)  # rejects names outside the schema
        result = self.query(f"SELECT count() AS n FROM {self._table(name)}")
        return int(result.column("n")[0].as_py())

    def distinct_count(self, name: str, column: str) -> int:
        """How many distinct values one column of a table holds (``uniqExact``): with
        :meth:`row_count`, whether rows were stored once each (spans by ``correlation``, batches
        by ``batch_id``)."""
        if column not in {c.name for c in table(name).columns}:
            raise KeyError(f"no column {column!r} in table {name!r}")
        result = self.query(f"SELECT uniqExact({ident(column)}) AS n FROM {self._table(name)}")
        return int(result.column("n")[0].as_py())

    def table_stats(self) -> list[dict[str, Any]]:
        """Per table of the store's database (``table``, by name): active ``parts``, ``rows``, ``bytes``
        on disk (the collector's store statistics, collector/metrics.py)."""
        p = Params()
        rows: list[dict[str, Any]] = self.query(
            "SELECT table, count() AS parts, sum(rows) AS rows, sum(bytes_on_disk) AS bytes"
            f" FROM system.parts WHERE active AND database = {p(str(self.database), 'String')}"
            " GROUP BY table ORDER BY table",
            p,
        ).to_pylist()
        return rows

    def optimize(self, name: str) -> None:
        """Merge a table's parts now (tests and benchmarks; the engine does this on its own)."""
        table(name)
        self.command(f"OPTIMIZE TABLE {self._table(name)} FINAL")

    def close(self) -> None:
        """Release the engine; safe twice. Later calls raise StorageUnavailable."""
        if self._closed:
            return
        if self.sample_cache is not None:
            self.sample_cache.close()  # a background fill may be reading through this store
        self._closed = True
        loader = self._head_loader
        if loader is not None and loader is not threading.current_thread():
            loader.join(timeout=60)
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open_store(
    target: str | Path,
    database: str = "ki",
    retention: Retention | None = None,
    cluster: str | None = None,
    *,
    cache_bytes: int | None = None,
    head_bytes: int = 0,
    head_window_ms: int = DEFAULT_HEAD_WINDOW_MS,
    ingest_wal: str | Path | None = None,
) -> Store:
    """A ServerStore for ``http(s)://``, ``clickhouse://`` or ``chdb://`` URLs, else an EmbeddedStore on a path.

    ``cache_bytes`` sizes the decoded-hours cache for kql (0 turns it off); by default it is on
    for the embedded store and off for a server, which other collectors may write to behind
    this one's back (collector/sample_cache.py). ``head_bytes`` and ``head_window_ms`` bound the
    embedded store's head (collector/head.py; 0 bytes, the default: off, for tools that only write,
    such as ``ki import``; ``ki collector`` turns it on); a server store has none.
    ``ingest_wal``: the directory of this process's ingest write-ahead files, replayed before the
    store is returned (``Store.open_ingest_wal``; ``ki collector`` gives one, tools that write
    with ``insert_batch`` need none).
    """
    from kernel_insight.collector.clickhouse.embedded import EmbeddedStore
    from kernel_insight.collector.clickhouse.server import ServerStore

    text = str(target)
    if is_store_url(text):
        store: Store = ServerStore.connect(text, database, retention, cluster=cluster)
        if cache_bytes:
            store.sample_cache = SampleCache(cache_bytes)
        if ingest_wal is not None:
            try:
                store.open_ingest_wal(ingest_wal)
            except BaseException:
                store.close()
                raise
        return store
    if cluster is not None:
        raise ValueError("a cluster needs a ClickHouse URL, not an embedded data directory")
    return EmbeddedStore(
        text,
        database,
        retention,
        cache_bytes=DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes,
        head_bytes=head_bytes,
        head_window_ms=head_window_ms,
        ingest_wal=ingest_wal,
    )


def __getattr__(name: str) -> Any:
    """The back ends, public names of this module, from their own modules (PEP 562): they
    subclass :class:`Store`, so they are imported once this module is, in either order."""
    if name == "EmbeddedStore":
        from kernel_insight.collector.clickhouse.embedded import EmbeddedStore

        return EmbeddedStore
    if name == "ServerStore":
        from kernel_insight.collector.clickhouse.server import ServerStore

        return ServerStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
