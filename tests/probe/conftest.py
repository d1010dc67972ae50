"""Fixtures for the probe tests: unique ring labels."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from kernel_insight.agent import Ring, RingError, ring_name


@pytest.fixture
def label_prefix() -> Iterator[str]:
    """A prefix for ring labels that no other test or process uses; rings under it are removed after."""
    prefix = f"ptest-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield prefix
    for i in range(16):
        with contextlib.suppress(RingError):
            Ring.unlink(ring_name(f"{prefix}{i}"))
