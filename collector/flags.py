"""argparse types for the numbers ``ki`` commands take: ports, periods, sizes and counts.

They live in the collector component, the lowest one every command module may import
(``ki import``'s flags are here, ``ki collector``'s and ``ki run``'s in the package root), so a
bad number reads the same in every command: ``argument --X: expected ..., got '...'``, exit 2,
before anything is opened.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence

__all__ = ["MOST", "DeferredParser", "at_least", "count_at_least", "defer_arguments", "port_number"]

#: The largest value ``at_least`` takes unless told otherwise. Past it the values meant nothing
#: more and broke things: ``--interval 1e308`` killed the snapshot thread (a wait past the
#: platform's time_t), ``--query-timeout 1e308`` made every query a 500, ``--query-cache-mb 1e308``
#: was a traceback (infinity bytes). A billion seconds is 31 years.
MOST = 1e9


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return port


def at_least(
    least: float, unit: str = "seconds", *, above: bool = False, most: float = MOST
) -> Callable[[str], float]:
    """An argparse type: a number of ``unit`` from ``least`` on (``above``: greater than it) up to
    ``most``, for periods, delays and sizes. NaN and infinity are refused: a thread that waits 0 s
    (or NaN s) between runs spins (``--interval 0`` rebuilt the snapshot without pause, a core's
    worth of CPU)."""
    bound = f"> {least:g}" if above else f">= {least:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if value > most:  # infinity too
            raise argparse.ArgumentTypeError(f"expected a number of {unit} up to {most:.15g}, got {text!r}")
        if not (least < value if above else least <= value):  # NaN: False
            raise argparse.ArgumentTypeError(f"expected a number of {unit} {bound}, got {text!r}")
        return value

    return parse


def count_at_least(least: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number (of ``what``) from ``least`` on, for connection, sample and
    label counts; worded as ``at_least`` words its numbers."""
    of = f" of {what}" if what else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number{of} >= {least}, got {text!r}")
        return value

    return parse


class DeferredParser(argparse.ArgumentParser):
    """A subcommand's parser that adds its arguments when it is used (it parses, or prints its
    help), not when ``ki`` builds the whole parser: ``ki --help`` and the other commands then import
    nothing the arguments' defaults come from (``ki collector``'s: FastAPI, numpy, the engine).
    ``ki``'s subparsers are of this class (kernel_insight/cli.py), and so are theirs."""

    def defer(self, add: Callable[[argparse.ArgumentParser], None]) -> None:
        self.__dict__.setdefault("_deferred", []).append(add)

    def _add_deferred(self) -> None:
        for add in self.__dict__.pop("_deferred", []):
            add(self)

    def read_flags_from(self, option: str) -> None:
        """Let ``option FILE`` (one of this parser's flags) set the others from a YAML file
        (collector/flag_file.py): its values are placed before argparse parses the command line,
        so the defaults step aside for them and flags given on the command line win."""
        self.__dict__["_flag_file_option"] = option

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._add_deferred()
        option = self.__dict__.get("_flag_file_option")
        argv = list(sys.argv[1:] if args is None else args)
        if option:
            from kernel_insight.collector.flag_file import FlagFileError, config_path, read_flag_file

            path = config_path(argv, option)
            if path is not None:
                try:
                    values = read_flag_file(self, path, option)
                except FlagFileError as exc:
                    self.error(str(exc))
                namespace = argparse.Namespace() if namespace is None else namespace
                for dest, value in values.items():
                    setattr(namespace, dest, value)
        return super().parse_known_args(argv, namespace)

    def format_help(self) -> str:
        self._add_deferred()
        return super().format_help()


def defer_arguments(parser: argparse.ArgumentParser, add: Callable[[argparse.ArgumentParser], None]) -> None:
    """``add(parser)`` when the parser is used (a :class:`DeferredParser`), else at once."""
    if isinstance(parser, DeferredParser):
        parser.defer(add)
    else:
        add(parser)
