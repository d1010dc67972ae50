"""``ki import FILE``: backfill OpenMetrics / Prometheus text exposition into the store."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kernel_insight.collector.openmetrics import OpenMetricsError, parse_exposition
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
        with open_store(args.store) as store:
            n = store.insert_samples(expo.samples)
    except StorageError as exc:
        print(f"ki import: {exc}", file=sys.stderr)
        return 2
    note = (
        f", {expo.defaulted_timestamps} without a timestamp stored at import time"
        if expo.defaulted_timestamps
        else ""
    )
    print(f"imported {n} samples of {len(expo.samples.series)} series ({expo.format}){note}")
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
    p.set_defaults(handler=_import)
