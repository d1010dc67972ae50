"""The SDK installs on its own (sdk/pyproject.toml): its wheel, in a clean venv, pulls httpx only.
The server distribution (pyproject.toml) depends on it and ships none of its files.

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
import zipfile
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


def _wheel(source: Path, out: Path) -> Path:
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source)
    (wheel,) = out.glob("*.whl")
    return wheel


def _package_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


@pytest.mark.slow
def test_server_wheel_depends_on_the_sdk_and_ships_none_of_its_files(tmp_path):
    """Each module has one owner: installing both distributions overwrites nothing."""
    tracked = _run("git", "-C", REPO, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    source = tmp_path / "src"
    for rel in filter(None, tracked):
        if (REPO / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, source / rel)
    sdk = _wheel(source / "sdk", tmp_path / "sdk-wheel")
    server = _wheel(source, tmp_path / "server-wheel")
    sdk_files, server_files = _package_files(sdk), _package_files(server)
    assert sdk_files & server_files == set()
    assert "kernel_insight/sdk/__init__.py" in sdk_files
    assert "kernel_insight/__init__.py" in server_files
    assert "kernel_insight/__init__.py" not in sdk_files  # alone, the SDK's kernel_insight is a namespace
    assert not [n for n in server_files if n.startswith("kernel_insight/sdk/")]
    with zipfile.ZipFile(server) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line for line in z.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")
        ]
    assert "Requires-Dist: kernel-insight-sdk==0.1.0" in requires, requires

    # Both installed side by side: kernel_insight (the server's package, extend_path) finds the SDK.
    target = tmp_path / "site"
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, sdk, server)
    both = (
        "import json, kernel_insight.sdk, kernel_insight.collector;"
        "print(json.dumps([kernel_insight.sdk.__file__, kernel_insight.collector.__file__]))"
    )
    files = json.loads(
        _run(sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {both}")
    )
    assert [Path(f).relative_to(target).as_posix() for f in files] == [
        "kernel_insight/sdk/__init__.py",
        "kernel_insight/collector/__init__.py",
    ]
