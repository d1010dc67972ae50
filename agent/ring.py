"""Python producers and readers of the shared-memory ring (docs/ring.md).

The producer side is the compiled ``_ring.Ring`` itself, so a write from
Python is one C call that ends in the header's atomic release, never a plain
memory write.  The reader wraps the single-consumer handle with typed and
bulk (numpy) views.
"""

from __future__ import annotations

import enum
import re
from types import TracebackType
from typing import Self

import numpy as np
import numpy.typing as npt

from kernel_insight.agent import _ring
from kernel_insight.agent.records import RECORD_DTYPE, Record, decode_records

__all__ = [
    "DEFAULT_CAPACITY",
    "RECORD_SIZE",
    "RING_VERSION",
    "Ring",
    "RingError",
    "RingReader",
    "WriteStatus",
    "ring_name",
]

Ring = _ring.Ring
RingError = _ring.RingError
RING_VERSION: int = _ring.VERSION
RECORD_SIZE: int = _ring.RECORD_SIZE
DEFAULT_CAPACITY: int = _ring.DEFAULT_CAPACITY

_GPU_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


class WriteStatus(enum.IntEnum):
    """What a producer call returns; a producer never waits, so loss is a value, not a delay."""

    OK = 0
    DROPPED = _ring.DROPPED  # ring full
    LOST = _ring.LOST  # the consumer abandoned the slot before it was published


def ring_name(gpu: int | str) -> str:
    """The shm object name of a GPU's ring: ``/kernel_insight.<index or uuid>``."""
    label = str(gpu)
    if not _GPU_RE.match(label):
        raise ValueError(
            f"invalid GPU label {label!r}: use an index or a UUID ([A-Za-z0-9_.:-], 1-200 chars)"
        )
    return f"/kernel_insight.{label}"


class RingReader:
    """The ring's single consumer, for tools and tests (the agent is the C consumer).

    Example::

        with RingReader.open(ring_name(0)) as reader:
            for rec in reader.read():
                print(rec)
    """

    def __init__(self, consumer: _ring.Consumer, batch: int = 8192) -> None:
        self._consumer = consumer
        self._buf = np.empty(batch, dtype=RECORD_DTYPE)

    @classmethod
    def open(
        cls,
        name: str,
        *,
        create: bool = False,
        stall_timeout_s: float = 0.25,
        stall_min_s: float = 0.002,
        batch: int = 8192,
    ) -> Self:
        consumer = _ring.Consumer.open(name, create, int(stall_timeout_s * 1e9), int(stall_min_s * 1e9))
        return cls(consumer, batch)

    @property
    def capacity(self) -> int:
        return self._consumer.capacity

    @property
    def label(self) -> str:
        return self._consumer.label

    def read_array(self, max_records: int | None = None) -> npt.NDArray[np.void]:
        """Consume up to max_records (default: one batch) into a new structured array."""
        limit = len(self._buf) if max_records is None else max(0, min(max_records, len(self._buf)))
        n = self._consumer.read_into(self._buf[:limit])
        return self._buf[:n].copy()

    def read_into(self, out: npt.NDArray[np.void]) -> int:
        """Consume into a caller's RECORD_DTYPE array; returns the count (no allocation)."""
        if out.dtype != RECORD_DTYPE:
            raise TypeError("read_into() needs an array of RECORD_DTYPE")
        return self._consumer.read_into(out)

    def peek(self, max_records: int | None = None) -> npt.NDArray[np.void]:
        """Read without freeing: the records stay in the ring (and are read again by a
        restarted consumer) until commit(), for consumers that must first make them durable."""
        limit = len(self._buf) if max_records is None else max(0, min(max_records, len(self._buf)))
        n = self._consumer.peek_into(self._buf[:limit])
        return self._buf[:n].copy()

    def commit(self) -> None:
        """Free every slot read by peek() so far."""
        self._consumer.commit()

    def read_bytes(self, max_records: int | None = None) -> bytes:
        return self.read_array(max_records).tobytes()

    def read(self, max_records: int | None = None) -> list[Record]:
        """Consume and decode; unknown record types raise ValueError."""
        return decode_records(self.read_bytes(max_records))

    def stats(self) -> dict[str, int]:
        return self._consumer.stats()

    def producer_stats(self, producer_id: int) -> dict[str, int] | None:
        return self._consumer.producer_stats(producer_id)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
