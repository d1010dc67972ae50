"""A pytest plugin for scripts/test_at_time.sh: moves the wall clock to WALLSHIFT_AT (seconds
since the epoch) when collection starts, so that the test modules' import-time "now"s fall at
the chosen time however long pytest took to start (10-20 s on a loaded machine: the shift set at
launch alone put "6 s before midnight" past it). Needs scripts/wallshift.c preloaded."""

from __future__ import annotations

import ctypes
import os

import pytest


def pytest_collection(session: pytest.Session) -> None:
    """Collection imports the test modules next (the initial conftests are already loaded)."""
    target = os.environ.get("WALLSHIFT_AT")
    if target:
        ctypes.CDLL(None).wallshift_to(ctypes.c_longlong(int(target)))
