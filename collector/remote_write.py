"""Prometheus remote_write: snappy-compressed protobuf -> samples and native histograms.

The decoder is hand-written for the messages remote_write 1.0 uses (WriteRequest,
TimeSeries, Label, Sample, Histogram, BucketSpan; prompb/types.proto) and 2.0's Request
(symbols and label references, start timestamps; write/v2/types.proto); exemplars and
metadata are skipped.
Snappy is the raw block format (not framed), via ``cramjam``.
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from kernel_insight.collector import _decode
from kernel_insight.collector.rows import (
    MAX_TS_MS,
    MIN_TS_MS,
    HistogramBuilder,
    Labels,
    SampleBatch,
    SampleBuilder,
    SeriesLimits,
    canonical_labels,
    series_fingerprint,
    validate_series,
)
from kernel_insight.collector.varint import decode as decode_varint
from kernel_insight.collector.varint import encode as encode_varint

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_DECOMPRESSED",
    "RemoteWriteError",
    "RemoteWriteTooLarge",
    "SeriesCache",
    "SeriesEncoder",
    "announced_size",
    "decode_write_request",
    "decode_write_request_v2",
    "decompress",
    "encode_histogram",
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
    return decode_varint(buf, pos, end, RemoteWriteError)


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


#: Series whose parsed labels a collector keeps for remote_write (``ki collector --remote-write-series``):
#: sized for a fleet's active series; past it the cache starts again empty (and says so in its count).
DEFAULT_SERIES_CACHE = 2_000_000


class _Known:
    """One generation of a SeriesCache: series ``i`` has ``labels[i]``, ``fingerprints[i]`` and the
    metric ``names[codes[i]]``. Only ever appended to (under the cache's lock) and published to
    ``index`` last, so a reader that found an id in ``index`` finds its entries here."""

    def __init__(self) -> None:
        self.index = _decode.SeriesIndex()
        self.labels: list[Labels] = []
        self.fingerprints = np.zeros(1024, np.uint64)
        self.codes = np.zeros(1024, np.int32)
        self.names: list[str] = []
        self.name_codes: dict[str, int] = {}


class SeriesCache:
    """remote_write's series by the raw bytes of their label fields, shared by a collector's requests.

    A series is parsed and checked (``SeriesLimits``) the first time its label bytes arrive;
    after that a request's series are found by one C lookup for all of them
    (``_decode.SeriesIndex``), with no Python step per series, and come with their fingerprint
    and metric name (``SampleBatch.series_meta``), so the store looks nothing up per series
    either. When a request's new series would take it past ``max_series`` series it starts again
    empty (``resets`` counts it): a request of known series never does. Safe to share between threads.
    """

    def __init__(self, max_series: int = DEFAULT_SERIES_CACHE) -> None:
        self.max_series = max_series
        self._known = _Known()
        self._lock = threading.Lock()
        self.resets = 0

    def __len__(self) -> int:
        return len(self._known.labels)

    def resolve(
        self, buf: bytes, raw_series: bytes, limits: SeriesLimits
    ) -> tuple[_Known, np.ndarray[Any, np.dtype[np.int32]]]:
        """The generation and, per TimeSeries of ``raw_series`` (``_decode.write_request``'s
        triples), its id there; series without samples get -1 (their labels are only parsed)."""
        triples = np.frombuffer(raw_series, dtype=np.int64).reshape(-1, 3)
        counts = triples[:, 2]
        known = self._known
        ids = np.frombuffer(known.index.lookup(buf, raw_series), dtype=np.int32).copy()
        new = int(np.count_nonzero((ids < 0) & (counts > 0)))
        if new and len(known.labels) + new > self.max_series:
            with self._lock:
                if self._known is known:
                    self._known = _Known()
                    self.resets += 1
                known = self._known
            ids = np.frombuffer(known.index.lookup(buf, raw_series), dtype=np.int32).copy()
        for j in np.flatnonzero(counts == 0).tolist():  # no samples: its labels must parse, nothing kept
            _raw_labels(buf, int(triples[j, 0]), int(triples[j, 1]))
            ids[j] = -1
        missing = np.flatnonzero((ids < 0) & (counts > 0))
        if len(missing):
            # Parsed, made canonical, checked and fingerprinted in C (collector/native/series_labels.c);
            # a series it leaves (None: a rare encoding, or one the checks refuse) takes the Python
            # path, which gives the same labels or raises the error the sender reads.
            parsed = _decode.series_labels(
                buf,
                triples[missing, :2].tobytes(),
                limits.max_labels,
                limits.max_name_bytes,
                limits.max_value_bytes,
                limits.utf8_names,
            )
            with self._lock:
                ids[missing] = self._add_all(known, buf, triples[missing, :2], parsed, limits)
        return known, ids

    @staticmethod
    def _add_all(
        known: _Known,
        buf: bytes,
        spans: np.ndarray[Any, np.dtype[np.int64]],
        parsed: list[tuple[Labels, int, str] | None],
        limits: SeriesLimits,
    ) -> np.ndarray[Any, np.dtype[np.int32]]:
        """Ids of the series at ``spans`` (int64 (start, end) of their label bytes), those not in
        ``known`` added (under the cache's lock): keys added at once in C, unpublished, then
        their entries written in bulk, then published, so readers find only complete entries.
        A Python step per new series is a step per sample of a new round: none but list
        building here (make bench-fleet-ingest, bench/results/fleet.md)."""
        index = known.index
        # The rare series the C parse left, parsed (or refused: nothing is added then) before anything is.
        for j in [j for j, p in enumerate(parsed) if p is None]:
            start, end = spans[j].tolist()
            if index.get(buf[start:end]) < 0:
                series = _series_labels(buf, start, end, limits)
                parsed[j] = (series, series_fingerprint(series), dict(series)["__name__"])
        base = len(known.labels)
        ids = np.frombuffer(index.add_spans(buf, np.ascontiguousarray(spans).tobytes()), np.int32)
        try:
            fresh = np.flatnonzero(ids >= base)
            if len(fresh):
                # New ids follow the order of first appearance: the first of each is its entry.
                _, first = np.unique(ids[fresh], return_index=True)
                entries = cast("list[tuple[Labels, int, str]]", [parsed[j] for j in fresh[first].tolist()])
                names = [e[2] for e in entries]
                name_codes = known.name_codes
                for name in dict.fromkeys(names):
                    if name not in name_codes:
                        name_codes[name] = len(known.names)
                        known.names.append(name)
                end = base + len(entries)
                if end > len(known.fingerprints):
                    size = max(end, 2 * len(known.fingerprints))
                    known.fingerprints = np.concatenate(
                        [known.fingerprints, np.zeros(size - len(known.fingerprints), np.uint64)]
                    )
                    known.codes = np.concatenate([known.codes, np.zeros(size - len(known.codes), np.int32)])
                known.fingerprints[base:end] = np.fromiter((e[1] for e in entries), np.uint64, len(entries))
                known.codes[base:end] = [name_codes[n] for n in names]
                known.labels.extend([e[0] for e in entries])
            index.publish()  # last: readers find only complete entries
        except BaseException:
            del known.labels[base:]
            index.rollback()
            raise
        return ids


def decode_write_request(
    buf: bytes,
    limits: SeriesLimits = DEFAULT_LIMITS,
    cache: SeriesCache | None = None,
    histograms: HistogramBuilder | None = None,
) -> SampleBatch:
    """Samples of an uncompressed WriteRequest; raises RemoteWriteError on anything malformed.

    Native histogram samples (``TimeSeries.histograms``, integer and float) are added to
    ``histograms`` when one is given, and checked but dropped otherwise.

    Requests encoded as Prometheus encodes them take a fast scan: each series' label bytes
    are looked up in ``cache`` (parsed and checked against ``limits`` only when new), and
    sample values and timestamps are gathered and decoded with numpy. Anything else
    (exemplars, histograms, fields out of the usual order) goes through the general decoder.
    """
    try:
        return _decode_fast(buf, limits, SeriesCache() if cache is None else cache)
    except _Unusual:
        return _decode_general(buf, limits, histograms)


def _decode_fast(buf: bytes, limits: SeriesLimits, cache: SeriesCache) -> SampleBatch:
    # The scan (where each series' labels are; values and timestamps as columns) is C
    # (collector/native/decodemodule.c): in Python it was the largest part of the collector's
    # cost per remote_write sample. The series are found by their label bytes in the cache, all
    # at once in C (a Python step per series is a step per sample: a Prometheus request holds
    # one sample of each of its series). make bench-fleet-ingest, bench/results/fleet.md.
    try:
        scanned = _decode.write_request(buf)
    except ValueError as exc:
        raise RemoteWriteError(str(exc)) from None
    if scanned is None:
        raise _Unusual  # metadata, exemplars, histograms, fields out of the usual order
    raw_series, raw_values, raw_ts = scanned
    known, ids = cache.resolve(buf, raw_series, limits)
    counts = np.frombuffer(raw_series, dtype=np.int64)[2::3]
    if (ids < 0).any():  # series without samples (id -1) have no entry
        counts = counts[ids >= 0]
        ids = ids[ids >= 0]
    # One entry of ``series`` per TimeSeries with samples, in the request's order: no sort to
    # merge the rare series sent twice in one request (each entry's samples are stored alike,
    # and the store writes a series row once per day). np.unique over a request's samples
    # cost more than the rest of the decode.
    sid = np.repeat(np.arange(len(ids), dtype=np.int32), counts)
    ts_ms = np.frombuffer(raw_ts, dtype=np.int64).copy()
    if len(ts_ms) and (ts_ms.min() < MIN_TS_MS or ts_ms.max() > MAX_TS_MS):
        bad = int(ts_ms.min()) if ts_ms.min() < MIN_TS_MS else int(ts_ms.max())
        raise RemoteWriteError(f"sample timestamp {bad} ms is outside 1970-01-01 .. 2149-06-06")
    labels = known.labels
    return SampleBatch(
        [labels[i] for i in ids.tolist()],
        sid,
        ts_ms,
        np.frombuffer(raw_values, dtype=np.float64).copy(),
        (known.fingerprints[ids], known.codes[ids], known.names),
    )


def _raw_labels(buf: bytes, start: int, end: int) -> list[tuple[str, str]]:
    """A TimeSeries' labels. Labels as every Prometheus encodes them (a Label of name then value,
    lengths under 128 bytes) are read by indexing; anything else, or an error, by the field walk
    below, which says what is wrong. A new series costs this once (~a third of its first sample)."""
    labels: list[tuple[str, str]] = []
    pos = start
    try:
        while pos < end:
            size = buf[pos + 1]
            if buf[pos] != 0x0A or size >= 0x80 or pos + 2 + size > end:
                return _raw_labels_walk(buf, start, end)
            p = pos + 2
            pos = p + size
            name_size = buf[p + 1]
            if buf[p] != 0x0A or name_size >= 0x80:
                return _raw_labels_walk(buf, start, end)
            name_end = p + 2 + name_size
            if name_end == pos:
                value = ""
            else:
                value_size = buf[name_end + 1]
                if buf[name_end] != 0x12 or value_size >= 0x80 or name_end + 2 + value_size != pos:
                    return _raw_labels_walk(buf, start, end)
                value = buf[name_end + 2 : pos].decode("utf-8")
            if name_end > pos:
                return _raw_labels_walk(buf, start, end)
            labels.append((buf[p + 2 : name_end].decode("utf-8"), value))
    except (IndexError, UnicodeDecodeError):
        return _raw_labels_walk(buf, start, end)
    return labels


def _raw_labels_walk(buf: bytes, start: int, end: int) -> list[tuple[str, str]]:
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


def _decode_general(
    buf: bytes, limits: SeriesLimits, histograms: HistogramBuilder | None = None
) -> SampleBatch:
    """Any valid WriteRequest, field by field (unknown fields skipped)."""
    out = SampleBuilder()
    for number, wire, start, end in _fields(buf, 0, len(buf), "WriteRequest"):
        if number != 1:
            continue  # 3: metadata
        _expect(wire, 2, "WriteRequest", number)
        labels: list[tuple[str, str]] = []
        ts: list[int] = []
        vs: list[float] = []
        hists: list[tuple[int, int]] = []
        for n2, w2, s2, e2 in _fields(buf, start, end, "TimeSeries"):
            if n2 == 1:
                _expect(w2, 2, "TimeSeries", n2)
                labels.append(_label(buf, s2, e2))
            elif n2 == 2:
                _expect(w2, 2, "TimeSeries", n2)
                _sample(buf, s2, e2, ts, vs)
            elif n2 == 4:
                _expect(w2, 2, "TimeSeries", n2)
                hists.append((s2, e2))
            # 3: exemplars: not stored
        _add_series(buf, labels, ts, vs, hists, limits, out, histograms)
    return out.build()


def _sample(
    buf: bytes, start: int, end: int, ts: list[int], vs: list[float], sts: list[int] | None = None
) -> None:
    """One Sample message (v1 and v2 alike) appended to ``ts`` / ``vs``; with ``sts``, 2.0's
    ``start_timestamp`` (field 3, 0 = unset) to it."""
    value_f = 0.0
    t = st = 0
    for n3, w3, s3, _e3 in _fields(buf, start, end, "Sample"):
        if n3 == 1:
            _expect(w3, 1, "Sample", n3)
            (value_f,) = _DOUBLE.unpack_from(buf, s3)
        elif n3 == 2:
            _expect(w3, 0, "Sample", n3)
            t = _timestamp(s3, "sample")
        elif n3 == 3 and sts is not None:
            _expect(w3, 0, "Sample", n3)
            st = _start_timestamp(s3, "sample")
    ts.append(t)
    vs.append(value_f)
    if sts is not None:
        sts.append(st)


def _add_series(
    buf: bytes,
    labels: list[tuple[str, str]],
    ts: list[int],
    vs: list[float],
    hists: list[tuple[int, int]],
    limits: SeriesLimits,
    out: SampleBuilder,
    histograms: HistogramBuilder | None,
    sts: list[int] | None = None,
) -> None:
    """One decoded TimeSeries' samples into ``out`` and its Histogram messages into ``histograms``
    (``sts``: the samples' start timestamps, remote_write 2.0 only)."""
    if not ts and not hists:
        return
    canonical = _checked(labels, limits)
    if ts:
        st = None if not sts or not any(sts) else np.asarray(sts, np.int64)
        out.add_series_canonical(canonical, np.asarray(ts, np.int64), np.asarray(vs, np.float64), st)
    for s2, e2 in hists:
        fields = _histogram(buf, s2, e2, v2=sts is not None)
        if histograms is None:
            continue
        try:
            histograms.add(canonical, **fields)
        except ValueError as exc:
            raise RemoteWriteError(f"series {_shown(canonical)}: histogram: {exc}") from None


def decode_write_request_v2(
    buf: bytes, limits: SeriesLimits = DEFAULT_LIMITS, histograms: HistogramBuilder | None = None
) -> SampleBatch:
    """Samples of an uncompressed remote write 2.0 ``io.prometheus.write.v2.Request``.

    Labels are pairs of references into the request's ``symbols``; samples and native
    histograms (the same Histogram message as 1.0's) as in :func:`decode_write_request`, plus
    their start timestamps (``Sample.start_timestamp``, field 3; ``Histogram.start_timestamp``,
    field 17; 0 = unset), which ``rate``, ``increase``, ``irate`` and ``resets`` read (docs/kql.md).
    Exemplars, metadata and the older per-series ``created_timestamp`` (field 6) are skipped.
    """
    symbols: list[str] = []
    series: list[tuple[int, int]] = []
    for number, wire, start, end in _fields(buf, 0, len(buf), "Request"):
        if number == 4:
            _expect(wire, 2, "Request", number)
            symbols.append(_string(buf, start, end, "symbol"))
        elif number == 5:
            _expect(wire, 2, "Request", number)
            series.append((start, end))
    out = SampleBuilder()
    for start, end in series:
        refs: list[int] = []
        ts: list[int] = []
        vs: list[float] = []
        sts: list[int] = []
        hists: list[tuple[int, int]] = []
        for n2, w2, s2, e2 in _fields(buf, start, end, "TimeSeries"):
            if n2 == 1:
                refs.extend(_packed_varints(buf, n2, w2, s2, e2, "TimeSeries"))
            elif n2 == 2:
                _expect(w2, 2, "TimeSeries", n2)
                _sample(buf, s2, e2, ts, vs, sts)
            elif n2 == 3:
                _expect(w2, 2, "TimeSeries", n2)
                hists.append((s2, e2))
            # 4: exemplars, 5: metadata, 6: created_timestamp: not stored
        if len(refs) % 2:
            raise RemoteWriteError(f"TimeSeries: {len(refs)} label references, not name/value pairs")
        if refs and max(refs) >= len(symbols):
            raise RemoteWriteError(f"TimeSeries: label reference {max(refs)} past the {len(symbols)} symbols")
        labels = [(symbols[refs[k]], symbols[refs[k + 1]]) for k in range(0, len(refs), 2)]
        _add_series(buf, labels, ts, vs, hists, limits, out, histograms, sts)
    return out.build()


def _timestamp(raw: int, what: str) -> int:
    t = raw - (1 << 64) if raw >= 1 << 63 else raw
    if not MIN_TS_MS <= t <= MAX_TS_MS:
        raise RemoteWriteError(f"{what} timestamp {t} ms is outside 1970-01-01 .. 2149-06-06")
    return t


def _start_timestamp(raw: int, what: str) -> int:
    """A start timestamp (int64 ms, 0 = unset): any value the sample timestamps may take, as the
    ``st`` column stores it; the queries ignore one at or after its sample's time, as Prometheus."""
    t = raw - (1 << 64) if raw >= 1 << 63 else raw
    if t and not MIN_TS_MS <= t <= MAX_TS_MS:
        raise RemoteWriteError(f"{what} start timestamp {t} ms is outside 1970-01-01 .. 2149-06-06")
    return t


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _shown(labels: Labels) -> str:
    return "{" + ", ".join(f"{k[:64]}={v[:64]!r}" for k, v in labels[:8]) + "}"


def _packed_varints(
    buf: bytes, number: int, wire: int, start: int, end: int, what: str = "Histogram"
) -> list[int]:
    """A repeated varint field's values: packed (one length-delimited run) or one per field."""
    if wire == 0:
        return [start]  # _fields yields the value itself for varints
    _expect(wire, 2, what, number)
    out = []
    pos = start
    while pos < end:
        v, pos = _varint(buf, pos, end)
        out.append(v)
    return out


def _packed_doubles(buf: bytes, number: int, wire: int, start: int, end: int) -> list[float]:
    """A repeated double field's values: packed or one per field."""
    if wire == 1:
        return [_DOUBLE.unpack_from(buf, start)[0]]
    _expect(wire, 2, "Histogram", number)
    if (end - start) % 8:
        raise RemoteWriteError(f"Histogram: field {number} holds {end - start} bytes, not whole doubles")
    return np.frombuffer(buf, dtype="<f8", count=(end - start) // 8, offset=start).tolist()  # type: ignore[no-any-return]


def _span(buf: bytes, start: int, end: int) -> tuple[int, int]:
    offset = length = 0
    for n, w, v, _e in _fields(buf, start, end, "BucketSpan"):
        _expect(w, 0, "BucketSpan", n)
        if n == 1:
            offset = _zigzag(v)
        elif n == 2:
            length = v
    if not -(1 << 31) <= offset < 1 << 31 or length >= 1 << 32:
        raise RemoteWriteError("BucketSpan: offset or length outside 32 bits")
    return offset, length


def _histogram(buf: bytes, start: int, end: int, *, v2: bool = False) -> dict[str, Any]:
    """One prompb.Histogram as ``HistogramBuilder.add`` keyword arguments (integer deltas summed);
    ``v2``: remote_write 2.0's, whose field 17 is the start timestamp."""
    count_i: int | None = None
    count_f: float | None = None
    zero_i: int | None = None
    zero_f: float | None = None
    total = threshold = 0.0
    schema = hint = t = st = 0
    spans: dict[int, list[tuple[int, int]]] = {8: [], 11: []}
    deltas: dict[int, list[int]] = {9: [], 12: []}
    counts: dict[int, list[float]] = {10: [], 13: []}
    custom: list[float] = []
    what = "Histogram"
    for n, w, v, e in _fields(buf, start, end, what):
        if n in (1, 6, 4, 14, 15):
            _expect(w, 0, what, n)
            if n == 1:
                count_i = v
            elif n == 6:
                zero_i = v
            elif n == 4:
                schema = _zigzag(v)
            elif n == 14:
                hint = v
            else:
                t = _timestamp(v, "histogram")
        elif n in (2, 3, 5, 7):
            _expect(w, 1, what, n)
            (x,) = _DOUBLE.unpack_from(buf, v)
            if n == 2:
                count_f = x
            elif n == 3:
                total = x
            elif n == 5:
                threshold = x
            else:
                zero_f = x
        elif n in spans:
            _expect(w, 2, what, n)
            spans[n].append(_span(buf, v, e))
        elif n in deltas:
            deltas[n].extend(_zigzag(d) for d in _packed_varints(buf, n, w, v, e))
        elif n in counts:
            counts[n].extend(_packed_doubles(buf, n, w, v, e))
        elif n == 16:
            custom.extend(_packed_doubles(buf, n, w, v, e))
        elif n == 17 and v2:
            _expect(w, 0, what, n)
            st = _start_timestamp(v, "histogram")
    is_float = count_f is not None or zero_f is not None or bool(counts[10] or counts[13])
    if is_float and (count_i is not None or zero_i is not None or deltas[9] or deltas[12]):
        raise RemoteWriteError("Histogram mixes integer and float fields")
    if not -128 <= schema <= 127:
        raise RemoteWriteError(f"Histogram: schema {schema} outside -128 .. 127")
    if hint > 3:
        raise RemoteWriteError(f"Histogram: reset_hint {hint} is not 0..3")
    if is_float:
        negative, positive = counts[10], counts[13]
        count, zero = count_f or 0.0, zero_f or 0.0
    else:
        negative = np.cumsum(np.asarray(deltas[9], dtype=np.int64)).astype(np.float64).tolist()
        positive = np.cumsum(np.asarray(deltas[12], dtype=np.int64)).astype(np.float64).tolist()
        count, zero = float(count_i or 0), float(zero_i or 0)
    return {
        "ts_ms": t,
        "schema": schema,
        "count": count,
        "sum": total,
        "zero_threshold": threshold,
        "zero_count": zero,
        "positive_spans": spans[11],
        "positive_buckets": positive,
        "negative_spans": spans[8],
        "negative_buckets": negative,
        "counter_reset_hint": hint,
        "custom_values": custom,
        "start_timestamp_ms": st,
    }


def announced_size(body: bytes) -> int | None:
    """The size a snappy block's header says it decompresses to; None when it has no valid header."""
    try:
        return _varint(body, 0, min(len(body), 10))[0]
    except RemoteWriteError:
        return None


def decompress(body: bytes, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Snappy block decompression, refusing bodies that announce more than ``max_decompressed`` bytes."""
    import cramjam

    size = announced_size(body)
    if size is None:
        raise RemoteWriteError("not snappy: the body has no valid length header")
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
    histograms: HistogramBuilder | None = None,
    version: int = 1,
) -> SampleBatch:
    """Samples of a snappy-compressed WriteRequest body, as ``POST /api/v1/write`` receives it
    (native histograms into ``histograms``, see :func:`decode_write_request`); ``version`` 2
    reads a remote write 2.0 ``io.prometheus.write.v2.Request`` (:func:`decode_write_request_v2`)."""
    raw = decompress(body, max_decompressed)
    if version == 2:
        return decode_write_request_v2(raw, limits, histograms)
    return decode_write_request(raw, limits, cache, histograms)


# ---- encoder: tests, benchmarks, and anyone feeding the collector from Python ---------


def _enc_len(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def _enc_zigzag(v: int) -> bytes:
    return encode_varint((v << 1) ^ (v >> 63))


def encode_histogram(
    ts_ms: int,
    *,
    schema: int,
    count: float,
    sum: float,
    zero_threshold: float = 0.0,
    zero_count: float = 0.0,
    positive_spans: Iterable[tuple[int, int]] = (),
    positive_buckets: Iterable[float] = (),
    negative_spans: Iterable[tuple[int, int]] = (),
    negative_buckets: Iterable[float] = (),
    counter_reset_hint: int = 0,
    custom_values: Iterable[float] = (),
    integer: bool = True,
) -> bytes:
    """One prompb.Histogram message, encoded as Prometheus' remote_write encodes it.

    Buckets are given as absolute counts; ``integer`` sends them as Prometheus sends an integer
    histogram (``count_int``, ``zero_count_int``, packed zigzag deltas), else as a float one
    (``count_float``, packed absolute ``*_counts``). Zero values are left out, as proto3 does.
    """
    out = bytearray()

    def double(number: int, x: float) -> None:
        if x != 0.0 or np.signbit(x):
            out.extend(encode_varint(number << 3 | 1) + _DOUBLE.pack(x))

    def varint(number: int, x: int) -> None:
        if x:
            out.extend(encode_varint(number << 3) + encode_varint(x))

    if integer:
        varint(1, int(count))
    else:
        double(2, count)
    double(3, sum)
    varint(4, (schema << 1) ^ (schema >> 31))
    double(5, zero_threshold)
    if integer:
        varint(6, int(zero_count))
    else:
        double(7, zero_count)
    for spans_no, values_no, spans, buckets in (
        (8, 9, negative_spans, negative_buckets),
        (11, 12, positive_spans, positive_buckets),
    ):
        for off, length in spans:
            span = (encode_varint(1 << 3) + _enc_zigzag(off) if off else b"") + (
                encode_varint(2 << 3) + encode_varint(length) if length else b""
            )
            out.extend(_enc_len(spans_no, span))
        values = list(buckets)
        if not values:
            continue
        if integer:
            ints = [int(v) for v in values]
            deltas = [ints[0], *(b - a for a, b in itertools.pairwise(ints))]
            out.extend(_enc_len(values_no, b"".join(_enc_zigzag(d) for d in deltas)))
        else:
            out.extend(_enc_len(values_no + 1, b"".join(_DOUBLE.pack(v) for v in values)))
    varint(14, counter_reset_hint)
    varint(15, ts_ms)
    custom = list(custom_values)
    if custom:
        out.extend(_enc_len(16, b"".join(_DOUBLE.pack(v) for v in custom)))
    return bytes(out)


def encode_write_request(
    series: Iterable[tuple[Mapping[str, str], Iterable[tuple[int, float]]]],
    *,
    compress: bool = True,
    histograms: Iterable[tuple[Mapping[str, str], Iterable[bytes]]] = (),
) -> bytes:
    """A WriteRequest for ``[(labels, [(ts_ms, value), ...]), ...]``, snappy-compressed by default.

    ``histograms`` adds series with native histogram samples: ``[(labels, [encode_histogram(...), ...])]``.
    """
    parts = []
    for labels, samples in series:
        ts_parts = [
            _enc_len(1, _enc_len(1, k.encode()) + _enc_len(2, v.encode())) for k, v in sorted(labels.items())
        ]
        for t, v in samples:
            sample = b"\x09" + _DOUBLE.pack(v) + b"\x10" + encode_varint(t)
            ts_parts.append(_enc_len(2, sample))
        parts.append(_enc_len(1, b"".join(ts_parts)))
    for labels, messages in histograms:
        ts_parts = [
            _enc_len(1, _enc_len(1, k.encode()) + _enc_len(2, v.encode())) for k, v in sorted(labels.items())
        ]
        ts_parts += [_enc_len(4, m) for m in messages]
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
