"""The background thread that rebuilds the snapshot every few seconds, so no request touches the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from kernel_insight.api.health.rule import HealthRule, HealthSource, InstanceFacts
from kernel_insight.api.health.snapshot import Snapshot, build_snapshot
from kernel_insight.collector.periodic import Periodic

__all__ = ["DEFAULT_INTERVAL_S", "MAX_WAIT_S", "Snapshotter"]

log = logging.getLogger("kernel_insight.api.health")

#: How often the background thread rebuilds the snapshot.
DEFAULT_INTERVAL_S = 5.0
#: The longest a long-poll (``?wait=``) is held open.
MAX_WAIT_S = 30.0


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


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
        #: Long-polls waiting for the next snapshot with another ETag: (their loop, their future).
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._waiters_lock = threading.Lock()

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
                    before = self._snapshot
                    self._snapshot = build_snapshot(self._facts, self.rule, now_ms, before)
                    if before is None or before.etag != self._snapshot.etag:
                        self._wake()
                raise
            self._facts = facts
            previous = self._snapshot
            snap = build_snapshot(facts, self.rule, now_ms, previous)
            self._snapshot = snap
            self.last_error = None
        if previous is None or previous.etag != snap.etag:
            self._wake()
        return snap

    async def changed(self, etag: str, timeout_s: float) -> Snapshot | None:
        """The first snapshot whose ETag is not ``etag``: at once if the current one is not, else
        when a rebuild publishes one within ``timeout_s`` (None after that). For long-polls: the
        waiting costs a future, no thread."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            snap = self._snapshot
            if snap is not None and snap.etag != etag:
                return snap
            left = deadline - loop.time()
            if left <= 0:
                return None
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            with self._waiters_lock:
                self._waiters.add(entry)
            try:
                snap = self._snapshot  # published between the check and the registration
                if snap is not None and snap.etag != etag:
                    return snap
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, left)
            finally:
                with self._waiters_lock:
                    self._waiters.discard(entry)

    def _wake(self) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(_settle, fut)

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
