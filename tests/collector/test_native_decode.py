"""The C decoding loops (collector/native/decodemodule.c) against Python oracles, and fuzzed.

``varints`` is checked against the numpy decoder it replaced in collector/wire.py; the
remote_write scan against the general (field by field) decoder, on valid requests and on
mutated ones: the C code must never crash, read out of bounds or accept what the general
decoder refuses.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector import _decode
from kernel_insight.collector.remote_write import (
    RemoteWriteError,
    SeriesCache,
    _decode_general,
    decode_write_request,
    encode_write_request,
)
from kernel_insight.collector.rows import SeriesLimits, series_fingerprint

ANY_NAMES = SeriesLimits(utf8_names=True)


def _numpy_varints(buf: bytes, n: int) -> list[int] | str:
    """The numpy decoder collector/wire.py used before (the oracle); an error's message."""
    b = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != n or (n and int(ends[-1]) != b.size - 1) or (n == 0 and b.size):
        return f"expected {n} varints in {b.size} bytes"
    if n == 0:
        return []
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    maxlen = int(lens.max())
    if maxlen > 10:
        return "varint longer than 10 bytes"
    last = b[ends]
    if np.any((lens > 1) & (last == 0)):
        return "non-canonical varint"
    if maxlen == 10 and np.any(last[lens == 10] > 1):
        return "varint does not fit 64 bits"
    out = np.zeros(n, dtype=np.uint64)
    for k in range(maxlen):
        m = lens > k
        out[m] |= (b[starts[m] + k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
    return [int(x) for x in out]


def _c_varints(buf: bytes, n: int) -> list[int] | str:
    try:
        return np.frombuffer(_decode.varints(buf, n), dtype=np.uint64).tolist()
    except ValueError as exc:
        return str(exc)


def _encode(v: int) -> bytes:
    out = bytearray()
    while True:
        if v < 0x80:
            out.append(v)
            return bytes(out)
        out.append((v & 0x7F) | 0x80)
        v >>= 7


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_varints_decode_what_was_encoded(values):
    assert _c_varints(b"".join(map(_encode, values)), len(values)) == values


@settings(max_examples=600, deadline=None)
@given(
    st.binary(max_size=40)
    | st.lists(st.sampled_from([b"\x80", b"\xff", b"\x00", b"\x01", b"\x7f", b"\x02"]), max_size=24).map(
        b"".join
    ),
    st.integers(0, 12),
)
def test_varints_agree_with_the_numpy_decoder_on_any_bytes(buf, n):
    want, got = _numpy_varints(buf, n), _c_varints(buf, n)
    if isinstance(want, str):
        # The same refusal; the message may name another of several faults first.
        assert isinstance(got, str)
    else:
        assert got == want


def test_varints_refuse_with_the_wire_messages():
    assert _c_varints(b"\x80\x00", 1) == "non-canonical varint"
    assert _c_varints(b"\xff" * 9 + b"\x02", 1) == "varint does not fit 64 bits"
    assert _c_varints(b"\xff" * 10 + b"\x01", 1) == "varint longer than 10 bytes"
    assert _c_varints(b"\x01\x02", 1) == "expected 1 varints in 2 bytes"
    assert _c_varints(b"\x81", 1) == "expected 1 varints in 1 bytes"
    assert _c_varints(b"", -1) == "expected -1 varints in 0 bytes"


_labels = st.dictionaries(
    st.sampled_from(["job", "gpu", "a", "b" * 130]),
    st.sampled_from(["", "x", "0", "é", "v" * 200]),
    max_size=3,
).map(lambda d: {**d, "__name__": "m"})
_samples = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 127, 128, 1_700_000_000_000, 5_662_310_399_999]),
        st.sampled_from([0.0, 1.5, -2.0, float("inf")]),
    ),
    max_size=4,
)


def _rows(batch):
    return sorted(
        repr((sorted(batch.series[i]), t, v))
        for i, t, v in zip(
            batch.series_idx.tolist(), batch.ts_ms.tolist(), batch.values.tolist(), strict=True
        )
    )


def _outcome(decode, raw: bytes) -> list[str] | type:
    try:
        return _rows(decode(raw))
    except RemoteWriteError:
        return RemoteWriteError


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_labels, _samples), max_size=6), st.data())
def test_the_scan_agrees_with_the_general_decoder_on_mutated_requests(series, data):
    raw = bytearray(encode_write_request(series, compress=False))
    edits = data.draw(
        st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)), max_size=3)
    )
    for at, byte in edits:
        if raw:
            raw[at] = byte
    cut = data.draw(st.integers(0, len(raw)))
    raw = bytes(raw[:cut])
    with contextlib.suppress(ValueError):
        _decode.write_request(raw)  # never crashes, never anything but ValueError
    general = _outcome(lambda b: _decode_general(b, ANY_NAMES, None), raw)
    fast = _outcome(lambda b: decode_write_request(b, ANY_NAMES, SeriesCache()), raw)
    if general is RemoteWriteError:
        assert fast is RemoteWriteError
    else:
        assert fast == general


@pytest.mark.parametrize("size", [0, 1, 2, 3, 127, 128, 129, 2000])
def test_the_scan_of_requests_of_every_size(size):
    series = [({"__name__": "m", "i": str(i)}, [(1_700_000_000_000 + i, float(i))]) for i in range(size)]
    raw = encode_write_request(series, compress=False)
    assert _rows(decode_write_request(raw, ANY_NAMES, SeriesCache())) == _rows(
        _decode_general(raw, ANY_NAMES, None)
    )
    scanned = _decode.write_request(raw)
    assert scanned is not None
    assert len(scanned[1]) == 8 * size


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=60))
def test_the_series_index_numbers_keys_as_a_dict_does(keys):
    index = _decode.SeriesIndex()
    oracle: dict[bytes, int] = {}
    for key in keys:
        assert index.get(key) == oracle.get(key, -1)
        assert index.add(key) == oracle.setdefault(key, len(oracle))
    assert len(index) == len(oracle)
    buf = b"".join(keys)
    triples, at = [], 0
    for key in keys:
        triples.append((at, at + len(key), 1))
        at += len(key)
    triples.append((0, 0, 0))  # the empty key
    got = np.frombuffer(index.lookup(buf, np.array(triples, np.int64).tobytes()), np.int32).tolist()
    assert got == [oracle[k] for k in keys] + [oracle.get(b"", -1)]


def test_the_series_index_refuses_triples_outside_the_buffer():
    index = _decode.SeriesIndex()
    for bad in ([(2, 9, 1)], [(-1, 2, 1)], [(3, 2, 1)]):
        with pytest.raises(ValueError, match="outside the buffer"):
            index.lookup(b"abcdef", np.array(bad, np.int64).tobytes())
    with pytest.raises(ValueError, match="triples"):
        index.lookup(b"abcdef", b"1234")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(_labels, _samples), max_size=5), min_size=1, max_size=5), st.data())
def test_one_cache_shared_by_many_requests_decodes_each_as_the_general_decoder(requests, data):
    """The cache remembers series across requests (and starts again past max_series): every
    request still decodes exactly as the field-by-field decoder, with its series' metadata."""
    cache = SeriesCache(max_series=data.draw(st.sampled_from([1, 3, 1000])))
    for series in requests:
        raw = bytearray(encode_write_request(series, compress=False))
        for at, byte in data.draw(
            st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)), max_size=1)
        ):
            if raw:
                raw[at] = byte
        raw_b = bytes(raw)
        general = _outcome(lambda b: _decode_general(b, ANY_NAMES, None), raw_b)
        fast = _outcome(lambda b: decode_write_request(b, ANY_NAMES, cache), raw_b)
        if general is RemoteWriteError:
            assert fast is RemoteWriteError
            continue
        assert fast == general
        batch = decode_write_request(raw_b, ANY_NAMES, cache)
        if batch.series_meta is not None:
            fps, codes, names = batch.series_meta
            assert fps.tolist() == [series_fingerprint(s) for s in batch.series]
            assert [names[c] for c in codes.tolist()] == [dict(s)["__name__"] for s in batch.series]
