"""``ki rules check FILE...`` and ``ki rules test FILE...``: promtool's two rule commands, for kql rules."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable

from kernel_insight.rules.defaults import DEFAULT_RESEND_DELAY_MS

__all__ = ["add_commands", "add_rule_arguments", "check_files"]


def check_files(paths: list[str]) -> int:
    """Validate rule files as ``promtool check rules`` does: 0 when all load, 1 otherwise."""
    from kernel_insight.rules.config import RuleFileError, load_files

    failed = False
    for path in paths:
        print(f"Checking {path}")
        try:
            groups = load_files([path])
        except RuleFileError as exc:
            failed = True
            print("  FAILED:", file=sys.stderr)
            for p in exc.problems:
                print(str(p), file=sys.stderr)
            print()
            continue
        rules = [r for g in groups for r in g.rules]
        dups = Counter((r.kind, r.name, r.labels) for r in rules if r.kind == "record")
        n_dup = sum(1 for c in dups.values() if c > 1)
        if n_dup:
            print(f"[WARNING]: {n_dup} duplicate rule(s) found.")
            for (_, name, _), c in dups.items():
                if c > 1:
                    print(f"Metric: {name}\nLabel(s):")
        print(f"  SUCCESS: {len(rules)} rules found")
        print()
    return 1 if failed else 0


def _check(args: argparse.Namespace) -> int:
    return check_files(args.files)


def _test(args: argparse.Namespace) -> int:
    from kernel_insight.rules.unit import run_test_files

    return run_test_files(args.files)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("rules", help="check and unit-test kql alert and recording rule files (docs/rules.md)")
    rs = s.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    c = rs.add_parser("check", help="validate rule files (like promtool check rules, kql extensions allowed)")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.set_defaults(handler=_check)
    t = rs.add_parser("test", help="run rule unit tests in promtool's test rules format")
    t.add_argument("files", nargs="+", metavar="FILE")
    t.set_defaults(handler=_test)


def add_rule_arguments(parser: argparse.ArgumentParser, seconds: Callable[[str], float]) -> None:
    """``ki collector``'s rule flags (the collector's own module stays free of rule details).
    ``seconds`` parses a number of seconds >= 0: the collector's argparse type for its own
    periods (kernel_insight.server.at_least), which this component may not import."""
    parser.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="GLOB",
        help="rule files to evaluate (repeatable; globs quoted); reloaded on SIGHUP and POST /-/reload",
    )
    parser.add_argument(
        "--alertmanager",
        action="append",
        default=[],
        metavar="URL",
        help="Alertmanager to send alerts to, e.g. http://127.0.0.1:9093 (repeatable)",
    )
    parser.add_argument(
        "--external-url",
        default=None,
        help="URL users reach this collector at, for alerts' generatorURL (default http://HOST:PORT)",
    )
    parser.add_argument(
        "--rules-resend-delay",
        type=seconds,
        default=DEFAULT_RESEND_DELAY_MS / 1000,
        metavar="SECONDS",
        help="send a still-firing alert again after this long (default 60)",
    )
