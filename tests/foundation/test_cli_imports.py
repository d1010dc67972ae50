"""``ki --help`` and the light commands import only what they run (issue 33: every ``ki`` command
took 1.5-1.8 s to start, importing FastAPI, chDB, numpy and the engine for ``--help``).

Asserted on the modules loaded, not on a time: a timing assertion fails under load, an import
list does not. The figures are in docs/benchmarks.md (row "cli") and bench/results/cli.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Libraries that cost 50-500 ms each to import, and what none of the light commands needs.
HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "chdb",
    "pyarrow",
    "numpy",
    "lark",
    "pydantic",
    "httpx",
    "prometheus_client",
)

_PROBE = """
import json, sys
from kernel_insight.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = {heavy!r}
sys.stdout.flush()
print("\\nIMPORTED " + json.dumps(sorted(h for h in heavy if h in sys.modules)))
"""


def _imported(*argv: str, cwd: Path | None = None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("IMPORTED "))
    return set(json.loads(line.removeprefix("IMPORTED ")))


def _subcommands() -> list[list[str]]:
    """Every ``ki`` subcommand, and each of their own subcommands, as argv prefixes."""
    import argparse

    from kernel_insight.cli import build_parser

    def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found: dict[str, argparse.ArgumentParser] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.update(action.choices)
        return found

    commands = []
    for name, parser in actions(build_parser()).items():
        if name == "agent":
            continue  # ki agent --help is the native binary's (execve): no Python runs after it
        commands.append([name])
        commands.extend([name, sub] for sub in actions(parser))
    return commands


def test_ki_help_imports_no_heavy_library() -> None:
    assert _imported("--help") == set()


#: Subcommands whose flags' defaults live in modules that need these (``ki import``: the series
#: limits of collector/rows.py; ``ki collector``: the engine's, the derive step's, the rules').
_HELP_MAY_IMPORT = {
    "import": {"numpy"},
    "collector": {"numpy", "lark", "prometheus_client", "pyarrow", "httpx", "starlette", "uvicorn"},
}


@pytest.mark.parametrize("argv", _subcommands(), ids=" ".join)
def test_help_of_every_subcommand_imports_no_server_library(argv: list[str]) -> None:
    """``ki collector --help`` reads its defaults from the modules that use them (the engine's
    limits, the derive step's, the health rule's, the connection guard's): never FastAPI or chDB."""
    imported = _imported(*argv, "--help")
    allowed = _HELP_MAY_IMPORT.get(argv[0], set())
    assert imported - allowed == set()


def test_light_commands_import_only_what_they_run(tmp_path: Path) -> None:
    assert _imported("keys", "list", "--store", str(tmp_path / "keys.json")) == set()
    assert _imported("tokens", "list", "--store", str(tmp_path / "tokens.json")) == set()
    assert _imported("schema") == set()
    # the ring's records are numpy arrays; the rule files are parsed by kql (lark)
    assert _imported("ring", "stat", "no-such-ring") <= {"numpy"}
    rules = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "agents.yml"
    assert _imported("rules", "check", str(rules)) <= {"numpy", "lark"}
