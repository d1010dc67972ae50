"""Kernel Insight: fresh, trustworthy facts about every GPU in a fleet.

The components live in their own top-level folders and the packaging maps them into this one
namespace (``kernel_insight.agent`` is ``agent/``: pyproject.toml's package-dir), so nothing
generic such as ``api`` lands in site-packages.
"""

from __future__ import annotations

from pkgutil import extend_path

__all__ = ["__version__"]

__version__ = "0.1.0"

# Run from a checkout's root (``python -m kernel_insight.cli``, ``python -m bench.x``), this folder
# comes first on sys.path and holds only the package root, not the mapped components. The
# installed package (a wheel, or the strict editable install's tree of links) holds them:
# ``__path__`` takes in every ``kernel_insight`` folder on sys.path, so ``kernel_insight.agent``
# is found there. Installed alone, this folder is the only one and nothing changes.
__path__ = extend_path(__path__, __name__)
