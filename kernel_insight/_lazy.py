"""Package namespaces whose exports are imported on first use (PEP 562), so that a light command
(``ki --help``, ``ki ring stat``) that imports one module of a package does not pay for the rest.

A package lists its exports once, as the imports of its ``if TYPE_CHECKING:`` block (``from
module import Name as Name``): what mypy and editors read (``as`` marks a re-export), and what
:func:`lazy_exports` reads from the package's source to know which module gives each name and to
set ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["exports_of", "lazy_exports"]


def exports_of(source: str) -> dict[str, tuple[str, str]]:
    """Exported name -> (module, name there), from the ``if TYPE_CHECKING:`` imports of ``source``."""
    found: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if not isinstance(statement, ast.ImportFrom) or statement.module is None or statement.level:
                    raise ValueError("a lazy package's TYPE_CHECKING block holds only absolute from-imports")
                for alias in statement.names:
                    found[alias.asname or alias.name] = (statement.module, alias.name)
    return found


def lazy_exports(package: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``package``, and its
    ``__all__``: the exports are its ``TYPE_CHECKING`` imports (:func:`exports_of`, read from its
    ``__init__``'s source once, at import). Each name is imported once, then kept in the package's
    namespace (later uses are plain lookups)."""
    module_of = exports_of(Path(package["__file__"]).read_text())
    package_name = package["__name__"]
    package["__all__"] = sorted(module_of)

    def getattr_(name: str) -> Any:
        where = module_of.get(name)
        if where is None:
            raise AttributeError(f"module {package_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[0]), where[1])
        package[name] = value
        return value

    def dir_() -> list[str]:
        """The exports and the package's own private names: not what ``__init__`` imported to
        build the namespace (``TYPE_CHECKING``, ``lazy_exports``)."""
        return sorted({*package["__all__"], *(n for n in package if n.startswith("_"))})

    return getattr_, dir_
