"""The ingest router's sink: a decoded agent batch -> derived rows -> stored exactly once.

``ingest_router(keys, sink=StoreSink(store))`` is the whole wiring; the router owns
authentication and status codes, this owns what a batch becomes in storage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.store import Store
from kernel_insight.collector.wire import Counter, DecodedBatch

__all__ = ["StoreSink"]


def _counter_name(counter_id: int) -> str:
    try:
        return Counter(counter_id).name.lower()
    except ValueError:
        return f"counter_{counter_id}"


class StoreSink:
    """Derive and store one batch; True when stored, False when its batch id was stored before.

    One :class:`Deriver` per agent keeps names and running counter totals between batches;
    a batch that fails to store rolls its deriver back, so the agent's retry counts once.

    Example::

        app = create_app(store, routers=[ingest_router(KeyStore(path), sink=StoreSink(store))])
    """

    def __init__(
        self,
        store: Store,
        *,
        instance_of: Callable[[bytes], str] | None = None,
        labels_of: Callable[[str], Mapping[str, str]] | None = None,
    ) -> None:
        self.store = store
        self._instance_of = instance_of or (lambda agent_id: agent_id.hex())
        self._labels_of = labels_of or (lambda instance: {})
        self._derivers: dict[bytes, tuple[Deriver, threading.Lock]] = {}
        self._lock = threading.Lock()

    def _deriver(self, agent_id: bytes) -> tuple[Deriver, threading.Lock]:
        with self._lock:
            entry = self._derivers.get(agent_id)
            if entry is None:
                instance = self._instance_of(agent_id)
                entry = self._derivers[agent_id] = (
                    Deriver(instance, self._labels_of(instance)),
                    threading.Lock(),
                )
            return entry

    def __call__(self, batch: DecodedBatch) -> bool:
        batch_id = str(batch.batch_id)
        if self.store.batch_seen(batch_id):
            return False
        deriver, lock = self._deriver(batch.header.agent_id)
        with lock:
            checkpoint = deriver.checkpoint()
            try:
                derived = deriver.derive(
                    batch.to_array(),
                    strings=batch.strings,
                    counters={_counter_name(k): float(v) for k, v in batch.counters.items()},
                    now_ns=batch.header.t_max_ns,
                )
                return self.store.insert_batch(
                    batch_id,
                    agent_id=deriver.instance,
                    samples=derived.samples,
                    spans=derived.spans,
                    events=derived.events,
                    instances=derived.instances,
                )
            except BaseException:
                deriver.rollback(checkpoint)
                raise
