"""The native-histogram value type and its math (kql/nativehist.py), against Prometheus' own cases.

Cases marked "Go:" are ported from prometheus/prometheus (commit d15adb9ad7):
model/histogram/float_histogram_test.go, promql/parser/parse_test.go and promql/quantile.go's
documented behaviour; the expected values are Prometheus', not recomputed here.
"""

from __future__ import annotations

import math

import pytest

from kernel_insight.kql.nativehist import (
    CUSTOM_BUCKETS_SCHEMA,
    GAUGE_TYPE,
    NOT_COUNTER_RESET,
    FloatHistogram,
    HistogramError,
    HistogramNotationError,
    expand_histogram_series,
    get_bound,
    go_float,
    parse_histogram,
)

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
