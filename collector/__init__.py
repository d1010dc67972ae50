"""The collector: authenticated ingest of agent batches into ClickHouse (see docs/architecture.md).

Storage side (docs/storage.md): :class:`EmbeddedStore` (chDB) and :class:`ServerStore`
(clickhouse-connect) share one schema and one set of SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.agent.metric_ids import METRIC_SPECS, MetricId, MetricSpec
    from kernel_insight.collector.app import create_app
    from kernel_insight.collector.batcher import Batcher, BatcherStats, FlushFailed, Ticket
    from kernel_insight.collector.captures import CaptureDesk, CaptureError
    from kernel_insight.collector.derive import DROP_REASONS, DROP_STATS, Derived, Deriver, DropStats
    from kernel_insight.collector.ingest import IngestStats, KeyLookup, SeenBatches, ingest_router
    from kernel_insight.collector.keys import (
        AgentCredentials,
        AgentInfo,
        ClickHouseKeyStore,
        KeyStore,
        KeyStoreBase,
        KeyStoreError,
        RevokedAgent,
        UnknownAgent,
        read_key_file,
    )
    from kernel_insight.collector.metrics import AgentStates, CollectorMetrics, RequestMetrics, StoreStats
    from kernel_insight.collector.openmetrics import (
        Exposition,
        ExpositionReader,
        OpenMetricsError,
        parse_exposition,
    )
    from kernel_insight.collector.perfetto_trace import perfetto_trace
    from kernel_insight.collector.query import ClickHouseStorage
    from kernel_insight.collector.relabel import (
        RelabelConfig,
        Relabeler,
        RelabelError,
        load_relabel_configs,
        parse_relabel_configs,
    )
    from kernel_insight.collector.remote_write import (
        RemoteWriteError,
        SeriesEncoder,
        encode_write_request,
        parse_remote_write,
    )
    from kernel_insight.collector.rows import (
        CallBatch,
        Event,
        HistogramBatch,
        HistogramBuilder,
        InstanceInfo,
        SampleBatch,
        SampleBuilder,
        SeriesLimits,
        SpanBatch,
        canonical_labels,
        series_fingerprint,
        validate_series,
    )
    from kernel_insight.collector.sample_cache import CacheStats, SampleBlock, SampleCache
    from kernel_insight.collector.schema import SCHEMA, Retention, cluster_ddl, single_ddl
    from kernel_insight.collector.sink import StoreSink
    from kernel_insight.collector.spans import SpanCursor, SpanQueryError, SpanWindow
    from kernel_insight.collector.store import (
        EmbeddedStore,
        PreparedRows,
        ServerStore,
        StorageError,
        StorageUnavailable,
        Store,
        open_store,
    )
    from kernel_insight.collector.trace import TraceTooLarge, chrome_trace, chrome_trace_parts
    from kernel_insight.collector.wire import (
        CONTENT_TYPE,
        INGEST_PATH,
        AuthenticationFailed,
        BatchHeader,
        BatchId,
        CaptureReport,
        Counter,
        DecodedBatch,
        Limits,
        MalformedBatch,
        OversizedBatch,
        WireError,
        decode_batch,
        encode_batch,
    )

#: Where each exported name lives. A submodule is imported when one of its names is first used:
#: ``import kernel_insight.collector.openmetrics`` (``ki import``) then loads neither FastAPI nor
#: the app (~57 MB resident and ~1 s of CPU the import never used: docs/benchmarks.md).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.agent.metric_ids": ("METRIC_SPECS", "MetricId", "MetricSpec"),
    "kernel_insight.collector.app": ("create_app",),
    "kernel_insight.collector.batcher": ("Batcher", "BatcherStats", "FlushFailed", "Ticket"),
    "kernel_insight.collector.captures": ("CaptureDesk", "CaptureError"),
    "kernel_insight.collector.derive": ("DROP_REASONS", "DROP_STATS", "Derived", "Deriver", "DropStats"),
    "kernel_insight.collector.ingest": ("IngestStats", "KeyLookup", "SeenBatches", "ingest_router"),
    "kernel_insight.collector.keys": (
        "AgentCredentials",
        "AgentInfo",
        "ClickHouseKeyStore",
        "KeyStore",
        "KeyStoreBase",
        "KeyStoreError",
        "RevokedAgent",
        "UnknownAgent",
        "read_key_file",
    ),
    "kernel_insight.collector.metrics": ("AgentStates", "CollectorMetrics", "RequestMetrics", "StoreStats"),
    "kernel_insight.collector.openmetrics": (
        "Exposition",
        "ExpositionReader",
        "OpenMetricsError",
        "parse_exposition",
    ),
    "kernel_insight.collector.perfetto_trace": ("perfetto_trace",),
    "kernel_insight.collector.query": ("ClickHouseStorage",),
    "kernel_insight.collector.relabel": (
        "RelabelConfig",
        "Relabeler",
        "RelabelError",
        "load_relabel_configs",
        "parse_relabel_configs",
    ),
    "kernel_insight.collector.remote_write": (
        "RemoteWriteError",
        "SeriesEncoder",
        "encode_write_request",
        "parse_remote_write",
    ),
    "kernel_insight.collector.rows": (
        "CallBatch",
        "Event",
        "HistogramBatch",
        "HistogramBuilder",
        "InstanceInfo",
        "SampleBatch",
        "SampleBuilder",
        "SeriesLimits",
        "SpanBatch",
        "canonical_labels",
        "series_fingerprint",
        "validate_series",
    ),
    "kernel_insight.collector.sample_cache": ("CacheStats", "SampleBlock", "SampleCache"),
    "kernel_insight.collector.schema": ("SCHEMA", "Retention", "cluster_ddl", "single_ddl"),
    "kernel_insight.collector.sink": ("StoreSink",),
    "kernel_insight.collector.spans": ("SpanCursor", "SpanQueryError", "SpanWindow"),
    "kernel_insight.collector.store": (
        "EmbeddedStore",
        "PreparedRows",
        "ServerStore",
        "StorageError",
        "StorageUnavailable",
        "Store",
        "open_store",
    ),
    "kernel_insight.collector.trace": ("TraceTooLarge", "chrome_trace", "chrome_trace_parts"),
    "kernel_insight.collector.wire": (
        "CONTENT_TYPE",
        "INGEST_PATH",
        "AuthenticationFailed",
        "BatchHeader",
        "BatchId",
        "CaptureReport",
        "Counter",
        "DecodedBatch",
        "Limits",
        "MalformedBatch",
        "OversizedBatch",
        "WireError",
        "decode_batch",
        "encode_batch",
    ),
}
__all__ = [
    "CONTENT_TYPE",
    "DROP_REASONS",
    "DROP_STATS",
    "INGEST_PATH",
    "METRIC_SPECS",
    "SCHEMA",
    "AgentCredentials",
    "AgentInfo",
    "AgentStates",
    "AuthenticationFailed",
    "BatchHeader",
    "BatchId",
    "Batcher",
    "BatcherStats",
    "CacheStats",
    "CallBatch",
    "CaptureDesk",
    "CaptureError",
    "CaptureReport",
    "ClickHouseKeyStore",
    "ClickHouseStorage",
    "CollectorMetrics",
    "Counter",
    "DecodedBatch",
    "Derived",
    "Deriver",
    "DropStats",
    "EmbeddedStore",
    "Event",
    "Exposition",
    "ExpositionReader",
    "FlushFailed",
    "HistogramBatch",
    "HistogramBuilder",
    "IngestStats",
    "InstanceInfo",
    "KeyLookup",
    "KeyStore",
    "KeyStoreBase",
    "KeyStoreError",
    "Limits",
    "MalformedBatch",
    "MetricId",
    "MetricSpec",
    "OpenMetricsError",
    "OversizedBatch",
    "PreparedRows",
    "RelabelConfig",
    "RelabelError",
    "Relabeler",
    "RemoteWriteError",
    "RequestMetrics",
    "Retention",
    "RevokedAgent",
    "SampleBatch",
    "SampleBlock",
    "SampleBuilder",
    "SampleCache",
    "SeenBatches",
    "SeriesEncoder",
    "SeriesLimits",
    "ServerStore",
    "SpanBatch",
    "SpanCursor",
    "SpanQueryError",
    "SpanWindow",
    "StorageError",
    "StorageUnavailable",
    "Store",
    "StoreSink",
    "StoreStats",
    "Ticket",
    "TraceTooLarge",
    "UnknownAgent",
    "WireError",
    "canonical_labels",
    "chrome_trace",
    "chrome_trace_parts",
    "cluster_ddl",
    "create_app",
    "decode_batch",
    "encode_batch",
    "encode_write_request",
    "ingest_router",
    "load_relabel_configs",
    "open_store",
    "parse_exposition",
    "parse_relabel_configs",
    "parse_remote_write",
    "perfetto_trace",
    "read_key_file",
    "series_fingerprint",
    "single_ddl",
    "validate_series",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
