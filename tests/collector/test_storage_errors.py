"""One storage error hierarchy (kql's StorageError) with one ``retryable``, and what each becomes on the wire."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from kernel_insight.collector import StorageError as CollectorStorageError
from kernel_insight.collector.app import create_app
from kernel_insight.collector.batcher import Batcher, FlushFailed
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore, StorageUnavailable
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.kql import Engine, StorageError
from kernel_insight.kql.errors import KqlError
from kernel_insight.kql.storage import MemoryStorage

NOW = (int(time.time()) // 60) * 60_000


def _post(app, path, body):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c:
            return await c.post(path, content=body)

    return asyncio.run(go())


class _RaisingClient:
    """A clickhouse-connect client stand-in whose every call raises ``exc``: only classification is under test."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def command(self, sql):
        raise self.exc

    def query_arrow(self, sql):
        raise self.exc

    def close(self):
        pass


def test_the_collector_raises_kqls_storage_error_one_hierarchy():
    assert CollectorStorageError is StorageError
    assert issubclass(StorageUnavailable, StorageError)
    assert issubclass(StorageError, KqlError)
    assert StorageUnavailable("down", 7).retryable
    assert StorageUnavailable("down", 7).retry_after_s == 7
    assert not StorageError("refused").retryable
    assert StorageError("refused").retry_after_s is None


def test_a_wrapped_retryable_error_stays_retryable():
    with pytest.raises(StorageError) as info:
        raise StorageError("storage select failed") from StorageUnavailable("refused", 3)
    assert info.value.retryable
    assert info.value.retry_after_s == 3
    with pytest.raises(StorageError) as info:
        raise StorageError("storage select failed") from StorageError("Code: 60 unknown table")
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (RuntimeError("Code: 241. DB::Exception: Memory limit exceeded"), True),
        (RuntimeError("Code: 60. DB::Exception: Unknown table ki.nope"), False),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (TimeoutError("timed out"), True),
    ],
)
def test_engine_and_transport_errors_are_classified(exc, retryable):
    store = ServerStore(_RaisingClient(exc), create_schema=False)
    with pytest.raises(StorageError) as info:
        store.query("SELECT 1")
    assert info.value.retryable is retryable
    assert isinstance(info.value, StorageUnavailable) is retryable
    assert info.value.__cause__ is exc


@pytest.mark.parametrize(
    "exc", [TypeError("unsupported operand"), KeyError("labels"), RuntimeError("no code")]
)
def test_a_bug_is_never_a_retryable_storage_error(exc):
    """Not ClickHouse's error nor its transport's: it passes unchanged (a 500 with a traceback, not a 503)."""
    store = ServerStore(_RaisingClient(exc), create_schema=False)
    with pytest.raises(type(exc)) as info:
        store.command("SELECT 1")
    assert info.value is exc
    assert not isinstance(info.value, StorageError)


def test_an_unreachable_server_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(StorageUnavailable):
        ServerStore.connect(f"http://127.0.0.1:{port}", connect_timeout=2, send_receive_timeout=2)


def test_a_real_engine_refusal_is_permanent(tmp_path):
    store = EmbeddedStore(tmp_path / "d")
    try:
        with pytest.raises(StorageError) as info:
            store.query("SELECT * FROM ki.no_such_table")
        assert not info.value.retryable
    finally:
        store.close()


def test_the_engine_keeps_retryable_through_its_wrapping():
    class Down(MemoryStorage):
        def select(self, matchers, start_ms, end_ms, hints=None):
            raise StorageUnavailable("connection refused", 4)

    with pytest.raises(StorageError, match="storage select failed") as info:
        Engine(Down()).instant_query("up", NOW)
    assert info.value.retryable
    assert info.value.retry_after_s == 4


def test_remote_write_refused_for_good_is_a_422_not_a_retried_5xx(tmp_path):
    """Prometheus resends any 5xx forever: a write the store refuses permanently must be a 4xx."""
    store = EmbeddedStore(tmp_path / "d")
    try:
        store.command("DROP TABLE ki.samples")  # every insert now fails with UNKNOWN_TABLE (code 60)
        body = encode_write_request([({"__name__": "up"}, [(NOW, 1.0)])])
        r = _post(create_app(store), "/api/v1/write", body)
        assert r.status_code == 422, r.text
        assert "storage refused the write" in r.json()["detail"]
        assert "Retry-After" not in r.headers
        store.close()
        r = _post(create_app(store), "/api/v1/write", body)
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "5"
    finally:
        store.close()


def test_remote_write_through_the_group_commit_refused_for_good_is_a_422(tmp_path):
    """Under ``ki collector`` remote_write rows go through the batcher: its refusal is permanent too."""
    store = EmbeddedStore(tmp_path / "d")
    batcher = Batcher(store, max_delay_s=0.01, shutdown_timeout_s=2)
    try:
        store.command("DROP TABLE ki.samples")
        app = create_app(store)
        app.state.remote_write_batcher = batcher
        r = _post(app, "/api/v1/write", encode_write_request([({"__name__": "up"}, [(NOW, 1.0)])]))
        assert r.status_code == 422, r.text
        assert "Retry-After" not in r.headers
    finally:
        batcher.shutdown()
        store.close()


def test_a_bug_in_the_group_commit_is_a_logged_500_never_a_retryable_503(tmp_path, monkeypatch, caplog):
    """A fault of the collector (here: the flusher's insert raises a plain RuntimeError) is no
    store that is away: answered 500 on remote_write and agent ingest alike, with its traceback logged."""
    store = EmbeddedStore(tmp_path / "d")
    batcher = Batcher(store, max_delay_s=0.01, shutdown_timeout_s=2)

    def bug(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(store, "insert_prepared", bug)
    try:
        app = create_app(store)
        app.state.remote_write_batcher = batcher
        with caplog.at_level("ERROR", logger="kernel_insight.collector.batcher"):
            r = _post(app, "/api/v1/write", encode_write_request([({"__name__": "up"}, [(NOW, 1.0)])]))
        assert r.status_code == 500, r.text
        assert "Retry-After" not in r.headers
        assert r.json()["detail"] == "internal error while storing the write"
        assert any("a bug of ours" in (rec.exc_text or "") for rec in caplog.records)
        with pytest.raises(FlushFailed, match="RuntimeError: a bug of ours"):
            batcher.submit(store.prepare("agent:1", samples=_one_sample())).answer().result(timeout=30)
    finally:
        batcher.shutdown()
        store.close()


def _one_sample():
    from kernel_insight.collector.rows import SampleBuilder

    b = SampleBuilder()
    b.add({"__name__": "up"}, NOW, 1.0)
    return b.build()
