"""Parse Prometheus text exposition and OpenMetrics text, timestamps included, for backfill (`ki import`).

Errors name the line and column (``line 3, column 14: ...``), because these files are
written by people and by scripts, and "invalid input" helps neither.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from kernel_insight.collector.rows import MAX_TS_MS, MIN_TS_MS, SampleBatch, SampleBuilder, canonical_labels

__all__ = ["Exposition", "MetricMeta", "OpenMetricsError", "parse_exposition"]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_FLOAT_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf(?:inity)?)|(?i:nan))")
_INT_RE = re.compile(r"[+-]?\d+")
_WS_RE = re.compile(r"[ \t]+")
_FAST_RE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?)[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*$'
)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TYPES = {
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "untyped",
    "unknown",
}


class OpenMetricsError(ValueError):
    """Malformed exposition text; ``line`` and ``column`` are 1-based."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column
        self.message = message


@dataclass(slots=True)
class MetricMeta:
    type: str = "unknown"
    help: str = ""
    unit: str = ""


@dataclass(slots=True)
class Exposition:
    samples: SampleBatch
    metadata: dict[str, MetricMeta] = field(default_factory=dict)
    format: str = "prometheus"  # or "openmetrics"
    defaulted_timestamps: int = 0  # samples that had no timestamp and got the default


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), text)


class _Line:
    __slots__ = ("no", "pos", "text")

    def __init__(self, no: int, text: str) -> None:
        self.no = no
        self.text = text
        self.pos = 0

    def fail(self, message: str, pos: int | None = None) -> OpenMetricsError:
        return OpenMetricsError(self.no, (self.pos if pos is None else pos) + 1, message)

    def match(self, pattern: re.Pattern[str]) -> str | None:
        m = pattern.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(0)

    def expect(self, char: str) -> None:
        if not self.text.startswith(char, self.pos):
            got = repr(self.text[self.pos]) if self.pos < len(self.text) else "end of line"
            raise self.fail(f"expected {char!r}, got {got}")
        self.pos += len(char)

    def skip_ws(self) -> bool:
        return self.match(_WS_RE) is not None

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def quoted(self) -> str:
        start = self.pos
        m = _QUOTED_RE.match(self.text, self.pos)
        if m is None:
            raise self.fail("unterminated or invalid quoted string", start)
        self.pos = m.end()
        return _unescape(m.group(1))


def _labels(ln: _Line, name: str | None) -> tuple[str | None, list[tuple[str, str]]]:
    """Parse ``{...}``; a bare quoted string is the metric name (Prometheus 3 UTF-8 names)."""
    ln.expect("{")
    labels: list[tuple[str, str]] = []
    seen: set[str] = set()
    while True:
        ln.skip_ws()
        if ln.text.startswith("}", ln.pos):
            ln.pos += 1
            return name, labels
        start = ln.pos
        if ln.text.startswith('"', ln.pos):
            key = ln.quoted()
            ln.skip_ws()
            if ln.text.startswith((",", "}"), ln.pos):
                if name is not None:
                    raise ln.fail("the metric name is given twice", start)
                name = key
                if ln.text.startswith(",", ln.pos):
                    ln.pos += 1
                continue
        else:
            got = ln.match(_LABEL_NAME_RE)
            if got is None:
                raise ln.fail("expected a label name")
            key = got
            ln.skip_ws()
        ln.expect("=")
        ln.skip_ws()
        if not ln.text.startswith('"', ln.pos):
            raise ln.fail("expected a quoted label value")
        value = ln.quoted()
        if key in seen or key == "__name__":
            raise ln.fail(f"label {key!r} appears twice", start)
        seen.add(key)
        labels.append((key, value))
        ln.skip_ws()
        if ln.text.startswith(",", ln.pos):
            ln.pos += 1
        elif not ln.text.startswith("}", ln.pos):
            raise ln.fail("expected ',' or '}' after a label")


def _float(ln: _Line, what: str) -> float:
    start = ln.pos
    text = ln.match(_FLOAT_RE)
    if text is None or (not ln.at_end() and ln.text[ln.pos] not in " \t"):
        raise ln.fail(f"invalid {what}", start)
    return float(text)


def parse_exposition(
    text: str, *, default_timestamp_ms: int | None = None, format: str = "auto"
) -> Exposition:
    """Samples of every line; a sample without a timestamp gets ``default_timestamp_ms`` or is an error.

    ``format="auto"`` reads OpenMetrics (timestamps in seconds) when the text ends with ``# EOF``,
    else Prometheus text (timestamps in milliseconds).
    """
    if format not in ("auto", "prometheus", "openmetrics"):
        raise ValueError(f"unknown format {format!r}: use auto, prometheus or openmetrics")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if format == "auto":
        format = "openmetrics" if lines and lines[-1].rstrip("\r") == "# EOF" else "prometheus"
    om = format == "openmetrics"
    out = SampleBuilder()
    meta: dict[str, MetricMeta] = {}
    defaulted = 0
    eof_seen = False
    # Each distinct series text is parsed (and checked) once; later lines of the same series only
    # need their value and timestamp checked, which makes big backfills several times faster.
    known: dict[str, tuple[tuple[str, str], ...]] = {}
    ts_re = _FLOAT_RE if om else _INT_RE
    for no, raw in enumerate(lines, start=1):
        text = raw[:-1] if raw.endswith("\r") else raw
        fast = None if eof_seen else _FAST_RE.match(text)
        if fast is not None:
            series = known.get(fast.group(1))
            v, t = fast.group(2), fast.group(3)
            if series is not None and _FLOAT_RE.fullmatch(v) and t is not None and ts_re.fullmatch(t):
                t_num = float(t) if om else int(t)
                if math.isfinite(t_num):
                    ts_fast = round(t_num * 1000) if om else int(t_num)
                    if MIN_TS_MS <= ts_fast <= MAX_TS_MS:
                        out.add(series, ts_fast, float(v))
                        continue
        ln = _Line(no, text)
        if eof_seen:
            raise ln.fail("text after '# EOF'", 0)
        if ln.text.strip() == "":
            continue
        if ln.text.startswith("#"):
            eof_seen = _comment(ln, meta, om)
            continue
        name = ln.match(_NAME_RE)
        labels: list[tuple[str, str]] = []
        if ln.text.startswith("{", ln.pos):
            name, labels = _labels(ln, name)
        if name is None:
            raise ln.fail("expected a metric name")
        if not ln.skip_ws():
            raise ln.fail("expected whitespace before the value")
        value = _float(ln, "value")
        ts_ms: int | None = None
        ln.skip_ws()
        if not ln.at_end() and not ln.text.startswith("#", ln.pos):
            start = ln.pos
            if om:
                seconds = _float(ln, "timestamp")
                if not math.isfinite(seconds):
                    raise ln.fail("the timestamp must be finite", start)
                ts_ms = round(seconds * 1000)
            else:
                got = ln.match(_INT_RE)
                if got is None or (not ln.at_end() and ln.text[ln.pos] not in " \t"):
                    raise ln.fail("invalid timestamp (Prometheus text wants integer milliseconds)", start)
                ts_ms = int(got)
            ln.skip_ws()
        if not ln.at_end() and not (om and ln.text.startswith("# ", ln.pos)):
            raise ln.fail("unexpected text after the sample")  # OpenMetrics exemplars are ignored
        if ts_ms is not None and not MIN_TS_MS <= ts_ms <= MAX_TS_MS:
            raise ln.fail(f"timestamp {ts_ms} ms is outside 1970-01-01 .. 2149-06-06", 0)
        if ts_ms is None:
            if default_timestamp_ms is None:
                raise ln.fail("the sample has no timestamp", 0)
            ts_ms = default_timestamp_ms
            defaulted += 1
        try:
            canonical = canonical_labels([("__name__", name), *labels])
        except ValueError as exc:
            raise ln.fail(str(exc), 0) from None
        if fast is not None:
            known[fast.group(1)] = canonical
        out.add(canonical, ts_ms, value)
    if om and not eof_seen:
        raise OpenMetricsError(max(len(lines), 1), 1, "OpenMetrics text must end with '# EOF'")
    return Exposition(out.build(), meta, format, defaulted)


def _comment(ln: _Line, meta: dict[str, MetricMeta], om: bool) -> bool:
    """Handle a ``#`` line; returns True for ``# EOF``."""
    parts = ln.text.split(None, 3)
    if ln.text.rstrip() == "# EOF":
        return True
    if len(parts) < 2 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE", "UNIT"):
        if om:
            raise ln.fail("OpenMetrics allows only # HELP, # TYPE, # UNIT and # EOF comments", 0)
        return False  # a plain comment
    if len(parts) < 3 or not _NAME_RE.fullmatch(parts[2]):
        raise ln.fail(f"# {parts[1]} needs a metric name", 0)
    entry = meta.setdefault(parts[2], MetricMeta())
    rest = parts[3] if len(parts) > 3 else ""
    if parts[1] == "TYPE":
        if rest.strip() not in _TYPES:
            raise ln.fail(f"unknown metric type {rest.strip()!r}", 0)
        entry.type = rest.strip()
    elif parts[1] == "HELP":
        entry.help = _unescape(rest)
    else:
        entry.unit = rest.strip()
    return False
