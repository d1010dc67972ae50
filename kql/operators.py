"""The one binary-operator registry: each operator's kind, binding strength and float arithmetic.

The parser, the checker, the printer and the evaluators read :data:`OPERATORS` (the grammar's
precedence ladder in ``grammar/kql.lark`` is the same ladder), as they read
:data:`kernel_insight.kql.functions.FUNCTIONS` for functions and
:data:`kernel_insight.kql.aggregators.AGGREGATORS` for aggregations.

>>> OPERATORS["atan2"].kind, OPERATORS["atan2"].precedence
('arithmetic', 5)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ARITHMETIC", "COMPARISON", "OPERATORS", "SET", "TRIM", "OperatorSpec", "names_of_kind"]

#: The kinds of binary operator.
ARITHMETIC = "arithmetic"
COMPARISON = "comparison"
TRIM = "trim"  # native-histogram trim (Prometheus 3): ``h </ x`` keeps observations below x
SET = "set"


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    """A binary operator.

    ``precedence``: higher binds tighter (unary minus binds at 6, between ``*`` and ``^``);
    ``right_assoc``: ``a ^ b ^ c`` is ``a ^ (b ^ c)``.
    ``floats``: the elementwise numpy operation over float samples (arithmetic and comparisons;
    numpy's float64 arithmetic is Go's: ``x/0`` is ±Inf). ``compare``: a comparison over two
    Python floats, for the per-sample histogram path.
    """

    name: str
    kind: str
    precedence: int
    right_assoc: bool = False
    floats: Callable[[Any, Any], Any] | None = field(default=None, compare=False, repr=False)
    compare: Callable[[float, float], bool] | None = field(default=None, compare=False, repr=False)

    @property
    def keeps_name(self) -> bool:
        """Whether the result keeps the metric name (without ``bool``): comparisons and trims."""
        return self.kind in (COMPARISON, TRIM)


def _spec(
    name: str,
    kind: str,
    precedence: int,
    floats: Callable[[Any, Any], Any] | None = None,
    compare: Callable[[float, float], bool] | None = None,
    right_assoc: bool = False,
) -> OperatorSpec:
    return OperatorSpec(name, kind, precedence, right_assoc, floats, compare)


#: Every binary operator kql knows, by its (lower-case) spelling.
OPERATORS: dict[str, OperatorSpec] = {
    s.name: s
    for s in (
        _spec("or", SET, 1),
        _spec("and", SET, 2),
        _spec("unless", SET, 2),
        _spec("==", COMPARISON, 3, np.equal, operator.eq),
        _spec("!=", COMPARISON, 3, np.not_equal, operator.ne),
        _spec(">", COMPARISON, 3, np.greater, operator.gt),
        _spec("<", COMPARISON, 3, np.less, operator.lt),
        _spec(">=", COMPARISON, 3, np.greater_equal, operator.ge),
        _spec("<=", COMPARISON, 3, np.less_equal, operator.le),
        _spec("</", TRIM, 3),
        _spec(">/", TRIM, 3),
        _spec("+", ARITHMETIC, 4, np.add),
        _spec("-", ARITHMETIC, 4, np.subtract),
        _spec("*", ARITHMETIC, 5, np.multiply),
        _spec("/", ARITHMETIC, 5, np.true_divide),
        _spec("%", ARITHMETIC, 5, np.fmod),
        _spec("atan2", ARITHMETIC, 5, np.arctan2),
        _spec("^", ARITHMETIC, 7, np.power, right_assoc=True),
    )
}


def names_of_kind(kind: str) -> frozenset[str]:
    """The operators of one kind (``COMPARISON``, ``TRIM``, ``SET`` or ``ARITHMETIC``)."""
    return frozenset(name for name, spec in OPERATORS.items() if spec.kind == kind)
