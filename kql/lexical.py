"""Lexical helpers shared by the parser, the printer and the test runner: durations, numbers, strings."""

from __future__ import annotations

import math
import re

__all__ = [
    "BYTE_UNITS",
    "DURATION_UNITS",
    "MAX_DURATION_MS",
    "format_duration",
    "go_quote",
    "is_valid_label_name",
    "is_valid_metric_name",
    "parse_bytes",
    "parse_duration",
    "parse_number",
    "unquote",
]

#: Milliseconds per duration unit, largest first (the order a duration must use them in).
DURATION_UNITS: dict[str, int] = {
    "y": 365 * 24 * 3600 * 1000,
    "w": 7 * 24 * 3600 * 1000,
    "d": 24 * 3600 * 1000,
    "h": 3600 * 1000,
    "m": 60 * 1000,
    "s": 1000,
    "ms": 1,
}
_UNIT_ORDER = list(DURATION_UNITS)
#: The longest duration Prometheus parses (Go's time.Duration: 2^63-1 ns, about 292 years).
MAX_DURATION_MS = (2**63 - 1) // 1_000_000
_DURATION_PART = re.compile(r"([0-9]+)(ms|[smhdwy])")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def parse_duration(text: str) -> int:
    """``1h30m`` -> 5400000 ms. Units must appear largest first, each at most once.

    >>> parse_duration("1m30s500ms")
    90500
    """
    pos = 0
    total = 0
    last_unit = -1
    if not text:
        raise ValueError("empty duration string")
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        unit = _UNIT_ORDER.index(m.group(2))
        if unit <= last_unit:
            raise ValueError(f"not a valid duration string: {text!r}")
        last_unit = unit
        total += int(m.group(1)) * DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"not a valid duration string: {text!r}")
    if total > MAX_DURATION_MS:
        raise ValueError("duration out of range")
    return total


def format_duration(ms: int) -> str:
    """The canonical spelling of a duration: ``5400000`` -> ``1h30m``; ``0`` -> ``0s``.

    >>> format_duration(90500)
    '1m30s500ms'
    """
    if ms == 0:
        return "0s"
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    parts = []
    for unit, size in DURATION_UNITS.items():
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return sign + "".join(parts)


#: Byte-size units of the kql byte literals (``40GiB``), in bytes.
BYTE_UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "EB": 10**18,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "PiB": 2**50,
    "EiB": 2**60,
}
_BYTES = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTPE]i?B|B)")


def parse_bytes(text: str) -> tuple[float, str]:
    """``1.5GiB`` -> (1610612736.0, "GiB").

    >>> parse_bytes("40GiB")
    (42949672960.0, 'GiB')
    """
    m = _BYTES.fullmatch(text)
    if not m:
        raise ValueError(f"not a valid byte size: {text!r}")
    return float(m.group(1)) * BYTE_UNITS[m.group(2)], m.group(2)


def parse_number(text: str) -> float:
    """A PromQL number literal: decimal, scientific, hexadecimal, ``Inf`` or ``NaN`` (any case)."""
    low = text.lower()
    if low.startswith("0x"):
        return float(int(low, 16))
    if low == "inf":
        return math.inf
    if low == "nan":
        return math.nan
    return float(text)


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
}


def unquote(text: str) -> str:
    """The value of a quoted PromQL string (Go escapes in ``"..."``/``'...'``, raw in backquotes).

    Bytes written with ``\\x`` or octal escapes that do not form valid UTF-8 are kept as
    surrogate escapes, so they survive until a label-name check rejects them.

    >>> unquote(r'"a\\tb\\u00e9"')
    'a\\tbé'
    """
    quote, body = text[0], text[1:-1]
    if quote == "`":
        return body
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8", "surrogateescape")
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("unterminated escape sequence")
        esc = body[i + 1]
        if esc in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[esc].encode()
            i += 2
        elif esc == "x":
            digits = body[i + 2 : i + 4]
            if not re.fullmatch(r"[0-9a-fA-F]{2}", digits):
                raise ValueError(f"invalid escape sequence \\x{digits}")
            out.append(int(digits, 16))
            i += 4
        elif esc in "01234567":
            digits = body[i + 1 : i + 4]
            if not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise ValueError(f"invalid escape sequence \\{digits}")
            out.append(int(digits, 8))
            i += 4
        elif esc in "uU":
            n = 4 if esc == "u" else 8
            digits = body[i + 2 : i + 2 + n]
            if not re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", digits):
                raise ValueError(f"invalid escape sequence \\{esc}{digits}")
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise ValueError(f"invalid Unicode code point \\{esc}{digits}")
            out += chr(code).encode()
            i += 2 + n
        else:
            raise ValueError(f"unknown escape sequence \\{esc}")
    return out.decode("utf-8", "surrogateescape")


def go_quote(value: str) -> str:
    """Double-quote a string as Go's ``%q`` does (invalid UTF-8 bytes as ``\\xNN``).

    >>> print(go_quote('a"b'))
    "a\\"b"
    """
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif 0xDC80 <= code <= 0xDCFF:  # a raw byte kept by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def is_valid_label_name(name: str) -> bool:
    """Whether a label name is valid: any non-empty valid UTF-8 (Prometheus 3 allows quoted names)."""
    if not name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_legacy_label_name(name: str) -> bool:
    """Whether a label name needs no quotes: ``[a-zA-Z_][a-zA-Z0-9_]*``."""
    return _LABEL_NAME.fullmatch(name) is not None


def is_valid_metric_name(name: str) -> bool:
    """Whether a metric name needs no quotes: ``[a-zA-Z_:][a-zA-Z0-9_:]*``."""
    return _METRIC_NAME.fullmatch(name) is not None
