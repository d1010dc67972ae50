"""``ki agent ...``: hand the process over to the native agent (the Python launcher does not stay resident)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["BINARY_ENV", "add_commands", "agent_binary"]

#: Environment variable naming a ki-agent binary to use instead of the packaged one.
BINARY_ENV = "KI_AGENT_BINARY"


def agent_binary() -> Path:
    """The packaged ki-agent (built by the package build), or $KI_AGENT_BINARY."""
    override = os.environ.get(BINARY_ENV)
    path = Path(override) if override else Path(__file__).resolve().parent / "bin" / "ki-agent"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"ki-agent binary not found at {path}: rebuild the package (make build, or pip install -e .)"
        )
    return path


def _exec(args: argparse.Namespace) -> int:
    try:
        binary = agent_binary()
    except FileNotFoundError as exc:
        print(f"ki agent: {exc}", file=sys.stderr)
        return 1
    argv = list(args.agent_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    # KI_AGENT_* variables are ki-agent settings; this one is the launcher's, so it does not go along.
    env = {k: v for k, v in os.environ.items() if k != BINARY_ENV}
    os.execve(binary, [str(binary), *argv], env)
    return 1  # not reached: execve replaces this process or raises


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agent",
        help="run the native per-GPU agent (ki agent --help lists its settings)",
        add_help=False,
        prefix_chars="+",  # every "-" argument belongs to ki-agent, --help included
        description="Runs ki-agent with the given arguments; see docs/agent.md.",
    )
    p.add_argument("agent_args", nargs=argparse.REMAINDER, help="arguments for ki-agent, e.g. --ring 0")
    p.set_defaults(handler=_exec)
