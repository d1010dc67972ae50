"""Batches as the Arrow tables the store inserts: one column builder per table, no engine.

Each function converts one kind of rows (collector/rows.py) into the columns of its table
(collector/clickhouse/schema.py); the store (collector/clickhouse/store.py) adds the series
rows and writes them. A value a column cannot hold raises ValueError here, before any write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.rows import (
    MAX_TS_MS,
    MIN_TS_MS,
    CallBatch,
    Event,
    HistogramBatch,
    InstanceInfo,
    SampleBatch,
    SpanBatch,
)
from kernel_insight.collector.valuecodec import encode_values

_MAX_NS = MAX_TS_MS * 1_000_000


def _instance_column(inst: list[str]) -> pa.Array:
    """The instance column: one agent's batch (one instance) as a dictionary of one string."""
    if inst and inst.count(inst[0]) == len(inst):
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(len(inst), np.int32)), pa.array([inst[0]], pa.string())
        )
    return pa.array(inst, pa.string())


def _kernel_column(spans: SpanBatch) -> pa.Array:
    """The kernel column as a dictionary of distinct names: from ``kernel_dict`` when the spans
    carry it (derive's), else by encoding ``kernel`` row by row."""
    if spans.kernel_dict is not None:
        codes, names = spans.kernel_dict
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(names, pa.string()))
    return pa.array(spans.kernel, pa.string()).dictionary_encode()


def _owner_columns(spans: SpanBatch) -> dict[str, pa.Array]:
    """The spans' pod, namespace and container columns, each a dictionary over the distinct holders."""
    codes, owners = spans.owner_columns()
    index = pa.array(codes, pa.int32())
    return {
        name: pa.DictionaryArray.from_arrays(index, pa.array([o[i] for o in owners], pa.string()))
        for i, name in enumerate(("pod", "namespace", "container"))
    }


def _nvtx_column(spans: SpanBatch) -> pa.Array:
    """The spans' NVTX ranges as a dictionary over the distinct ranges ("" where none)."""
    codes, ranges = spans.nvtx if spans.nvtx is not None else (np.zeros(len(spans), np.int32), [""])
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(ranges, pa.string()))


def check_ns_range(values: Any, what: str) -> None:
    arr = np.asarray(values, dtype=np.int64)
    if arr.size and (int(arr.min()) < MIN_TS_MS or int(arr.max()) > _MAX_NS):
        bad = int(arr.min()) if int(arr.min()) < MIN_TS_MS else int(arr.max())
        raise ValueError(f"{what} {bad} ns is outside the storable range 1970-01-01 .. 2149-06-06")


def _integral_rows(offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Per row: whether all of its values are whole numbers an Int64 holds exactly (|v| < 2^53)."""
    bad = ~((flat == np.floor(flat)) & (np.abs(flat) < 2.0**53))
    seen = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(bad, out=seen[1:])
    result: np.ndarray[Any, Any] = seen[offsets[1:]] == seen[offsets[:-1]]
    return result


def _bucket_lists(
    side: str, offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any], integral: np.ndarray[Any, Any]
) -> dict[str, pa.Array]:
    """``<side>_counts`` (Int64, integer rows) and ``<side>_float_counts`` (Float64, the other rows)."""
    lengths = np.diff(offsets)
    out = {}
    for name, rows, kind in (("counts", integral, pa.int64()), ("float_counts", ~integral, pa.float64())):
        keep = np.repeat(rows, lengths)
        own = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(np.where(rows, lengths, 0), out=own[1:])
        values = flat[keep].astype(np.int64) if name == "counts" else flat[keep]
        out[f"{side}_{name}"] = pa.ListArray.from_arrays(pa.array(own, pa.int32()), pa.array(values, kind))
    return out


def _value_columns(batch: SampleBatch) -> dict[str, pa.Array]:
    """The samples table's value columns: decimals where they give the float back bit for bit
    (collector/valuecodec.py), one scale per series of the batch."""
    float_value, mantissa, scale = encode_values(batch.values, batch.series_idx)
    return {
        "float_value": pa.array(float_value, pa.float64()),
        "mantissa": pa.array(mantissa, pa.int64()),
        "scale": pa.array(scale, pa.int8()),
    }


TS_MS_UTC = pa.timestamp("ms", tz="UTC")


def dense_codes(codes: npt.NDArray[Any], domain: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int32]]:
    """``np.unique(codes, return_inverse=True)`` for codes in ``range(domain)``, by counting:
    O(len + domain) where a sort is O(len log len), on every remote_write request."""
    if domain > 8 * len(codes) + 1024:  # a few codes out of many: sorting them is cheaper
        used, inverse = np.unique(codes, return_inverse=True)
        return used, inverse.astype(np.int32).reshape(-1)
    used = np.flatnonzero(np.bincount(codes, minlength=domain))
    dense = np.zeros(max(domain, 1), dtype=np.int32)
    dense[used] = np.arange(len(used), dtype=np.int32)
    return used, dense[codes]


def concat(parts: list[pa.Table]) -> pa.Table:
    # No copy: chDB reads the chunks one by one (each with its own dictionary of metric names)
    # and the engine squashes them into one part per partition.
    if len(parts) == 1:
        return parts[0]
    if any("st" in p.column_names for p in parts):  # start timestamps in some batches only: 0 elsewhere
        parts = [
            p if "st" in p.column_names else p.append_column("st", pa.array(np.zeros(p.num_rows, np.int64)))
            for p in parts
        ]
    if any(p.schema != parts[0].schema for p in parts[1:]):  # a column dictionary-encoded in some only
        plain = pa.schema(
            [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in parts[0].schema]
        )
        parts = [p.cast(plain) for p in parts]
    return pa.concat_tables(parts)


def start_metrics(batch: SampleBatch | HistogramBatch) -> list[str]:
    """The metrics of a batch's samples that carry a start timestamp (none for most batches)."""
    if batch.st_ms is None:
        return []
    rows = np.unique(batch.series_idx[batch.st_ms != 0]).tolist()
    return sorted({dict(batch.series[i]).get("__name__", "") for i in rows})


def spans_table(spans: SpanBatch) -> pa.Table:
    start = np.asarray(spans.start_ns, dtype=np.int64)
    end = np.asarray(spans.end_ns, dtype=np.int64)
    instance = _instance_column(spans.instance)
    return pa.table(
        {
            "instance": instance,
            "gpu": pa.array(spans.gpu, pa.uint16()),
            "stream": pa.array(spans.stream, pa.uint64()),
            # Dictionary-encoded (a batch holds few distinct names): the LowCardinality column
            # is then filled from the dictionary, not by hashing every row's string in chDB.
            "kernel": _kernel_column(spans),
            "start": pa.array(start, pa.timestamp("ns", tz="UTC")),
            "end": pa.array(end, pa.timestamp("ns", tz="UTC")),
            "duration_ns": pa.array(np.maximum(end - start, 0).astype(np.uint64), pa.uint64()),
            "correlation": pa.array(spans.correlation, pa.uint64()),
            "pid": pa.array(spans.pid, pa.uint32()),
            "launch_ns": pa.array(spans.launch_ns, pa.int64()),
            "launch_host_ns": pa.array(spans.launch_host_ns, pa.uint32()),
            "tid": pa.array(spans.tid, pa.uint32()),
            **_owner_columns(spans),
            "nvtx_range": _nvtx_column(spans),
        }
    )


def calls_table(calls: CallBatch) -> pa.Table:
    instance = _instance_column(calls.instance)
    return pa.table(
        {
            "instance": instance,
            "gpu": pa.array(calls.gpu, pa.uint16()),
            "track": pa.array(calls.track, pa.string()),
            "op": pa.array(calls.op, pa.string()),
            "start": pa.array(np.asarray(calls.start_ns, np.int64), pa.timestamp("ns", tz="UTC")),
            "duration_ns": pa.array(calls.duration_ns, pa.uint64()),
            "bytes": pa.array(calls.bytes, pa.uint64()),
            "handle": pa.array(calls.handle, pa.uint64()),
            "pid": pa.array(calls.pid, pa.uint32()),
            "tid": pa.array(calls.tid, pa.uint32()),
            "rank": pa.array(calls.rank, pa.uint32()),
            "nranks": pa.array(calls.nranks, pa.uint32()),
            "status": pa.array(calls.status, pa.int32()),
            "failed": pa.array(calls.failed, pa.uint8()),
        }
    )


def events_table(events: Sequence[Event]) -> pa.Table:
    return pa.table(
        {
            "instance": pa.array([e.instance for e in events], pa.string()),
            "gpu": pa.array([e.gpu for e in events], pa.uint16()),
            "ts": pa.array([e.ts_ns for e in events], pa.timestamp("ns", tz="UTC")),
            "kind": pa.array([e.kind for e in events], pa.string()),
            "code": pa.array([e.code for e in events], pa.int64()),
            "aux": pa.array([e.aux for e in events], pa.uint64()),
            "pid": pa.array([e.pid for e in events], pa.uint32()),
            "message": pa.array([e.message for e in events], pa.string()),
        }
    )


def instances_table(instances: Sequence[InstanceInfo]) -> pa.Table:
    smap = pa.map_(pa.string(), pa.string())
    return pa.table(
        {
            "id": pa.array([i.id for i in instances], pa.string()),
            "hardware_fingerprint": pa.array([i.hardware_fingerprint for i in instances], pa.string()),
            "gpu_count": pa.array([i.gpu_count for i in instances], pa.uint16()),
            "gpu_model": pa.array([i.gpu_model for i in instances], pa.string()),
            "memory_total_bytes": pa.array([i.memory_total_bytes for i in instances], pa.uint64()),
            "labels": pa.array([sorted(i.labels.items()) for i in instances], smap),
            "attributes": pa.array([sorted(i.attributes.items()) for i in instances], smap),
            "last_seen": pa.array([i.last_seen_ms for i in instances], pa.timestamp("ms", tz="UTC")),
        }
    )


def samples_table(
    batch: SampleBatch, fps: npt.NDArray[np.uint64], sample_codes: npt.NDArray[Any], names: list[str]
) -> pa.Table:
    """The samples table of ``batch``: ``fps`` per series, ``sample_codes`` per sample into ``names``."""
    # The metric column as a dictionary of the batch's distinct names (chDB wants them unique).
    metric = pa.DictionaryArray.from_arrays(pa.array(sample_codes, pa.int32()), pa.array(names, pa.string()))
    data = pa.table(
        {
            "metric": metric,
            "fingerprint": pa.array(fps[batch.series_idx], pa.uint64()),
            # Int64 viewed as the timestamp: a tz-aware type from numpy went through pandas_compat.
            "ts": pa.array(batch.ts_ms, pa.int64()).view(TS_MS_UTC),
            **_value_columns(batch),
        }
    )
    if batch.st_ms is not None:  # else not sent: the rows read the column's default, 0 (unset)
        data = data.append_column("st", pa.array(batch.st_ms, pa.int64()))
    return data


def histograms_table(
    batch: HistogramBatch, fps: npt.NDArray[np.uint64], codes: npt.NDArray[np.int32], names: list[str]
) -> pa.Table:
    """The histograms table of ``batch``: ``fps`` and ``codes`` (into ``names``) per series."""
    metric = pa.DictionaryArray.from_arrays(
        pa.array(codes[batch.series_idx], pa.int32()),
        pa.array(names, pa.string()),
    )

    def lists(offsets: np.ndarray[Any, Any], flat: np.ndarray[Any, Any], kind: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, kind))

    # Rows whose every bucket count is a whole number (integer histograms) go to the Int64
    # columns, the others (float histograms) to the Float64 ones: one of the two is empty.
    integral = _integral_rows(batch.pos_bucket_offsets, batch.pos_buckets) & _integral_rows(
        batch.neg_bucket_offsets, batch.neg_buckets
    )

    data = pa.table(
        {
            "metric": metric,
            "fingerprint": pa.array(fps[batch.series_idx], pa.uint64()),
            "ts": pa.array(batch.ts_ms, pa.timestamp("ms", tz="UTC")),
            "schema": pa.array(batch.schema.astype(np.int8), pa.int8()),
            "zero_threshold": pa.array(batch.zero_threshold, pa.float64()),
            "zero_count": pa.array(batch.zero_count, pa.float64()),
            "count": pa.array(batch.count, pa.float64()),
            "sum": pa.array(batch.sum, pa.float64()),
            "counter_reset_hint": pa.array(batch.counter_reset_hint, pa.uint8()),
            "positive_span_offsets": lists(batch.pos_span_offsets, batch.pos_span_offset, pa.int32()),
            "positive_span_lengths": lists(batch.pos_span_offsets, batch.pos_span_length, pa.uint32()),
            **_bucket_lists("positive", batch.pos_bucket_offsets, batch.pos_buckets, integral),
            "negative_span_offsets": lists(batch.neg_span_offsets, batch.neg_span_offset, pa.int32()),
            "negative_span_lengths": lists(batch.neg_span_offsets, batch.neg_span_length, pa.uint32()),
            **_bucket_lists("negative", batch.neg_bucket_offsets, batch.neg_buckets, integral),
            "custom_values": lists(batch.custom_value_offsets, batch.custom_values, pa.float64()),
        }
    )
    if batch.st_ms is not None:  # as samples: only batches that carry start timestamps write them
        data = data.append_column("st", pa.array(batch.st_ms, pa.int64()))
    return data
