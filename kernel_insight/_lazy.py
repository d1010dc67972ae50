"""Package namespaces whose exports are imported on first use (PEP 562), so that a light command
(``ki --help``, ``ki ring stat``) that imports one module of a package does not pay for the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: dict[str, Any], exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``package``:
    ``exports`` maps each module to the names it gives the package. Each name is imported once,
    then kept in the package's namespace (later uses are plain lookups)."""
    module_of = {name: module for module, names in exports.items() for name in names}
    package_name = package["__name__"]

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        package[name] = value
        return value

    def dir_() -> list[str]:
        """The exports and the package's own private names: not what ``__init__`` imported to
        build the namespace (``TYPE_CHECKING``, ``lazy_exports``)."""
        return sorted({*package.get("__all__", ()), *(n for n in package if n.startswith("_"))})

    return getattr_, dir_
