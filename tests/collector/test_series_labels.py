"""remote_write's new series in C (collector/native/series_labels.c, ki_blake2b.c) against the Python path.

The C parse must give exactly the labels, fingerprint and metric name that ``canonical_labels``,
``validate_series`` and ``series_fingerprint`` give (stored data is keyed by the fingerprint),
and must leave to the Python path (None) every series that path refuses, so the sender reads
the same 400 and message as before. Label sets are random (unicode, empty values, repeated
and invalid names, sizes about the limits); the label bytes are also mutated at random.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector import _decode
from kernel_insight.collector.remote_write import (
    RemoteWriteError,
    SeriesCache,
    _enc_len,
    _series_labels,
    decode_write_request,
    encode_write_request,
    parse_remote_write,
)
from kernel_insight.collector.rows import SeriesLimits, series_fingerprint

SMALL = SeriesLimits(max_labels=6, max_name_bytes=24, max_value_bytes=40)
LIMITS = [SeriesLimits(), SeriesLimits(utf8_names=True), SMALL, SeriesLimits(0, 0, 0, True)]


def _label_bytes(pairs: list[tuple[str, str]]) -> bytes:
    """A TimeSeries' label fields as Prometheus encodes them (proto3: an empty value left out)."""
    out = b""
    for k, v in pairs:
        body = _enc_len(1, k.encode("utf-8", "surrogatepass"))
        if v:
            body += _enc_len(2, v.encode("utf-8", "surrogatepass"))
        out += _enc_len(1, body)
    return out


def _c(raw: bytes, limits: SeriesLimits) -> tuple[tuple[tuple[str, str], ...], int, str] | None:
    spans = np.array([[0, len(raw)]], dtype=np.int64).tobytes()
    return _decode.series_labels(
        raw, spans, limits.max_labels, limits.max_name_bytes, limits.max_value_bytes, limits.utf8_names
    )[0]


def _python(raw: bytes, limits: SeriesLimits) -> tuple[tuple[tuple[str, str], ...], int, str] | str:
    try:
        labels = _series_labels(raw, 0, len(raw), limits)
    except RemoteWriteError as exc:
        return str(exc)
    return labels, series_fingerprint(labels), dict(labels)["__name__"]


def _agrees(raw: bytes, limits: SeriesLimits) -> None:
    c = _c(raw, limits)
    py = _python(raw, limits)
    if c is not None:
        assert c == py  # what C accepts, Python accepts the same way
    else:
        # Left to Python: refused there with a message, or a case C does not take (a Label
        # without a name field first, or more than 128 labels).
        assert isinstance(py, str) or b"\x0a\x00" in raw or raw.count(b"\x0a") > 128 or _unusual(raw)


def _unusual(raw: bytes) -> bool:
    """Label fields not in Prometheus' encoding (name field 1 first, then value field 2, nothing else)."""
    pos = 0
    while pos < len(raw):
        if raw[pos] != 0x0A:
            return True
        n, pos = _varint(raw, pos + 1)
        body = raw[pos : pos + n]
        pos += n
        if not body or body[0] != 0x0A:
            return True
        m, q = _varint(body, 1)
        q += m
        if q < len(body):
            if body[q] != 0x12:
                return True
            m2, q2 = _varint(body, q + 1)
            if q2 + m2 != len(body):
                return True
    return False


def _varint(b: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        c = b[pos]
        pos += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, pos


_NAMES = st.one_of(
    st.sampled_from(["__name__", "job", "instance", "cpu", "mode", "le", "a_b", "Z9", "_x"]),
    st.text(max_size=30),  # unicode, empty, invalid classic names
    st.text(alphabet="abcXYZ_:09", min_size=0, max_size=30),
)
_VALUES = st.one_of(
    st.just(""), st.text(max_size=50), st.sampled_from(["up", "node_cpu:rate", "9bad", "a-b"])
)


@settings(max_examples=600, deadline=None)
@given(
    pairs=st.lists(st.tuples(_NAMES, _VALUES), max_size=10),
    metric=st.one_of(st.none(), _VALUES),
    limits=st.sampled_from(LIMITS),
    shuffle=st.randoms(use_true_random=False),
)
def test_random_label_sets_agree_with_the_python_path(
    pairs: list[tuple[str, str]], metric: str | None, limits: SeriesLimits, shuffle: object
) -> None:
    if metric is not None:
        pairs = [*pairs, ("__name__", metric)]
    shuffle.shuffle(pairs)  # type: ignore[attr-defined]
    _agrees(_label_bytes(pairs), limits)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(_NAMES, st.text(max_size=20)), min_size=1, max_size=8),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_mutated_label_bytes_never_crash_and_never_disagree(
    pairs: list[tuple[str, str]], edits: list[tuple[int, int]], cut: int
) -> None:
    raw = bytearray(_label_bytes([("__name__", "up"), *pairs]))
    for at, byte in edits:
        raw[at % len(raw)] = byte
    raw = raw[: max(1, cut % (len(raw) + 1))]
    for limits in LIMITS:
        c = _c(bytes(raw), limits)
        if c is not None:
            assert c == _python(bytes(raw), limits)


@pytest.mark.parametrize("size", [0, 1, 100, 111, 112, 113, 127, 128, 129, 255, 256, 257, 1000, 5000])
def test_fingerprints_across_blake2b_block_boundaries(size: int) -> None:
    # The message is name 0xFF value 0xFE per label: values sized so it ends on, before and
    # after 128-byte block boundaries, and past the C parse's 4 KB scratch buffer.
    given = (("__name__", "m"), ("v", "ü" * (size // 2) + "x" * (size % 2)))
    labels = tuple((k, v) for k, v in given if v)
    raw = _label_bytes(list(labels))
    c = _c(raw, SeriesLimits(0, 0, 0, True))
    assert c is not None
    assert c[1] == series_fingerprint(labels)
    h = hashlib.blake2b(
        b"".join(k.encode() + b"\xff" + v.encode() + b"\xfe" for k, v in labels), digest_size=8
    )
    assert c[1] == int.from_bytes(h.digest(), "little")


def test_label_bytes_of_exotic_text_and_bad_utf8() -> None:
    ok = [("__name__", "up"), ("x", "\U0001f600 \u00e9\u4e2d \u0000"), ("e", "")]
    c = _c(_label_bytes(ok), SeriesLimits())
    assert c == _python(_label_bytes(ok), SeriesLimits())
    assert c is not None
    assert c[0] == (("__name__", "up"), ("x", "\U0001f600 \u00e9\u4e2d \u0000"))
    for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"):
        raw = _enc_len(1, _enc_len(1, b"__name__") + _enc_len(2, b"up")) + _enc_len(
            1, _enc_len(1, b"x") + _enc_len(2, bad)
        )
        assert _c(raw, SeriesLimits()) is None
        assert "UTF-8" in str(_python(raw, SeriesLimits()))


def test_spans_outside_the_buffer_raise() -> None:
    with pytest.raises(ValueError, match="outside"):
        _decode.series_labels(b"abc", np.array([[0, 9]], np.int64).tobytes(), 0, 0, 0, False)
    with pytest.raises(ValueError, match="pairs"):
        _decode.series_labels(b"abc", b"\0" * 8, 0, 0, 0, False)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"job": "a"}, "metric name"),
        ({"__name__": "9up"}, "invalid metric name"),
        ({"__name__": "up", "a-b": "1"}, "invalid label name"),
        ({"__name__": "up", "v": "x" * 3000}, "over the limit"),
        ({"__name__": "up", **{f"l{i}": "1" for i in range(40)}}, "exceed the limit"),
    ],
)
def test_refused_new_series_answer_the_same_message(labels: dict[str, str], message: str) -> None:
    body = encode_write_request([(labels, [(1_000, 1.0)])])
    cache = SeriesCache()
    with pytest.raises(RemoteWriteError, match=message):
        parse_remote_write(body, cache=cache)
    assert len(cache) == 0


def test_repeated_label_name_is_refused_with_its_name() -> None:
    raw = _label_bytes([("__name__", "up"), ("a", "1"), ("a", "2")])
    sample = _enc_len(2, b"\x09" + b"\0" * 8 + b"\x10\x01")
    with pytest.raises(RemoteWriteError, match="repeated label name"):
        decode_write_request(_enc_len(1, raw + sample), cache=SeriesCache())


def test_a_request_of_new_series_stores_the_python_fingerprints() -> None:
    rng = np.random.default_rng(3)
    series = [
        (
            {"__name__": f"m{i % 7}", "instance": f"h{i}", "v": "é" * int(rng.integers(0, 5))},
            [(1_000 + i, float(i))],
        )
        for i in range(300)
    ]
    batch = decode_write_request(encode_write_request(series, compress=False), cache=SeriesCache())
    assert batch.series_meta is not None
    fps, codes, names = batch.series_meta
    for i, labels in enumerate(batch.series):
        assert int(fps[i]) == series_fingerprint(labels)
        assert names[int(codes[i])] == dict(labels)["__name__"]
