"""PromQL regular expressions: RE2 syntax (Go's ``regexp``), matched in time linear in the text.

Python's ``re`` backtracks, so a pattern such as ``(a+)+b`` can take seconds per label value
while holding the GIL; RE2 (the ``google-re2`` package) cannot. Every pattern is compiled as
Prometheus does, ``^(?s:pattern)$``, so kql's matching, ClickHouse's ``match()`` (RE2 too) and
Prometheus agree on anchoring and on ``.`` matching newlines.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import re2

if TYPE_CHECKING:
    from re2 import _Match, _Regexp

__all__ = ["Regex", "RegexError", "anchored", "compile_anchored", "compile_go"]


class RegexError(ValueError):
    """The pattern is not valid RE2; the message reads like Go's ``regexp/syntax`` error."""


# RE2's error texts (re2.cc CodeText) in Go's words (regexp/syntax ErrorCode), which Prometheus shows.
_GO_WORDS = {
    "missing )": "missing closing )",
    "missing ]": "missing closing ]",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "invalid UTF-8": "invalid UTF-8",
}

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad user pattern is an answer to the user, not a line in our log


def anchored(pattern: str) -> str:
    """The pattern as Prometheus compiles it for a matcher: ``^(?s:pattern)$``."""
    return f"^(?s:{pattern})$"


def _go_error(raw: str) -> str:
    code, _, arg = raw.partition(": ")
    for known in sorted(_GO_WORDS, key=len, reverse=True):
        if raw.startswith(known):
            code, arg = known, raw[len(known) :].removeprefix(": ")
            break
    words = _GO_WORDS.get(code, code)
    return f"error parsing regexp: {words}: `{arg}`" if arg else f"error parsing regexp: {words}"


class Regex:
    """A compiled PromQL regex: ``matches`` says whether a whole label value matches; ``match`` gives groups.

    >>> compile_anchored("gpu[0-3]").matches("gpu2")
    True

    Matchers run over every candidate series, so the common shapes skip RE2's Python wrapper (a few
    microseconds a call): a plain alternation of literals (``a|b|c``, what Grafana's multi-value
    variables produce) is a set lookup, ``.*`` matches everything, and answers for recent values
    are remembered (label values repeat across series).
    """

    __slots__ = ("_literals", "_memo", "_raw", "compiled", "pattern")

    def __init__(self, pattern: str, compiled: _Regexp[str]) -> None:
        self.pattern = pattern
        self.compiled = compiled
        self._literals = _literal_alternatives(pattern)
        # The wrapper's C++ object: one call per value instead of the span and offset bookkeeping
        # of ``search``. Private, so only used when present.
        self._raw: Any = getattr(compiled, "_regexp", None) if _UNANCHORED is not None else None
        self._memo: dict[str, bool] = {}

    @property
    def literals(self) -> frozenset[str] | None:
        """The strings the pattern stands for when it is a plain alternation of literals, else None
        (a store reads exactly those metrics for ``__name__=~"a|b"``)."""
        return self._literals

    def matches(self, text: str) -> bool:
        """Whether ``text`` matches the whole pattern (``^(?s:pattern)$``)."""
        if self._literals is not None:
            return text in self._literals
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        if self._raw is not None:
            data = text.encode("utf-8", "surrogatepass")
            hit = self._raw.Match(_UNANCHORED, data, 0, len(data))[0][0] >= 0
        else:
            hit = self.compiled.search(text) is not None
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
        self._memo[text] = hit
        return hit

    def match(self, text: str) -> _Match[str] | None:
        """The match with its groups (``label_replace``), or None."""
        return self.compiled.search(text)


# Bounded so that hostile queries cannot grow them: at most 512 compiled patterns (RE2 caps each
# one's automaton at 8 MiB) with 256 remembered answers each.
_MEMO_SIZE = 256
_UNANCHORED: Any = getattr(getattr(getattr(re2, "_re2", None), "RE2", None), "Anchor", None)
_UNANCHORED = getattr(_UNANCHORED, "UNANCHORED", None)
_METACHARACTERS = frozenset("\\.+*?()|[]{}^$")


def _literal_alternatives(pattern: str) -> frozenset[str] | None:
    """The strings ``a|b|c`` (or ``(a|b|c)``) stands for, if it is nothing but literal alternatives."""
    body = pattern
    if body.startswith("(") and body.endswith(")") and "(" not in body[1:] and ")" not in body[:-1]:
        body = body[1:-1]
    options = body.split("|")
    if any(_METACHARACTERS.intersection(o) for o in options):
        return None
    return frozenset(options)


@functools.lru_cache(maxsize=512)
def compile_anchored(pattern: str) -> Regex:
    """Compile a PromQL regex anchored at both ends, as Prometheus does. Raises :class:`RegexError`."""
    return Regex(pattern, compile_go(anchored(pattern)))


@functools.lru_cache(maxsize=512)
def compile_go(pattern: str) -> _Regexp[str]:
    """Go's ``regexp.Compile``: RE2, unanchored (alert templates' ``match``, ``reReplaceAll``).

    Raises :class:`RegexError` with Go's words.
    """
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        raise RegexError(_go_error(text)) from None
