"""PromQL regular expressions are RE2; this compiles them with Python's ``re``.

The syntax differs in a few places users hit: RE2 allows flag groups anywhere (``a(?i)b``
scopes the flag to the rest of the enclosing group), ``(?<name>...)``, ``\\z``, ``\\Q...\\E``
and POSIX classes such as ``[[:digit:]]``. Matching is always anchored and ``.`` matches
newlines, as in Prometheus.
"""

from __future__ import annotations

import functools
import re

__all__ = ["compile_anchored", "translate"]

_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7F",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1F\\x7F",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}


def translate(pattern: str) -> str:
    """Rewrite RE2 syntax that Python's ``re`` lacks into an equivalent Python pattern."""
    out: list[str] = []
    # For each open group: the scoped-flag groups opened inside it, closed again at its end.
    pending: list[list[str]] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt == "Q":
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append(re.escape(literal))
                i = n if end < 0 else end + 2
                continue
            if nxt == "z":
                out.append("\\Z")
                i += 2
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            j, cls = _char_class(pattern, i)
            out.append(cls)
            i = j
            continue
        if ch == "(":
            m = re.match(r"\(\?([imsU-]+)\)", pattern[i:])
            if m:
                flags = m.group(1).replace("U", "")
                if flags.strip("-"):
                    out.append(f"(?{flags}:")
                    pending[-1].append(flags)
                i += m.end()
                continue
            if pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
                out.append("(?P<")
                i += 3
                pending.append([])
                continue
            out.append("(")
            pending.append([])
            i += 1
            continue
        if ch == ")":
            if len(pending) > 1:
                out.append(")" * len(pending.pop()))
            out.append(")")
            i += 1
            continue
        if ch == "|" and pending[-1]:
            # Flags stay set in the following alternatives of the same group.
            out.append(")" * len(pending[-1]) + "|" + "".join(f"(?{f}:" for f in pending[-1]))
            i += 1
            continue
        out.append(ch)
        i += 1
    out.append(")" * len(pending[0]))
    return "".join(out)


def _char_class(pattern: str, start: int) -> tuple[int, str]:
    i = start + 1
    body: list[str] = []
    if pattern[i : i + 1] == "^":
        body.append("^")
        i += 1
    if pattern[i : i + 1] == "]":
        body.append("\\]")
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        m = re.match(r"\[:(\^?)(\w+):\]", pattern[i:])
        if m and m.group(2) in _POSIX:
            if m.group(1):
                raise re.error(f"negated POSIX class [:^{m.group(2)}:] is not supported")
            body.append(_POSIX[m.group(2)])
            i += m.end()
            continue
        if pattern[i] == "\\":
            body.append(pattern[i : i + 2])
            i += 2
            continue
        if pattern[i] == "[":
            body.append("\\[")
            i += 1
            continue
        body.append(pattern[i])
        i += 1
    return i + 1, "[" + "".join(body) + "]"


@functools.lru_cache(maxsize=4096)
def compile_anchored(pattern: str) -> re.Pattern[str]:
    """Compile a PromQL regex; use ``fullmatch`` (PromQL anchors both ends). Raises ``re.error``."""
    return re.compile(f"(?s:{translate(pattern)})")
