"""Fixtures for the ring tests: the C tool and unique ring names."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ringutil import HERE, compile_c

from kernel_insight.agent import Ring, RingError


@pytest.fixture(scope="session")
def ringtool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(HERE / "c" / "ringtool.c", tmp_path_factory.mktemp("ringtool") / "ringtool")


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = f"/kernel_insight.test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(RingError):
        Ring.unlink(name)
