"""When the soak's faults ran, and how long after the last one ended an instance was still stale."""

from __future__ import annotations

import math
import threading

__all__ = ["FaultWindows"]


class FaultWindows:
    """Each fault's window (monotonic seconds): open from its beginning until it is over.

    A fault is over when its effect is lifted: a restarted collector answers, a cut network is
    up again, a stopped agent is continued (its SIGCONT, not the SIGSTOP). While any window is
    open the snapshot's verdicts are the fault's, not a failure to recover from it.
    """

    def __init__(self) -> None:
        self._windows: list[list[float]] = []
        self._names: list[str] = []
        self._lock = threading.Lock()

    def begin(self, at: float, name: str = "") -> int:
        """Open a window at ``at`` for fault ``name``; its index, for :meth:`end`."""
        with self._lock:
            self._names.append(name)
            self._windows.append([at, math.inf])
            return len(self._windows) - 1

    def end(self, index: int, at: float) -> float:
        """Close window ``index`` at ``at``; how long it lasted."""
        with self._lock:
            self._windows[index][1] = at
            return at - self._windows[index][0]

    def active(self, now: float) -> bool:
        """Whether a fault runs at ``now``."""
        with self._lock:
            return any(start <= now <= end for start, end in self._windows)

    def since_last(self, now: float) -> float | None:
        """Seconds from the end of the latest fault over by ``now`` to ``now``; None while none is
        over, or while one runs."""
        with self._lock:
            if any(start <= now <= end for start, end in self._windows):
                return None
            ended = [end for _, end in self._windows if end <= now]
            return now - max(ended) if ended else None

    def spans(self) -> list[tuple[str, float, float]]:
        """Every fault's (name, beginning, end); the end is infinite while it runs."""
        with self._lock:
            return [(n, w[0], w[1]) for n, w in zip(self._names, self._windows, strict=True)]
