"""The limits every kql query runs under, and their defaults.

Apart from the engine because ``ki collector --help`` prints these defaults: this module
imports only the standard library (the engine pulls in numpy and every function), and the
engine, the HTTP API and the command line import :class:`EngineLimits` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_insight.kql.storage import ReadBudget

__all__ = ["DEFAULT_LOOKBACK_MS", "EngineLimits"]

#: How far back an instant selector looks for a series' newest sample (Prometheus' 5 minutes).
DEFAULT_LOOKBACK_MS = 5 * 60 * 1000


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Execution limits; every query gets them unless it passes its own."""

    # Samples held in memory at one time (Prometheus' query.max-samples): the inputs a node is
    # working on plus the results it has built; kql also counts its dense series x steps arrays.
    max_samples: int = 50_000_000
    timeout_s: float = 30.0
    max_series: int = 1_000_000  # series one selector may return, and series in a result
    lookback_ms: int = DEFAULT_LOOKBACK_MS
    subquery_step_ms: int = 60_000  # resolution of subqueries written without a step

    def read_budget(self, deadline: float, held: int = 0) -> ReadBudget:
        """What one storage read may spend: until ``deadline``, and the samples ``held`` leaves free."""
        from kernel_insight.kql.storage import ReadBudget  # numpy: only once a query runs

        return ReadBudget(deadline, self.timeout_s, max(0, self.max_samples - held))
