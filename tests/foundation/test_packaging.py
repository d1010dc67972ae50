"""`pip install .` builds a wheel with the compiled ring and only the kernel_insight namespace."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_wheel_holds_the_compiled_ring_under_one_namespace(tmp_path: Path) -> None:
    # --no-build-isolation: build with the venv's setuptools, no download needed.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("kernel_insight-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"kernel_insight", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert any(n.startswith("kernel_insight/agent/_ring.") and n.endswith(".so") for n in names)
    assert "kernel_insight/agent/include/ki_ring.h" in names
    assert "kernel_insight/kql/grammar/kql.lark" in names  # an installed kql must parse
    for component in ["agent", "collector", "kql", "api", "sdk", "rules"]:
        assert f"kernel_insight/{component}/__init__.py" in names
