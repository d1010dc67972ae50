"""Parse kql text into the AST of :mod:`kernel_insight.kql.ast` (lark, LALR, built once).

>>> from kernel_insight.kql import parse
>>> parse('sum by (gpu) (rate(kernel_launches_total[5m]))').op
'sum'
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import re
from importlib import resources
from typing import Any, TypeVar

import lark
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta

import kernel_insight.kql.aggregation  # noqa: F401  (importing registers the aggregators)
from kernel_insight.kql.aggregators import AGGREGATORS
from kernel_insight.kql.ast import (
    AggregateExpr,
    At,
    BinaryExpr,
    Call,
    Expr,
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
from kernel_insight.kql.errors import KqlParseError
from kernel_insight.kql.lexical import (
    go_quote,
    is_valid_label_name,
    parse_bytes,
    parse_duration,
    parse_number,
    unquote,
)
from kernel_insight.kql.operators import COMPARISON, SET, TRIM, names_of_kind
from kernel_insight.kql.storage import Matcher

__all__ = [
    "MAX_AT_MS",
    "MAX_DEPTH",
    "MAX_QUERY_LENGTH",
    "parse",
    "parse_raw",
    "vocabulary",
]

#: How deeply the parse tree may nest (about 255 terms of ``1+1+...``, 255 parentheses or 127 nested
#: calls). Every pass over the tree (transformer, checker, evaluator, printer) recurses, so a deeper
#: query would exhaust Python's stack; Prometheus has no such limit, and no real query comes near it.
MAX_DEPTH = 256
#: The longest query text parsed, in characters. Parsing costs tens of microseconds a character in
#: Python, so a multi-megabyte query (a POST body may hold 10 MiB) would hold a worker for minutes;
#: 128 Ki characters leave room for a Grafana variable of thousands of alternatives.
MAX_QUERY_LENGTH = 128 * 1024
#: The largest ``@`` time, in milliseconds, either side of the epoch (2^62 ms, about 146 million
#: years): any offset and range subtracted from it still fits the engine's int64 arithmetic.
MAX_AT_MS = 2**62

COMPARISON_OPS = names_of_kind(COMPARISON)
#: Native-histogram trim operators (Prometheus 3): ``h </ x`` keeps the observations below ``x``,
#: ``h >/ x`` those above; like a comparison they keep the metric name, but they take no ``bool``.
TRIM_OPS = names_of_kind(TRIM)
SET_OPS = names_of_kind(SET)

_TOKEN_NAMES = {
    "$END": "end of input",
    "LPAR": '"("',
    "RPAR": '")"',
    "LSQB": '"["',
    "RSQB": '"]"',
    "LBRACE": '"{"',
    "RBRACE": '"}"',
    "COMMA": '","',
    "COLON": '":"',
    "AT": '"@"',
    "IDENTIFIER": "identifier",
    "LABEL_NAME": "label name",
    "STRING": "string",
    "NUMBER": "number",
    "DURATION": "duration",
    "CMP": "comparison operator",
    "TRIM": "trim operator",
    "MATCH_OP": "label matching operator",
    "AGG_OP": "aggregation",
}


# Tokens whose text varies: messages name the kind and quote the text (`unexpected number "3"`).
_KINDS = frozenset(
    {"IDENTIFIER", "LABEL_NAME", "STRING", "NUMBER", "DURATION", "BYTES", "CMP", "TRIM", "MATCH_OP", "AGG_OP"}
)


def _describe(terminal: str) -> str:
    return _TOKEN_NAMES.get(terminal, terminal.lower().replace("_", " "))


def _pos(meta: Meta) -> PosRange:
    if getattr(meta, "empty", True):
        return PosRange(0, 0)
    return PosRange(meta.start_pos, meta.end_pos)


def _tok_pos(tok: Token) -> PosRange:
    start = tok.start_pos or 0
    return PosRange(start, tok.end_pos if tok.end_pos is not None else start + len(tok))


class _Error(Exception):
    """Raised inside the transformer; turned into a KqlParseError with the query attached."""

    def __init__(self, message: str, pos: PosRange) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


def _duration_ms(tok: Token) -> int:
    try:
        return parse_duration(str(tok))
    except ValueError as exc:
        raise _Error(str(exc), _tok_pos(tok)) from None


def _unquote(tok: Token) -> str:
    try:
        return unquote(str(tok))
    except ValueError as exc:
        raise _Error(f"invalid string {tok}: {exc}", _tok_pos(tok)) from None


@v_args(meta=True)
class _ToAst(Transformer[Token, Expr]):
    """Builds one AST class per grammar alias."""

    # ---------------------------------------------------------------- literals

    def number(self, meta: Meta, children: list[Token]) -> NumberLiteral:
        return NumberLiteral(parse_number(str(children[0])), pos=_pos(meta))

    def duration(self, meta: Meta, children: list[Token]) -> NumberLiteral:
        return NumberLiteral(_duration_ms(children[0]) / 1000, duration=True, pos=_pos(meta))

    def bytes(self, meta: Meta, children: list[Token]) -> NumberLiteral:
        value, unit = parse_bytes(str(children[0]))
        return NumberLiteral(value, unit=unit, pos=_pos(meta))

    def string(self, meta: Meta, children: list[Token]) -> StringLiteral:
        return StringLiteral(_unquote(children[0]), pos=_pos(meta))

    def paren(self, meta: Meta, children: list[Expr]) -> ParenExpr:
        return ParenExpr(children[0], pos=_pos(meta))

    dur_paren = paren

    # ---------------------------------------------------------------- operators

    def unary(self, meta: Meta, children: list[Any]) -> Expr:
        op, expr = str(children[0]), children[1]
        pos = _pos(meta)
        if isinstance(expr, NumberLiteral):
            # As in Prometheus, a signed number is one literal: `-1` is NumberLiteral(-1).
            value = -expr.value if op == "-" else expr.value
            return NumberLiteral(value, duration=expr.duration, unit=expr.unit, pos=pos)
        return UnaryExpr(op, expr, pos=pos)

    dur_unary = unary

    def binary(self, meta: Meta, children: list[Any]) -> BinaryExpr:
        lhs, op_tok, mods, rhs = children
        op = str(op_tok).lower()
        return_bool, matching = self._modifiers(op, op_tok, mods.children)
        return BinaryExpr(op, lhs, rhs, return_bool=return_bool, matching=matching, pos=_pos(meta))

    def dur_binary(self, meta: Meta, children: list[Any]) -> BinaryExpr:
        lhs, op_tok, rhs = children
        return BinaryExpr(str(op_tok), lhs, rhs, pos=_pos(meta))

    def _modifiers(self, op: str, op_tok: Token, mods: list[Any]) -> tuple[bool, VectorMatching | None]:
        bool_tok, matching_tree, *fills = mods
        if bool_tok is not None and op not in COMPARISON_OPS:
            raise _Error("bool modifier can only be used on comparison operators", _tok_pos(bool_tok))
        fill_left: float | None = None
        fill_right: float | None = None
        for fill_tok, value in fills:
            if op in SET_OPS:
                raise _Error(
                    f"fill modifiers are not allowed for set operator {go_quote(op)}", _tok_pos(fill_tok)
                )
            kind = str(fill_tok).lower()
            if kind in ("fill", "fill_left"):
                fill_left = value
            if kind in ("fill", "fill_right"):
                fill_right = value
        if matching_tree is None and not fills:
            return bool_tok is not None, None
        card, on, labels, include, given = "one-to-one", False, (), (), False
        if matching_tree is not None:
            on, labels, group = matching_tree
            given = True
            if group is not None:
                group_tok, include = group
                if op in SET_OPS:
                    raise _Error(f"no grouping allowed for {go_quote(op)} operation", _tok_pos(group_tok))
                card = "many-to-one" if str(group_tok).lower() == "group_left" else "one-to-many"
                if on:
                    for name in include:
                        if name in labels:
                            raise _Error(
                                f"label {go_quote(name)} must not occur in ON and GROUP clause at once",
                                _tok_pos(group_tok),
                            )
        if op in SET_OPS:
            card = "many-to-many"
        matching = VectorMatching(
            card=card,
            on=on,
            labels=labels,
            include=include,
            matching_given=given,
            fill_left=fill_left,
            fill_right=fill_right,
        )
        return bool_tok is not None, matching

    def bin_mods(self, meta: Meta, children: list[Any]) -> _Children:
        return _Children(children)

    def matching(self, meta: Meta, children: list[Any]) -> tuple[bool, tuple[str, ...], Any]:
        kw, labels, group = children
        return str(kw).lower() == "on", labels, group

    def group_mod(self, meta: Meta, children: list[Any]) -> tuple[Token, tuple[str, ...]]:
        tok, labels = children
        return tok, labels if labels is not None else ()

    def fill_mod(self, meta: Meta, children: list[Any]) -> tuple[Token, float]:
        return children[0], children[1]

    def signed_number(self, meta: Meta, children: list[Any]) -> float:
        sign, tok = children
        value = _duration_ms(tok) / 1000 if tok.type == "DURATION" else parse_number(str(tok))
        return -value if sign is not None and str(sign) == "-" else value

    # ---------------------------------------------------------------- postfix modifiers

    def matrix(self, meta: Meta, children: list[Any]) -> MatrixSelector:
        inner, rng = children
        pos = _pos(meta)
        if not isinstance(inner, VectorSelector):
            raise _Error("ranges only allowed for vector selectors", pos)
        if inner.offset is not None or inner.at is not None or inner.smoothed:
            raise _Error("no offset, @ or smoothed modifiers allowed before range", pos)
        return MatrixSelector(inner, rng, pos=pos)

    def subquery(self, meta: Meta, children: list[Any]) -> SubqueryExpr:
        inner, rng, step = children
        return SubqueryExpr(inner, rng, step, pos=_pos(meta))

    def offset(self, meta: Meta, children: list[Any]) -> Expr:
        inner, tok, value = children
        pos = _pos(meta)
        if isinstance(inner, VectorSelector | SubqueryExpr):
            if inner.offset is not None:
                raise _Error("offset may not be set multiple times", _tok_pos(tok))
            return _replace(inner, offset=value, pos=pos)
        if isinstance(inner, MatrixSelector):
            if inner.vector.offset is not None:
                raise _Error("offset may not be set multiple times", _tok_pos(tok))
            return _replace(inner, vector=_replace(inner.vector, offset=value), pos=pos)
        raise _Error(
            "offset modifier must be preceded by an instant vector selector or range vector selector "
            "or a subquery",
            _tok_pos(tok),
        )

    def at(self, meta: Meta, children: list[Any]) -> Expr:
        inner, at = children
        pos = _pos(meta)
        if isinstance(inner, VectorSelector | SubqueryExpr):
            if inner.at is not None:
                raise _Error("@ <timestamp> may not be set multiple times", pos)
            return _replace(inner, at=at, pos=pos)
        if isinstance(inner, MatrixSelector):
            if inner.vector.at is not None:
                raise _Error("@ <timestamp> may not be set multiple times", pos)
            return _replace(inner, vector=_replace(inner.vector, at=at), pos=pos)
        raise _Error(
            "@ modifier must be preceded by an instant vector selector or range vector selector or a subquery",
            pos,
        )

    def at_number(self, meta: Meta, children: list[Any]) -> At:
        sign, tok = children
        if tok.type == "DURATION":
            ms = _duration_ms(tok)
        else:
            value = parse_number(str(tok))
            # Prometheus refuses infinities and NaN here; kql also refuses times whose milliseconds
            # would not fit the engine's int64 arithmetic (with any offset and range added).
            if not math.isfinite(value) or abs(value) * 1000 > MAX_AT_MS:
                raise _Error(f"timestamp out of bounds for @ modifier: {value:f}", _tok_pos(tok))
            ms = round(value * 1000)
        return At("time", -ms if sign is not None and str(sign) == "-" else ms)

    def at_function(self, meta: Meta, children: list[Any]) -> At:
        tok = children[0]
        name = str(tok).lower()
        if name not in ("start", "end"):
            raise _Error(f"unexpected {go_quote(str(tok))} in @, expected start() or end()", _tok_pos(tok))
        return At(name)

    def range_modifier(self, meta: Meta, children: list[Any]) -> Expr:
        inner, tok = children
        kind = str(tok).lower()
        if isinstance(inner, VectorSelector) and kind == "smoothed":
            if inner.smoothed:
                raise _Error("smoothed modifier may be given only once", _tok_pos(tok))
            return _replace(inner, smoothed=True, pos=_pos(meta))
        if not isinstance(inner, MatrixSelector):
            what = "an instant or range vector selector" if kind == "smoothed" else "a range vector selector"
            raise _Error(f"{kind} modifier must be preceded by {what}", _tok_pos(tok))
        if inner.anchored or inner.smoothed:
            raise _Error("anchored and smoothed modifiers may be given only once", _tok_pos(tok))
        return _replace(inner, anchored=kind == "anchored", smoothed=kind == "smoothed", pos=_pos(meta))

    # ---------------------------------------------------------------- selectors

    def vector_selector(self, meta: Meta, children: list[Any]) -> VectorSelector:
        pos = _pos(meta)
        if len(children) == 2:
            name_tok, items = children
            name: str | None = str(name_tok)
        else:
            name, items = None, children[0]
        matchers: list[Matcher] = []
        for kind, value, item_pos in items or ():
            if kind == "name":
                if name is not None:
                    raise _Error(
                        f"metric name must not be set twice: {go_quote(name)} or {go_quote(value)}", item_pos
                    )
                name = value
                continue
            if name is not None and value.name == "__name__" and len(children) == 2:
                raise _Error(
                    f"metric name must not be set twice: {go_quote(name)} or {go_quote(value.value)}",
                    item_pos,
                )
            matchers.append(value)
        # The checker rejects selectors that match everything (info() may take one as its filter).
        return VectorSelector(name, tuple(matchers), pos=pos)

    def matchers(self, meta: Meta, children: list[Any]) -> list[Any]:
        return [c for c in children if c is not None]

    def label_matcher(self, meta: Meta, children: list[Any]) -> tuple[str, Matcher, PosRange]:
        name, op_tok, value_tok = children
        pos = _pos(meta)
        try:
            matcher = Matcher(name, str(op_tok), _unquote(value_tok))
        except ValueError as exc:
            raise _Error(str(exc), _tok_pos(value_tok)) from None
        return "matcher", matcher, pos

    def name_matcher(self, meta: Meta, children: list[Any]) -> tuple[str, str, PosRange]:
        return "name", _unquote(children[0]), _pos(meta)

    def label_name(self, meta: Meta, children: list[Token]) -> str:
        tok = children[0]
        name = _unquote(tok) if tok.type == "STRING" else str(tok)
        if not is_valid_label_name(name):
            raise _Error(f"invalid label name {go_quote(name)}", _tok_pos(tok))
        return name

    def label_list(self, meta: Meta, children: list[Any]) -> tuple[str, ...]:
        return tuple(c for c in children if c is not None)

    # ---------------------------------------------------------------- calls and aggregations

    def args(self, meta: Meta, children: list[Any]) -> list[Expr]:
        return [c for c in children if c is not None]

    def call(self, meta: Meta, children: list[Any]) -> Call:
        from kernel_insight.kql.functions import FUNCTIONS  # local: the registry imports the AST

        name_tok, args = children
        name = str(name_tok)
        if name not in FUNCTIONS:
            raise _Error(f"unknown function with name {go_quote(name)}", _tok_pos(name_tok))
        return Call(name, tuple(args or ()), pos=_pos(meta))

    def dur_call(self, meta: Meta, children: list[Any]) -> Call:
        from kernel_insight.kql.functions import FUNCTIONS  # local: the registry imports the AST

        name_tok, *args = children
        args = [a for a in args if a is not None]
        name = str(name_tok).lower()
        spec = FUNCTIONS.get(name)
        if spec is None or not spec.in_durations:
            raise _Error(
                f"unknown function {go_quote(str(name_tok))} in duration expression, "
                "expected step(), range(), min_of() or max_of()",
                _tok_pos(name_tok),
            )
        want = len(spec.arg_types)
        if len(args) != want:
            raise _Error(
                f"expected {want} argument(s) in call to {go_quote(name)}, got {len(args)}", _pos(meta)
            )
        return Call(name, tuple(args), pos=_pos(meta))

    def grouping(self, meta: Meta, children: list[Any]) -> tuple[bool, tuple[str, ...]]:
        kw, labels = children
        return str(kw).lower() == "without", labels

    def aggregate_pre(self, meta: Meta, children: list[Any]) -> AggregateExpr:
        op_tok, grouping, args = children
        return self._aggregate(meta, op_tok, args, grouping)

    def aggregate_post(self, meta: Meta, children: list[Any]) -> AggregateExpr:
        op_tok, args, grouping = children
        return self._aggregate(meta, op_tok, args, grouping)

    def _aggregate(
        self,
        meta: Meta,
        op_tok: Token,
        args: list[Expr] | None,
        grouping: tuple[bool, tuple[str, ...]] | None,
    ) -> AggregateExpr:
        op = str(op_tok).lower()
        args = args or []
        pos = _pos(meta)
        want = 1 if AGGREGATORS[op].param is None else 2
        if len(args) != want:
            raise _Error(
                f"wrong number of arguments for aggregate expression provided, expected {want}, got {len(args)}",
                pos,
            )
        without, labels = grouping if grouping is not None else (False, ())
        param = args[0] if want == 2 else None
        return AggregateExpr(op, args[-1], param=param, grouping=labels, without=without, pos=pos)


class _Children:
    """A bare list holder so bin_mods is not mistaken for an AST node."""

    __slots__ = ("children",)

    def __init__(self, children: list[Any]) -> None:
        self.children = children


_N = TypeVar("_N", bound=VectorSelector | MatrixSelector | SubqueryExpr)


def _replace(node: _N, **changes: Any) -> _N:
    return dataclasses.replace(node, **changes)


#: The grammar's placeholder for the registered aggregation names (AGG_OP in grammar/kql.lark).
_AGGREGATORS_PLACEHOLDER = "__aggregators__"


def _grammar() -> str:
    """grammar/kql.lark with the registered aggregation names (longest first) in AGG_OP's pattern.

    Substituted in the text, not by editing the terminal afterwards, so the text the parser's
    cache is keyed on names every aggregator the parser accepts.
    """
    text = resources.files("kernel_insight.kql").joinpath("grammar/kql.lark").read_text()
    if text.count(_AGGREGATORS_PLACEHOLDER) != 1:
        raise ValueError(
            f"grammar/kql.lark: AGG_OP must hold the {_AGGREGATORS_PLACEHOLDER} placeholder once"
        )
    names = "|".join(sorted(AGGREGATORS, key=lambda n: (-len(n), n)))
    return text.replace(_AGGREGATORS_PLACEHOLDER, names)


def _cache_file(grammar: str) -> str | bool:
    """Where the analysed grammar is kept between processes, or False for no cache.

    Building the LALR tables is most of a short command's start (``ki rules check``, ``ki
    query``); loading them is far quicker (``make bench-cli``, bench/results/cli.md). Lark's own default is a predictable name in the
    shared temporary directory, and the file is a pickle, so it lives in the user's cache
    directory instead (``$XDG_CACHE_HOME`` or ``~/.cache``, ``kernel-insight/``), used only when
    that folder is the user's own and writable by nobody else. The name carries a digest of the
    grammar and lark's version; lark also checks a digest inside the file and rebuilds it when
    it does not match (a partly written file included).
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "kernel-insight")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError:
        return False
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return False
    digest = hashlib.sha256(f"{lark.__version__}\0{grammar}".encode()).hexdigest()[:16]
    return os.path.join(folder, f"kql-grammar-{digest}.lark-cache")


@functools.cache
def _parser() -> Lark:
    grammar = _grammar()
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=_cache_file(grammar),
    )


def _syntax_error(query: str, exc: UnexpectedInput) -> KqlParseError:
    if isinstance(exc, UnexpectedCharacters):
        at = exc.pos_in_stream or 0
        ch = query[at] if at < len(query) else ""
        return KqlParseError(f"unexpected character: {go_quote(ch)}", query, at)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected = sorted({_describe(t) for t in exc.expected if not t.startswith("__")})
        hint = f", expected {' or '.join(expected)}" if 0 < len(expected) <= 4 else ""
        if tok.type == "$END":
            return KqlParseError(f"unexpected end of input{hint}", query, len(query))
        start = tok.start_pos if tok.start_pos is not None else 0
        what = f"{_describe(tok.type)} {go_quote(str(tok))}" if tok.type in _KINDS else go_quote(str(tok))
        return KqlParseError(f"unexpected {what}{hint}", query, start, start + len(str(tok)))
    if isinstance(exc, UnexpectedEOF):
        return KqlParseError("unexpected end of input", query, len(query))
    return KqlParseError(str(exc), query, getattr(exc, "pos_in_stream", 0) or 0)


def _check_depth(tree: Tree[Token], query: str) -> None:
    """Refuse trees deeper than :data:`MAX_DEPTH`, walking without recursion (the parse itself is LALR)."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            meta = node.meta
            start = 0 if getattr(meta, "empty", True) else meta.start_pos
            end = start if getattr(meta, "empty", True) else meta.end_pos
            raise KqlParseError(
                f"expression nests too deeply: more than {MAX_DEPTH} levels", query, start, end
            )
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def parse_raw(query: str) -> Expr:
    """Parse without the type-checking pass (the printer and tests use it)."""
    if not query.strip():
        raise KqlParseError("no expression found in input", query, 0)
    if len(query) > MAX_QUERY_LENGTH:
        raise KqlParseError(
            f"query is too long: {len(query)} characters, more than the limit of {MAX_QUERY_LENGTH}",
            query,
            MAX_QUERY_LENGTH,
            len(query),
        )
    try:
        tree = _parser().parse(query)
    except UnexpectedInput as exc:
        raise _syntax_error(query, exc) from None
    _check_depth(tree, query)
    try:
        result: Expr = _ToAst().transform(tree)
    except _Error as exc:
        raise KqlParseError(exc.message, query, exc.pos.start, exc.pos.end) from None
    except VisitError as exc:
        orig = exc.orig_exc
        if isinstance(orig, _Error):
            raise KqlParseError(orig.message, query, orig.pos.start, orig.pos.end) from None
        raise
    return result


#: A keyword terminal of grammar/kql.lark: ``/(?i:word)(?![\w:])/`` (or a lookahead for ``(``).
_KEYWORD_PATTERN = re.compile(r"\(\?i:([a-z_0-9]+)\)\(\?[=!]")


@functools.cache
def vocabulary() -> dict[str, list[str] | dict[str, str]]:
    """The words an editor highlights, read from the parser and the registries, not listed again:
    ``keywords`` (the grammar's keyword terminals; ``call_keywords``: those that are keywords only
    before a parenthesis, ``fill``), ``grouping`` (those a label list follows: ``by``, ``on``,
    ``group_left`` ...), ``aggregators`` and ``functions`` (their registries, duration functions
    included), and ``result_units``: each function's and aggregator's result unit other than its
    argument's (``result_unit``, one of :data:`~kernel_insight.kql.ast.RESULT_UNITS`). The web UI's
    query editor asks for it (``GET /ui/kql.json``) and labels its charts' axes with the units."""
    from kernel_insight.kql.functions import FUNCTIONS

    parser = _parser()
    keyword_of: dict[str, str] = {}
    before_parenthesis: set[str] = set()
    for terminal in parser.terminals:
        found = _KEYWORD_PATTERN.match(str(terminal.pattern.value))
        if terminal.name != "AGG_OP" and found is not None:
            keyword_of[terminal.name] = found.group(1)
            if found.group(0).endswith("(?="):
                before_parenthesis.add(found.group(1))
    grouping = {
        keyword_of[rule.expansion[i].name]
        for rule in parser.rules
        for i in range(len(rule.expansion) - 1)
        if rule.expansion[i].name in keyword_of and rule.expansion[i + 1].name == "label_list"
    }
    units = {name: spec.result_unit for name, spec in AGGREGATORS.items()}
    units.update({name: spec.result_unit for name, spec in FUNCTIONS.items()})
    return {
        "keywords": sorted(keyword_of.values()),
        "call_keywords": sorted(before_parenthesis),
        "grouping": sorted(grouping),
        "aggregators": sorted(AGGREGATORS),
        "functions": sorted(FUNCTIONS),
        "result_units": {name: unit for name, unit in sorted(units.items()) if unit},
    }


def parse(query: str) -> Expr:
    """Parse and type-check a query; raises :class:`KqlParseError` (or its subclass KqlTypeError)."""
    from kernel_insight.kql.checker import check  # local: the checker needs the function registry

    expr = parse_raw(query)
    check(expr, query)
    return expr
