"""remote_write decoding (hand-written protobuf, snappy) and the collector app's answers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
import time

import cramjam
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector.app import create_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import (
    RemoteWriteError,
    SeriesCache,
    decode_write_request,
    decode_write_request_v2,
    encode_write_request,
    parse_remote_write,
)
from kernel_insight.collector.rows import HistogramBuilder, SeriesLimits
from kernel_insight.kql.storage import STALE_NAN, Matcher, is_stale

NOW = (int(time.time()) // 60) * 60_000
ANY_NAMES = SeriesLimits(max_labels=0, max_name_bytes=0, max_value_bytes=0, utf8_names=True)


def _rows(batch):
    return [
        (dict(batch.series[i]), t, v)
        for i, t, v in zip(
            batch.series_idx.tolist(), batch.ts_ms.tolist(), batch.values.tolist(), strict=True
        )
    ]


def test_decodes_series_labels_and_samples():
    body = encode_write_request(
        [
            ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, [(NOW, 61.0), (NOW + 15_000, 62.0)]),
            ({"__name__": "up"}, [(1, 1.0)]),
        ]
    )
    assert _rows(parse_remote_write(body)) == [
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, NOW, 61.0),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, NOW + 15_000, 62.0),
        ({"__name__": "up"}, 1, 1.0),
    ]


def test_unknown_fields_metadata_and_histograms_are_skipped():
    # WriteRequest.metadata (3), a fixed32 field (9), and TimeSeries.histograms (4).
    series = encode_write_request([({"__name__": "up"}, [(5, 1.0)])], compress=False)
    extra_ts = b"\x22\x02\x08\x01"  # histograms field with a tiny payload
    inner = series[2:] + extra_ts
    msg = b"\x0a" + bytes([len(inner)]) + inner + b"\x1a\x00" + b"\x4d" + struct.pack("<I", 7)
    assert _rows(decode_write_request(msg)) == [({"__name__": "up"}, 5, 1.0)]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x0a\x05\x0a", "runs past the end"),
        (b"\x0b", "unsupported wire type"),
        (b"\x0a\x04\x12\x02\x08\x01", "wire type 0, expected 1"),
        (b"\x0a\x06\x0a\x04\x0a\x02\xff\xfe" + b"", "UTF-8"),
        (b"\x0a\x0b\x12\x09\x09" + b"\x00" * 8, "metric name"),
        (b"\x80", "truncated varint"),
        (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    ],
)
def test_malformed_protobuf_is_a_clear_error(raw, message):
    with pytest.raises(RemoteWriteError, match=message):
        decode_write_request(raw)


def test_timestamps_outside_the_schema_are_refused():
    for t in (-1, 2**62):
        with pytest.raises(RemoteWriteError, match="outside 1970-01-01"):
            parse_remote_write(encode_write_request([({"__name__": "up"}, [(t, 1.0)])]))


def test_snappy_problems_are_clear_errors():
    with pytest.raises(RemoteWriteError, match="snappy"):
        parse_remote_write(b"\xff\xff\xff")
    bomb = b"\x80\x80\x80\x80\x08"  # claims 2 GiB
    with pytest.raises(RemoteWriteError, match="over the"):
        parse_remote_write(bomb)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decoder_raises_only_remote_write_error(raw):
    with contextlib.suppress(RemoteWriteError):
        decode_write_request(raw)
    with contextlib.suppress(RemoteWriteError):  # native histograms collected, and remote write 2.0
        decode_write_request(raw, histograms=HistogramBuilder())
    with contextlib.suppress(RemoteWriteError):
        decode_write_request_v2(raw, histograms=HistogramBuilder())
    with contextlib.suppress(RemoteWriteError):
        parse_remote_write(bytes(cramjam.snappy.compress_raw(raw)))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=5), max_size=3),
            st.lists(
                st.tuples(st.integers(0, 5_662_310_399_999), st.floats(allow_nan=False)),
                min_size=1,
                max_size=4,
            ),
        ),
        max_size=5,
    )
)
def test_fuzz_round_trip(series):
    series = [({**labels, "__name__": "m"}, samples) for labels, samples in series]
    got = _rows(parse_remote_write(encode_write_request(series), limits=ANY_NAMES))
    want = [(labels, t, v) for labels, samples in series for t, v in samples]

    def key(row):
        return repr((sorted(row[0].items()), row[1], row[2]))

    assert sorted(got, key=key) == sorted(want, key=key)


class Client:
    """A sync facade over httpx's ASGI transport (Starlette's TestClient warns under httpx)."""

    def __init__(self, app):
        self.app = app

    def request(self, method, path, **kwargs):
        async def go():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://collector") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(go())

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)


@pytest.fixture
def app_store(tmp_path):
    store = EmbeddedStore(tmp_path / "d")
    yield store
    store.close()


def test_app_stores_remote_write_and_kql_reads_it(app_store):
    client = Client(create_app(app_store))
    body = encode_write_request([({"__name__": "up", "job": "dcgm"}, [(NOW, 1.0), (NOW + 1000, STALE_NAN)])])
    r = client.post("/api/v1/write", content=body, headers={"Content-Encoding": "snappy"})
    assert r.status_code == 204, r.text
    (series,) = app_store.storage().select([Matcher("job", "=", "dcgm")], NOW, NOW + 1000)
    assert series.timestamps.tolist() == [NOW, NOW + 1000]
    assert is_stale(series.values).tolist() == [False, True]
    assert client.get("/healthz").json() == {"status": "ok"}


def test_app_answers_400_413_415_and_503_never_500(app_store):
    client = Client(create_app(app_store, max_body_bytes=1000))
    r = client.post("/api/v1/write", content=b"garbage!")
    assert r.status_code == 400
    assert "malformed remote_write request" in r.json()["detail"]
    r = client.post("/api/v1/write", content=bytes(cramjam.snappy.compress_raw(b"\x0a\x05\x0a")))
    assert r.status_code == 400
    assert "runs past the end" in r.json()["detail"]
    assert client.post("/api/v1/write", content=b"x" * 1001).status_code == 413
    assert client.post("/api/v1/write", content=b"x", headers={"Content-Encoding": "gzip"}).status_code == 415
    app_store.close()
    body = encode_write_request([({"__name__": "up"}, [(NOW, 1.0)])])
    r = client.post("/api/v1/write", content=body)
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "5"
    assert client.get("/healthz").status_code == 503


def test_app_refuses_unknown_remote_write_messages_so_senders_fall_back(app_store):
    # Remote write 2.0 is accepted (test_remote_write_histograms.py); any other proto= is a 415.
    client = Client(create_app(app_store))
    other = "application/x-protobuf;proto=io.prometheus.write.v3.Request"
    body = encode_write_request([({"__name__": "up"}, [(NOW, 1.0)])])
    r = client.post("/api/v1/write", content=body, headers={"Content-Type": other})
    assert r.status_code == 415
    assert "io.prometheus.write.v2.Request (2.0)" in r.json()["detail"]
    v1 = "application/x-protobuf;proto=prometheus.WriteRequest"
    assert client.post("/api/v1/write", content=body, headers={"Content-Type": v1}).status_code == 204


def test_app_413_without_content_length(app_store):
    client = Client(create_app(app_store, max_body_bytes=10))

    async def chunks():
        yield b"x" * 8
        yield b"x" * 8

    assert client.post("/api/v1/write", content=chunks()).status_code == 413


# ---- the fast scan against the general decoder -------------------------------------------


def _proto3(series, exemplar_at=None):
    """A WriteRequest as Go's proto3 encoder writes it: zero values and timestamps left out."""
    from kernel_insight.collector.remote_write import _enc_len
    from kernel_insight.collector.varint import encode as _enc_varint

    parts = []
    for n, (labels, samples) in enumerate(series):
        body = b"".join(_enc_len(1, _enc_len(1, k.encode()) + _enc_len(2, v.encode())) for k, v in labels)
        for t, v in samples:
            sample = (b"\x09" + struct.pack("<d", v) if v != 0.0 else b"") + (
                b"\x10" + _enc_varint(t) if t else b""
            )
            body += _enc_len(2, sample)
        if n == exemplar_at:
            body += _enc_len(3, _enc_len(1, _enc_len(1, b"trace_id") + _enc_len(2, b"abc")))
        parts.append(_enc_len(1, body))
    return b"".join(parts)


_series = st.tuples(
    st.lists(
        st.tuples(st.sampled_from(["__name__", "job", "gpu", "a"]), st.sampled_from(["m", "x", "0", "h y"])),
        min_size=1,
        max_size=4,
        unique_by=lambda kv: kv[0],
    ).map(lambda ls: [("__name__", "m"), *[kv for kv in ls if kv[0] != "__name__"]]),
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 127, 128, NOW, 5_662_310_399_999]), st.sampled_from([0.0, 1.5, -2.0])
        ),
        max_size=4,
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_series, max_size=6), st.one_of(st.none(), st.integers(0, 5)))
def test_fast_scan_matches_the_general_decoder(series, exemplar_at):
    from kernel_insight.collector.remote_write import _decode_general

    raw = _proto3(series, exemplar_at)
    cache = SeriesCache()
    want = sorted(map(repr, _rows(_decode_general(raw, SeriesLimits()))))
    assert sorted(map(repr, _rows(decode_write_request(raw, SeriesLimits(), cache)))) == want
    assert sorted(map(repr, _rows(decode_write_request(raw, SeriesLimits(), cache)))) == want  # cached


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"__name__": "x{y}"}, "invalid metric name 'x{y}'"),
        ({"__name__": "up", 'a b"}': "1"}, "invalid label name"),
        ({"__name__": "up", **{f"l{i}": "v" for i in range(30)}}, "31 labels exceed the limit of 30"),
        ({"__name__": "a" * 5_000_000}, "metric name of 5000000 bytes exceeds the limit of 1024"),
        ({"__name__": "up", "a": "v" * 2049}, "over the limit of 2048"),
    ],
)
def test_app_refuses_series_prometheus_would_with_400(app_store, labels, message):
    client = Client(create_app(app_store))
    body = encode_write_request([(labels, [(NOW, 1.0)])])
    r = client.post("/api/v1/write", content=body, headers={"Content-Encoding": "snappy"})
    assert r.status_code == 400, r.text
    assert message in r.json()["detail"]
    assert app_store.row_count("samples") == 0


def test_app_series_limits_are_settings_and_writes_go_through_the_batcher(app_store):
    from kernel_insight.collector.batcher import Batcher

    app = create_app(app_store)
    app.state.series_limits = SeriesLimits(max_labels=40, utf8_names=True)
    batcher = app.state.remote_write_batcher = Batcher(app_store)
    try:
        client = Client(app)
        labels = {"__name__": "x{y}", **{f"l{i}": "v" for i in range(30)}}
        body = encode_write_request([(labels, [(NOW, 1.0)])])
        assert client.post("/api/v1/write", content=body).status_code == 204
        assert batcher.stats.flushed_batches == 1
    finally:
        batcher.shutdown()
    (series,) = app_store.storage().select([Matcher("__name__", "=", "x{y}")], NOW, NOW)
    assert series.values.tolist() == [1.0]


def test_the_store_writes_the_same_rows_with_the_decoders_series_metadata_as_without(app_store):
    """SampleBatch.series_meta (the SeriesCache's fingerprints and names) only saves the store work."""
    cache = SeriesCache()
    series = [
        ({"__name__": name, "gpu": str(g)}, [(NOW + k, float(g * k)) for k in range(3)])
        for name in ("b_metric", "a_metric")
        for g in range(4)
    ]
    decode_write_request(encode_write_request(series[:3], compress=False), cache=cache)  # some known before
    batch = decode_write_request(encode_write_request(series, compress=False), cache=cache)
    assert batch.series_meta is not None
    with_meta = app_store.prepare("rw:a", samples=batch, record=False)
    without = app_store.prepare("rw:b", samples=dataclasses.replace(batch, series_meta=None), record=False)
    for table in ("samples", "series"):
        assert with_meta.tables[table].to_pylist() == without.tables[table].to_pylist()
    for p in (with_meta, without):  # per sample, the metric the sample cache is told about
        assert [p.metric_names[c] for c in p.metric_codes.tolist()] == [
            batch.series[i][0][1] for i in batch.series_idx.tolist()
        ]
    with pytest.raises(ValueError, match="series_meta"):
        dataclasses.replace(batch, series_meta=(batch.series_meta[0][:1], batch.series_meta[1], []))


@pytest.mark.parametrize("with_meta", [True, False])
def test_a_series_row_is_written_once_per_series_and_day(app_store, with_meta):
    """The written (series, day) check (sorted fingerprints per day): no pair twice, none missed."""
    cache = SeriesCache()
    day = 86_400_000
    t = (NOW // day) * day + 1000

    def write(batch_id: str, series: list) -> None:
        batch = decode_write_request(encode_write_request(series, compress=False), cache=cache)
        if not with_meta:
            batch = dataclasses.replace(batch, series_meta=None)
        app_store.insert_prepared([app_store.prepare(batch_id, samples=batch, record=False)], batch_id)

    a, b, c = ({"__name__": "m", "s": s} for s in "abc")
    write("rw:1", [(a, [(t, 1.0)]), (b, [(t, 1.0)])])
    write("rw:2", [(a, [(t + 1, 1.0)]), (b, [(t + 1, 1.0)]), (c, [(t + 1, 1.0)])])
    write("rw:3", [(a, [(t + day, 1.0)]), (c, [(t + 2, 1.0)])])  # a on the next day; c again
    write("rw:4", [(a, [(t + day + 1, 1.0)]), (b, [(t + 3, 1.0)])])
    rows = app_store.query("SELECT labels['s'] AS s, date FROM ki.series ORDER BY date, s").to_pylist()
    assert [(r["s"], r["date"].toordinal() - rows[0]["date"].toordinal()) for r in rows] == [
        ("a", 0),
        ("b", 0),
        ("c", 0),
        ("a", 1),
    ]


def test_a_series_sent_twice_in_one_request_is_stored_once_per_sample_with_one_series_row(app_store):
    """The fast decoder keeps one entry per TimeSeries (no sort to merge repeats): rows as the general
    decoder's, one series row, and every sample read back."""
    from kernel_insight.collector.remote_write import _decode_general

    t = NOW - 60_000
    twice = {"__name__": "twice", "s": "x"}
    raw = encode_write_request(
        [(twice, [(t, 1.0)]), ({"__name__": "twice", "s": "y"}, [(t, 5.0)]), (twice, [(t + 1000, 2.0)])],
        compress=False,
    )
    batch = decode_write_request(raw, cache=SeriesCache())
    assert sorted(map(repr, _rows(batch))) == sorted(map(repr, _rows(_decode_general(raw, SeriesLimits()))))
    app_store.insert_prepared([app_store.prepare("rw:twice", samples=batch, record=False)], "rw:twice")
    rows = app_store.query("SELECT labels['s'] AS s FROM ki.series FINAL WHERE metric = 'twice' ORDER BY s")
    assert rows.column("s").to_pylist() == ["x", "y"]
    (series,) = app_store.storage().select([Matcher("s", "=", "x")], t, t + 1000)
    assert series.values.tolist() == [1.0, 2.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=300), st.integers(0, 3))
def test_dense_codes_are_numpys_unique_with_its_inverse(codes, spare):
    """arrow_rows.dense_codes, Store._sample_rows' counting unique (both its branches: few codes of a large domain sort)."""
    import numpy as np

    from kernel_insight.collector.clickhouse.arrow_rows import dense_codes

    arr = np.asarray(codes, dtype=np.int32)
    for domain in (max(codes, default=-1) + 1 + spare, 10_000 + spare):
        used, dense = dense_codes(arr, domain)
        want_used, want_inverse = np.unique(arr, return_inverse=True)
        assert used.tolist() == want_used.tolist()
        assert dense.tolist() == want_inverse.reshape(-1).tolist()
        assert dense.dtype == np.int32


def test_the_series_cache_starts_again_only_when_new_series_would_pass_its_size():
    """A request of known series never empties the cache, however many series it holds (it
    counted the request's size once: at ~490k of 500k active series every request re-parsed)."""
    cache = SeriesCache(max_series=10)
    known = [({"__name__": "m", "i": str(i)}, [(NOW, float(i))]) for i in range(8)]
    raw = encode_write_request(known, compress=False)
    for _ in range(3):
        decode_write_request(raw, SeriesLimits(), cache)
    assert len(cache) == 8
    assert cache.resets == 0
    fresh = [({"__name__": "m", "i": f"new{i}"}, [(NOW, 1.0)]) for i in range(3)]
    decode_write_request(encode_write_request(known[:2] + fresh, compress=False), SeriesLimits(), cache)
    assert cache.resets == 1
    assert len(cache) == 5


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=200), st.text(max_size=200)),
        max_size=6,
    ),
    st.binary(max_size=40),
)
def test_the_labels_fast_read_answers_as_the_field_walk(labels, garbage):
    """The indexed read of a new series' labels (lengths under 128, name then value) gives what the
    field walk gives on every encoding, long, empty, non-ASCII or broken, or fails as it does."""
    from kernel_insight.collector.remote_write import RemoteWriteError, _raw_labels, _raw_labels_walk

    def field(number: int, payload: bytes) -> bytes:
        n = len(payload)
        size = bytearray()
        while True:
            size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                break
        return bytes([number << 3 | 2]) + bytes(size) + payload

    body = b"".join(field(1, field(1, k.encode()) + (field(2, v.encode()) if v else b"")) for k, v in labels)
    for buf in (body, body + garbage, garbage + body, body[: len(body) // 2]):
        try:
            want: object = _raw_labels_walk(buf, 0, len(buf))
        except RemoteWriteError as exc:
            want = type(exc)
        try:
            got: object = _raw_labels(buf, 0, len(buf))
        except RemoteWriteError as exc:
            got = type(exc)
        assert got == want


def test_a_group_waits_for_each_keep_alive_connection_of_the_senders(app_store):
    """Over real HTTP the batcher knows remote_write's senders by their connections: with two
    connections sending, one's request waits (past max_delay_s) for the other's, and both go in one insert."""
    from concurrent.futures import ThreadPoolExecutor

    from loopback import running_server

    from kernel_insight.collector.batcher import Batcher

    app = create_app(app_store)
    batcher = app.state.remote_write_batcher = Batcher(
        app_store, max_delay_s=0.01, eager_max_delay_s=120, sender_idle_s=120
    )

    def body(i: int) -> bytes:
        return encode_write_request([({"__name__": "conn", "i": str(i)}, [(NOW, float(i))])])

    try:
        with (
            running_server(app) as url,
            httpx.Client(base_url=url, timeout=60) as a,
            httpx.Client(base_url=url, timeout=60) as b,
            ThreadPoolExecutor(1) as pool,
        ):
            assert a.post("/api/v1/write", content=body(0)).status_code == 204  # a alone: at once
            pending = pool.submit(b.post, "/api/v1/write", content=body(1))
            with pytest.raises(TimeoutError):  # b waits for a's next request
                pending.result(timeout=0.5)
            flushes = batcher.stats.flushes
            assert a.post("/api/v1/write", content=body(2)).status_code == 204
            assert pending.result(timeout=60).status_code == 204
            assert batcher.stats.flushes == flushes + 1
            assert batcher.stats.eager_senders == 2
    finally:
        batcher.shutdown()
    got = app_store.row_count("samples")
    assert got == 3
