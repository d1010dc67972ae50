"""Every module of the mapped folders is importable under its ``kernel_insight.*`` name, from the
real file (pyproject.toml's package-dir; docs/architecture.md "Packaging").

The development install is setuptools' strict editable mode: a tree of links to the files that
existed when it ran. A module added since is missing from it until the install is refreshed, and a
folder missing from ``[tool.setuptools] packages`` is missing from the wheel too; both fail here,
with the fix in the message, rather than as a puzzling ImportError elsewhere.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The two distributions: the server (pyproject.toml) and the SDK it depends on (sdk/pyproject.toml),
#: each mapping its folders into kernel_insight; each package is listed by exactly one of them.
DISTRIBUTIONS = {"": ROOT / "pyproject.toml", "sdk": ROOT / "sdk" / "pyproject.toml"}
PACKAGE_DIR: dict[str, str] = {}
PACKAGES: list[str] = []
for _base, _pyproject in DISTRIBUTIONS.items():
    _config = tomllib.loads(_pyproject.read_text())["tool"]["setuptools"]
    PACKAGE_DIR |= {package: str(Path(_base, folder)) for package, folder in _config["package-dir"].items()}
    PACKAGES += _config["packages"]

STALE = (
    "run `make build` (scripts/bootstrap.sh re-links the strict editable install when modules are "
    "added or removed; by hand: .venv/bin/pip install -e ./sdk -e . --no-deps --no-build-isolation "
    "--config-settings editable_mode=strict)"
)


def _modules() -> dict[str, Path]:
    """Dotted name -> real file, for every .py module and built extension under the mapped folders."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base)
            # sdk/build: the SDK's own strict editable install (links to these same files).
            if {"__pycache__", "build"} & set(rel.parts) or not path.is_file():
                continue
            suffix = next((s for s in importlib.machinery.EXTENSION_SUFFIXES if path.name.endswith(s)), None)
            if path.suffix == ".py":
                stem = path.stem
            elif suffix is not None:
                stem = path.name[: -len(suffix)]
            else:
                continue
            parts = [*rel.parts[:-1], stem]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def test_every_mapped_folder_is_a_component() -> None:
    assert PACKAGE_DIR["kernel_insight"] == "kernel_insight"
    for package, folder in PACKAGE_DIR.items():
        assert (ROOT / folder / "__init__.py").is_file(), (
            f"{folder}/ is mapped to {package} but is no package"
        )
        assert package in PACKAGES
    # No links left in the tree: the packaging maps the folders, nothing else does.
    links = [str(p.relative_to(ROOT)) for p in (ROOT / "kernel_insight").iterdir() if p.is_symlink()]
    assert links == []


def test_each_package_has_one_owner() -> None:
    assert sorted(set(PACKAGES)) == sorted(PACKAGES), "a package is listed by both distributions"
    assert "kernel_insight.sdk" in PACKAGES
    assert tomllib.loads(DISTRIBUTIONS["sdk"].read_text())["tool"]["setuptools"]["packages"] == [
        "kernel_insight.sdk"
    ]  # the SDK ships no kernel_insight/__init__.py: installed alone, kernel_insight is a namespace


def test_every_folder_with_modules_is_a_listed_package() -> None:
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    folders = {name.rsplit(".", 1)[0] for name, path in MODULES.items() if path.name != "__init__.py"}
    assert folders - packages == set(), "a folder with modules has no __init__.py"
    missing = sorted(packages - set(PACKAGES))
    assert missing == [], (
        f"add {missing} to [tool.setuptools] packages in pyproject.toml (the wheel skips them)"
    )


#: The compiled extensions setup.py builds.
EXTENSIONS = [
    "kernel_insight.agent._ring",
    "kernel_insight.collector._decode",
    "kernel_insight.collector._valuecodec",
    "kernel_insight.kql._windows",
]


def test_the_walk_sees_every_component_and_every_extension() -> None:
    assert {n.split(".")[1] for n in MODULES if n.count(".")} >= {
        "agent", "api", "collector", "kql", "rules", "sdk", "cli", "server",
    }  # fmt: skip
    assert MODULES["kernel_insight.agent.probe.nvml"] == ROOT / "agent" / "probe" / "nvml.py"
    extensions = {n for n, p in MODULES.items() if p.suffix == ".so"}
    assert extensions == set(EXTENSIONS), (
        "the compiled extensions are missing from the source folders: " + STALE
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_importable_under_the_namespace(name: str) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"{name} is not importable: {STALE}"
    assert spec.origin is not None
    assert Path(spec.origin).resolve() == MODULES[name], (
        f"{name} is imported from {spec.origin}, not {MODULES[name]}: {STALE}"
    )


@pytest.mark.parametrize("name", EXTENSIONS)
def test_built_extension_loads(name: str) -> None:
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").resolve() == MODULES[name]
    assert [n for n in dir(module) if not n.startswith("_")] != []
