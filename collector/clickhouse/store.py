"""The store: inserts and queries against ClickHouse, embedded (chDB) or a server (clickhouse-connect).

Both back ends share every SQL statement; they differ only in how a statement or an
Arrow table reaches the engine. Exceptions (what to catch)::

    kql.StorageError        the engine refused a statement or its values: permanent (HTTP 4xx on
     |                      writes, the batch is set aside; 500 on reads)
     +-- StorageUnavailable the store cannot serve now: ``retryable``, retry later (HTTP 503)

``StorageError`` is kql's (kernel_insight.kql.errors): one hierarchy and one ``retryable`` for
reads and writes. Only ClickHouse's own errors and its transport's are turned into them; any
other exception (a bug here) passes through unchanged, so it is never mistaken for a store that
is merely away.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.schema import (
    MERGE_SETTINGS,
    PACKED_SETTINGS,
    SCHEMA,
    Retention,
    cluster_ddl,
    codec_matches,
    single_ddl,
    table,
)
from kernel_insight.collector.clickhouse.sql import Params, ident, is_store_url, literal, qualified
from kernel_insight.collector.head import DEFAULT_HEAD_BYTES, DEFAULT_HEAD_WINDOW_MS, Head, find_sorted
from kernel_insight.collector.ingest_wal import IngestWal, WalCorrupt, WalGroup
from kernel_insight.collector.rows import (
    MAX_TS_MS,
    MIN_TS_MS,
    CallBatch,
    Event,
    HistogramBatch,
    InstanceInfo,
    Labels,
    SampleBatch,
    SpanBatch,
    series_fingerprint,
)
from kernel_insight.collector.sample_cache import DEFAULT_CACHE_BYTES, SampleCache
from kernel_insight.collector.valuecodec import encode_values
from kernel_insight.kql.errors import StorageError

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.query import ClickHouseStorage

__all__ = [
    "EmbeddedStore",
    "PreparedRows",
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
#: How often the embedded store asks the engine to delete the parts merges replaced (docs/storage.md,
#: "Merges"). chDB's own cleanup ran rarely: replaced parts stayed 40 s and more after the merges
#: (past ``old_parts_lifetime``), so ``du`` of a busy table was several times its active parts.
#: The statement is cheap and deletes nothing younger than ``old_parts_lifetime``.
CLEANUP_INTERVAL_S = 2.0
#: Merge settings of the embedded store's busiest tables (docs/storage.md, "Merges"): ClickHouse's
#: selector (base 5) rewrote each ``kernel_spans`` row 2.3 times on average in a stream of
#: 40k-row flushes (12M rows); at base 10 about 1.6 times, for less CPU in inserts and merges
#: together and a few more active parts. ``samples`` under remote_write (32k-row flushes): 2.9
#: times against 1.6, and the merge threads took half the CPU in bench-import's remote_write
#: (bench/results/import.md). Embedded only: a server's tables keep its defaults.
EMBEDDED_TABLE_SETTINGS: dict[str, dict[str, int]] = {
    "kernel_spans": {"merge_selector_base": 10},
    "samples": {"merge_selector_base": 10},
}
_SERIES_CACHE_MAX = 2_000_000

#: ClickHouse error codes that mean "try again later", not "your statement is wrong".
_RETRYABLE_CODES = frozenset(
    {3, 74, 75, 159, 164, 202, 209, 210, 236, 241, 242, 243, 252, 279, 319, 394, 425, 999, 1000}
)
_CODE_RE = re.compile(r"Code:\s*(\d+)")
_TTL_DAYS_RE = re.compile(r"\bTTL\b.*?toIntervalDay\((\d+)\)", re.DOTALL)


#: The order a group's tables are written in (``Store.insert_prepared``); the ``batches`` rows
#: come after all of them, since they vouch that everything before them landed.
_GROUP_ORDER = ("series", "samples", "histograms", "kernel_spans", "gpu_calls", "events", "instances")
#: A test hook, never set in production: a process started with this variable naming a table of
#: ``_GROUP_ORDER`` SIGKILLs itself right after that table of a group of two or more recorded
#: batches landed, before the group's ``batches`` rows: the one place where an agent's retry
#: (a new group, a new token) would store rows twice without the write-ahead file
#: (tests/collector/test_ingest_wal.py kills ``ki collector`` exactly there). Read once, at import.
TEST_KILL_AFTER_TABLE_ENV = "KI_TEST_KILL_AFTER_GROUP_TABLE"
_TEST_KILL_AFTER_TABLE = os.environ.get(TEST_KILL_AFTER_TABLE_ENV) or None
_MAX_NS = MAX_TS_MS * 1_000_000


def _instance_column(inst: list[str]) -> pa.Array:
    """The instance column: one agent's batch (one instance) as a dictionary of one string."""
    if inst and inst.count(inst[0]) == len(inst):
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(len(inst), np.int32)), pa.array([inst[0]], pa.string())
        )
    return pa.array(inst, pa.string())


def _kernel_column(spans: SpanBatch) -> pa.Array:
    """The kernel column as a dictionary of distinct names: from ``kernel_dict`` when the spans
    carry it (derive's), else by encoding ``kernel`` row by row."""
    if spans.kernel_dict is not None:
        codes, names = spans.kernel_dict
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(names, pa.string()))
    return pa.array(spans.kernel, pa.string()).dictionary_encode()


def _owner_columns(spans: SpanBatch) -> dict[str, pa.Array]:
    """The spans' pod, namespace and container columns, each a dictionary over the distinct holders."""
    codes, owners = spans.owner_columns()
    index = pa.array(codes, pa.int32())
    return {
        name: pa.DictionaryArray.from_arrays(index, pa.array([o[i] for o in owners], pa.string()))
        for i, name in enumerate(("pod", "namespace", "container"))
    }


def _nvtx_column(spans: SpanBatch) -> pa.Array:
    """The spans' NVTX ranges as a dictionary over the distinct ranges ("" where none)."""
    codes, ranges = spans.nvtx if spans.nvtx is not None else (np.zeros(len(spans), np.int32), [""])
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(ranges, pa.string()))


def _check_ns_range(values: Any, what: str) -> None:
    arr = np.asarray(values, dtype=np.int64)
    if arr.size and (int(arr.min()) < MIN_TS_MS or int(arr.max()) > _MAX_NS):
        bad = int(arr.min()) if int(arr.min()) < MIN_TS_MS else int(arr.max())
        raise ValueError(f"{what} {bad} ns is outside the storable range 1970-01-01 .. 2149-06-06")


def _integral_rows(offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Per row: whether all of its values are whole numbers an Int64 holds exactly (|v| < 2^53)."""
    bad = ~((flat == np.floor(flat)) & (np.abs(flat) < 2.0**53))
    seen = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(bad, out=seen[1:])
    result: np.ndarray[Any, Any] = seen[offsets[1:]] == seen[offsets[:-1]]
    return result


def _bucket_lists(
    side: str, offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any], integral: np.ndarray[Any, Any]
) -> dict[str, pa.Array]:
    """``<side>_counts`` (Int64, integer rows) and ``<side>_float_counts`` (Float64, the other rows)."""
    lengths = np.diff(offsets)
    out = {}
    for name, rows, kind in (("counts", integral, pa.int64()), ("float_counts", ~integral, pa.float64())):
        keep = np.repeat(rows, lengths)
        own = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(np.where(rows, lengths, 0), out=own[1:])
        values = flat[keep].astype(np.int64) if name == "counts" else flat[keep]
        out[f"{side}_{name}"] = pa.ListArray.from_arrays(pa.array(own, pa.int32()), pa.array(values, kind))
    return out


def _labels_map(series: Sequence[Labels]) -> pa.MapArray:
    """The series table's ``labels`` column: each series' labels but ``__name__`` (which every
    series has once), built from flat key and value columns rather than a list of pairs per series."""
    offsets = np.zeros(len(series) + 1, np.int32)
    np.cumsum([len(s) - 1 for s in series], out=offsets[1:])
    pairs = [kv for s in series for kv in s if kv[0] != "__name__"]
    if len(pairs) != offsets[-1]:  # a series without a name: count each one's pairs
        np.cumsum([sum(k != "__name__" for k, _ in s) for s in series], out=offsets[1:])
    keys, values = (list(c) for c in zip(*pairs, strict=True)) if pairs else ([], [])
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
    )


def _value_columns(batch: SampleBatch) -> dict[str, pa.Array]:
    """The samples table's value columns: decimals where they give the float back bit for bit
    (collector/valuecodec.py), one scale per series of the batch."""
    float_value, mantissa, scale = encode_values(batch.values, batch.series_idx)
    return {
        "float_value": pa.array(float_value, pa.float64()),
        "mantissa": pa.array(mantissa, pa.int64()),
        "scale": pa.array(scale, pa.int8()),
    }


_TS_MS_UTC = pa.timestamp("ms", tz="UTC")


def _dense_codes(codes: npt.NDArray[Any], domain: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int32]]:
    """``np.unique(codes, return_inverse=True)`` for codes in ``range(domain)``, by counting:
    O(len + domain) where a sort is O(len log len), on every remote_write request."""
    if domain > 8 * len(codes) + 1024:  # a few codes out of many: sorting them is cheaper
        used, inverse = np.unique(codes, return_inverse=True)
        return used, inverse.astype(np.int32).reshape(-1)
    used = np.flatnonzero(np.bincount(codes, minlength=domain))
    dense = np.zeros(max(domain, 1), dtype=np.int32)
    dense[used] = np.arange(len(used), dtype=np.int32)
    return used, dense[codes]


def _concat(parts: list[pa.Table]) -> pa.Table:
    # No copy: chDB reads the chunks one by one (each with its own dictionary of metric names)
    # and the engine squashes them into one part per partition.
    if len(parts) == 1:
        return parts[0]
    if any("st" in p.column_names for p in parts):  # start timestamps in some batches only: 0 elsewhere
        parts = [
            p if "st" in p.column_names else p.append_column("st", pa.array(np.zeros(p.num_rows, np.int64)))
            for p in parts
        ]
    if any(p.schema != parts[0].schema for p in parts[1:]):  # a column dictionary-encoded in some only
        plain = pa.schema(
            [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in parts[0].schema]
        )
        parts = [p.cast(plain) for p in parts]
    return pa.concat_tables(parts)


@dataclass(slots=True)
class PreparedRows:
    """One batch's rows as Arrow tables (``Store.prepare``), ready to be written with others.

    Converting is done in the caller's thread, batch by batch, so a value the schema cannot
    hold refuses its own batch and never a group; ``Store.insert_prepared`` then writes any
    number of them with one insert per table.
    """

    batch_id: str
    agent_id: str = ""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    rows: int = 0
    metric_names: list[str] = field(default_factory=list)
    metric_codes: np.ndarray[Any, Any] | None = None
    ts_ms: np.ndarray[Any, Any] | None = None
    series_keys: list[tuple[int, int]] = field(default_factory=list)
    histogram_metrics: list[str] = field(default_factory=list)
    #: The batch's metrics when it carries start timestamps (``Store.start_timestamp_metrics``).
    start_timestamp_metrics: list[str] = field(default_factory=list)
    #: Whether the batch id is looked up in and written to the ``batches`` table. False for ids
    #: no sender can send again (remote_write's fresh ``rw:<uuid>``): nothing to deduplicate, so
    #: a group of them costs no ``batches_seen`` query and no ``batches`` insert.
    record: bool = True
    #: The batch's float samples for the head (``Store.head``), once they are written.
    samples: SampleBatch | None = None


def _batches_rows(recorded: Sequence[PreparedRows]) -> pa.Table:
    """The ``batches`` rows of a group's recorded batches (written last, ``Store.insert_prepared``)."""
    now_ms = time.time_ns() // 1_000_000
    return pa.table(
        {
            "batch_id": pa.array([p.batch_id for p in recorded], pa.string()),
            "agent_id": pa.array([p.agent_id for p in recorded], pa.string()),
            "received": pa.array([now_ms] * len(recorded), pa.timestamp("ms", tz="UTC")),
            "rows": pa.array([p.rows for p in recorded], pa.uint64()),
        }
    )


def _start_metrics(batch: SampleBatch | HistogramBatch) -> list[str]:
    """The metrics of a batch's samples that carry a start timestamp (none for most batches)."""
    if batch.st_ms is None:
        return []
    rows = np.unique(batch.series_idx[batch.st_ms != 0]).tolist()
    return sorted({dict(batch.series[i]).get("__name__", "") for i in rows})


class _MetricsWith:
    """The metric names that have some kind of row (histograms, start timestamps), for a store whose
    writes all pass through one object (the embedded store): the rows' metrics read once (again
    after any raw statement: ``forget``), plus every metric this process writes such rows of, noted
    before the write. Reads of other metrics then skip what only those have (docs/storage.md)."""

    __slots__ = ("_known", "_lock", "_noted", "_sql")

    def __init__(self, sql: str) -> None:
        self._sql = sql  # SELECT DISTINCT metric ... of the rows in question
        self._known: frozenset[str] | None = None
        self._noted: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def note(self, names: Iterable[str]) -> None:
        names = set(names)
        if not self._noted.issuperset(names):
            with self._lock:
                self._noted = self._noted | names

    def forget(self) -> None:
        self._known = None

    def noted(self) -> frozenset[str]:
        """The names noted so far, without reading the table: a subset of the truth on a store
        other processes write to too."""
        return self._noted

    def get(self, query: Callable[[str], pa.Table]) -> frozenset[str]:
        known = self._known
        if known is None:
            rows = query(self._sql)
            known = self._known = frozenset(str(m) for m in rows.column("metric").to_pylist())
        noted = self._noted
        return known | noted if noted else known


#: How long an engine's answer to ``Store.ping`` stands (seconds).
PING_FRESH_S = 1.0


class StorageUnavailable(StorageError):
    """The store cannot serve now (closed, unreachable, out of memory or disk, overloaded): retryable."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message, retry_after_s=retry_after_s)

    @property
    def retry_after_s(self) -> int:
        """Seconds to wait before retrying (``Retry-After``)."""
        return self._retry_after_s if self._retry_after_s is not None else 5


#: A ClickHouse string literal: ``sql.literal`` under its older name. Values belong in parameters.
quote = literal


#: clickhouse-connect's errors that say the statement or its data is wrong, not the connection.
_CLIENT_PERMANENT = frozenset({"DataError", "ProgrammingError", "NotSupportedError", "IntegrityError"})


def _is_transport(exc: BaseException) -> bool:
    """A failure to reach the engine: sockets, TLS, HTTP (urllib3) or clickhouse-connect itself."""
    if isinstance(exc, OSError):
        return True
    return any(k.__module__.split(".")[0] in {"clickhouse_connect", "urllib3"} for k in type(exc).__mro__)


def _classify(exc: BaseException, what: str) -> StorageError | None:
    """The storage error ``exc`` stands for, or ``None`` when it is not the engine's nor the transport's.

    An engine error carries ``Code: N``: retryable codes (memory, timeouts, too many parts,
    network) give ``StorageUnavailable``, the rest a permanent ``StorageError``. Without a code,
    only a transport failure means the store is unreachable; anything else is a bug of ours.
    """
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    m = _CODE_RE.search(message)
    if m is not None:
        if int(m.group(1)) in _RETRYABLE_CODES:
            return StorageUnavailable(f"{what}: {message[:500]}")
        return StorageError(f"{what}: {message[:500]}")
    if not _is_transport(exc):
        return None
    if type(exc).__name__ in _CLIENT_PERMANENT:
        return StorageError(f"{what}: {message[:500]}")
    return StorageUnavailable(f"{what}: {message[:500]}")


@contextlib.contextmanager
def _engine_errors(what: str) -> Iterator[None]:
    """Turn the engine's and the transport's exceptions into storage errors; others pass unchanged."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        error = _classify(exc, what)
        if error is None:
            raise
        raise error from exc


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
        #: The (series, day) pairs whose series rows are written, as a sorted fingerprint array per
        #: day: a batch's series are checked against them at once (no Python object per pair).
        self._seen_by_day: dict[int, np.ndarray[Any, np.dtype[np.uint64]]] = {}
        self._series_lock = threading.Lock()
        self._fp_cache: dict[Labels, tuple[int, str]] = {}
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
        self._histogram_metrics = _MetricsWith(f"SELECT DISTINCT metric FROM {self._table('histograms')}")
        self._start_timestamp_metrics = _MetricsWith(
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
        if self.cluster is None:
            statements = single_ddl(self.database, self.retention, self._table_settings)
            suffix, on_cluster = "", ""
        else:
            statements = cluster_ddl(self.database, self.cluster, self.retention)
            suffix, on_cluster = "_local", f" ON CLUSTER {ident(self.cluster)}"
        self._migrate_samples_without_metric(suffix)
        for statement in statements:
            self.command(statement)
        # ALTER only where the retention changed: MODIFY TTL re-evaluates every part of the table.
        p = Params()
        current = {
            row["name"]: row["q"]
            for row in self.query(
                f"SELECT name, create_table_query AS q FROM system.tables WHERE database = {p(self.database, 'String')}",
                p,
            ).to_pylist()
        }
        self._migrate_samples_value(suffix, on_cluster)
        self._add_missing_columns(suffix, on_cluster)
        self._update_codecs(suffix, on_cluster)
        for t in SCHEMA:
            # Tables made before MERGE_SETTINGS (or this back end's own settings) existed, or with other
            # values, get them (docs/storage.md, "Merges").
            ddl = current.get(t.name + suffix)
            missing = {
                k: v
                for k, v in {**MERGE_SETTINGS, **self._table_settings.get(t.name, {})}.items()
                if ddl is not None and not re.search(rf"\b{k} = {v}(?![\w.])", ddl)
            }
            if missing:
                assignments = ", ".join(f"{k} = {v}" for k, v in missing.items())
                self.command(
                    f"ALTER TABLE {self._table(t.name + suffix)}{on_cluster} MODIFY SETTING {assignments}"
                )
            if t.ttl_column is None:
                continue
            found = _TTL_DAYS_RE.search(current.get(t.name + suffix, ""))
            have = int(found.group(1)) if found else 0
            want = t.ttl(self.retention)
            if have == t.ttl_days(self.retention):
                continue
            name = f"{self._table(t.name + suffix)}{on_cluster}"
            self.command(
                f"ALTER TABLE {name} MODIFY TTL {want}" if want else f"ALTER TABLE {name} REMOVE TTL"
            )

    # ---- public SQL ------------------------------------------------------------------

    def _add_missing_columns(self, suffix: str, on_cluster: str) -> None:
        """Columns a newer version added to a table (at its end) are added to a store made before
        them: ``ADD COLUMN`` only changes metadata, and old rows read the column's default."""
        have: dict[str, set[str]] = {}
        p = Params()
        for row in self.query(
            f"SELECT table, name FROM system.columns WHERE database = {p(self.database, 'String')}", p
        ).to_pylist():
            have.setdefault(row["table"], set()).add(row["name"])
        for t in SCHEMA:
            table = t.name + suffix
            if table not in have:
                continue
            for column in t.columns:
                if column.name in have[table]:
                    continue
                targets = (
                    [table] if self.cluster is None else [table, t.name]
                )  # the local and Distributed tables
                for target in targets:
                    self.command(
                        f"ALTER TABLE {self._table(target)}{on_cluster} ADD COLUMN IF NOT EXISTS {column.sql()}"
                    )

    def _update_codecs(self, suffix: str, on_cluster: str) -> None:
        """A column whose codec a newer version changed gets it: ``MODIFY COLUMN ... CODEC`` only
        changes metadata, so existing parts stay as written (and readable) and are re-encoded when
        merges rewrite them; new parts use the new codec at once (docs/storage.md, "Codecs")."""
        have: dict[tuple[str, str], str] = {}
        p = Params()
        for row in self.query(
            "SELECT table, name, compression_codec AS codec FROM system.columns "
            f"WHERE database = {p(self.database, 'String')}",
            p,
        ).to_pylist():
            have[(row["table"], row["name"])] = row["codec"]
        for t in SCHEMA:
            table_name = t.name + suffix
            for column in t.columns:
                current = have.get((table_name, column.name))
                if column.codec is None or current is None or codec_matches(column.codec, current):
                    continue
                self.command(
                    f"ALTER TABLE {self._table(table_name)}{on_cluster} "
                    f"MODIFY COLUMN {ident(column.name)} CODEC({column.codec})"
                )

    def _migrate_samples_value(self, suffix: str, on_cluster: str) -> None:
        """Stores made before values were kept as decimals (``mantissa``, ``scale``): their stored
        ``value`` column becomes ``float_value`` (``RENAME COLUMN``: metadata and file names, no
        data rewritten), and ``_add_missing_columns`` then adds the decimal columns and ``value``
        as their ALIAS. Parts written before read ``scale`` as its default, -1, so their values
        come from ``float_value`` as they were; a merge writes them out with ``scale`` -1."""
        table = f"samples{suffix}"
        p = Params()
        kinds = {
            str(row["name"]): str(row["default_kind"])
            for row in self.query(
                "SELECT name, default_kind FROM system.columns "
                f"WHERE database = {p(self.database, 'String')} AND table = {p(table, 'String')}",
                p,
            ).to_pylist()
        }
        if kinds.get("value") != "" or "float_value" in kinds:
            return  # no table yet, or already migrated (value is the ALIAS)
        targets = [table] if self.cluster is None else [table, "samples"]  # local and Distributed
        for target in targets:
            self.command(f"ALTER TABLE {self._table(target)}{on_cluster} RENAME COLUMN value TO float_value")

    def _migrate_samples_without_metric(self, suffix: str) -> None:
        """Stores made before samples were ordered by metric: move the old table aside, so the
        new one is created, and copy its rows over with the metric from the series index."""
        table = f"samples{suffix}"
        p = Params()
        columns = (
            self.query(
                f"SELECT name FROM system.columns WHERE database = {p(self.database, 'String')} "
                f"AND table = {p(table, 'String')}",
                p,
            )
            .column("name")
            .to_pylist()
        )
        if not columns or "metric" in columns:
            return
        if self.cluster is not None:
            raise StorageError(
                f"{self.database}.{table} has the layout of an older version (no metric column); "
                "migrate it on the cluster first (docs/storage.md, 'Upgrading')"
            )
        old = self._table("samples_before_metric")
        self.command(f"RENAME TABLE {self._table('samples')} TO {old}")
        for statement in single_ddl(self.database, self.retention, self._table_settings):
            self.command(statement)
        self.command(
            f"INSERT INTO {self._table('samples')} (metric, fingerprint, ts, float_value) "
            f"SELECT m.metric, o.fingerprint, o.ts, o.value FROM {old} AS o "
            f"INNER JOIN (SELECT DISTINCT fingerprint, metric FROM {self._table('series')}) AS m "
            "ON o.fingerprint = m.fingerprint"
        )
        self.command(f"DROP TABLE {old}")

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
    ) -> tuple[pa.Table, pa.Table | None, list[str], np.ndarray[Any, Any], list[tuple[int, int]]]:
        """The samples table of ``batch``, the series rows for (series, day) pairs not written yet,
        the metric names and per-sample codes (for the sample cache) and the new series keys."""
        if batch.series_meta is not None:
            # Known to the maker (remote_write's SeriesCache): no lookup per series here.
            fps, series_codes, all_names = batch.series_meta
            used, codes = _dense_codes(series_codes, len(all_names))
            names = np.array([all_names[c] for c in used.tolist()], dtype=object)
            metric_of: Sequence[str] | npt.NDArray[np.object_] = names[codes]  # read for new series only
        else:
            meta = [self._fingerprint(s) for s in batch.series]
            fps = np.fromiter((m[0] for m in meta), dtype=np.uint64, count=len(meta))
            metric_of = [m[1] for m in meta]
            names, inverse = np.unique(metric_of, return_inverse=True)
            codes = inverse.astype(np.int32).reshape(-1)
        series, keys = self._series_rows(batch, fps, metric_of)
        # The metric column as a dictionary of the batch's distinct names (chDB wants them unique).
        sample_codes = codes[batch.series_idx]
        metric = pa.DictionaryArray.from_arrays(
            pa.array(sample_codes, pa.int32()), pa.array(names.tolist(), pa.string())
        )
        data = pa.table(
            {
                "metric": metric,
                "fingerprint": pa.array(fps[batch.series_idx], pa.uint64()),
                # Int64 viewed as the timestamp: a tz-aware type from numpy went through pandas_compat.
                "ts": pa.array(batch.ts_ms, pa.int64()).view(_TS_MS_UTC),
                **_value_columns(batch),
            }
        )
        if batch.st_ms is not None:  # else not sent: the rows read the column's default, 0 (unset)
            data = data.append_column("st", pa.array(batch.st_ms, pa.int64()))
        return data, series, names.tolist(), sample_codes, keys

    def _histogram_rows(
        self, batch: HistogramBatch
    ) -> tuple[pa.Table, pa.Table | None, list[str], list[tuple[int, int]]]:
        """The histograms table of ``batch``, its new series rows, its metric names and new series keys.

        The same series model as samples: one fingerprint per label set, series rows for
        (series, day) pairs not written yet, so selectors and label APIs find histogram series
        through the one series table.
        """
        meta = [self._fingerprint(s) for s in batch.series]
        fps = np.fromiter((m[0] for m in meta), dtype=np.uint64, count=len(meta))
        series, keys = self._series_rows(batch, fps, [m[1] for m in meta])
        names, codes = np.unique([m[1] for m in meta], return_inverse=True)
        metric = pa.DictionaryArray.from_arrays(
            pa.array(codes.astype(np.int32)[batch.series_idx], pa.int32()),
            pa.array(names.tolist(), pa.string()),
        )

        def lists(offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any], kind: pa.DataType) -> pa.Array:
            return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, kind))

        # Rows whose every bucket count is a whole number (integer histograms) go to the Int64
        # columns, the others (float histograms) to the Float64 ones: one of the two is empty.
        integral = _integral_rows(batch.pos_bucket_offsets, batch.pos_buckets) & _integral_rows(
            batch.neg_bucket_offsets, batch.neg_buckets
        )

        data = pa.table(
            {
                "metric": metric,
                "fingerprint": pa.array(fps[batch.series_idx], pa.uint64()),
                "ts": pa.array(batch.ts_ms, pa.timestamp("ms", tz="UTC")),
                "schema": pa.array(batch.schema.astype(np.int8), pa.int8()),
                "zero_threshold": pa.array(batch.zero_threshold, pa.float64()),
                "zero_count": pa.array(batch.zero_count, pa.float64()),
                "count": pa.array(batch.count, pa.float64()),
                "sum": pa.array(batch.sum, pa.float64()),
                "counter_reset_hint": pa.array(batch.counter_reset_hint, pa.uint8()),
                "positive_span_offsets": lists(batch.pos_span_offsets, batch.pos_span_offset, pa.int32()),
                "positive_span_lengths": lists(batch.pos_span_offsets, batch.pos_span_length, pa.uint32()),
                **_bucket_lists("positive", batch.pos_bucket_offsets, batch.pos_buckets, integral),
                "negative_span_offsets": lists(batch.neg_span_offsets, batch.neg_span_offset, pa.int32()),
                "negative_span_lengths": lists(batch.neg_span_offsets, batch.neg_span_length, pa.uint32()),
                **_bucket_lists("negative", batch.neg_bucket_offsets, batch.neg_buckets, integral),
                "custom_values": lists(batch.custom_value_offsets, batch.custom_values, pa.float64()),
            }
        )
        if batch.st_ms is not None:  # as samples: only batches that carry start timestamps write them
            data = data.append_column("st", pa.array(batch.st_ms, pa.int64()))
        return data, series, names.tolist(), keys

    def insert_histograms(self, batch: HistogramBatch, *, dedup_token: str | None = None) -> int:
        """Insert native histogram samples and any series rows not yet written today; returns the count."""
        self._check_open()
        if len(batch) == 0:
            return 0
        data, series, names, keys = self._histogram_rows(batch)
        if series is not None:
            self._write("series", series, None if dedup_token is None else f"{dedup_token}:series")
            self._mark_series(keys)
        # Before the write: a reader must not miss rows that landed.
        self._histogram_metrics.note(names)
        self._start_timestamp_metrics.note(_start_metrics(batch))
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
            self._mark_series(keys)
        self._start_timestamp_metrics.note(_start_metrics(batch))  # before the write, as histogram metrics
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
            first = self._head_start(first, now, head.max_bytes)
            coverage = first if self._samples_before(first) else None
        except Exception:  # the head stays unloaded: every read goes to ClickHouse, still exact
            head.reset(None)
            log.exception("head: cannot size the load from ClickHouse; kql reads go to ClickHouse")
            return
        head.reset(coverage)
        generation = head.generation
        thread = threading.Thread(
            target=self._load_head, args=(head, generation, first), name="ki-head-load", daemon=True
        )
        self._head_loader = thread
        thread.start()

    def _head_start(self, first: int, now: int, max_bytes: int) -> int:
        """Where the head's load starts: ``first``, or the start of the latest second from which
        the samples still fit nine tenths of ``max_bytes`` (counted per second of the window)."""
        rows = self._query(
            f"SELECT intDiv(toUnixTimestamp64Milli(ts), 1000) AS sec, count() AS n FROM {self._table('samples')} "
            f"WHERE ts >= fromUnixTimestamp64Milli(toInt64({int(first)}), 'UTC') GROUP BY sec ORDER BY sec DESC"
        )
        fit = int(max_bytes * 0.9 / 12)  # a sealed sample's bytes (collector/head.py)
        counts = rows.column("n").to_numpy()
        total = np.cumsum(counts)
        if not len(total) or int(total[-1]) <= fit:
            return first
        over = int(np.argmax(total > fit))  # the first second (newest first) that does not fit
        return (int(rows.column("sec")[over].as_py()) + 1) * 1000

    def _samples_before(self, ms: int) -> bool:
        """Whether the samples table holds any sample older than ``ms`` (parts of earlier days
        answer it without a scan; only the day of ``ms`` is read)."""
        p = Params()
        day = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()
        parts = self._query(
            "SELECT count() AS n FROM system.parts WHERE active AND database = "
            f"{p(self.database, 'String')} AND table = 'samples' AND min_date < {p(day, 'Date')}",
            p,
        )
        if int(parts.column("n")[0].as_py()):
            return True
        found = self._query(
            f"SELECT count() AS n FROM {self._table('samples')} WHERE toDate(ts) = {p(day, 'Date')} "
            f"AND ts < fromUnixTimestamp64Milli(toInt64({int(ms)}), 'UTC')",
            p,
        )
        return bool(int(found.column("n")[0].as_py()))

    def _load_head(self, head: Head, generation: int, first: int) -> None:
        try:
            rows = self._query(
                f"SELECT s.fingerprint AS fingerprint, toUnixTimestamp64Milli(s.ts) AS t, s.value AS value "
                f"FROM {self._table('samples')} AS s WHERE s.ts >= fromUnixTimestamp64Milli(toInt64({int(first)}), 'UTC')"
            )
            fps = rows.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
            ts = rows.column("t").to_numpy().astype(np.int64, copy=False)
            vs = rows.column("value").to_numpy().astype(np.float64, copy=False)
            uniq, sid = np.unique(fps, return_inverse=True)
            found = self._labels_of_fingerprints(uniq, first)
            keep = np.array([lab is not None for lab in found], dtype=bool)
            if not keep.all():  # a sample row without a series row cannot happen; be safe anyway
                ok = keep[sid]
                sid, ts, vs = (np.cumsum(keep) - 1)[sid[ok]], ts[ok], vs[ok]
                uniq = uniq[keep]
            labels = [lab for lab in found if lab is not None]
            head.load(generation, labels, uniq, sid.astype(np.int32), ts, vs)
            log.info("head: %d series, %d samples loaded from ClickHouse", len(uniq), len(ts))
        except StorageUnavailable:
            pass  # closing
        except Exception:
            log.exception("head: loading from ClickHouse failed; kql reads go to ClickHouse")

    def _labels_of_fingerprints(self, fps: npt.NDArray[np.uint64], first_ms: int) -> list[Labels | None]:
        """Each fingerprint's label set (``__name__`` included), from the series table: the rows of
        the days from ``first_ms`` on (a series has a row for each day it has samples on), matched
        to ``fps`` (sorted, unique) in numpy. Naming the fingerprints in the query instead made a
        head of 500k series a text parameter of ~10 MB that the engine parsed for minutes, while
        holding the session every other statement waits for."""
        if not len(fps):
            return []
        rows = self._query(
            f"SELECT fingerprint, any(metric) AS metric, any(labels) AS labels FROM {self._table('series')} "
            f"WHERE date >= toDate(fromUnixTimestamp64Milli(toInt64({int(first_ms)}), 'UTC')) GROUP BY fingerprint"
        )
        have = rows.column("fingerprint").to_numpy().astype(np.uint64, copy=False)
        at = np.minimum(np.searchsorted(fps, have), len(fps) - 1)
        wanted = np.flatnonzero(fps[at] == have)
        metrics = rows.column("metric").take(wanted).to_pylist()
        maps = rows.column("labels").take(wanted).to_pylist()
        out: list[Labels | None] = [None] * len(fps)
        for i, metric, pairs in zip(at[wanted].tolist(), metrics, maps, strict=True):
            out[i] = tuple(sorted([("__name__", metric), *((k, v) for k, v in pairs if v != "")]))
        return out

    def _fingerprint(self, labels: Labels) -> tuple[int, str]:
        """The series' fingerprint and metric name, remembered: a steady stream of the same series
        (remote_write sends each one every scrape) costs one dict lookup per series per batch."""
        meta = self._fp_cache.get(labels)
        if meta is None:
            if len(self._fp_cache) > _SERIES_CACHE_MAX:
                self._fp_cache.clear()
            meta = self._fp_cache[labels] = (series_fingerprint(labels), dict(labels)["__name__"])
        return meta

    def _series_rows(
        self,
        batch: SampleBatch | HistogramBatch,
        fps: np.ndarray[Any, np.dtype[np.uint64]],
        metric_of: Sequence[str] | npt.NDArray[np.object_],
    ) -> tuple[pa.Table | None, list[tuple[int, int]]]:
        days = batch.ts_ms // _MS_PER_DAY
        first, last = int(days.min()), int(days.max())
        # Seen pairs are skipped even under a dedup token: a retry then sends fewer rows under
        # the same token, which the engine drops or stores exactly as it would the full set.
        if first == last:  # the common case: every sample of the batch on one UTC day
            # A series row only for a day it has samples on (bincount: O(n), np.unique sorted).
            used = np.flatnonzero(np.bincount(batch.series_idx, minlength=len(batch.series)))
            row_days = np.full(len(used), first, np.int64)
        else:
            pairs = np.unique((batch.series_idx.astype(np.int64) << 24) | (days & 0xFFFFFF))
            used, row_days = pairs >> 24, pairs & 0xFFFFFF
        with self._series_lock:
            new = ~self._seen(fps[used], row_days)
        if not new.any():
            return None, []
        idx, row_days = used[new], row_days[new]
        row_fps = fps[idx]
        data = pa.table(
            {
                "date": pa.array(row_days.astype(np.int32), pa.date32()),
                "metric": pa.array(
                    metric_of[idx]
                    if isinstance(metric_of, np.ndarray)
                    else [metric_of[i] for i in idx.tolist()],
                    pa.string(),
                ),
                "fingerprint": pa.array(row_fps, pa.uint64()),
                "labels": _labels_map([batch.series[i] for i in idx.tolist()]),
            }
        )
        return data, list(zip(row_fps.tolist(), row_days.tolist(), strict=True))

    def _seen(
        self, fps: np.ndarray[Any, np.dtype[np.uint64]], days: np.ndarray[Any, Any]
    ) -> npt.NDArray[np.bool_]:
        """Whether each (fingerprint, day) pair's series row is written (under the series lock)."""
        out = np.zeros(len(fps), np.bool_)
        for day in np.unique(days).tolist() if len(days) else ():
            known = self._seen_by_day.get(day)
            if known is not None and len(known):
                on = days == day
                out[on] = find_sorted(known, fps[on]) >= 0
        return out

    def _mark_series(self, keys: Sequence[tuple[int, int]]) -> None:
        if not keys:
            return
        fps = np.fromiter((k[0] for k in keys), np.uint64, len(keys))
        days = np.fromiter((k[1] for k in keys), np.int64, len(keys))
        with self._series_lock:
            if sum(len(a) for a in self._seen_by_day.values()) > _SERIES_CACHE_MAX:
                self._seen_by_day.clear()
            for day in np.unique(days).tolist():
                new = np.unique(fps[days == day])
                have = self._seen_by_day.get(day)
                if have is not None and len(have):
                    new = new[find_sorted(have, new) < 0]
                    # Inserted in place of a sort of the whole day's array: O(n) per batch.
                    new = np.insert(have, np.searchsorted(have, new), new)
                self._seen_by_day[day] = new

    @staticmethod
    def _spans_table(spans: SpanBatch) -> pa.Table:
        start = np.asarray(spans.start_ns, dtype=np.int64)
        end = np.asarray(spans.end_ns, dtype=np.int64)
        instance = _instance_column(spans.instance)
        return pa.table(
            {
                "instance": instance,
                "gpu": pa.array(spans.gpu, pa.uint16()),
                "stream": pa.array(spans.stream, pa.uint64()),
                # Dictionary-encoded (a batch holds few distinct names): the LowCardinality column
                # is then filled from the dictionary, not by hashing every row's string in chDB.
                "kernel": _kernel_column(spans),
                "start": pa.array(start, pa.timestamp("ns", tz="UTC")),
                "end": pa.array(end, pa.timestamp("ns", tz="UTC")),
                "duration_ns": pa.array(np.maximum(end - start, 0).astype(np.uint64), pa.uint64()),
                "correlation": pa.array(spans.correlation, pa.uint64()),
                "pid": pa.array(spans.pid, pa.uint32()),
                "launch_ns": pa.array(spans.launch_ns, pa.int64()),
                "launch_host_ns": pa.array(spans.launch_host_ns, pa.uint32()),
                "tid": pa.array(spans.tid, pa.uint32()),
                **_owner_columns(spans),
                "nvtx_range": _nvtx_column(spans),
            }
        )

    def insert_spans(self, spans: SpanBatch, *, dedup_token: str | None = None) -> int:
        self._check_open()
        if len(spans) == 0:
            return 0
        self._write(
            "kernel_spans",
            self._spans_table(spans),
            None if dedup_token is None else f"{dedup_token}:kernel_spans",
        )
        return len(spans)

    @staticmethod
    def _calls_table(calls: CallBatch) -> pa.Table:
        instance = _instance_column(calls.instance)
        return pa.table(
            {
                "instance": instance,
                "gpu": pa.array(calls.gpu, pa.uint16()),
                "track": pa.array(calls.track, pa.string()),
                "op": pa.array(calls.op, pa.string()),
                "start": pa.array(np.asarray(calls.start_ns, np.int64), pa.timestamp("ns", tz="UTC")),
                "duration_ns": pa.array(calls.duration_ns, pa.uint64()),
                "bytes": pa.array(calls.bytes, pa.uint64()),
                "handle": pa.array(calls.handle, pa.uint64()),
                "pid": pa.array(calls.pid, pa.uint32()),
                "tid": pa.array(calls.tid, pa.uint32()),
                "rank": pa.array(calls.rank, pa.uint32()),
                "nranks": pa.array(calls.nranks, pa.uint32()),
                "status": pa.array(calls.status, pa.int32()),
                "failed": pa.array(calls.failed, pa.uint8()),
            }
        )

    def insert_calls(self, calls: CallBatch, *, dedup_token: str | None = None) -> int:
        """Write NCCL, memory and sync calls (``gpu_calls``); the collector writes them with a batch."""
        self._check_open()
        if len(calls) == 0:
            return 0
        _check_ns_range(calls.start_ns, "call start")
        self._write(
            "gpu_calls", self._calls_table(calls), None if dedup_token is None else f"{dedup_token}:gpu_calls"
        )
        return len(calls)

    @staticmethod
    def _events_table(events: Sequence[Event]) -> pa.Table:
        return pa.table(
            {
                "instance": pa.array([e.instance for e in events], pa.string()),
                "gpu": pa.array([e.gpu for e in events], pa.uint16()),
                "ts": pa.array([e.ts_ns for e in events], pa.timestamp("ns", tz="UTC")),
                "kind": pa.array([e.kind for e in events], pa.string()),
                "code": pa.array([e.code for e in events], pa.int64()),
                "aux": pa.array([e.aux for e in events], pa.uint64()),
                "pid": pa.array([e.pid for e in events], pa.uint32()),
                "message": pa.array([e.message for e in events], pa.string()),
            }
        )

    def insert_events(self, events: Sequence[Event], *, dedup_token: str | None = None) -> int:
        self._check_open()
        if not events:
            return 0
        self._write(
            "events", self._events_table(events), None if dedup_token is None else f"{dedup_token}:events"
        )
        return len(events)

    @staticmethod
    def _instances_table(instances: Sequence[InstanceInfo]) -> pa.Table:
        smap = pa.map_(pa.string(), pa.string())
        return pa.table(
            {
                "id": pa.array([i.id for i in instances], pa.string()),
                "hardware_fingerprint": pa.array([i.hardware_fingerprint for i in instances], pa.string()),
                "gpu_count": pa.array([i.gpu_count for i in instances], pa.uint16()),
                "gpu_model": pa.array([i.gpu_model for i in instances], pa.string()),
                "memory_total_bytes": pa.array([i.memory_total_bytes for i in instances], pa.uint64()),
                "labels": pa.array([sorted(i.labels.items()) for i in instances], smap),
                "attributes": pa.array([sorted(i.attributes.items()) for i in instances], smap),
                "last_seen": pa.array([i.last_seen_ms for i in instances], pa.timestamp("ms", tz="UTC")),
            }
        )

    def upsert_instances(self, instances: Sequence[InstanceInfo], *, dedup_token: str | None = None) -> int:
        """Write instance rows; ReplacingMergeTree keeps the newest per id, ``FINAL`` reads see only that."""
        self._check_open()
        if not instances:
            return 0
        self._write(
            "instances",
            self._instances_table(instances),
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
            out.start_timestamp_metrics = _start_metrics(samples)
            out.ts_ms = samples.ts_ms
            out.tables["samples"] = data
            out.samples = samples
            if series is not None:
                out.tables["series"] = series
            out.rows += len(samples)
        if histograms is not None and len(histograms):
            data, series, out.histogram_metrics, keys = self._histogram_rows(histograms)
            out.start_timestamp_metrics = [*out.start_timestamp_metrics, *_start_metrics(histograms)]
            out.tables["histograms"] = data
            if series is not None:
                have = out.tables.get("series")
                out.tables["series"] = series if have is None else _concat([have, series])
                out.series_keys = [*out.series_keys, *keys]
            out.rows += len(histograms)
        if spans is not None and len(spans):
            _check_ns_range(spans.start_ns, "span start")
            _check_ns_range(spans.end_ns, "span end")
            out.tables["kernel_spans"] = self._spans_table(spans)
            out.rows += len(spans)
        if calls is not None and len(calls):
            _check_ns_range(calls.start_ns, "call start")
            out.tables["gpu_calls"] = self._calls_table(calls)
            out.rows += len(calls)
        if events:
            _check_ns_range(np.fromiter((e.ts_ns for e in events), np.int64, len(events)), "event time")
            out.tables["events"] = self._events_table(events)
            out.rows += len(events)
        if instances:
            out.tables["instances"] = self._instances_table(instances)
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
        for name in _GROUP_ORDER:
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
                    self._mark_series(keys)
                elif name == "samples":
                    try:
                        self._write("samples", _concat(parts), f"{token}:samples")
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
                    self._write(name, _concat(parts), f"{token}:{name}")
                done.add(name)
            if name == _TEST_KILL_AFTER_TABLE and sum(p.record for p in group) > 1:
                os.kill(os.getpid(), signal.SIGKILL)
        recorded = [p for p in group if p.record]
        with self._group_step:
            if "batches" not in done and recorded:
                self._write("batches", _batches_rows(recorded), f"{token}:batches")
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
        tables: dict[str, pa.Table] = {}
        for name in _GROUP_ORDER:
            parts = [p.tables[name] for p in group if name in p.tables]
            if not parts or name in done:
                continue
            # The rows insert_prepared is about to write, so a replay's insert is the same block
            # under the same token (series: the pairs not written before, as it chooses them).
            data = self._new_series(parts, group)[0] if name == "series" else _concat(parts)
            if data is not None:
                tables[name] = data
        tables["batches"] = _batches_rows(recorded)
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
        groups: list[WalGroup] = []
        for path, done in list(self._groups_logged.items()):
            try:
                group = IngestWal.read(path)
            except (OSError, WalCorrupt) as exc:
                raise StorageError(
                    f"cannot read the ingest write-ahead file {path} for a backup: {exc}"
                ) from exc
            left = {name: table for name, table in group.tables.items() if name not in done}
            if left:
                groups.append(WalGroup(path, group.token, left))
        return groups

    def replay_ingest_wal(self, wal: IngestWal) -> int:
        """Store each group left in ``wal`` with its own token, ``batches`` rows last, and remove
        its file; the number of groups replayed.

        The engine drops the tables that had landed (their tokens survive restarts) and stores
        the rest. A file that does not read back whole, names a table that is not ingest's, holds
        batches of which some are stored already (another group stored them: replaying could
        store rows twice), or that storage refuses is set aside (``*.bad``, logged) and the store
        opens without it; a group whose batches are all stored had finished, and is removed.
        StorageUnavailable propagates: the store does not open until the files can be replayed."""
        replayed = 0
        known = {*_GROUP_ORDER, "batches"}
        for path in wal.pending():
            try:
                group = wal.read(path)
            except (WalCorrupt, OSError) as exc:
                wal.set_aside(path, str(exc))
                continue
            strange = sorted(set(group.tables) - known)
            batches = group.tables.get("batches")
            if strange or batches is None or list(group.tables)[-1] != "batches":
                wal.set_aside(path, f"not an ingest group (tables {list(group.tables)})")
                continue
            ids = {str(b) for b in batches.column("batch_id").to_pylist()}
            seen = self.batches_seen(sorted(ids))
            if seen == ids:
                wal.remove(path)  # the group had finished; its file's removal had not reached the disk
                continue
            if seen:
                wal.set_aside(
                    path, f"{len(seen)} of its {len(ids)} batches are stored already, e.g. {min(seen)}"
                )
                continue
            try:
                for name, table in group.tables.items():
                    self.insert_table(name, table, dedup_token=f"{group.token}:{name}")
            except StorageUnavailable:
                raise
            except (StorageError, ValueError) as exc:
                wal.set_aside(path, f"storage refused it: {exc}")
                continue
            wal.remove(path)
            replayed += 1
            log.warning(
                "ingest WAL: replayed group %s (%d batches) that an earlier process had not finished",
                group.token,
                len(ids),
            )
        return replayed

    def _new_series(
        self, parts: list[pa.Table], group: Sequence[PreparedRows]
    ) -> tuple[pa.Table | None, list[tuple[int, int]]]:
        """The group's series rows without repeats and without pairs another group wrote since."""
        keys = [k for p in group for k in p.series_keys]
        if not keys:
            return None, keys
        fps = np.fromiter((k[0] for k in keys), np.uint64, len(keys))
        days = np.fromiter((k[1] for k in keys), np.int64, len(keys))
        # The first row of each pair (np.unique's index), of the pairs not written meanwhile.
        _, first = np.unique(np.stack([fps, days.astype(np.uint64)]), axis=1, return_index=True)
        first.sort()
        with self._series_lock:
            keep = first[~self._seen(fps[first], days[first])]
        if not len(keep):
            return None, keys
        data = _concat(parts)
        return (data if len(keep) == len(keys) else data.take(pa.array(keep, pa.int64()))), keys

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


class EmbeddedStore(Store):
    """ClickHouse in-process (chDB) on a data directory; one per directory per process.

    Inserts hand Arrow tables to the engine through the ``Python()`` table function, which
    reads the Arrow buffers in place; row-by-row INSERT statements are orders of magnitude slower.
    Small parts are written packed, one file each (``PACKED_SETTINGS``, docs/storage.md, "Merges").
    """

    def __init__(
        self,
        path: str | Path,
        database: str = "ki",
        retention: Retention | None = None,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        head_bytes: int = 0,
        head_window_ms: int = DEFAULT_HEAD_WINDOW_MS,
        ingest_wal: str | Path | None = None,
    ) -> None:
        super().__init__(database, retention)
        from chdb import session as chdb_session

        session_cls: Any = chdb_session.Session

        self.path = Path(path)
        # Samples, keys and tokens live here: a directory we create is readable by its owner only.
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._insert_lock = threading.Lock()
        # chDB runs one statement of a session at a time anyway (three concurrent sleep(1): 3 s);
        # the lock keeps a failed statement and the throwaway query after it together (_run).
        self._session_lock = threading.Lock()
        self._cleanup_stop = threading.Event()
        self._cleanup_thread: threading.Thread | None = None
        try:
            self._session: Any = session_cls(str(self.path))
        except Exception as exc:
            # chDB lets one process at a time use a data directory; the engine's own message
            # ("Error initializing EmbeddedServer") does not say so.
            raise StorageUnavailable(
                f"cannot open the embedded store at {self.path}: is another process (a running collector?) "
                f"using it? Only one process at a time can; send through the collector instead (ki import --collector URL) "
                f"({str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__})"
            ) from exc
        try:
            # Results cross no wire here: LZ4 on Arrow output only cost time.
            self._command("SET output_format_arrow_compression_method = 'none'")
            # Packed small parts where the engine has them (chDB 4.4 does; an older one creates
            # its tables as before rather than refusing an unknown setting).
            p = Params()
            names = ", ".join(p(k, "String") for k in PACKED_SETTINGS)
            known = set(
                self._query(f"SELECT name FROM system.merge_tree_settings WHERE name IN ({names})", p)
                .column("name")
                .to_pylist()
            )
            packed = {k: v for k, v in PACKED_SETTINGS.items() if k in known}
            self._table_settings = {
                t.name: {**packed, **EMBEDDED_TABLE_SETTINGS.get(t.name, {})} for t in SCHEMA
            }
            self.create_schema()
            if ingest_wal is not None:  # before the head loads: what a replay stores is in it
                self.open_ingest_wal(ingest_wal)
        except BaseException:
            self.close()  # a half-opened session would hold the directory for this process
            raise
        # One process owns the directory, so every write passes through here: the cache is exact,
        # and so is the set of metrics with histograms.
        self.sample_cache = SampleCache(cache_bytes) if cache_bytes > 0 else None
        self._track_metrics = True
        if head_bytes > 0:
            self.enable_head(head_bytes, head_window_ms)
        self._cleanup_thread = threading.Thread(
            target=self._cleanup_loop, name="ki-store-cleanup", daemon=True
        )
        self._cleanup_thread.start()

    def _cleanup_loop(self) -> None:
        """Have the engine delete replaced parts every ``CLEANUP_INTERVAL_S``, busy or idle."""
        while not self._cleanup_stop.wait(CLEANUP_INTERVAL_S):
            try:
                self._command("SYSTEM START CLEANUP")
            except StorageError as exc:  # closing, or a transient engine error: the next round retries
                log.debug("embedded store cleanup: %s", exc)

    def _run(self, sql: str, fmt: str, params: Params | None = None) -> Any:
        self._check_open()
        texts = params.texts() if params else None
        with self._session_lock, _engine_errors("embedded ClickHouse"):
            try:
                return self._session.query(sql, fmt, params=texts)
            except Exception:
                # chDB hands what a statement that failed mid-stream had already produced (rows
                # of a throwIf, a result over max_result_rows, a memory limit) to the session's
                # next query, another thread's too, as that query's result: a throwaway
                # statement takes it instead, before any other statement can run.
                with contextlib.suppress(Exception):
                    self._session.query("SELECT 1", "CSV")
                raise

    def _command(self, sql: str, params: Params | None = None) -> None:
        self._run(sql, "CSV", params)

    def _query(self, sql: str, params: Params | None = None) -> pa.Table:
        # ArrowStream read by pyarrow directly: chdb.to_arrowTable would import pandas (0.3 s).
        result = self._run(sql, "ArrowStream", params)
        data = result.bytes()
        if not data:
            raise StorageError(f"embedded ClickHouse returned no result set for: {sql[:200]}")
        table_: pa.Table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
        return table_

    def _query_blob(self, sql: str, params: Params | None = None) -> bytes:
        data: bytes = self._run(sql, "RawBLOB", params).bytes()
        return data

    def purge_allocator(self) -> None:
        """Hand the engine's freed memory back to the system now (``SYSTEM JEMALLOC PURGE``)."""
        self.command("SYSTEM JEMALLOC PURGE")

    @contextlib.contextmanager
    def writes_held(self) -> Iterator[None]:
        """No insert runs while this is held: a backup freezes every table at one moment
        (collector/backup.py)."""
        with self._group_step, self._insert_lock:
            yield

    def _insert(self, name: str, data: pa.Table, token: str | None) -> None:
        cols = ", ".join(ident(c) for c in data.column_names)
        # An INSERT's SETTINGS take no parameters; the token is ours (batch id and table name).
        settings = f" SETTINGS insert_deduplication_token = {literal(token)}" if token else ""
        # chDB resolves Python(_ki_arrow_data) by looking the name up from this frame, and two
        # threads doing so at once can be handed each other's table: inserts take turns.
        _ki_arrow_data = data
        with self._insert_lock:
            self._run(
                f"INSERT INTO {self._table(name)} ({cols}){settings} SELECT {cols} FROM Python(_ki_arrow_data)",
                "CSV",
            )

    def _close(self) -> None:
        self._cleanup_stop.set()
        if self._cleanup_thread is not None:
            self._cleanup_thread.join()
        try:
            self._session.close()
        finally:
            self._session = None


class ServerStore(Store):
    """A ClickHouse server or cluster through clickhouse-connect (any client it returns works).

    Example::

        store = ServerStore.connect("http://default:@clickhouse:8123", cluster="ki")
    """

    def __init__(
        self,
        client: Any,
        database: str = "ki",
        retention: Retention | None = None,
        *,
        cluster: str | None = None,
        create_schema: bool = True,
    ) -> None:
        super().__init__(database, retention, cluster)
        self._client = client
        if create_schema:
            try:
                self.create_schema()
            except BaseException:
                self.close()
                raise

    @classmethod
    def connect(
        cls,
        dsn: str,
        database: str = "ki",
        retention: Retention | None = None,
        *,
        cluster: str | None = None,
        **kwargs: Any,
    ) -> ServerStore:
        """Connect through clickhouse-connect; ``kwargs`` go to ``clickhouse_connect.get_client``."""
        import clickhouse_connect

        # One client serves every thread of a collector; a clickhouse-connect session would
        # refuse concurrent queries ("concurrent queries within the same session"), and the
        # store needs no session state, so none is made unless the caller asks for one.
        if "autogenerate_session_id" not in dsn:
            kwargs.setdefault("autogenerate_session_id", False)
        with _engine_errors("cannot connect to ClickHouse"):
            client = clickhouse_connect.get_client(dsn=dsn, **kwargs)
        return cls(client, database, retention, cluster=cluster)

    def _command(self, sql: str, params: Params | None = None) -> None:
        with _engine_errors("ClickHouse"):
            self._client.command(sql, **_passed_through(params))

    def _query(self, sql: str, params: Params | None = None) -> pa.Table:
        with _engine_errors("ClickHouse"):
            result: pa.Table = self._client.query_arrow(sql, **_passed_through(params))
        return result

    def _query_blob(self, sql: str, params: Params | None = None) -> bytes:
        with _engine_errors("ClickHouse"):
            data: bytes = self._client.raw_query(sql, fmt="RawBLOB", **_passed_through(params))
        return data

    def _insert(self, name: str, data: pa.Table, token: str | None) -> None:
        settings = {"insert_deduplication_token": token} if token else {}
        self._check_open()
        with _engine_errors("ClickHouse insert"):
            self._client.insert_arrow(self._table(name), data, settings=settings)

    def _close(self) -> None:
        self._client.close()


class _Text:
    """A parameter already in ClickHouse's text form: clickhouse-connect sends ``str()`` of it as is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _passed_through(params: Params | None) -> dict[str, dict[str, _Text]]:
    """clickhouse-connect's ``parameters`` argument, formatted as for chDB so both engines read the same text."""
    return {"parameters": {k: _Text(v) for k, v in params.texts().items()}} if params else {}


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
