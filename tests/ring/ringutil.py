"""Helpers for the ring tests: compiling C, and the verifiable record scheme of ringtool.c."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernel_insight.agent import RECORD_DTYPE

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
INCLUDE = ROOT / "agent" / "include"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}"]

MIX = 0xA5A5A5A55A5A5A5A
MUL = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1

#: The KERNEL payload laid over RECORD_DTYPE's 32 payload bytes.
KERNEL_VIEW = np.dtype(
    [
        ("pos", "<u8"),
        ("producer", "<u4"),
        ("check", "<u4"),
        ("type", "u1"),
        ("flags", "u1"),
        ("device", "<u2"),
        ("id", "<u4"),
        ("ts_ns", "<u8"),
        ("end_ns", "<u8"),
        ("stream", "<u8"),
        ("correlation", "<u8"),
        ("pid", "<u4"),
        ("reserved", "<u4"),
    ]
)
assert KERNEL_VIEW.itemsize == RECORD_DTYPE.itemsize


def compile_c(source: Path, out: Path, extra: list[str] | None = None) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler: run scripts/bootstrap.sh (build-essential)")
    subprocess.run([cc, *CFLAGS, *(extra or []), str(source), "-o", str(out)], check=True)
    return out


def verify_kernel_records(arr: np.ndarray) -> np.ndarray:
    """Assert every record follows the verifiable scheme; returns the KERNEL view."""
    view = arr.view(KERNEL_VIEW)
    assert np.all(view["type"] == 1), "non-KERNEL record in a verifiable stream"
    tag = view["id"].astype(np.uint64)
    assert np.array_equal(view["device"], (view["id"] & 0xFFFF).astype(np.uint16))
    assert np.array_equal(view["end_ns"], view["ts_ns"] ^ np.uint64(MIX))
    assert np.array_equal(view["correlation"], view["ts_ns"])
    assert np.array_equal(view["stream"], tag * np.uint64(MUL))
    return view
