"""Go ``text/template`` as Prometheus uses it in alert labels and annotations: a subset, same output.

Rule files written for Prometheus carry annotations such as
``{{ $labels.instance }} is {{ $value | humanizeDuration }}``; this renders them the way
Prometheus does (Go's number formatting included) so the text Alertmanager receives is the
same. Supported: text and actions with ``{{-``/``-}}`` trimming, comments, pipelines,
variables (``$x := ...``, ``$x = ...``), fields and map keys (``.Labels.gpu``,
``$labels.gpu``), ``if``/``else if``/``else``, ``range`` (with ``$i, $v :=``), ``with``,
``break``/``continue``, and the functions of Go and of Prometheus' ``template`` package
listed in :data:`FUNCTION_NAMES`. Not supported (a parse error says so): ``define``,
``template``, ``block``.

>>> render("{{ $labels.gpu }} at {{ $value | humanizeDuration }}", labels={"gpu": "3"}, value=0.25)
'3 at 250ms'
"""

from __future__ import annotations

import datetime as dt
import functools
import html
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernel_insight.kql.gocompat import go_duration, go_float

if TYPE_CHECKING:
    from re2 import _Regexp

__all__ = [
    "FUNCTION_NAMES",
    "QuerySample",
    "Template",
    "TemplateError",
    "go_format_float",
    "render",
]


class TemplateError(ValueError):
    """The template does not parse, or failed while running (an unknown function, a bad argument)."""


@dataclass(frozen=True, slots=True)
class QuerySample:
    """One element of what the ``query`` function returns (``.Labels``, ``.Value``)."""

    Labels: Mapping[str, str]
    Value: float


QueryFunc = Callable[[str], list[QuerySample]]

# ----------------------------------------------------------------------------- Go formatting


def go_format_float(v: float, verb: str = "v", prec: int | None = None) -> str:
    """``fmt.Sprintf("%v"|"%.Ng"|"%e"|"%f", v)`` as Go prints a float64."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if verb in ("v", "g", "G") and prec is None:
        return go_float(v)
    p = 6 if prec is None else prec
    if verb in ("g", "G"):
        return f"{v:.{p}g}"
    if verb == "e":
        return f"{v:.{p}e}"
    if verb == "f":
        return f"{v:.{p}f}"
    raise TemplateError(f"unsupported float verb %{verb}")


def _go_g4(v: float) -> str:
    """``fmt.Sprintf("%.4g", v)``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


def _sprint(value: Any) -> str:
    """What Go's ``fmt.Sprint`` prints for a template value."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_format_float(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime):
        return _go_time(value)
    if isinstance(value, dt.timedelta):
        return go_duration(value // dt.timedelta(microseconds=1) * 1000)
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{k}:{_sprint(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, QuerySample):
        return "{" + _sprint(dict(value.Labels)) + " " + _sprint(value.Value) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_sprint(v) for v in value) + "]"
    return str(value)


def _go_time(t: dt.datetime) -> str:
    t = t.astimezone(dt.UTC)
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if t.microsecond:
        text += ("." + f"{t.microsecond:06d}").rstrip("0")
    return text + " +0000 UTC"


# ----------------------------------------------------------------------------- functions


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        raise TemplateError("can't convert bool to float")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise TemplateError(f'strconv.ParseFloat: parsing "{v}": invalid syntax') from None
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    raise TemplateError(f"can't convert {type(v).__name__} to float")


def humanize(v: Any) -> str:
    x = _to_float(v)
    if x == 0 or math.isnan(x) or math.isinf(x):
        return _go_g4(x)
    prefix = ""
    if abs(x) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(x) < 1000:
                break
            prefix, x = p, x / 1000
        return _go_g4(x) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(x) >= 1:
            break
        prefix, x = p, x * 1000
    return _go_g4(x) + prefix


def humanize1024(v: Any) -> str:
    x = _to_float(v)
    if abs(x) <= 1 or math.isnan(x) or math.isinf(x):
        return _go_g4(x)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(x) < 1024:
            break
        prefix, x = p, x / 1024
    return _go_g4(x) + prefix


def humanize_duration(v: Any) -> str:
    x = _to_float(v)
    if math.isnan(x) or math.isinf(x):
        return _go_g4(x)
    if x == 0:
        return _go_g4(x) + "s"
    if abs(x) >= 1:
        sign = ""
        if x < 0:
            sign, x = "-", -x
        d = int(x)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g4(x)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(x) >= 1:
            break
        prefix, x = p, x * 1000
    return f"{_go_g4(x)}{prefix}s"


def humanize_percentage(v: Any) -> str:
    return _go_g4(_to_float(v) * 100) + "%"


def humanize_timestamp(v: Any) -> str:
    if isinstance(v, dt.datetime):
        return _go_time(v)
    x = _to_float(v)
    if math.isnan(x) or math.isinf(x):
        return _go_g4(x)
    return _go_time(dt.datetime.fromtimestamp(x, dt.UTC))


def _printf(fmt: str, *args: Any) -> str:
    out: list[str] = []
    i, ai = 0, 0
    spec = re.compile(r"%([-+ #0]*)(\d+)?(?:\.(\d+))?([vdsfgeqxXtTo%])")
    while i < len(fmt):
        m = spec.match(fmt, i) if fmt[i] == "%" else None
        if m is None:
            out.append(fmt[i])
            i += 1
            continue
        i = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if ai >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[ai]
        ai += 1
        if verb in "fge" and isinstance(arg, (int, float)) and not isinstance(arg, bool):
            text = go_format_float(float(arg), verb, int(prec) if prec is not None else None)
            if "+" in flags and not text.startswith("-"):
                text = "+" + text
        elif verb == "d" and isinstance(arg, (int, float)) and not isinstance(arg, bool):
            text = str(int(arg)) if float(arg).is_integer() else f"%!d(float64={_sprint(arg)})"
        elif verb == "q":
            text = '"' + str(arg).replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif verb in "xX" and isinstance(arg, int):
            text = format(arg, verb)
        elif verb == "t":
            text = _sprint(arg)
        elif verb == "T":
            text = {float: "float64", int: "int", str: "string", bool: "bool"}.get(
                type(arg), type(arg).__name__
            )
        else:
            text = _sprint(arg)
            if prec is not None and verb == "s":
                text = text[: int(prec)]
        if width:
            text = (
                text.ljust(int(width))
                if "-" in flags
                else text.rjust(int(width), "0" if "0" in flags else " ")
            )
        out.append(text)
    if ai < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{type(a).__name__}={_sprint(a)}" for a in args[ai:]) + ")")
    return "".join(out)


def _truth(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, (bool, int, float)):
        return bool(v)
    if isinstance(v, (str, Mapping, list, tuple)):
        return len(v) > 0
    if isinstance(v, dt.timedelta):
        return v.total_seconds() != 0
    return True


def _cmp_args(a: Any, b: Any) -> tuple[Any, Any]:
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        if isinstance(a, int) != isinstance(b, int):
            raise TemplateError("incompatible types for comparison")
        return a, b
    if type(a) is not type(b):
        raise TemplateError("incompatible types for comparison")
    return a, b


def _eq(a: Any, *bs: Any) -> bool:
    return any(x == y for x, y in (_cmp_args(a, b) for b in bs))


def _lt(a: Any, b: Any) -> bool:
    x, y = _cmp_args(a, b)
    return bool(x < y)


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, Mapping):
            v = v.get(k, "" if all(isinstance(x, str) for x in v.values()) else None)
        elif isinstance(v, (list, tuple)):
            if not isinstance(k, int) or not 0 <= k < len(v):
                raise TemplateError(f"error calling index: index out of range: {k}")
            v = v[k]
        else:
            raise TemplateError(f"can't index item of type {type(v).__name__}")
    return v


def _length(v: Any) -> int:
    if isinstance(v, (str, Mapping, list, tuple)):
        return len(v)
    raise TemplateError(f"error calling len: len of type {type(v).__name__}")


def _label(name: str, s: Any) -> str:
    if not isinstance(s, QuerySample):
        raise TemplateError("label: expected a query sample")
    return s.Labels.get(name, "")


def _first(v: Any) -> QuerySample:
    if isinstance(v, (list, tuple)) and v:
        first = v[0]
        if isinstance(first, QuerySample):
            return first
    raise TemplateError("first() called on vector with no elements")


def _value(s: Any) -> float:
    if not isinstance(s, QuerySample):
        raise TemplateError("value: expected a query sample")
    return s.Value


def _title(s: str) -> str:
    return re.sub(r"(^|[^\w'])(\w)", lambda m: m.group(1) + m.group(2).upper(), s)


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    rx = _go_regexp(pattern)
    go_repl = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: "\\g<" + (m.group(1) or m.group(2)) + ">", repl)
    return rx.sub(go_repl, text)


def _match(pattern: str, text: str) -> bool:
    return _go_regexp(pattern).search(text) is not None


def _go_regexp(pattern: str) -> _Regexp[str]:
    """Go's ``regexp.MustCompile`` (RE2, unanchored, linear time): kql's RE2 compile."""
    from kernel_insight.kql.regex import compile_go

    return compile_go(pattern)


def _sort_by_label(name: str, v: Sequence[QuerySample]) -> list[QuerySample]:
    return sorted(v, key=lambda s: s.Labels.get(name, ""))


def _strip_port(host: str) -> str:
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _strip_domain(host: str) -> str:
    port = ""
    if ":" in host and not host.startswith("["):
        host, port = host.rsplit(":", 1)
        port = ":" + port
    if re.fullmatch(r"[0-9.]+", host):
        return host + port
    return host.split(".", 1)[0] + port


def _parse_duration(text: str) -> float:
    from kernel_insight.kql.lexical import parse_duration

    try:
        return parse_duration(text) / 1000
    except ValueError as exc:
        raise TemplateError(str(exc)) from None


def _to_time(v: Any) -> dt.datetime:
    return dt.datetime.fromtimestamp(_to_float(v), dt.UTC)


def _to_duration(v: Any) -> dt.timedelta:
    return dt.timedelta(seconds=_to_float(v))


def _and(*args: Any) -> Any:
    for a in args:
        if not _truth(a):
            return a
    return args[-1]


def _or(*args: Any) -> Any:
    for a in args:
        if _truth(a):
            return a
    return args[-1]


_BASE_FUNCS: dict[str, Callable[..., Any]] = {
    "and": _and,
    "or": _or,
    "not": lambda a: not _truth(a),
    "len": _length,
    "index": _index,
    "print": lambda *a: "".join(_sprint(x) for x in a),
    "println": lambda *a: " ".join(_sprint(x) for x in a) + "\n",
    "printf": _printf,
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "lt": _lt,
    "le": lambda a, b: _lt(a, b) or _eq(a, b),
    "gt": lambda a, b: not (_lt(a, b) or _eq(a, b)),
    "ge": lambda a, b: not _lt(a, b),
    "html": lambda *a: html.escape("".join(_sprint(x) for x in a), quote=True).replace("&#x27;", "&#39;"),
    "js": lambda *a: (
        "".join(_sprint(x) for x in a).replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"')
    ),
    "urlquery": lambda *a: urllib.parse.quote_plus("".join(_sprint(x) for x in a)),
    "humanize": humanize,
    "humanize1024": humanize1024,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
    "humanizeTimestamp": humanize_timestamp,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "title": _title,
    "reReplaceAll": _re_replace_all,
    "match": _match,
    "safeHtml": lambda s: str(s),
    "stripPort": _strip_port,
    "stripDomain": _strip_domain,
    "label": _label,
    "first": _first,
    "value": _value,
    "strvalue": lambda s: s.Labels.get("__value__", "") if isinstance(s, QuerySample) else "",
    "sortByLabel": _sort_by_label,
    "args": lambda *a: {f"arg{i}": v for i, v in enumerate(a)},
    "toTime": _to_time,
    "toDuration": _to_duration,
    "parseDuration": _parse_duration,
}
#: Every function a template may call (``query``, ``externalURL``, ``pathPrefix``, ``graphLink``
#: and ``tableLink`` need the evaluation context and are bound per render).
FUNCTION_NAMES = frozenset(
    [*_BASE_FUNCS, "query", "externalURL", "pathPrefix", "graphLink", "tableLink", "now"]
)

# ----------------------------------------------------------------------------- lexer and parser

_ACTION = re.compile(r"\{\{(-\s)?|\{\{")
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\\n]|\\.)*")|(?P<raw>`[^`]*`)|(?P<chr>'(?:[^'\\]|\\.)')|
    (?P<num>[+-]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))(?![\w.])|
    (?P<decl>:=)|(?P<assign>=)|(?P<pipe>\|)|(?P<lp>\()|(?P<rp>\))|(?P<comma>,)|
    (?P<var>\$\w*(?:\.\w+)*)|(?P<field>(?:\.\w+)+|\.)|(?P<ident>[A-Za-z_]\w*(?:\.\w+)*)
    )""",
    re.VERBOSE,
)


@dataclass
class _Node:
    kind: str  # text, action, if, range, with, break, continue
    text: str = ""
    pipe: Any = None
    body: list[_Node] = field(default_factory=list)
    else_body: list[_Node] = field(default_factory=list)
    decl: list[str] = field(default_factory=list)


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def _split(src: str, name: str) -> list[tuple[str, str]]:
    """``[("text", t) | ("action", a)]`` with trim markers applied and comments dropped."""
    out: list[tuple[str, str]] = []
    i = 0
    while True:
        j = src.find("{{", i)
        if j < 0:
            out.append(("text", src[i:]))
            return out
        text = src[i:j]
        k = j + 2
        if src.startswith("- ", k) or src.startswith("-\t", k) or src.startswith("-\n", k):
            text = text.rstrip(" \t\r\n")
            k += 1
        out.append(("text", text))
        end = src.find("}}", k)
        if src.startswith("/*", _skip_ws(src, k)):
            cend = src.find("*/", k)
            if cend < 0:
                raise TemplateError(f"template: {name}: unclosed comment")
            end = src.find("}}", cend)
        if end < 0:
            raise TemplateError(f"template: {name}:{src.count(chr(10), 0, j) + 1}: unclosed action")
        body = src[k:end]
        trim_right = body.endswith(" -") or body.endswith("\t-") or body.endswith("\n-")
        if trim_right:
            body = body[:-1]
        i = end + 2
        if trim_right:
            while i < len(src) and src[i] in " \t\r\n":
                i += 1
        if body.strip().startswith("/*"):
            continue
        out.append(("action", body))


def _skip_ws(src: str, k: int) -> int:
    while k < len(src) and src[k] in " \t\r\n":
        k += 1
    return k


def _tokens(action: str, name: str) -> list[tuple[str, str]]:
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(action):
        if action[pos:].strip() == "":
            break
        m = _TOKEN.match(action, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"template: {name}: unexpected {action[pos:].strip()[:20]!r} in command")
        kind = m.lastgroup
        assert kind is not None
        toks.append((kind, m.group(kind)))
        pos = m.end()
    return toks


class _Parser:
    def __init__(self, src: str, name: str) -> None:
        self.name = name
        self.items = _split(src, name)
        self.i = 0

    def parse(self) -> list[_Node]:
        nodes, stop = self._list()
        if stop is not None:
            raise TemplateError(f"template: {self.name}: unexpected {{{{{stop}}}}}")
        return nodes

    def _list(self) -> tuple[list[_Node], str | None]:
        nodes: list[_Node] = []
        while self.i < len(self.items):
            kind, text = self.items[self.i]
            self.i += 1
            if kind == "text":
                if text:
                    nodes.append(_Node("text", text))
                continue
            toks = _tokens(text, self.name)
            if not toks:
                raise TemplateError(f"template: {self.name}: missing value for command")
            head = toks[0][1] if toks[0][0] == "ident" else ""
            if head in ("end", "else"):
                return nodes, " ".join(t for _, t in toks)
            if head in ("if", "with", "range"):
                nodes.append(self._control(head, toks[1:]))
            elif head in ("break", "continue"):
                nodes.append(_Node(head))
            elif head in ("define", "template", "block"):
                raise TemplateError(f"template: {self.name}: {{{{{head}}}}} is not supported")
            else:
                decl, pipe = self._pipeline(toks)
                nodes.append(_Node("action", pipe=pipe, decl=decl))
        return nodes, None

    def _control(self, head: str, toks: list[tuple[str, str]]) -> _Node:
        if not toks:
            raise TemplateError(f"template: {self.name}: missing value for {head}")
        decl, pipe = self._pipeline(toks, allow_two=head == "range")
        node = _Node(head, pipe=pipe, decl=decl)
        node.body, stop = self._list()
        if stop is None:
            raise TemplateError(f"template: {self.name}: unexpected EOF")
        if stop.startswith("else"):
            rest = stop[4:].strip()
            if rest.startswith(head) and head in ("if", "with"):
                # {{else if ...}}: an if nested in the else branch that shares this one's {{end}}.
                self.i -= 1
                self.items[self.i] = ("action", rest)
                node.else_body, _ = self._list_one()
                return node
            node.else_body, stop = self._list()
            if stop != "end":
                raise TemplateError(f"template: {self.name}: expected end; found {stop}")
        elif stop != "end":
            raise TemplateError(f"template: {self.name}: unexpected {stop}")
        return node

    def _list_one(self) -> tuple[list[_Node], str | None]:
        text = self.items[self.i][1]
        self.i += 1
        toks = _tokens(text, self.name)
        return [self._control(toks[0][1], toks[1:])], "end"

    def _pipeline(self, toks: list[tuple[str, str]], allow_two: bool = False) -> tuple[list[str], list[Any]]:
        decl: list[str] = []
        for n in (2, 4) if allow_two else (2,):
            if len(toks) > n - 1 and toks[n - 1][0] in ("decl", "assign"):
                names = [t for k, t in toks[: n - 1] if k != "comma"]
                if all(t.startswith("$") for t in names):
                    decl = [("=" if toks[n - 1][0] == "assign" else ":=") + x for x in names]
                    toks = toks[n:]
                    break
        cmds: list[Any] = []
        cur: list[Any] = []
        i = 0
        while i < len(toks):
            kind, text = toks[i]
            if kind == "pipe":
                if not cur:
                    raise TemplateError(f"template: {self.name}: missing command before |")
                cmds.append(cur)
                cur = []
                i += 1
                continue
            if kind == "lp":
                depth, j = 1, i + 1
                while j < len(toks) and depth:
                    depth += {"lp": 1, "rp": -1}.get(toks[j][0], 0)
                    j += 1
                if depth:
                    raise TemplateError(f"template: {self.name}: unclosed left paren")
                _, inner = self._pipeline(toks[i + 1 : j - 1])
                cur.append(("paren", inner))
                i = j
                continue
            if kind == "rp":
                raise TemplateError(f"template: {self.name}: unexpected right paren")
            if (
                kind == "ident"
                and text not in ("true", "false", "nil")
                and text.split(".")[0] not in FUNCTION_NAMES
            ):
                raise TemplateError(f'template: {self.name}: function "{text.split(".")[0]}" not defined')
            cur.append((kind, text))
            i += 1
        if not cur:
            raise TemplateError(f"template: {self.name}: missing command")
        cmds.append(cur)
        return decl, cmds


# ----------------------------------------------------------------------------- execution


class Template:
    """A parsed template; :meth:`execute` renders it against a data value and variables."""

    def __init__(self, text: str, name: str = "template") -> None:
        self.name = name
        self.nodes = _Parser(text, name).parse()

    def execute(
        self, data: Any, variables: Mapping[str, Any], funcs: Mapping[str, Callable[..., Any]]
    ) -> str:
        out: list[str] = []
        scopes: list[dict[str, Any]] = [{"$": data, **variables}]
        self._run(self.nodes, data, scopes, funcs, out)
        return "".join(out)

    def _run(
        self,
        nodes: list[_Node],
        dot: Any,
        scopes: list[dict[str, Any]],
        funcs: Mapping[str, Callable[..., Any]],
        out: list[str],
    ) -> None:
        scopes.append({})
        try:
            for node in nodes:
                if node.kind == "text":
                    out.append(node.text)
                elif node.kind == "action":
                    value = self._pipe(node.pipe, dot, scopes, funcs)
                    if node.decl:
                        self._declare(node.decl[:1], [value], scopes)
                    else:
                        out.append(_sprint(value))
                elif node.kind == "break":
                    raise _Break
                elif node.kind == "continue":
                    raise _Continue
                elif node.kind in ("if", "with"):
                    value = self._pipe(node.pipe, dot, scopes, funcs)
                    if node.decl:
                        self._declare(node.decl[:1], [value], scopes)
                    if _truth(value):
                        self._run(node.body, value if node.kind == "with" else dot, scopes, funcs, out)
                    else:
                        self._run(node.else_body, dot, scopes, funcs, out)
                elif node.kind == "range":
                    self._range(node, dot, scopes, funcs, out)
        finally:
            scopes.pop()

    def _range(
        self,
        node: _Node,
        dot: Any,
        scopes: list[dict[str, Any]],
        funcs: Mapping[str, Callable[..., Any]],
        out: list[str],
    ) -> None:
        value = self._pipe(node.pipe, dot, scopes, funcs)
        if isinstance(value, Mapping):
            items: list[tuple[Any, Any]] = sorted(value.items())
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        elif value is None:
            items = []
        else:
            raise TemplateError(f"range can't iterate over {_sprint(value)}")
        if not items:
            self._run(node.else_body, dot, scopes, funcs, out)
            return
        for k, v in items:
            scopes.append({})
            try:
                if len(node.decl) == 1:
                    self._declare(node.decl, [v], scopes)
                elif len(node.decl) == 2:
                    self._declare(node.decl, [k, v], scopes)
                self._run(node.body, v, scopes, funcs, out)
            except _Break:
                break
            except _Continue:
                continue
            finally:
                scopes.pop()

    @staticmethod
    def _declare(decl: list[str], values: list[Any], scopes: list[dict[str, Any]]) -> None:
        for d, v in zip(decl, values, strict=False):
            name = (d[2:] if d.startswith(":=") else d[1:]).lstrip("$")
            if d.startswith(":="):
                scopes[-1][name] = v
            else:
                for scope in reversed(scopes):
                    if name in scope:
                        scope[name] = v
                        break
                else:
                    raise TemplateError(f"undefined variable: {name}")

    def _pipe(
        self, cmds: list[Any], dot: Any, scopes: list[dict[str, Any]], funcs: Mapping[str, Callable[..., Any]]
    ) -> Any:
        value: Any = _NOTHING
        for cmd in cmds:
            value = self._command(cmd, dot, scopes, funcs, value)
        return value

    def _command(
        self,
        cmd: list[Any],
        dot: Any,
        scopes: list[dict[str, Any]],
        funcs: Mapping[str, Callable[..., Any]],
        piped: Any,
    ) -> Any:
        kind, text = cmd[0]
        if kind == "ident" and text not in ("true", "false", "nil"):
            fname, _, rest = text.partition(".")
            fn = funcs.get(fname)
            if fn is None:
                raise TemplateError(f'template: {self.name}: function "{fname}" not defined')
            args = [self._operand(a, dot, scopes, funcs) for a in cmd[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            try:
                result = fn(*args)
            except TemplateError:
                raise
            except (TypeError, ValueError, KeyError, IndexError, re.error) as exc:
                raise TemplateError(f"template: {self.name}: error calling {fname}: {exc}") from None
            return self._fields(result, rest.split(".") if rest else [])
        if len(cmd) > 1 or piped is not _NOTHING:
            raise TemplateError(f"template: {self.name}: can't give argument to non-function {text}")
        return self._operand(cmd[0], dot, scopes, funcs)

    def _operand(
        self, tok: Any, dot: Any, scopes: list[dict[str, Any]], funcs: Mapping[str, Callable[..., Any]]
    ) -> Any:
        kind, text = tok
        if kind == "paren":
            return self._pipe(text, dot, scopes, funcs)
        if kind == "str":
            from kernel_insight.kql.lexical import unquote

            return unquote(text)
        if kind == "raw":
            return text[1:-1]
        if kind == "chr":
            from kernel_insight.kql.lexical import unquote

            return ord(unquote('"' + text[1:-1] + '"'))
        if kind == "num":
            low = text.lower()
            if re.fullmatch(r"[+-]?(0x[0-9a-f]+|\d+)", low):
                return int(low, 0) if not re.fullmatch(r"[+-]?0\d+", low) else int(low, 8)
            return float(text)
        if kind == "ident":
            if text in ("true", "false"):
                return text == "true"
            if text == "nil":
                return None
            fn = funcs.get(text)
            if fn is None:
                raise TemplateError(f'template: {self.name}: function "{text}" not defined')
            return fn()
        if kind == "var":
            name, *path = text[1:].split(".")
            for scope in reversed(scopes):
                if name in scope:
                    return self._fields(scope[name], path)
            raise TemplateError(f"template: {self.name}: undefined variable: ${name}")
        if kind == "field":
            if text == ".":
                return dot
            return self._fields(dot, text[1:].split("."))
        raise TemplateError(f"template: {self.name}: unexpected {text}")

    def _fields(self, value: Any, path: list[str]) -> Any:
        for name in path:
            if isinstance(value, Mapping):
                # missingkey=zero over map[string]string: the zero value, "".
                value = value.get(name, "")
            elif isinstance(value, QuerySample) and name in ("Labels", "Value"):
                value = getattr(value, name)
            else:
                raise TemplateError(f"template: {self.name}: can't evaluate field {name} in {_sprint(value)}")
        return value


_NOTHING = object()


def render(
    text: str,
    *,
    labels: Mapping[str, str] | None = None,
    value: float = 0.0,
    external_labels: Mapping[str, str] | None = None,
    external_url: str = "",
    query: QueryFunc | None = None,
    now_s: float = 0.0,
    name: str = "template",
) -> str:
    """Expand an alert template as Prometheus does (``$labels``, ``$value``, ``$externalLabels``, ``$externalURL``)."""
    data = {
        "Labels": dict(labels or {}),
        "ExternalLabels": dict(external_labels or {}),
        "ExternalURL": external_url,
        "Value": value,
    }
    variables = {
        "labels": data["Labels"],
        "externalLabels": data["ExternalLabels"],
        "externalURL": external_url,
        "value": value,
    }
    return _parsed(text, name).execute(data, variables, template_funcs(query, external_url, now_s))


@functools.lru_cache(maxsize=4096)
def _parsed(text: str, name: str) -> Template:
    """Templates are parsed once: a rule renders the same few texts for every alert, every evaluation."""
    return Template(text, name)


def template_funcs(query: QueryFunc | None, external_url: str, now_s: float) -> dict[str, Callable[..., Any]]:
    """The function table with the context-bound functions filled in."""

    def run_query(q: str) -> list[QuerySample]:
        if query is None:
            raise TemplateError("query is not available here")
        return query(q)

    prefix = urllib.parse.urlparse(external_url).path
    funcs = dict(_BASE_FUNCS)
    funcs.update(
        {
            "query": run_query,
            "externalURL": lambda: external_url,
            "pathPrefix": lambda: prefix,
            "graphLink": lambda e: f"{prefix}/graph?g0.expr={urllib.parse.quote_plus(e)}&g0.tab=0",
            "tableLink": lambda e: f"{prefix}/graph?g0.expr={urllib.parse.quote_plus(e)}&g0.tab=1",
            "now": lambda: now_s,
        }
    )
    return funcs


def check(text: str, name: str = "template") -> None:
    """Raise :class:`TemplateError` unless ``text`` parses (what ``ki rules check`` runs on every template)."""
    Template(
        "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
        + text,
        name,
    )
