"""Each package's public surface is exactly what its __all__ says, and the install layout holds."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

PACKAGES = [
    "kernel_insight",
    "kernel_insight.agent",
    "kernel_insight.collector",
    "kernel_insight.kql",
    "kernel_insight.api",
    "kernel_insight.sdk",
    "kernel_insight.rules",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_exists(name: str) -> None:
    mod = importlib.import_module(name)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(mod, n)]
    assert missing == []
    assert len(set(exported)) == len(exported)


def test_ring_api_is_public() -> None:
    agent = importlib.import_module("kernel_insight.agent")
    for n in ["Ring", "RingReader", "RingError", "ring_name", "RecordType", "StringTable", "RECORD_DTYPE"]:
        assert n in agent.__all__


def test_components_install_under_one_namespace() -> None:
    repo = Path(__file__).resolve().parents[2]
    for component in ["agent", "collector", "kql", "api", "sdk", "rules"]:
        mod = importlib.import_module(f"kernel_insight.{component}")
        installed = Path(mod.__file__ or "")
        # Installed at kernel_insight/<component>/ (a wheel, or the strict editable tree of links) ...
        assert installed.parent.name == component
        assert installed.parent.parent.name == "kernel_insight"
        # ... from the top-level source folder (pyproject.toml's package-dir).
        assert installed.resolve() == repo / component / "__init__.py"
    dist = importlib.metadata.distribution("kernel-insight")
    assert (dist.read_text("top_level.txt") or "").split() == [
        "kernel_insight"
    ]  # nothing generic at top level
