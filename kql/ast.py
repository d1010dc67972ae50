"""The kql abstract syntax tree: frozen node classes named as in PromQL, each with its position.

Nodes compare by value and ignore positions, so ``parse("a + b") == parse("a+b")``; NaN
literals compare equal to each other, which keeps round-trip tests exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from kernel_insight.kql.storage import Matcher

__all__ = [
    "RESULT_UNITS",
    "AggregateExpr",
    "At",
    "BinaryExpr",
    "Call",
    "Expr",
    "MatrixSelector",
    "Node",
    "NumberLiteral",
    "ParenExpr",
    "PosRange",
    "StringLiteral",
    "SubqueryExpr",
    "UnaryExpr",
    "ValueType",
    "VectorMatching",
    "VectorSelector",
    "children",
    "walk",
]


class ValueType(StrEnum):
    """The four PromQL value types (plus ``none`` for an empty argument slot)."""

    SCALAR = "scalar"
    VECTOR = "instant vector"
    MATRIX = "range vector"
    STRING = "string"

    def __str__(self) -> str:
        return str(self.value)


#: What a function's or aggregator's result is measured in (``FunctionSpec.result_unit``,
#: ``AggregatorSpec.result_unit``): "" its argument's unit, "unitless" a plain number (a count, a
#: time, a 0/1 presence), "per_second" the argument's unit per second, "bucket_unit" the unit of
#: the histogram's buckets (a quantile, a mean), "ratio" a fraction of 1.
RESULT_UNITS = ("", "unitless", "per_second", "bucket_unit", "ratio")


@dataclass(frozen=True, slots=True)
class PosRange:
    """Character offsets ``[start, end)`` of a node in the query text."""

    start: int
    end: int

    def line_col(self, query: str) -> tuple[int, int]:
        """1-based line and column of ``start`` in ``query``."""
        before = query[: self.start]
        line = before.count("\n") + 1
        return line, self.start - (before.rfind("\n") + 1) + 1


_NOPOS = PosRange(0, 0)


def _key(value: object) -> object:
    # Numbers compare as floats and every NaN equals every NaN (a query cannot tell them apart).
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ("nan",)
        return ("f", value)
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    return value


class Node:
    """Base of every AST node: value equality without positions, a ``pos`` on each."""

    __slots__ = ()
    pos: PosRange

    def _compare_key(self) -> tuple[Any, ...]:
        return tuple(_key(getattr(self, f.name)) for f in fields(self) if f.compare)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Node)
        return self._compare_key() == other._compare_key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._compare_key()))

    def __str__(self) -> str:
        from kernel_insight.kql.printer import format_expr  # local: the printer imports the AST

        return format_expr(self)


@dataclass(frozen=True, slots=True, eq=False)
class At:
    """An ``@`` modifier: a fixed time in ms, or the query's ``start()`` / ``end()``."""

    kind: str  # "time" | "start" | "end"
    ms: int = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, At) and (self.kind, self.ms) == (other.kind, other.ms)

    def __hash__(self) -> int:
        return hash((self.kind, self.ms))


@dataclass(frozen=True, slots=True, eq=False)
class VectorMatching:
    """How a binary operation between two vectors pairs their series.

    ``card`` is ``one-to-one``, ``many-to-one`` (group_left), ``one-to-many`` (group_right) or
    ``many-to-many`` (set operators). ``on`` says whether ``labels`` lists the labels to match on
    (``on(...)``) or to ignore (``ignoring(...)``); ``matching_given`` records that one of them was
    written. ``include`` holds the extra labels of ``group_left(...)``/``group_right(...)``.
    """

    card: str = "one-to-one"
    on: bool = False
    labels: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    matching_given: bool = False
    fill_left: float | None = None
    fill_right: float | None = None

    def _compare_key(self) -> tuple[Any, ...]:
        return tuple(_key(getattr(self, f.name)) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VectorMatching) and self._compare_key() == other._compare_key()

    def __hash__(self) -> int:
        return hash(self._compare_key())


@dataclass(frozen=True, slots=True, eq=False)
class NumberLiteral(Node):
    """A number; ``duration`` marks one written as a duration (``5m`` is 300 seconds), ``unit`` one
    written as a byte size (``40GiB`` is 42949672960 with unit ``GiB``), so printing keeps the spelling.
    """

    value: float
    duration: bool = False
    unit: str = ""
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class StringLiteral(Node):
    value: str
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class VectorSelector(Node):
    """``name{matchers} offset d @ t``; ``matchers`` excludes the metric name, held in ``name``."""

    name: str | None
    matchers: tuple[Matcher, ...] = ()
    offset: Expr | None = None  # a duration expression, seconds
    at: At | None = None
    smoothed: bool = False  # interpolate between the samples around each step
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)

    def all_matchers(self) -> tuple[Matcher, ...]:
        """The matchers storage sees: the name as ``__name__="..."`` first, then the rest."""
        if self.name is None:
            return self.matchers
        return (Matcher("__name__", "=", self.name), *self.matchers)


@dataclass(frozen=True, slots=True, eq=False)
class MatrixSelector(Node):
    """``vector[range]``; offset and @ live on the inner selector, as in Prometheus."""

    vector: VectorSelector
    range: Expr  # a duration expression, seconds
    anchored: bool = False
    smoothed: bool = False
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class SubqueryExpr(Node):
    """``expr[range:step] offset d @ t``; ``step`` None means the default resolution."""

    expr: Expr
    range: Expr
    step: Expr | None = None
    offset: Expr | None = None
    at: At | None = None
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class BinaryExpr(Node):
    op: str  # lower-case: + - * / % ^ atan2 == != > < >= <= and or unless
    lhs: Expr
    rhs: Expr
    return_bool: bool = False
    matching: VectorMatching | None = None
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class UnaryExpr(Node):
    op: str  # "-" or "+"
    expr: Expr
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class ParenExpr(Node):
    expr: Expr
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class AggregateExpr(Node):
    """``op by|without (grouping) ([param,] expr)``."""

    op: str  # lower-case aggregation name
    expr: Expr
    param: Expr | None = None
    grouping: tuple[str, ...] = ()
    without: bool = False
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class Call(Node):
    func: str
    args: tuple[Expr, ...] = ()
    pos: PosRange = field(default=_NOPOS, compare=False, repr=False)


Expr = (
    NumberLiteral
    | StringLiteral
    | VectorSelector
    | MatrixSelector
    | SubqueryExpr
    | BinaryExpr
    | UnaryExpr
    | ParenExpr
    | AggregateExpr
    | Call
)


def children(node: Node) -> Iterator[Node]:
    """The direct sub-expressions of a node, in source order (duration expressions included)."""
    if isinstance(node, VectorSelector):
        if node.offset is not None:
            yield node.offset
    elif isinstance(node, MatrixSelector):
        yield node.vector
        yield node.range
    elif isinstance(node, SubqueryExpr):
        yield node.expr
        yield node.range
        if node.step is not None:
            yield node.step
        if node.offset is not None:
            yield node.offset
    elif isinstance(node, BinaryExpr):
        yield node.lhs
        yield node.rhs
    elif isinstance(node, UnaryExpr | ParenExpr):
        yield node.expr
    elif isinstance(node, AggregateExpr):
        if node.param is not None:
            yield node.param
        yield node.expr
    elif isinstance(node, Call):
        yield from node.args


def walk(node: Node) -> Iterator[Node]:
    """Every node of a tree, depth first, parents before children."""
    yield node
    for child in children(node):
        yield from walk(child)
