"""``ki timeline export`` (a GPU window as a Chrome trace file) and ``ki timeline capture``, through the API.

It goes through the API (the SDK's :class:`TimelineClient`) rather than the store, so it works
against a running collector with a read token and never needs the store's credentials.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_commands", "parse_when"]

Handler = Callable[[argparse.Namespace], int]

#: Where the CLI looks for the collector when --collector is not given.
DEFAULT_COLLECTOR = "http://127.0.0.1:8470"


def parse_when(text: str) -> float:
    """Unix seconds, RFC 3339, or ``now`` / ``now-30s`` / ``now-5m`` / ``now-1h``; Unix seconds out."""
    if text == "now" or text.startswith("now-"):
        offset = text[4:]
        units = {"s": 1, "m": 60, "h": 3600}
        seconds = 0.0
        if offset:
            try:
                seconds = float(offset[:-1]) * units[offset[-1]]
            except (KeyError, ValueError):
                raise argparse.ArgumentTypeError(
                    f"cannot parse {text!r}: use now-30s, now-5m or now-1h"
                ) from None
        return dt.datetime.now(dt.UTC).timestamp() - seconds
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot parse {text!r}: Unix seconds, RFC 3339 or now-5m") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no timezone: add Z or +00:00")
    return parsed.timestamp()


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        from kernel_insight.collector.private_json import read_secret_file

        return read_secret_file(Path(args.token_file))
    return os.environ.get("KI_TOKEN") or None


def _known_instance(args: argparse.Namespace) -> str | None:
    """Why ``--instance`` names no instance the collector knows, or None when it names one: a
    mistyped id exported an empty trace and said "open it in Perfetto" (the UI says "no such
    instance" for the same input)."""
    from kernel_insight.sdk import HealthClient

    with HealthClient(args.collector, _token(args), ttl=0) as health:
        ids = sorted(i.id for i in health.snapshot().instances)
    if args.instance in ids:
        return None
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return f"no such instance {args.instance!r} (the collector knows {shown or 'none'})"


def _export(args: argparse.Namespace) -> int:
    from kernel_insight.sdk import TimelineClient

    problem = _known_instance(args)
    if problem is not None:
        print(f"ki timeline: {problem}", file=sys.stderr)
        return 1
    with TimelineClient(args.collector, _token(args), retries=1) as client:
        filters: dict[str, object] = {}
        if args.stream is not None:
            filters["stream"] = args.stream
        if args.kernel is not None:
            filters["kernel"] = args.kernel
        if args.min_duration_ns:
            filters["min_duration_ns"] = args.min_duration_ns
        for name in ("pod", "namespace", "container"):
            if getattr(args, name) is not None:
                filters[name] = getattr(args, name)
        path = client.to_perfetto(
            args.output, args.instance, args.gpu, args.start, args.end, format=args.format, **filters
        )
    print(
        f"wrote {path} ({path.stat().st_size} bytes): open it in https://ui.perfetto.dev or chrome://tracing"
    )
    return 0


def _capture(args: argparse.Namespace) -> int:
    from kernel_insight.sdk import TimelineClient

    with TimelineClient(args.collector, _token(args), retries=1) as client:
        req = client.capture(args.instance, args.gpu, args.seconds)
        print(
            f"capture {req.id}: every span of {req.instance} GPU {req.gpu} for {req.seconds} s, {req.state} "
            "(audited); the agent starts it at its next batch",
            flush=True,
        )
        if args.wait is None:
            return 0
        try:
            req = client.wait_capture(req.id, timeout_s=args.wait + req.seconds)
        except TimeoutError as exc:
            print(f"ki timeline: {exc}", file=sys.stderr)
            return 1
    if req.state != "done":
        print(f"ki timeline: capture {req.id} {req.state}: its agent did not run the window", file=sys.stderr)
        return 1
    print(
        f"capture {req.id} done: {req.spans} spans from {req.window_start_ns} to {req.window_end_ns} ns "
        f"(export them with ki timeline export --from {req.window_start_ns / 1e9:.3f} "
        f"--to {req.window_end_ns / 1e9:.3f})"
    )
    return 0


def _run(fn: Handler) -> Handler:
    """Errors a user can act on (refused request, unreachable collector, unwritable file) as one line."""

    def run(args: argparse.Namespace) -> int:
        from kernel_insight.sdk import KernelInsightError

        try:
            return fn(args)
        except (KernelInsightError, OSError) as exc:
            print(f"ki timeline: {exc}", file=sys.stderr)
            return 1

    return run


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--collector", default=DEFAULT_COLLECTOR, help=f"collector URL (default {DEFAULT_COLLECTOR})"
    )
    p.add_argument("--token-file", help="file holding a bearer token (default: $KI_TOKEN)")
    p.add_argument("--instance", required=True, help="the instance (agent) id")
    p.add_argument("--gpu", type=int, required=True, help="GPU index on the instance")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    timeline = sub.add_parser(
        "timeline", help="kernel timelines: export a GPU window to Perfetto; ask for a capture"
    )
    tsub = timeline.add_subparsers(dest="timeline_command", required=True, metavar="ACTION")
    e = tsub.add_parser("export", help="write a GPU window as Chrome trace JSON (Perfetto, chrome://tracing)")
    _common(e)
    e.add_argument("--from", dest="start", type=parse_when, required=True, help="Unix s, RFC 3339 or now-5m")
    e.add_argument("--to", dest="end", type=parse_when, required=True, help="Unix s, RFC 3339 or now")
    e.add_argument("--stream", type=int, help="only this stream")
    e.add_argument("--kernel", help="only kernels matching this RE2 regex (anchored)")
    e.add_argument("--min-duration-ns", type=int, default=0, help="only spans at least this long")
    for name in ("pod", "namespace", "container"):
        e.add_argument(f"--{name}", help=f"Kubernetes: only spans run while this {name} held the GPU")
    e.add_argument(
        "--format",
        choices=["json", "perfetto"],
        default="json",
        help="json: Chrome trace JSON (Perfetto and chrome://tracing); perfetto: native protobuf (Perfetto)",
    )
    e.add_argument("-o", "--output", required=True, help="the trace file to write")
    e.set_defaults(handler=_run(_export))
    c = tsub.add_parser("capture", help="ask an agent for every span of one GPU for N seconds (admin token)")
    _common(c)
    c.add_argument("--seconds", type=int, required=True, help="the window's length, 1..60")
    c.add_argument(
        "--wait",
        type=float,
        nargs="?",
        const=60.0,
        metavar="S",
        help="wait until every span of the window is stored (up to S seconds past the window; default 60)",
    )
    c.set_defaults(handler=_run(_capture))
