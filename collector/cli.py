"""``ki import FILE`` (backfill text exposition into the store) and ``ki schema`` (print or write the DDL)."""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from kernel_insight.collector.clickhouse.schema import (
    Retention,
    cluster_ddl,
    render_sql_file,
    single_ddl,
    write_deploy_files,
)
from kernel_insight.collector.flags import count_at_least, defer_arguments
from kernel_insight.collector.footprint import (
    drop_library_pages,
    dropping_library_pages,
    modules_unimportable,
)
from kernel_insight.collector.private_json import read_secret_file

if TYPE_CHECKING:
    # Imported where a command runs (numpy, pyarrow, chDB): ki schema and ki --help need none.
    from kernel_insight.collector.clickhouse.store import Store
    from kernel_insight.collector.openmetrics import ExpositionReader
    from kernel_insight.collector.relabel import Relabeler
    from kernel_insight.collector.rows import Labels, SampleBatch, SeriesLimits

__all__ = ["DEFAULT_DATA_DIR", "add_commands", "add_series_limit_arguments", "relabeler", "series_limits"]

#: Where the embedded store keeps its data unless told otherwise.
DEFAULT_DATA_DIR = "./ki-data"

Handler = Callable[[argparse.Namespace], int]


#: Bytes read per step: a few MB of parser state, whatever the file's size (2 MiB parsed faster
#: than 8 MiB and kept less resident: bench/results/import.md).
CHUNK_BYTES = 2 << 20
#: Samples per insert into an embedded store: ClickHouse wants few, large inserts, but an insert's
#: working memory grows with it, ~130 bytes a sample. For the bench file (3.4M samples) at load
#: ~10: 100k, 255-268 MB peak RSS and 4.2-4.5 CPU s; 200k, 271-277 MB and 3.5-3.6 CPU s; 250k,
#: 280-290 MB and 3.4-3.7 CPU s (bench/results/import.md, "Memory of `ki import`").
FLUSH_SAMPLES = 200_000
#: Samples inserted between two drops of chDB's pages (_bounded_writer): what only a merge or the
#: first insert ran leaves the resident set. Each walks /proc/self/smaps, so not after every insert.
DROP_SAMPLES = 1_000_000
#: Samples per remote_write request with ``--collector``, and requests in flight at once.
REQUEST_SAMPLES = 20_000
SENDERS = 4
#: The mapped file name of chDB's engine, and a part of every mapped file's (footprint.drop_library_pages).
_CHDB_LIBRARY = "/_chdb."
_EVERY_FILE = "/"
#: A single line longer than this is refused rather than buffered.
MAX_LINE_BYTES = 64 << 20


class _ImportError(Exception):
    """A message for standard error and an exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _chunks(f: BinaryIO, size: int) -> Iterator[bytes]:
    """Whole lines, about ``size`` bytes at a time (the last chunk may lack its newline)."""
    rest = b""
    while True:
        block = f.read(size)
        if not block:
            if rest:
                yield rest
            return
        block = rest + block if rest else block
        cut = block.rfind(b"\n") + 1
        if cut == 0:
            if len(block) > MAX_LINE_BYTES:
                raise _ImportError(f"a line longer than {MAX_LINE_BYTES} bytes", 1)
            rest = block
            continue
        rest = block[cut:]
        yield block[:cut]


def _tail(f: BinaryIO) -> bytes:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - 64))
    tail = f.read()
    f.seek(0)
    return tail


class _Writer:
    """Stores batches on a thread of its own, so parsing the next chunk overlaps the insert.

    The queue holds at most two batches: memory stays bounded however far the reader gets ahead.
    """

    def __init__(self, write: Callable[[SampleBatch], int]) -> None:
        self._write = write
        self._queue: queue.Queue[SampleBatch | None] = queue.Queue(maxsize=2)
        self.stored = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ki-import-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self.error is None:
                try:
                    self.stored += self._write(batch)
                except BaseException as exc:  # handed to the reading thread, which reports it
                    self.error = exc

    def put(self, batch: SampleBatch) -> None:
        if self.error is not None:
            raise self.error
        self._queue.put(batch)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def _import(args: argparse.Namespace) -> int:
    try:
        return _import_stream(args)
    except _ImportError as exc:
        print(f"ki import: {exc}", file=sys.stderr)
        return exc.status


def _import_stream(args: argparse.Namespace) -> int:
    """Read, parse and store a chunk at a time: memory stays flat whatever the file's size."""
    from kernel_insight.collector.clickhouse.store import StorageError, open_store
    from kernel_insight.collector.openmetrics import ExpositionReader, OpenMetricsError, detect_format
    from kernel_insight.collector.relabel import RelabelError

    try:
        token = _token(args) if args.collector else None
    except OSError as exc:  # before the file is read: a shared token file is refused at once
        raise _ImportError(str(exc), 1) from None
    if args.file == "-":
        # Standard input cannot be seeked for the format check: spool it to disk, not memory.
        spool = tempfile.TemporaryFile()  # noqa: SIM115 -- closed with f below
        shutil.copyfileobj(sys.stdin.buffer, spool, CHUNK_BYTES)
        spool.seek(0)
        f: BinaryIO = spool
    else:
        try:
            f = Path(args.file).open("rb")  # noqa: SIM115 -- closed below, after the stream
        except OSError as exc:
            raise _ImportError(f"cannot read {args.file}: {exc.strerror}", 1) from None
    limits = series_limits(args)
    try:
        rules = relabeler(args)
    except RelabelError as exc:
        f.close()
        raise _ImportError(str(exc), 2) from None
    # pyarrow would import pandas (~55 MB) on its first array only to ask whether the data is a
    # pandas object; nothing here is one (bench/results/import.md, "Memory of `ki import`").
    with f, modules_unimportable("pandas"):
        fmt = args.format if args.format != "auto" else detect_format(_tail(f))
        default_ts = None if args.require_timestamps else int(time.time() * 1000)
        reader = ExpositionReader(format=fmt, default_timestamp_ms=default_ts, limits=limits)
        size = os.fstat(f.fileno()).st_size
        try:
            if args.collector:
                sender = _Sender(args.collector, token)
                try:
                    n, series = _pump(
                        f, reader, sender.send, REQUEST_SAMPLES * SENDERS, size, args.file, rules
                    )
                finally:
                    sender.close()
            else:
                # cache_bytes=0: nothing reads through this process, so no hours to keep or invalidate.
                # chDB's static initialisers touch ~165 MB of its library (as much again as an
                # import's whole working set): dropped as they go, it is never all resident; and
                # what the imports ran once (Python's, numpy's, Arrow's start-up code) is dropped
                # before; the peak RSS while the store opens is lower for it (bench/results/import.md).
                drop_library_pages(_EVERY_FILE)
                with dropping_library_pages(_CHDB_LIBRARY):
                    opened = open_store(args.store, cluster=args.cluster, cache_bytes=0)
                with opened as store:
                    n, series = _pump(
                        f,
                        reader,
                        _bounded_writer(store),
                        args.insert_samples or FLUSH_SAMPLES,
                        size,
                        args.file,
                        rules,
                    )
        except OpenMetricsError as exc:
            raise _ImportError(f"{args.file}: {exc}", 1) from None
        except (StorageError, ValueError, OSError) as exc:
            raise _ImportError(str(exc), 2) from None
    note = f", {reader.defaulted} without a timestamp stored at import time" if reader.defaulted else ""
    print(f"imported {n} samples of {series} series ({fmt}){note}")
    return 0


def _bounded_writer(store: Store) -> Callable[[SampleBatch], int]:
    """``store.insert_samples``, keeping an embedded store's resident memory to what an insert needs.

    chDB's allocator (jemalloc) is purged after each insert: it keeps freed pages for seconds,
    and an insert frees most of its ~130 bytes a sample (anonymous memory at the peak for the
    bench's samples, bench/results/import.md "Memory of `ki import`"). chDB's
    library pages are dropped every ``DROP_SAMPLES`` (footprint.drop_library_pages). A ClickHouse
    server's memory is its own business.
    """
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    if not isinstance(store, EmbeddedStore):
        return store.insert_samples
    stored = 0
    next_drop = 0  # after the first insert (what creating the tables ran), then every DROP_SAMPLES

    def write(batch: SampleBatch) -> int:
        nonlocal stored, next_drop
        n = store.insert_samples(batch)
        store.purge_allocator()
        stored += n
        if stored >= next_drop:
            next_drop = stored + DROP_SAMPLES
            drop_library_pages(_CHDB_LIBRARY)
        return n

    return write


def _pump(
    f: BinaryIO,
    reader: ExpositionReader,
    write: Callable[[SampleBatch], int],
    flush_samples: int,
    size: int,
    name: str,
    rules: Relabeler | None = None,
) -> tuple[int, int]:
    """Chunks -> reader -> writer thread, with a progress bar on a terminal; (samples, series) stored."""
    from kernel_insight.collector.rows import concat_samples

    writer = _Writer(write)
    pending: list[SampleBatch] = []
    waiting = 0
    seen: set[Labels] = set()
    progress = _progress(size, name)
    try:
        for chunk in _chunks(f, CHUNK_BYTES):
            batch = reader.feed(chunk)
            if rules is not None:
                batch = rules.apply_batch(batch)
            if len(batch):
                seen.update(batch.series)
                pending.append(batch)
                waiting += len(batch)
            if waiting >= flush_samples:
                writer.put(concat_samples(pending))
                pending, waiting = [], 0
            if progress is not None:
                progress(len(chunk), reader.lines)
        reader.finish()
        if pending:
            writer.put(concat_samples(pending))
    finally:
        try:
            writer.close()
        finally:
            if progress is not None:
                progress(0, -1)
    return writer.stored, len(seen)


def _progress(total: int, name: str) -> Callable[[int, int], None] | None:
    """A rich progress bar on standard error when it is a terminal; ``advance(bytes, lines)``, lines -1 ends it."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[lines]} lines"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(f"importing {Path(name).name}", total=total or None, lines=0)
    bar.start()

    def advance(nbytes: int, lines: int) -> None:
        if lines < 0:
            bar.stop()
        else:
            bar.update(task, advance=nbytes, lines=f"{lines:,}")

    return advance


def _token(args: argparse.Namespace) -> str | None:
    """The ingest token: from --token-file, else $KI_TOKEN, else the deprecated --token (which
    every user of the machine can read in ``ps``, so it says so)."""
    if args.token_file:
        return read_secret_file(Path(args.token_file)) or None
    if os.environ.get("KI_TOKEN"):
        return os.environ["KI_TOKEN"].strip()
    if args.token:
        print(
            "ki import: --token is deprecated: any user can read it in the process list; "
            "use --token-file FILE or $KI_TOKEN",
            file=sys.stderr,
        )
        return str(args.token)
    return None


class _Sender:
    """remote_write requests to a running collector, ``SENDERS`` at once over keep-alive connections."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/") + "/api/v1/write"
        from kernel_insight.collector.remote_write import SeriesEncoder

        self.encoder = SeriesEncoder()
        self.client = httpx.Client(timeout=120, headers=headers, limits=httpx.Limits(max_connections=SENDERS))
        self.pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="ki-import-send")

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()

    def _post(self, body: bytes) -> None:
        r = self.client.post(self.url, content=body)
        if r.status_code != 204:
            raise OSError(f"the collector answered {r.status_code}: {r.text[:300]}")

    def send(self, batch: SampleBatch) -> int:
        """Split ``batch`` into requests of ``REQUEST_SAMPLES`` samples, sent ``SENDERS`` at a time."""
        from kernel_insight.collector.rows import SampleBatch

        bodies = [
            self.encoder.encode(
                SampleBatch(
                    batch.series,
                    batch.series_idx[i : i + REQUEST_SAMPLES],
                    batch.ts_ms[i : i + REQUEST_SAMPLES],
                    batch.values[i : i + REQUEST_SAMPLES],
                )
            )
            for i in range(0, len(batch), REQUEST_SAMPLES)
        ]
        for _ in self.pool.map(self._post, bodies):
            pass
        return len(batch)


def _schema(args: argparse.Namespace) -> int:
    if args.write:
        for path in write_deploy_files(Path(args.write)):
            print(path)
        return 0
    try:
        retention = Retention(
            samples_days=args.retention_samples,
            spans_days=args.retention_spans,
            events_days=args.retention_events,
            series_days=args.retention_series,
        )
    except ValueError as exc:
        print(f"ki schema: {exc}", file=sys.stderr)
        return 1
    if args.cluster:
        statements = cluster_ddl(args.database, args.cluster, retention)
    else:
        statements = single_ddl(args.database, retention)
    print(render_sql_file(statements, "Kernel Insight schema"), end="")
    return 0


def add_series_limit_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The flags of ``SeriesLimits``, shared by ``ki import`` and ``ki collector`` (remote_write)."""
    from kernel_insight.collector.defaults import SeriesLimits

    defaults = SeriesLimits()
    parser.add_argument(
        "--max-labels",
        type=count_at_least(0, "labels"),  # 0: no limit; a negative one refused every series
        default=defaults.max_labels,
        help=f"most labels per series, __name__ included (default {defaults.max_labels}, 0 = no limit)",
    )
    parser.add_argument(
        "--max-name-bytes",
        type=count_at_least(0, "bytes"),  # 0: no limit; a negative one refused every series
        default=defaults.max_name_bytes,
        help=f"longest metric or label name (default {defaults.max_name_bytes}, 0 = no limit)",
    )
    parser.add_argument(
        "--max-value-bytes",
        type=count_at_least(0, "bytes"),  # 0: no limit; a negative one refused every series
        default=defaults.max_value_bytes,
        help=f"longest label value (default {defaults.max_value_bytes}, 0 = no limit)",
    )
    parser.add_argument(
        "--utf8-names",
        action="store_true",
        help="accept any UTF-8 metric and label names (Prometheus 3's utf8 scheme) instead of the classic ones",
    )
    parser.add_argument(
        "--relabel-config",
        metavar="FILE",
        help="YAML list of Prometheus relabel rules applied to every series before it is stored "
        "(docs/storage.md, Relabelling)",
    )


def relabeler(args: argparse.Namespace) -> Relabeler | None:
    """The ``--relabel-config`` rules; raises :class:`RelabelError` (a ValueError) for a bad file."""
    from kernel_insight.collector.relabel import Relabeler, load_relabel_configs

    path = getattr(args, "relabel_config", None)
    return Relabeler(load_relabel_configs(path)) if path else None


def series_limits(args: argparse.Namespace) -> SeriesLimits:
    """``SeriesLimits`` from the flags ``add_series_limit_arguments`` added."""
    from kernel_insight.collector.rows import SeriesLimits

    return SeriesLimits(
        max_labels=args.max_labels,
        max_name_bytes=args.max_name_bytes,
        max_value_bytes=args.max_value_bytes,
        utf8_names=args.utf8_names,
    )


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="load OpenMetrics / Prometheus text (with timestamps) into the store")
    defer_arguments(p, _import_arguments)

    retention = Retention()
    s = sub.add_parser(
        "schema", help="print the ClickHouse DDL (single server or cluster), or regenerate deploy/"
    )
    s.add_argument("--cluster", default=None, help="emit the cluster layout for this cluster name")
    s.add_argument("--database", default="ki", help="database name (default ki)")
    s.add_argument("--write", metavar="DIR", help="write schema-single.sql and schema-cluster.sql into DIR")
    for kind in ("samples", "spans", "events", "series"):
        default = getattr(retention, f"{kind}_days")
        shown = "as samples" if default is None else default
        s.add_argument(
            f"--retention-{kind}",
            type=int,
            default=default,
            metavar="DAYS",
            help=f"days to keep {kind}, 0 = forever (default {shown})",
        )
    s.set_defaults(handler=_schema)


def _import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the exposition file, or - for standard input")
    p.add_argument(
        "--store",
        default=DEFAULT_DATA_DIR,
        help=f"embedded data directory, or a ClickHouse URL such as http://host:8123 (default {DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "--format",
        default="auto",
        choices=["auto", "prometheus", "openmetrics"],
        help="auto: OpenMetrics when the text ends with '# EOF' (timestamps in seconds), else Prometheus (ms)",
    )
    p.add_argument(
        "--require-timestamps",
        action="store_true",
        help="refuse samples without a timestamp instead of stamping them with the import time",
    )
    p.add_argument(
        "--cluster", default=None, help="ClickHouse cluster name (cluster layout, docs/storage.md)"
    )
    p.add_argument(
        "--insert-samples",
        type=count_at_least(1, "samples"),
        default=None,
        metavar="N",
        help=f"samples per insert into the store (default {FLUSH_SAMPLES:,}: peak RSS under 300 MB; an insert "
        "holds ~130 bytes a sample; 100,000 takes ~15 MB less and ~20%% more CPU)",
    )
    p.add_argument(
        "--collector",
        default=None,
        metavar="URL",
        help="send through a running collector's remote_write endpoint instead (e.g. http://127.0.0.1:8470)",
    )
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding a bearer token with the ingest scope for --collector (default: $KI_TOKEN)",
    )
    p.add_argument(
        "--token", default=None, help="deprecated (visible in ps): the token itself; use --token-file"
    )
    add_series_limit_arguments(p)
    p.set_defaults(handler=_import)
