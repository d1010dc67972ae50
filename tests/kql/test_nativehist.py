"""The native-histogram value type and its math (kql/histogram/), against Prometheus' own cases.

Cases marked "Go:" are ported from prometheus/prometheus (commit d15adb9ad7):
model/histogram/float_histogram_test.go, promql/parser/parse_test.go and promql/quantile.go's
documented behaviour; the expected values are Prometheus', not recomputed here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel_insight.kql.gocompat import go_float
from kernel_insight.kql.histogram import (
    CUSTOM_BUCKETS_SCHEMA,
    GAUGE_TYPE,
    NOT_COUNTER_RESET,
    FloatHistogram,
    HistogramError,
    HistogramMean,
    HistogramNotationError,
    HistogramSum,
    expand_histogram_series,
    get_bound,
    go_exp2,
    go_log2,
    histogram_avg,
    histogram_fraction,
    histogram_quantile,
    histogram_stddev,
    histogram_stdvar,
    parse_histogram,
)
from kernel_insight.kql.promqltest import same_histogram, same_value

FH = FloatHistogram


# --- String() (Go: TestFloatHistogramString) -------------------------------------------------


def test_string_of_an_exponential_histogram_matches_prometheus() -> None:
    h = FH(
        schema=1,
        zero_threshold=0.01,
        zero_count=5.5,
        count=3493.3,
        sum=2349209.324,
        positive_spans=((-2, 1), (2, 3)),
        positive_buckets=(1, 3.3, 4.2, 0.1),
        negative_spans=((3, 2), (3, 2)),
        negative_buckets=(3.1, 3, 1.234e5, 1000),
    )
    assert str(h) == (
        "{count:3493.3, sum:2.349209324e+06, [-22.62741699796952,-16):1000, [-16,-11.31370849898476):123400, "
        "[-4,-2.82842712474619):3, [-2.82842712474619,-2):3.1, [-0.01,0.01]:5.5, (0.35355339059327373,0.5]:1, "
        "(1,1.414213562373095]:3.3, (1.414213562373095,2]:4.2, (2,2.82842712474619]:0.1}"
    )


def test_string_of_a_custom_buckets_histogram_matches_prometheus() -> None:
    h = FH(
        schema=CUSTOM_BUCKETS_SCHEMA,
        count=3493.3,
        sum=2349209.324,
        positive_spans=((0, 1), (2, 4)),
        positive_buckets=(1, 3.3, 4.2, 0.1, 5),
        custom_values=(1, 2, 5, 10, 15, 20),
    )
    assert (
        str(h)
        == "{count:3493.3, sum:2.349209324e+06, [-Inf,1]:1, (5,10]:3.3, (10,15]:4.2, (15,20]:0.1, (20,+Inf]:5}"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e6, "1e+06"),
        (123456.7, "123456.7"),
        (100000.0, "100000"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (3.0, "3"),
        (-2.5e-7, "-2.5e-07"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_floats_print_as_go_percent_g(value: float, text: str) -> None:
    assert go_float(value) == text


# --- bounds (Go: generic_test.go TestGetBound, the published bucket boundaries) ---------------


@pytest.mark.parametrize(
    ("idx", "schema", "bound"),
    [
        (0, 0, 1.0),
        (1, 0, 2.0),
        (-1, 0, 0.5),
        (1, 1, 1.414213562373095),  # as in Go String(): (1,1.414213562373095]
        (1, 3, 1.0905077326652577),
        (2, 2, 1.414213562373095),
        (1, -1, 4.0),
        (1, -2, 16.0),
        (1024, 0, 1.7976931348623157e308),  # the last finite bucket ends at MaxFloat64
        (1025, 0, math.inf),
        (256, -2, 1.7976931348623157e308),
        (8192, 3, 1.7976931348623157e308),
    ],
)
def test_exponential_bucket_bounds(idx: int, schema: int, bound: float) -> None:
    assert get_bound(idx, schema) == bound


def test_custom_bucket_bounds_end_in_infinities() -> None:
    assert get_bound(-1, CUSTOM_BUCKETS_SCHEMA, (1.0, 2.0)) == -math.inf
    assert get_bound(1, CUSTOM_BUCKETS_SCHEMA, (1.0, 2.0)) == 2.0
    assert get_bound(2, CUSTOM_BUCKETS_SCHEMA, (1.0, 2.0)) == math.inf
    with pytest.raises(HistogramError):
        get_bound(3, CUSTOM_BUCKETS_SCHEMA, (1.0, 2.0))


# --- from_deltas ----------------------------------------------------------------------------


def test_from_deltas_turns_integer_deltas_into_absolute_counts() -> None:
    h = FH.from_deltas(
        3, 1e-128, 2, 12, 4.5, [(-1, 2), (3, 2)], [1, 2, -1, 0], [(0, 1)], [3], NOT_COUNTER_RESET
    )
    assert h.positive_buckets == (1.0, 3.0, 2.0, 2.0)
    assert h.negative_buckets == (3.0,)
    assert h.positive_spans == ((-1, 2), (3, 2))
    assert h.counter_reset_hint == NOT_COUNTER_RESET
    assert h.count == 12.0
    assert h.zero_count == 2.0
    assert h.zero_threshold == 1e-128


# --- equals (Go: TestFloatHistogramEquals) --------------------------------------------------


def _h1() -> FloatHistogram:
    return FH(
        schema=3,
        sum=2.7,
        zero_threshold=0.1,
        zero_count=1.7,
        count=9.2,
        positive_spans=((0, 2), (2, 1), (3, 2), (3, 1), (1, 1)),
        positive_buckets=(1, 2, 1, 1, 1, 1, 1),
        negative_spans=((0, 2), (2, 1), (3, 2), (3, 1), (1, 1)),
        negative_buckets=(1, 2, 1, 1, 1, 1, 1),
    )


def test_equals_compares_layout_and_bits() -> None:
    h1 = _h1()
    assert h1.equals(h1.copy())
    # Empty spans in between describe the same layout.
    h2 = h1.copy(positive_spans=((0, 2), (2, 1), (0, 0), (3, 2), (3, 1), (1, 1)))
    assert h1.equals(h2)
    assert not h1.equals(h1.copy(sum=2.8))
    assert not h1.equals(h1.copy(positive_buckets=(1, 2, 1, 1, 1, 1, 2)))
    assert not h1.equals(h1.copy(schema=2))
    assert not h1.equals(h1.copy(zero_threshold=0.2))
    # An extra (even empty) bucket is a different layout.
    assert not h1.equals(
        h1.copy(
            positive_spans=((0, 3), (1, 1), (3, 2), (3, 1), (1, 1)), positive_buckets=(1, 2, 0, 1, 1, 1, 1, 1)
        )
    )
    # NaN sums are equal by bits; a staleness marker is not a plain NaN.
    nan = h1.copy(sum=math.nan)
    assert nan.equals(nan.copy())
    assert not h1.equals(None)


def test_equals_compares_custom_values() -> None:
    h = FH(
        schema=CUSTOM_BUCKETS_SCHEMA,
        count=2,
        sum=1,
        positive_spans=((0, 2),),
        positive_buckets=(1, 1),
        custom_values=(1.0, 2.0),
    )
    assert h.equals(h.copy())
    assert not h.equals(h.copy(custom_values=(1.0, 3.0)))


# --- scalar arithmetic (Go: TestFloatHistogramMul, TestFloatHistogramDiv) --------------------


def test_mul_scales_everything_and_negative_factors_make_gauges() -> None:
    h = FH(
        schema=0,
        zero_threshold=0.01,
        zero_count=11,
        count=30,
        sum=23,
        positive_spans=((-2, 2), (1, 3)),
        positive_buckets=(1, 0, 3, 4, 7),
        negative_spans=((3, 2), (3, 2)),
        negative_buckets=(3, 1, 5, 6),
    )
    m = h.mul(3)
    assert m.equals(
        FH(
            schema=0,
            zero_threshold=0.01,
            zero_count=33,
            count=90,
            sum=69,
            positive_spans=((-2, 2), (1, 3)),
            positive_buckets=(3, 0, 9, 12, 21),
            negative_spans=((3, 2), (3, 2)),
            negative_buckets=(9, 3, 15, 18),
        )
    )
    assert m.counter_reset_hint == 0
    assert h.mul(-1).counter_reset_hint == GAUGE_TYPE
    assert h.positive_buckets == (1, 0, 3, 4, 7)  # the receiver is untouched


def test_div_by_zero_gives_infinities_and_drops_buckets() -> None:
    h = FH(
        schema=0,
        zero_threshold=0.01,
        zero_count=5.5,
        count=3493.3,
        sum=2349209.324,
        positive_spans=((-2, 1), (2, 3)),
        positive_buckets=(1, 3.3, 4.2, 0.1),
        negative_spans=((3, 2), (3, 2)),
        negative_buckets=(3.1, 3, 1.234e5, 1000),
    )
    d = h.div(0)
    assert d.count == math.inf
    assert d.sum == math.inf
    assert d.zero_count == math.inf
    assert d.positive_buckets == ()
    assert d.negative_spans == ()
    assert FH(count=0).div(0).count != FH(count=0).div(0).count  # 0/0 is NaN
    half = h.div(2)
    assert half.positive_buckets == (0.5, 1.65, 2.1, 0.05)
    assert h.div(-1).counter_reset_hint == GAUGE_TYPE


# --- the promqltest notation (Go: promql/parser/parse_test.go series cases) ------------------


def test_parse_a_full_histogram_description() -> None:
    h = parse_histogram(
        "{{schema:1 sum:-0.3 count:3.1 z_bucket:7.1 z_bucket_w:0.05 buckets:[5.1 10 7] offset:-3 "
        "n_buckets:[4.1 5] n_offset:-5 counter_reset_hint:gauge}}"
    )
    assert h == FH(
        schema=1,
        zero_threshold=0.05,
        zero_count=7.1,
        count=3.1,
        sum=-0.3,
        positive_spans=((-3, 3),),
        positive_buckets=(5.1, 10, 7),
        negative_spans=((-5, 2),),
        negative_buckets=(4.1, 5),
        counter_reset_hint=GAUGE_TYPE,
    )


def test_parse_custom_values_and_empty_histogram() -> None:
    h = parse_histogram("{{schema:-53 sum:1 count:2 custom_values:[0.1 0.2] buckets:[1 1]}}")
    assert h.custom_values == (0.1, 0.2)
    assert h.uses_custom_buckets()
    assert parse_histogram("{{}}") == FH()
    assert parse_histogram("{{ }}") == FH()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{schema:1 schema:2}}", 'duplicate key "schema"'),
        ("{{buckets:[1 2}}", "buckets"),
        ("{{foo:1}}", "unknown histogram description key"),
        ("{{counter_reset_hint:maybe}}", "counter_reset_hint"),
        ("{{sum:abc}}", "error parsing number"),
        ("{{schema:1.5}}", "schema"),
    ],
)
def test_bad_histogram_literals_are_rejected_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(HistogramNotationError, match=message):
        parse_histogram(text)


def test_series_repeat_form_gives_n_plus_one_samples() -> None:
    out = expand_histogram_series("{{schema:1 sum:1 count:1 buckets:[1]}}x3")
    assert len(out) == 4
    assert all(v.histogram == out[0].histogram for v in out)
    assert not out[0].hint_set


def test_series_increment_form_adds_the_increment_each_step() -> None:
    # Go parse_test.go: `{{schema:1 sum:-0.3 count:3 buckets:[1 2 1] offset:1}}+{{schema:1 sum:0.3 ...}}x2`.
    out = expand_histogram_series(
        "{{sum:1 count:1 buckets:[1] counter_reset_hint:gauge}}+{{sum:2 count:2 buckets:[1 1] offset:-1}}x2"
    )
    assert [v.histogram.count for v in out] == [1.0, 3.0, 5.0]
    assert [v.histogram.sum for v in out] == [1.0, 3.0, 5.0]
    assert out[2].histogram.positive_spans == ((-1, 2),)
    assert out[2].histogram.positive_buckets == (2.0, 3.0)


def test_series_decrement_form_subtracts() -> None:
    out = expand_histogram_series("{{sum:10 count:10 buckets:[5 5]}}-{{sum:1 count:2 buckets:[1 1]}}x2")
    assert [v.histogram.count for v in out] == [10.0, 8.0, 6.0]
    assert out[2].histogram.positive_buckets == (3.0, 3.0)


def test_series_increment_with_a_finer_schema_is_refused() -> None:
    with pytest.raises(HistogramNotationError, match="cannot merge from schema"):
        expand_histogram_series("{{schema:1 count:1 buckets:[1]}}+{{schema:0 count:1 buckets:[1]}}x1")


def test_test_expression_round_trips_through_the_parser() -> None:
    h = parse_histogram(
        "{{schema:2 count:7 sum:5.5 z_bucket:1 z_bucket_w:0.001 buckets:[1 0 2] offset:-2 "
        "n_buckets:[3] counter_reset_hint:not_reset}}"
    )
    text = h.test_expression()
    assert text == (
        "{{schema:2 count:7 sum:5.5 z_bucket:1 z_bucket_w:0.001 counter_reset_hint:not_reset "
        "offset:-2 buckets:[1 0 2] n_buckets:[3]}}"
    )
    assert parse_histogram(text).equals(h)


# --- Prometheus' own tables (tests/fixtures/nativehist/prometheus_cases.json) ---------------
# Extracted by tests/fixtures/nativehist/extract_go_cases.py from float_histogram_test.go; each
# case runs as Go runs it (Add/Sub in both orders, results compared after Compact(0)).

_CASES = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "nativehist" / "prometheus_cases.json").read_text()
)


def _span(s: Any) -> tuple[int, int]:
    if isinstance(s, dict):
        return int(s.get("Offset", 0)), int(s.get("Length", 0))
    return int(s[0]), int(s[1])


def _fh(d: dict[str, Any] | None) -> FloatHistogram | None:
    if d is None:
        return None
    return FH(
        schema=int(d.get("Schema", 0)),
        zero_threshold=float(d.get("ZeroThreshold", 0.0)),
        zero_count=float(d.get("ZeroCount", 0.0)),
        count=float(d.get("Count", 0.0)),
        sum=float(d.get("Sum", 0.0)),
        positive_spans=tuple(_span(s) for s in d.get("PositiveSpans") or ()),
        positive_buckets=tuple(float(x) for x in d.get("PositiveBuckets") or ()),
        negative_spans=tuple(_span(s) for s in d.get("NegativeSpans") or ()),
        negative_buckets=tuple(float(x) for x in d.get("NegativeBuckets") or ()),
        counter_reset_hint=int(d.get("CounterResetHint", 0)),
        custom_values=tuple(float(x) for x in d.get("CustomValues") or ()),
    )


def _same(a: FloatHistogram, b: FloatHistogram) -> bool:
    """Go's require.Equal on two FloatHistograms: every field, spans exactly (NaN never equal)."""
    return (
        a.schema == b.schema
        and a.zero_threshold == b.zero_threshold
        and a.zero_count == b.zero_count
        and a.count == b.count
        and a.sum == b.sum
        and a.positive_spans == b.positive_spans
        and a.positive_buckets == b.positive_buckets
        and a.negative_spans == b.negative_spans
        and a.negative_buckets == b.negative_buckets
        and a.counter_reset_hint == b.counter_reset_hint
        and a.custom_values == b.custom_values
    )


def _table(name: str) -> list[Any]:
    return [pytest.param(c, id=c["name"]) for c in _CASES[name]]


@pytest.mark.parametrize("case", _table("TestFloatHistogramMul"))
def test_go_mul_table(case: dict[str, Any]) -> None:
    got = _fh(case["in"]).mul(case["scale"])  # type: ignore[union-attr]
    assert _same(got, _fh(case["expected"])), str(got)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", _table("TestFloatHistogramDiv"))
def test_go_div_table(case: dict[str, Any]) -> None:
    got = _fh(case["fh"]).div(case["s"])  # type: ignore[union-attr]
    exp = _fh(case.get("expected"))
    assert exp is not None
    if any(math.isnan(x) for x in (exp.count, exp.sum, exp.zero_count)):
        assert got.equals(exp)  # bit-equal NaNs, as Go's require.Equal on the fields' bits
    else:
        assert _same(got, exp), str(got)


@pytest.mark.parametrize("case", _table("TestFloatHistogramDetectReset"))
def test_go_detect_reset_table(case: dict[str, Any]) -> None:
    cur, prev = _fh(case["current"]), _fh(case["previous"])
    assert cur is not None
    assert prev is not None
    assert cur.detect_reset(prev) is case["resetExpected"]


@pytest.mark.parametrize("case", _table("TestFloatHistogramCompact"))
def test_go_compact_table(case: dict[str, Any]) -> None:
    got = _fh(case["in"]).compact(int(case["maxEmptyBuckets"]))  # type: ignore[union-attr]
    exp = _fh(case.get("expected"))
    assert exp is not None
    assert _same(got, exp), (
        f"{got.positive_spans} {got.positive_buckets} / {got.negative_spans} {got.negative_buckets}"
    )


def _check_op(case: dict[str, Any], a: FloatHistogram, b: FloatHistogram, subtract: bool) -> None:
    if case.get("expErrMsg"):
        with pytest.raises(HistogramError, match=re.escape(case["expErrMsg"])):
            a.sub(b) if subtract else a.add(b)
        return
    before = b.copy()
    res = a.sub(b) if subtract else a.add(b)
    assert res.counter_reset_collision is bool(case.get("expCounterResetCollision"))
    assert res.nhcb_bounds_reconciled is bool(case.get("expNHCBBoundsReconciled"))
    assert _same(b, before)
    exp = _fh(case.get("expected"))
    if exp is not None:
        got = res.histogram.compact(0)
        assert _same(got, exp.compact(0)), str(got)


@pytest.mark.parametrize("case", _table("TestFloatHistogramAdd"))
def test_go_add_table(case: dict[str, Any]) -> None:
    a, b = _fh(case["in1"]), _fh(case["in2"])
    assert a is not None
    assert b is not None
    _check_op(case, a, b, subtract=False)
    _check_op(case, b, a, subtract=False)


@pytest.mark.parametrize("case", _table("TestFloatHistogramSub"))
def test_go_sub_table(case: dict[str, Any]) -> None:
    a, b = _fh(case["in1"]), _fh(case["in2"])
    assert a is not None
    assert b is not None
    _check_op(case, a, b, subtract=True)


@pytest.mark.parametrize("case", _table("TestFloatHistogramCopyToSchema"))
def test_go_copy_to_schema_table(case: dict[str, Any]) -> None:
    got = _fh(case["in"]).copy_to_schema(int(case["targetSchema"]))  # type: ignore[union-attr]
    assert _same(got, _fh(case["expected"])), str(got)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", _table("TestFloatHistogramReduceResolution"))
def test_go_reduce_resolution_table(case: dict[str, Any]) -> None:
    origin = _fh(case["origin"])
    assert origin is not None
    if case.get("errorMsg"):
        with pytest.raises(HistogramError, match=re.escape(case["errorMsg"])):
            origin.reduce_resolution(int(case["targetSchema"]))
        return
    got = origin.reduce_resolution(int(case["targetSchema"]))
    assert _same(got, _fh(case["target"])), str(got)  # type: ignore[arg-type]


# --- Prometheus' native_histograms.test, the math-only cases ---------------------------------
# tests/fixtures/nativehist/native_histograms.test (Prometheus' promqltest file). Every instant
# eval of histogram_{quantile,fraction,stddev,stdvar,avg,count,sum} applied directly to a loaded
# histogram series is computed with kql.histogram and compared as promqltest compares (relative
# epsilon 1e-6); the engine-level cases (rate, sum, ...) belong to kql's promqltest runner.

_NH_TEST = Path(__file__).parents[1] / "fixtures" / "nativehist" / "native_histograms.test"
_FUNC_CALL = re.compile(
    r"^(histogram_quantile|histogram_fraction|histogram_stddev|histogram_stdvar|histogram_avg|histogram_count"
    r"|histogram_sum)\((?:\s*([-+]?[\w.]+)\s*,)?(?:\s*([-+]?[\w.]+)\s*,)?\s*([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s*\)$"
)
_TRIM = re.compile(
    r"^(?:(histogram_\w+)\()?\s*([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s*([<>]/)\s*([-+\w.]+)\s*(\)?)$"
)
_AGG = re.compile(r"^(sum|avg)\(([a-zA-Z_:][\w:]*)\)$")
_OVER_TIME = re.compile(r"^(sum|avg)_over_time\(([a-zA-Z_:][\w:]*)\[(\w+):(\w+)\]\)$")
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _ms(text: str) -> int:
    return sum(int(n) * _UNIT_MS[u] for n, u in _DURATION.findall(text))


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', text or ""))


def _scalar(tok: str) -> float:
    return float(tok.replace("Inf", "inf").replace("NaN", "nan"))


def _nh_cases() -> list[Any]:
    """(line, query, t_ms, {labels: histogram or None}, {labels: expected}) for each math-only eval."""
    from kernel_insight.kql.promqltest import _split_values

    lines = _NH_TEST.read_text().splitlines()
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, FloatHistogram | None]]] = {}
    out: list[Any] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line == "clear":
            series = {}
        elif line.startswith("load "):
            step = _ms(line.split()[1])
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                m = re.match(r"\s*([a-zA-Z_:][\w:]*)?(\{[^}]*\})?\s+(.*)$", lines[i])
                assert m is not None
                key = (m.group(1) or "", tuple(sorted(_labels(m.group(2) or "").items())))
                samples: list[tuple[int, FloatHistogram | None]] = []
                t = 0
                for tok in _split_values(m.group(3)):
                    if tok.startswith("{{"):
                        for v in expand_histogram_series(tok):
                            samples.append((t, v.histogram))
                            t += step
                    elif re.fullmatch(r"_x(\d+)", tok):
                        t += step * int(tok[2:])
                    elif tok == "_":
                        t += step
                    else:
                        samples.append((t, None))  # a float (or stale) sample: not this test's business
                        t += step
                series[key] = samples
                i += 1
            continue
        elif line.startswith("eval instant at "):
            m = re.match(r"eval instant at (\S+) (.*)$", line)
            assert m is not None
            t_ms, query = _ms(m.group(1)), m.group(2).strip()
            block: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].startswith((" ", "\t")) and lines[j].strip():
                block.append(lines[j].strip())
                j += 1
            agg, over = _AGG.match(query), _OVER_TIME.match(query)
            if agg or over:
                out.extend(_aggregation_case(i, query, t_ms, series, block, agg, over))
                i = j
                continue
            call = _FUNC_CALL.match(query)
            trim_call = _TRIM.match(query)
            trim: tuple[str, str] | None = None
            if trim_call and bool(trim_call.group(1)) == bool(trim_call.group(6)):
                name, metric, matchers, op, rhs, _ = trim_call.groups()
                a1 = a2 = None
                trim = (op, rhs)
            elif call:
                name, a1, a2, metric, matchers = call.groups()
            if call or trim:
                want = _labels(matchers or "")
                inputs: dict[str, FloatHistogram | None] = {}
                floats = False
                for (mname, items), samples in series.items():
                    labels = dict(items)
                    if mname != metric or any(labels.get(k) != v for k, v in want.items()):
                        continue
                    live = [(ts, h) for ts, h in samples if t_ms - 300_000 < ts <= t_ms]
                    if live:
                        inputs[repr(sorted(labels.items()))] = live[-1][1]
                    floats = floats or any(h is None for _, h in samples)
                expected: dict[str, str] = {}
                info: bool | str | None = None  # True: some info, a str: that info's text, False: none
                for b in block:
                    if b.startswith("expect info msg:"):
                        info = b.split("PromQL info: ", 1)[1].split(" for metric name")[0]
                    elif b.startswith("expect info"):
                        info = True
                    elif b.startswith("expect no_info"):
                        info = False
                    if b.startswith("expect"):
                        continue
                    em = re.match(r"([a-zA-Z_:][\w:]*)?(\{[^}]*\})?\s+(.+)$", b)
                    if em:
                        expected[repr(sorted(_labels(em.group(2) or "").items()))] = em.group(3).strip()
                if not floats:  # classic (float) buckets are kql's histogram.py, not this module
                    out.append(
                        pytest.param(
                            name, a1, a2, trim, inputs, expected, info, id=f"line{i + 1 - 3}:{query}"
                        )
                    )
            i = j
            continue
        i += 1
    return out


def _latest(samples: list[tuple[int, FloatHistogram | None]], t_ms: int) -> FloatHistogram | None:
    live = [h for ts, h in samples if t_ms - 300_000 < ts <= t_ms]
    return live[-1] if live else None


def _aggregation_case(
    line: int, query: str, t_ms: int, series: Any, block: list[str], agg: Any, over: Any
) -> list[Any]:
    """sum/avg over the series at ``t_ms`` (label order, as Prometheus reads them), or
    sum/avg_over_time of a subquery's steps; only when every input is a histogram."""
    op, metric = (agg or over).group(1), (agg or over).group(2)
    hs: list[FloatHistogram | None] = []
    for (mname, _), samples in sorted(series.items(), key=lambda kv: kv[0][1]):
        if mname != metric:
            continue
        if agg:
            hs.append(_latest(samples, t_ms))
        else:
            rng, step = _ms(over.group(3)), _ms(over.group(4))
            first = (t_ms - rng) // step * step + step
            hs.extend(_latest(samples, t) for t in range(first, t_ms + 1, step))
    results = [b for b in block if not b.startswith("expect")]
    if not hs or any(h is None for h in hs) or len(results) != 1 or not results[0].startswith("{} {{"):
        return []
    return [
        pytest.param(
            op, None, None, None, {"[]": hs}, {"[]": results[0][3:]}, None, id=f"line{line - 2}:{query}"
        )
    ]


def _apply(
    name: str | None, a1: str | None, a2: str | None, trim: tuple[str, str] | None, h: FloatHistogram
) -> float | FloatHistogram:
    if trim is not None:
        h = h.trim_buckets(_scalar(trim[1]), trim[0] == "</")
    if name is None:
        return h
    if name == "histogram_quantile":
        return histogram_quantile(_scalar(a1 or ""), h)[0]
    if name == "histogram_fraction":
        return histogram_fraction(_scalar(a1 or ""), _scalar(a2 or ""), h)[0]
    if name == "histogram_count":
        return h.count
    if name == "histogram_sum":
        return h.sum
    return {
        "histogram_stddev": histogram_stddev,
        "histogram_stdvar": histogram_stdvar,
        "histogram_avg": histogram_avg,
    }[name](h)


def _notes(name: str, a1: str | None, a2: str | None, h: FloatHistogram) -> list[str]:
    if name == "histogram_quantile":
        return histogram_quantile(_scalar(a1 or ""), h)[1]
    return histogram_fraction(_scalar(a1 or ""), _scalar(a2 or ""), h)[1]


_NH = _nh_cases()


def test_enough_math_only_cases_are_found() -> None:
    assert len(_NH) >= 100


@pytest.mark.parametrize(("name", "a1", "a2", "trim", "inputs", "expected", "info"), _NH)
def test_prometheus_native_histograms_test_math(
    name: str | None,
    a1: str | None,
    a2: str | None,
    trim: tuple[str, str] | None,
    inputs: dict[str, FloatHistogram | None],
    expected: dict[str, str],
    info: bool | str | None,
) -> None:
    if name in ("sum", "avg"):
        (hs,) = inputs.values()
        assert isinstance(hs, list)
        acc = HistogramSum(hs[0]) if name == "sum" else HistogramMean(hs[0])
        for h in hs[1:]:
            acc.add(h)
        got_h = acc.result().compact(0)
        assert same_histogram(parse_histogram(expected["[]"]), got_h, False), got_h.test_expression()
        return
    got = {k: _apply(name, a1, a2, trim, h) for k, h in inputs.items() if h is not None}
    if name in ("histogram_quantile", "histogram_fraction") and trim is None and info is not None:
        notes = [n for h in inputs.values() if h is not None for n in _notes(name, a1, a2, h)]
        if info is False:
            assert notes == []
        elif info is True:
            assert notes
        else:
            assert info in notes
    assert set(got) == set(expected)
    for k, v in got.items():
        if isinstance(v, FloatHistogram):
            assert same_histogram(parse_histogram(expected[k]), v, "counter_reset_hint" in expected[k]), (
                f"{k}: got {v.test_expression()}, Prometheus {expected[k]}"
            )
        else:
            assert same_value(v, _scalar(expected[k])), f"{k}: got {v!r}, Prometheus {expected[k]}"


def _check_kahan(
    case: dict[str, Any], a: FloatHistogram, c: FloatHistogram | None, b: FloatHistogram
) -> None:
    """Go testHistogramKahanAdd: the compensation keeps the sum's layout; sum + compensation is the expected sum."""
    if case.get("expErrMsg"):
        with pytest.raises(HistogramError, match=re.escape(case["expErrMsg"])):
            a.kahan_add(b, c)
        return
    r = a.kahan_add(b, c)
    assert r.counter_reset_collision is bool(case.get("expCounterResetCollision"))
    assert r.nhcb_bounds_reconciled is bool(case.get("expNHCBBoundsReconciled"))
    s, comp = r.histogram, r.compensation
    assert (comp.schema, comp.zero_threshold) == (s.schema, s.zero_threshold)
    assert (comp.positive_spans, comp.negative_spans) == (s.positive_spans, s.negative_spans)
    assert (len(comp.positive_buckets), len(comp.negative_buckets)) == (
        len(s.positive_buckets),
        len(s.negative_buckets),
    )
    exp = _fh(case.get("expected") or case.get("expectedSum"))
    if exp is not None:
        got = s.add(comp).histogram.compact(0)
        assert _same(got, exp.compact(0)), str(got)


@pytest.mark.parametrize("case", _table("TestFloatHistogramAdd"))
def test_go_add_table_through_kahan_add(case: dict[str, Any]) -> None:
    a, b = _fh(case["in1"]), _fh(case["in2"])
    assert a is not None
    assert b is not None
    _check_kahan(case, a, None, b)
    _check_kahan(case, b, None, a)


@pytest.mark.parametrize("case", _table("TestKahanAddWithCompHistogram"))
def test_go_kahan_add_with_compensation_table(case: dict[str, Any]) -> None:
    a, b = _fh(case["in1"]), _fh(case["in2"])
    assert a is not None
    assert b is not None
    _check_kahan(case, a, _fh(case.get("comp")), b)


def test_kahan_add_compensates_what_plain_add_loses() -> None:
    big = FH(count=1e16, sum=1e16, positive_spans=((0, 1),), positive_buckets=(1e16,))
    one = FH(count=1.0, sum=1.0, positive_spans=((0, 1),), positive_buckets=(1.0,))
    plain, r = big, big.kahan_add(one)
    c = r.compensation
    total = r.histogram
    for _ in range(9):
        plain = plain.add(one).histogram
        r = total.kahan_add(one, c)
        total, c = r.histogram, r.compensation
    assert plain.count == 1e16  # each +1 is lost in plain float addition
    final = total.add(c).histogram
    assert final.count == 1e16 + 10
    assert final.positive_buckets == (1e16 + 10,)


def test_has_overflow() -> None:
    assert not _h1().has_overflow()
    assert _h1().copy(sum=math.inf).has_overflow()
    assert _h1().copy(positive_buckets=(1, 2, math.inf, 1, 1, 1, 1)).has_overflow()


# --- validate (Go: Validate, TestFloatHistogramValidateNegativeHistogram) --------------------


@pytest.mark.parametrize("case", _table("TestFloatHistogramAdd") + _table("TestFloatHistogramSub"))
def test_go_add_inputs_are_valid(case: dict[str, Any]) -> None:
    # Go's testHistogramAdd requires both inputs to pass Validate().
    for key in ("in1", "in2"):
        h = _fh(case[key])
        assert h is not None
        h.validate()


@pytest.mark.parametrize("case", _table("TestFloatHistogramValidateNegativeHistogram"))
def test_go_negative_populations_are_invalid(case: dict[str, Any]) -> None:
    h = _fh(case["fh"])
    assert h is not None
    with pytest.raises(HistogramError, match="negative"):
        h.validate()


@pytest.mark.parametrize(
    ("h", "message"),
    [
        (FH(schema=9), "invalid schema"),
        (
            FH(positive_spans=((0, 3),), positive_buckets=(1, 2)),
            "positive side: spans need 3 buckets, have 2",
        ),
        (
            FH(negative_spans=((0, 1), (-1, 1)), negative_buckets=(1, 2)),
            "negative side: span number 2 with offset -1",
        ),
        (
            FH(positive_spans=((0, 1),), positive_buckets=(-1.5,)),
            "bucket number 1 has observation count of -1.5",
        ),
        (FH(schema=CUSTOM_BUCKETS_SCHEMA, custom_values=(2.0, 1.0)), "strictly increasing"),
        (FH(schema=CUSTOM_BUCKETS_SCHEMA, custom_values=(1.0, math.inf)), "must not be explicitly defined"),
        (
            FH(
                schema=CUSTOM_BUCKETS_SCHEMA,
                custom_values=(1.0,),
                positive_spans=((0, 3),),
                positive_buckets=(1, 1, 1),
            ),
            "only 1 custom bounds defined",
        ),
        (FH(schema=CUSTOM_BUCKETS_SCHEMA, zero_count=1.0), "must have zero count of 0"),
        (FH(schema=0, custom_values=(1.0,)), "exponential schema must not have custom bounds"),
    ],
)
def test_validate_names_what_is_wrong(h: FloatHistogram, message: str) -> None:
    with pytest.raises(HistogramError, match=re.escape(message)):
        h.validate()


# --- bucketing and the accuracy of histogram_quantile (issue 14) ----------------------------


@pytest.mark.parametrize("schema", [-2, 0, 3, 8])
def test_from_observations_puts_each_value_in_the_bucket_whose_bounds_hold_it(schema: int) -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate(
        (rng.lognormal(-8, 2, 2000), -rng.lognormal(0, 3, 500), [1.0, 2.0, 0.5, 1024.0, 0.0])
    )
    h = FH.from_observations(values, schema=schema)
    h.validate()
    assert h.count == len(values)
    assert sum(h.positive_buckets) + sum(h.negative_buckets) + h.zero_count == len(values)
    for v in [*values[:300].tolist(), 1.0, 2.0, 0.5, 1024.0]:
        if v == 0:
            continue
        # The one bucket of v's sign whose (lower, upper] holds |v| must be populated.
        bucket = next(
            b for b in (h.buckets(v > 0)) if (b.lower < v <= b.upper if v > 0 else b.lower <= v < b.upper)
        )
        assert bucket.count >= 1


def test_from_observations_sends_infinities_past_the_last_finite_bucket_and_nan_nowhere() -> None:
    h = FH.from_observations([math.inf, -math.inf, math.nan, 1.0], schema=0)
    assert h.count == 4
    assert math.isnan(h.sum)
    assert h.positive_spans == ((0, 1), (1024, 1))  # bucket 0 holds 1.0; 1025 is the +Inf bucket
    assert get_bound(1025, 0) == math.inf
    assert h.negative_buckets == (1.0,)


@pytest.mark.parametrize("schema", [0, 3, 5])
def test_quantiles_of_a_million_long_tailed_durations_are_within_the_schema_error_bound(schema: int) -> None:
    # Kernel durations: lognormal around 50 us plus 0.5 % stragglers 20-200x slower.
    rng = np.random.default_rng(14)
    n = 1_000_000
    durations = rng.lognormal(math.log(50e-6), 0.4, n)
    stragglers = rng.random(n) < 0.005
    durations[stragglers] *= rng.uniform(20, 200, int(stragglers.sum()))
    h = FH.from_observations(durations, schema=schema)
    bound = 2 ** (2.0**-schema) - 1  # widest relative bucket width of the schema
    for q in (0.5, 0.99, 0.999):
        exact = float(np.quantile(durations, q, method="inverted_cdf"))
        est, notes = histogram_quantile(q, h)
        assert notes == []
        assert abs(est - exact) / exact <= bound, (q, est, exact)
        # A rate keeps the shape: the same estimate from h / 300.
        assert histogram_quantile(q, h.div(300.0))[0] == pytest.approx(est, rel=1e-12)


def test_same_layout_fast_paths_agree_with_the_general_merge() -> None:
    # ((0, 2), (0, 2)) and ((0, 4),) describe the same buckets; only the first pair takes the fast paths.
    rng = np.random.default_rng(3)
    a = FH(
        schema=2, count=50, sum=9, positive_spans=((0, 4),), positive_buckets=tuple(rng.uniform(0, 1e16, 4))
    )
    b = a.copy(positive_buckets=tuple(rng.uniform(0, 3, 4)), count=7.0)
    split = b.copy(positive_spans=((0, 2), (0, 2)))
    fast, slow = a.kahan_add(b), a.kahan_add(split)
    assert fast.histogram.positive_buckets == slow.histogram.positive_buckets
    assert fast.compensation.positive_buckets == slow.compensation.positive_buckets
    assert a.add(b).histogram.positive_buckets == a.add(split).histogram.positive_buckets
    assert a.sub(b).histogram.positive_buckets == a.sub(split).histogram.positive_buckets
    bigger = a.add(b).histogram
    assert bigger.detect_reset(a) is bigger.detect_reset(a.copy(positive_spans=((0, 2), (0, 2)))) is False
    assert a.detect_reset(bigger) is a.detect_reset(bigger.copy(positive_spans=((0, 1), (0, 3)))) is True


# --- Go's math where Prometheus prints it ---------------------------------------------------


def test_go_exp2_and_log2_round_as_go_does() -> None:
    # Prometheus' native_histograms.test prints the median of {{buckets:[1 2 1]}} as
    # 1.414213562373095 = Go's Exp2(0.5); the C library's exp2 gives 1.4142135623730951.
    assert go_exp2(0.5) == 1.414213562373095
    assert (
        histogram_quantile(0.5, parse_histogram("{{schema:0 sum:5 count:4 buckets:[1 2 1]}}"))[0]
        == 1.414213562373095
    )
    assert [go_log2(x) for x in (1.0, 8.0, 0.5, 2.0**-1074)] == [0.0, 3.0, -1.0, -1074.0]
    assert go_log2(0.0) == -math.inf
    assert math.isnan(go_log2(-1.0))
    assert go_exp2(1024.0) == math.inf
    assert go_exp2(-2000.0) == 0.0
    assert go_exp2(10.0) == 1024.0
    for x in (0.3, 1.7, 3.3, 1e-3, 123.456):
        assert go_exp2(go_log2(x)) == pytest.approx(x, rel=1e-15)


def test_go_log2_and_exp2_of_arrays_are_the_scalar_ports_bit_for_bit() -> None:
    from kernel_insight.kql.histogram import go_exp2_array, go_log2_array

    rng = np.random.default_rng(11)
    xs = np.concatenate(
        [
            rng.lognormal(-10, 4, 20_000),  # bucket bounds and quantiles: 1e-9 .. 1e2
            2.0 ** rng.integers(-1074, 1023, 200).astype(np.float64),  # exact powers of two
            [0.0, -1.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308, 0.5, 1.0],
        ]
    )
    logs = go_log2_array(xs)
    assert (
        logs.view(np.uint64).tolist() == np.array([go_log2(x) for x in xs.tolist()]).view(np.uint64).tolist()
    )
    es = np.concatenate(
        [rng.uniform(-40, 10, 20_000), [-1100.0, -1074.5, -1022.3, 1023.9, 1024.5, 0.0, np.nan]]
    )
    es = np.concatenate([es, logs[np.isfinite(logs)]])
    got = go_exp2_array(es)
    want = np.array([go_exp2(x) for x in es.tolist()])
    assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()


def test_stddev_of_a_histogram_with_negative_variance_is_nan_not_an_error() -> None:
    from kernel_insight.kql import Engine, MemoryStorage, Vector

    h = parse_histogram("{{schema:0 count:1 sum:1 buckets:[-5 1] counter_reset_hint:gauge}}")
    assert histogram_stdvar(h) < 0
    assert math.isnan(histogram_stddev(h))
    store = MemoryStorage()
    store.add_histograms({"__name__": "g"}, [0], [h])
    result = Engine(store).instant_query("histogram_stddev(g)", 0).value
    assert isinstance(result, Vector)
    assert math.isnan(result.samples[0].value)
