"""The allowed arrows between components (docs/architecture.md, "Dependency rules"), read from the source.

Every import is counted, also those inside functions: a lazy import is still a dependency.
A new top-level component must be added to RULES before its code can land.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: A leaf of the package root that every component may import: the standard library only (checked below).
SHARED_LEAVES = frozenset({"kernel_insight._lazy"})

#: component -> (components it may import, third-party packages it may import).
#: The package root (kernel_insight/*.py: the CLI, ``make run``, the composition root that
#: builds the server) may import anything; it is listed under "root".
RULES: dict[str, tuple[frozenset[str], frozenset[str] | None]] = {
    # Producers and the agent know nothing of servers: only the ring, records and metric ids.
    "agent": (frozenset({"agent"}), frozenset({"numpy", "pynvml", "bcc", "torch", "cupy", "grpc", "google"})),
    # The query language knows no HTTP and no storage engine: storage is a protocol it defines.
    "kql": (frozenset({"kql"}), frozenset({"numpy", "lark", "re2", "orjson"})),
    # The collector stores what agents send and implements kql's storage protocol.
    "collector": (frozenset({"collector", "agent", "kql"}), None),
    # The API composes kql and the collector's storage.
    "api": (frozenset({"api", "collector", "kql", "agent"}), None),
    # Rule evaluation composes kql, the storage and the API's notions (scopes, routers).
    "rules": (frozenset({"rules", "collector", "kql", "api", "agent"}), None),
    # The SDK is what clients install: httpx and the standard library only.
    "sdk": (frozenset({"sdk"}), frozenset({"httpx"})),
}


def _component(path: Path) -> str:
    top = path.relative_to(ROOT).parts[0]
    return "root" if top == "kernel_insight" else top


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(
                    f"{path}:{node.lineno}: relative import (the project imports absolutely)"
                )
            found.append((node.lineno, node.module or ""))
    return found


def _sources() -> list[Path]:
    files: list[Path] = []
    for top in sorted({*RULES, "kernel_insight"}):
        folder = ROOT / top
        if folder.is_dir():
            files.extend(folder.rglob("*.py"))
    return files


def test_every_component_folder_has_rules() -> None:
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops - {*RULES, "kernel_insight", "tests", "bench"} == set(), "add the new component to RULES"


@pytest.mark.parametrize("leaf", sorted(SHARED_LEAVES))
def test_the_shared_leaves_import_the_standard_library_only(leaf: str) -> None:
    path = ROOT / "kernel_insight" / f"{leaf.rsplit('.', 1)[1]}.py"
    tops = {module.split(".")[0] for _, module in _imports(path)}
    assert tops <= {*sys.stdlib_module_names, "__future__"}, tops


@pytest.mark.parametrize("component", sorted(RULES))
def test_component_imports_only_what_its_rule_allows(component: str) -> None:
    components, third_party = RULES[component]
    wrong: list[str] = []
    for path in _sources():
        if _component(path) != component:
            continue
        for line, module in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}: {module}"
            if module in SHARED_LEAVES:
                continue
            if top == "kernel_insight":
                parts = module.split(".")
                target = parts[1] if len(parts) > 1 else "root"
                if target not in components:
                    wrong.append(where)
            elif third_party is not None and top not in (
                *sys.stdlib_module_names,
                "__future__",
                *third_party,
            ):
                wrong.append(where)
    assert wrong == [], f"{component} may import {sorted(components)}; these break the rule:\n" + "\n".join(
        wrong
    )


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    probe = tmp_path / "x.py"
    probe.write_text("def f():\n    from kernel_insight.collector.clickhouse.store import Store\n")
    assert _imports(probe) == [(2, "kernel_insight.collector.clickhouse.store")]
