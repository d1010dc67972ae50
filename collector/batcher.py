"""Group commit: rows of many agent batches go into ClickHouse together, each acknowledged once durable.

One insert per table per batch is ClickHouse's anti-pattern: every insert makes a part
per partition, and ~6 tables x tens of batches per second outrun the merges. Here a
request's batch is converted on the request's thread (``Store.prepare``), queued, and
written by one flusher thread together with everything else queued, one insert per table,
when ``max_rows`` rows are waiting or ``max_delay_s`` has passed since the last flush began,
whichever comes first (so a batch arriving after a quiet spell is written at once). The request
is answered only when its group's rows landed (docs/storage.md, "Ingest: group commit").

Senders that wait for each answer before sending more (remote_write: each of Prometheus'
shards holds one request in flight) submit ``eager``: once ``eager_rows`` of theirs are queued
and nothing new has come for ``quiet_s``, everyone who will send before this flush has sent,
and waiting out ``max_delay_s`` would only idle them (16 senders of 2,000 samples capped
remote_write at 32,000 samples per 0.2 s: 160k/s with the collector half idle).

An eager batch submitted with its ``sender`` (the connection it came on) lets the flusher wait
for exactly those senders: a group of such batches alone is written once every sender seen in
the last ``sender_idle_s`` has a batch queued (none of them will send more before its answer),
by the quiet rule above, or ``eager_max_delay_s`` after the previous flush began, whichever is
first. A fleet's remote_write arrives spread over its scrape interval: a short fixed window
would give groups of a few requests, each paying an insert's fixed cost (docs/storage.md).

Example::

    batcher = Batcher(store)
    batcher.start()
    future = batcher.submit(store.prepare("agent:1:7", spans=spans)).answer()
    stored = future.result()     # True, or False when that batch id was stored before
    batcher.shutdown()           # flushes what is queued; safe twice and without start()
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from kernel_insight.collector.clickhouse.ingest_groups import PreparedRows
from kernel_insight.collector.clickhouse.store import StorageError, StorageUnavailable, Store
from kernel_insight.collector.defaults import BATCHER_SHUTDOWN_S

__all__ = ["Batcher", "BatcherStats", "FlushFailed", "Ticket"]

log = logging.getLogger("kernel_insight.collector.batcher")

#: Upper bounds of the flush-size (rows) and insert-latency (seconds) histograms in ``BatcherStats``.
FLUSH_ROWS_BOUNDS = (1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000)
INSERT_SECONDS_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

#: How often, at most, the batcher looks for remote_write senders gone idle (``sender_idle_s``).
_PRUNE_EVERY_S = 0.05


def _bucket(bounds: tuple[float, ...], value: float) -> int:
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds)


@dataclass
class BatcherStats:
    """Plain counters for the collector's metrics (read them; only the flusher writes them).

    ``flush_rows_counts`` and ``insert_seconds_counts`` are per-bucket (not cumulative) counts
    for ``FLUSH_ROWS_BOUNDS`` / ``INSERT_SECONDS_BOUNDS`` plus a last +Inf bucket.
    """

    queue_batches: int = 0  # batches waiting for a flush, the one being written included
    queue_rows: int = 0
    flushes: int = 0  # groups written (a group split after a refusal counts once per part)
    flushed_batches: int = 0
    flushed_rows: int = 0
    last_flush_batches: int = 0
    last_flush_rows: int = 0
    duplicates: int = 0  # batches found in the batches table at flush time
    retries: int = 0  # flush attempts that failed with StorageUnavailable and were retried
    refused_batches: int = 0  # batches the engine refused (answered with the error)
    partial_batches: int = 0  # refused after some of their tables had landed (logged)
    queue_full: int = 0  # submits refused because the queue held max_queue_rows
    early_flushes: int = 0  # groups written before their delay: eager senders had gone quiet or all wait
    eager_senders: int = 0  # remote_write connections seen in the last sender_idle_s (at the last flush)
    wal_files: int = 0  # write-ahead files written (groups with agent batches; collector/ingest_wal.py)
    wal_bytes: int = 0
    wal_cpu_seconds: float = 0.0  # the flusher's CPU time writing them (serialising, checksum, fsync)
    insert_seconds_total: float = 0.0
    insert_seconds_last: float = 0.0
    insert_seconds_max: float = 0.0
    flush_rows_counts: list[int] = field(default_factory=lambda: [0] * (len(FLUSH_ROWS_BOUNDS) + 1))
    insert_seconds_counts: list[int] = field(default_factory=lambda: [0] * (len(INSERT_SECONDS_BOUNDS) + 1))


class FlushFailed(RuntimeError):
    """The flusher failed with no storage error: a fault of the collector itself (HTTP 500, logged).

    Never a ``StorageUnavailable``: that would have the sender retry a bug as if the store were
    merely away, and never a ``StorageError``: the batch itself was not refused.
    """


class Ticket:
    """One queued batch: its final outcome, and the requests waiting to be answered about it.

    A request's answer (``answer()``) can come before the outcome: while storage is
    unavailable the group stays queued and is retried, but its waiting requests are answered
    StorageUnavailable (503) at once; the agent's retry of the same batch id attaches to this
    ticket again instead of storing the batch a second time.
    """

    def __init__(self, rows: PreparedRows, eager: bool = False, sender: Hashable | None = None) -> None:
        self.rows = rows
        self.eager = eager
        self.sender = sender if eager else None
        self.enqueued = time.monotonic()
        self.outcome: bool | BaseException | None = None
        self._answers: list[Future[bool]] = []
        self._final: list[Callable[[Ticket], None]] = []
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def stored(self) -> bool:
        """True once this ticket's rows are stored by this group (False for a duplicate or a refusal)."""
        return self.outcome is True

    def answer(self) -> Future[bool]:
        """A future for one request: True stored, False stored before, or the storage exception."""
        fut: Future[bool] = Future()
        with self._lock:
            if self.outcome is None:
                self._answers.append(fut)
                return fut
        _resolve(fut, self.outcome)
        return fut

    def on_final(self, callback: Callable[[Ticket], None]) -> None:
        """Call ``callback(ticket)`` once the outcome is final (at once if it already is)."""
        with self._lock:
            if self.outcome is None:
                self._final.append(callback)
                return
        callback(self)

    def _settle(self, outcome: bool | BaseException) -> None:
        with self._lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
            answers, self._answers = self._answers, []
            finals, self._final = self._final, []
        for cb in finals:
            try:
                cb(self)
            except Exception:  # a callback's bug must not stop the flusher
                log.exception("batcher: final callback for batch %s failed", self.rows.batch_id)
        for fut in answers:
            _resolve(fut, outcome)

    def _answer_unavailable(self, exc: StorageUnavailable) -> None:
        with self._lock:
            answers, self._answers = self._answers, []
        for fut in answers:
            _resolve(fut, exc)


def _resolve(fut: Future[bool], outcome: bool | BaseException) -> None:
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        # A fresh exception per request: one instance raised in several threads shares a traceback.
        if isinstance(outcome, StorageUnavailable):
            fut.set_exception(StorageUnavailable(str(outcome), outcome.retry_after_s))
        elif isinstance(outcome, StorageError):
            fut.set_exception(StorageError(str(outcome)))
        else:
            fut.set_exception(FlushFailed(str(outcome)))
    else:
        fut.set_result(outcome)


@dataclass
class _Group:
    tickets: list[Ticket]
    token: str
    done: set[str] = field(default_factory=set)
    checked: bool = False
    logged: bool = False  # its write-ahead file is written (``Store.log_group``), or none is needed
    wal: Path | None = None


def _group_token(tickets: list[Ticket]) -> str:
    """The dedup token prefix of a group: a single batch keeps its own id (as ``Store.insert_batch``)."""
    if len(tickets) == 1:
        return tickets[0].rows.batch_id
    digest = hashlib.blake2b("\n".join(t.rows.batch_id for t in tickets).encode(), digest_size=16)
    return "group:" + digest.hexdigest()


class Batcher:
    """The flusher: queues prepared batches and writes them in groups (see the module docstring).

    ``max_queue_rows`` bounds memory: past it ``submit`` raises StorageUnavailable (503,
    Retry-After 1) until the flusher catches up. ``shutdown`` refuses new batches, flushes
    what is queued (retrying an unavailable store for up to ``shutdown_timeout_s``) and stops.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_delay_s: float = 0.2,
        max_rows: int = 500_000,
        max_queue_rows: int = 2_000_000,
        eager_rows: int = 10_000,
        quiet_s: float = 0.005,
        eager_max_delay_s: float = 1.0,
        sender_idle_s: float = 2.0,
        retry_min_s: float = 0.2,
        retry_max_s: float = 5.0,
        shutdown_timeout_s: float = BATCHER_SHUTDOWN_S,
    ) -> None:
        if (
            max_delay_s < 0
            or max_rows < 1
            or max_queue_rows < max_rows
            or quiet_s < 0
            or eager_rows < 1
            or eager_max_delay_s < 0
            or sender_idle_s <= 0
        ):
            raise ValueError(
                "need max_delay_s >= 0, quiet_s >= 0, eager_max_delay_s >= 0, sender_idle_s > 0, "
                "eager_rows >= 1 and 1 <= max_rows <= max_queue_rows"
            )
        self.store = store
        self.max_delay_s = max_delay_s
        self.max_rows = max_rows
        self.max_queue_rows = max_queue_rows
        self.eager_rows = eager_rows
        self.quiet_s = quiet_s
        self.eager_max_delay_s = eager_max_delay_s
        self.sender_idle_s = sender_idle_s
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.stats = BatcherStats()
        self._cond = threading.Condition()
        self._queue: deque[Ticket] = deque()
        self._pending: dict[str, Ticket] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stop_by = 0.0
        self._last_flush = 0.0
        self._eager_queued = 0  # rows of queued eager tickets not yet taken by a flush
        self._last_submit = 0.0
        #: Eager senders (connections) by the time of their last submit; and how many of the queued
        #: tickets not yet taken by a flush came from each, and from none (agents, untracked eager).
        self._senders: dict[Hashable, float] = {}
        self._sender_queued: dict[Hashable, int] = {}
        self._untracked_queued = 0
        self._pruned = 0.0  # when idle senders were last forgotten

    # ---- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start the flusher thread (idempotent; refused after ``shutdown``)."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the batcher was shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ki-batcher", daemon=True)
                self._thread.start()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Refuse new batches, write what is queued, stop the thread; safe twice and without start."""
        timeout = self.shutdown_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._stop_by = time.monotonic() + timeout
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout + 5)
        else:
            self._drain_now()  # never started: nothing else would settle what is queued

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    # ---- the request side ------------------------------------------------------------

    def pending(self, batch_id: str) -> Ticket | None:
        """The queued (or being written, or being retried) ticket of ``batch_id``, if any; asking
        wakes a flusher waiting to retry an unavailable store (an agent's retry has come)."""
        with self._cond:
            ticket = self._pending.get(batch_id)
            if ticket is not None:
                self._cond.notify_all()
            return ticket

    def submit(self, rows: PreparedRows, *, eager: bool = False, sender: Hashable | None = None) -> Ticket:
        """Queue one prepared batch; a batch id already queued returns the queued ticket.

        ``eager``: its sender sends nothing more until answered (see the module docstring);
        ``sender``: which one (a connection's address), so the group waits for exactly the
        senders that are still to send."""
        with self._cond:
            if self._stopping:
                raise StorageUnavailable("the collector is shutting down", retry_after_s=5)
            queued = self._pending.get(rows.batch_id)
            if queued is not None:
                self._cond.notify_all()  # an agent retrying a stalled batch: retry storage now
                return queued
            if self.stats.queue_rows + rows.rows > self.max_queue_rows and self._queue:
                self.stats.queue_full += 1
                raise StorageUnavailable("the ingest queue is full; the store is behind", retry_after_s=1)
            ticket = Ticket(rows, eager, sender)
            self._queue.append(ticket)
            self._pending[rows.batch_id] = ticket
            self.stats.queue_batches += 1
            self.stats.queue_rows += rows.rows
            now = self._last_submit = time.monotonic()
            crossed = False
            if eager:
                crossed = self._eager_queued < self.eager_rows <= self._eager_queued + rows.rows
                self._eager_queued += rows.rows
            if ticket.sender is not None:
                self._senders[ticket.sender] = now
                self._sender_queued[ticket.sender] = self._sender_queued.get(ticket.sender, 0) + 1
                crossed |= self._all_senders_wait(now)
            else:
                self._untracked_queued += 1
                crossed |= self._untracked_queued == 1  # the group's window shortens to max_delay_s
            if len(self._queue) == 1 or self.stats.queue_rows >= self.max_rows or crossed:
                self._cond.notify_all()
        return ticket

    # ---- the flusher -------------------------------------------------------------------

    def _all_senders_wait(self, now: float) -> bool:
        """Every eager sender seen in the last ``sender_idle_s`` has a ticket queued (under the
        lock); senders gone idle longer are forgotten."""
        if not self._sender_queued:
            return False
        if len(self._sender_queued) < len(self._senders) and now - self._pruned >= _PRUNE_EVERY_S:
            # A scan at most every _PRUNE_EVERY_S: a client opening a connection per request
            # must not cost a scan of every connection per request.
            self._pruned = now
            idle_before = now - self.sender_idle_s
            gone = [k for k, t in self._senders.items() if t < idle_before and k not in self._sender_queued]
            for k in gone:
                del self._senders[k]
        return len(self._sender_queued) >= len(self._senders)

    def _count_taken(self, ticket: Ticket) -> None:
        """Count ``ticket`` as taken by a flush (under the lock)."""
        if ticket.eager:
            self._eager_queued -= ticket.rows.rows
        if ticket.sender is None:
            self._untracked_queued -= 1
            return
        left = self._sender_queued[ticket.sender] - 1
        if left:
            self._sender_queued[ticket.sender] = left
        else:
            del self._sender_queued[ticket.sender]

    def _take(self) -> list[Ticket] | None:
        """Wait for a group to be due and take it; None when stopping with nothing queued."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            # At most one flush per max_delay_s: after a quiet spell a batch goes at once, under
            # load what arrives while one group is written (or within max_delay_s) forms the next;
            # sooner only once eager senders' rows are queued and they have gone quiet. A group
            # of tracked senders' batches alone waits up to eager_max_delay_s, less once every
            # sender waits on its answer.
            while not self._stopping and self.stats.queue_rows < self.max_rows:
                now = time.monotonic()
                delay = self.max_delay_s if self._untracked_queued else self.eager_max_delay_s
                left = self._last_flush + delay - now
                if left <= 0:
                    break
                if self._sender_queued:
                    if self._all_senders_wait(now):
                        self.stats.early_flushes += 1
                        break
                    # Wake when the next sender still to send would be forgotten, should it stay away.
                    oldest = min(t for k, t in self._senders.items() if k not in self._sender_queued)
                    left = min(left, max(_PRUNE_EVERY_S, oldest + self.sender_idle_s - now))
                if self._eager_queued >= self.eager_rows:
                    quiet_left = self._last_submit + self.quiet_s - now
                    if quiet_left <= 0:
                        self.stats.early_flushes += 1
                        break
                    left = min(left, quiet_left)
                self._cond.wait(left)
            self._last_flush = time.monotonic()
            self.stats.eager_senders = len(self._senders)
            taken: list[Ticket] = []
            rows = 0
            while self._queue and (not taken or rows + self._queue[0].rows.rows <= self.max_rows):
                t = self._queue.popleft()
                taken.append(t)
                rows += t.rows.rows
                self._count_taken(t)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            try:
                self._flush(taken)
            except BaseException as exc:  # never leave a request waiting on a dead flusher
                log.exception("batcher: flush failed unexpectedly")
                for t in taken:
                    self._finish(t, FlushFailed(f"ingest flush failed: {type(exc).__name__}: {exc}"))

    def _drain_now(self) -> None:
        while True:
            with self._cond:
                taken = list(self._queue)
                self._queue.clear()
                self._eager_queued = self._untracked_queued = 0
                self._sender_queued.clear()
            if not taken:
                return
            self._flush(taken)

    def _finish(self, ticket: Ticket, outcome: bool | BaseException) -> None:
        with self._cond:
            if self._pending.get(ticket.rows.batch_id) is ticket:
                del self._pending[ticket.rows.batch_id]
                self.stats.queue_batches -= 1
                self.stats.queue_rows -= ticket.rows.rows
        ticket._settle(outcome)

    def _give_up(self) -> bool:
        return self._stopping and time.monotonic() >= self._stop_by

    def _flush(self, taken: list[Ticket]) -> None:
        work: deque[_Group] = deque([_Group(taken, _group_token(taken))])
        delay = self.retry_min_s
        while work:
            group = work.popleft()
            try:
                if not group.checked:
                    recorded = [t.rows.batch_id for t in group.tickets if t.rows.record]
                    seen = self.store.batches_seen(recorded) if recorded else set()
                    for t in group.tickets:
                        if t.rows.batch_id in seen:
                            self.stats.duplicates += 1
                            self._finish(t, False)
                    group.tickets = [t for t in group.tickets if t.rows.batch_id not in seen]
                    group.token = _group_token(group.tickets) if group.tickets else group.token
                    group.checked = True
                if not group.tickets:
                    continue
                started = time.monotonic()
                if not group.logged:
                    self._log(group)
                self.store.insert_prepared([t.rows for t in group.tickets], group.token, group.done)
                self.store.unlog_group(group.wal)
                self._count_flush(group, time.monotonic() - started)
                for t in group.tickets:
                    self._finish(t, True)
                delay = self.retry_min_s
            except StorageUnavailable as exc:
                if self._give_up():
                    # Its write-ahead file stays: the next start stores the group, and the agents'
                    # retries then find their batches stored.
                    log.error("batcher: giving up on %d batches at shutdown: %s", len(group.tickets), exc)
                    for t in group.tickets:
                        self._finish(t, exc)
                    continue
                # The group stays first in line with its token and what landed; its requests are
                # answered now (503) and an agent's retry attaches to the same tickets.
                self.stats.retries += 1
                log.warning("batcher: storage unavailable, retrying %d batches: %s", len(group.tickets), exc)
                for t in group.tickets:
                    t._answer_unavailable(exc)
                work.appendleft(group)
                wait = min(delay, max(0.0, self._stop_by - time.monotonic())) if self._stopping else delay
                with self._cond:
                    self._cond.wait(wait)
                delay = min(delay * 2, self.retry_max_s)
            except (StorageError, ValueError) as exc:
                if len(group.tickets) > 1:
                    # One batch's rows were refused: write the rest one batch at a time, each from
                    # where the group stopped, so only the refused batch fails.
                    parts = [_Group([t], t.rows.batch_id, set(group.done), True) for t in group.tickets]
                    self._log_parts(group, parts)
                    work.extendleft(reversed(parts))
                    continue
                (t,) = group.tickets
                self.stats.refused_batches += 1
                # A series row is a label index entry, not data: one without samples is read as nothing.
                landed = sorted(n for n in group.done if n != "series" and n in t.rows.tables)
                if landed:
                    self.stats.partial_batches += 1
                    log.error(
                        "batcher: batch %s refused after its tables %s had landed: %s",
                        t.rows.batch_id,
                        landed,
                        exc,
                    )
                else:
                    log.error("batcher: batch %s refused by storage: %s", t.rows.batch_id, exc)
                self.store.unlog_group(group.wal)  # refused: a replay would be refused again
                self._finish(t, exc if isinstance(exc, StorageError) else StorageError(str(exc)))

    def _log(self, group: _Group) -> None:
        """Write the group's write-ahead file (``Store.log_group``), counted in the stats."""
        cpu = time.thread_time()
        group.wal = self.store.log_group([t.rows for t in group.tickets], group.token, group.done)
        group.logged = True
        if group.wal is not None:
            self.stats.wal_files += 1
            self.stats.wal_bytes += group.wal.stat().st_size
            self.stats.wal_cpu_seconds += time.thread_time() - cpu

    def _log_parts(self, group: _Group, parts: list[_Group]) -> None:
        """Write-ahead files of a split group's parts (each under its own token, from where the
        group stopped), then remove the group's: a crash in between replays the parts, never
        the group under its token after some parts landed under theirs. Should a part's file
        fail (a full disk), the group's file stays and the parts are logged one by one before
        their first insert; a replay of the group then sets it aside (its batches are stored in
        part), logged."""
        if group.wal is None:
            return
        try:
            for part in parts:
                self._log(part)
        except StorageUnavailable as exc:
            log.error("batcher: cannot write the write-ahead files of a split group %s: %s", group.token, exc)
            for part in parts:
                self.store.unlog_group(part.wal)
                part.wal, part.logged = None, False
            return
        self.store.unlog_group(group.wal)

    def _count_flush(self, group: _Group, seconds: float) -> None:
        s = self.stats
        rows = sum(t.rows.rows for t in group.tickets)
        s.flushes += 1
        s.flushed_batches += len(group.tickets)
        s.flushed_rows += rows
        s.last_flush_batches = len(group.tickets)
        s.last_flush_rows = rows
        s.insert_seconds_total += seconds
        s.insert_seconds_last = seconds
        s.insert_seconds_max = max(s.insert_seconds_max, seconds)
        s.flush_rows_counts[_bucket(FLUSH_ROWS_BOUNDS, rows)] += 1
        s.insert_seconds_counts[_bucket(INSERT_SECONDS_BOUNDS, seconds)] += 1
