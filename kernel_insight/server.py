"""``ki collector``: the one server process: agent ingest, remote_write, the query and health API.

The composition root: it is the only place that knows every router, so the
routers themselves stay independent of each other.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# ki collector's number types; re-exported for ki run (kernel_insight/run.py), which words its own alike
from kernel_insight.collector.flags import (
    DeferredParser,
    at_least,
    count_at_least,
    defer_arguments,
    port_number,
)

if TYPE_CHECKING:
    from fastapi import APIRouter, FastAPI

    from kernel_insight.api.health import HealthRule
    from kernel_insight.kql.limits import EngineLimits
    from kernel_insight.rules.manager import RuleManager

__all__ = [
    "AUTH_STORES",
    "DEFAULT_PORT",
    "add_commands",
    "at_least",
    "auth_store_kind",
    "build_collector_app",
    "port_number",
]

#: Port the collector listens on when none is given.
DEFAULT_PORT = 8470


#: Where agent keys and API tokens live: files beside an embedded store, tables in a ClickHouse one.
AUTH_STORES = ("auto", "file", "table")


def auth_store_kind(store: Any, requested: str = "auto") -> str:
    """``file`` or ``table``: ``auto`` picks the table for a ClickHouse server (several collectors
    may share it, and must share enrolments and revocations), the files for an embedded store."""
    from kernel_insight.collector.clickhouse.store import ServerStore

    if requested not in AUTH_STORES:
        raise ValueError(f"unknown auth store {requested!r} (known: {', '.join(AUTH_STORES)})")
    if requested != "auto":
        return requested
    return "table" if isinstance(store, ServerStore) else "file"


def _closing(sink: Any) -> APIRouter:
    """A router whose lifespan writes what the sink has queued when the app shuts down: uvicorn
    re-raises SIGTERM once the server stopped, so code after ``serve()`` may never run."""
    import contextlib
    from collections.abc import AsyncIterator

    from fastapi import APIRouter
    from starlette.concurrency import run_in_threadpool

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(sink.close)

    return APIRouter(lifespan=lifespan)


def build_collector_app(
    store: Any,
    *,
    keys_path: Path | None = None,
    tokens_path: Path | None = None,
    local_dev: bool = False,
    interval_s: float = 5.0,
    auth_store: str = "auto",
    rules: RuleManager | None = None,
    stats_interval_s: float | None = None,
    health_rule: HealthRule | None = None,
    series_limits: Any = None,
    query_limits: EngineLimits | None = None,
    relabeler: Any = None,
    sync_keep_ns: int | None = None,
    sync_sample_every: int | None = None,
    histogram_base_bytes: int | None = None,
    remote_write_series: int | None = None,
) -> FastAPI:
    """The collector app over ``store``: agent ingest, remote_write (scope ``ingest``), agent
    enrolment (``ingest-admin``) and the query and health API (``read``); no token checks in
    local-dev mode. Keys and tokens live in files (``keys_path``, ``tokens_path``) or, with
    ``auth_store`` ``table`` (``auto`` over a ClickHouse server), in tables of ``store``.
    ``rules`` (docs/rules.md) is started and stopped with the app; ``/api/v1/rules`` and
    ``/api/v1/alerts`` answer (empty without it). ``health_rule`` judges the snapshot (the
    default ``HealthRule()`` when None). ``/metrics`` reads the store's parts per table every ``stats_interval_s`` (None: the default).
    ``query_limits`` bound every query of the Prometheus API (None: ``EngineLimits()``, docs/kql.md).
    ``histogram_base_bytes`` bounds the histogram bases of all agents together (docs/wire.md,
    "Increments"; None: ``BASE_MAX_BYTES``).
    The web UI (docs/ui.md) is served at ``/``."""
    from kernel_insight.api import ClickHouseTokenStore, TokenStore, TokenStoreBase, create_api_app
    from kernel_insight.collector.captures import CaptureDesk
    from kernel_insight.collector.ingest import ingest_router
    from kernel_insight.collector.keys import ClickHouseKeyStore, KeyStore, KeyStoreBase
    from kernel_insight.collector.metrics import (
        DEFAULT_STORE_STATS_INTERVAL_S,
        CollectorMetrics,
        RelabelFigures,
    )
    from kernel_insight.collector.sink import StoreSink

    keys: KeyStoreBase
    tokens: TokenStoreBase | None = None
    if auth_store_kind(store, auth_store) == "table":
        keys = ClickHouseKeyStore(store)
        if not local_dev:
            tokens = ClickHouseTokenStore(store)
    else:
        if keys_path is None:
            raise ValueError("a file key store needs keys_path")
        keys = KeyStore(keys_path)
        if not local_dev:
            if tokens_path is None:
                raise ValueError("a collector that checks tokens needs tokens_path (or --local-dev)")
            tokens = TokenStore(tokens_path)
    from kernel_insight.api.auth import Authenticator
    from kernel_insight.api.ui import ui_router
    from kernel_insight.rules.api import rules_router

    metrics = CollectorMetrics()
    metrics.watch_store(store, stats_interval_s or DEFAULT_STORE_STATS_INTERVAL_S)
    if store.head is not None:
        metrics.watch_head(store.head)
    # enrolment labels on the instance and its series; which syncs are stored per call (docs/storage.md)
    from kernel_insight.collector.derive import SYNC_KEEP_NS, SYNC_SAMPLE_EVERY
    from kernel_insight.collector.hist_base import BASE_MAX_BYTES, BaseBudget

    sink = StoreSink(
        store,
        labels_of=keys.labels_of,
        sync_keep_ns=SYNC_KEEP_NS if sync_keep_ns is None else sync_keep_ns,
        sync_sample_every=SYNC_SAMPLE_EVERY if sync_sample_every is None else sync_sample_every,
        base_budget=BaseBudget(BASE_MAX_BYTES if histogram_base_bytes is None else histogram_base_bytes),
    )
    metrics.watch_batcher(sink.batcher)
    metrics.watch_histogram_bases(sink.base_budget)
    # capture windows reach agents in ingest answers (docs/wire.md); instances are agent ids, as in the sink
    ingest = ingest_router(keys, sink, metrics=metrics, captures=CaptureDesk(store))
    rule_api = rules_router(lambda: rules, Authenticator(tokens, local_dev=local_dev), manage_lifecycle=True)
    app = create_api_app(
        store,
        tokens=tokens,
        local_dev=local_dev,
        interval_s=interval_s,
        rule=health_rule,
        # _closing: queued batches are written at shutdown; ui_router: the web UI at / (docs/ui.md)
        extra_routers=[
            ingest,
            rule_api,
            ui_router(),
            _closing(sink),
            _backups(store, keys, tokens, local_dev),
        ],
        keys=keys,
        metrics=metrics,
        query_limits=query_limits,
    )
    app.state.keys, app.state.tokens, app.state.rules = keys, tokens, rules
    app.state.sink = sink  # ``sink.close()`` before the store closes: it writes what is queued
    # remote_write goes through the same group commit as agent batches (one insert per table per
    # flush), checked against ``series_limits`` (rows.SeriesLimits; None: the defaults).
    app.state.remote_write_batcher = sink.batcher
    app.state.series_limits = series_limits
    if remote_write_series is not None:  # remote_write's parsed series kept (collector/remote_write.py)
        app.state.series_cache.max_series = remote_write_series
    # remote-written series relabelled before they are stored (collector/relabel.py; None: as sent)
    app.state.relabeler = relabeler
    if relabeler is not None:
        metrics.register(RelabelFigures(relabeler))
    return app


def _backups(store: Any, keys: Any, tokens: Any, local_dev: bool) -> Any:
    """``GET /api/v1/admin/backup`` (api/backup.py): the store with the key and token files."""
    from kernel_insight.api.auth import Authenticator
    from kernel_insight.api.backup import backup_router
    from kernel_insight.collector.backup import KEYS_FILE, TOKENS_FILE

    files = {
        name: Path(owner.path)
        for name, owner in ((KEYS_FILE, keys), (TOKENS_FILE, tokens))
        if isinstance(getattr(owner, "path", None), Path)
    }
    return backup_router(store, files, Authenticator(tokens, local_dev=local_dev))


def _tls(args: argparse.Namespace) -> Any:
    """``TlsFiles`` from --tls-cert/--tls-key/--tls-client-ca, None without them; ValueError when half given."""
    from kernel_insight.api.app import TlsFiles

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    ca = None if args.tls_client_ca is None else Path(args.tls_client_ca)
    return TlsFiles(Path(args.tls_cert), Path(args.tls_key), ca)


def _query_limits(args: argparse.Namespace) -> EngineLimits:
    """``EngineLimits`` from --query-timeout and --query-max-samples (Prometheus' flags of those names;
    their argparse types keep both positive)."""
    from kernel_insight.kql.limits import EngineLimits

    return EngineLimits(max_samples=args.query_max_samples, timeout_s=args.query_timeout)


def _limits(args: argparse.Namespace) -> Any:
    from kernel_insight.api.connections import ConnectionLimits

    return ConnectionLimits(
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
    )


def _health_rule(args: argparse.Namespace) -> HealthRule:
    """The rule of --stale-after and --max-data-age; each is a number > 0 by its argparse type, but
    one against the other only here (before the store is opened): data may not turn stale sooner
    while its agent is heard than while it is not."""
    from kernel_insight.api.health import HealthRule

    if args.stale_after > args.max_data_age:
        raise ValueError(
            f"--stale-after ({args.stale_after:g} s) must not be above --max-data-age ({args.max_data_age:g} s)"
        )
    return HealthRule(stale_after_s=args.stale_after, max_data_age_s=args.max_data_age)


def _ingest_wal_dir(args: argparse.Namespace) -> Path:
    """--ingest-wal, or its default: beside the embedded store's tables, or ./ki-ingest-wal."""
    from kernel_insight.collector.clickhouse.store import is_store_url
    from kernel_insight.collector.defaults import EMBEDDED_INGEST_WAL

    if args.ingest_wal:
        return Path(args.ingest_wal)
    return Path("ki-ingest-wal") if is_store_url(str(args.store)) else Path(args.store) / EMBEDDED_INGEST_WAL


def _serve(args: argparse.Namespace) -> int:
    from kernel_insight.api.app import serve
    from kernel_insight.api.auth import TokenError
    from kernel_insight.api.cli import token_store_path
    from kernel_insight.collector.cli import relabeler, series_limits
    from kernel_insight.collector.clickhouse.store import StorageError, open_store
    from kernel_insight.collector.head import DEFAULT_HEAD_BYTES, DEFAULT_HEAD_WINDOW_MS
    from kernel_insight.collector.keys import DEFAULT_STORE as DEFAULT_KEYS
    from kernel_insight.collector.keys import KeyStoreError

    if args.print_config:
        from kernel_insight.collector.flag_file import settings_yaml

        print(settings_yaml(_collector_parser(), args, skip=_NOT_SETTINGS), end="")
        return 0
    from kernel_insight.collector.footprint import MallocTrimmer, limit_malloc_arenas

    limit_malloc_arenas()  # before any thread of the server starts (collector/footprint.py)
    MallocTrimmer().start()  # for the process' life (a daemon thread)
    keys = Path(args.keys or os.environ.get("KI_KEY_STORE", str(DEFAULT_KEYS)))
    try:
        tls, limits, rules_for_series = _tls(args), _limits(args), relabeler(args)
        health_rule = _health_rule(args)
        if tls is not None:
            tls.context()  # refuse bad certificate files before opening the store
    except ValueError as exc:
        print(f"ki collector: {exc}", file=sys.stderr)
        return 2
    try:
        cache = None if args.query_cache_mb is None else int(args.query_cache_mb * 1024 * 1024)
        store = open_store(
            args.store,
            cluster=args.cluster,
            cache_bytes=cache,
            head_bytes=DEFAULT_HEAD_BYTES if args.head_mb is None else int(args.head_mb * 1024 * 1024),
            head_window_ms=DEFAULT_HEAD_WINDOW_MS
            if args.head_minutes is None
            else int(args.head_minutes * 60_000),
            ingest_wal=_ingest_wal_dir(args),
        )
    except (StorageError, ValueError, OSError) as exc:
        print(f"ki collector: cannot open the store {args.store}: {exc}", file=sys.stderr)
        return 2
    if auth_store_kind(store, args.auth_store) == "table" and (args.keys or args.tokens):
        store.close()
        print(
            "ki collector: --keys and --tokens name files, but this collector keeps agent keys and tokens "
            "in tables of the store (give --auth-store file to use files)",
            file=sys.stderr,
        )
        return 2
    try:
        from kernel_insight.rules.manager import rule_manager_for

        rules = rule_manager_for(store, args, before_reload=_config_reloader(args))
        app = build_collector_app(
            store,
            keys_path=keys,
            tokens_path=None if args.local_dev else token_store_path(args.tokens),
            local_dev=args.local_dev,
            interval_s=args.interval,
            auth_store=args.auth_store,
            rules=rules,
            stats_interval_s=args.stats_interval,
            health_rule=health_rule,
            series_limits=series_limits(args),
            query_limits=_query_limits(args),
            relabeler=rules_for_series,
            sync_keep_ns=int(args.sync_keep_us * 1000),
            sync_sample_every=args.sync_sample_every,
            histogram_base_bytes=int(args.histogram_base_mb * (1 << 20)),
            remote_write_series=args.remote_write_series,
        )
        try:
            serve(app, args.host, args.port, local_dev=args.local_dev, tls=tls, limits=limits)
        finally:
            app.state.sink.close()  # requests still queued are written before the store closes
    except (ValueError, KeyStoreError, TokenError, StorageError, OSError) as exc:
        print(f"ki collector: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


#: Flags that are not settings of the collector: a file does not set them, --print-config omits them.
_NOT_SETTINGS = ("--config", "--print-config")
#: Settings a SIGHUP applies to the running collector (with the rule files, which it re-reads);
#: a change to any other key is reported as waiting for the next start.
_LIVE_SETTINGS = ("rules", "alertmanager", "rules_resend_delay")


def _collector_parser() -> argparse.ArgumentParser:
    """A parser with ``ki collector``'s flags, to read its configuration file again."""
    parser = argparse.ArgumentParser(prog="ki collector", add_help=False)
    _collector_arguments(parser)
    return parser


def _config_reloader(args: argparse.Namespace) -> Callable[[Any], None] | None:
    """What a SIGHUP does with ``--config FILE`` before the rule files are re-read: read the file
    again (a bad file changes nothing and says why), apply the live settings (_LIVE_SETTINGS) to
    the rule manager unless the command line set them, and name the changed keys that need a
    restart. None without ``--config``."""
    from kernel_insight.collector.flag_file import FlagFileError, flag_actions, read_flag_file

    if not args.config:
        return None
    parser = _collector_parser()
    key_of = {action.dest: key for key, action in flag_actions(parser, _NOT_SETTINGS).items()}
    state = {"file": read_flag_file(parser, args.config, "--config")}

    def reload(manager: Any) -> None:
        try:
            new = read_flag_file(parser, args.config, "--config")
        except FlagFileError as exc:
            print(f"ki collector: SIGHUP: {exc}; keeping the settings in use", file=sys.stderr, flush=True)
            return
        old = state["file"]
        changed = sorted(d for d in old.keys() | new.keys() if old.get(d) != new.get(d))
        defaults = parser.parse_args([])
        for dest in changed:
            value = new.get(dest, getattr(defaults, dest))
            from_file = old.get(dest, getattr(defaults, dest))
            current = getattr(args, dest)
            if dest in _LIVE_SETTINGS and manager is not None:
                if isinstance(current, list):  # the file's items first, then the command line's
                    value = [*value, *current[len(from_file) :]]
                elif current != from_file:
                    print(f"ki collector: SIGHUP: {key_of[dest]} is set on the command line", file=sys.stderr)
                    continue
                _apply_live(manager, dest, value)
                setattr(args, dest, value)
                print(f"ki collector: SIGHUP: {key_of[dest]} is now {value!r}", file=sys.stderr, flush=True)
            else:
                print(
                    f"ki collector: SIGHUP: {key_of[dest]} changed in {args.config}; it takes effect at the next start",
                    file=sys.stderr,
                    flush=True,
                )
        state["file"] = new

    return reload


def _apply_live(manager: Any, dest: str, value: Any) -> None:
    if dest == "rules":
        manager.patterns = list(value)
    elif dest == "alertmanager":
        manager.notifier.set_urls(value)
    elif dest == "rules_resend_delay":
        manager.resend_delay_ms = int(value * 1000)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "collector", help="serve agent ingest, remote_write and the query and health API (one process)"
    )
    defer_arguments(s, _collector_arguments)


def _collector_arguments(s: argparse.ArgumentParser) -> None:
    from kernel_insight.api.defaults import (
        DEFAULT_BODY_TIMEOUT_S,
        DEFAULT_HEADER_TIMEOUT_S,
        DEFAULT_KEEP_ALIVE_S,
        DEFAULT_MAX_CONNECTIONS,
    )
    from kernel_insight.api.health import HealthRule
    from kernel_insight.api.tokens import DEFAULT_TOKEN_STORE
    from kernel_insight.collector.defaults import (
        BASE_MAX_BYTES,
        DEFAULT_STORE_STATS_INTERVAL_S,
        SYNC_KEEP_NS,
        SYNC_SAMPLE_EVERY,
    )
    from kernel_insight.collector.keys import DEFAULT_STORE as DEFAULT_KEYS

    rule = HealthRule()
    s.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file of these flags, each key a flag without '--' (head-mb: 512); flags given here win; "
        "re-read on SIGHUP (docs/configuration.md)",
    )
    s.add_argument(
        "--print-config",
        action="store_true",
        help="print every setting as the YAML --config reads (defaults, the file, these flags) and exit",
    )
    if isinstance(s, DeferredParser):
        s.read_flags_from("--config")
    s.add_argument("--store", default="./ki-data", help="data directory (embedded chDB) or ClickHouse URL")
    s.add_argument(
        "--ingest-wal",
        help="directory of this collector's ingest write-ahead files, which keep agent batches stored "
        "exactly once across a crash (default: ingest-wal in the data directory, or ./ki-ingest-wal with "
        'a ClickHouse URL; one per collector, on a disk that outlives a restart; docs/storage.md, "Exactly once")',
    )
    s.add_argument(
        "--cluster",
        help="ClickHouse cluster name: the schema is created ON CLUSTER as replicated local tables under "
        "Distributed ones (deploy/clickhouse/README.md); only with a ClickHouse URL",
    )
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free port)",
    )
    s.add_argument("--keys", help=f"agent key store (default $KI_KEY_STORE or {DEFAULT_KEYS})")
    s.add_argument("--tokens", help=f"bearer token file (default $KI_TOKEN_STORE or {DEFAULT_TOKEN_STORE})")
    s.add_argument(
        "--local-dev",
        action="store_true",
        help="no bearer tokens checked; binds 127.0.0.1 only and says so at start",
    )
    s.add_argument(
        "--auth-store",
        choices=AUTH_STORES,
        default="auto",
        help="where agent keys and tokens live: files (--keys, --tokens) or tables in the store "
        "(auto: tables for a ClickHouse URL, files for a data directory; docs/storage.md)",
    )
    s.add_argument(
        "--query-cache-mb",
        type=at_least(0, "MiB"),
        default=None,
        help="memory for decoded past hours that kql re-reads (default 256 for a data directory, "
        "0 (off) for a ClickHouse URL, where other collectors may write; docs/storage.md)",
    )
    s.add_argument(
        "--remote-write-series",
        type=count_at_least(1),
        default=None,
        help="remote_write series whose parsed labels are kept (default 2,000,000: size it above the "
        "active series sent by remote_write; past it the cache starts again empty)",
    )
    s.add_argument(
        "--head-mb",
        type=at_least(0, "MiB"),
        default=None,
        help="memory for the head (default 1024): recent samples and the series index that alert rules, dashboards "
        'and the health snapshot read (0: off; a data directory only; docs/storage.md, "The head")',
    )
    s.add_argument(
        "--head-minutes",
        type=at_least(0, "minutes", above=True),
        default=None,
        help="how far back by sample time the head keeps samples (default 30), memory allowing (older reads go to ClickHouse)",
    )
    s.add_argument(
        "--interval",
        type=at_least(0, above=True),
        default=5.0,
        help="seconds between health snapshot rebuilds",
    )
    s.add_argument(
        "--sync-keep-us",
        # 1e15 us (32 years) in ns still fits the uint64 the syncs' durations are compared as
        type=at_least(0, "microseconds", most=1e15),
        default=SYNC_KEEP_NS / 1000,
        help="syncs stored one row each (gpu_calls): every one that waited at least this long "
        f"(microseconds, default {SYNC_KEEP_NS / 1000:g}) ... (docs/storage.md)",
    )
    s.add_argument(
        "--sync-sample-every",
        type=count_at_least(1),
        default=SYNC_SAMPLE_EVERY,
        help=f"... and 1 in this many of the shorter ones (default {SYNC_SAMPLE_EVERY}; 1: every sync)",
    )
    s.add_argument(
        "--histogram-base-mb",
        type=at_least(0, "MiB", most=1 << 40),  # 0: no bases kept, every increment asks for a snapshot
        default=BASE_MAX_BYTES / (1 << 20),
        help="memory for the histogram bases of all agents together, MiB: past it the least recently "
        f"used series lose theirs and send a snapshot (default {BASE_MAX_BYTES >> 20}; docs/wire.md, 'Increments')",
    )
    s.add_argument(
        "--stale-after",
        type=at_least(0, above=True),
        default=rule.stale_after_s,
        help="health: an instance whose data is older than this, and whose agent was not heard for "
        f"this long, is stale (seconds, default {rule.stale_after_s:g}; docs/api.md)",
    )
    s.add_argument(
        "--max-data-age",
        type=at_least(0, above=True),
        default=rule.max_data_age_s,
        help="health: data of an agent that is heard (catching up on a backlog) may be this old "
        f"before the instance is stale (seconds, default {rule.max_data_age_s:g})",
    )
    s.add_argument(
        "--stats-interval",
        type=at_least(0, above=True),
        default=DEFAULT_STORE_STATS_INTERVAL_S,
        help=f"seconds between reads of the store's parts per table for /metrics "
        f"(default {DEFAULT_STORE_STATS_INTERVAL_S:g})",
    )
    from kernel_insight.kql.limits import EngineLimits

    query = EngineLimits()
    q = s.add_argument_group("query limits (docs/kql.md, 'Limits and cancellation')")
    q.add_argument(
        "--query-timeout",
        type=at_least(0, above=True),
        default=query.timeout_s,
        metavar="SECONDS",
        help=f"longest a query may run; a request's timeout can only shorten it (default {query.timeout_s:g})",
    )
    q.add_argument(
        "--query-max-samples",
        type=count_at_least(1, "samples"),
        default=query.max_samples,
        metavar="N",
        help=f"samples a query may hold in memory at once (default {query.max_samples:,})",
    )
    from kernel_insight.rules.cli import add_rule_arguments

    add_rule_arguments(s, seconds=at_least(0))
    t = s.add_argument_group("TLS (docs/security.md)")
    t.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate (chain)")
    t.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    t.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require client certificates signed by these PEM CAs (mutual TLS); default: none asked",
    )
    c = s.add_argument_group("connection limits (docs/security.md)")
    c.add_argument(
        "--max-connections",
        type=count_at_least(1, "connections"),
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"open connections at most (default {DEFAULT_MAX_CONNECTIONS}, lowered to fit the open-file "
        "limit); past it the connection idle longest is closed",
    )
    c.add_argument(
        "--header-timeout",
        type=at_least(0, above=True),
        default=DEFAULT_HEADER_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds a client has to send a request head (default {DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    c.add_argument(
        "--body-timeout",
        type=at_least(0, above=True),
        default=DEFAULT_BODY_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds a client has to send a request body after its head (default {DEFAULT_BODY_TIMEOUT_S:g})",
    )
    c.add_argument(
        "--keep-alive",
        type=at_least(0, above=True),
        default=DEFAULT_KEEP_ALIVE_S,
        metavar="SECONDS",
        help=f"seconds an idle connection stays open (default {DEFAULT_KEEP_ALIVE_S:g})",
    )
    from kernel_insight.collector.cli import add_series_limit_arguments

    add_series_limit_arguments(s.add_argument_group("remote_write series limits (docs/storage.md)"))
    s.set_defaults(handler=_serve)
