"""The collector: authenticated ingest of agent batches into ClickHouse (see docs/architecture.md).

Storage side (docs/storage.md): :class:`EmbeddedStore` (chDB) and :class:`ServerStore`
(clickhouse-connect) share one schema and one set of SQL.
"""

from __future__ import annotations

from kernel_insight.collector.app import create_app
from kernel_insight.collector.derive import Derived, Deriver
from kernel_insight.collector.metric_ids import METRIC_SPECS, MetricId, MetricSpec
from kernel_insight.collector.openmetrics import Exposition, OpenMetricsError, parse_exposition
from kernel_insight.collector.query import ClickHouseStorage
from kernel_insight.collector.remote_write import RemoteWriteError, encode_write_request, parse_remote_write
from kernel_insight.collector.rows import (
    Event,
    InstanceInfo,
    SampleBatch,
    SampleBuilder,
    SpanBatch,
    canonical_labels,
    series_fingerprint,
)
from kernel_insight.collector.schema import SCHEMA, Retention, cluster_ddl, single_ddl
from kernel_insight.collector.sink import StoreSink
from kernel_insight.collector.store import (
    EmbeddedStore,
    ServerStore,
    StorageError,
    StorageUnavailable,
    Store,
    open_store,
)

__all__ = [
    "METRIC_SPECS",
    "SCHEMA",
    "ClickHouseStorage",
    "Derived",
    "Deriver",
    "EmbeddedStore",
    "Event",
    "Exposition",
    "InstanceInfo",
    "MetricId",
    "MetricSpec",
    "OpenMetricsError",
    "RemoteWriteError",
    "Retention",
    "SampleBatch",
    "SampleBuilder",
    "ServerStore",
    "SpanBatch",
    "StorageError",
    "StorageUnavailable",
    "Store",
    "StoreSink",
    "canonical_labels",
    "cluster_ddl",
    "create_app",
    "encode_write_request",
    "open_store",
    "parse_exposition",
    "parse_remote_write",
    "series_fingerprint",
    "single_ddl",
]
