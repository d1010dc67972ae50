"""Prometheus remote_write 1.0: snappy-compressed protobuf ``WriteRequest`` -> samples.

The decoder is hand-written for the four messages remote_write 1.0 uses (WriteRequest,
TimeSeries, Label, Sample); exemplars, native histograms and metadata are skipped.
Snappy is the raw block format (not framed), via ``cramjam``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

import numpy as np

from kernel_insight.collector.rows import MAX_TS_MS, MIN_TS_MS, Labels, SampleBatch, SampleBuilder

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "RemoteWriteError",
    "RemoteWriteTooLarge",
    "SeriesEncoder",
    "decode_write_request",
    "decompress",
    "encode_write_request",
    "parse_remote_write",
]

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


def decode_write_request(buf: bytes) -> SampleBatch:
    """Samples of an uncompressed WriteRequest; raises RemoteWriteError on anything malformed."""
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
                name = value = ""
                for n3, w3, s3, e3 in _fields(buf, s2, e2, "Label"):
                    _expect(w3, 2, "Label", n3)
                    if n3 == 1:
                        name = _string(buf, s3, e3, "label name")
                    elif n3 == 2:
                        value = _string(buf, s3, e3, "label value")
                labels.append((name, value))
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
        try:
            out.add_series(labels, np.asarray(ts, np.int64), np.asarray(vs, np.float64))
        except ValueError as exc:
            shown = "{" + ", ".join(f"{k}={v!r}" for k, v in labels[:8]) + "}"
            raise RemoteWriteError(f"series {shown}: {exc}") from None
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


def parse_remote_write(body: bytes, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> SampleBatch:
    """Samples of a snappy-compressed WriteRequest body, as ``POST /api/v1/write`` receives it."""
    return decode_write_request(decompress(body, max_decompressed))


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
