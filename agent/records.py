"""Typed views of the ring's 64-byte records (docs/ring.md, "Record types").

The ring hands out raw slot images; tools and tests want named fields, the
agent wants bulk arrays.  Both views are defined here, once.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "COLLECTIVE_PAYLOAD",
    "ERROR_PAYLOAD",
    "FINGERPRINT_PAYLOAD",
    "KERNEL_PAYLOAD",
    "LAUNCH_PAYLOAD",
    "MEMOP_PAYLOAD",
    "PAYLOAD_DTYPES",
    "RECORD_DTYPE",
    "REC_HEAD",
    "SAMPLE_PAYLOAD",
    "SYNC_PAYLOAD",
    "CollectiveOp",
    "CollectiveRecord",
    "ErrorKind",
    "ErrorRecord",
    "FingerprintField",
    "FingerprintRecord",
    "KernelRecord",
    "LaunchRecord",
    "MemopKind",
    "MemopRecord",
    "Record",
    "RecordFlag",
    "RecordType",
    "SampleRecord",
    "StringRecord",
    "StringTable",
    "SyncKind",
    "SyncRecord",
    "decode_record",
    "decode_records",
]


class RecordType(enum.IntEnum):
    KERNEL = 1
    LAUNCH = 2
    MEMOP = 3
    COLLECTIVE = 4
    SYNC = 5
    GPU_SAMPLE = 6
    FINGERPRINT = 7
    ERROR = 8
    STRING = 9


class RecordFlag(enum.IntFlag):
    FAILED = 0x01
    SIMULATED = 0x02
    LAUNCH_SPAN = 0x04  # LAUNCH: the host side of a CUDA-event span (docs/ring.md)
    STRING_SIZED = 0x20  # last STRING chunk of a name ending in NUL: byte 31 is the chunk's length
    FP_STRING = 0x40
    STRING_LAST = 0x80


class MemopKind(enum.IntEnum):
    ALLOC = 1
    FREE = 2
    ALLOC_ASYNC = 3
    FREE_ASYNC = 4
    MEMCPY = 5  # a memory copy: bytes is its size (memcpy_bytes histogram)
    MEMSET = 6  # a memset on the device (CUPTI probe): bytes is its size


class SyncKind(enum.IntEnum):
    STREAM = 1
    CONTEXT = 2
    EVENT = 3


class CollectiveOp(enum.IntEnum):
    ALLREDUCE = 1
    ALLGATHER = 2
    REDUCESCATTER = 3
    BROADCAST = 4
    REDUCE = 5
    SEND = 6
    RECV = 7
    GROUP = 8
    ALLTOALL = 9


class ErrorKind(enum.IntEnum):
    OOM = 1
    XID = 2
    NCCL_TIMEOUT = 3
    ECC = 4
    CUDA = 5
    OTHER = 6


class FingerprintField(enum.IntEnum):
    NAME = 1
    UUID = 2
    DRIVER_VERSION = 3
    CUDA_VERSION = 4
    MEMORY_TOTAL = 5
    NVLINK_LINKS = 6
    NVLINK_BANDWIDTH = 7
    PCI_BUS_ID = 8
    SM_COUNT = 9
    COMPUTE_CAPABILITY = 10
    HOSTNAME = 11  # the node's name (string): dcgm-exporter's Hostname label
    POD = 12  # Kubernetes attribution of the GPU (strings, "" when no pod holds it): docs/metrics.md
    NAMESPACE = 13
    CONTAINER = 14


#: One consumed record: the slot image with the sequence word replaced by the position.
RECORD_DTYPE = np.dtype(
    [
        ("pos", "<u8"),
        ("producer", "<u4"),
        ("check", "<u4"),
        ("type", "u1"),
        ("flags", "u1"),
        ("device", "<u2"),
        ("id", "<u4"),
        ("ts_ns", "<u8"),
        ("payload", "V32"),
    ]
)
assert RECORD_DTYPE.itemsize == 64

#: Each record type's 32-byte payload as a numpy dtype, field for field as ``ki_ring.h``'s
#: payload structs (same names, offsets, sizes and signedness): the table every vectorised
#: reader views payloads through. tests/agent/test_record_layout.py checks it, the struct
#: formats below and the wire decoder's against the compiler's ``offsetof``/``sizeof``.
PAYLOAD_DTYPES: dict[RecordType, np.dtype[np.void]] = {
    RecordType.KERNEL: np.dtype(
        [("end_ns", "<u8"), ("stream", "<u8"), ("correlation", "<u8"), ("pid", "<u4"), ("reserved", "<u4")]
    ),
    RecordType.LAUNCH: np.dtype(
        [("pid", "<u4"), ("tid", "<u4"), ("grid", "<u4", (3,)), ("block", "<u4", (3,))]
    ),
    RecordType.MEMOP: np.dtype(
        [
            ("address", "<u8"),
            ("bytes", "<u8"),
            ("pid", "<u4"),
            ("tid", "<u4"),
            ("status", "<i4"),
            ("reserved", "<u4"),
        ]
    ),
    RecordType.COLLECTIVE: np.dtype(
        [("bytes", "<u8"), ("duration_ns", "<u8"), ("comm", "<u8"), ("rank", "<u4"), ("nranks", "<u4")]
    ),
    RecordType.SYNC: np.dtype(
        [("duration_ns", "<u8"), ("handle", "<u8"), ("pid", "<u4"), ("tid", "<u4"), ("reserved", "<u8")]
    ),
    RecordType.GPU_SAMPLE: np.dtype([("value", "<f8"), ("aux", "<u8"), ("reserved", "<u8", (2,))]),
    RecordType.FINGERPRINT: np.dtype([("value", "<u8"), ("reserved", "<u8", (3,))]),
    RecordType.ERROR: np.dtype(
        [("code", "<i8"), ("aux", "<u8"), ("pid", "<u4"), ("detail_id", "<u4"), ("reserved", "<u8")]
    ),
    RecordType.STRING: np.dtype([("text", "S32")]),
}
assert all(dt.itemsize == 32 for dt in PAYLOAD_DTYPES.values())

_STRUCT_CODES = {"u1": "B", "u2": "H", "u4": "I", "u8": "Q", "i4": "i", "i8": "q", "f8": "d"}


def _struct_of(dtype: np.dtype[np.void], names: tuple[str, ...] | None = None) -> struct.Struct:
    """The ``struct`` format of ``dtype``'s fields (``names``: those, in order), written from the
    dtype itself: ``reserved`` fields are pad bytes, a sub-array is a repeat count."""
    assert dtype.names is not None
    assert dtype.fields is not None
    codes = []
    for name in dtype.names if names is None else names:
        field: np.dtype[Any] = dtype.fields[name][0]
        base, shape = field.subdtype if field.subdtype is not None else (field, ())
        count = int(np.prod(shape)) if shape else 1
        if name == "reserved":
            codes.append(f"{field.itemsize}x")
        else:
            codes.append((str(count) if count > 1 else "") + _STRUCT_CODES[base.str[1:]])
    return struct.Struct("<" + "".join(codes))


_RECORD_FIELDS = ("pos", "producer", "check", "type", "flags", "device", "id", "ts_ns")
#: A consumed record's first 32 bytes (pos, producer, check, header).
_HEAD = _struct_of(RECORD_DTYPE, _RECORD_FIELDS)

#: The 16-byte record header and the 32-byte payload of each type, as docs/ring.md lays them
#: out, written from RECORD_DTYPE and PAYLOAD_DTYPES: what Python-side record packers use.
REC_HEAD = _struct_of(RECORD_DTYPE, _RECORD_FIELDS[3:])
KERNEL_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.KERNEL])
LAUNCH_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.LAUNCH])
MEMOP_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.MEMOP])
COLLECTIVE_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.COLLECTIVE])
SYNC_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.SYNC])
SAMPLE_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.GPU_SAMPLE])
FINGERPRINT_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.FINGERPRINT])
ERROR_PAYLOAD = _struct_of(PAYLOAD_DTYPES[RecordType.ERROR])


@dataclass(frozen=True, slots=True)
class KernelRecord:
    pos: int
    producer: int
    flags: int
    device: int
    name_id: int
    start_ns: int
    end_ns: int
    stream: int
    correlation: int
    pid: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    pos: int
    producer: int
    flags: int
    device: int
    function_id: int
    ts_ns: int
    pid: int
    tid: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class MemopRecord:
    pos: int
    producer: int
    flags: int
    device: int
    kind: int  # MemopKind when known
    ts_ns: int
    address: int
    nbytes: int
    pid: int
    tid: int
    status: int


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    pos: int
    producer: int
    flags: int
    device: int
    op: int  # CollectiveOp when known
    ts_ns: int
    nbytes: int
    duration_ns: int
    comm: int
    rank: int
    nranks: int


@dataclass(frozen=True, slots=True)
class SyncRecord:
    pos: int
    producer: int
    flags: int
    device: int
    kind: int  # SyncKind when known
    ts_ns: int
    duration_ns: int
    handle: int
    pid: int
    tid: int


@dataclass(frozen=True, slots=True)
class SampleRecord:
    pos: int
    producer: int
    flags: int
    device: int
    metric: int
    ts_ns: int
    value: float
    aux: int


@dataclass(frozen=True, slots=True)
class FingerprintRecord:
    pos: int
    producer: int
    flags: int
    device: int
    field: int  # FingerprintField when known
    ts_ns: int
    value: int

    @property
    def is_string(self) -> bool:
        return bool(self.flags & RecordFlag.FP_STRING)


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    pos: int
    producer: int
    flags: int
    device: int
    kind: int  # ErrorKind when known
    ts_ns: int
    code: int
    aux: int
    pid: int
    detail_id: int


@dataclass(frozen=True, slots=True)
class StringRecord:
    pos: int
    producer: int
    flags: int
    string_id: int
    chunk: int
    ts_ns: int
    text: bytes

    @property
    def last(self) -> bool:
        return bool(self.flags & RecordFlag.STRING_LAST)


Record = (
    KernelRecord
    | LaunchRecord
    | MemopRecord
    | CollectiveRecord
    | SyncRecord
    | SampleRecord
    | FingerprintRecord
    | ErrorRecord
    | StringRecord
)


def _enum(cls: type[enum.IntEnum], value: int) -> int:
    """The enum member when the value is known, else the plain int (newer producers may add kinds)."""
    try:
        return cls(value)
    except ValueError:
        return value


def decode_record(raw: bytes | memoryview) -> Record:
    """Decode one 64-byte consumed record; unknown types raise ValueError (the consumer counts them)."""
    if len(raw) != 64:
        raise ValueError(f"a record is 64 bytes, got {len(raw)}")
    pos, producer, _check, rtype, flags, device, ident, ts = _HEAD.unpack_from(raw, 0)
    p = 32
    if rtype == RecordType.KERNEL:
        end, stream, corr, pid = KERNEL_PAYLOAD.unpack_from(raw, p)
        return KernelRecord(pos, producer, flags, device, ident, ts, end, stream, corr, pid)
    if rtype == RecordType.LAUNCH:
        pid, tid, gx, gy, gz, bx, by, bz = LAUNCH_PAYLOAD.unpack_from(raw, p)
        return LaunchRecord(pos, producer, flags, device, ident, ts, pid, tid, (gx, gy, gz), (bx, by, bz))
    if rtype == RecordType.MEMOP:
        addr, nbytes, pid, tid, status = MEMOP_PAYLOAD.unpack_from(raw, p)
        kind = _enum(MemopKind, ident)
        return MemopRecord(pos, producer, flags, device, kind, ts, addr, nbytes, pid, tid, status)
    if rtype == RecordType.COLLECTIVE:
        nbytes, dur, comm, rank, nranks = COLLECTIVE_PAYLOAD.unpack_from(raw, p)
        op = _enum(CollectiveOp, ident)
        return CollectiveRecord(pos, producer, flags, device, op, ts, nbytes, dur, comm, rank, nranks)
    if rtype == RecordType.SYNC:
        dur, handle, pid, tid = SYNC_PAYLOAD.unpack_from(raw, p)
        return SyncRecord(pos, producer, flags, device, _enum(SyncKind, ident), ts, dur, handle, pid, tid)
    if rtype == RecordType.GPU_SAMPLE:
        value, aux = SAMPLE_PAYLOAD.unpack_from(raw, p)
        return SampleRecord(pos, producer, flags, device, ident, ts, value, aux)
    if rtype == RecordType.FINGERPRINT:
        (value,) = FINGERPRINT_PAYLOAD.unpack_from(raw, p)
        field = _enum(FingerprintField, ident)
        return FingerprintRecord(pos, producer, flags, device, field, ts, value)
    if rtype == RecordType.ERROR:
        code, aux, pid, detail = ERROR_PAYLOAD.unpack_from(raw, p)
        return ErrorRecord(pos, producer, flags, device, _enum(ErrorKind, ident), ts, code, aux, pid, detail)
    if rtype == RecordType.STRING:
        text = bytes(raw[p : p + 32])
        if flags & RecordFlag.STRING_LAST and flags & RecordFlag.STRING_SIZED:
            text = text[: min(text[31], 31)]  # the name ends in NUL: keep exactly its bytes
        elif flags & RecordFlag.STRING_LAST:
            text = text.rstrip(b"\0")
        return StringRecord(pos, producer, flags, ident, device, ts, text)
    raise ValueError(f"unknown record type {rtype} at ring position {pos}")


def decode_records(buf: bytes | bytearray | memoryview) -> list[Record]:
    """Decode a run of consumed records, as RingReader.read_bytes returns them."""
    view = memoryview(buf)
    if len(view) % 64:
        raise ValueError(f"record buffer of {len(view)} bytes is not a whole number of 64-byte records")
    return [decode_record(view[i : i + 64]) for i in range(0, len(view), 64)]


class StringTable:
    """Reassembles STRING chunks into names, keyed by (producer, string id).

    String ids are chosen by each producer, so the same id from two producers
    names two different strings; the producer id in every slot tells them apart.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[int, int], str] = {}
        self._partial: dict[tuple[int, int], list[bytes]] = {}

    def add(self, rec: StringRecord) -> str | None:
        """Take one chunk; returns the whole name once its last chunk arrives."""
        key = (rec.producer, rec.string_id)
        parts = self._partial.setdefault(key, [])
        if rec.chunk != len(parts):
            # A chunk went missing (dropped while the ring was full): start over.
            parts.clear()
            if rec.chunk != 0:
                return None
        parts.append(rec.text)
        if not rec.last:
            return None
        del self._partial[key]
        name = b"".join(parts).decode("utf-8", errors="replace")
        self._names[key] = name
        return name

    def get(self, producer: int, string_id: int) -> str | None:
        return self._names.get((producer, string_id))

    def __len__(self) -> int:
        return len(self._names)
