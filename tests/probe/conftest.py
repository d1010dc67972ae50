"""Fixtures for the probe tests: the NVML stand-in library (unique ring labels: support/rings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvmlutil import SCRIPT
from probeutil import HERE, compile_c


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
