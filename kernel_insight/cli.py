"""The ``ki`` command line: one entry point for every component.

Each component owns its subcommands in its own ``cli`` module with an
``add_commands(subparsers)`` function; this module only dispatches, so adding
a component never means editing another's code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from kernel_insight.collector.flags import DeferredParser

__all__ = ["COMMAND_MODULES", "LEAN_COMMANDS", "build_parser", "main"]

#: Modules that contribute subcommands, in --help order.
COMMAND_MODULES = [
    "kernel_insight.run",
    "kernel_insight.agent.cli",
    "kernel_insight.collector.keys_cli",
    "kernel_insight.collector.cli",
    "kernel_insight.backup_cli",
    "kernel_insight.agent.launcher",
    "kernel_insight.agent.probe.cli",
    "kernel_insight.api.cli",
    "kernel_insight.timeline_cli",
    "kernel_insight.server",
    "kernel_insight.rules.cli",
]

#: Commands run with only their own module imported, and the environment they want before any
#: library reads it (users' own settings win). Every module's imports together (FastAPI, the
#: apps, the SDK) hold ~57 MB that ``ki import`` never uses, and Arrow's default allocator
#: (mimalloc, chosen when pyarrow loads) kept ~25 MB of its parser's freed blocks: its peak RSS
#: is a target (issue 11: under 300 MB; bench/results/import.md, "Memory of `ki import`").
#: ``ki rules check`` is a command users run in a loop and in CI (promtool's twin): building every
#: command's parser was a third of its start.
LEAN_COMMANDS: dict[str, tuple[str, dict[str, str]]] = {
    "import": ("kernel_insight.collector.cli", {"ARROW_DEFAULT_MEMORY_POOL": "system"}),
    "rules": ("kernel_insight.rules.cli", {}),
}

Handler = Callable[[argparse.Namespace], int]


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ki", description="Kernel Insight: facts about every GPU.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=DeferredParser)
    for name in modules:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lean = LEAN_COMMANDS.get(argv[0]) if argv else None
    if lean is not None:
        for key, value in lean[1].items():
            os.environ.setdefault(key, value)
    args = build_parser([lean[0]] if lean else COMMAND_MODULES).parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        # A file, directory or address the user named that cannot be used: one line, like the
        # errors each command words itself, never a traceback (ki schema --write to a bad path).
        print(f"ki {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
