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
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.agent.launcher import BINARY_ENV as BINARY_ENV
    from kernel_insight.agent.launcher import agent_binary as agent_binary
    from kernel_insight.agent.metric_ids import METRIC_SPECS as METRIC_SPECS
    from kernel_insight.agent.metric_ids import MetricId as MetricId
    from kernel_insight.agent.metric_ids import MetricSpec as MetricSpec
    from kernel_insight.agent.records import PAYLOAD_DTYPES as PAYLOAD_DTYPES
    from kernel_insight.agent.records import RECORD_DTYPE as RECORD_DTYPE
    from kernel_insight.agent.records import CollectiveOp as CollectiveOp
    from kernel_insight.agent.records import CollectiveRecord as CollectiveRecord
    from kernel_insight.agent.records import ErrorKind as ErrorKind
    from kernel_insight.agent.records import ErrorRecord as ErrorRecord
    from kernel_insight.agent.records import FingerprintField as FingerprintField
    from kernel_insight.agent.records import FingerprintRecord as FingerprintRecord
    from kernel_insight.agent.records import KernelRecord as KernelRecord
    from kernel_insight.agent.records import LaunchRecord as LaunchRecord
    from kernel_insight.agent.records import MemopKind as MemopKind
    from kernel_insight.agent.records import MemopRecord as MemopRecord
    from kernel_insight.agent.records import Record as Record
    from kernel_insight.agent.records import RecordFlag as RecordFlag
    from kernel_insight.agent.records import RecordType as RecordType
    from kernel_insight.agent.records import SampleRecord as SampleRecord
    from kernel_insight.agent.records import StringRecord as StringRecord
    from kernel_insight.agent.records import StringTable as StringTable
    from kernel_insight.agent.records import SyncKind as SyncKind
    from kernel_insight.agent.records import SyncRecord as SyncRecord
    from kernel_insight.agent.records import decode_record as decode_record
    from kernel_insight.agent.records import decode_records as decode_records
    from kernel_insight.agent.ring import DEFAULT_CAPACITY as DEFAULT_CAPACITY
    from kernel_insight.agent.ring import RECORD_SIZE as RECORD_SIZE
    from kernel_insight.agent.ring import RING_VERSION as RING_VERSION
    from kernel_insight.agent.ring import Ring as Ring
    from kernel_insight.agent.ring import RingError as RingError
    from kernel_insight.agent.ring import RingReader as RingReader
    from kernel_insight.agent.ring import WriteStatus as WriteStatus
    from kernel_insight.agent.ring import ring_name as ring_name


__getattr__, __dir__ = lazy_exports(globals())
