"""`pip install .` builds a wheel with the compiled parts and only the kernel_insight namespace, and
that wheel works installed in a clean venv, away from the checkout.

The source folders are mapped into the namespace by pyproject.toml's package-dir (no links); these
tests are what proves the mapping reaches a real install, not only the strict editable tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The server distribution's components; the SDK (sdk/) is its own distribution, kernel-insight-sdk
#: (tests/sdk/test_sdk_wheel.py checks its wheel and that no file is in both).
COMPONENTS = ["agent", "collector", "kql", "api", "rules"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: build with the venv's setuptools, no download needed.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("kernel_insight-*.whl")
    return built


@pytest.mark.slow
def test_wheel_holds_the_compiled_ring_under_one_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"kernel_insight", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert any(n.startswith("kernel_insight/agent/_ring.") and n.endswith(".so") for n in names)
    assert any(n.startswith("kernel_insight/collector/_decode.") and n.endswith(".so") for n in names)
    assert "kernel_insight/agent/bin/ki-agent" in names
    assert "kernel_insight/agent/include/ki_ring.h" in names
    assert "kernel_insight/kql/grammar/kql.lark" in names  # an installed kql must parse
    assert "kernel_insight/api/ui/static/index.html" in names
    for package in [
        "agent",
        "agent/probe",
        "api",
        "api/health",
        "api/ui",
        "collector",
        "kql",
        "kql/functions",
    ]:
        assert f"kernel_insight/{package}/__init__.py" in names
    # Every module of every source folder, under its namespace name.
    for component in COMPONENTS:
        for path in (ROOT / component).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert f"kernel_insight/{path.relative_to(ROOT).as_posix()}" in names


CHECK = """
import json, sys
import kernel_insight, kernel_insight.agent._ring, kernel_insight.collector._decode
import kernel_insight.api, kernel_insight.collector, kernel_insight.kql, kernel_insight.server
from kernel_insight.agent.launcher import agent_binary
from kernel_insight.kql import parse
parse('sum by (gpu) (rate(kernel_launches_total[5m]))')
mods = [m for n, m in sys.modules.items() if n.startswith("kernel_insight") and getattr(m, "__file__", None)]
print(json.dumps({"files": sorted(m.__file__ for m in mods), "agent": str(agent_binary())}))
"""


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_clean_venv(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    python = env / "bin" / "python"
    # The dependencies (chDB, pyarrow, numpy, ...: gigabytes) are this venv's, seen through a .pth
    # path entry: that is no site directory, so its own .pth files, the editable install's among
    # them, are not read. The package itself comes from the wheel alone.
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "_ki_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "elsewhere"
    run.mkdir()
    found = json.loads(subprocess.check_output([python, "-c", CHECK], cwd=run, text=True, timeout=120))
    assert len(found["files"]) > 20
    for file in found["files"]:
        # Installed copies, no links back into this checkout.
        assert file.startswith(str(site / "kernel_insight")), file
        assert Path(file).resolve().is_relative_to(site), file
    assert found["agent"] == str(site / "kernel_insight" / "agent" / "bin" / "ki-agent")
    ki = env / "bin" / "ki"
    helped = subprocess.run([ki, "--help"], cwd=run, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    for command in ["collector", "agent", "import", "timeline"]:
        assert command in helped.stdout
    version = subprocess.run([ki, "agent", "--version"], cwd=run, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert "ki-agent" in version.stdout + version.stderr
