"""Helpers shared by the function modules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.ast import Node, ParenExpr, ValueType
from kernel_insight.kql.storage import Labels, Matcher
from kernel_insight.kql.values import RangeInput, StepVector

__all__ = ["F64", "STR", "M", "S", "V", "map_values", "range_result", "unwrap"]

S, V, M, STR = ValueType.SCALAR, ValueType.VECTOR, ValueType.MATRIX, ValueType.STRING
F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]


def map_values(vec: StepVector, fn: Callable[[F64], F64], keep_name: bool = False) -> StepVector:
    """Apply ``fn`` to every value; the metric name is dropped unless ``keep_name``."""
    drop = vec.drop_name if keep_name else np.ones(len(vec), dtype=bool)
    return StepVector(vec.labels, np.asarray(fn(vec.values), dtype=np.float64), vec.present, drop)


def range_result(r: RangeInput, values: F64, present: BOOL, keep_name: bool = False) -> StepVector:
    """A step vector from per-(series, step) results of a range function."""
    drop = r.drop_name if keep_name else np.ones(len(r), dtype=bool)
    out = StepVector(list(r.labels), np.where(present, values, 0.0), present, drop.copy())
    return out.compact()


def unwrap(node: Node) -> Node:
    while isinstance(node, ParenExpr):
        node = node.expr
    return node


def labels_from_equal_matchers(matchers: tuple[Matcher, ...]) -> Labels:
    """The labels ``absent()`` reports, as Prometheus derives them from the selector's matchers.

    An equality matcher sets its label; any other matcher on the same label (or a second
    equality) removes it again, so ``x{job="a", job="b"}`` reports no ``job``.
    """
    out: dict[str, str] = {}
    has: set[str] = set()
    for m in matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and m.name not in has:
            if m.value:
                out[m.name] = m.value
            has.add(m.name)
        else:
            out.pop(m.name, None)
    return tuple(sorted(out.items()))
