"""Prometheus text and OpenMetrics parsing: table of inputs, positioned errors, and hypothesis fuzzing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector.openmetrics import OpenMetricsError, parse_exposition


def _rows(expo):
    b = expo.samples
    return [
        (dict(b.series[i]), t, v)
        for i, t, v in zip(b.series_idx.tolist(), b.ts_ms.tolist(), b.values.tolist(), strict=True)
    ]


def test_prometheus_text_with_millisecond_timestamps():
    text = (
        "# HELP gpu_temp_celsius GPU temperature.\n"
        "# TYPE gpu_temp_celsius gauge\n"
        'gpu_temp_celsius{gpu="0",host="a"} 61.5 1700000000000\n'
        'gpu_temp_celsius{gpu="1",host="a",} 62 1700000000000\n'
        "# a plain comment\n"
        "\n"
        "up 1 5\n"
    )
    expo = parse_exposition(text)
    assert expo.format == "prometheus"
    assert _rows(expo) == [
        ({"__name__": "gpu_temp_celsius", "gpu": "0", "host": "a"}, 1700000000000, 61.5),
        ({"__name__": "gpu_temp_celsius", "gpu": "1", "host": "a"}, 1700000000000, 62.0),
        ({"__name__": "up"}, 5, 1.0),
    ]
    assert expo.metadata["gpu_temp_celsius"].type == "gauge"
    assert expo.metadata["gpu_temp_celsius"].help == "GPU temperature."


def test_openmetrics_with_second_timestamps_units_and_exemplars():
    text = (
        "# TYPE kernel_launches counter\n"
        "# UNIT kernel_launches launches\n"
        'kernel_launches_total{kernel="gemm"} 17 1700000000.25 # {trace_id="ab"} 1.0 1700000000.2\n'
        "# EOF\n"
    )
    expo = parse_exposition(text)
    assert expo.format == "openmetrics"
    assert _rows(expo) == [({"__name__": "kernel_launches_total", "kernel": "gemm"}, 1700000000250, 17.0)]
    assert expo.metadata["kernel_launches"].unit == "launches"


def test_escapes_special_values_and_utf8_names():
    text = '{"gpu.temp", path="C:\\\\x \\"q\\"\\n"} +Inf 1\nb NaN 2\nc -inf 3\n'
    rows = _rows(parse_exposition(text))
    assert rows[0][0] == {"__name__": "gpu.temp", "path": 'C:\\x "q"\n'}
    assert rows[0][2] == math.inf
    assert math.isnan(rows[1][2])
    assert rows[2][2] == -math.inf


def test_missing_timestamp_uses_the_default_or_fails():
    assert _rows(parse_exposition("up 1\n", default_timestamp_ms=99)) == [({"__name__": "up"}, 99, 1.0)]
    with pytest.raises(OpenMetricsError, match="line 1, column 1: the sample has no timestamp"):
        parse_exposition("up 1\n")


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("up 1 2\nup{a=1} 1 2\n", 2, 6, "expected a quoted label value"),
        ('up{a="1" 1 2\n', 1, 10, "expected ',' or '}'"),
        ("up one 2\n", 1, 4, "invalid value"),
        ("up 1 2.5\n", 1, 6, "integer milliseconds"),
        ("up 1 2 3\n", 1, 8, "unexpected text"),
        ('up{a="1",a="2"} 1 2\n', 1, 10, "appears twice"),
        ('up{a="unterminated} 1 2\n', 1, 6, "unterminated"),
        ("# TYPE up flavour\nup 1 2\n", 1, 1, "unknown metric type"),
        ("up 1 2\n# EOF\nup 1 3\n# EOF\n", 3, 1, "after '# EOF'"),
        ("# TYPE up gauge\nup 1 2\n", None, None, None),
        ("{} 1 2\n", 1, 3, "expected a metric name"),
        ("up 1 -5\n", 1, 1, "outside 1970-01-01"),
        ("up 1 99999999999999999\n", 1, 1, "outside 1970-01-01"),
        ('{""} 1 2\n', 1, 1, "metric name"),
        ("up 1_000 2\n", 1, 4, "invalid value"),
    ],
)
def test_errors_name_line_and_column(text, line, column, message):
    if message is None:
        parse_exposition(text)
        return
    with pytest.raises(OpenMetricsError) as info:
        parse_exposition(text)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert message in str(info.value)


def test_openmetrics_must_end_with_eof():
    with pytest.raises(OpenMetricsError, match="EOF"):
        parse_exposition("up 1 2\n", format="openmetrics")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('ab_{}=",# \n\\.0123456789eEinfNa+-:\t')), max_size=80))
def test_fuzz_only_positioned_errors(text):
    try:
        parse_exposition(text, default_timestamp_ms=0)
    except OpenMetricsError as exc:
        error = exc
    else:
        return
    assert error.line >= 1
    assert error.column >= 1


_names = st.from_regex(r"\A[a-zA-Z_:][a-zA-Z0-9_:]{0,12}\Z")
_label_names = st.from_regex(r"\A[a-zA-Z_][a-zA-Z0-9_]{0,8}\Z").filter(lambda s: s != "__name__")
_values = st.floats(allow_nan=False)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            _names,
            st.dictionaries(_label_names, st.text(min_size=1, max_size=10), max_size=4),
            _values,
            st.integers(0, 5_662_310_399_999),
        ),
        max_size=10,
    )
)
def test_fuzz_round_trip(samples):
    lines = []
    for n, labels, v, t in samples:
        body = ",".join(k + '="' + _esc(lv) + '"' for k, lv in labels.items())
        lines.append(f"{n}{{{body}}} {v!r} {t}\n")
    text = "".join(lines)
    got = _rows(parse_exposition(text))
    assert got == [({"__name__": n, **labels}, t, v) for n, labels, v, t in samples]


def _outcome(text):
    try:
        return [
            (labels, t, repr(v)) for labels, t, v in _rows(parse_exposition(text, default_timestamp_ms=0))
        ]
    except OpenMetricsError as exc:
        return exc.message


_series_text = st.builds(
    lambda name, body: name + body,
    st.sampled_from(["a", "a_b", "a:b", ""]),
    st.sampled_from(
        ["", "{}", '{x="1"}', '{x="1",}', '{x="a b"}', '{x="}"}', '{x="\\""}', "{x=1}", '{x="1" y="2"}']
    ),
)
_sample_line = st.builds(
    lambda series, sep, value, ts: f"{series}{sep}{value}{ts}",
    _series_text,
    st.sampled_from([" ", "\t", "  ", ""]),
    st.sampled_from(["1", "-2.5", "inf", "NaN", "1e3", "x", "1_0", ".5", "+Inf", ""]),
    st.sampled_from(
        ["", " 5", " -5", " 1.5", " inf", " nan", " 99999999999999999", ' # {a="1"} 1', " 5 ", " 5 6"]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            _sample_line,
            st.text(alphabet=st.sampled_from(list('ab_{}=",# \\.0123456789eEinfNa+-:\t')), max_size=40),
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_fuzz_repeated_lines_parse_like_first_ones(lines, openmetrics):
    # Repeats of a series take the cached fast path; they must be read exactly as the first was.
    lines = [line for line in lines if not line.startswith("#")]
    tail = ["# EOF"] if openmetrics else []
    once = _outcome("\n".join([*lines, *tail]) + "\n")
    twice = _outcome("\n".join([*(x for line in lines for x in (line, line)), *tail]) + "\n")
    if isinstance(once, str):
        assert isinstance(twice, str)
    else:
        assert twice == [row for row in once for row in (row, row)]


def test_repeated_series_with_bad_value_or_timestamp_still_fail():
    with pytest.raises(OpenMetricsError, match="line 2, column 4: invalid value"):
        parse_exposition("up 1 5\nup x 5\n")
    with pytest.raises(OpenMetricsError, match=r"line 2, column 1: .*outside"):
        parse_exposition("up 1 5\nup 1 -5\n")
    with pytest.raises(OpenMetricsError, match="line 2, column 6: the timestamp must be finite"):
        parse_exposition("up 1 5\nup 1 inf\n# EOF\n")
