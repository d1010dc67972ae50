"""ServerStore over clickhouse-connect's HTTP client, against the real engine behind the chDB HTTP shim.

No ClickHouse server recent enough for clickhouse-connect installs here (docs/storage.md,
"What is tested where"); the shim runs the real engine in another process.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from chdb_http import running_shim

from kernel_insight.collector.clickhouse.store import ServerStore, StorageError, StorageUnavailable
from kernel_insight.collector.rows import SampleBuilder

NOW_MS = (int(time.time()) // 60) * 60_000


@pytest.fixture
def shim(tmp_path):
    with running_shim(tmp_path / "d") as (proc, url):
        yield proc, url


def _batch():
    b = SampleBuilder()
    b.add_series({"__name__": "gpu_power_watts", "gpu": "0"}, NOW_MS + np.arange(5) * 1000, np.arange(5.0))
    return b.build()


def _count(store):
    return store.query("SELECT count() AS c FROM ki.samples").column("c")[0].as_py()


def test_exactly_once_over_http(shim):
    _, url = shim
    store = ServerStore.connect(url, compress=False)
    try:
        assert store.insert_batch("agent-h:1", samples=_batch()) is True
        assert store.insert_batch("agent-h:1", samples=_batch()) is False
        # The dedup token travels as an HTTP setting and the engine honours it.
        store.insert_samples(_batch(), dedup_token="agent-h:2")
        store.insert_samples(_batch(), dedup_token="agent-h:2")
        assert _count(store) == 10
        with pytest.raises(StorageError) as info:
            store.query("SELECT nope FROM ki.samples")
        assert not isinstance(info.value, StorageUnavailable)
    finally:
        store.close()


def test_server_going_away_is_storage_unavailable(shim):
    proc, url = shim
    store = ServerStore.connect(url, compress=False)
    try:
        proc.kill()
        proc.wait()
        with pytest.raises(StorageUnavailable):
            store.insert_samples(_batch())
    finally:
        store.close()


def test_unreachable_server_is_storage_unavailable():
    with pytest.raises(StorageUnavailable, match="cannot connect"):
        ServerStore.connect("http://127.0.0.1:9", connect_timeout=1)


def test_shim_speaks_http_compression_both_ways(shim):
    import httpx
    import zstandard

    _, url = shim
    body = zstandard.ZstdCompressor().compress(b"SELECT 40 + 2 FORMAT TabSeparated")
    r = httpx.post(
        url + "/?enable_http_compression=1",
        content=body,
        headers={"Content-Encoding": "zstd", "Accept-Encoding": "zstd"},
    )
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "zstd"
    assert r.text == "42\n"  # httpx undid the zstd
    r = httpx.post(url, content=b"SELECT 1", headers={"Content-Encoding": "br"})
    assert r.status_code == 400
    assert "unsupported Content-Encoding" in r.text


def test_query_blob_returns_the_values_back_to_back(shim):
    from kernel_insight.collector.clickhouse.sql import Params

    _, url = shim
    store = ServerStore.connect(url, compress=False)
    try:
        p = Params()
        sql = f"SELECT concat(toString(number), {p('x', 'String')}) FROM numbers(3)"
        assert store.query_blob(sql, p) == b"0x1x2x"
    finally:
        store.close()
