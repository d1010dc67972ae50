"""The one aggregator registry: a decorator above each implementation records its name and parameter.

The grammar's ``AGG_OP`` token, the parser's argument count, the type checker's parameter type
and the engine's dispatch all read :data:`AGGREGATORS`, as :mod:`kernel_insight.kql.functions`
does for functions; adding an aggregation is one decorated implementation in
:mod:`kernel_insight.kql.aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel_insight.kql.ast import RESULT_UNITS, AggregateExpr, ValueType

__all__ = ["AGGREGATORS", "HISTOGRAM_AGGREGATION", "AggImpl", "AggregatorSpec", "aggregator"]

#: An implementation receives the evaluator, the node, the evaluated vector and the evaluated
#: parameter (None without one) and returns a StepVector.
AggImpl = Callable[[Any, AggregateExpr, Any, Any], Any]


@dataclass(frozen=True, slots=True)
class AggregatorSpec:
    """An aggregation operator: ``param`` is the type of the argument before the vector, None without one."""

    name: str
    param: ValueType | None
    impl: AggImpl = field(compare=False, repr=False)
    doc: str = ""
    #: What it does with native-histogram samples (one of HISTOGRAM_AGGREGATION): "sum" and
    #: "mean" add them (Prometheus' KahanAdd; "mean" divides, incrementally past an overflow),
    #: "presence" counts a histogram as a sample, "ignored" leaves them out with the info
    #: ``ignored histogram in <op> aggregation`` at the argument ("ignored_whole": at the whole
    #: aggregation, as topk/bottomk place it), "" hands them to the implementation as they are.
    histograms: str = ""
    #: The unit of its result, one of RESULT_UNITS ("" the argument's).
    result_unit: str = ""


#: Every aggregation kql knows, by (lower-case) name; filled when kql.aggregation is imported.
AGGREGATORS: dict[str, AggregatorSpec] = {}
#: The values of ``AggregatorSpec.histograms``.
HISTOGRAM_AGGREGATION = ("", "sum", "mean", "presence", "ignored", "ignored_whole")


def aggregator(
    name: str, param: ValueType | None = None, *, histograms: str = "", result_unit: str = ""
) -> Callable[[AggImpl], AggImpl]:
    """Register the decorated implementation as the aggregation ``name``; the docstring becomes its doc."""

    def register(impl: AggImpl) -> AggImpl:
        if name in AGGREGATORS:
            raise ValueError(f"aggregator {name!r} registered twice")
        if not name.isidentifier() or name != name.lower():
            raise ValueError(f"aggregator name {name!r} must be a lower-case identifier")
        if histograms not in HISTOGRAM_AGGREGATION:
            raise ValueError(f"aggregator {name!r}: unknown histogram behaviour {histograms!r}")
        if result_unit not in RESULT_UNITS:
            raise ValueError(f"aggregator {name!r}: unknown result unit {result_unit!r}")
        doc = (impl.__doc__ or "").strip().split("\n")[0]
        AGGREGATORS[name] = AggregatorSpec(name, param, impl, doc, histograms, result_unit)
        return impl

    return register
