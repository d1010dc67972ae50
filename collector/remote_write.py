"""Prometheus remote_write 1.0: snappy-compressed protobuf ``WriteRequest`` -> samples.

The decoder is hand-written for the four messages remote_write 1.0 uses (WriteRequest,
TimeSeries, Label, Sample); exemplars, native histograms and metadata are skipped.
Snappy is the raw block format (not framed), via ``cramjam``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

import numpy as np

from kernel_insight.collector.rows import (
    MAX_TS_MS,
    MIN_TS_MS,
    Labels,
    SampleBatch,
    SampleBuilder,
    SeriesLimits,
    canonical_labels,
    validate_series,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_DECOMPRESSED",
    "RemoteWriteError",
    "RemoteWriteTooLarge",
    "SeriesCache",
    "SeriesEncoder",
    "decode_write_request",
    "decompress",
    "encode_write_request",
    "parse_remote_write",
]

#: Prometheus' classic names and Mimir's size limits (rows.SeriesLimits); ``ki collector`` flags change them.
DEFAULT_LIMITS = SeriesLimits()

#: Refuse bodies that claim to decompress past this (a snappy header states the size up front).
DEFAULT_MAX_DECOMPRESSED = 64 << 20

_DOUBLE = struct.Struct("<d")


class RemoteWriteError(ValueError):
    """A body that is not a valid snappy-compressed WriteRequest (HTTP 400: Prometheus does not retry)."""


class RemoteWriteTooLarge(RemoteWriteError):
    """A body whose snappy header announces more than the decompression limit (HTTP 413)."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise RemoteWriteError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >= 1 << 64:
                raise RemoteWriteError("varint overflows 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise RemoteWriteError("varint longer than 10 bytes")


def _fields(buf: bytes, pos: int, end: int, what: str) -> Iterable[tuple[int, int, int, int]]:
    """Yield (field number, wire type, value or start, end) for each field of one message."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise RemoteWriteError(f"{what}: field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
        elif wire == 1:
            if pos + 8 > end:
                raise RemoteWriteError(f"{what}: truncated 64-bit field")
            yield number, wire, pos, pos + 8
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise RemoteWriteError(f"{what}: field {number} runs past the end of its message")
            yield number, wire, pos, pos + length
            pos += length
        elif wire == 5:
            if pos + 4 > end:
                raise RemoteWriteError(f"{what}: truncated 32-bit field")
            yield number, wire, pos, pos + 4
            pos += 4
        else:
            raise RemoteWriteError(f"{what}: unsupported wire type {wire}")


def _expect(wire: int, want: int, what: str, number: int) -> None:
    if wire != want:
        raise RemoteWriteError(f"{what}: field {number} has wire type {wire}, expected {want}")


def _string(buf: bytes, start: int, end: int, what: str) -> str:
    try:
        return buf[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteWriteError(f"{what} is not valid UTF-8") from None


class _Unusual(Exception):
    """The fast scan met an encoding it does not handle; the general decoder takes the request."""


#: Validated labels by the raw bytes of a TimeSeries' label fields, shared by a collector's requests.
SeriesCache = dict[bytes, Labels]
_CACHE_MAX = 500_000


def decode_write_request(
    buf: bytes, limits: SeriesLimits = DEFAULT_LIMITS, cache: SeriesCache | None = None
) -> SampleBatch:
    """Samples of an uncompressed WriteRequest; raises RemoteWriteError on anything malformed.

    Requests encoded as Prometheus encodes them take a fast scan: each series' label bytes
    are looked up in ``cache`` (parsed and checked against ``limits`` only when new), and
    sample values and timestamps are gathered and decoded with numpy. Anything else
    (exemplars, histograms, fields out of the usual order) goes through the general decoder.
    """
    try:
        return _decode_fast(buf, limits, {} if cache is None else cache)
    except _Unusual:
        return _decode_general(buf, limits)


def _decode_fast(buf: bytes, limits: SeriesLimits, cache: SeriesCache) -> SampleBatch:
    n = len(buf)
    pos = 0
    series: list[Labels] = []
    index: dict[Labels, int] = {}
    sid: list[int] = []
    voff: list[int] = []
    tstart: list[int] = []
    tend: list[int] = []
    while pos < n:
        if buf[pos] != 0x0A:
            raise _Unusual  # metadata (field 3), or anything else: the general decoder skips it
        length = buf[pos + 1] if pos + 1 < n else 0x80
        if length < 0x80:
            start = pos + 2
        else:
            length, start = _varint(buf, pos + 1, n)
        end = start + length
        if end > n:
            raise RemoteWriteError("WriteRequest: field 1 runs past the end of its message")
        p = start
        while p < end and buf[p] == 0x0A:  # labels: skipped here, parsed once per distinct series
            size = buf[p + 1] if p + 1 < end else 0x80
            if size < 0x80:
                p += 2 + size
            else:
                size, q = _varint(buf, p + 1, end)
                p = q + size
        if p > end:
            raise _Unusual
        labels_end = p
        first = len(voff)
        while p < end:
            if buf[p] != 0x12 or p + 1 >= end or buf[p + 1] >= 0x80:
                raise _Unusual  # exemplars, histograms, labels after samples, long samples
            s = p + 2
            e = s + buf[p + 1]
            if e > end:
                raise _Unusual
            if s == e:
                voff.append(-1)
                tstart.append(-1)
                tend.append(-1)
            elif buf[s] == 0x09 and e - s >= 9:
                voff.append(s + 1)
                if e - s == 9:
                    tstart.append(-1)
                    tend.append(-1)
                elif buf[s + 9] == 0x10:
                    tstart.append(s + 10)
                    tend.append(e)
                else:
                    raise _Unusual
            elif buf[s] == 0x10:  # a zero value is left out by proto3 encoders
                voff.append(-1)
                tstart.append(s + 1)
                tend.append(e)
            else:
                raise _Unusual
            p = e
        if first == len(voff):  # no samples: its labels must parse, but are not checked or kept
            _raw_labels(buf, start, labels_end)
        else:
            key = buf[start:labels_end]
            labels = cache.get(key)
            if labels is None:
                labels = _series_labels(buf, start, labels_end, limits)
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[key] = labels
            k = index.get(labels)
            if k is None:
                k = index[labels] = len(series)
                series.append(labels)
            sid.extend([k] * (len(voff) - first))
        pos = end
    return _columns(buf, series, sid, voff, tstart, tend)


def _columns(
    buf: bytes, series: list[Labels], sid: list[int], voff: list[int], tstart: list[int], tend: list[int]
) -> SampleBatch:
    """Values and varint timestamps gathered from their offsets in one numpy pass each."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    m = len(sid)
    vo = np.array(voff, dtype=np.int64)
    has_v = vo >= 0
    values = np.zeros(m, dtype=np.float64)
    if has_v.any():
        at = vo[has_v, None] + np.arange(8)
        values[has_v] = raw[at].view("<f8").reshape(-1)
    ts_s = np.array(tstart, dtype=np.int64)
    ts_e = np.array(tend, dtype=np.int64)
    ts = np.zeros(m, dtype=np.uint64)
    has_t = ts_s >= 0
    if has_t.any():
        s, e = ts_s[has_t], ts_e[has_t]
        lens = e - s
        if lens.min() < 1 or lens.max() > 10:
            raise RemoteWriteError("Sample: malformed timestamp varint")
        k = np.arange(10)
        at = np.minimum(s[:, None] + k, len(raw) - 1)
        inside = k < lens[:, None]
        b = np.where(inside, raw[at], 0).astype(np.uint64)
        last = k == (lens - 1)[:, None]
        if np.any(inside & ~last & (b < 0x80)) or np.any(last & (b >= 0x80)):
            raise RemoteWriteError("Sample: malformed timestamp varint")
        ts[has_t] = np.bitwise_or.reduce(
            (b & np.uint64(0x7F)) << (np.uint64(7) * k.astype(np.uint64)), axis=1
        )
    ts_ms = ts.view(np.int64)
    if m and (ts_ms.min() < MIN_TS_MS or ts_ms.max() > MAX_TS_MS):
        bad = int(ts_ms.min()) if ts_ms.min() < MIN_TS_MS else int(ts_ms.max())
        raise RemoteWriteError(f"sample timestamp {bad} ms is outside 1970-01-01 .. 2149-06-06")
    return SampleBatch(series, np.array(sid, dtype=np.int32), ts_ms, values)


def _raw_labels(buf: bytes, start: int, end: int) -> list[tuple[str, str]]:
    labels: list[tuple[str, str]] = []
    for n2, w2, s2, e2 in _fields(buf, start, end, "TimeSeries"):
        _expect(w2, 2, "TimeSeries", n2)
        labels.append(_label(buf, s2, e2))
    return labels


def _series_labels(buf: bytes, start: int, end: int, limits: SeriesLimits) -> Labels:
    """Parse and check one TimeSeries' labels (the fields before its samples)."""
    return _checked(_raw_labels(buf, start, end), limits)


def _label(buf: bytes, start: int, end: int) -> tuple[str, str]:
    name = value = ""
    for n3, w3, s3, e3 in _fields(buf, start, end, "Label"):
        _expect(w3, 2, "Label", n3)
        if n3 == 1:
            name = _string(buf, s3, e3, "label name")
        elif n3 == 2:
            value = _string(buf, s3, e3, "label value")
    return name, value


def _checked(labels: list[tuple[str, str]], limits: SeriesLimits) -> Labels:
    try:
        canonical = canonical_labels(labels)
        validate_series(canonical, limits)
    except ValueError as exc:
        shown = "{" + ", ".join(f"{k[:64]}={v[:64]!r}" for k, v in labels[:8]) + "}"
        raise RemoteWriteError(f"series {shown}: {exc}") from None
    return canonical


def _decode_general(buf: bytes, limits: SeriesLimits) -> SampleBatch:
    """Any valid WriteRequest, field by field (unknown fields skipped)."""
    out = SampleBuilder()
    for number, wire, start, end in _fields(buf, 0, len(buf), "WriteRequest"):
        if number != 1:
            continue  # 3: metadata
        _expect(wire, 2, "WriteRequest", number)
        labels: list[tuple[str, str]] = []
        ts: list[int] = []
        vs: list[float] = []
        for n2, w2, s2, e2 in _fields(buf, start, end, "TimeSeries"):
            if n2 == 1:
                _expect(w2, 2, "TimeSeries", n2)
                labels.append(_label(buf, s2, e2))
            elif n2 == 2:
                _expect(w2, 2, "TimeSeries", n2)
                value_f = 0.0
                t = 0
                for n3, w3, s3, _e3 in _fields(buf, s2, e2, "Sample"):
                    if n3 == 1:
                        _expect(w3, 1, "Sample", n3)
                        (value_f,) = _DOUBLE.unpack_from(buf, s3)
                    elif n3 == 2:
                        _expect(w3, 0, "Sample", n3)
                        t = s3 - (1 << 64) if s3 >= 1 << 63 else s3
                        if not MIN_TS_MS <= t <= MAX_TS_MS:
                            raise RemoteWriteError(
                                f"sample timestamp {t} ms is outside 1970-01-01 .. 2149-06-06"
                            )
                ts.append(t)
                vs.append(value_f)
            # 3: exemplars, 4: native histograms: not stored yet
        if not ts:
            continue
        out.add_series_canonical(
            _checked(labels, limits), np.asarray(ts, np.int64), np.asarray(vs, np.float64)
        )
    return out.build()


def decompress(body: bytes, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Snappy block decompression, refusing bodies that announce more than ``max_decompressed`` bytes."""
    import cramjam

    try:
        size, _ = _varint(body, 0, min(len(body), 10))
    except RemoteWriteError:
        raise RemoteWriteError("not snappy: the body has no valid length header") from None
    if size > max_decompressed:
        raise RemoteWriteTooLarge(
            f"body decompresses to {size} bytes, over the {max_decompressed}-byte limit"
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise RemoteWriteError(f"not valid snappy: {exc}") from None


def parse_remote_write(
    body: bytes,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    limits: SeriesLimits = DEFAULT_LIMITS,
    cache: SeriesCache | None = None,
) -> SampleBatch:
    """Samples of a snappy-compressed WriteRequest body, as ``POST /api/v1/write`` receives it."""
    return decode_write_request(decompress(body, max_decompressed), limits, cache)


# ---- encoder: tests, benchmarks, and anyone feeding the collector from Python ---------


def _enc_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _enc_len(number: int, payload: bytes) -> bytes:
    return _enc_varint(number << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_write_request(
    series: Iterable[tuple[Mapping[str, str], Iterable[tuple[int, float]]]], *, compress: bool = True
) -> bytes:
    """A WriteRequest for ``[(labels, [(ts_ms, value), ...]), ...]``, snappy-compressed by default."""
    parts = []
    for labels, samples in series:
        ts_parts = [
            _enc_len(1, _enc_len(1, k.encode()) + _enc_len(2, v.encode())) for k, v in sorted(labels.items())
        ]
        for t, v in samples:
            sample = b"\x09" + _DOUBLE.pack(v) + b"\x10" + _enc_varint(t)
            ts_parts.append(_enc_len(2, sample))
        parts.append(_enc_len(1, b"".join(ts_parts)))
    raw = b"".join(parts)
    if not compress:
        return raw
    import cramjam

    return bytes(cramjam.snappy.compress_raw(raw))


class SeriesEncoder:
    """Encodes :class:`SampleBatch` es as WriteRequests with numpy: the fast sender (``ki import``, benches).

    Each series' label fields are encoded once and remembered; samples are laid out as
    columns (tag, length, double, tag, varint timestamp) and packed in one pass.

    >>> body = SeriesEncoder().encode(SampleBatch([(("__name__", "up"),)], np.zeros(1, np.int32),
    ...                                          np.array([1000]), np.array([1.0])))
    >>> len(parse_remote_write(body))
    1
    """

    def __init__(self, cache_max: int = 1_000_000) -> None:
        self._labels: dict[Labels, bytes] = {}
        self._cache_max = cache_max

    def _label_bytes(self, labels: Labels) -> bytes:
        raw = self._labels.get(labels)
        if raw is None:
            raw = b"".join(_enc_len(1, _enc_len(1, k.encode()) + _enc_len(2, v.encode())) for k, v in labels)
            if len(self._labels) >= self._cache_max:
                self._labels.clear()
            self._labels[labels] = raw
        return raw

    def encode(self, batch: SampleBatch, *, compress: bool = True) -> bytes:
        """One WriteRequest with every sample of ``batch``, series by series (snappy-compressed by default)."""
        import cramjam

        n = len(batch)
        order = np.argsort(batch.series_idx, kind="stable")
        idx = batch.series_idx[order]
        ts = batch.ts_ms[order].astype(np.uint64)
        vlen = np.ones(n, dtype=np.int64)
        for k in range(1, 10):
            vlen += (ts >> np.uint64(7 * k)) != 0
        rows = np.zeros((n, 22), dtype=np.uint8)
        rows[:, 0] = 0x12  # TimeSeries.samples, length-delimited
        rows[:, 1] = 10 + vlen  # Sample: 1 + 8 (value) + 1 + varint (timestamp), always < 128
        rows[:, 2] = 0x09  # Sample.value, 64-bit
        rows[:, 3:11] = batch.values[order].astype("<f8").view(np.uint8).reshape(n, 8)
        rows[:, 11] = 0x10  # Sample.timestamp, varint
        for k in range(10):
            byte = ((ts >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
            rows[:, 12 + k] = byte | ((vlen > k + 1).astype(np.uint8) << np.uint8(7))
        flat = rows[np.arange(22) < (12 + vlen)[:, None]].tobytes()
        ends = np.cumsum(12 + vlen)
        series_ends = [*np.flatnonzero(np.diff(idx)).tolist(), n - 1] if n else []
        parts = []
        start = 0
        for last in series_ends:
            body = self._label_bytes(batch.series[int(idx[last])]) + flat[start : int(ends[last])]
            parts.append(_enc_len(1, body))
            start = int(ends[last])
        raw = b"".join(parts)
        return bytes(cramjam.snappy.compress_raw(raw)) if compress else raw
