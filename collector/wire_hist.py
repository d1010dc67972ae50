"""The HISTOGRAMS section of a version 2-5 agent batch (docs/wire.md): columnar native histograms.

Version 4 adds increments: a row flagged FLAG_INCREMENT holds only the zero count and buckets
added since the series' previous export (its base, the cumulative histogram whose count is
``count - count_inc``); ``count`` and ``sum`` stay cumulative. ``hist_base.HistogramBases``
turns them back into cumulative histograms.

Kept apart from ``wire.py``'s record columns so either can change without the other; the
decoder faces untrusted bytes and raises only ``wire.MalformedBatch``.

Example::

    row = HistRow(HistKind.KERNEL, producer=1, id=7, gpu=0, pid=42, stream=3, schema=3,
                  count=2, sum=0.5, pos_spans=((0, 1),), pos_deltas=(2,))
    data = encode_histograms(ts_ns, [row])      # the section's bytes, without tag and length
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.collector import wire as _w
from kernel_insight.collector.varint import encode as encode_varint

__all__ = [
    "FLAG_FIRST",
    "FLAG_INCREMENT",
    "HIST_SECTION",
    "HistKind",
    "HistRow",
    "WireHistograms",
    "decode_histograms",
    "encode_histograms",
]

#: Section tag of HISTOGRAMS in a body of version 2 to 5.
HIST_SECTION = 0x04
#: Flag of a histogram's first export since its agent started: a counter reset.
FLAG_FIRST = 0x01
#: Flag of an increment (body version 4): zero count and buckets are what was added since the
#: series' export whose count was ``count - count_inc``; count and sum are cumulative.
FLAG_INCREMENT = 0x02
#: The body version whose section has the ``count_inc`` column (wire.BODY_VERSION_INCREMENTS).
_V_INCREMENTS = 4

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]


class HistKind(enum.IntEnum):
    """What a histogram measures (its metric, docs/metrics.md)."""

    KERNEL = 1  # kernel_duration_seconds, key (producer, kernel name id, gpu, pid, stream)
    NCCL = 2  # nccl_op_duration_seconds, key (gpu, op)
    MEMCPY = 3  # memcpy_bytes, key (gpu)


# (column, encoding): the wire order. "fixed" columns hold one value per histogram.
_FIXED: tuple[tuple[str, str], ...] = (
    ("kind", "u8"),
    ("producer", "uv"),
    ("id", "uv"),
    ("gpu", "uv"),
    ("pid", "uv"),
    ("stream", "uv"),
    ("flags", "u8"),
    ("schema", "sv"),
    ("zero_threshold", "f64"),
    ("zero_count", "uv"),
    ("count", "uv"),
    ("sum", "f64"),
    ("n_pos_spans", "uv"),
    ("n_neg_spans", "uv"),
)
#: Body version 4: one more fixed column, after the fourteen above.
_FIXED_V4 = (*_FIXED, ("count_inc", "uv"))
_FLAT: tuple[tuple[str, str], ...] = (
    ("pos_span_offset", "sv"),
    ("pos_span_length", "uv"),
    ("pos_delta", "sv"),
    ("neg_span_offset", "sv"),
    ("neg_span_length", "uv"),
    ("neg_delta", "sv"),
)


@dataclass(frozen=True, slots=True)
class HistRow:
    """One histogram as the agent exports it: cumulative since the agent started, buckets as deltas;
    or, with ``increment`` (body version 4), zero count and buckets added since the export whose
    count was ``count - count_inc`` (count and sum cumulative)."""

    kind: HistKind
    producer: int = 0
    id: int = 0
    gpu: int = 0
    pid: int = 0
    stream: int | None = None
    schema: int = 3
    zero_threshold: float = 0.0
    zero_count: int = 0
    count: int = 0
    sum: float = 0.0
    pos_spans: tuple[tuple[int, int], ...] = ()
    pos_deltas: tuple[int, ...] = ()
    neg_spans: tuple[tuple[int, int], ...] = ()
    neg_deltas: tuple[int, ...] = ()
    first: bool = False  # first export since the agent started (a counter reset)
    increment: bool = False  # zero count and buckets are an increment over a base (version 4)
    count_inc: int = 0  # count minus the base's count (increments; 0 otherwise)


@dataclass(frozen=True, slots=True)
class WireHistograms:
    """A decoded HISTOGRAMS section: one value per histogram in each fixed column; spans and
    deltas flat, cut by the per-histogram span counts and span lengths."""

    ts_ns: int
    kind: U8
    producer: U64
    id: U64
    gpu: U64
    pid: U64
    stream: U64  # 0: no stream, else stream + 1
    flags: U8
    schema: I64
    zero_threshold: F64
    zero_count: U64
    count: U64
    sum: F64
    n_pos_spans: U64
    n_neg_spans: U64
    pos_span_offset: I64
    pos_span_length: U64
    pos_delta: I64
    neg_span_offset: I64
    neg_span_length: U64
    neg_delta: I64
    count_inc: U64  # version 4: count minus the base's count in increment rows; zeros otherwise

    def __len__(self) -> int:
        return len(self.kind)

    def rows(self, which: Sequence[int] | None = None) -> list[HistRow]:
        """Each histogram (or those of the rows ``which``, ascending) as a HistRow: tests, tools,
        and the few rows the collector looks at one by one (it works on the columns)."""
        n = len(self)
        span_off = {s: np.zeros(n + 1, dtype=np.int64) for s in ("pos", "neg")}
        bucket_off = {}
        for side, per_row in (("pos", self.n_pos_spans), ("neg", self.n_neg_spans)):
            np.cumsum(per_row.astype(np.int64), out=span_off[side][1:])
            ends = np.zeros(len(getattr(self, f"{side}_span_length")) + 1, dtype=np.int64)
            np.cumsum(getattr(self, f"{side}_span_length").astype(np.int64), out=ends[1:])
            bucket_off[side] = ends[span_off[side]].tolist()
        pso, nso = span_off["pos"].tolist(), span_off["neg"].tolist()
        pbo, nbo = bucket_off["pos"], bucket_off["neg"]
        out = []
        for i in range(n) if which is None else which:
            pspans = tuple(
                zip(
                    self.pos_span_offset[pso[i] : pso[i + 1]].tolist(),
                    self.pos_span_length[pso[i] : pso[i + 1]].tolist(),
                    strict=True,
                )
            )
            nspans = tuple(
                zip(
                    self.neg_span_offset[nso[i] : nso[i + 1]].tolist(),
                    self.neg_span_length[nso[i] : nso[i + 1]].tolist(),
                    strict=True,
                )
            )
            stream = int(self.stream[i])
            out.append(
                HistRow(
                    HistKind(int(self.kind[i])),
                    producer=int(self.producer[i]),
                    id=int(self.id[i]),
                    gpu=int(self.gpu[i]),
                    pid=int(self.pid[i]),
                    stream=None if stream == 0 else stream - 1,
                    schema=int(self.schema[i]),
                    zero_threshold=float(self.zero_threshold[i]),
                    zero_count=int(self.zero_count[i]),
                    count=int(self.count[i]),
                    sum=float(self.sum[i]),
                    pos_spans=pspans,
                    pos_deltas=tuple(self.pos_delta[pbo[i] : pbo[i + 1]].tolist()),
                    neg_spans=nspans,
                    neg_deltas=tuple(self.neg_delta[nbo[i] : nbo[i + 1]].tolist()),
                    first=bool(int(self.flags[i]) & FLAG_FIRST),
                    increment=bool(int(self.flags[i]) & FLAG_INCREMENT),
                    count_inc=int(self.count_inc[i]),
                )
            )
        return out


def _column(r: _w._Reader, n: int, enc: str, what: str) -> npt.NDArray[Any]:
    buf = np.frombuffer(r.take(r.varint()), dtype=np.uint8)
    if enc == "u8":
        if buf.size != n:
            raise _w.MalformedBatch(f"{what}: expected {n} bytes, got {buf.size}")
        return buf
    if enc == "f64":
        if buf.size != 8 * n:
            raise _w.MalformedBatch(f"{what}: expected {8 * n} bytes, got {buf.size}")
        return buf.view("<f8").astype(np.float64)
    if n > buf.size:  # a varint takes at least one byte: refuse before counting anything
        raise _w.MalformedBatch(f"{what}: expected {n} varints in {buf.size} bytes")
    v = _w._decode_varints(buf, n, what)
    return _w._unzigzag(v).view(np.int64) if enc == "sv" else v


def decode_histograms(
    r: _w._Reader, header: _w.BatchHeader, limits: _w.Limits, version: int = 3
) -> WireHistograms:
    """The section's content in a body of ``version``; every inconsistency is a MalformedBatch."""
    k = r.varint()
    if k == 0 or k > limits.max_records:
        raise _w.MalformedBatch(f"HISTOGRAMS: bad histogram count {k}")
    ts_ns = r.varint()
    if not header.t_min_ns <= ts_ns <= header.t_max_ns:
        raise _w.MalformedBatch("HISTOGRAMS: time outside the header's range")
    cols: dict[str, npt.NDArray[Any]] = {}
    for name, enc in _FIXED_V4 if version >= _V_INCREMENTS else _FIXED:
        cols[name] = _column(r, k, enc, f"HISTOGRAMS column {name}")
    if "count_inc" not in cols:
        cols["count_inc"] = np.zeros(k, dtype=np.uint64)
    for side in ("pos", "neg"):
        nspans = int(cols[f"n_{side}_spans"].sum())
        for name, enc in (c for c in _FLAT if c[0].startswith(side) and "span" in c[0]):
            cols[name] = _column(r, nspans, enc, f"HISTOGRAMS column {name}")
        nbuckets = int(cols[f"{side}_span_length"].sum())
        cols[f"{side}_delta"] = _column(r, nbuckets, "sv", f"HISTOGRAMS column {side}_delta")
        _check_spans(cols[f"{side}_span_offset"], cols[f"n_{side}_spans"], side)
    kind, schema = cols["kind"], cols["schema"]
    if np.any((kind < int(HistKind.KERNEL)) | (kind > int(HistKind.MEMCPY))):
        raise _w.MalformedBatch("HISTOGRAMS: unknown histogram kind")
    if np.any((schema < -4) | (schema > 8)):
        raise _w.MalformedBatch("HISTOGRAMS: schema outside -4 .. 8")
    flags = cols["flags"]
    known = FLAG_FIRST | (FLAG_INCREMENT if version >= _V_INCREMENTS else 0)
    if np.any(flags & ~np.uint8(known)):
        raise _w.MalformedBatch("HISTOGRAMS: unknown flags")
    inc = (flags & FLAG_INCREMENT) != 0
    if np.any(inc & ((flags & FLAG_FIRST) != 0)):
        raise _w.MalformedBatch("HISTOGRAMS: a first export cannot be an increment")
    if np.any(~inc & (cols["count_inc"] != 0)) or np.any(cols["count_inc"] > cols["count"]):
        raise _w.MalformedBatch("HISTOGRAMS: count_inc is not 0 in a cumulative row, or above count")
    for name, bits in (("producer", 32), ("id", 32), ("gpu", 16), ("pid", 32)):
        if np.any(cols[name] >> np.uint64(bits)):
            raise _w.MalformedBatch(f"HISTOGRAMS column {name}: value does not fit {bits} bits")
    zt = cols["zero_threshold"]
    if not np.all(zt >= 0):
        raise _w.MalformedBatch("HISTOGRAMS: zero threshold negative or NaN")
    return WireHistograms(ts_ns, **cols)


def _check_spans(offsets: I64, per_row: U64, side: str) -> None:
    """Only a histogram's first span may have a negative offset (it is the first bucket index)."""
    if not len(offsets):
        return
    first = np.zeros(len(offsets), dtype=bool)
    starts = np.cumsum(per_row) - per_row
    first[starts[per_row > 0].astype(np.int64)] = True
    if np.any((offsets < 0) & ~first):
        raise _w.MalformedBatch(f"HISTOGRAMS: a {side} span after the first has a negative offset")
    if np.any(np.abs(offsets) > (1 << 20)):
        raise _w.MalformedBatch(f"HISTOGRAMS: a {side} span offset is out of range")


def encode_histograms(ts_ns: int, rows: Sequence[HistRow], version: int = 3) -> bytes:
    """The section's content for ``rows`` in a body of ``version`` (the C agent's encoding; for
    tests and tools). Increment rows need version 4."""
    if not rows:
        raise ValueError("a HISTOGRAMS section holds at least one histogram")
    if version < _V_INCREMENTS and any(r.increment for r in rows):
        raise ValueError("increments need body version 4")

    def uv(values: Sequence[int]) -> bytes:
        return _w._encode_varints(np.asarray(values, dtype=np.uint64))

    def sv(values: Sequence[int]) -> bytes:
        return _w._encode_varints(_w._zigzag(np.asarray(values, dtype=np.int64).view(np.uint64)))

    def f64(values: Sequence[float]) -> bytes:
        return np.asarray(values, dtype="<f8").tobytes()

    data = {
        "kind": bytes(int(r.kind) for r in rows),
        "producer": uv([r.producer for r in rows]),
        "id": uv([r.id for r in rows]),
        "gpu": uv([r.gpu for r in rows]),
        "pid": uv([r.pid for r in rows]),
        "stream": uv([0 if r.stream is None else r.stream + 1 for r in rows]),
        "flags": bytes((FLAG_FIRST if r.first else 0) | (FLAG_INCREMENT if r.increment else 0) for r in rows),
        "schema": sv([r.schema for r in rows]),
        "zero_threshold": f64([r.zero_threshold for r in rows]),
        "zero_count": uv([r.zero_count for r in rows]),
        "count": uv([r.count for r in rows]),
        "sum": f64([r.sum for r in rows]),
        "n_pos_spans": uv([len(r.pos_spans) for r in rows]),
        "n_neg_spans": uv([len(r.neg_spans) for r in rows]),
        "count_inc": uv([r.count_inc for r in rows]),
        "pos_span_offset": sv([o for r in rows for o, _ in r.pos_spans]),
        "pos_span_length": uv([n for r in rows for _, n in r.pos_spans]),
        "pos_delta": sv([d for r in rows for d in r.pos_deltas]),
        "neg_span_offset": sv([o for r in rows for o, _ in r.neg_spans]),
        "neg_span_length": uv([n for r in rows for _, n in r.neg_spans]),
        "neg_delta": sv([d for r in rows for d in r.neg_deltas]),
    }
    out = bytearray(encode_varint(len(rows)) + encode_varint(ts_ns))
    for name, _ in (_FIXED_V4 if version >= _V_INCREMENTS else _FIXED) + _FLAT:
        out += encode_varint(len(data[name])) + data[name]
    return bytes(out)
