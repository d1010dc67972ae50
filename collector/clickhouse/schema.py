"""The one declarative storage schema, and the DDL generated from it (docs/storage.md).

Single-server DDL (embedded chDB or one ClickHouse server) and cluster DDL
(ReplicatedMergeTree behind Distributed tables) come from the same table list, so
the two deployments cannot drift apart; ``deploy/clickhouse/*.sql`` is this
module's output, checked by a test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernel_insight.collector.clickhouse.sql import VALUE_ALIAS, ident, literal, qualified

__all__ = [
    "DEDUP_WINDOW",
    "MERGE_SETTINGS",
    "PACKED_SETTINGS",
    "SCHEMA",
    "Column",
    "Retention",
    "Table",
    "cluster_ddl",
    "codec_matches",
    "render_sql_file",
    "single_ddl",
    "table",
    "write_deploy_files",
]

#: How many recent insert blocks per table remember their dedup token; agents retry within minutes,
#: and the batches table covers anything older.
DEDUP_WINDOW = 10_000

#: Merge settings every table gets (docs/storage.md, "Merges"). ClickHouse's merge selector
#: leaves a partition alone while its few parts differ much in size, so day partitions that
#: stopped receiving rows kept 2-5 small parts each for good (140 parts seen after 33 minutes):
#: once every part of a partition is this old, the partition is merged into one part.
#: Parts replaced by a merge are deleted a second after it (looked for every second): while a
#: partition is small (under ~1-2 MB) the selector merges every new small part into the whole
#: partition, so each flush replaced the partition's part, and with a 10 s lifetime ``du`` of the
#: samples table stayed ~9x above the active parts (26 bytes per sample against 3.0). The
#: lifetime only guards a merged part that had not reached the disk when the power went: merged
#: parts are fsynced instead (``min_compressed_bytes_to_fsync_after_merge``; inserts are not).
MERGE_SETTINGS: dict[str, int] = {
    "min_age_to_force_merge_seconds": 600,
    "min_age_to_force_merge_on_partition_only": 1,
    "old_parts_lifetime": 1,
    "cleanup_delay_period": 1,
    "min_compressed_bytes_to_fsync_after_merge": 1,
}

#: Embedded store only (chDB, whose engine version the package pins; a ClickHouse server before
#: 26.7 knows no such setting, and older engines cannot read such parts): a part under 1 MiB
#: uncompressed is written as one file, ``data.packed``, instead of ~13 (columns, marks, index,
#: checksums, count, TTL, ...), each of which the file system rounds up to a 4 KiB block. The
#: small parts every table keeps beside its merged ones (the latest flushes, the agents'
#: heartbeats) cost ~52 KiB of ``du`` each for a few KB of rows; packed, 4 KiB plus the directory.
PACKED_SETTINGS: dict[str, int] = {"min_bytes_for_full_part_storage": 1 << 20}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    codec: str | None = None
    comment: str = ""
    #: ``DEFAULT <expr>`` (what parts written before the column read) or ``ALIAS <expr>`` (computed
    #: on read, never stored); None: the type's zero.
    default: str | None = None

    def sql(self) -> str:
        parts = [ident(self.name), self.type]
        if self.default:
            parts.append(self.default)
        if self.codec:
            parts.append(f"CODEC({self.codec})")
        if self.comment:
            parts.append("COMMENT " + literal(self.comment))
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Table:
    """One table: columns, engine family and key; ``ttl_column`` + ``retention_key`` give its TTL."""

    name: str
    columns: tuple[Column, ...]
    order_by: tuple[str, ...]
    comment: str
    replacing: bool = False  # ReplacingMergeTree: rows with equal ORDER BY keys collapse on merge
    version: str | None = None  # the ReplacingMergeTree version column (the newest row wins)
    partition_by: str | None = None
    ttl_column: str | None = None  # a DateTime/Date expression the retention counts from
    retention_key: str | None = None  # attribute of Retention
    sharding_key: str = "rand()"  # Distributed sharding expression in the cluster layout
    settings: Mapping[str, int | str] = field(default_factory=dict)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def engine(self, replicated: bool, database: str, local_name: str) -> str:
        family = "ReplacingMergeTree" if self.replacing else "MergeTree"
        args: list[str] = []
        if replicated:
            family = "Replicated" + family
            args += [literal(f"/clickhouse/tables/{{shard}}/{database}/{local_name}"), literal("{replica}")]
        if self.version:
            args.append(self.version)
        return f"{family}({', '.join(args)})"

    def ttl_days(self, retention: Retention) -> int:
        """Days this table keeps rows under ``retention``; 0 is forever."""
        if self.ttl_column is None or self.retention_key is None:
            return 0
        return int(getattr(retention, self.retention_key))

    def ttl(self, retention: Retention) -> str | None:
        days = self.ttl_days(retention)
        return f"{self.ttl_column} + INTERVAL {days} DAY" if days > 0 else None


@dataclass(frozen=True, slots=True)
class Retention:
    """Days each kind of data is kept (0 keeps it forever); TTL deletes whole day partitions.

    ``series_days`` (the label index) defaults to ``samples_days`` and may only be longer:
    a sample whose series row expired first could no longer be found by any query.
    """

    samples_days: int = 30
    spans_days: int = 7
    events_days: int = 90
    series_days: int | None = None
    batches_days: int = 7

    def __post_init__(self) -> None:
        for name in ("samples_days", "spans_days", "events_days", "series_days", "batches_days"):
            value = getattr(self, name)
            if name == "series_days" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"retention {name} must be a whole number of days >= 0, got {value!r}")
        s = self.series_days
        if s is not None and s != 0 and (self.samples_days == 0 or s < self.samples_days):
            raise ValueError(
                f"retention series_days ({s}) must cover samples_days ({self.samples_days or 'forever'}): "
                "series rows are how queries find samples"
            )

    @property
    def series_ttl_days(self) -> int:
        return self.samples_days if self.series_days is None else self.series_days


_TS_MS = "DateTime64(3, 'UTC')"
_TS_NS = "DateTime64(9, 'UTC')"
_LABELS = "Map(LowCardinality(String), String)"

SCHEMA: tuple[Table, ...] = (
    Table(
        name="series",
        comment="One row per series per day it had samples: the label index kql matchers run against.",
        columns=(
            Column("date", "Date", "DoubleDelta, ZSTD(1)", "UTC day the series had samples on"),
            Column("metric", "LowCardinality(String)", None, "the __name__ label"),
            Column("fingerprint", "UInt64", None, "series_fingerprint(labels), the samples key"),
            Column("labels", _LABELS, "ZSTD(3)", "every label but __name__, none empty"),
        ),
        replacing=True,
        order_by=("metric", "fingerprint", "date"),
        partition_by="date",  # by day, like samples, so a day's series rows expire with its samples
        ttl_column="date",
        retention_key="series_ttl_days",
        sharding_key="fingerprint",
    ),
    Table(
        name="samples",
        comment="Float samples, ordered by metric, series, time: a selector reads its metric's granules only.",
        columns=(
            # Leading the key: a metric's series share granules instead of ~6 random metrics per granule.
            Column("metric", "LowCardinality(String)", "ZSTD(1)", "the __name__ label"),
            # Plain ZSTD: runs of one fingerprint compress to nothing either way, and Delta's wrapping
            # differences between series cost more (0.030 against 0.036 bytes/sample, bench-e2e data).
            Column("fingerprint", "UInt64", "ZSTD(1)"),
            # Delta over DoubleDelta: agents' timestamps jitter by milliseconds (batch ends), and a
            # jittered step costs DoubleDelta twice; 0.59 against 0.94 bytes/sample on bench-e2e data.
            Column("ts", _TS_MS, "Delta, ZSTD(3)"),
            # The value as a decimal where one gives it back bit for bit (collector/valuecodec.py):
            # mantissa / 10**scale; else the float in float_value (scale -1, the default, which
            # the parts written before these columns existed read). docs/storage.md, "Codecs".
            # Delta of the float's bits over Gorilla's XOR: ZSTD finds the repeated high bytes of
            # neighbour differences; 1.87 against 2.21 (bench-e2e) and 3.70 against 4.04 (bench-import)
            # bytes/sample at the same insert CPU (make bench-samplestore, docs/storage.md).
            Column(
                "float_value", "Float64", "Delta, ZSTD(3)", "the value where no decimal gives it back, else 0"
            ),
            # ZSTD(5), ZSTD's lazy matching (4 is 3's strategy): fewer bytes a sample on e2e and
            # import data, for a little more CPU at each write (insert, merges): make
            # bench-samplestore, bench/results/samplestore.md.
            Column("mantissa", "Int64", "Delta, ZSTD(5)", "the value is mantissa / 10^scale when scale >= 0"),
            Column(
                "scale", "Int8", "ZSTD(1)", "0, 3, 6, 9, 12 or 15; -1: the value is float_value", "DEFAULT -1"
            ),
            Column(
                "value", "Float64", None, "the sample's value, bit for bit as written", f"ALIAS {VALUE_ALIAS}"
            ),
            # Start timestamps (remote_write 2.0, created timestamps): 0 for the sources without
            # them, so Delta + ZSTD store a column of zeros (or of one value per series) in next to
            # nothing; parts written before the column read the default, 0.
            Column("st", "Int64", "Delta, ZSTD(1)", "start timestamp of the sample in ms, 0 = unset"),
        ),
        order_by=("metric", "fingerprint", "ts"),
        partition_by="toDate(ts)",
        ttl_column="toDateTime(ts)",
        retention_key="samples_days",
        sharding_key="fingerprint",
    ),
    Table(
        name="histograms",
        comment="Native histogram samples (Prometheus' sparse exponential buckets), in the samples' series model.",
        columns=(
            Column("metric", "LowCardinality(String)", "ZSTD(1)", "the __name__ label"),
            Column("fingerprint", "UInt64", "Delta, ZSTD(1)", "series_fingerprint(labels), as in samples"),
            Column("ts", _TS_MS, "DoubleDelta, ZSTD(3)"),
            Column("schema", "Int8", "ZSTD(1)", "-4 .. 8 exponential, -53 custom bounds (NHCB)"),
            Column("zero_threshold", "Float64", "ZSTD(1)"),
            # Delta of the float's bits, as samples' value: sum 3.4 and count 1.8 bytes per histogram
            # sample against 7.2 and 2.6 with Gorilla + ZSTD(3) (bench/histstore: 53.6 against 58.2 in all).
            Column("zero_count", "Float64", "Delta, ZSTD(3)"),
            Column("count", "Float64", "Delta, ZSTD(3)"),
            Column("sum", "Float64", "Delta, ZSTD(3)", "a stale marker is the StaleNaN bit pattern here"),
            Column("counter_reset_hint", "UInt8", "ZSTD(1)", "0 unknown, 1 reset, 2 not a reset, 3 gauge"),
            Column("positive_span_offsets", "Array(Int32)", "ZSTD(3)", "Prometheus Span.Offset per span"),
            Column("positive_span_lengths", "Array(UInt32)", "ZSTD(3)"),
            # Integer histograms (the agent's, Prometheus' scrapes): absolute counts as Int64, which
            # Delta stores as neighbour differences: 48 bytes per sample of 54 buckets, against 68
            # for the same counts as Float64 + ZSTD(3) (bench/histstore, docs/storage.md).
            Column(
                "positive_counts", "Array(Int64)", "Delta, ZSTD(1)", "integer histograms: absolute counts"
            ),
            Column("positive_float_counts", "Array(Float64)", "ZSTD(3)", "float histograms: absolute counts"),
            Column("negative_span_offsets", "Array(Int32)", "ZSTD(3)"),
            Column("negative_span_lengths", "Array(UInt32)", "ZSTD(3)"),
            Column(
                "negative_counts", "Array(Int64)", "Delta, ZSTD(1)", "integer histograms: absolute counts"
            ),
            Column("negative_float_counts", "Array(Float64)", "ZSTD(3)", "float histograms: absolute counts"),
            Column("custom_values", "Array(Float64)", "ZSTD(3)", "bucket bounds of schema -53"),
            Column("st", "Int64", "Delta, ZSTD(1)", "start timestamp of the histogram in ms, 0 = unset"),
        ),
        order_by=("metric", "fingerprint", "ts"),
        partition_by="toDate(ts)",
        ttl_column="toDateTime(ts)",
        retention_key="samples_days",
        sharding_key="fingerprint",
    ),
    Table(
        name="kernel_spans",
        comment="One row per kernel execution on a GPU, for timelines.",
        columns=(
            Column("instance", "LowCardinality(String)"),
            Column("gpu", "UInt16"),
            # Codecs by measurement on bench-e2e's spans (docs/storage.md, "Codecs"): 2.33 bytes per
            # span against 3.94 with DoubleDelta + ZSTD(1) on start/end and ZSTD(1) elsewhere; kernels'
            # starts come at irregular gaps, which DoubleDelta packs into bit fields ZSTD cannot shrink.
            Column("stream", "UInt64", "ZSTD(3)"),
            Column("kernel", "LowCardinality(String)"),
            Column("start", _TS_NS, "Delta, ZSTD(1)"),
            Column("end", _TS_NS, "Delta, ZSTD(1)"),
            Column("duration_ns", "UInt64", "T64, ZSTD(3)"),
            Column("correlation", "UInt64", "Delta, ZSTD(3)"),
            Column("pid", "UInt32", "ZSTD(1)"),
            Column(
                "launch_ns",
                "Int64",
                "Delta, ZSTD(1)",
                "host time the span was launched (CUDA-event probe, ring flag LAUNCH_SPAN); 0: unknown",
            ),
            Column("launch_host_ns", "UInt32", "T64, ZSTD(1)", "host ns the span's code took to enqueue it"),
            Column("tid", "UInt32", "ZSTD(1)", "host thread of the launch; 0: unknown"),
            # The GPU's holder when the span started, as the kubelet's PodResources API said
            # (ki probe nvml --kubelet-socket); "" off Kubernetes or while no pod held the GPU.
            Column("pod", "LowCardinality(String)", "ZSTD(1)", "Kubernetes pod holding the GPU; '': none"),
            Column("namespace", "LowCardinality(String)", "ZSTD(1)", "the pod's namespace"),
            Column(
                "container", "LowCardinality(String)", "ZSTD(1)", "the pod's container the GPU is assigned to"
            ),
            Column(
                "nvtx_range",
                "LowCardinality(String)",
                "ZSTD(1)",
                "the NVTX range enclosing the kernel's launch (CUPTI probe); '': none",
            ),
        ),
        order_by=("instance", "gpu", "start"),
        partition_by="toDate(start)",
        ttl_column="toDateTime(start)",
        retention_key="spans_days",
        sharding_key="cityHash64(instance)",
    ),
    Table(
        name="gpu_calls",
        comment="Host/GPU calls other than kernels, one row each: NCCL collectives, memory operations, syncs.",
        columns=(
            Column("instance", "LowCardinality(String)"),
            Column("gpu", "UInt16"),
            Column("track", "LowCardinality(String)", None, "nccl, memory or sync"),
            Column(
                "op", "LowCardinality(String)", None, "allreduce, alloc, memcpy, stream, ... (docs/ring.md)"
            ),
            # Delta, as kernel_spans' start: 3.50 against 4.09 bytes per call (bench/calls' data).
            Column("start", _TS_NS, "Delta, ZSTD(1)", "when the host called it"),
            Column("duration_ns", "UInt64", "T64, ZSTD(1)", "host-side duration; 0 for memory operations"),
            Column("bytes", "UInt64", "T64, ZSTD(1)", "collective payload, allocation or copy size"),
            Column("handle", "UInt64", "ZSTD(1)", "communicator (nccl), address (memory), handle (sync)"),
            Column("pid", "UInt32", "ZSTD(1)"),
            Column("tid", "UInt32", "ZSTD(1)"),
            Column("rank", "UInt32", "ZSTD(1)", "nccl: this GPU's rank in the communicator"),
            Column("nranks", "UInt32", "ZSTD(1)"),
            Column("status", "Int32", "ZSTD(1)", "memory: the CUDA status (0: success)"),
            Column("failed", "UInt8", "ZSTD(1)", "the record's FAILED flag"),
        ),
        order_by=("instance", "gpu", "start"),
        partition_by="toDate(start)",
        ttl_column="toDateTime(start)",
        retention_key="spans_days",
        sharding_key="cityHash64(instance)",
    ),
    Table(
        name="events",
        comment="Discrete errors and incidents: oom, xid, nccl_timeout, ecc, cuda, other.",
        columns=(
            Column("instance", "LowCardinality(String)"),
            Column("gpu", "UInt16"),
            Column("ts", _TS_NS, "DoubleDelta, ZSTD(1)"),
            Column("kind", "LowCardinality(String)"),
            Column("code", "Int64"),
            Column("aux", "UInt64"),
            Column("pid", "UInt32"),
            Column("message", "String", "ZSTD(3)"),
        ),
        order_by=("instance", "kind", "ts"),
        partition_by="toYYYYMM(ts)",
        ttl_column="toDateTime(ts)",
        retention_key="events_days",
        sharding_key="cityHash64(instance)",
    ),
    Table(
        name="capture_requests",
        comment="Capture windows asked for (ki timeline capture): every span of one GPU for N seconds; the audit record.",
        columns=(
            Column("id", "String"),
            Column("instance", "LowCardinality(String)"),
            Column("gpu", "UInt16"),
            Column("seconds", "UInt32"),
            Column(
                "state",
                "LowCardinality(String)",
                None,
                "pending, delivered (told the agent), capturing, done or expired (docs/wire.md)",
            ),
            Column("requested", _TS_MS),
            Column("updated", _TS_MS),
            Column("token_id", "String", None, "who asked: the admin token's id (never the token)"),
            Column("token_name", "String"),
            Column(
                "window_start", _TS_NS, None, "the window as the agent ran it (its clock); 0 until it reports"
            ),
            Column("window_end", _TS_NS),
            Column(
                "spans", "UInt64", None, "kernel spans of the GPU the agent shipped for the window so far"
            ),
        ),
        replacing=True,
        version="updated",
        order_by=("instance", "id"),
        ttl_column="toDateTime(requested)",
        retention_key="events_days",
        sharding_key="cityHash64(instance)",
    ),
    Table(
        name="instances",
        comment="What each instance is (hardware fingerprint, capacity, placement labels) and when it was last seen.",
        columns=(
            Column("id", "String"),
            Column("hardware_fingerprint", "String"),
            Column("gpu_count", "UInt16"),
            Column("gpu_model", "LowCardinality(String)"),
            Column("memory_total_bytes", "UInt64", None, "summed over the instance's GPUs"),
            Column("labels", _LABELS, None, "host, rack, switch, model and any the operator adds"),
            Column("attributes", "Map(String, String)", None, "raw fingerprint fields, gpu<N>.<field>"),
            Column("last_seen", _TS_MS),
        ),
        replacing=True,
        version="last_seen",
        order_by=("id",),
        sharding_key="cityHash64(id)",
    ),
    Table(
        name="batches",
        comment="Batch ids already stored: the exactly-once record beyond the insert dedup window.",
        columns=(
            Column("batch_id", "String"),
            Column("agent_id", "LowCardinality(String)"),
            Column("received", _TS_MS),
            Column("rows", "UInt64"),
        ),
        replacing=True,
        version="received",
        order_by=("batch_id",),
        partition_by="toYYYYMM(received)",
        ttl_column="toDateTime(received)",
        retention_key="batches_days",
        sharding_key="cityHash64(batch_id)",
    ),
)


_CODEC_RE = re.compile(r"(\w+)(?:\(([^)]*)\))?")


def _codec_parts(text: str) -> list[tuple[str, str]]:
    text = text.strip()
    if text.upper().startswith("CODEC(") and text.endswith(")"):
        text = text[6:-1]
    return [(m.group(1), (m.group(2) or "").replace(" ", "")) for m in _CODEC_RE.finditer(text)]


def codec_matches(want: str, have: str) -> bool:
    """Whether a column's codec as the engine shows it (``CODEC(Delta(8), ZSTD(3))``) is the
    schema's (``Delta, ZSTD(3)``): the same codecs in order, arguments the schema leaves out
    being the engine's defaults for the column's type."""
    w, h = _codec_parts(want), _codec_parts(have)
    return len(w) == len(h) and all(
        wn == hn and (not wa or wa == ha) for (wn, wa), (hn, ha) in zip(w, h, strict=True)
    )


def table(name: str) -> Table:
    for t in SCHEMA:
        if t.name == name:
            return t
    raise KeyError(f"no table {name!r} in the schema")


def _create(
    t: Table,
    database: str,
    name: str,
    retention: Retention,
    *,
    replicated: bool,
    on_cluster: str,
    extra: Mapping[str, int | str] | None = None,
) -> str:
    cols = ",\n".join(f"    {c.sql()}" for c in t.columns)
    lines = [f"CREATE TABLE IF NOT EXISTS {qualified(database, name)}{on_cluster}\n(\n{cols}\n)"]
    lines.append(f"ENGINE = {t.engine(replicated, database, name)}")
    if t.partition_by:
        lines.append(f"PARTITION BY {t.partition_by}")
    lines.append(f"ORDER BY ({', '.join(ident(c) for c in t.order_by)})")
    ttl = t.ttl(retention)
    if ttl:
        lines.append(f"TTL {ttl}")
    dedup = "replicated_deduplication_window" if replicated else "non_replicated_deduplication_window"
    settings: dict[str, int | str] = {dedup: DEDUP_WINDOW, **MERGE_SETTINGS, **(extra or {})}
    if t.partition_by and ttl:
        settings["ttl_only_drop_parts"] = 1  # drop whole day partitions instead of rewriting parts
    settings.update(t.settings)
    lines.append("SETTINGS " + ", ".join(f"{k} = {v}" for k, v in settings.items()))
    lines.append(f"COMMENT {literal(t.comment)}")
    return "\n".join(lines)


def single_ddl(
    database: str = "ki",
    retention: Retention | None = None,
    settings: Mapping[str, Mapping[str, int | str]] | None = None,
) -> list[str]:
    """Statements creating the schema on one node (embedded chDB or a single server)."""
    retention = retention or Retention()
    out = [f"CREATE DATABASE IF NOT EXISTS {ident(database)}"]
    out += [
        _create(
            t,
            database,
            t.name,
            retention,
            replicated=False,
            on_cluster="",
            extra=(settings or {}).get(t.name),
        )
        for t in SCHEMA
    ]
    return out


def cluster_ddl(database: str = "ki", cluster: str = "ki", retention: Retention | None = None) -> list[str]:
    """Statements for a cluster: ``<name>_local`` replicated tables and ``<name>`` Distributed over them.

    Readers and writers use the same table names as on one node, so the store's SQL is unchanged.
    """
    retention = retention or Retention()
    oc = f" ON CLUSTER {ident(cluster)}"
    out = [f"CREATE DATABASE IF NOT EXISTS {ident(database)}{oc}"]
    for t in SCHEMA:
        local = f"{t.name}_local"
        out.append(_create(t, database, local, retention, replicated=True, on_cluster=oc))
        out.append(
            f"CREATE TABLE IF NOT EXISTS {qualified(database, t.name)}{oc}\nAS {qualified(database, local)}\n"
            f"ENGINE = Distributed({literal(cluster)}, {literal(database)}, {literal(local)}, {t.sharding_key})"
        )
    return out


def render_sql_file(statements: list[str], header: str) -> str:
    body = ";\n\n".join(statements)
    return f"-- {header}\n-- Generated by kernel_insight.collector.clickhouse.schema; do not edit (see docs/storage.md).\n\n{body};\n"


def write_deploy_files(directory: Path) -> list[Path]:
    """Regenerate ``deploy/clickhouse/*.sql``; returns the files written."""
    files = {
        "schema-single.sql": render_sql_file(single_ddl(), "Single-server schema (default retention)."),
        "schema-cluster.sql": render_sql_file(
            cluster_ddl(), "Cluster schema: ReplicatedMergeTree *_local tables behind Distributed tables."
        ),
    }
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
