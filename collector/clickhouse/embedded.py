"""The embedded back end of the store: ClickHouse in-process (chDB) on a data directory.

:class:`~kernel_insight.collector.clickhouse.store.Store` holds every statement; this module only
hands a statement or an Arrow table to chDB, keeps the session's one-statement-at-a-time rules and
deletes replaced parts (docs/storage.md, "Merges").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.errors import StorageUnavailable, engine_errors
from kernel_insight.collector.clickhouse.schema import PACKED_SETTINGS, SCHEMA, Retention
from kernel_insight.collector.clickhouse.sql import Params, ident, literal
from kernel_insight.collector.clickhouse.store import Store
from kernel_insight.collector.head import DEFAULT_HEAD_WINDOW_MS
from kernel_insight.collector.sample_cache import DEFAULT_CACHE_BYTES, SampleCache
from kernel_insight.kql.errors import StorageError

__all__ = ["CLEANUP_INTERVAL_S", "EMBEDDED_TABLE_SETTINGS", "EmbeddedStore"]

log = logging.getLogger(__name__)

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
        with self._session_lock, engine_errors("embedded ClickHouse"):
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
