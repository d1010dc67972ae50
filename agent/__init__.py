"""The per-GPU side: the shared-memory ring that producers write and the agent drains.

Example::

    from kernel_insight.agent import Ring, RingReader, ring_name

    with Ring.create(ring_name(0)) as ring:
        ring.kernel(ring.intern("gemm"), 0, 1_000, 2_000)
        with RingReader.open(ring_name(0)) as reader:
            print(reader.read())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.agent.launcher import BINARY_ENV, agent_binary
    from kernel_insight.agent.metric_ids import METRIC_SPECS, MetricId, MetricSpec
    from kernel_insight.agent.records import (
        PAYLOAD_DTYPES,
        RECORD_DTYPE,
        CollectiveOp,
        CollectiveRecord,
        ErrorKind,
        ErrorRecord,
        FingerprintField,
        FingerprintRecord,
        KernelRecord,
        LaunchRecord,
        MemopKind,
        MemopRecord,
        Record,
        RecordFlag,
        RecordType,
        SampleRecord,
        StringRecord,
        StringTable,
        SyncKind,
        SyncRecord,
        decode_record,
        decode_records,
    )
    from kernel_insight.agent.ring import (
        DEFAULT_CAPACITY,
        RECORD_SIZE,
        RING_VERSION,
        Ring,
        RingError,
        RingReader,
        WriteStatus,
        ring_name,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.agent.launcher": (
        "BINARY_ENV",
        "agent_binary",
    ),
    "kernel_insight.agent.metric_ids": (
        "METRIC_SPECS",
        "MetricId",
        "MetricSpec",
    ),
    "kernel_insight.agent.records": (
        "PAYLOAD_DTYPES",
        "RECORD_DTYPE",
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
    ),
    "kernel_insight.agent.ring": (
        "DEFAULT_CAPACITY",
        "RECORD_SIZE",
        "RING_VERSION",
        "Ring",
        "RingError",
        "RingReader",
        "WriteStatus",
        "ring_name",
    ),
}

__all__ = [
    "BINARY_ENV",
    "DEFAULT_CAPACITY",
    "METRIC_SPECS",
    "PAYLOAD_DTYPES",
    "RECORD_DTYPE",
    "RECORD_SIZE",
    "RING_VERSION",
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
    "MetricId",
    "MetricSpec",
    "Record",
    "RecordFlag",
    "RecordType",
    "Ring",
    "RingError",
    "RingReader",
    "SampleRecord",
    "StringRecord",
    "StringTable",
    "SyncKind",
    "SyncRecord",
    "WriteStatus",
    "agent_binary",
    "decode_record",
    "decode_records",
    "ring_name",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
