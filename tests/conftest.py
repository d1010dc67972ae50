"""Puts tests/ on sys.path (pytest's prepend import mode), so helpers shared by several test
folders live once, in tests/ itself (loopback.py).

How the suite runs in parallel (``make unit``: pytest-xdist, ``--dist loadgroup``): each test file
is one group, run whole by one worker, so its module fixtures are made once and its tests never
race each other for what they share (a ring name, a data directory, a port they chose). A file
whose tests are many and independent is in ``SPREAD``: its tests go to any worker. A file may name
its own group (``pytestmark = pytest.mark.xdist_group("name")``) to run with others that must not
overlap with it (the browser, eBPF).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import reaping
from support.rings import label_prefix, ring_name

HERE = Path(__file__).resolve().parent

#: Fixtures for every folder (support/): each test folder used to define its own.
__all__ = ["label_prefix", "ring_name"]

#: Test files whose tests are independent of each other and slow enough to be worth spreading.
SPREAD: frozenset[str] = frozenset(
    {
        # a few long property tests each (up to 9 minutes one at load 15): the suite's longest files
        "kql/test_columnar_histograms.py",
        "collector/test_store_kql_lean_instant.py",
        "agent/test_histogram.py",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.path.relative_to(HERE).as_posix()
        if path not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(path))


def pytest_configure(config: pytest.Config) -> None:
    reaping.pytest_configure(config)
