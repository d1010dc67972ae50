"""The agent's batch format (docs/wire.md): decoder for the collector, encoder for tests and tools.

The decoder faces untrusted bytes, so every failure is a ``WireError``
subclass and nothing else: the ingest endpoint maps them to status codes.
Columns are decoded with numpy, so a batch of 10k records costs a few numpy
calls, not 100k Python-level varint reads.

Exceptions::

    WireError (ValueError)
    +-- MalformedBatch         header or body does not follow docs/wire.md (400)
    |   +-- OversizedBatch     past a size limit before any work is done (413)
    +-- AuthenticationFailed   the AEAD tag does not verify (401)

Example::

    frame = encode_batch(records, agent_id=aid, key_id=1, key=key, epoch=7, seq=0)
    header = parse_header(frame)
    batch = decode_batch(frame, key)
    batch.records()  # the records.py dataclasses, as the ring handed them out
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from kernel_insight.agent.counters import Counter
from kernel_insight.agent.records import PAYLOAD_DTYPES, RECORD_DTYPE, Record, RecordType, decode_records
from kernel_insight.collector import _decode, varint

if TYPE_CHECKING:
    from kernel_insight.collector.wire_hist import WireHistograms

__all__ = [
    "AEAD_CHACHA20_POLY1305",
    "BATCH_STATUS_HEADER",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "CONTENT_TYPE",
    "FRAMES_CONTENT_TYPE",
    "HEADER_SIZE",
    "INGEST_PATH",
    "MAGIC",
    "SNAPSHOT_HEADER",
    "STATUS_NAMES_UNKNOWN",
    "TAG_SIZE",
    "WIRE_VERSION",
    "AuthenticationFailed",
    "BatchHeader",
    "BatchId",
    "CaptureReport",
    "Counter",
    "DecodedBatch",
    "Limits",
    "MalformedBatch",
    "NamesUnknown",
    "OversizedBatch",
    "WireError",
    "decode_batch",
    "decode_body",
    "encode_batch",
    "encode_body",
    "name_hash",
    "nonce_for",
    "open_frame",
    "parse_header",
    "parse_sender",
    "seal_body",
    "split_frames",
]

MAGIC = b"KIWB"
WIRE_VERSION = 1
BODY_VERSION = 1
#: Bodies of agents that aggregate kernels into histograms: KERNEL records are a sample and a
#: HISTOGRAMS section (wire_hist.py) may follow. Version 1 bodies stay accepted.
BODY_VERSION_HISTOGRAMS = 2
#: Version 2 with the KERNEL correlation column as the delta of (correlation - pos): what
#: histogram agents send since issue 14's wire work (a probe numbers its kernels as the ring
#: numbers its records, so the column shrinks to almost nothing). Versions 1 and 2 stay accepted.
BODY_VERSION_PDELTA = 3
#: Version 3 whose HISTOGRAMS section may hold increments (buckets and counts added since the
#: series' previous export, against a base the collector keeps): its extra column ``count_inc``
#: says which base (docs/wire.md, issue 14). Versions 1-3 stay accepted.
BODY_VERSION_INCREMENTS = 4
#: Version 4 whose STRINGS section may leave out names the agent sent before (its collector keeps
#: them per agent); a NAMES_USED section then carries the digest of every name the batch uses, and
#: a collector that cannot match it answers 424 (docs/wire.md, "Names once"). Versions 1-4 stay accepted.
BODY_VERSION_NAMES_ONCE = 5
BODY_VERSIONS = (
    BODY_VERSION,
    BODY_VERSION_HISTOGRAMS,
    BODY_VERSION_PDELTA,
    BODY_VERSION_INCREMENTS,
    BODY_VERSION_NAMES_ONCE,
)
AEAD_CHACHA20_POLY1305 = 1
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
HEADER_SIZE = 64
TAG_SIZE = 16
KEY_SIZE = 32
INGEST_PATH = "/v1/ingest"
CONTENT_TYPE = "application/x-ki-batch"
#: A request body of one or more frames back to back, each answered on its own (docs/wire.md, HTTP).
FRAMES_CONTENT_TYPE = "application/x-ki-batches"
#: The response header carrying one status per frame of a FRAMES_CONTENT_TYPE request, in body order.
BATCH_STATUS_HEADER = "KI-Batch-Status"
#: The response header asking an agent for cumulative histograms (snapshots) next: one of its
#: increments named a base this collector does not hold (docs/wire.md, "Increments").
SNAPSHOT_HEADER = "KI-Histogram-Snapshot"

SECTION_COUNTERS = 0x01
SECTION_STRINGS = 0x02
SECTION_CAPTURES = 0x03
SECTION_HISTOGRAMS = 0x04  # body versions 2 to 5 only
SECTION_LABELS = 0x05  # any body version; only agents configured with labels send it
SECTION_NAMES_USED = 0x06  # version 5 bodies only: the digest of the names a batch uses
#: The status of a version 5 batch whose names left out the collector cannot all match (the
#: agent sends every name, then the batch again: docs/wire.md, "Names once").
STATUS_NAMES_UNKNOWN = 424
#: Labels one LABELS section may carry, and the longest name and value (bytes) it may hold.
MAX_AGENT_LABELS = 16
MAX_AGENT_LABEL_BYTES = 1024
SECTION_RECORDS = 0x10
#: Capture windows one CAPTURES section may report on.
MAX_CAPTURES = 64

_HEADER = struct.Struct("<4sBBBB16sIIQQQII")
assert _HEADER.size == HEADER_SIZE

U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]


class WireError(ValueError):
    """Any reason a batch cannot be accepted; the message is safe to return to the sender."""


class MalformedBatch(WireError):
    """The bytes do not follow docs/wire.md."""


class OversizedBatch(MalformedBatch):
    """The frame or its decompressed body is larger than the decoder's limits allow."""


class NamesUnknown(WireError):
    """A version 5 batch left out names this collector cannot match (status 424: the agent sends
    every name, then the batch again). Raised by the sink, which holds the names."""


class AuthenticationFailed(WireError):
    """The AEAD tag did not verify: wrong key, or the batch was changed on the way."""


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """What one batch says about one capture window (a CAPTURES entry, docs/wire.md).

    ``id`` is the request's 16 hex digits; ``[start_ns, end_ns)`` the window on the agent's
    clock; ``spans`` the GPU's kernel spans the agent shipped for the window up to and
    including this batch; ``final`` marks the window's last batch.
    """

    id: str
    gpu: int
    start_ns: int
    end_ns: int
    spans: int
    final: bool


@dataclass(frozen=True, slots=True)
class Limits:
    """What the decoder accepts; past any of these a batch is malformed (or oversized)."""

    max_frame: int = 16 << 20  # one frame, and one request body of several frames
    max_frames: int = 256  # frames in one request body
    max_body: int = 64 << 20
    max_records: int = 4 << 20
    max_strings: int = 65536
    max_name: int = 65535


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class BatchId:
    """The deduplication key: unique per batch for an agent's whole life."""

    agent_id: bytes
    epoch: int
    seq: int

    def __str__(self) -> str:
        """The text form storage keys on: ``<agent hex>:<epoch>:<seq>``."""
        return f"{self.agent_id.hex()}:{self.epoch}:{self.seq}"


@dataclass(frozen=True, slots=True)
class BatchHeader:
    agent_id: bytes
    key_id: int
    epoch: int
    seq: int
    t_min_ns: int
    t_max_ns: int
    record_count: int
    payload_len: int
    compression: int

    @property
    def batch_id(self) -> BatchId:
        return BatchId(self.agent_id, self.epoch, self.seq)

    @property
    def nonce(self) -> bytes:
        return nonce_for(self.epoch, self.seq)

    def pack(self) -> bytes:
        return _HEADER.pack(
            MAGIC,
            WIRE_VERSION,
            AEAD_CHACHA20_POLY1305,
            self.compression,
            0,
            self.agent_id,
            self.key_id,
            self.epoch,
            self.seq,
            self.t_min_ns,
            self.t_max_ns,
            self.record_count,
            self.payload_len,
        )


def nonce_for(epoch: int, seq: int) -> bytes:
    """The 96-bit nonce: epoch then sequence number, both from the authenticated header."""
    return struct.pack("<IQ", epoch, seq)


# ---- column tables -----------------------------------------------------------------

# (field, encoding, storage width in bytes); the order is the wire order.
_Col = tuple[str, str, int]
_COMMON: tuple[_Col, ...] = (
    ("pos", "delta", 8),
    ("producer", "uv", 4),
    ("flags", "u8", 1),
    ("device", "uv", 2),
    ("id", "uv", 4),
    ("ts_ns", "delta", 8),
)
_PAYLOAD: dict[int, tuple[_Col, ...]] = {
    RecordType.KERNEL: (
        ("end_ns", "rel", 8),
        ("stream", "uv", 8),
        ("correlation", "delta", 8),
        ("pid", "uv", 4),
    ),
    RecordType.LAUNCH: tuple(
        (f, "uv", 4) for f in ("pid", "tid", "grid0", "grid1", "grid2", "block0", "block1", "block2")
    ),
    RecordType.MEMOP: (
        ("address", "delta", 8),
        ("bytes", "uv", 8),
        ("pid", "uv", 4),
        ("tid", "uv", 4),
        ("status", "sv", 4),
    ),
    RecordType.COLLECTIVE: (
        ("bytes", "uv", 8),
        ("duration_ns", "uv", 8),
        ("comm", "uv", 8),
        ("rank", "uv", 4),
        ("nranks", "uv", 4),
    ),
    RecordType.SYNC: (("duration_ns", "uv", 8), ("handle", "uv", 8), ("pid", "uv", 4), ("tid", "uv", 4)),
    RecordType.GPU_SAMPLE: (("value", "f64", 8), ("aux", "uv", 8)),
    RecordType.FINGERPRINT: (("value", "uv", 8),),
    RecordType.ERROR: (("code", "sv", 8), ("aux", "uv", 8), ("pid", "uv", 4), ("detail_id", "uv", 4)),
}
#: KERNEL's payload columns in body version 3: correlation as the delta of (correlation - pos).
_KERNEL_V3: tuple[_Col, ...] = tuple(
    ("correlation", "pdelta", 8) if c[0] == "correlation" else c for c in _PAYLOAD[RecordType.KERNEL]
)


def _bit_view(layout: np.dtype[np.void]) -> np.dtype[np.void]:
    """``layout`` (a ``records.PAYLOAD_DTYPES`` entry) with every field as unsigned bits of its size
    and arrays split into one field per element (``grid`` -> ``grid0``..``grid2``): what the codec
    moves, whatever each field's type, at the offsets of the one record table."""
    names: list[str] = []
    formats: list[str] = []
    offsets: list[int] = []
    for name in layout.names or ():
        field_type, offset = layout.fields[name][:2]  # type: ignore[index]
        element, shape = field_type.subdtype or (field_type, ())
        count = int(np.prod(shape)) if shape else 1
        for k in range(count):
            names.append(f"{name}{k}" if shape else name)
            formats.append(f"<u{element.itemsize}")
            offsets.append(offset + k * element.itemsize)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": layout.itemsize})


# Payloads as unsigned bit patterns, laid out by agent/records.py's PAYLOAD_DTYPES (ki_ring.h).
_PAYLOAD_DTYPE: dict[int, np.dtype[np.void]] = {t: _bit_view(PAYLOAD_DTYPES[RecordType(t)]) for t in _PAYLOAD}
SHIPPED_TYPES = tuple(sorted(_PAYLOAD))

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---- varints (vectorised) ----------------------------------------------------------


def _zigzag(v: U64) -> U64:
    s = v.view(np.int64)
    return ((s << np.int64(1)) ^ (s >> np.int64(63))).view(np.uint64)


def _unzigzag(z: U64) -> U64:
    neg = (z & np.uint64(1)).astype(np.int64)
    return (z >> np.uint64(1)) ^ (-neg).view(np.uint64)


def _encode_varints(v: U64) -> bytes:
    n = v.size
    if n == 0:
        return b""
    nbytes = np.ones(n, dtype=np.int64)
    for k in range(1, 10):
        nbytes += (v >> np.uint64(7 * k)) != 0
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(nbytes[:-1], out=offsets[1:])
    out = np.zeros(int(nbytes.sum()), dtype=np.uint8)
    for k in range(int(nbytes.max())):
        m = nbytes > k
        byte = ((v[m] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        cont = (nbytes[m] > k + 1).astype(np.uint8) << np.uint8(7)
        out[offsets[m] + k] = byte | cont
    return out.tobytes()


def _decode_varints(buf: U8, n: int, what: str) -> U64:
    """Exactly n canonical varints filling buf, or MalformedBatch.

    In C (collector/native/decodemodule.c): the numpy version of this loop was half of
    ``decode_body``, itself a large part of the collector's CPU (``make bench-e2e``).
    """
    try:
        raw = _decode.varints(buf.data, n)
    except ValueError as exc:
        raise MalformedBatch(f"{what}: {exc}") from None
    return np.frombuffer(raw, dtype=np.uint64)


class _Reader:
    """Bounds-checked cursor over a body; every overrun is a MalformedBatch."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf: bytes | memoryview, what: str, start: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = start
        self.end = len(buf) if end is None else end
        self.what = what

    def done(self) -> bool:
        return self.pos >= self.end

    def u8(self) -> int:
        if self.pos >= self.end:
            raise MalformedBatch(f"{self.what}: truncated")
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def varint(self) -> int:
        v = 0
        for k in range(10):
            b = self.u8()
            if k == 9 and b > 1:
                raise MalformedBatch(f"{self.what}: varint does not fit 64 bits")
            v |= (b & 0x7F) << (7 * k)
            if not b & 0x80:
                if k and b == 0:
                    raise MalformedBatch(f"{self.what}: non-canonical varint")
                return v
        raise MalformedBatch(f"{self.what}: varint longer than 10 bytes")

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise MalformedBatch(f"{self.what}: length {n} runs past the end")
        v = memoryview(self.buf)[self.pos : self.pos + n]
        self.pos += n
        return v


# ---- decoded batch -----------------------------------------------------------------


@dataclass(slots=True)
class DecodedBatch:
    """One verified batch: its header, the agent's counters, names, records by type and capture reports."""

    header: BatchHeader
    counters: dict[int, int] = field(default_factory=dict)
    strings: dict[tuple[int, int], str] = field(default_factory=dict)
    arrays: dict[int, npt.NDArray[np.void]] = field(default_factory=dict)
    captures: tuple[CaptureReport, ...] = ()
    body_version: int = BODY_VERSION
    histograms: WireHistograms | None = None  # the HISTOGRAMS section of a version 2-5 body
    labels: tuple[tuple[str, str], ...] | None = None  # the agent's configured instance labels (LABELS)
    #: Version 5: name_hash of each STRINGS entry, from its bytes as sent (decoding may replace some)
    string_hashes: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Version 5 with texts left out: the XOR of name_hash over every name the batch uses (NAMES_USED)
    names_digest: int | None = None

    @property
    def batch_id(self) -> BatchId:
        return self.header.batch_id

    @property
    def record_count(self) -> int:
        return sum(len(a) for a in self.arrays.values())

    def counter(self, c: Counter) -> int:
        return self.counters.get(int(c), 0)

    def to_array(self) -> npt.NDArray[np.void]:
        """All records as RECORD_DTYPE (check = 0), in ring order: the shape RingReader gives."""
        if not self.arrays:
            return np.zeros(0, dtype=RECORD_DTYPE)
        arr = np.concatenate([self.arrays[t] for t in sorted(self.arrays)])
        return arr[np.argsort(arr["pos"], kind="stable")]

    def by_type(self) -> npt.NDArray[np.void]:
        """All records as RECORD_DTYPE, grouped by type and in ring order within each type: what
        ``Deriver.derive`` needs (it derives each type on its own), without ``to_array``'s sort
        by position (a cost on every batch; ``make bench-e2e``)."""
        if not self.arrays:
            return np.zeros(0, dtype=RECORD_DTYPE)
        if len(self.arrays) == 1:
            return next(iter(self.arrays.values()))
        return np.concatenate([self.arrays[t] for t in sorted(self.arrays)])

    def records(self) -> list[Record]:
        return decode_records(self.to_array().tobytes())

    def name(self, producer: int, string_id: int) -> str | None:
        return self.strings.get((producer, string_id))


# ---- decoder -----------------------------------------------------------------------


def parse_sender(prefix: bytes | memoryview) -> tuple[bytes, int]:
    """(agent_id, key_id) from a frame's first ``HEADER_SIZE`` bytes, checking magic and version only.

    The collector reads this much of a request body, refuses unknown or revoked senders, and
    only then reads the rest: a stranger cannot make it buffer 16 MiB (nothing here is
    authenticated yet; the tag is checked once the whole frame is in).
    """
    if len(prefix) < HEADER_SIZE:
        raise MalformedBatch(f"frame of {len(prefix)} bytes is shorter than its header")
    magic, version, _aead, _comp, _flags, agent_id, key_id = _HEADER.unpack_from(prefix, 0)[:7]
    if magic != MAGIC:
        raise MalformedBatch("bad magic: not a Kernel Insight batch")
    if version != WIRE_VERSION:
        raise MalformedBatch(f"wire version {version}, this collector understands {WIRE_VERSION}")
    return bytes(agent_id), int(key_id)


def parse_header(frame: bytes | memoryview, limits: Limits = DEFAULT_LIMITS) -> BatchHeader:
    """Check the cleartext header (nothing here is trusted until the tag verifies)."""
    if len(frame) > limits.max_frame:
        raise OversizedBatch(f"frame of {len(frame)} bytes exceeds the limit of {limits.max_frame}")
    if len(frame) < HEADER_SIZE + TAG_SIZE:
        raise MalformedBatch(f"frame of {len(frame)} bytes is shorter than header and tag")
    (magic, version, aead, comp, flags, agent_id, key_id, epoch, seq, t_min, t_max, count, plen) = (
        _HEADER.unpack_from(frame, 0)
    )
    if magic != MAGIC:
        raise MalformedBatch("bad magic: not a Kernel Insight batch")
    if version != WIRE_VERSION:
        raise MalformedBatch(f"wire version {version}, this collector understands {WIRE_VERSION}")
    if aead != AEAD_CHACHA20_POLY1305:
        raise MalformedBatch(f"unknown AEAD {aead}")
    if comp not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        raise MalformedBatch(f"unknown compression {comp}")
    if flags != 0:
        raise MalformedBatch(f"reserved header flags 0x{flags:02x} set")
    if plen != len(frame) - HEADER_SIZE:
        raise MalformedBatch(f"payload length {plen} does not match the frame ({len(frame) - HEADER_SIZE})")
    if t_min > t_max:
        raise MalformedBatch("time range is inverted")
    if count > limits.max_records:
        raise OversizedBatch(f"{count} records exceed the limit of {limits.max_records}")
    return BatchHeader(bytes(agent_id), key_id, epoch, seq, t_min, t_max, count, plen, comp)


def split_frames(body: bytes | memoryview, limits: Limits = DEFAULT_LIMITS) -> list[memoryview]:
    """Cut a request body of frames laid back to back at each header's payload_len.

    Only the lengths are read here (each frame's header is checked later on its
    own, and nothing is trusted before its tag verifies); a body that does not
    tile into whole frames is malformed as a whole, since no frame boundary
    after the break can be found again.
    """
    if len(body) > limits.max_frame:
        raise OversizedBatch(f"request body of {len(body)} bytes exceeds the limit of {limits.max_frame}")
    view = memoryview(body)
    out: list[memoryview] = []
    pos = 0
    while pos < len(view):
        if len(out) == limits.max_frames:
            raise OversizedBatch(f"more than {limits.max_frames} frames in one request")
        if len(view) - pos < HEADER_SIZE + TAG_SIZE:
            raise MalformedBatch(
                f"frame {len(out)} at byte {pos}: {len(view) - pos} bytes left, shorter than a header"
            )
        (plen,) = struct.unpack_from("<I", view, pos + HEADER_SIZE - 4)
        end = pos + HEADER_SIZE + plen
        if plen < TAG_SIZE or end > len(view):
            raise MalformedBatch(f"frame {len(out)} at byte {pos}: payload length {plen} runs past the body")
        out.append(view[pos:end])
        pos = end
    if not out:
        raise MalformedBatch("empty request body")
    return out


def open_frame(
    frame: bytes | memoryview, header: BatchHeader, key: bytes, limits: Limits = DEFAULT_LIMITS
) -> bytes:
    """Verify and decrypt, then decompress: the body's plaintext."""
    if len(key) != KEY_SIZE:
        raise ValueError("a key is 32 bytes")
    raw = bytes(frame)
    try:
        plain = ChaCha20Poly1305(key).decrypt(header.nonce, raw[HEADER_SIZE:], raw[:HEADER_SIZE])
    except InvalidTag:
        raise AuthenticationFailed("batch authentication failed (wrong key or tampered batch)") from None
    if header.compression == COMPRESSION_NONE:
        if len(plain) > limits.max_body:
            raise OversizedBatch(f"body of {len(plain)} bytes exceeds the limit of {limits.max_body}")
        return plain
    try:
        size = zstandard.frame_content_size(plain)
    except zstandard.ZstdError:
        raise MalformedBatch("body is not a zstd frame") from None
    if size < 0:
        raise MalformedBatch("zstd frame without a content size")
    if size > limits.max_body:
        raise OversizedBatch(f"body of {size} bytes exceeds the limit of {limits.max_body}")
    try:
        out = zstandard.ZstdDecompressor().decompress(plain)
    except zstandard.ZstdError as exc:
        raise MalformedBatch(f"zstd: {exc}") from None
    if len(out) != size:
        raise MalformedBatch("zstd frame content size mismatch")
    return out


def _decode_column(r: _Reader, n: int, col: _Col, ts: U64 | None, rtype: int, pos: U64 | None = None) -> U64:
    name, enc, width = col
    what = f"{RecordType(rtype).name} column {name}"
    data = r.take(r.varint())
    buf = np.frombuffer(data, dtype=np.uint8)
    if enc == "u8":
        if buf.size != n:
            raise MalformedBatch(f"{what}: expected {n} bytes, got {buf.size}")
        return buf.astype(np.uint64)
    if enc == "f64":
        if buf.size != 8 * n:
            raise MalformedBatch(f"{what}: expected {8 * n} bytes, got {buf.size}")
        return buf.view("<u8").astype(np.uint64)
    v = _decode_varints(buf, n, what)
    if enc == "delta":
        v = np.cumsum(_unzigzag(v), dtype=np.uint64)
    elif enc == "pdelta":  # delta of (v - pos), body version 3's KERNEL correlation
        assert pos is not None
        v = pos + np.cumsum(_unzigzag(v), dtype=np.uint64)
    elif enc == "rel":
        assert ts is not None
        v = ts + _unzigzag(v)
    elif enc == "sv":
        v = _unzigzag(v)
        if width == 4:
            s = v.view(np.int64)
            if np.any((s < -(1 << 31)) | (s >= (1 << 31))):
                raise MalformedBatch(f"{what}: value does not fit 32 bits")
            v = (s & np.int64(0xFFFFFFFF)).view(np.uint64)
    if enc in ("uv", "delta") and width < 8 and np.any(v >> np.uint64(8 * width)):
        raise MalformedBatch(f"{what}: value does not fit {8 * width} bits")
    return v


def _columns(rtype: int, version: int) -> tuple[_Col, ...]:
    """A record type's columns in wire order, in a body of ``version``."""
    if rtype == RecordType.KERNEL and version >= BODY_VERSION_PDELTA:
        return _COMMON + _KERNEL_V3
    return _COMMON + _PAYLOAD[rtype]


def _decode_records(
    r: _Reader, rtype: int, header: BatchHeader, limits: Limits, version: int = BODY_VERSION
) -> npt.NDArray[np.void]:
    n = r.varint()
    if n == 0 or n > limits.max_records:
        raise MalformedBatch(f"{RecordType(rtype).name}: bad record count {n}")
    out = np.zeros(n, dtype=RECORD_DTYPE)
    payload = np.zeros(n, dtype=_PAYLOAD_DTYPE[rtype])
    ts: U64 | None = None
    pos: U64 | None = None
    for col in _columns(rtype, version):
        v = _decode_column(r, n, col, ts, rtype, pos)
        name, _enc, width = col
        if col in _COMMON:
            if name == "ts_ns":
                ts = v
            elif name == "pos":
                pos = v
            out[name] = v.astype(_UNSIGNED[width])
        else:
            payload[name] = v.astype(_UNSIGNED[width])
    assert ts is not None
    if np.any(ts < np.uint64(header.t_min_ns)) or np.any(ts > np.uint64(header.t_max_ns)):
        raise MalformedBatch(f"{RecordType(rtype).name}: record time outside the header's range")
    out["type"] = rtype
    out["payload"] = payload.view("V32").reshape(n)
    return out


def decode_body(body: bytes, header: BatchHeader, limits: Limits = DEFAULT_LIMITS) -> DecodedBatch:
    """Parse a verified plaintext body; a malformed one raises MalformedBatch, nothing else."""
    batch = DecodedBatch(header)
    r = _Reader(body, "body")
    version = r.u8()
    if version not in BODY_VERSIONS:
        raise MalformedBatch(f"body version {version}, this collector understands 1 to 5")
    batch.body_version = version
    seen: set[int] = set()
    while not r.done():
        tag = r.u8()
        length = r.varint()
        if tag in seen:
            raise MalformedBatch(f"section 0x{tag:02x} appears twice")
        seen.add(tag)
        start = r.pos
        r.take(length)
        sec = _Reader(body, f"section 0x{tag:02x}", start, start + length)
        if tag == SECTION_COUNTERS:
            _decode_counters(sec, batch)
        elif tag == SECTION_STRINGS:
            _decode_strings(sec, batch, limits)
        elif tag == SECTION_CAPTURES:
            batch.captures = _decode_captures(sec)
        elif tag == SECTION_LABELS:
            batch.labels = _decode_labels(sec)
        elif tag == SECTION_NAMES_USED and version >= BODY_VERSION_NAMES_ONCE:
            batch.names_digest = int.from_bytes(sec.take(8), "little")
        elif SECTION_RECORDS + min(SHIPPED_TYPES) <= tag <= SECTION_RECORDS + max(SHIPPED_TYPES):
            batch.arrays[tag - SECTION_RECORDS] = _decode_records(
                sec, tag - SECTION_RECORDS, header, limits, version
            )
        elif tag == SECTION_HISTOGRAMS and version >= BODY_VERSION_HISTOGRAMS:
            from kernel_insight.collector.wire_hist import decode_histograms

            batch.histograms = decode_histograms(sec, header, limits, version)
        else:
            raise MalformedBatch(f"unknown section 0x{tag:02x}")
        if not sec.done():
            raise MalformedBatch(f"section 0x{tag:02x}: {sec.end - sec.pos} bytes left over")
    total = batch.record_count
    if total != header.record_count:
        raise MalformedBatch(f"header says {header.record_count} records, body has {total}")
    return batch


def _decode_counters(r: _Reader, batch: DecodedBatch) -> None:
    k = r.varint()
    if k > 4096:
        raise MalformedBatch(f"{k} counters")
    last = 0
    for _ in range(k):
        cid = r.varint()
        if cid <= last:
            raise MalformedBatch("counter ids not strictly increasing")
        last = cid
        batch.counters[cid] = r.varint()


def _decode_strings(r: _Reader, batch: DecodedBatch, limits: Limits) -> None:
    k = r.varint()
    if k > limits.max_strings:
        raise MalformedBatch(f"{k} names exceed the limit of {limits.max_strings}")
    for _ in range(k):
        producer = r.varint()
        sid = r.varint()
        if producer >> 32 or sid >> 32:
            raise MalformedBatch("name key does not fit 32 bits")
        n = r.varint()
        if n > limits.max_name:
            raise MalformedBatch(f"name of {n} bytes exceeds the limit of {limits.max_name}")
        raw = bytes(r.take(n))
        batch.strings[(producer, sid)] = raw.decode("utf-8", errors="replace")
        if batch.body_version >= BODY_VERSION_NAMES_ONCE:
            batch.string_hashes[(producer, sid)] = name_hash(producer, sid, raw)


def name_hash(producer: int, string_id: int, text: bytes) -> int:
    """The wire's hash of one name (docs/wire.md, NAMES_USED): the first 8 bytes, little-endian,
    of the 16-byte BLAKE2b of producer and string id (u32 LE each) and the text's bytes."""
    h = hashlib.blake2b(struct.pack("<II", producer, string_id), digest_size=16)
    h.update(text)
    return int.from_bytes(h.digest()[:8], "little")


def _decode_captures(r: _Reader) -> tuple[CaptureReport, ...]:
    k = r.varint()
    if not 1 <= k <= MAX_CAPTURES:
        raise MalformedBatch(f"{k} capture reports (1..{MAX_CAPTURES})")
    out = []
    for _ in range(k):
        cid = int.from_bytes(r.take(8), "little")
        gpu, start, end, spans, final = r.varint(), r.varint(), r.varint(), r.varint(), r.u8()
        if gpu > 65535 or end <= start or start >> 63 or end >> 63 or final > 1:
            raise MalformedBatch(
                f"capture report {cid:016x}: gpu {gpu}, window {start}..{end}, final {final}"
            )
        out.append(CaptureReport(f"{cid:016x}", gpu, start, end, spans, bool(final)))
    return tuple(out)


def _decode_labels(r: _Reader) -> tuple[tuple[str, str], ...]:
    """The section's shape only: whether the labels are acceptable is the collector's call
    (sink.StoreSink applies the enrolment rules and ignores labels that break them)."""
    k = r.varint()
    if not 1 <= k <= MAX_AGENT_LABELS:
        raise MalformedBatch(f"{k} labels (1..{MAX_AGENT_LABELS})")
    out = []
    for _ in range(k):
        pair = []
        for what in ("name", "value"):
            n = r.varint()
            if not 1 <= n <= MAX_AGENT_LABEL_BYTES:
                raise MalformedBatch(f"label {what} of {n} bytes (1..{MAX_AGENT_LABEL_BYTES})")
            try:
                pair.append(bytes(r.take(n)).decode("utf-8"))
            except UnicodeDecodeError:
                raise MalformedBatch(f"label {what} is not UTF-8") from None
        out.append((pair[0], pair[1]))
    return tuple(out)


def _encode_labels(labels: Sequence[tuple[str, str]]) -> bytes:
    out = bytearray(varint.encode(len(labels)))
    for name, value in labels:
        for text in (name, value):
            raw = text.encode()
            out += varint.encode(len(raw)) + raw
    return bytes(out)


def _encode_captures(reports: Sequence[CaptureReport]) -> bytes:
    out = bytearray(varint.encode(len(reports)))
    for c in reports:
        out += int(c.id, 16).to_bytes(8, "little")
        out += (
            varint.encode(c.gpu)
            + varint.encode(c.start_ns)
            + varint.encode(c.end_ns)
            + varint.encode(c.spans)
            + bytes([int(c.final)])
        )
    return bytes(out)


KeyLookup = Callable[[BatchHeader], bytes]


def decode_batch(
    frame: bytes | memoryview, key: bytes | KeyLookup, limits: Limits = DEFAULT_LIMITS
) -> DecodedBatch:
    """Header, tag, decompression and body in one call; key may be a lookup by header."""
    header = parse_header(frame, limits)
    k = key if isinstance(key, bytes) else key(header)
    return decode_body(open_frame(frame, header, k, limits), header, limits)


# ---- encoder -----------------------------------------------------------------------


def _encode_column(v: U64, enc: str, width: int, ts: U64, pos: U64 | None = None) -> bytes:
    if enc == "pdelta":
        assert pos is not None
        v, enc = v - pos, "delta"
    if enc == "u8":
        return v.astype(np.uint8).tobytes()
    if enc == "f64":
        return v.astype("<u8").tobytes()
    if enc == "delta":
        d = np.empty_like(v)
        d[0] = v[0]
        d[1:] = v[1:] - v[:-1]
        v = _zigzag(d)
    elif enc == "rel":
        v = _zigzag(v - ts)
    elif enc == "sv":
        if width == 4:
            v = v.astype(np.uint32).view(np.int32).astype(np.int64).view(np.uint64)
        v = _zigzag(v)
    return _encode_varints(v)


def _encode_records(arr: npt.NDArray[np.void], rtype: int, version: int = BODY_VERSION) -> bytes:
    out = bytearray(varint.encode(len(arr)))
    payload = arr["payload"].copy().view(_PAYLOAD_DTYPE[rtype])
    ts = arr["ts_ns"].astype(np.uint64)
    pos = arr["pos"].astype(np.uint64)
    for col in _columns(rtype, version):
        name, enc, width = col
        src = arr[name] if col in _COMMON else payload[name]
        data = _encode_column(np.ascontiguousarray(src).astype(np.uint64), enc, width, ts, pos)
        out += varint.encode(len(data)) + data
    return bytes(out)


def _section(tag: int, data: bytes) -> bytes:
    return bytes([tag]) + varint.encode(len(data)) + data


def encode_body(
    records: npt.NDArray[np.void],
    strings: Mapping[tuple[int, int], bytes | str] | None = None,
    counters: Mapping[int, int] | None = None,
    captures: Sequence[CaptureReport] = (),
    *,
    body_version: int = BODY_VERSION,
    histograms: bytes | None = None,
    labels: Sequence[tuple[str, str]] = (),
    names_digest: int | None = None,
) -> bytes:
    """A plaintext body from RECORD_DTYPE records (STRING chunks go in `strings`, already joined);
    ``histograms`` is a HISTOGRAMS section's content (wire_hist.encode_histograms, versions 2 to 5);
    ``labels`` the agent's configured instance labels (a LABELS section); ``names_digest`` a
    NAMES_USED section (version 5: texts of names the batch uses were left out of ``strings``)."""
    if records.dtype != RECORD_DTYPE:
        raise TypeError("encode_body() needs an array of RECORD_DTYPE")
    if histograms is not None and body_version < BODY_VERSION_HISTOGRAMS:
        # from the constants, so it cannot go stale again (it said "2, 3 or 4" when 5 came)
        raise ValueError(
            f"a HISTOGRAMS section needs body_version {BODY_VERSION_HISTOGRAMS} to {BODY_VERSIONS[-1]}"
        )
    out = bytearray([body_version])
    if histograms is not None:
        out += _section(SECTION_HISTOGRAMS, histograms)
    if counters:
        c = bytearray(varint.encode(len(counters)))
        for cid in sorted(counters):
            c += varint.encode(int(cid)) + varint.encode(int(counters[cid]))
        out += _section(SECTION_COUNTERS, bytes(c))
    if strings:
        s = bytearray(varint.encode(len(strings)))
        for (producer, sid), name in strings.items():
            raw = name.encode() if isinstance(name, str) else bytes(name)
            s += varint.encode(producer) + varint.encode(sid) + varint.encode(len(raw)) + raw
        out += _section(SECTION_STRINGS, bytes(s))
    if captures:
        out += _section(SECTION_CAPTURES, _encode_captures(captures))
    if names_digest is not None:
        if body_version < BODY_VERSION_NAMES_ONCE:
            raise ValueError("a NAMES_USED section needs body_version 5")
        out += _section(SECTION_NAMES_USED, names_digest.to_bytes(8, "little"))
    if labels:
        out += _section(SECTION_LABELS, _encode_labels(labels))
    types = records["type"]
    for t in np.unique(types).tolist():
        if t not in _PAYLOAD:
            raise ValueError(f"record type {t} cannot be shipped (STRING chunks go in the string table)")
        out += _section(SECTION_RECORDS + t, _encode_records(records[types == t], t, body_version))
    return bytes(out)


def seal_body(
    body: bytes,
    *,
    agent_id: bytes,
    key_id: int,
    key: bytes,
    epoch: int,
    seq: int,
    t_min_ns: int,
    t_max_ns: int,
    record_count: int,
    compress: bool = True,
    level: int = 3,
) -> bytes:
    """Compress and seal a body under the agent's key: the frame the agent would send."""
    if len(agent_id) != 16:
        raise ValueError("an agent id is 16 bytes")
    payload = zstandard.ZstdCompressor(level=level).compress(body) if compress else body
    header = BatchHeader(
        agent_id,
        key_id,
        epoch,
        seq,
        t_min_ns,
        t_max_ns,
        record_count,
        len(payload) + TAG_SIZE,
        COMPRESSION_ZSTD if compress else COMPRESSION_NONE,
    )
    aad = header.pack()
    return aad + ChaCha20Poly1305(key).encrypt(header.nonce, payload, aad)


def encode_batch(
    records: npt.NDArray[np.void] | Iterable[Record],
    *,
    agent_id: bytes,
    key_id: int,
    key: bytes,
    epoch: int,
    seq: int,
    strings: Mapping[tuple[int, int], bytes | str] | None = None,
    counters: Mapping[int, int] | None = None,
    now_ns: int = 0,
    compress: bool = True,
    captures: Sequence[CaptureReport] = (),
    body_version: int = BODY_VERSION,
    histograms: bytes | None = None,
    histograms_ts_ns: int = 0,
    labels: Sequence[tuple[str, str]] = (),
    names_digest: int | None = None,
) -> bytes:
    """Encode and seal one batch; the time range is taken from the records (or now_ns if none)
    and, with ``histograms`` (a HISTOGRAMS section stamped ``histograms_ts_ns``), covers it too."""
    arr = records if isinstance(records, np.ndarray) else records_to_array(records)
    times = [int(arr["ts_ns"].min()), int(arr["ts_ns"].max())] if len(arr) else []
    if histograms is not None:
        times.append(histograms_ts_ns)
    t_min, t_max = (min(times), max(times)) if times else (now_ns, now_ns)
    return seal_body(
        encode_body(
            arr,
            strings,
            counters,
            captures,
            body_version=body_version,
            histograms=histograms,
            labels=labels,
            names_digest=names_digest,
        ),
        agent_id=agent_id,
        key_id=key_id,
        key=key,
        epoch=epoch,
        seq=seq,
        t_min_ns=t_min,
        t_max_ns=t_max,
        record_count=len(arr),
        compress=compress,
    )


def records_to_array(records: Iterable[Record]) -> npt.NDArray[np.void]:
    """The inverse of records.decode_records for shippable records (reserved bytes zero)."""
    from kernel_insight.agent import records as r

    rows = list(records)
    out = np.zeros(len(rows), dtype=RECORD_DTYPE)
    for i, rec in enumerate(rows):
        p: tuple[int | float, ...]
        if isinstance(rec, r.KernelRecord):
            t, ident, ts = RecordType.KERNEL, rec.name_id, rec.start_ns
            p = (rec.end_ns, rec.stream, rec.correlation, rec.pid)
            fmt = "<QQQI4x"
        elif isinstance(rec, r.LaunchRecord):
            t, ident, ts = RecordType.LAUNCH, rec.function_id, rec.ts_ns
            p, fmt = (rec.pid, rec.tid, *rec.grid, *rec.block), "<8I"
        elif isinstance(rec, r.MemopRecord):
            t, ident, ts = RecordType.MEMOP, rec.kind, rec.ts_ns
            p, fmt = (rec.address, rec.nbytes, rec.pid, rec.tid, rec.status), "<QQIIi4x"
        elif isinstance(rec, r.CollectiveRecord):
            t, ident, ts = RecordType.COLLECTIVE, rec.op, rec.ts_ns
            p, fmt = (rec.nbytes, rec.duration_ns, rec.comm, rec.rank, rec.nranks), "<QQQII"
        elif isinstance(rec, r.SyncRecord):
            t, ident, ts = RecordType.SYNC, rec.kind, rec.ts_ns
            p, fmt = (rec.duration_ns, rec.handle, rec.pid, rec.tid), "<QQII8x"
        elif isinstance(rec, r.SampleRecord):
            t, ident, ts = RecordType.GPU_SAMPLE, rec.metric, rec.ts_ns
            p, fmt = (rec.value, rec.aux), "<dQ16x"
        elif isinstance(rec, r.FingerprintRecord):
            t, ident, ts = RecordType.FINGERPRINT, rec.field, rec.ts_ns
            p, fmt = (rec.value,), "<Q24x"
        elif isinstance(rec, r.ErrorRecord):
            t, ident, ts = RecordType.ERROR, rec.kind, rec.ts_ns
            p, fmt = (rec.code, rec.aux, rec.pid, rec.detail_id), "<qQII8x"
        else:
            raise ValueError(f"{type(rec).__name__} cannot be shipped as a record")
        out[i] = (rec.pos, rec.producer, 0, t, rec.flags, rec.device, ident, ts, struct.pack(fmt, *p))
    return out
