"""Fixtures for the SDK tests (helpers live in sdk_helpers, a module name unique in the suite)."""

from __future__ import annotations

import pytest
from sdk_helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()
