"""The ingest router's sink: a decoded agent batch -> derived rows -> stored exactly once.

``ingest_router(keys, sink=StoreSink(store))`` is the whole wiring; the router owns
authentication and status codes, this owns what a batch becomes in storage. Rows are
written in groups with other requests' rows by a :class:`~kernel_insight.collector.batcher.Batcher`
(docs/storage.md, "Ingest: group commit"); a request is answered once its rows are durable.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

from kernel_insight.collector.batcher import Batcher, Ticket
from kernel_insight.collector.clickhouse.store import StorageError, Store
from kernel_insight.collector.derive import SYNC_KEEP_NS, SYNC_SAMPLE_EVERY, Deriver
from kernel_insight.collector.hist_base import BaseBudget
from kernel_insight.collector.ingest import counter_name
from kernel_insight.collector.keys import KeyStoreError, check_instance_labels
from kernel_insight.collector.rows import InstanceInfo, Labels
from kernel_insight.collector.wire import DecodedBatch, NamesUnknown

__all__ = ["INSTANCE_ROW_EVERY_S", "StoreSink"]

#: An agent's ``instances`` row (what the instance is, and ``last_seen``) is written with its first
#: batch in each window of this many seconds of its own (producer) time, and with any batch whose
#: row says something new besides ``last_seen`` (docs/storage.md, "Ingest: group commit"). The
#: windows are aligned to the clock, so a fleet's rows land in the same flush or two per window,
#: and the other flushes skip the table: each insert has a fixed cost in chDB whatever its size. ``last_seen`` is thus at most this much behind the newest batch (staleness is 60 s).
INSTANCE_ROW_EVERY_S = 1.0


class StoreSink:
    """Derive and store one batch; True when stored, False when its batch id was stored before.

    One :class:`Deriver` per agent keeps names and running counter totals between batches.
    A batch whose rows end up not stored (refused, or a duplicate found at write time) has
    its counter increments taken back out of its deriver, so the agent's retry counts once,
    even when later batches of the same agent were derived meanwhile (``submit`` pipelines).

    The batcher starts on the first batch; ``close()`` (also the app's shutdown) flushes
    what is queued.

    Example::

        app = create_app(store, routers=[ingest_router(KeyStore(path), sink=StoreSink(store))])
    """

    def __init__(
        self,
        store: Store,
        *,
        instance_of: Callable[[bytes], str] | None = None,
        labels_of: Callable[[str], Mapping[str, str]] | None = None,
        batcher: Batcher | None = None,
        sync_keep_ns: int = SYNC_KEEP_NS,
        sync_sample_every: int = SYNC_SAMPLE_EVERY,
        base_budget: BaseBudget | None = None,
    ) -> None:
        if sync_sample_every < 1 or sync_keep_ns < 0:
            raise ValueError("syncs: keep at least 1 in N (N >= 1) of those shorter than a threshold >= 0")
        #: The bound on every agent's histogram bases together (hist_base.py; BASE_MAX_BYTES if None).
        self.base_budget = BaseBudget() if base_budget is None else base_budget
        self._sync_keep_ns, self._sync_sample_every = sync_keep_ns, sync_sample_every
        self.store = store
        self.batcher = batcher if batcher is not None else Batcher(store)
        self._instance_of = instance_of or (lambda agent_id: agent_id.hex())
        self._labels_of = labels_of or (lambda instance: {})
        self._derivers: dict[bytes, tuple[Deriver, threading.Lock]] = {}
        #: per agent: (window, row without last_seen) of its last instance row queued (under its lock)
        self._instance_rows: dict[bytes, tuple[int, InstanceInfo]] = {}
        self._lock = threading.Lock()
        self._started = False

    def _deriver(self, agent_id: bytes) -> tuple[Deriver, threading.Lock]:
        with self._lock:
            if not self._started:
                self.batcher.start()
                self._started = True
            entry = self._derivers.get(agent_id)
            if entry is None:
                instance = self._instance_of(agent_id)
                entry = self._derivers[agent_id] = (
                    Deriver(
                        instance,
                        self._labels_of(instance),
                        sync_keep_ns=self._sync_keep_ns,
                        sync_sample_every=self._sync_sample_every,
                        base_budget=self.base_budget,
                    ),
                    threading.Lock(),
                )
            return entry

    def submit(self, batch: DecodedBatch) -> Future[bool]:
        """Derive and queue ``batch``; the future says True (stored), False (stored before) or raises
        the storage exception. A batch id still queued (its store being retried) is not derived
        again: the future waits on the queued rows."""
        batch_id = str(batch.batch_id)
        deriver, lock = self._deriver(batch.header.agent_id)
        queued = self.batcher.pending(batch_id)
        if queued is not None:
            return queued.answer()
        records = batch.by_type()
        with lock:
            if batch.labels is not None:
                _apply_agent_labels(deriver, batch.labels)
            if batch.names_digest is not None and not deriver.names_match(
                records,
                batch.strings,
                batch.string_hashes,
                batch.histograms,
                batch.names_digest,
            ):
                raise NamesUnknown(
                    f"batch {batch_id} uses names this collector does not hold as sent: send them"
                )
            before = deriver.checkpoint()
            try:
                derived = deriver.derive(
                    records,
                    strings=batch.strings,
                    counters={counter_name(k): float(v) for k, v in batch.counters.items()},
                    now_ns=batch.header.t_max_ns,
                    received_ns=time.time_ns(),
                    histograms=batch.histograms,
                    body_version=batch.body_version,
                    epoch=batch.header.epoch,
                    string_hashes=batch.string_hashes,
                )
                after = deriver.checkpoint()
                agent_id = batch.header.agent_id
                instances = self._instances_due(agent_id, derived.instances)
                rows = self.store.prepare(
                    batch_id,
                    agent_id=deriver.instance,
                    samples=derived.samples,
                    spans=derived.spans,
                    events=derived.events,
                    instances=instances,
                    histograms=derived.histograms,
                    calls=derived.calls,
                )
                ticket = self.batcher.submit(rows)
                if ticket.rows is not rows:  # queued meanwhile by a retry: these rows are not needed
                    deriver.rollback(before)
                    self._instance_rows.pop(agent_id, None)
                    return ticket.answer()
            except (ValueError, OverflowError) as exc:
                deriver.rollback(before)
                raise StorageError(f"batch {batch_id} holds values storage cannot take: {exc}") from exc
            except BaseException:
                deriver.rollback(before)
                raise
        increments = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        if increments or instances:
            ticket.on_final(
                lambda t: self._undo_unless_stored(
                    t, deriver, lock, increments, agent_id if instances else None
                )
            )
        return ticket.answer()

    def _instances_due(self, agent_id: bytes, instances: Sequence[InstanceInfo]) -> Sequence[InstanceInfo]:
        """The batch's instance row when one is due (INSTANCE_ROW_EVERY_S, or the row changed),
        else none (the agent's lock is held). A row that ends up not stored is forgotten, so
        the agent's next batch writes one."""
        if not instances:
            return instances
        (info,) = instances
        window = int(info.last_seen_ms // (INSTANCE_ROW_EVERY_S * 1000))
        facts = dataclasses.replace(info, last_seen_ms=0)
        if self._instance_rows.get(agent_id) == (window, facts):
            return ()
        self._instance_rows[agent_id] = (window, facts)
        return instances

    def _undo_unless_stored(
        self,
        ticket: Ticket,
        deriver: Deriver,
        lock: threading.Lock,
        increments: dict[Labels, float],
        instance_of: bytes | None,
    ) -> None:
        if ticket.stored:
            return
        with lock:
            if instance_of is not None:
                self._instance_rows.pop(instance_of, None)
            totals = deriver.checkpoint()
            for labels, inc in increments.items():
                totals[labels] = totals.get(labels, 0.0) - inc
            deriver.rollback(totals)

    def histogram_snapshot_wanted(self, agent_id: bytes) -> bool:
        """Whether an increment of this agent lacked its base since the last call (then the
        ingest answer asks the agent for snapshots: KI-Histogram-Snapshot, docs/wire.md)."""
        with self._lock:
            entry = self._derivers.get(agent_id)
        if entry is None or not entry[0].snapshot_wanted:
            return False
        with entry[1]:
            wanted, entry[0].snapshot_wanted = entry[0].snapshot_wanted, False
        return wanted

    def __call__(self, batch: DecodedBatch) -> bool:
        return self.submit(batch).result()

    def close(self) -> None:
        """Write what is queued and stop the batcher; safe twice."""
        self.batcher.shutdown()


log = logging.getLogger(__name__)


def _apply_agent_labels(deriver: Deriver, labels: tuple[tuple[str, str], ...]) -> None:
    """The agent's configured labels, under the enrolment rules; labels that break them are
    ignored with a warning rather than refusing the batch: its data is still good."""
    try:
        checked = check_instance_labels(dict(labels))
    except KeyStoreError as exc:
        log.warning("instance %s: the agent's configured labels are ignored: %s", deriver.instance, exc)
        return
    deriver.set_agent_labels(checked)
