"""kql/gocompat.py: Go's text for floats and durations, the one definition kql, rules and the API use.

The expected strings are Go's own (``fmt.Sprint``, ``strconv.FormatFloat(v, 'f', -1, 64)``,
``time.Duration.String()``), as Go 1.22 prints them; the properties hold for every float."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel_insight.kql.gocompat import go_duration, go_float, go_float_fixed


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (0.5, "0.5"),
        (123456.0, "123456"),
        (1234567.0, "1.234567e+06"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (1e21, "1e+21"),
        (5.939e-10, "5.939e-10"),
        (-2.5e-7, "-2.5e-07"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_go_float_is_fmt_sprint(value: float, text: str) -> None:
    assert go_float(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.5, "0.5"),
        (5.939e-10, "0.0000000005939"),
        (1e21, "1000000000000000000000"),
        (-0.25, "-0.25"),
        (1e100, "1" + "0" * 100),
        (1e-7, "0.0000001"),
        (1e15, "1000000000000000"),
        (-0.0, "-0"),
        (123456789012345678.0, "123456789012345680"),
    ],
)
def test_go_float_fixed_is_strconv_f(value: float, text: str) -> None:
    assert go_float_fixed(value) == text


@pytest.mark.parametrize(
    ("value", "prec", "text"),
    [
        (10.0, 3, "10.000"),
        (1.0, 3, "1.000"),
        (-1.5, 3, "-1.500"),
        (0.0005, 3, "0.001"),  # 0.0005 is stored just above the half
        (0.0625, 3, "0.062"),  # an exact half rounds to even, as Go's decimal rounding
        (1e15, 3, "1000000000000000.000"),
        (math.inf, 3, "+Inf"),
    ],
)
def test_go_float_fixed_with_a_precision_is_strconv_f(value: float, prec: int, text: str) -> None:
    assert go_float_fixed(value, prec) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_both_forms_read_back_as_the_same_float(x: float) -> None:
    assert float(go_float(x)) == x
    assert float(go_float_fixed(x)) == x
    assert "e" not in go_float_fixed(x)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (750, "750ns"),
        (1_500, "1.5µs"),
        (1_500_000, "1.5ms"),
        (500_000_000, "500ms"),
        (1_500_000_000, "1.5s"),
        (60_000_000_000, "1m0s"),
        (3_600_000_000_000, "1h0m0s"),
        (3_600_500_000_000, "1h0m0.5s"),
        (-90_000_000_000, "-1m30s"),
        (8_828_760_765_000_000, "2452h26m0.765s"),  # exact: a float of seconds gave 0.765000001s
    ],
)
def test_go_duration_is_time_duration_string(ns: int, text: str) -> None:
    assert go_duration(ns) == text
