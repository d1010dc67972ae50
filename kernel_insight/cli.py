"""The ``ki`` command line: one entry point for every component.

Each component owns its subcommands in its own ``cli`` module with an
``add_commands(subparsers)`` function; this module only dispatches, so adding
a component never means editing another's code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

#: Modules that contribute subcommands, in --help order.
COMMAND_MODULES = [
    "kernel_insight.run",
    "kernel_insight.agent.cli",
    "kernel_insight.collector.keys_cli",
    "kernel_insight.collector.cli",
    "kernel_insight.agent.launcher",
    "kernel_insight.agent.probe.cli",
    "kernel_insight.api.cli",
    "kernel_insight.timeline_cli",
    "kernel_insight.server",
    "kernel_insight.rules.cli",
]

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ki", description="Kernel Insight: facts about every GPU.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
