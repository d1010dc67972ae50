"""Sample values stored as decimals (mantissa, scale) where exact, else as floats: bit for bit."""

from __future__ import annotations

import struct
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector import _valuecodec
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.valuecodec import FLOAT_FORM, decode_values, encode_values, encode_values_numpy
from kernel_insight.kql.storage import Matcher


def _f(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


STALE_NAN = _f(0x7FF0000000000002)  # Prometheus' stale marker: a NaN with its own payload
AWKWARD = [
    0.0,
    -0.0,
    STALE_NAN,
    float("nan"),
    _f(0x7FF8000000000001),  # a quiet NaN with a payload
    _f(0xFFF8000000000000),  # a negative NaN
    float("inf"),
    float("-inf"),
    5e-324,  # the smallest subnormal
    2.225073858507201e-308,  # the largest subnormal
    2.2250738585072014e-308,  # the smallest normal
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1e300,
    1e-300,
    2.0**53,
    2.0**53 + 2,
    -(2.0**53),
    2.0**63,
    0.1,
    0.3,
    1 / 3,
    72.123456,
    -7.5,
    1e-15,
    1.5e-16,
    123456789.123,
    150123 / 1e9,
    9007199254740.991,
    1e22,
    42.0,
]


def _bits(values: np.ndarray) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.int64).tolist()


def test_awkward_values_encode_and_decode_bit_for_bit() -> None:
    v = np.array(AWKWARD)
    f, m, e = encode_values(v, np.zeros(len(v), np.int32))
    assert _bits(decode_values(f, m, e)) == _bits(v)
    nf, nm, ne = encode_values_numpy(v, np.zeros(len(v), np.int32))
    assert (_bits(f), m.tolist(), e.tolist()) == (_bits(nf), nm.tolist(), ne.tolist())
    # The floats no decimal gives back are kept as floats; plain decimals are not.
    as_float = {i for i, s in enumerate(e.tolist()) if s == FLOAT_FORM}
    for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 21):  # -0.0, NaNs, infinities, subnormals, 1/3
        assert i in as_float, AWKWARD[i]
    assert e[AWKWARD.index(72.123456)] == 6
    assert m[AWKWARD.index(72.123456)] == 72_123_456


def test_the_c_loop_refuses_bad_buffers() -> None:
    v = np.array([1.5, 2.0])
    out = (np.empty(2), np.empty(2, np.int64), np.empty(2, np.int8))
    with pytest.raises(ValueError, match="series_idx points outside top"):
        _valuecodec.encode(v, np.array([0, 3], np.int32), np.full(2, -1, np.int8), *out)
    with pytest.raises(ValueError, match="mantissa_out"):
        _valuecodec.encode(v, None, np.empty(0, np.int8), out[0], np.empty(1, np.int64), out[2])
    with pytest.raises(ValueError, match="series_idx must hold"):
        _valuecodec.encode(v, np.array([0], np.int32), np.full(2, -1, np.int8), *out)


def test_a_series_keeps_one_scale_within_a_batch() -> None:
    # 61.5 alone would be scale 3 and 61 scale 0: one series, so both are scale 3 (Delta sees 500).
    f, m, e = encode_values(np.array([61.0, 61.5, 7.0]), np.array([0, 0, 1]))
    assert e.tolist() == [3, 3, 0]
    assert m.tolist() == [61_000, 61_500, 7]
    assert f.tolist() == [0.0, 0.0, 0.0]


def test_full_precision_floats_stay_floats() -> None:
    # Near 2**53 / 10**k most floats are some m / 10**k; taken as decimals, a float series would
    # switch columns at random. Fractions need < 10**14 as mantissa: well under 1% pass by accident.
    rng = np.random.default_rng(7)
    for lo, hi in ((0.1, 1.0), (1.0, 4.0), (4.0, 9.0), (4000.0, 9000.0)):
        _, _, e = encode_values(rng.uniform(lo, hi, 20_000))
        assert (e >= 0).mean() < 0.01, (lo, hi)
    # Integers keep the whole 2**53 (byte counters), and short decimals still pass.
    _, m, e = encode_values(np.array([2.0**53, 1e15 + 1, 123.456, 0.000150123]))
    assert e.tolist() == [0, 0, 3, 9]
    assert m.tolist() == [2**53, 10**15 + 1, 123_456, 150_123]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-(10**18), 10**18).map(float),
            st.tuples(st.integers(-(10**16), 10**16), st.integers(0, 18)).map(lambda t: t[0] / 10 ** t[1]),
            st.integers(0, 2**64 - 1).map(lambda b: _f(b)),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 4),
)
def test_any_floats_come_back_bit_for_bit(values: list[float], series: int) -> None:
    v = np.array(values, dtype=np.float64)
    idx = np.arange(len(v)) % series
    f, m, e = encode_values(v, idx)
    assert _bits(decode_values(f, m, e)) == _bits(v)
    # The C loop is the numpy reference, array for array (and so is without series).
    nf, nm, ne = encode_values_numpy(v, idx)
    assert (_bits(f), m.tolist(), e.tolist()) == (_bits(nf), nm.tolist(), ne.tolist())
    cf, cm, ce = encode_values(v)
    rf, rm, re_ = encode_values_numpy(v)
    assert (_bits(cf), cm.tolist(), ce.tolist()) == (_bits(rf), rm.tolist(), re_.tolist())
    assert (f[e >= 0] == 0).all()
    assert (m[e < 0] == 0).all()


def _read_back(store: EmbeddedStore, now: int, n: int) -> tuple[list[int], list[int]]:
    """The values as the SQL column and as kql's storage read them, in write order."""
    sql = store.query("SELECT value FROM ki.samples WHERE metric = 'awk' ORDER BY ts").column("value")
    got = store.storage(use_cache=False).select([Matcher("__name__", "=", "awk")], now - n - 10, now)
    assert len(got) == 1
    return _bits(sql.to_numpy()), _bits(np.asarray(got[0].values))


def test_stored_values_read_back_bit_for_bit_before_and_after_a_merge(tmp_path) -> None:
    now = int(time.time() * 1000)
    values = AWKWARD * 3
    n = len(values)
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        for lo, hi in ((0, n // 2), (n // 2, n)):  # two parts, merged below
            b = SampleBuilder()
            for i in range(lo, hi):
                b.add({"__name__": "awk", "s": "1"}, now - n + i, values[i])
            store.insert_samples(b.build())
        want = _bits(np.array(values))
        assert _read_back(store, now, n) == (want, want)
        scales = store.query("SELECT scale FROM ki.samples WHERE metric = 'awk'").column("scale").to_pylist()
        assert FLOAT_FORM in scales
        assert any(s >= 0 for s in scales)
        store.optimize("samples")
        assert _read_back(store, now, n) == (want, want)


def test_a_store_with_a_stored_value_column_is_migrated_by_metadata_only(tmp_path) -> None:
    now = int(time.time() * 1000)
    old_values = AWKWARD
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        # The layout before decimals: value a stored Float64 column.
        store.command("DROP TABLE ki.samples SYNC")
        store.command(
            "CREATE TABLE ki.samples (metric LowCardinality(String), fingerprint UInt64, "
            "ts DateTime64(3, 'UTC'), value Float64 CODEC(Delta, ZSTD(3))) ENGINE = MergeTree "
            "PARTITION BY toDate(ts) ORDER BY (metric, fingerprint, ts)"
        )
        b = SampleBuilder()
        for i, v in enumerate(old_values):
            b.add({"__name__": "awk", "s": "1"}, now - 200 + i, v)
        batch = b.build()
        rows, series = store._sample_rows(batch)[:2]
        assert series is not None
        store.insert_table("series", series)
        old = rows.select(["metric", "fingerprint", "ts"]).append_column(
            "value", pa.array(batch.values, pa.float64())
        )
        store.insert_table("samples", old)
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        kinds = {
            r["name"]: r["default_kind"]
            for r in store.query(
                "SELECT name, default_kind FROM system.columns WHERE database = 'ki' AND table = 'samples'"
            ).to_pylist()
        }
        assert kinds["value"] == "ALIAS"
        assert kinds["float_value"] == ""
        assert kinds["scale"] == "DEFAULT"
        assert store.query(
            "SELECT count() AS n FROM system.mutations WHERE database = 'ki' AND NOT is_done"
        ).to_pylist() == [{"n": 0}]
        b = SampleBuilder()
        for i, v in enumerate(old_values):
            b.add({"__name__": "awk", "s": "1"}, now - 100 + i, v)
        store.insert_samples(b.build())
        want = _bits(np.array(old_values * 2))
        assert _read_back(store, now, 200) == (want, want)
        store.optimize("samples")
        assert _read_back(store, now, 200) == (want, want)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
