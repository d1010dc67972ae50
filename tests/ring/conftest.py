"""Fixtures for the ring tests: the C tool (unique ring names: support/rings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ringutil import HERE, compile_c


@pytest.fixture(scope="session")
def ringtool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(HERE / "c" / "ringtool.c", tmp_path_factory.mktemp("ringtool") / "ringtool")
