"""Every third-party package the product imports is declared in pyproject.toml (a fresh install has it).

Read from the source, as test_dependencies.py reads the arrows between components: a module
that imports a package only another dependency happens to pull in breaks when that one drops it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("kernel_insight", "agent", "collector", "kql", "api", "sdk", "rules")

#: Import name -> distribution, where they differ.
DISTRIBUTION = {
    "re2": "google-re2",
    "yaml": "pyyaml",
    "pynvml": "nvidia-ml-py",
    "clickhouse_connect": "clickhouse-connect",
    "prometheus_client": "prometheus-client",
    "grpc": "grpcio",
    "google": "protobuf",  # google.protobuf, in the generated podresources stubs
}
#: Imported only at the hardware boundary, when present (docs/probes.md): never required.
OPTIONAL = {"bcc", "torch", "cupy"}


def _imports() -> dict[str, str]:
    """Top-level third-party module -> one place importing it."""
    found: dict[str, str] = {}
    for top in COMPONENTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "kernel_insight" in path.relative_to(ROOT).parts[1:]:
                continue  # the namespace links back to the component folders
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                for name in names:
                    first = name.split(".")[0]
                    if (
                        first not in sys.stdlib_module_names
                        and first != "kernel_insight"
                        and not first.startswith("_")
                    ):
                        found.setdefault(first, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_every_imported_package_is_a_declared_dependency() -> None:
    declared = _declared()
    missing = [
        f"{where}: {module} ({DISTRIBUTION.get(module, module.replace('_', '-'))})"
        for module, where in sorted(_imports().items())
        if module not in OPTIONAL
        and DISTRIBUTION.get(module, module.replace("_", "-")).lower() not in declared
    ]
    assert missing == [], "imported but not in pyproject.toml's dependencies:\n" + "\n".join(missing)


def test_the_check_sees_imports() -> None:
    found = _imports()
    assert {"numpy", "fastapi", "httpx", "lark"} <= set(found)
