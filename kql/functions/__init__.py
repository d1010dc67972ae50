"""Function bodies, one module per family, each registered in :data:`FUNCTIONS` by its decorator."""

from __future__ import annotations

from kernel_insight.kql.functions import (  # noqa: F401  (importing registers the functions)
    extensions,
    histogram,
    info,
    labels,
    math,
    range,
    range_histograms,
    time,
)
from kernel_insight.kql.functions.registry import FUNCTIONS, FunctionSpec, GridPushdown, function

__all__ = ["FUNCTIONS", "FunctionSpec", "GridPushdown", "function"]
