"""Kernel Insight: fresh, trustworthy facts about every GPU in a fleet.

The components live in their own top-level folders and install under this one
namespace (``kernel_insight.agent`` is ``agent/``), so nothing generic such as
``api`` lands in site-packages.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
