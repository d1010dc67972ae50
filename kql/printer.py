"""Print an AST as canonical kql: parsing the output gives back the same tree.

Parentheses are added only where precedence needs them, so an AST that came from the
parser (which keeps the user's parentheses as ParenExpr) prints without extra ones.

>>> from kernel_insight.kql import parse
>>> format_expr(parse('SUM(rate(x{a="b"}[5m]))BY(gpu)>200ms'))
'sum by (gpu) (rate(x{a="b"}[5m])) > 200ms'
"""

from __future__ import annotations

import math

from kernel_insight.kql.ast import (
    AggregateExpr,
    At,
    BinaryExpr,
    Call,
    MatrixSelector,
    Node,
    NumberLiteral,
    ParenExpr,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    VectorMatching,
    VectorSelector,
)
from kernel_insight.kql.gocompat import go_float, go_float_fixed
from kernel_insight.kql.lexical import (
    BYTE_UNITS,
    format_duration,
    go_quote,
    is_legacy_label_name,
    is_valid_metric_name,
)
from kernel_insight.kql.operators import OPERATORS
from kernel_insight.kql.storage import Matcher

__all__ = ["format_expr", "format_labels", "format_matcher"]

# Binding strength (higher binds tighter) of what is not a binary operator: unary minus sits
# between `*` and `^` (OPERATORS holds the binary operators').
_UNARY = 6
_ATOM = 8


def _precedence(node: Node) -> int:
    if isinstance(node, BinaryExpr):
        return OPERATORS[node.op].precedence
    if isinstance(node, UnaryExpr):
        return _UNARY
    if isinstance(node, NumberLiteral) and _is_negative(node):
        return _UNARY
    return _ATOM


def _is_negative(node: NumberLiteral) -> bool:
    """Whether the number prints with a sign (``-1``, ``-0``, and ``+Inf``), which binds like unary minus."""
    return node.value < 0 or str(node.value).startswith("-") or node.value == math.inf


def _label(name: str) -> str:
    return name if is_legacy_label_name(name) else go_quote(name)


def format_labels(names: tuple[str, ...]) -> str:
    """``(a, b)`` as written after by/without/on/ignoring/group_left."""
    return "(" + ", ".join(_label(n) for n in names) + ")"


def format_matcher(m: Matcher) -> str:
    return f"{_label(m.name)}{m.op}{go_quote(m.value)}"


def _number(node: NumberLiteral) -> str:
    if node.unit in BYTE_UNITS:
        size = node.value / BYTE_UNITS[node.unit]
        text = go_float_fixed(abs(size))
        if "n" not in text.lower() and abs(size) * BYTE_UNITS[node.unit] == abs(node.value):
            return ("-" if node.value < 0 else "") + text + node.unit
    if node.duration and math.isfinite(node.value) and abs(node.value) < 2**52:
        ms = round(node.value * 1000)
        if ms / 1000 == node.value:  # exactly what the parser makes of the duration text
            return format_duration(ms)
    # Prometheus 3's NumberLiteral.String: strconv.FormatFloat(v, 'f', -1, 64), never an exponent.
    return go_float_fixed(node.value)


def _at(at: At | None) -> str:
    if at is None:
        return ""
    if at.kind != "time":
        return f" @ {at.kind}()"
    # Prometheus' printer: FormatFloat(float64(ms)/1000, 'f', 3, 64), so `@ 10` prints `@ 10.000`.
    return f" @ {go_float_fixed(float(at.ms) / 1000.0, 3)}"


def _offset(offset: Node | None) -> str:
    if offset is None:
        return ""
    return f" offset {_offset_value(offset)}"


def _offset_value(node: Node) -> str:
    # After `offset` only an atom may follow: a number, a call, a parenthesis, or a signed atom.
    if isinstance(node, NumberLiteral | Call | ParenExpr):
        return format_expr(node)
    if isinstance(node, UnaryExpr) and isinstance(node.expr, Call | ParenExpr | UnaryExpr):
        return node.op + _offset_value(node.expr)
    return f"({format_expr(node)})"


def _selector(node: VectorSelector) -> str:
    items = [format_matcher(m) for m in node.matchers]
    name = node.name or ""
    if name and not is_valid_metric_name(name):
        items.insert(0, go_quote(name))
        name = ""
    braces = "{" + ", ".join(items) + "}" if items or not name else ""
    return name + braces


def _matching(op: str, return_bool: bool, matching: VectorMatching | None, rhs_paren: bool = False) -> str:
    parts = [op]
    if return_bool:
        parts.append("bool")
    if matching is not None:
        if matching.matching_given:
            parts.append(("on" if matching.on else "ignoring") + format_labels(matching.labels))
        if matching.card in ("many-to-one", "one-to-many"):
            group = "group_left" if matching.card == "many-to-one" else "group_right"
            # `group_left (x)` would read the parenthesis as the label list, so spell out `()`.
            bare = not matching.include and not rhs_paren
            parts.append(group + ("" if bare else format_labels(matching.include)))
        left, right = matching.fill_left, matching.fill_right
        # Prometheus' printer writes fill values with %v (go_float): `fill(1e+06)`.
        if left is not None and right is not None and go_float(left) == go_float(right):
            parts.append(f"fill({go_float(left)})")
        else:
            if left is not None:
                parts.append(f"fill_left({go_float(left)})")
            if right is not None:
                parts.append(f"fill_right({go_float(right)})")
    return " ".join(parts)


def _operand(child: Node, parent_prec: int, right: bool, right_assoc: bool) -> str:
    prec = _precedence(child)
    text = format_expr(child)
    if right and right_assoc and prec == _UNARY:
        return text  # `2 ^ -1`: the operand of `^` may carry a sign
    if prec < parent_prec or (prec == parent_prec and right != right_assoc):
        return f"({text})"
    return text


def _postfix_operand(node: Node) -> str:
    text = format_expr(node)
    if _precedence(node) < _ATOM:
        return f"({text})"
    return text


def format_expr(node: Node) -> str:
    """The canonical text of an expression."""
    if isinstance(node, NumberLiteral):
        return _number(node)
    if isinstance(node, StringLiteral):
        return go_quote(node.value)
    if isinstance(node, VectorSelector):
        return _selector(node) + _at(node.at) + _offset(node.offset) + (" smoothed" if node.smoothed else "")
    if isinstance(node, MatrixSelector):
        vec = node.vector
        modifier = " anchored" if node.anchored else " smoothed" if node.smoothed else ""
        return f"{_selector(vec)}[{format_expr(node.range)}]{modifier}{_at(vec.at)}{_offset(vec.offset)}"
    if isinstance(node, SubqueryExpr):
        step = format_expr(node.step) if node.step is not None else ""
        inner = _postfix_operand(node.expr)
        return f"{inner}[{format_expr(node.range)}:{step}]{_at(node.at)}{_offset(node.offset)}"
    if isinstance(node, ParenExpr):
        return f"({format_expr(node.expr)})"
    if isinstance(node, UnaryExpr):
        inner = format_expr(node.expr)
        if _precedence(node.expr) < _UNARY or isinstance(node.expr, NumberLiteral):
            inner = f"({inner})"
        return node.op + inner
    if isinstance(node, BinaryExpr):
        spec = OPERATORS[node.op]
        prec, right_assoc = spec.precedence, spec.right_assoc
        lhs = _operand(node.lhs, prec, right=False, right_assoc=right_assoc)
        rhs = _operand(node.rhs, prec, right=True, right_assoc=right_assoc)
        modifiers = _matching(node.op, node.return_bool, node.matching, rhs.startswith("("))
        return f"{lhs} {modifiers} {rhs}"
    if isinstance(node, AggregateExpr):
        grouping = ""
        if node.without:
            grouping = f" without {format_labels(node.grouping)}"
        elif node.grouping:
            grouping = f" by {format_labels(node.grouping)}"
        args = [format_expr(node.param)] if node.param is not None else []
        args.append(format_expr(node.expr))
        return f"{node.op}{grouping}{' ' if grouping else ''}({', '.join(args)})"
    if isinstance(node, Call):
        return f"{node.func}({', '.join(format_expr(a) for a in node.args)})"
    raise TypeError(f"not a kql AST node: {node!r}")
