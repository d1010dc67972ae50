"""Function bodies, one module per family, each registered in :data:`FUNCTIONS` by its decorator."""

from __future__ import annotations

from kernel_insight.kql.functions import histogram, info, labels, math, range, time  # noqa: F401  (registration)
from kernel_insight.kql.functions.registry import FUNCTIONS, FunctionSpec, function

__all__ = ["FUNCTIONS", "FunctionSpec", "function"]
