"""Parser: query text -> AST, and positioned errors, one table row per behaviour."""

from __future__ import annotations

import math

import pytest

from kernel_insight.kql import KqlParseError, KqlTypeError, parse
from kernel_insight.kql.ast import (
    AggregateExpr,
    At,
    BinaryExpr,
    Call,
    MatrixSelector,
    NumberLiteral,
    ParenExpr,
    PosRange,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    VectorMatching,
    VectorSelector,
)
from kernel_insight.kql.parser import parse_raw
from kernel_insight.kql.storage import Matcher


def vs(name: str | None, *matchers: tuple[str, str, str], **kw: object) -> VectorSelector:
    return VectorSelector(name, tuple(Matcher(*m) for m in matchers), **kw)  # type: ignore[arg-type]


def num(value: float, duration: bool = False) -> NumberLiteral:
    return NumberLiteral(value, duration=duration)


def dur(seconds: float) -> NumberLiteral:
    return NumberLiteral(seconds, duration=True)


def bin_(op: str, lhs, rhs, **kw) -> BinaryExpr:
    return BinaryExpr(op, lhs, rhs, **kw)


PARSES = [
    # literals
    ("1", num(1)),
    (".5", num(0.5)),
    ("2.", num(2)),
    ("1e3", num(1000)),
    ("0x1F", num(31)),
    ("-1", num(-1)),
    ("+Inf", num(math.inf)),
    ("-inf", num(-math.inf)),
    ("NaN", num(math.nan)),
    ("5m", dur(300)),
    ("1h30m", dur(5400)),
    ("200ms", dur(0.2)),
    ('"a\\tb"', StringLiteral("a\tb")),
    ("'single'", StringLiteral("single")),
    ("`raw\\n`", StringLiteral("raw\\n")),
    # selectors
    ("up", vs("up")),
    ("job:rate5m:sum", vs("job:rate5m:sum")),
    ('up{job="a"}', vs("up", ("job", "=", "a"))),
    (
        'up{job!="a",gpu=~"[01]",model!~"llama.*",}',
        vs("up", ("job", "!=", "a"), ("gpu", "=~", "[01]"), ("model", "!~", "llama.*")),
    ),
    ('{__name__=~"gpu_.+"}', vs(None, ("__name__", "=~", "gpu_.+"))),
    ('{"gpu.util", "k8s.pod"="x"}', vs("gpu.util", ("k8s.pod", "=", "x"))),
    ('{on="x", by="y", group="z"}', vs(None, ("on", "=", "x"), ("by", "=", "y"), ("group", "=", "z"))),
    ("summary_total", vs("summary_total")),
    ("info_metric", vs("info_metric")),
    # modifiers
    ("up offset 5m", vs("up", offset=dur(300))),
    ("up offset -5m", vs("up", offset=dur(-300))),
    ("up @ 100", vs("up", at=At("time", 100_000))),
    ("up @ start()", vs("up", at=At("start"))),
    ("up @ end() offset 1m", vs("up", at=At("end"), offset=dur(60))),
    ("up[5m]", MatrixSelector(vs("up"), dur(300))),
    ("up[300]", MatrixSelector(vs("up"), num(300))),
    ("up[5m] offset 1m @ 10", MatrixSelector(vs("up", offset=dur(60), at=At("time", 10_000)), dur(300))),
    ("up[5m] anchored", MatrixSelector(vs("up"), dur(300), anchored=True)),
    ("up[5m] smoothed", MatrixSelector(vs("up"), dur(300), smoothed=True)),
    ("up smoothed", vs("up", smoothed=True)),
    ("up[1h:5m]", SubqueryExpr(vs("up"), dur(3600), dur(300))),
    ("up[1h:]", SubqueryExpr(vs("up"), dur(3600), None)),
    (
        "rate(up[5m])[1h:] offset 1m",
        SubqueryExpr(Call("rate", (MatrixSelector(vs("up"), dur(300)),)), dur(3600), offset=dur(60)),
    ),
    # duration expressions
    ("up[26m+4m]", MatrixSelector(vs("up"), bin_("+", dur(1560), dur(240)))),
    ("up[step()]", MatrixSelector(vs("up"), Call("step"))),
    ("up[STEP()*2]", MatrixSelector(vs("up"), bin_("*", Call("step"), num(2)))),
    ("up offset min_of(step(), 1s)", vs("up", offset=Call("min_of", (Call("step"), dur(1))))),
    # offset binds tighter than every operator: (up offset 2) ^ 2
    ("up offset 2 ^ 2", bin_("^", vs("up", offset=num(2)), num(2))),
    ("up offset (2 ^ 2)", vs("up", offset=ParenExpr(bin_("^", num(2), num(2))))),
    # precedence and associativity
    ("1 + 2 * 3", bin_("+", num(1), bin_("*", num(2), num(3)))),
    ("1 - 2 - 3", bin_("-", bin_("-", num(1), num(2)), num(3))),
    ("2 ^ 3 ^ 2", bin_("^", num(2), bin_("^", num(3), num(2)))),
    ("-2 ^ 2", UnaryExpr("-", bin_("^", num(2), num(2)))),
    ("2 ^ -1 * 3", bin_("*", bin_("^", num(2), num(-1)), num(3))),
    ("-up * 2", bin_("*", UnaryExpr("-", vs("up")), num(2))),
    ("a or b and c", bin_("or", vs("a"), bin_("and", vs("b"), vs("c")))),
    ("a unless b == c", bin_("unless", vs("a"), bin_("==", vs("b"), vs("c")))),
    ("a > b + c", bin_(">", vs("a"), bin_("+", vs("b"), vs("c")))),
    ("a atan2 b * c", bin_("*", bin_("atan2", vs("a"), vs("b")), vs("c"))),
    ("(1 + 2) * 3", bin_("*", ParenExpr(bin_("+", num(1), num(2))), num(3))),
    # binary modifiers
    ("a == bool b", bin_("==", vs("a"), vs("b"), return_bool=True)),
    (
        "a / on(gpu) b",
        bin_("/", vs("a"), vs("b"), matching=VectorMatching(on=True, labels=("gpu",), matching_given=True)),
    ),
    (
        "a * ignoring(pid) group_left(model) b",
        bin_(
            "*", vs("a"), vs("b"), matching=VectorMatching("many-to-one", False, ("pid",), ("model",), True)
        ),
    ),
    (
        "a - on() group_right b",
        bin_("-", vs("a"), vs("b"), matching=VectorMatching("one-to-many", True, (), (), True)),
    ),
    (
        "a AND ON(x) b",
        bin_("and", vs("a"), vs("b"), matching=VectorMatching("many-to-many", True, ("x",), (), True)),
    ),
    ("a + fill(0) b", bin_("+", vs("a"), vs("b"), matching=VectorMatching(fill_left=0.0, fill_right=0.0))),
    (
        "a + fill_left(1) fill_right(NaN) b",
        bin_("+", vs("a"), vs("b"), matching=VectorMatching(fill_left=1.0, fill_right=math.nan)),
    ),
    (
        "fill + fill(0) fill",
        bin_("+", vs("fill"), vs("fill"), matching=VectorMatching(fill_left=0.0, fill_right=0.0)),
    ),
    # aggregations
    ("sum(up)", AggregateExpr("sum", vs("up"))),
    ("SUM BY (gpu) (up)", AggregateExpr("sum", vs("up"), grouping=("gpu",))),
    ("sum(up) by (gpu, model,)", AggregateExpr("sum", vs("up"), grouping=("gpu", "model"))),
    ("avg without (pid) (up)", AggregateExpr("avg", vs("up"), grouping=("pid",), without=True)),
    ("topk(3, up)", AggregateExpr("topk", vs("up"), param=num(3))),
    ('count_values("v", up)', AggregateExpr("count_values", vs("up"), param=StringLiteral("v"))),
    ("quantile by (le) (0.9, up)", AggregateExpr("quantile", vs("up"), param=num(0.9), grouping=("le",))),
    ("sum by (group, on) (up)", AggregateExpr("sum", vs("up"), grouping=("group", "on"))),
    # calls
    ("time()", Call("time")),
    ("rate(up[5m])", Call("rate", (MatrixSelector(vs("up"), dur(300)),))),
    (
        'label_join(up, "d", ",", "a", "b",)',
        Call(
            "label_join",
            (vs("up"), StringLiteral("d"), StringLiteral(","), StringLiteral("a"), StringLiteral("b")),
        ),
    ),
    ("rate(up[5m]) > 200ms", bin_(">", Call("rate", (MatrixSelector(vs("up"), dur(300)),)), dur(0.2))),
    ("up > 40GiB", bin_(">", vs("up"), NumberLiteral(40 * 2**30, unit="GiB"))),
    ("1 # a comment\n+ 2", bin_("+", num(1), num(2))),
]


@pytest.mark.parametrize(("query", "expected"), PARSES, ids=[q for q, _ in PARSES])
def test_parses_to_ast(query: str, expected: object) -> None:
    assert parse_raw(query) == expected


ERRORS = [
    # (query, message fragment, line, column)
    ("sum(rate(x[5m])", "unexpected end of input", 1, 16),
    ("up{job=}", 'unexpected "}", expected string', 1, 8),
    ("up{job", "unexpected end of input", 1, 7),
    ("up +", "unexpected end of input", 1, 5),
    ("1 $ 2", 'unexpected character: "$"', 1, 3),
    ("up\n  + )", 'unexpected ")"', 2, 5),
    ("foo(up)", 'unknown function with name "foo"', 1, 1),
    ("{}", "vector selector must contain at least one non-empty matcher", 1, 1),
    ('{job=~".*"}', "vector selector must contain at least one non-empty matcher", 1, 1),
    ('up{job=~"("}', "invalid regular expression", 1, 9),
    ("rate(up)[5m]", "ranges only allowed for vector selectors", 1, 1),
    ("up offset 1m[5m]", "no offset, @ or smoothed modifiers allowed before range", 1, 1),
    ("sum(up) offset 5m", "offset modifier must be preceded by", 1, 9),
    ("up offset 1m offset 2m", "offset may not be set multiple times", 1, 14),
    ("up @ 1 @ 2", "@ <timestamp> may not be set multiple times", 1, 1),
    ("up @ now()", "expected start() or end()", 1, 6),
    ("a + bool b", "bool modifier can only be used on comparison operators", 1, 5),
    ("a and on(x) group_left b", 'no grouping allowed for "and" operation', 1, 13),
    ("a * on(x) group_left(x) b", 'label "x" must not occur in ON and GROUP clause at once', 1, 11),
    ("topk(up)", "wrong number of arguments for aggregate expression provided, expected 2, got 1", 1, 1),
    ("up[1m5h]", "not a valid duration string", 1, 4),
    ('up{a="\\q"}', "unknown escape sequence", 1, 6),
    ("up[foo()]", 'unknown function "foo" in duration expression', 1, 4),
    ("", "no expression found in input", 1, 1),
]


@pytest.mark.parametrize(
    ("query", "fragment", "line", "column"), ERRORS, ids=[e[0] or "<empty>" for e in ERRORS]
)
def test_parse_error_has_position(query: str, fragment: str, line: int, column: int) -> None:
    with pytest.raises(KqlParseError) as info:
        parse(query)
    err = info.value
    assert fragment in err.message
    assert (err.line, err.column) == (line, column)
    assert str(err).startswith(f"{line}:{column}: parse error: ")


def test_parse_error_shows_the_query_with_a_caret_under_the_problem() -> None:
    with pytest.raises(KqlParseError) as info:
        parse('sum by (gpu) (rate(kernel_launches_total{gpu="0"}[5m])')
    lines = str(info.value).split("\n")
    assert lines[1] == '  sum by (gpu) (rate(kernel_launches_total{gpu="0"}[5m])'
    assert lines[2] == "  " + " " * len('sum by (gpu) (rate(kernel_launches_total{gpu="0"}[5m])') + "^"


def test_parse_error_on_a_later_line_shows_that_line() -> None:
    with pytest.raises(KqlParseError) as info:
        parse("sum(\n  rate(up[5m]) +\n  ]")
    err = info.value
    assert (err.line, err.column) == (3, 3)
    assert str(err).split("\n")[1:] == ["    ]", "    ^"]


def test_lark_exceptions_never_escape() -> None:
    for query in ["(", ")", "up{", "up[", "sum by", "a ==", "@", "up @", "1 +* 2", "up[5m:1m:1m]"]:
        with pytest.raises(KqlParseError):
            parse(query)


TYPE_ERRORS = [
    (
        "rate(up)",
        'expected type range vector in call to function "rate" (argument 1), got instant vector',
        1,
        6,
    ),
    (
        "abs(up[5m])",
        'expected type instant vector in call to function "abs" (argument 1), got range vector',
        1,
        5,
    ),
    (
        'histogram_quantile("x", up)',
        'expected type scalar in call to function "histogram_quantile" (argument 1), got string',
        1,
        20,
    ),
    ("round(up, 1, 2)", 'expected at most 2 argument(s) in call to "round", got 3', 1, 1),
    ("clamp(up)", 'expected 3 argument(s) in call to "clamp", got 1', 1, 1),
    ("label_join(up)", 'expected at least 3 argument(s) in call to "label_join", got 1', 1, 1),
    ("sum(up[5m])", 'expected type instant vector in aggregation "sum", got range vector', 1, 5),
    ('topk("3", up)', 'expected type scalar in aggregation parameter of "topk", got string', 1, 6),
    (
        "count_values(1, up)",
        'expected type string in aggregation parameter of "count_values", got scalar',
        1,
        14,
    ),
    (
        "up[5m] + 1",
        'binary expression must contain only scalar and instant vector types, got range vector on the left of "+"',
        1,
        1,
    ),
    ("1 > 2", "comparisons between scalars must use BOOL modifier", 1, 1),
    ("1 and up", 'set operator "and" not allowed in binary scalar expression', 1, 1),
    ("1 + on(x) up", "vector matching only allowed between instant vectors", 1, 1),
    (
        "-up[5m]",
        "unary expression only allowed on expressions of type scalar or instant vector, got range vector",
        1,
        1,
    ),
    ("up[5m][10m:]", "subquery is only allowed on instant vector, got range vector", 1, 1),
    (
        "deriv(up[5m] smoothed)",
        "smoothed modifier can only be used with: delta, increase, rate - not with deriv",
        1,
        7,
    ),
    (
        "max_over_time(up[5m] anchored)",
        "anchored modifier can only be used with: changes, delta, increase, rate, resets - not with max_over_time",
        1,
        15,
    ),
]


@pytest.mark.parametrize(("query", "message", "line", "column"), TYPE_ERRORS, ids=[e[0] for e in TYPE_ERRORS])
def test_type_error_names_the_culprit(query: str, message: str, line: int, column: int) -> None:
    with pytest.raises(KqlTypeError) as info:
        parse(query)
    assert info.value.message == message
    assert (info.value.line, info.value.column) == (line, column)
    assert "type error" in str(info.value)


def test_nodes_carry_their_position() -> None:
    expr = parse('sum(rate(up{gpu="0"}[5m])) by (gpu) > 1')
    assert isinstance(expr, BinaryExpr)
    assert expr.pos == PosRange(0, 39)
    agg = expr.lhs
    assert isinstance(agg, AggregateExpr)
    assert agg.pos == PosRange(0, 35)
    call = agg.expr
    assert isinstance(call, Call)
    assert call.pos == PosRange(4, 25)
    matrix = call.args[0]
    assert isinstance(matrix, MatrixSelector)
    assert (matrix.pos, matrix.vector.pos) == (PosRange(9, 24), PosRange(9, 20))


def test_equality_ignores_positions_and_spacing() -> None:
    assert parse("sum(up)by(gpu)") == parse("sum by (gpu) (\n  up\n)")


def test_keywords_are_case_insensitive_but_function_names_are_not() -> None:
    assert parse("SUM(up) BY (gpu) AND ON (gpu) up OFFSET 5m") == parse(
        "sum by (gpu) (up) and on(gpu) up offset 5m"
    )
    with pytest.raises(KqlParseError, match="unknown function"):
        parse("RATE(up[5m])")
