"""Fixtures for the rule tests: a unique ring label for the end-to-end run."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from kernel_insight.agent import Ring, RingError, ring_name


@pytest.fixture
def label_prefix() -> Iterator[str]:
    """A ring label prefix no other test uses; its rings are removed after the test."""
    prefix = f"rtest-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield prefix
    for i in range(4):
        with contextlib.suppress(RingError):
            Ring.unlink(ring_name(f"{prefix}{i}"))
