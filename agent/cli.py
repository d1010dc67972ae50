"""``ki ring ...``: create, inspect, read and remove rings from the shell.

The ring module (numpy) is imported when a command runs, not when ``ki --help`` builds the parser."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from kernel_insight.agent._ring import DEFAULT_CAPACITY

__all__ = ["add_commands"]

Handler = Callable[[argparse.Namespace], int]


def _name(args: argparse.Namespace) -> str:
    from kernel_insight.agent.ring import ring_name

    return str(args.name) if args.name.startswith("/") else ring_name(args.name)


def _create(args: argparse.Namespace) -> int:
    from kernel_insight.agent.ring import Ring

    mode = int(args.mode, 8)
    with Ring.create(_name(args), capacity=args.capacity, mode=mode, group=args.group, producer=False) as r:
        print(f"created {r.name}: {r.capacity} slots, mode {mode:04o}")
    return 0


def _stat(args: argparse.Namespace) -> int:
    from kernel_insight.agent.ring import Ring

    with Ring.attach(_name(args), producer=False) as r:
        print(json.dumps({"name": r.name, "label": r.label, **r.stats()}, indent=2))
    return 0


def _read(args: argparse.Namespace) -> int:
    from kernel_insight.agent.records import StringRecord, StringTable
    from kernel_insight.agent.ring import RingReader

    strings = StringTable()
    deadline = time.monotonic() + args.seconds
    with RingReader.open(_name(args)) as reader:
        while time.monotonic() < deadline:
            for rec in reader.read():
                if isinstance(rec, StringRecord):
                    strings.add(rec)
                print(rec)
            time.sleep(0.1)
        print(json.dumps(reader.stats()), file=sys.stderr)
    return 0


def _unlink(args: argparse.Namespace) -> int:
    from kernel_insight.agent.ring import Ring

    Ring.unlink(_name(args))
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ring = sub.add_parser("ring", help="create, inspect, read or remove a GPU's shared-memory ring")
    rsub = ring.add_subparsers(dest="ring_command", required=True, metavar="ACTION")

    def action(name: str, fn: Handler, help_: str) -> argparse.ArgumentParser:
        p = rsub.add_parser(name, help=help_)
        p.add_argument("name", help="GPU index or UUID, or a full shm name starting with /")
        p.set_defaults(handler=_errors_to_exit(fn))
        return p

    c = action("create", _create, "create a ring")
    c.add_argument(
        "--capacity",
        type=int,
        default=DEFAULT_CAPACITY,
        help=f"slots, a power of two (default {DEFAULT_CAPACITY})",
    )
    c.add_argument("--mode", default="600", choices=["600", "660"], help="permissions (default 600)")
    c.add_argument("--group", default=None, help="group for mode 660")
    action("stat", _stat, "print the ring's counters as JSON")
    r = action("read", _read, "consume and print records (the ring's only consumer)")
    r.add_argument("--seconds", type=float, default=5.0, help="how long to read (default 5)")
    action("unlink", _unlink, "remove the ring's shared-memory object")


def _errors_to_exit(fn: Handler) -> Handler:
    """Ring problems are the user's to fix: one clear line, exit 1, no traceback."""

    def run(args: argparse.Namespace) -> int:
        from kernel_insight.agent.ring import RingError

        try:
            return fn(args)
        except (RingError, ValueError) as exc:
            print(f"ki ring: {exc}", file=sys.stderr)
            return 1

    return run
