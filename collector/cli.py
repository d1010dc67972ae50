"""``ki import FILE`` (backfill text exposition into the store) and ``ki schema`` (print or write the DDL)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kernel_insight.collector.openmetrics import OpenMetricsError, parse_exposition
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.collector.rows import SampleBatch
from kernel_insight.collector.schema import (
    Retention,
    cluster_ddl,
    render_sql_file,
    single_ddl,
    write_deploy_files,
)
from kernel_insight.collector.store import StorageError, open_store

__all__ = ["DEFAULT_DATA_DIR", "add_commands"]

#: Where the embedded store keeps its data unless told otherwise.
DEFAULT_DATA_DIR = "./ki-data"

Handler = Callable[[argparse.Namespace], int]


def _import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else path.read_bytes()
    except OSError as exc:
        print(f"ki import: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        print(f"ki import: {args.file}: line {line}: not valid UTF-8", file=sys.stderr)
        return 1
    default_ts = None if args.require_timestamps else int(time.time() * 1000)
    try:
        expo = parse_exposition(text, default_timestamp_ms=default_ts, format=args.format)
    except OpenMetricsError as exc:
        print(f"ki import: {args.file}: {exc}", file=sys.stderr)
        return 1
    try:
        if args.collector:
            n = _send(args.collector, expo.samples, token=_token(args))
        else:
            with open_store(args.store, cluster=args.cluster) as store:
                n = store.insert_samples(expo.samples)
    except (StorageError, ValueError, OSError) as exc:
        print(f"ki import: {exc}", file=sys.stderr)
        return 2
    note = (
        f", {expo.defaulted_timestamps} without a timestamp stored at import time"
        if expo.defaulted_timestamps
        else ""
    )
    print(f"imported {n} samples of {len(expo.samples.series)} series ({expo.format}){note}")
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """The ingest token: from --token-file, else $KI_TOKEN, else the deprecated --token (which
    every user of the machine can read in ``ps``, so it says so)."""
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise OSError(f"cannot read the token file {args.token_file}: {exc.strerror}") from None
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


def _send(url: str, samples: SampleBatch, chunk: int = 50_000, token: str | None = None) -> int:
    """Through a running collector's remote_write endpoint (its data directory is in use)."""
    import httpx
    import numpy as np

    order = np.argsort(samples.series_idx, kind="stable")
    idx, ts, vs = samples.series_idx[order], samples.ts_ms[order], samples.values[order]
    bounds = np.flatnonzero(np.diff(idx)) + 1
    runs = list(
        zip(
            np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [len(idx)])).tolist(), strict=True
        )
    )
    sent = 0
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=60, headers=auth) as client:
        pending: list[tuple[dict[str, str], list[tuple[int, float]]]] = []
        size = 0
        for k, (lo, hi) in enumerate(runs):
            points = list(zip(ts[lo:hi].tolist(), vs[lo:hi].tolist(), strict=True))
            pending.append((dict(samples.series[int(idx[lo])]), points))
            size += len(points)
            if size >= chunk or k == len(runs) - 1:
                r = client.post(
                    url.rstrip("/") + "/api/v1/write",
                    content=encode_write_request(pending),
                    headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
                )
                if r.status_code != 204:
                    raise OSError(f"the collector answered {r.status_code}: {r.text[:300]}")
                sent += size
                pending, size = [], 0
    return sent


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


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="load OpenMetrics / Prometheus text (with timestamps) into the store")
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
    p.set_defaults(handler=_import)

    defaults = Retention()
    s = sub.add_parser(
        "schema", help="print the ClickHouse DDL (single server or cluster), or regenerate deploy/"
    )
    s.add_argument("--cluster", default=None, help="emit the cluster layout for this cluster name")
    s.add_argument("--database", default="ki", help="database name (default ki)")
    s.add_argument("--write", metavar="DIR", help="write schema-single.sql and schema-cluster.sql into DIR")
    for kind in ("samples", "spans", "events", "series"):
        default = getattr(defaults, f"{kind}_days")
        shown = "as samples" if default is None else default
        s.add_argument(
            f"--retention-{kind}",
            type=int,
            default=default,
            metavar="DAYS",
            help=f"days to keep {kind}, 0 = forever (default {shown})",
        )
    s.set_defaults(handler=_schema)
