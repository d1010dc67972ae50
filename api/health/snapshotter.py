"""The background thread that rebuilds the snapshot every few seconds, so no request touches the store."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kernel_insight.api.health.rule import HealthRule, HealthSource, InstanceFacts
from kernel_insight.api.health.snapshot import Snapshot, build_snapshot
from kernel_insight.collector.periodic import Periodic

__all__ = ["DEFAULT_INTERVAL_S", "Snapshotter"]

log = logging.getLogger("kernel_insight.api.health")

#: How often the background thread rebuilds the snapshot.
DEFAULT_INTERVAL_S = 5.0


class Snapshotter:
    """Rebuilds the snapshot every ``interval_s`` on a background thread.

    ``start()``/``shutdown()`` follow the pipeline contract: shutdown is safe without start
    and safe twice. A failed rebuild re-judges the previous facts at the new time (so
    instances age into ``stale``) and is logged; ``last_error`` holds it.
    """

    def __init__(
        self,
        source: HealthSource,
        rule: HealthRule | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.rule = rule or HealthRule()
        self.interval_s = interval_s
        self.clock = clock
        self.last_error: BaseException | None = None
        self._snapshot: Snapshot | None = None
        self._facts: list[InstanceFacts] | None = None
        self._lock = threading.Lock()  # one rebuild at a time
        self._background = Periodic(self.tick, lambda: self.interval_s, "ki-health-snapshot")

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def refresh(self) -> Snapshot:
        """Rebuild now (blocking); raises what the source raises.

        When the source fails, the last facts are judged again at the new time before the
        error propagates, so instances turn ``stale`` while the store cannot be read: what
        nobody has heard from lately is not vouched for.
        """
        with self._lock:
            now_ms = int(self.clock() * 1000)
            try:
                facts = self.source.collect(now_ms)
            except Exception:
                if self._facts is not None:
                    self._snapshot = build_snapshot(self._facts, self.rule, now_ms, self._snapshot)
                raise
            self._facts = facts
            snap = build_snapshot(facts, self.rule, now_ms, self._snapshot)
            self._snapshot = snap
            self.last_error = None
            return snap

    def current(self) -> Snapshot:
        """The latest snapshot, built now if there is none yet."""
        snap = self._snapshot
        return snap if snap is not None else self.refresh()

    def tick(self) -> bool:
        """One background iteration: rebuild, or log the failure and keep the last snapshot."""
        try:
            self.refresh()
        except Exception as exc:  # keep serving the last snapshot; the store may come back
            self.last_error = exc
            log.warning("health snapshot rebuild failed: %s", exc)
            return False
        return True

    def start(self) -> None:
        self._background.start()

    def shutdown(self) -> None:
        self._background.shutdown()
