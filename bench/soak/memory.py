"""When the soak judges a process's memory: from the end of the process's own warm-up.

The issue's yardstick is "memory of every process flat after the first 10 minutes": of the
process, not of the run. A collector that a fault restarted 15 s before the run's warm-up ended
was judged from its 15th second, so its own start-up (head load, caches, first rule rounds)
counted as growth (the 20-minute seed-1 run's 8.8%). Each process is judged from ``warm_s``
after its first look; one that did not live that long (fewer than two looks after) is listed as
not judged, never counted as flat.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["growth_pct", "judged_from"]


def judged_from(points: Sequence[tuple[float, int]], t_start: float, warm_s: float) -> float:
    """The monotonic time from which ``points`` ((time, kB) looks of one process) are judged."""
    return max(t_start, points[0][0]) + warm_s


def growth_pct(
    points: Sequence[tuple[float, int]], t_start: float, warm_s: float
) -> tuple[float, list[int]] | None:
    """The growth of resident memory after the process's own warm-up, in % of its first judged
    look, and those looks' kB (0: the process had ended); None when fewer than two remain."""
    since = judged_from(points, t_start, warm_s)
    after = [kb for t, kb in points if t >= since and kb > 0]
    if len(after) < 2:
        return None
    return 100.0 * (max(after) - after[0]) / after[0], after
