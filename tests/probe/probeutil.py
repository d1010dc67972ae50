"""Helpers shared by the probe tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_insight.agent import RingReader
from kernel_insight.agent.records import Record, StringRecord, StringTable

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
INCLUDE = ROOT / "agent" / "include"


def drain(name: str) -> list[Record]:
    """Everything in the ring now, decoded."""
    out: list[Record] = []
    with RingReader.open(name) as reader:
        while batch := reader.read():
            out.extend(batch)
    return out


def names_of(records: list[Record]) -> StringTable:
    table = StringTable()
    for r in records:
        if isinstance(r, StringRecord):
            table.add(r)
    return table


def compile_c(args: list[str], out: Path) -> Path:
    """Build a C helper; without a compiler the test is skipped and says so."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH to build the stand-in libraries")
    cmd = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", *args, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"compile failed: {' '.join(cmd)}\n{proc.stderr}")
    return out
