"""Fixtures for the probe tests: unique ring labels, the NVML stand-in library."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvmlutil import SCRIPT
from probeutil import HERE, compile_c

from kernel_insight.agent import Ring, RingError, ring_name


@pytest.fixture
def label_prefix() -> Iterator[str]:
    """A prefix for ring labels that no other test or process uses; rings under it are removed after."""
    prefix = f"ptest-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield prefix
    for i in range(16):
        with contextlib.suppress(RingError):
            Ring.unlink(ring_name(f"{prefix}{i}"))


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    return compile_c(
        [
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libnvidia-ml.so.1",
            str(HERE / "c" / "fake_nvml.c"),
        ],
        out,
    )


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The NVML stand-in's script file (nvmlutil.SCRIPT), named in KI_FAKE_NVML_SCRIPT."""
    path = tmp_path / "nvml.script"
    path.write_text(SCRIPT)
    monkeypatch.setenv("KI_FAKE_NVML_SCRIPT", str(path))
    return path
