"""kql extensions: each is documented, and none changes what a valid PromQL query means."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kernel_insight.kql import FUNCTIONS, Engine, KqlParseError, MemoryStorage, parse
from kernel_insight.kql.ast import NumberLiteral

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kql.md"

#: Every function of PromQL (Prometheus 3.x) that applies to float samples, plus the native-histogram ones.
PROMQL_FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "cos",
        "cosh",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "deg",
        "delta",
        "deriv",
        "double_exponential_smoothing",
        "end",
        "exp",
        "first_over_time",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_quantiles",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "hour",
        "idelta",
        "increase",
        "info",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_of",
        "max_over_time",
        "min_of",
        "min_over_time",
        "minute",
        "month",
        "pi",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rad",
        "range",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sin",
        "sinh",
        "sort",
        "sort_by_label",
        "sort_by_label_desc",
        "sort_desc",
        "sqrt",
        "start",
        "start_timestamp",
        "step",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "tan",
        "tanh",
        "time",
        "timestamp",
        "ts_of_first_over_time",
        "ts_of_last_over_time",
        "ts_of_max_over_time",
        "ts_of_min_over_time",
        "vector",
        "year",
    ]
)


def test_every_promql_function_is_registered() -> None:
    assert set(FUNCTIONS) >= PROMQL_FUNCTIONS


def test_extension_functions_are_marked_and_new() -> None:
    extensions = {name for name, spec in FUNCTIONS.items() if spec.extension}
    assert extensions == set(FUNCTIONS) - PROMQL_FUNCTIONS
    assert extensions == {"time_weighted_avg_over_time", "zscore"}


def test_every_function_is_documented() -> None:
    text = DOCS.read_text()
    missing = [name for name in FUNCTIONS if not re.search(rf"`{name}\(", text)]
    assert not missing, f"functions missing from docs/kql.md: {missing}"


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [("40GiB", 40 * 2**30, "GiB"), ("512MiB", 512 * 2**20, "MiB"), ("1.5TB", 1.5e12, "TB"), ("8B", 8, "B")],
)
def test_byte_literals_are_numbers_of_bytes(text: str, value: float, unit: str) -> None:
    assert parse(text) == NumberLiteral(value, unit=unit)


def test_byte_literals_were_syntax_errors_in_promql() -> None:
    # PromQL rejects `40GiB`; a number glued to a name is still an error where kql has no meaning for it.
    with pytest.raises(KqlParseError):
        parse("40GiBs")
    with pytest.raises(KqlParseError):
        parse("5 GiB")


def test_duration_literals_are_seconds_as_in_prometheus_3() -> None:
    assert parse("200ms") == NumberLiteral(0.2, duration=True)
    expr = parse("rate(x[5m]) > 1m")
    assert expr.rhs == NumberLiteral(60.0, duration=True)  # type: ignore[union-attr]


def test_time_weighted_average_weighs_by_hold_time() -> None:
    s = MemoryStorage()
    s.add({"__name__": "gpu_util", "gpu": "0"}, [10_000, 50_000], [0.0, 50.0])
    engine = Engine(s)
    # 0 held for 40 s, 50 held for the last 10 s of the range.
    assert (
        engine.instant_query("time_weighted_avg_over_time(gpu_util[1m])", 60_000).value.samples[0].value == 10
    )
    assert engine.instant_query("avg_over_time(gpu_util[1m])", 60_000).value.samples[0].value == 25
    # A single sample at the end of the range is its own average.
    single = engine.instant_query("time_weighted_avg_over_time(gpu_util[5s])", 50_000).value.samples[0]
    assert single.value == 50
    assert single.labels == (("gpu", "0"),)


def test_zscore_finds_the_straggler_among_peers() -> None:
    s = MemoryStorage()
    for job, gpu, value in (
        ("a", "0", 1.0),
        ("a", "1", 1.0),
        ("a", "2", 1.0),
        ("a", "3", 3.0),
        ("b", "0", 7.0),
    ):
        s.add({"__name__": "step_seconds", "job": job, "gpu": gpu}, [0], [value])
    result = Engine(s).instant_query('zscore(step_seconds, "job")', 0).value
    z = {dict(x.labels)["gpu"] + dict(x.labels)["job"]: x.value for x in result.samples}
    assert z["3a"] == pytest.approx(math.sqrt(3))
    assert z["0a"] == pytest.approx(-1 / math.sqrt(3))
    assert math.isnan(z["0b"])  # a job of one GPU has no spread to compare against
    stragglers = Engine(s).instant_query('zscore(step_seconds, "job") > 1.5', 0).value
    assert [dict(x.labels)["gpu"] for x in stragglers.samples] == ["3"]
