"""The promqltest ``{{...}}`` histogram notation (promql/parser: histogram_series_value)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kernel_insight.kql.histogram.constants import (
    _INF,
    COUNTER_RESET,
    GAUGE_TYPE,
    NOT_COUNTER_RESET,
    UNKNOWN_COUNTER_RESET,
    HistogramError,
    HistogramNotationError,
    Span,
)
from kernel_insight.kql.histogram.float_histogram import FloatHistogram

# --- promqltest notation (promql/parser: histogram_series_value) ----------------------------

_HINTS = {
    "unknown": UNKNOWN_COUNTER_RESET,
    "reset": COUNTER_RESET,
    "not_reset": NOT_COUNTER_RESET,
    "gauge": GAUGE_TYPE,
}
_NUM_KEYS = {"sum", "count", "z_bucket", "z_bucket_w"}
_INT_KEYS = {"schema", "offset", "n_offset"}
_LIST_KEYS = {"buckets", "n_buckets", "custom_values"}
_ITEM = re.compile(r"\s*([A-Za-z_]+)\s*:\s*(\[[^\]]*\]|[^\s\]}]+)")


def _number(text: str) -> float:
    """A PromQL number: decimal, hex/octal integer, Inf/NaN in any case, with an optional sign."""
    t = text.strip()
    sign = 1.0
    if t[:1] in "+-":
        sign = -1.0 if t[0] == "-" else 1.0
        t = t[1:]
    low = t.lower()
    if low in ("inf", "infinity"):
        return sign * _INF
    if low == "nan":
        return math.nan
    try:
        return sign * float(int(t, 0))
    except ValueError:
        pass
    try:
        return sign * float(t)
    except ValueError:
        raise HistogramNotationError(f"error parsing number: {text!r}") from None


def _int(text: str, key: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise HistogramNotationError(f"error parsing {key} number: {text!r}") from None


@dataclass(slots=True)
class HistogramSeriesValue:
    """One loaded histogram sample and whether its literal set ``counter_reset_hint`` explicitly."""

    histogram: FloatHistogram
    hint_set: bool


def _parse_one(text: str) -> HistogramSeriesValue:
    t = text.strip()
    if not (t.startswith("{{") and t.endswith("}}")):
        raise HistogramNotationError(f"a histogram literal is written {{{{...}}}}, got {text!r}")
    body = t[2:-2]
    desc: dict[str, object] = {}
    pos = 0
    while pos < len(body):
        if body[pos:].strip() == "":
            break
        m = _ITEM.match(body, pos)
        if not m:
            raise HistogramNotationError(
                f"unexpected {body[pos:].strip()[:20]!r} in histogram description, "
                "expected a key such as buckets:[5 10 7]"
            )
        key, raw = m.group(1).lower(), m.group(2)
        if key in desc:
            raise HistogramNotationError(f'duplicate key "{key}" in histogram')
        if key in _INT_KEYS:
            desc[key] = _int(raw, key)
        elif key in _NUM_KEYS:
            desc[key] = _number(raw)
        elif key in _LIST_KEYS:
            if not (raw.startswith("[") and raw.endswith("]")):
                raise HistogramNotationError(f"error parsing {key} float array: {raw!r}")
            items = raw[1:-1].split()
            if not items:
                raise HistogramNotationError(f"error parsing {key} float array: empty")
            desc[key] = tuple(_number(x) for x in items)
        elif key == "counter_reset_hint":
            if raw.lower() not in _HINTS:
                raise HistogramNotationError(f"error parsing counter_reset_hint: unknown value {raw!r}")
            desc[key] = _HINTS[raw.lower()]
        else:
            raise HistogramNotationError(f"unknown histogram description key {key!r}")
        pos = m.end()

    def spans(bkey: str, okey: str) -> tuple[tuple[Span, ...], tuple[float, ...]]:
        b = desc.get(bkey, ())
        assert isinstance(b, tuple)
        off = desc.get(okey, 0)
        assert isinstance(off, int)
        return (((off, len(b)),) if b else ()), b

    ps, pb = spans("buckets", "offset")
    ns, nb = spans("n_buckets", "n_offset")
    h = FloatHistogram(
        schema=int(desc.get("schema", 0)),  # type: ignore[call-overload]
        zero_threshold=float(desc.get("z_bucket_w", 0.0)),  # type: ignore[arg-type]
        zero_count=float(desc.get("z_bucket", 0.0)),  # type: ignore[arg-type]
        count=float(desc.get("count", 0.0)),  # type: ignore[arg-type]
        sum=float(desc.get("sum", 0.0)),  # type: ignore[arg-type]
        positive_spans=ps,
        positive_buckets=pb,
        negative_spans=ns,
        negative_buckets=nb,
        counter_reset_hint=int(desc.get("counter_reset_hint", UNKNOWN_COUNTER_RESET)),  # type: ignore[call-overload]
        custom_values=desc.get("custom_values", ()),  # type: ignore[arg-type]
    )
    return HistogramSeriesValue(h, "counter_reset_hint" in desc)


def parse_histogram(text: str) -> FloatHistogram:
    """One ``{{schema:0 sum:5 count:4 buckets:[1 2 1]}}`` literal as a :class:`FloatHistogram`."""
    return _parse_one(text).histogram


def _split_literal(token: str, start: int) -> int:
    """The index just past the ``}}`` closing the literal that opens at ``start``."""
    end = token.find("}}", start + 2)
    if end < 0:
        raise HistogramNotationError(f"unterminated histogram literal in {token!r}")
    return end + 2


def expand_histogram_series(token: str) -> list[HistogramSeriesValue]:
    """One promqltest series item holding histograms, expanded to its samples.

    ``{{...}}`` is one sample, ``{{...}}xN`` is N+1 copies, ``{{a}}+{{b}}xN`` is a, a+b, ...
    (N additions) and ``{{a}}-{{b}}xN`` the same with subtraction, as promqltest loads them.
    """
    t = token.strip()
    if not t.startswith("{{"):
        raise HistogramNotationError(f"expected a histogram literal, got {token!r}")
    end = _split_literal(t, 0)
    base = _parse_one(t[:end])
    rest = t[end:]
    if not rest:
        return [base]
    m = re.fullmatch(r"x([0-9]+)", rest)
    if m:
        return [base] * (int(m.group(1)) + 1)
    if rest[0] in "+-" and rest[1:].startswith("{{"):
        inc_end = _split_literal(rest, 1)
        inc = _parse_one(rest[1:inc_end])
        m = re.fullmatch(r"x([0-9]+)", rest[inc_end:])
        if not m:
            raise HistogramNotationError(f"expected xN after {rest[:inc_end]!r} in {token!r}")
        times = int(m.group(1))
        out = [HistogramSeriesValue(base.histogram, inc.hint_set)]
        cur = base.histogram
        for _ in range(times):
            if cur.schema > inc.histogram.schema:
                raise HistogramNotationError(
                    f"error combining histograms: cannot merge from schema {inc.histogram.schema} to {cur.schema}"
                )
            try:
                r = cur.add(inc.histogram) if rest[0] == "+" else cur.sub(inc.histogram)
            except HistogramError as exc:
                raise HistogramNotationError(str(exc)) from None
            cur = r.histogram
            out.append(HistogramSeriesValue(cur, inc.hint_set))
        return out
    raise HistogramNotationError(f"unexpected {rest!r} after a histogram literal in {token!r}")
