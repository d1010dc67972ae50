"""prometheus_json_bytes writes exactly the JSON json.dumps writes for to_prometheus_json, only faster."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernel_insight.kql import (
    Matrix,
    Sample,
    Scalar,
    Series,
    String,
    Vector,
    _windows,
    prometheus_json_bytes,
    to_prometheus_json,
)
from kernel_insight.kql.values import (
    _few_value_bytes,
    _stamps_bytes,
    _ts_bytes,
    _value_bytes,
    float_samples,
    format_json_float,
    format_sample_value,
)


def _dumps(value: Vector | Matrix | Scalar | String) -> bytes:
    # What starlette's JSONResponse writes for the dict form.
    return json.dumps(to_prometheus_json(value), ensure_ascii=False, separators=(",", ":")).encode()


# Every kind of float: any bit pattern (NaN payloads, subnormals, huge), round decimals as
# gauges hold, integers as counters hold, and the edges of Python's positional repr.
_EDGES = [
    0.0,
    -0.0,
    1e-4,
    -1e-4,
    9.999e-5,
    1e16,
    9999999999999998.0,
    1e15,
    0.1,
    5e-324,
    1.7976931348623157e308,
]
floats = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(-1e6, 1e6, places=6, allow_nan=False).map(float),
    st.integers(-(2**60), 2**60).map(float),
    st.sampled_from(_EDGES),
)
labels = st.lists(
    st.tuples(st.sampled_from(["__name__", "gpu", "instance", "é", 'q"uote', "x\ny"]), st.text(max_size=6)),
    max_size=4,
    unique_by=lambda p: p[0],
).map(lambda ps: tuple(sorted(ps)))
ms = st.integers(0, 4_102_444_800_000)


@st.composite
def matrices(draw: st.DrawFn) -> Matrix:
    steps = sorted(set(draw(st.lists(ms, min_size=1, max_size=12))))
    out = []
    for lab in draw(st.lists(labels, max_size=5, unique=True)):
        keep = draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps)))
        ts = np.array([t for t, k in zip(steps, keep, strict=True) if k], dtype=np.int64)
        vs = np.array(draw(st.lists(floats, min_size=len(ts), max_size=len(ts))), dtype=np.float64)
        out.append(Series(lab, ts, vs))
    return Matrix(tuple(out))


@settings(max_examples=300, deadline=None)
@given(matrices())
def test_matrix_bytes_equal_json_dumps(m: Matrix) -> None:
    # Twice: the second time each label set's JSON is the one remembered from the first.
    assert prometheus_json_bytes(m) == _dumps(m) == prometheus_json_bytes(m)


@settings(max_examples=300, deadline=None)
@given(ms, st.lists(st.tuples(labels, floats), max_size=6))
def test_vector_bytes_equal_json_dumps(
    t: int, items: list[tuple[tuple[tuple[str, str], ...], float]]
) -> None:
    v = Vector(t, tuple(Sample(lab, t, x) for lab, x in items))
    assert prometheus_json_bytes(v) == _dumps(v) == prometheus_json_bytes(v)


@settings(max_examples=50, deadline=None)
@given(ms, st.lists(st.tuples(labels, floats), min_size=30, max_size=40))
def test_larger_vector_bytes_equal_json_dumps(
    t: int, items: list[tuple[tuple[tuple[str, str], ...], float]]
) -> None:
    # Past _FEW_VALUES the values are formatted by numpy and orjson together, below one by one.
    v = Vector(t, tuple(Sample(lab, t, x) for lab, x in items))
    assert prometheus_json_bytes(v) == _dumps(v)


@settings(max_examples=300, deadline=None)
@given(st.lists(floats, max_size=40))
def test_few_values_are_formatted_as_many_are(values: list[float]) -> None:
    # The one-by-one path and the vectorised one write the same bytes, numpy scalars included.
    expected = _value_bytes(np.array(values, dtype=np.float64)).tolist()
    assert _few_value_bytes(values) == expected
    assert _few_value_bytes(list(np.array(values, dtype=np.float64))) == expected


@given(ms, floats, st.text(max_size=8))
def test_scalar_and_string_bytes_equal_json_dumps(t: int, x: float, text: str) -> None:
    assert prometheus_json_bytes(Scalar(t, x)) == _dumps(Scalar(t, x))
    assert prometheus_json_bytes(String(t, text)) == _dumps(String(t, text))


def test_values_are_written_as_go_formats_them() -> None:
    values = [
        1.0,
        0.5,
        -0.0,
        1e-5,
        1e20,
        math.inf,
        -math.inf,
        math.nan,
        123.456,
        2.0**53,
        5.939e-10,
        -1e-7,
        1e21,
    ]
    m = Matrix(
        (Series((("__name__", "x"),), np.arange(len(values), dtype=np.int64) * 1500, np.array(values)),)
    )
    doc = json.loads(prometheus_json_bytes(m))
    got = [v for _, v in doc["result"][0]["values"]]
    assert got == [
        "1",
        "0.5",
        "-0",
        "0.00001",
        "100000000000000000000",
        "+Inf",
        "-Inf",
        "NaN",
        "123.456",
        "9007199254740992",
        "5.939e-10",  # jsonutil.MarshalFloat: Go's 'e' format below 1e-6 and from 1e21 on
        "-1e-07",
        "1e+21",
    ]
    assert got == [format_json_float(x) for x in values]
    # A label value (count_values) is Go's 'f' format throughout.
    assert format_sample_value(5.939e-10) == "0.0000000005939"
    assert [t for t, _ in doc["result"][0]["values"]][:3] == [0, 1.5, 3]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.integers(0, 10**15 - 1) | ms | st.integers(0, 10**6).map(lambda k: 1_796_000_000_000 + 250 * k),
        max_size=50,
    )
    | st.lists(st.integers(-(10**16), 10**16), max_size=5)
)
@example([1_796_000_000_000, 1_796_000_060_000, 1_796_000_120_000])  # all on whole seconds
@example([1_796_000_000_500, 1_796_000_060_500, 1_796_000_120_500])  # none on one
@example([1_796_000_000_500, 1_796_000_001_000])  # some
def test_grid_times_are_written_as_one_by_one(times: list[int]) -> None:
    # A range answer's steps in one pass (_stamps_bytes): the same text as each alone.
    steps = np.unique(np.array(times, dtype=np.int64))
    assert _stamps_bytes(steps) == [_ts_bytes(t) for t in steps.tolist()]


@settings(max_examples=100, deadline=None)
@given(ms, st.lists(st.tuples(labels, floats), max_size=8))
def test_float_samples_are_the_samples_the_dataclass_makes(
    t: int, items: list[tuple[tuple[tuple[str, str], ...], float]]
) -> None:
    # The engine's instant results set Sample's slots directly: equal, same hash and repr.
    rows = list(range(len(items)))[::-1]
    got = float_samples([lab for lab, _ in items], t, rows, [items[i][1] for i in rows])
    want = tuple(Sample(items[i][0], t, items[i][1]) for i in rows)
    assert [repr(s) for s in got] == [repr(s) for s in want]
    assert [(s.labels, s.timestamp_ms, s.histogram) for s in got] == [
        (s.labels, s.timestamp_ms, s.histogram) for s in want
    ]
    assert all(_same_float(a.value, b.value) for a, b in zip(got, want, strict=True))


def _same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)


@settings(max_examples=300, deadline=None)
@given(
    labels,
    floats,
    st.lists(ms | st.integers(0, 10**6).map(lambda k: 1_796_000_000_000 + 250 * k), min_size=1, max_size=40)
    | st.lists(st.integers(-(10**16), 10**16), min_size=1, max_size=5),
    st.data(),
)
def test_constant_series_are_written_as_any_series(
    lab: tuple[tuple[str, str], ...], x: float, times: list[int], data: st.DataObject
) -> None:
    # absent() over a range, vector(1), a flat gauge: the value formatted once, the same bytes.
    # One value of a few series changed (another bit pattern of the same number included: -0,
    # a NaN payload) takes the general path.
    ts = np.unique(np.array(times, dtype=np.int64))
    vs = np.full(len(ts), x)
    if data.draw(st.booleans()):
        vs[data.draw(st.integers(0, len(ts) - 1))] = data.draw(floats | st.sampled_from([-x, x * 1.0]))
    for m in (
        Matrix((Series(lab, ts, vs),)),
        Matrix((Series(lab, ts, vs), Series((*lab, ("~", "b")), ts, vs))),
    ):
        assert prometheus_json_bytes(m) == _dumps(m)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 10**15 - 1) | ms, max_size=40),
    st.sampled_from([b",", b'","1"],[', b""]),
)
@example([0, 1, 5, 50, 500, 120, 1_000, 10**15 - 1], b",")
def test_stamps_text_in_c_is_repr_of_the_seconds(times: list[int], after: bytes) -> None:
    # _windows.stamps_text writes ms / 1000 as Python's repr and orjson do, a whole second as an integer.
    got = _windows.stamps_text(np.array(times, dtype=np.int64), after)
    assert got == b"".join(
        (repr(t // 1000) if t % 1000 == 0 else repr(t / 1000)).encode() + after for t in times
    )
    assert got == b"".join(orjson.dumps(t // 1000 if t % 1000 == 0 else t / 1000) + after for t in times)


def test_stamps_text_refuses_times_it_cannot_write() -> None:
    for bad in ([-1], [10**15], [0, 2**62]):
        with pytest.raises(ValueError, match="outside"):
            _windows.stamps_text(np.array(bad, dtype=np.int64), b",")
    assert _windows.stamps_text(np.array([], dtype=np.int64), b",") == b""
