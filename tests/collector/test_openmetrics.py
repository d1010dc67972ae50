"""Prometheus text and OpenMetrics parsing: table of inputs, positioned errors, and hypothesis fuzzing."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector.openmetrics import ExpositionReader, OpenMetricsError, parse_exposition
from kernel_insight.collector.rows import SeriesLimits


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
    rows = _rows(parse_exposition(text, limits=SeriesLimits(utf8_names=True)))
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


# ---- the chunked reader's fast path against the line-by-line parser ------------------------


def _by_series(batch):
    out: dict = {}
    for i, labels in enumerate(batch.series):
        m = batch.series_idx == i
        values = [repr(v) for v in batch.values[m].tolist()]  # NaN compares by its text
        out.setdefault(labels, []).extend(zip(batch.ts_ms[m].tolist(), values, strict=True))
    return {k: sorted(v, key=repr) for k, v in out.items()}


def _merge(batches):
    out: dict = {}
    for b in batches:
        for k, v in _by_series(b).items():
            out.setdefault(k, []).extend(v)
    return {k: sorted(v, key=repr) for k, v in out.items()}


_line = st.tuples(
    st.sampled_from(["up", "gpu_temp", "a:b"]),
    st.dictionaries(
        st.sampled_from(["gpu", "host", "k"]), st.sampled_from(["0", "1", "x y", 'q"', "é"]), max_size=2
    ),
    st.sampled_from(["1", "-2.5", "+Inf", "NaN", "1e3", ".5", "7."]),
    st.integers(0, 5_662_310_399_999),
    st.sampled_from([" ", " ", " ", "\t"]),  # tabs send a chunk down the slow path
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_line, max_size=30), st.lists(st.integers(1, 30), max_size=4), st.booleans())
def test_chunked_fast_path_matches_the_line_by_line_parser(lines, cuts, om):
    text_lines = ["# TYPE up gauge"] if om else []
    for name, labels, value, ts, sep in lines:
        lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        stamp = f"{ts // 1000}.{ts % 1000:03d}" if om else str(ts)
        text_lines.append(f"{name}{{{lab}}}{sep}{value} {stamp}" if lab else f"{name}{sep}{value} {stamp}")
    if om:
        text_lines.append("# EOF")
    raw = ("\n".join(text_lines) + "\n").encode()
    fmt = "openmetrics" if om else "prometheus"
    want = ExpositionReader(format=fmt)._slow(raw, 1)
    reader = ExpositionReader(format=fmt)
    bounds = sorted({0, len(text_lines), *(c for c in cuts if c < len(text_lines))})
    parts = [("\n".join(text_lines[a:b]) + "\n").encode() for a, b in itertools.pairwise(bounds)]
    got = [reader.feed(p) for p in parts]
    reader.finish()
    assert _merge(got) == _by_series(want)
    assert reader.lines == len(text_lines)


def test_an_error_in_a_later_chunk_names_its_line_in_the_file():
    reader = ExpositionReader(format="prometheus")
    reader.feed(b"up 1 1000\nup 1 2000\n")
    with pytest.raises(OpenMetricsError, match=r"line 4, column 4: invalid value"):
        reader.feed(b"up 1 3000\nup x 4000\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x{y}"} 1 2\n', "invalid metric name 'x{y}'"),
        ('up{"a b\\""="1"} 1 2\n', "invalid label name"),
        ("up{" + ",".join(f'l{i}="v"' for i in range(31)) + "} 1 2\n", "32 labels exceed the limit of 30"),
        ("a" * 1025 + " 1 2\n", "metric name of 1025 bytes exceeds the limit of 1024"),
        ('up{a="' + "v" * 2049 + '"} 1 2\n', "2049 bytes, over the limit of 2048"),
    ],
)
def test_names_prometheus_rejects_and_oversized_series_are_refused(text, message):
    with pytest.raises(OpenMetricsError, match="line 1, column 1: ") as info:
        parse_exposition(text)
    assert message in str(info.value)


def test_limits_are_settings():
    text = '{"x{y}", a="' + "v" * 3000 + '"} 1 2\n'
    limits = SeriesLimits(max_value_bytes=0, utf8_names=True)
    (labels,) = parse_exposition(text, limits=limits).samples.series
    assert dict(labels)["__name__"] == "x{y}"


@pytest.mark.parametrize("om", [False, True])
def test_the_usual_shape_takes_the_fast_path(om):
    """Lines as exporters and promtool write them never fall back to the line-by-line parser."""
    stamp = "1700000000.250" if om else "1700000000250"
    text = "# TYPE gpu_temp gauge\n" + "".join(
        f'gpu_temp{{gpu="{g}",host="a b"}} {60 + g}.5 {stamp}\n' for g in range(8)
    )
    if om:
        text += "# EOF\n"
    reader = ExpositionReader(format="openmetrics" if om else "prometheus")
    batch = reader._fast(text.encode(), 1, text.count("\n"))
    assert batch is not None
    assert sorted(batch.values.tolist()) == [60.5 + g for g in range(8)]
    assert set(batch.ts_ms.tolist()) == {1700000000250}
    assert reader.eof_seen == om


@pytest.mark.parametrize("om", [False, True])
def test_the_usual_shape_without_spaces_in_labels_takes_the_columnar_path(om):
    """Arrow's CSV reader parses these chunks (the numpy path is for label values with spaces)."""
    stamp = "1700000000.250" if om else "1700000000250"
    text = "# TYPE gpu_temp gauge\n" + "".join(
        f'gpu_temp{{gpu="{g}",host="a"}} {60 + g}.5 {stamp}\nup{{gpu="{g}"}} NaN {stamp}\n' for g in range(8)
    )
    if om:
        text += "# EOF\n"
    reader = ExpositionReader(format="openmetrics" if om else "prometheus")
    batch = reader._columnar(text.encode(), 1, text.count("\n"))
    assert batch is not None
    fmt = "openmetrics" if om else "prometheus"
    assert _by_series(batch) == _by_series(ExpositionReader(format=fmt)._slow(text.encode(), 1))
    assert len(batch.series) == 16
    assert reader.eof_seen == om


@pytest.mark.parametrize(
    ("text", "om", "message"),
    [
        # Arrow's parsers take these; the formats do not, and neither does the reader.
        ("up 1 1000\nup nan(1) 2000\n", False, "line 2, column 4: invalid value"),
        ("up 1 1000\nup 1 0x10\n", False, "line 2, column 6: invalid timestamp"),
        ("up 1 1000\nup 1_0 2000\n", False, "line 2, column 4: invalid value"),
        ("up 1 1.5\nup NaN(2) 2.5\n# EOF\n", True, "line 2, column 4: invalid value"),
    ],
)
def test_numbers_arrow_would_take_but_the_formats_do_not_are_refused(text, om, message):
    reader = ExpositionReader(format="openmetrics" if om else "prometheus")
    with pytest.raises(OpenMetricsError, match=message):
        reader.feed(text.encode())
