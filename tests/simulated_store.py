"""The simulator's records derived and stored as the collector would, batch by batch, on a synthetic clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kernel_insight.agent import RingReader
from kernel_insight.agent.probe import Simulator
from kernel_insight.collector.derive import Deriver

__all__ = ["store_simulated"]

S = 1_000_000_000


def store_simulated(
    sim: Simulator,
    readers: Sequence[RingReader],
    deriver: Deriver,
    store: Any,
    seconds: int,
    batch_s: int,
    after_batch: Callable[[int, int], None] | None = None,
) -> None:
    """Advance ``sim`` from its start ``batch_s`` seconds at a time up to ``seconds``; each time,
    derive what its rings hold as one batch and insert it into ``store``, then call
    ``after_batch(seconds since the start, now in ns)``."""
    for t in range(batch_s, seconds + 1, batch_s):
        now = sim.start_ns + t * S
        sim.advance_to(now)
        parts = []
        for reader in readers:
            while (got := reader.read_array()).size:
                parts.append(got)
        derived = deriver.derive(np.concatenate(parts), now_ns=now)
        store.insert_batch(
            f"sim-{t}",
            agent_id=deriver.instance,
            samples=derived.samples,
            spans=derived.spans,
            events=derived.events,
            instances=derived.instances,
        )
        if after_batch is not None:
            after_batch(t, now)
