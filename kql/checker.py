"""The type-checking pass: value types of every node, argument types of every call.

Errors name the function or operator and the argument at fault, and point at it:
``1:6: type error: expected type range vector in call to function "rate" (argument 1), got instant vector``.
"""

from __future__ import annotations

from kernel_insight.kql.aggregators import AGGREGATORS
from kernel_insight.kql.ast import (
    AggregateExpr,
    BinaryExpr,
    Call,
    Expr,
    MatrixSelector,
    Node,
    NumberLiteral,
    ParenExpr,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    ValueType,
    VectorSelector,
)
from kernel_insight.kql.errors import KqlParseError, KqlTypeError
from kernel_insight.kql.functions import FUNCTIONS
from kernel_insight.kql.functions.registry import names_with
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.parser import COMPARISON_OPS, SET_OPS

__all__ = ["check", "value_type"]

S, V, M, STR = ValueType.SCALAR, ValueType.VECTOR, ValueType.MATRIX, ValueType.STRING

#: Functions that accept range selectors with the `anchored` / `smoothed` modifiers.


def value_type(node: Node) -> ValueType:
    """The type an expression evaluates to (the tree must have passed :func:`check`)."""
    if isinstance(node, NumberLiteral):
        return S
    if isinstance(node, StringLiteral):
        return STR
    if isinstance(node, VectorSelector | AggregateExpr):
        return V
    if isinstance(node, MatrixSelector | SubqueryExpr):
        return M
    if isinstance(node, ParenExpr | UnaryExpr):
        return value_type(node.expr)
    if isinstance(node, BinaryExpr):
        return V if V in (value_type(node.lhs), value_type(node.rhs)) else S
    if isinstance(node, Call):
        return FUNCTIONS[node.func].return_type
    raise TypeError(f"not a kql AST node: {node!r}")


class _Checker:
    def __init__(self, query: str) -> None:
        self.query = query

    def fail(self, message: str, node: Node) -> KqlTypeError:
        return KqlTypeError(message, self.query, node.pos.start, node.pos.end)

    def expect(self, node: Node, want: tuple[ValueType, ...], context: str) -> ValueType:
        got = self.visit(node)
        if got not in want:
            names = " or ".join(str(w) for w in want)
            raise self.fail(f"expected type {names} {context}, got {got}", node)
        return got

    def duration(self, node: Node | None, what: str) -> None:
        if node is None:
            return
        got = self.visit(node)
        if got != S:
            raise self.fail(f"{what} must be a number or a duration, got {got}", node)

    def visit(self, node: Node) -> ValueType:
        if isinstance(node, NumberLiteral):
            return S
        if isinstance(node, StringLiteral):
            return STR
        if isinstance(node, VectorSelector):
            if node.name is None and all(m.matches_empty() for m in node.matchers):
                raise KqlParseError(
                    "vector selector must contain at least one non-empty matcher",
                    self.query,
                    node.pos.start,
                    node.pos.end,
                )
            self.duration(node.offset, "offset")
            return V
        if isinstance(node, MatrixSelector):
            self.visit(node.vector)
            self.duration(node.range, "range")
            return M
        if isinstance(node, SubqueryExpr):
            got = self.visit(node.expr)
            if got != V:
                raise self.fail(f"subquery is only allowed on instant vector, got {got}", node.expr)
            self.duration(node.range, "subquery range")
            self.duration(node.step, "subquery step")
            self.duration(node.offset, "offset")
            return M
        if isinstance(node, ParenExpr):
            return self.visit(node.expr)
        if isinstance(node, UnaryExpr):
            got = self.visit(node.expr)
            if got not in (S, V):
                raise self.fail(
                    f"unary expression only allowed on expressions of type scalar or instant vector, got {got}",
                    node,
                )
            return got
        if isinstance(node, BinaryExpr):
            return self.binary(node)
        if isinstance(node, AggregateExpr):
            return self.aggregate(node)
        if isinstance(node, Call):
            return self.call(node)
        raise TypeError(f"not a kql AST node: {node!r}")

    def binary(self, node: BinaryExpr) -> ValueType:
        lt, rt = self.visit(node.lhs), self.visit(node.rhs)
        for side, t in ((node.lhs, lt), (node.rhs, rt)):
            if t not in (S, V):
                raise self.fail(
                    f"binary expression must contain only scalar and instant vector types, "
                    f"got {t} on the {'left' if side is node.lhs else 'right'} of {go_quote(node.op)}",
                    side,
                )
        both_vectors = lt == V and rt == V
        if node.op in COMPARISON_OPS and not node.return_bool and lt == S and rt == S:
            raise self.fail("comparisons between scalars must use BOOL modifier", node)
        if node.op in SET_OPS and not both_vectors:
            raise self.fail(f"set operator {go_quote(node.op)} not allowed in binary scalar expression", node)
        if node.matching is not None and not both_vectors:
            m = node.matching
            if (
                m.matching_given
                or m.card != "one-to-one"
                or m.fill_left is not None
                or m.fill_right is not None
            ):
                raise self.fail("vector matching only allowed between instant vectors", node)
        return V if V in (lt, rt) else S

    def aggregate(self, node: AggregateExpr) -> ValueType:
        self.expect(node.expr, (V,), f"in aggregation {go_quote(node.op)}")
        param = AGGREGATORS[node.op].param
        if param is not None:
            assert node.param is not None
            self.expect(node.param, (param,), f"in aggregation parameter of {go_quote(node.op)}")
        return V

    def call(self, node: Call) -> ValueType:
        spec = FUNCTIONS[node.func]
        n = len(node.args)
        if spec.variadic == 0 and n != spec.min_args:
            raise self.fail(
                f"expected {spec.min_args} argument(s) in call to {go_quote(node.func)}, got {n}", node
            )
        if n < spec.min_args:
            raise self.fail(
                f"expected at least {spec.min_args} argument(s) in call to {go_quote(node.func)}, got {n}",
                node,
            )
        if spec.max_args is not None and n > spec.max_args:
            raise self.fail(
                f"expected at most {spec.max_args} argument(s) in call to {go_quote(node.func)}, got {n}",
                node,
            )
        for i, arg in enumerate(node.args):
            if i in spec.unevaluated:
                # A label filter rather than a value (info's second argument): any selector will do.
                if not isinstance(arg, VectorSelector) or arg.offset is not None or arg.at is not None:
                    raise self.fail(
                        f'expected a label selector such as {{data=~".+"}} in call to function '
                        f"{go_quote(node.func)} (argument {i + 1})",
                        arg,
                    )
                continue
            want = spec.arg_type(i)
            self.expect(arg, (want,), f"in call to function {go_quote(node.func)} (argument {i + 1})")
            if isinstance(arg, MatrixSelector):
                self.range_modifiers(node.func, arg)
        return spec.return_type

    def range_modifiers(self, func: str, arg: MatrixSelector) -> None:
        for modifier, given in (("smoothed", arg.smoothed), ("anchored", arg.anchored)):
            if given and not getattr(FUNCTIONS[func], modifier):
                raise self.fail(
                    f"{modifier} modifier can only be used with: {', '.join(names_with(modifier))} - not with {func}",
                    arg,
                )


def check(expr: Expr, query: str = "") -> ValueType:
    """Type-check a tree; returns its type or raises :class:`KqlTypeError` pointing at the culprit."""
    return _Checker(query).visit(expr)
