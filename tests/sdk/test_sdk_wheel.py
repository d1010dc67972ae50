"""The SDK installs on its own (sdk/pyproject.toml): its wheel, in a clean venv, pulls httpx only.

A user of the client must not install chDB, pyarrow, the NVML bindings or the server. The wheel
is built from a copy of ``sdk/`` (no build files land in the source tree), httpx and its
dependencies come from the package index (or pip's cache) as wheels, and the venv installs
with ``--no-index`` from those alone: anything else the SDK asked for would fail the install.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]

#: What a clean install of the SDK may hold: the SDK, httpx and httpx's own dependencies, pip.
ALLOWED = {"kernel-insight-sdk", "httpx", "httpcore", "anyio", "certifi", "idna", "h11", "sniffio"}
ALLOWED |= {"typing-extensions", "exceptiongroup", "pip", "setuptools"}

CHECK = """
import importlib.metadata as md, importlib.util, json, sys
import httpx
import kernel_insight.sdk as sdk

def server(request):
    return httpx.Response(200, json={"as_of_ms": 1, "instances": []}, headers={"ETag": '"a"'})

client = sdk.HealthClient("http://collector", transport=httpx.MockTransport(server))
snapshot = client.snapshot()
missing = [m for m in ("chdb", "pyarrow", "numpy", "fastapi", "pynvml", "lark") if importlib.util.find_spec(m)]
print(json.dumps({
    "dists": sorted(d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()),
    "present": missing,
    "instances": len(snapshot.instances),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in {"chdb", "pyarrow", "numpy", "fastapi"}),
    "file": sdk.__file__,
}))
"""


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow
def test_sdk_wheel_installs_alone_with_httpx_only(tmp_path):
    source = tmp_path / "sdk"
    shutil.copytree(REPO / "sdk", source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, source
    )
    (sdk_wheel,) = wheels.glob("kernel_insight_sdk-*.whl")
    _run(sys.executable, "-m", "pip", "download", "-q", "-d", wheels, f"httpx=={httpx.__version__}")
    env = tmp_path / "env"
    _run(sys.executable, "-m", "venv", env)
    python = env / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, sdk_wheel)
    found = json.loads(_run(python, "-c", CHECK, cwd=tmp_path))
    assert set(found["dists"]) <= ALLOWED, found["dists"]
    assert {"kernel-insight-sdk", "httpx"} <= set(found["dists"])
    assert found["present"] == []
    assert found["modules"] == []
    assert found["instances"] == 0
    assert found["file"].startswith(str(env))  # the installed copy, not this checkout
