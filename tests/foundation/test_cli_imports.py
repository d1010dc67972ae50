"""``ki --help`` and the light commands import only what they run (issue 33: every ``ki`` command
took 1.5-1.8 s to start, importing FastAPI, chDB, numpy and the engine for ``--help``).

Asserted on the modules loaded, not on a time: a timing assertion fails under load, an import
list does not. The figures are in docs/benchmarks.md (row "cli") and bench/results/cli.md."""

from __future__ import annotations

import json
import os
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


@pytest.mark.parametrize("argv", _subcommands(), ids=" ".join)
def test_help_of_every_subcommand_imports_no_server_library(argv: list[str]) -> None:
    """``ki collector --help`` and ``ki import --help`` print defaults that the engine, the derive
    step, the rule manager and the connection guard use: those live in standard-library modules
    (collector/defaults.py, kql/limits.py, rules/defaults.py, api/defaults.py), so no help imports
    numpy, lark or a server library (it took ``ki collector --help`` to 0.66 s)."""
    assert _imported(*argv, "--help") == set()


def test_light_commands_import_only_what_they_run(tmp_path: Path) -> None:
    assert _imported("keys", "list", "--store", str(tmp_path / "keys.json")) == set()
    assert _imported("tokens", "list", "--store", str(tmp_path / "tokens.json")) == set()
    assert _imported("schema") == set()
    # the ring's records are numpy arrays; the rule files are parsed by kql (lark)
    assert _imported("ring", "stat", "no-such-ring") <= {"numpy"}
    rules = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "agents.yml"
    assert _imported("rules", "check", str(rules)) <= {"numpy", "lark"}


def test_rules_check_builds_the_grammar_once_per_user(tmp_path: Path) -> None:
    """The analysed kql grammar is kept in the user's cache folder (kql/parser.py, ``_cache_file``):
    a second process loads it rather than building the LALR tables, and a folder others may write
    to is not used (the cache is a pickle)."""
    rules = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "agents.yml"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    folder = tmp_path / "kernel-insight"
    written: list[int] = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "kernel_insight.cli", "rules", "check", str(rules)],
                             capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr
        cached = list(folder.glob("kql-grammar-*.lark-cache"))
        assert len(cached) == 1
        assert cached[0].stat().st_size > 10_000
        written.append(cached[0].stat().st_mtime_ns)
    assert written[0] == written[1]  # the second process loaded the file, it did not write it again
    assert folder.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    (shared / "kernel-insight").mkdir(parents=True)
    (shared / "kernel-insight").chmod(0o777)
    env["XDG_CACHE_HOME"] = str(shared)
    out = subprocess.run([sys.executable, "-m", "kernel_insight.cli", "rules", "check", str(rules)],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert list((shared / "kernel-insight").iterdir()) == []
