"""One background thread that calls a function every few seconds: the pipeline's start/shutdown contract."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Periodic"]


class Periodic:
    """Calls ``fn`` at once and then every ``interval()`` seconds on a daemon thread named ``name``.

    ``start()`` is idempotent; ``shutdown()`` wakes the thread, waits for it (at most 30 s) and is
    safe without ``start()`` and twice. ``fn`` owns its errors (log them, keep the last good
    state): whatever it raises ends the thread. The health snapshot's rebuild and the store
    statistics of ``/metrics`` run on it.

    Example::

        refresher = Periodic(stats.tick, lambda: 15.0, "ki-store-stats")
        refresher.start()
        refresher.shutdown()
    """

    def __init__(self, fn: Callable[[], object], interval: Callable[[], float], name: str) -> None:
        self.fn = fn
        self.interval = interval
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.fn()
            self._stop.wait(self.interval())

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
