"""The collector: authenticated ingest of agent batches into ClickHouse (see docs/architecture.md).

Storage side (docs/storage.md): :class:`EmbeddedStore` (chDB) and :class:`ServerStore`
(clickhouse-connect) share one schema and one set of SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.agent.metric_ids import METRIC_SPECS as METRIC_SPECS
    from kernel_insight.agent.metric_ids import MetricId as MetricId
    from kernel_insight.agent.metric_ids import MetricSpec as MetricSpec
    from kernel_insight.collector.app import create_app as create_app
    from kernel_insight.collector.batcher import Batcher as Batcher
    from kernel_insight.collector.batcher import BatcherStats as BatcherStats
    from kernel_insight.collector.batcher import FlushFailed as FlushFailed
    from kernel_insight.collector.batcher import Ticket as Ticket
    from kernel_insight.collector.captures import CaptureDesk as CaptureDesk
    from kernel_insight.collector.captures import CaptureError as CaptureError
    from kernel_insight.collector.clickhouse.embedded import EmbeddedStore as EmbeddedStore
    from kernel_insight.collector.clickhouse.errors import StorageUnavailable as StorageUnavailable
    from kernel_insight.collector.clickhouse.ingest_groups import PreparedRows as PreparedRows
    from kernel_insight.collector.clickhouse.query import ClickHouseStorage as ClickHouseStorage
    from kernel_insight.collector.clickhouse.schema import SCHEMA as SCHEMA
    from kernel_insight.collector.clickhouse.schema import Retention as Retention
    from kernel_insight.collector.clickhouse.schema import cluster_ddl as cluster_ddl
    from kernel_insight.collector.clickhouse.schema import single_ddl as single_ddl
    from kernel_insight.collector.clickhouse.server import ServerStore as ServerStore
    from kernel_insight.collector.clickhouse.store import StorageError as StorageError
    from kernel_insight.collector.clickhouse.store import Store as Store
    from kernel_insight.collector.clickhouse.store import open_store as open_store
    from kernel_insight.collector.derive import DROP_REASONS as DROP_REASONS
    from kernel_insight.collector.derive import DROP_STATS as DROP_STATS
    from kernel_insight.collector.derive import Derived as Derived
    from kernel_insight.collector.derive import Deriver as Deriver
    from kernel_insight.collector.derive import DropStats as DropStats
    from kernel_insight.collector.ingest import IngestStats as IngestStats
    from kernel_insight.collector.ingest import KeyLookup as KeyLookup
    from kernel_insight.collector.ingest import SeenBatches as SeenBatches
    from kernel_insight.collector.ingest import ingest_router as ingest_router
    from kernel_insight.collector.keys import AgentCredentials as AgentCredentials
    from kernel_insight.collector.keys import AgentInfo as AgentInfo
    from kernel_insight.collector.keys import ClickHouseKeyStore as ClickHouseKeyStore
    from kernel_insight.collector.keys import KeyStore as KeyStore
    from kernel_insight.collector.keys import KeyStoreBase as KeyStoreBase
    from kernel_insight.collector.keys import KeyStoreError as KeyStoreError
    from kernel_insight.collector.keys import RevokedAgent as RevokedAgent
    from kernel_insight.collector.keys import UnknownAgent as UnknownAgent
    from kernel_insight.collector.keys import read_key_file as read_key_file
    from kernel_insight.collector.metrics import AgentStates as AgentStates
    from kernel_insight.collector.metrics import CollectorMetrics as CollectorMetrics
    from kernel_insight.collector.metrics import RequestMetrics as RequestMetrics
    from kernel_insight.collector.metrics import StoreStats as StoreStats
    from kernel_insight.collector.openmetrics import Exposition as Exposition
    from kernel_insight.collector.openmetrics import ExpositionReader as ExpositionReader
    from kernel_insight.collector.openmetrics import OpenMetricsError as OpenMetricsError
    from kernel_insight.collector.openmetrics import parse_exposition as parse_exposition
    from kernel_insight.collector.relabel import RelabelConfig as RelabelConfig
    from kernel_insight.collector.relabel import Relabeler as Relabeler
    from kernel_insight.collector.relabel import RelabelError as RelabelError
    from kernel_insight.collector.relabel import load_relabel_configs as load_relabel_configs
    from kernel_insight.collector.relabel import parse_relabel_configs as parse_relabel_configs
    from kernel_insight.collector.remote_write import RemoteWriteError as RemoteWriteError
    from kernel_insight.collector.remote_write import SeriesEncoder as SeriesEncoder
    from kernel_insight.collector.remote_write import encode_write_request as encode_write_request
    from kernel_insight.collector.remote_write import parse_remote_write as parse_remote_write
    from kernel_insight.collector.rows import CallBatch as CallBatch
    from kernel_insight.collector.rows import Event as Event
    from kernel_insight.collector.rows import HistogramBatch as HistogramBatch
    from kernel_insight.collector.rows import HistogramBuilder as HistogramBuilder
    from kernel_insight.collector.rows import InstanceInfo as InstanceInfo
    from kernel_insight.collector.rows import SampleBatch as SampleBatch
    from kernel_insight.collector.rows import SampleBuilder as SampleBuilder
    from kernel_insight.collector.rows import SeriesLimits as SeriesLimits
    from kernel_insight.collector.rows import SpanBatch as SpanBatch
    from kernel_insight.collector.rows import canonical_labels as canonical_labels
    from kernel_insight.collector.rows import series_fingerprint as series_fingerprint
    from kernel_insight.collector.rows import validate_series as validate_series
    from kernel_insight.collector.sample_cache import CacheStats as CacheStats
    from kernel_insight.collector.sample_cache import SampleBlock as SampleBlock
    from kernel_insight.collector.sample_cache import SampleCache as SampleCache
    from kernel_insight.collector.sink import StoreSink as StoreSink
    from kernel_insight.collector.spans import SpanCursor as SpanCursor
    from kernel_insight.collector.spans import SpanQueryError as SpanQueryError
    from kernel_insight.collector.spans import SpanWindow as SpanWindow
    from kernel_insight.collector.trace import TraceTooLarge as TraceTooLarge
    from kernel_insight.collector.trace import chrome_trace as chrome_trace
    from kernel_insight.collector.trace import chrome_trace_parts as chrome_trace_parts
    from kernel_insight.collector.wire import CONTENT_TYPE as CONTENT_TYPE
    from kernel_insight.collector.wire import INGEST_PATH as INGEST_PATH
    from kernel_insight.collector.wire import AuthenticationFailed as AuthenticationFailed
    from kernel_insight.collector.wire import BatchHeader as BatchHeader
    from kernel_insight.collector.wire import BatchId as BatchId
    from kernel_insight.collector.wire import CaptureReport as CaptureReport
    from kernel_insight.collector.wire import Counter as Counter
    from kernel_insight.collector.wire import DecodedBatch as DecodedBatch
    from kernel_insight.collector.wire import Limits as Limits
    from kernel_insight.collector.wire import MalformedBatch as MalformedBatch
    from kernel_insight.collector.wire import OversizedBatch as OversizedBatch
    from kernel_insight.collector.wire import WireError as WireError
    from kernel_insight.collector.wire import decode_batch as decode_batch
    from kernel_insight.collector.wire import encode_batch as encode_batch

#: Where each exported name lives. A submodule is imported when one of its names is first used:
#: ``import kernel_insight.collector.openmetrics`` (``ki import``) then loads neither FastAPI nor
#: the app, memory and start-up CPU the import never uses (``make bench-import``, bench/results/import.md).


__getattr__, __dir__ = lazy_exports(globals())
