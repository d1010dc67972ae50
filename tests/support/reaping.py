"""Finds the test that dropped a child process without reaping it.

A ``subprocess.Popen`` whose exit status was never read (no ``wait()``, ``communicate()`` or a
``poll()`` that saw it exit) warns "subprocess N is still running" (a ResourceWarning, an error
under the suite's ``filterwarnings = error``) when it is freed. When the object sits in a
reference cycle (a traceback's frames after a failed test, a fixture's generator), it is freed by
the garbage collector whenever that next runs: in another test, which then fails for no fault of
its own, while the test that leaked it passes.

:class:`Plugin` (registered by tests/conftest.py) runs the collector at the end of each test's
teardown when a child process the suite started is still unreaped, so the leak is found in the test
that made it, and fails that test naming where the process was started. The cost is one
``gc.collect()`` after a test that leaves a new child unreaped and after the last test of
a file that holds one, nothing for the others.
"""

from __future__ import annotations

import gc
import subprocess
import weakref
from collections.abc import Generator
from typing import Any

import pytest

#: The nodeid of the test (or collector) running now: stamped on each child process it starts.
_running = "<session start>"
_live: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()
_dropped: list[str] = []
#: The unreaped children at the last check (ids): a child a module fixture keeps costs no collection.
_seen: set[int] = set()
_installed = False


def install() -> None:
    """Wraps ``Popen.__init__`` (to know who started each child) and ``Popen.__del__`` (to note a
    child freed before it was reaped, for the check to report). Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    init = subprocess.Popen.__init__
    delete = subprocess.Popen.__del__

    def __init__(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        self._ki_started_by = _running  # type: ignore[attr-defined]
        init(self, *args, **kwargs)
        _live.add(self)

    def __del__(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if not (getattr(self, "_child_created", False) and self.returncode is None):
            delete(self, *args, **kwargs)
            return
        # Reported by the check, in the test that started it, instead of CPython's ResourceWarning,
        # which pytest would report in whichever test runs next.
        _dropped.append(f"pid {self.pid} {self.args!r}, started in {getattr(self, '_ki_started_by', '?')}")
        if self.poll() is None:
            # Still running: CPython's __del__ keeps such a child on subprocess._active to reap later.
            active = getattr(subprocess, "_active", None)
            if active is not None:
                active.append(self)

    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]
    subprocess.Popen.__del__ = __del__  # type: ignore[method-assign]


def running(nodeid: str) -> None:
    """Names the test or collector that runs now."""
    global _running
    _running = nodeid


def unreaped() -> list[subprocess.Popen[Any]]:
    """The child processes started under this plugin that are still alive and unreaped."""
    return [p for p in list(_live) if p.returncode is None]


def collect(last_of_file: bool) -> None:
    """Frees what became garbage when a child is still unreaped, so a child dropped in a reference
    cycle is found now, in the test that dropped it: after a test that left a child running that
    the last check did not see, and after a file's last test (its module fixtures' children were
    reaped or dropped by then)."""
    global _seen
    now = unreaped()
    if now and (last_of_file or any(id(p) not in _seen for p in now)):
        del now
        gc.collect()
        now = unreaped()
    _seen = {id(p) for p in now}


def dropped() -> str | None:
    """What was freed unreaped since the last call, or None."""
    if not _dropped:
        return None
    found = "; ".join(_dropped)
    _dropped.clear()
    return (
        f"a subprocess.Popen was freed without wait()/communicate() (its exit status never read): {found}. "
        "Reap every child you start, on the error path too (kill() then wait())."
    )


class Plugin:
    """The pytest hooks: who runs now, and the check after each test's teardown."""

    def __init__(self) -> None:
        install()

    def pytest_collectstart(self, collector: pytest.Collector) -> None:
        running(collector.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        running(item.nodeid)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, None, None]:
        """After the fixtures' teardown: fails the test whose run or teardown freed a child
        unreaped, naming where it started (CPython's ResourceWarning names neither)."""
        try:
            yield
        finally:
            collect(nextitem is None or nextitem.path != item.path)
            leaked = dropped()
            if leaked is not None:
                pytest.fail(leaked, pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """Registers the check (tests/conftest.py, or ``-p support.reaping``)."""
    if not config.pluginmanager.has_plugin("reaping-check"):
        config.pluginmanager.register(Plugin(), "reaping-check")
