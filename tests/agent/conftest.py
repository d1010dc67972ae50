"""Fixtures for the agent tests: the agent built from the current sources (unique ring names: support/rings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_harness import build


@pytest.fixture(scope="session")
def agent_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ki-agent compiled from agent/src now, so tests never run a stale agent/bin."""
    return build(tmp_path_factory.mktemp("agent-build")) / "ki-agent"


@pytest.fixture(scope="session")
def agent_asan_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("agent-asan"), "asan") / "ki-agent-asan"
