"""remote_write native histograms: integer (delta buckets) and float, into the histograms table.

The requests are built by Google's protobuf library from Prometheus' own message definitions
(prompb/types.proto and remote.proto, transcribed below field for field), so the hand-written
decoder is checked against an independent encoder: packed and zigzag fields, oneofs, proto3's
left-out zero values.
"""

from __future__ import annotations

import asyncio
import time

import cramjam
import httpx
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kernel_insight.collector.app import create_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import (
    RemoteWriteError,
    decode_write_request,
    encode_histogram,
    encode_write_request,
)
from kernel_insight.collector.rows import HistogramBuilder
from kernel_insight.kql.storage import STALE_NAN, is_stale_value

NOW = (int(time.time()) // 60) * 60_000

F = descriptor_pb2.FieldDescriptorProto


def _prompb():
    """prometheus.WriteRequest and friends from prompb/types.proto + remote.proto (field numbers as there)."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="ki_test_prompb.proto", package="prometheus", syntax="proto3"
    )

    def message(name, fields, oneofs=()):
        m = fd.message_type.add(name=name)
        for o in oneofs:
            m.oneof_decl.add(name=o)
        for fname, number, ftype, label, type_name, oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if oneof is not None:
                f.oneof_index = oneof
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message(
        "Label", [("name", 1, F.TYPE_STRING, opt, None, None), ("value", 2, F.TYPE_STRING, opt, None, None)]
    )
    message(
        "Sample",
        [("value", 1, F.TYPE_DOUBLE, opt, None, None), ("timestamp", 2, F.TYPE_INT64, opt, None, None)],
    )
    message(
        "BucketSpan",
        [("offset", 1, F.TYPE_SINT32, opt, None, None), ("length", 2, F.TYPE_UINT32, opt, None, None)],
    )
    h = message(
        "Histogram",
        [
            ("count_int", 1, F.TYPE_UINT64, opt, None, 0),
            ("count_float", 2, F.TYPE_DOUBLE, opt, None, 0),
            ("sum", 3, F.TYPE_DOUBLE, opt, None, None),
            ("schema", 4, F.TYPE_SINT32, opt, None, None),
            ("zero_threshold", 5, F.TYPE_DOUBLE, opt, None, None),
            ("zero_count_int", 6, F.TYPE_UINT64, opt, None, 1),
            ("zero_count_float", 7, F.TYPE_DOUBLE, opt, None, 1),
            ("negative_spans", 8, F.TYPE_MESSAGE, rep, ".prometheus.BucketSpan", None),
            ("negative_deltas", 9, F.TYPE_SINT64, rep, None, None),
            ("negative_counts", 10, F.TYPE_DOUBLE, rep, None, None),
            ("positive_spans", 11, F.TYPE_MESSAGE, rep, ".prometheus.BucketSpan", None),
            ("positive_deltas", 12, F.TYPE_SINT64, rep, None, None),
            ("positive_counts", 13, F.TYPE_DOUBLE, rep, None, None),
            ("reset_hint", 14, F.TYPE_ENUM, opt, ".prometheus.Histogram.ResetHint", None),
            ("timestamp", 15, F.TYPE_INT64, opt, None, None),
            ("custom_values", 16, F.TYPE_DOUBLE, rep, None, None),
        ],
        oneofs=("count", "zero_count"),
    )
    hint = h.enum_type.add(name="ResetHint")
    for i, n in enumerate(("UNKNOWN", "YES", "NO", "GAUGE")):
        hint.value.add(name=n, number=i)
    message(
        "TimeSeries",
        [
            ("labels", 1, F.TYPE_MESSAGE, rep, ".prometheus.Label", None),
            ("samples", 2, F.TYPE_MESSAGE, rep, ".prometheus.Sample", None),
            ("histograms", 4, F.TYPE_MESSAGE, rep, ".prometheus.Histogram", None),
        ],
    )
    message("WriteRequest", [("timeseries", 1, F.TYPE_MESSAGE, rep, ".prometheus.TimeSeries", None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


WriteRequest = _prompb()


def _prompb_v2():
    """io.prometheus.write.v2.Request from prompb/io/prometheus/write/v2/types.proto (field numbers as there)."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="ki_test_write_v2.proto", package="io.prometheus.write.v2", syntax="proto3"
    )
    base = WriteRequest.DESCRIPTOR.file  # Histogram and BucketSpan: the same messages, field for field
    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    for name in ("Sample", "BucketSpan", "Histogram"):
        msg = fd.message_type.add()
        msg.CopyFrom(next(m for m in _file_proto(base).message_type if m.name == name))
        for f in msg.field:
            if f.type_name.startswith(".prometheus."):
                f.type_name = f.type_name.replace(".prometheus.", ".io.prometheus.write.v2.")
        # 2.0's own fields: the start timestamps (Sample 3, Histogram 17), which 1.0 lacks.
        if name in ("Sample", "Histogram"):
            msg.field.add(
                name="start_timestamp", number=3 if name == "Sample" else 17, type=F.TYPE_INT64, label=opt
            )
    ts = fd.message_type.add(name="TimeSeries")
    for fname, number, ftype, label, type_name in (
        ("labels_refs", 1, F.TYPE_UINT32, rep, None),
        ("samples", 2, F.TYPE_MESSAGE, rep, ".io.prometheus.write.v2.Sample"),
        ("histograms", 3, F.TYPE_MESSAGE, rep, ".io.prometheus.write.v2.Histogram"),
        ("created_timestamp", 6, F.TYPE_INT64, opt, None),
    ):
        f = ts.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
    req = fd.message_type.add(name="Request")
    req.field.add(name="symbols", number=4, type=F.TYPE_STRING, label=rep)
    req.field.add(
        name="timeseries",
        number=5,
        type=F.TYPE_MESSAGE,
        label=rep,
        type_name=".io.prometheus.write.v2.TimeSeries",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("io.prometheus.write.v2.Request"))


def _file_proto(file_descriptor):
    out = descriptor_pb2.FileDescriptorProto()
    file_descriptor.CopyToProto(out)
    return out


RequestV2 = _prompb_v2()


def _request() -> bytes:
    req = WriteRequest()
    ts = req.timeseries.add()
    ts.labels.add(name="__name__", value="kernel_duration_seconds")
    ts.labels.add(name="kernel", value="gemm")
    # Integer histogram, Prometheus' docs example: buckets 2, 1, 1, 2, 3 as deltas; a negative side.
    h = ts.histograms.add(
        count_int=12,
        sum=0.0425,
        schema=3,
        zero_threshold=1e-128,
        zero_count_int=2,
        reset_hint=2,
        timestamp=NOW,
    )
    h.positive_spans.add(offset=-3, length=2)
    h.positive_spans.add(offset=1, length=3)
    h.positive_deltas.extend([2, -1, 0, 1, 1])
    h.negative_spans.add(offset=0, length=1)
    h.negative_deltas.extend([1])
    # Float histogram (a recording rule's output, say), later sample of the same series.
    f = ts.histograms.add(
        count_float=7.75, sum=-1.25, schema=-1, zero_count_float=0.5, timestamp=NOW + 15_000
    )
    f.positive_spans.add(offset=0, length=2)
    f.positive_counts.extend([4.25, 3.0])
    # A staleness marker: sum is StaleNaN.
    ts.histograms.add(sum=STALE_NAN, timestamp=NOW + 30_000)
    nhcb = req.timeseries.add()
    nhcb.labels.add(name="__name__", value="nhcb_seconds")
    c = nhcb.histograms.add(count_int=5, sum=1.5, schema=-53, timestamp=NOW)
    c.positive_spans.add(offset=0, length=3)
    c.positive_deltas.extend([1, 2, -2])
    c.custom_values.extend([0.1, 0.5, 1.0])
    mixed = req.timeseries.add()
    mixed.labels.add(name="__name__", value="nhcb_seconds")
    mixed.labels.add(name="also", value="floats")
    mixed.samples.add(value=3.0, timestamp=NOW)
    return req.SerializeToString()


def _rows(batch):
    return [batch.row(i) for i in range(len(batch))]


def test_protobuf_library_request_decodes_to_the_same_histograms():
    builder = HistogramBuilder()
    floats = decode_write_request(_request(), histograms=builder)
    rows = _rows(builder.build())
    assert len(rows) == 4
    first, second, stale, nhcb = rows
    assert dict(first["labels"]) == {"__name__": "kernel_duration_seconds", "kernel": "gemm"}
    assert first["ts_ms"] == NOW
    assert (first["schema"], first["count"], first["sum"], first["zero_count"]) == (3, 12.0, 0.0425, 2.0)
    assert first["zero_threshold"] == 1e-128
    assert first["positive_spans"] == ((-3, 2), (1, 3))
    assert first["positive_buckets"] == (2.0, 1.0, 1.0, 2.0, 3.0)
    assert first["negative_spans"] == ((0, 1),)
    assert first["negative_buckets"] == (1.0,)
    assert first["counter_reset_hint"] == 2
    assert (second["schema"], second["count"], second["sum"], second["zero_count"]) == (-1, 7.75, -1.25, 0.5)
    assert second["positive_buckets"] == (4.25, 3.0)
    assert second["ts_ms"] == NOW + 15_000
    assert is_stale_value(stale["sum"])
    assert stale["count"] == 0.0
    assert nhcb["schema"] == -53
    assert nhcb["custom_values"] == (0.1, 0.5, 1.0)
    assert nhcb["positive_buckets"] == (1.0, 3.0, 1.0)
    # Float samples of the same request still arrive as samples.
    assert [dict(floats.series[i]) for i in floats.series_idx.tolist()] == [
        {"__name__": "nhcb_seconds", "also": "floats"}
    ]


def test_our_encoder_agrees_with_the_protobuf_library():
    args = {
        "schema": 3,
        "count": 12,
        "sum": 0.0425,
        "zero_threshold": 1e-128,
        "zero_count": 2,
        "positive_spans": [(-3, 2), (1, 3)],
        "positive_buckets": [2.0, 1.0, 1.0, 2.0, 3.0],
        "negative_spans": [(0, 1)],
        "negative_buckets": [1.0],
        "counter_reset_hint": 2,
    }
    ours = encode_write_request(
        [],
        histograms=[
            ({"__name__": "kernel_duration_seconds", "kernel": "gemm"}, [encode_histogram(NOW, **args)])
        ],
        compress=False,
    )
    theirs = WriteRequest()
    theirs.ParseFromString(ours)
    h = theirs.timeseries[0].histograms[0]
    assert h.WhichOneof("count") == "count_int"
    assert list(h.positive_deltas) == [2, -1, 0, 1, 1]
    assert [(s.offset, s.length) for s in h.positive_spans] == [(-3, 2), (1, 3)]
    assert h.timestamp == NOW
    floaty = WriteRequest()
    floaty.ParseFromString(
        encode_write_request(
            [],
            histograms=[({"__name__": "x"}, [encode_histogram(NOW, **args, integer=False)])],
            compress=False,
        )
    )
    g = floaty.timeseries[0].histograms[0]
    assert g.WhichOneof("count") == "count_float"
    assert list(g.positive_counts) == [2.0, 1.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda h: (setattr(h, "count_int", 3), h.positive_counts.extend([1.0])), "mixes integer and float"),
        (lambda h: (setattr(h, "count_int", 3), h.positive_deltas.extend([1])), "cover 0 buckets"),
        (
            lambda h: (
                setattr(h, "count_int", 1),
                h.positive_spans.add(length=1),
                h.positive_deltas.extend([5]),
            ),
            "5 observations found in buckets, but the count is 1",
        ),
        (
            lambda h: (
                setattr(h, "count_int", 9),
                h.positive_spans.add(length=2),
                h.positive_deltas.extend([3, -4]),
            ),
            "negative observation count",
        ),
        (lambda h: setattr(h, "timestamp", -5), "outside 1970-01-01"),
    ],
)
def test_bad_histograms_are_refused_with_a_reason(build, message):
    req = WriteRequest()
    ts = req.timeseries.add()
    ts.labels.add(name="__name__", value="h")
    h = ts.histograms.add(timestamp=NOW)
    build(h)
    with pytest.raises(RemoteWriteError, match=message):
        decode_write_request(req.SerializeToString(), histograms=HistogramBuilder())


def test_collector_stores_remote_written_histograms_and_answers_400_for_bad_ones(tmp_path):
    store = EmbeddedStore(tmp_path / "data")
    try:
        app = create_app(store)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}

        async def post(body: bytes) -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c:
                return await c.post("/api/v1/write", content=body, headers=headers)

        ok = asyncio.run(post(bytes(cramjam.snappy.compress_raw(_request()))))
        assert ok.status_code == 204, ok.text
        got = store.query(
            "SELECT metric, toUnixTimestamp64Milli(ts) AS t, count, positive_counts, positive_float_counts, "
            "custom_values FROM ki.histograms ORDER BY metric, t"
        ).to_pylist()
        assert [(r["metric"], r["t"] - NOW) for r in got] == [
            ("kernel_duration_seconds", 0),
            ("kernel_duration_seconds", 15_000),
            ("kernel_duration_seconds", 30_000),
            ("nhcb_seconds", 0),
        ]
        assert got[0]["positive_counts"] == [2, 1, 1, 2, 3]
        # Whole-number counts go to the Int64 column whatever the message said; others stay Float64.
        assert got[1]["positive_float_counts"] == [4.25, 3.0]
        assert got[1]["positive_counts"] == []
        assert got[3]["custom_values"] == [0.1, 0.5, 1.0]
        samples = store.row_count("samples")
        assert samples == 1
        req = WriteRequest()
        ts = req.timeseries.add()
        ts.labels.add(name="__name__", value="h")
        bad = ts.histograms.add(count_int=1, timestamp=NOW)
        bad.positive_deltas.extend([1])
        refused = asyncio.run(post(bytes(cramjam.snappy.compress_raw(req.SerializeToString()))))
        assert refused.status_code == 400
        assert "cover 0 buckets" in refused.text
        assert np.isfinite(got[0]["count"])
    finally:
        store.close()


def test_relabelling_applies_to_histogram_series_as_to_float_ones():
    from kernel_insight.collector.relabel import Relabeler, parse_relabel_configs

    builder = HistogramBuilder()
    decode_write_request(_request(), histograms=builder)
    batch = builder.build()
    r = Relabeler(
        parse_relabel_configs(
            [
                {"action": "drop", "source_labels": ["__name__"], "regex": "nhcb_.*"},
                {"action": "replace", "target_label": "cluster", "replacement": "a"},
            ]
        )
    )
    out = r.apply_histograms(batch)
    rows = _rows(out)
    assert [dict(row["labels"]) for row in rows] == [
        {"__name__": "kernel_duration_seconds", "kernel": "gemm", "cluster": "a"}
    ] * 3
    assert rows[0]["positive_buckets"] == (2.0, 1.0, 1.0, 2.0, 3.0)
    assert rows[1]["positive_buckets"] == (4.25, 3.0)
    assert r.dropped_samples == 1


def _request_v2() -> bytes:
    req = RequestV2()
    req.symbols.extend(["", "__name__", "kernel_duration_seconds", "kernel", "gemm", "up", "job", "x"])
    ts = req.timeseries.add(labels_refs=[1, 2, 3, 4], created_timestamp=NOW - 60_000)
    h = ts.histograms.add(
        count_int=12,
        sum=0.0425,
        schema=3,
        zero_threshold=1e-128,
        zero_count_int=2,
        reset_hint=2,
        timestamp=NOW,
    )
    h.positive_spans.add(offset=-3, length=2)
    h.positive_spans.add(offset=1, length=3)
    h.positive_deltas.extend([2, -1, 0, 1, 1])
    h.negative_spans.add(offset=0, length=1)
    h.negative_deltas.extend([1])
    f = ts.histograms.add(
        count_float=7.75, sum=-1.25, schema=-1, zero_count_float=0.5, timestamp=NOW + 15_000
    )
    f.positive_spans.add(offset=0, length=2)
    f.positive_counts.extend([4.25, 3.0])
    up = req.timeseries.add(labels_refs=[1, 5, 6, 7])
    up.samples.add(value=1.0, timestamp=NOW)
    return req.SerializeToString()


def test_remote_write_2_requests_decode_like_1_0_ones():
    from kernel_insight.collector.remote_write import decode_write_request_v2

    builder = HistogramBuilder()
    floats = decode_write_request_v2(_request_v2(), histograms=builder)
    rows = _rows(builder.build())
    v1 = HistogramBuilder()
    decode_write_request(_request(), histograms=v1)
    assert rows == _rows(v1.build())[:2]  # the same two histograms as the 1.0 request's first series
    assert [dict(floats.series[i]) for i in floats.series_idx.tolist()] == [{"__name__": "up", "job": "x"}]
    bad = RequestV2()
    bad.symbols.extend(["", "__name__"])
    bad.timeseries.add(labels_refs=[1, 7]).samples.add(value=1.0, timestamp=NOW)
    with pytest.raises(RemoteWriteError, match="label reference 7 past the 2 symbols"):
        decode_write_request_v2(bad.SerializeToString())
    odd = RequestV2()
    odd.symbols.extend(["", "__name__", "up"])
    odd.timeseries.add(labels_refs=[1, 2, 1]).samples.add(value=1.0, timestamp=NOW)
    with pytest.raises(RemoteWriteError, match="not name/value pairs"):
        decode_write_request_v2(odd.SerializeToString())


def test_collector_takes_remote_write_2_and_says_what_it_wrote(tmp_path):
    store = EmbeddedStore(tmp_path / "data")
    try:
        app = create_app(store)
        headers = {
            "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "2.0.0",
        }

        async def post(body: bytes) -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c:
                return await c.post("/api/v1/write", content=body, headers=headers)

        r = asyncio.run(post(bytes(cramjam.snappy.compress_raw(_request_v2()))))
        assert r.status_code == 204, r.text
        assert r.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
        assert r.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "2"
        assert r.headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "0"
        got = store.query(
            "SELECT metric, positive_counts, positive_float_counts FROM ki.histograms ORDER BY ts"
        ).to_pylist()
        assert got == [
            {
                "metric": "kernel_duration_seconds",
                "positive_counts": [2, 1, 1, 2, 3],
                "positive_float_counts": [],
            },
            {
                "metric": "kernel_duration_seconds",
                "positive_counts": [],
                "positive_float_counts": [4.25, 3.0],
            },
        ]
        assert store.row_count("samples") == 1
    finally:
        store.close()


def _request_v2_with_start_timestamps() -> bytes:
    """A counter whose second sample starts after the first (a reset the value does not show),
    one without start timestamps, and a histogram with one."""
    req = RequestV2()
    req.symbols.extend(["", "__name__", "requests_total", "job", "a", "b", "lat"])
    a = req.timeseries.add(labels_refs=[1, 2, 3, 4])
    a.samples.add(value=10.0, timestamp=NOW, start_timestamp=NOW - 60_000)
    a.samples.add(value=12.0, timestamp=NOW + 15_000, start_timestamp=NOW + 5_000)
    b = req.timeseries.add(labels_refs=[1, 2, 3, 5])
    b.samples.add(value=1.0, timestamp=NOW)
    h = req.timeseries.add(labels_refs=[1, 6]).histograms.add(
        count_int=1, sum=0.5, schema=0, timestamp=NOW, start_timestamp=NOW - 1
    )
    h.positive_spans.add(offset=0, length=1)
    h.positive_deltas.extend([1])
    return req.SerializeToString()


def test_remote_write_2_start_timestamps_are_decoded_and_stored(tmp_path):
    from kernel_insight.collector.remote_write import decode_write_request_v2

    builder = HistogramBuilder()
    floats = decode_write_request_v2(_request_v2_with_start_timestamps(), histograms=builder)
    assert floats.st_ms is not None
    got = sorted(
        (dict(floats.series[i])["job"], t, st)
        for i, t, st in zip(
            floats.series_idx.tolist(), floats.ts_ms.tolist(), floats.st_ms.tolist(), strict=True
        )
    )
    assert got == [("a", NOW, NOW - 60_000), ("a", NOW + 15_000, NOW + 5_000), ("b", NOW, 0)]
    hists = builder.build()
    assert hists.st_ms is not None
    assert hists.st_ms.tolist() == [NOW - 1]
    # Without any start timestamp a batch carries none (1.0, and 2.0 senders that send none).
    plain = HistogramBuilder()
    assert decode_write_request_v2(_request_v2(), histograms=plain).st_ms is None
    plain_hists = plain.build()
    assert plain_hists.st_ms is None
    bad = RequestV2()
    bad.symbols.extend(["", "__name__", "x"])
    bad.timeseries.add(labels_refs=[1, 2]).samples.add(value=1.0, timestamp=NOW, start_timestamp=-(2**62))
    with pytest.raises(RemoteWriteError, match=r"start timestamp .* is outside"):
        decode_write_request_v2(bad.SerializeToString())

    with EmbeddedStore(tmp_path / "data") as store:
        store.insert_samples(floats)
        store.insert_histograms(hists)
        store.insert_histograms(plain_hists)  # a batch without: its rows read 0
        rows = store.query(
            "SELECT toUnixTimestamp64Milli(ts) AS t, st FROM ki.samples ORDER BY t, st"
        ).to_pylist()
        assert [(r["t"], r["st"]) for r in rows] == [
            (NOW, 0),
            (NOW, NOW - 60_000),
            (NOW + 15_000, NOW + 5_000),
        ]
        hist_st = store.query("SELECT st FROM ki.histograms ORDER BY ts, st").column("st").to_pylist()
        assert hist_st == [0, NOW - 1, 0]
        # Batches with and without start timestamps written together (the batcher's groups).
        group = [
            store.prepare(f"b{i}", samples=batch)
            for i, batch in enumerate((floats, decode_write_request_v2(_request_v2())))
        ]
        store.insert_prepared(group, "g")
        assert store.query("SELECT count() AS n, countIf(st != 0) AS k FROM ki.samples").to_pylist() == [
            {"n": 7, "k": 4}
        ]
