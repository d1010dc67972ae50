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


REPO = Path(__file__).resolve().parents[2]
#: Every package whose ``__init__`` builds its namespace with ``lazy_exports`` (found, not listed).
LAZY_PACKAGES = sorted(
    "kernel_insight." + ".".join(init.relative_to(REPO).parent.parts)
    for init in REPO.glob("*/**/__init__.py")
    if init.parts[len(REPO.parts)] in {"agent", "api", "collector", "kql", "rules", "sdk"}
    and "lazy_exports(globals())" in init.read_text()
)


def test_the_lazy_packages_are_found() -> None:
    assert {"kernel_insight.kql", "kernel_insight.collector", "kernel_insight.api.health"} <= set(
        LAZY_PACKAGES
    )


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_a_lazy_package_exports_its_type_checking_imports_and_nothing_else(name: str) -> None:
    """The ``if TYPE_CHECKING:`` block is the one list (kernel_insight/_lazy.py): ``__all__`` is it,
    and each name resolves, on first use, to the very object of the module the block names."""
    from kernel_insight._lazy import exports_of

    mod = importlib.import_module(name)
    exports = exports_of(Path(mod.__file__ or "").read_text())
    assert sorted(exports) == mod.__all__
    folder = Path(mod.__file__ or "").resolve().parent
    for export, (module, attr) in exports.items():
        # a name that is also a submodule's becomes the submodule once that is imported
        assert not (folder / f"{export}.py").exists(), f"{name}.{export} is also a module"
        assert getattr(mod, export) is getattr(importlib.import_module(module), attr)
    with pytest.raises(AttributeError, match="has no attribute 'not_exported'"):
        _ = mod.not_exported


def test_a_lazy_block_with_anything_but_absolute_imports_is_refused() -> None:
    from kernel_insight._lazy import exports_of

    with pytest.raises(ValueError, match="only absolute from-imports"):
        exports_of("if TYPE_CHECKING:\n    from .engine import Engine as Engine\n")
    with pytest.raises(ValueError, match="only absolute from-imports"):
        exports_of("if TYPE_CHECKING:\n    import numpy\n")
