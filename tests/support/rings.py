"""Rings that clean up after themselves: unique names, removed when the test ends.

``ring_name`` and ``label_prefix`` are fixtures for every test folder (tests/conftest.py imports
them); ``fresh_ring`` is the ring a test creates, closed and unlinked when it leaves the block.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from kernel_insight.agent import Ring, RingError
from kernel_insight.agent import ring_name as gpu_ring_name

__all__ = ["fresh_ring", "label_prefix", "ring_name", "unique_ring_name"]

#: Ring labels a ``label_prefix`` test may use: ``<prefix>0`` .. ``<prefix>15``.
LABELS_PER_PREFIX = 16


def unique_ring_name(what: str = "test") -> str:
    """A shared-memory name no other test or process uses (pid and a random part)."""
    return f"/kernel_insight.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def unlink_quietly(name: str) -> None:
    """Remove ring ``name`` if it exists."""
    with contextlib.suppress(RingError, OSError):
        Ring.unlink(name)


@contextlib.contextmanager
def fresh_ring(name: str, capacity: int = 1 << 14) -> Iterator[Ring]:
    """A new ring ``name`` (one left over from a killed run is replaced), closed and unlinked after."""
    unlink_quietly(name)
    ring = Ring.create(name, capacity=capacity)
    try:
        yield ring
    finally:
        ring.close()
        unlink_quietly(name)


@pytest.fixture
def ring_name() -> Iterator[str]:
    """A unique ring name; the ring, if the test made one, is removed after it."""
    name = unique_ring_name()
    yield name
    unlink_quietly(name)


@pytest.fixture
def label_prefix() -> Iterator[str]:
    """A prefix for GPU ring labels (``ki probe ... --ring-prefix``) that no other test or process
    uses; the rings ``<prefix>0`` .. ``<prefix>15`` are removed after the test."""
    prefix = f"ptest-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield prefix
    for i in range(LABELS_PER_PREFIX):
        unlink_quietly(gpu_ring_name(f"{prefix}{i}"))
