"""The ingest endpoint answers every case with the status docs/wire.md promises."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from support.wire_corpus import random_records

from kernel_insight.collector import wire
from kernel_insight.collector.clickhouse.store import StorageError, StorageUnavailable
from kernel_insight.collector.ingest import IngestStats, ingest_router
from kernel_insight.collector.keys import KeyStore

PATH = wire.INGEST_PATH


class Client:
    """A synchronous face on httpx's ASGI transport (starlette's TestClient warns on import)."""

    def __init__(self, app):
        self.app = app

    def post(self, path, content, headers):
        async def go():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://collector") as c:
                return await c.post(path, content=content, headers=headers)

        return asyncio.run(go())


class MemorySink:
    def __init__(self):
        self.batches: list[wire.DecodedBatch] = []
        self.fail: Exception | None = None
        self.ids: set[str] = set()

    def __call__(self, batch: wire.DecodedBatch) -> bool:
        if self.fail is not None:
            raise self.fail
        if str(batch.batch_id) in self.ids:
            return False
        self.ids.add(str(batch.batch_id))
        self.batches.append(batch)
        return True


@pytest.fixture
def env(tmp_path):
    store = KeyStore(tmp_path / "keys.json")
    creds = store.add_agent("a")
    sink = MemorySink()
    stats = IngestStats()
    app = FastAPI()
    app.include_router(ingest_router(store, sink, limits=wire.Limits(max_frame=64 * 1024), stats=stats))
    return Client(app), store, creds, sink, stats


def frame(creds, seq=0, n=5, key=None, epoch=1):
    arr = random_records(np.random.default_rng(seq), n)
    return wire.encode_batch(
        arr,
        agent_id=creds.agent_id,
        key_id=creds.key_id,
        key=key or creds.key,
        epoch=epoch,
        seq=seq,
        now_ns=1,
    )


def post(client, body):
    return client.post(PATH, content=body, headers={"Content-Type": wire.CONTENT_TYPE})


def test_valid_batch_is_stored(env):
    client, _, creds, sink, stats = env
    r = post(client, frame(creds))
    assert r.status_code == 200
    assert r.json()["records"] == 5
    assert len(sink.batches) == 1
    assert stats.records == 5


def test_replayed_batch_is_409_and_stored_once(env):
    client, _, creds, sink, _ = env
    f = frame(creds)
    assert post(client, f).status_code == 200
    r = post(client, f)
    assert r.status_code == 409
    assert r.json()["status"] == "duplicate"
    assert len(sink.batches) == 1


def test_duplicate_known_only_to_storage_is_409(env, tmp_path):
    client, _, creds, sink, _ = env
    f = frame(creds)
    sink.ids.add(str(wire.parse_header(f).batch_id))  # stored by an earlier collector process
    assert post(client, f).status_code == 409
    assert sink.batches == []


def test_same_seq_in_new_epoch_is_a_new_batch(env):
    client, _, creds, sink, _ = env
    assert post(client, frame(creds, epoch=1)).status_code == 200
    assert post(client, frame(creds, epoch=2)).status_code == 200
    assert len(sink.batches) == 2


def test_wrong_key_is_401(env):
    client, _, creds, sink, _ = env
    assert post(client, frame(creds, key=bytes(32))).status_code == 401
    assert sink.batches == []


def test_tampered_batch_is_401(env):
    client, _, creds, sink, _ = env
    f = bytearray(frame(creds))
    f[80] ^= 0x10
    assert post(client, bytes(f)).status_code == 401
    assert sink.batches == []


def test_unknown_agent_is_403(env):
    client, _, creds, _, _ = env
    stranger = wire.encode_batch(
        random_records(np.random.default_rng(1), 2),
        agent_id=bytes(16),
        key_id=1,
        key=creds.key,
        epoch=1,
        seq=0,
    )
    r = post(client, stranger)
    assert r.status_code == 403
    assert "not enrolled" in r.json()["detail"]


def test_revoked_agent_is_403(env, monkeypatch):

    monkeypatch.setattr("kernel_insight.collector.private_json.RELOAD_CHECK_S", 0.0)
    client, store, creds, _, _ = env
    assert post(client, frame(creds, seq=0)).status_code == 200
    store.revoke(creds.agent_id)
    r = post(client, frame(creds, seq=1))
    assert r.status_code == 403
    assert "revoked" in r.json()["detail"]


def test_rotated_key_and_old_key_both_accepted_until_retired(env, monkeypatch):

    monkeypatch.setattr("kernel_insight.collector.private_json.RELOAD_CHECK_S", 0.0)
    client, store, creds, _, _ = env
    new = store.rotate(creds.agent_id)
    assert post(client, frame(creds, seq=0)).status_code == 200
    assert post(client, frame(new, seq=1)).status_code == 200
    store.retire(creds.agent_id, creds.key_id)
    assert post(client, frame(creds, seq=2)).status_code == 403


def test_malformed_header_is_400(env):
    client = env[0]
    assert post(client, b"GET / HTTP/1.0\r\n\r\n" * 5).status_code == 400
    assert post(client, b"").status_code == 400


def test_authenticated_garbage_body_is_400(env):
    client, _, creds, sink, _ = env
    f = wire.seal_body(
        b"\x01\x77\x00",
        agent_id=creds.agent_id,
        key_id=1,
        key=creds.key,
        epoch=1,
        seq=0,
        t_min_ns=0,
        t_max_ns=0,
        record_count=0,
    )
    r = post(client, f)
    assert r.status_code == 400
    assert "unknown section" in r.json()["detail"]
    assert sink.batches == []


def test_oversized_is_413_by_header_and_by_body(env):
    client, _, creds, _, _ = env
    assert post(client, b"\0" * (64 * 1024 + 1)).status_code == 413
    assert post(client, frame(creds, n=6000)).status_code == 413


def test_storage_unavailable_is_503_with_retry_after_and_retry_succeeds(env):
    client, _, creds, sink, _ = env
    sink.fail = StorageUnavailable("down", retry_after_s=7)
    f = frame(creds)
    r = post(client, f)
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "7"
    sink.fail = None
    assert post(client, f).status_code == 200
    assert len(sink.batches) == 1


def test_storage_refusal_is_422(env):
    client, _, creds, _, stats = env
    sink = env[3]
    sink.fail = StorageError("bad column")
    assert post(client, frame(creds)).status_code == 422
    assert stats.by_status == {422: 1}


def test_key_never_in_responses(env):
    client, _, creds, _, _ = env
    for body in (frame(creds, key=bytes(32)), frame(creds), frame(creds)):
        assert creds.key.hex() not in post(client, body).text


# ---- requests of several frames (application/x-ki-batches) -------------------------------


def post_many(client, frames):
    return client.post(PATH, content=b"".join(frames), headers={"Content-Type": wire.FRAMES_CONTENT_TYPE})


def statuses(r):
    return [int(s) for s in r.headers[wire.BATCH_STATUS_HEADER].split(",")]


def test_several_frames_in_one_request_are_each_stored_and_answered(env):
    client, _, creds, sink, stats = env
    r = post_many(client, [frame(creds, seq=s) for s in range(4)])
    assert r.status_code == 200
    assert statuses(r) == [200, 200, 200, 200]
    assert [x["records"] for x in r.json()["results"]] == [5, 5, 5, 5]
    assert sorted(b.batch_id.seq for b in sink.batches) == [0, 1, 2, 3]
    assert stats.by_status == {200: 4}


def test_each_frame_of_a_request_gets_its_own_outcome(env):
    client, _, creds, sink, _ = env
    stored_before = frame(creds, seq=0)
    assert post(client, stored_before).status_code == 200
    tampered = bytearray(frame(creds, seq=2))
    tampered[80] ^= 0x10
    garbage = wire.seal_body(
        b"\x01\x77\x00", agent_id=creds.agent_id, key_id=1, key=creds.key, epoch=1, seq=3,
        t_min_ns=0, t_max_ns=0, record_count=0,
    )  # fmt: skip
    stranger = wire.encode_batch(
        random_records(np.random.default_rng(1), 2),
        agent_id=bytes(16),
        key_id=1,
        key=creds.key,
        epoch=1,
        seq=4,
    )
    r = post_many(
        client, [stored_before, frame(creds, seq=1), bytes(tampered), garbage, stranger, frame(creds, seq=5)]
    )
    assert r.status_code == 200
    assert statuses(r) == [409, 200, 401, 400, 403, 200]
    assert "Retry-After" not in r.headers
    assert sorted(b.batch_id.seq for b in sink.batches) == [0, 1, 5]
    assert "unknown section" in r.json()["results"][3]["detail"]


def test_storage_unavailable_for_some_frames_answers_them_503_with_the_longest_retry_after(env):
    _client, _, creds, sink, _ = env
    calls = []

    def flaky(batch):
        calls.append(batch.batch_id.seq)
        if batch.batch_id.seq == 1:
            raise StorageUnavailable("busy", retry_after_s=4)
        if batch.batch_id.seq == 2:
            raise StorageError("bad value")
        return MemorySink.__call__(sink, batch)

    app = FastAPI()
    store, _ = env[1], None
    app.include_router(ingest_router(store, flaky))
    r = post_many(Client(app), [frame(creds, seq=s) for s in range(4)])
    assert statuses(r) == [200, 503, 422, 200]
    assert r.headers["Retry-After"] == "4"
    assert calls == [0, 1, 2, 3]  # in body order


def test_unexpected_sink_failure_answers_that_frame_500_and_settles_the_rest(env):
    _client, store, creds, sink, _ = env

    def broken(batch):
        if batch.batch_id.seq == 0:
            raise RuntimeError("bug")
        return MemorySink.__call__(sink, batch)

    app = FastAPI()
    app.include_router(ingest_router(store, broken))
    c = Client(app)
    r = post_many(c, [frame(creds, seq=0), frame(creds, seq=1)])
    assert statuses(r) == [500, 200]
    # Nothing of the failed frame stays "in flight": its retry is stored normally.
    r = post_many(c, [frame(creds, seq=1), frame(creds, seq=2)])
    assert statuses(r) == [409, 200]


def test_frames_of_one_request_are_all_submitted_before_any_is_waited_for(env):
    """With group commit a sink answers only after a flush: frames must share one, not queue for one each."""
    from concurrent.futures import Future

    _client, store, creds, _, _ = env
    events: list[str] = []

    class GroupSink:
        def __init__(self):
            self.futures: list[Future[bool]] = []

        def __call__(self, batch):  # the router must not use this when submit exists
            raise AssertionError("called one at a time")

        def submit(self, batch):
            events.append(f"submit {batch.batch_id.seq}")
            f: Future[bool] = Future()
            self.futures.append(f)
            if len(self.futures) == 3:  # "the flush": every queued batch becomes durable at once
                events.append("flush")
                for x in self.futures:
                    x.set_result(True)
            return f

    app = FastAPI()
    app.include_router(ingest_router(store, GroupSink()))
    r = post_many(Client(app), [frame(creds, seq=s) for s in range(3)])
    assert statuses(r) == [200, 200, 200]
    assert events == ["submit 0", "submit 1", "submit 2", "flush"]


def test_a_body_that_does_not_split_into_frames_is_400_as_a_whole(env):
    client, _, creds, sink, _ = env
    good = frame(creds, seq=0)
    for body in (good + good[:70], good[:-1], b"", b"\0" * 100):
        r = client.post(PATH, content=body, headers={"Content-Type": wire.FRAMES_CONTENT_TYPE})
        assert r.status_code == 400, body[:8]
        assert wire.BATCH_STATUS_HEADER not in r.headers
    assert sink.batches == []


def test_too_many_frames_or_bytes_in_one_request_is_413(env):
    client, store, creds, sink, _ = env
    app = FastAPI()
    app.include_router(ingest_router(store, sink, limits=wire.Limits(max_frames=3)))
    assert post_many(Client(app), [frame(creds, seq=s) for s in range(4)]).status_code == 413
    assert post_many(client, [frame(creds, seq=s, n=1000) for s in range(8)]).status_code == 413
    assert sink.batches == []


def test_one_frame_agents_are_answered_as_before(env):
    """An agent that predates x-ki-batches sends one frame with application/x-ki-batch: no per-frame header."""
    client, _, creds, _sink, _ = env
    r = post(client, frame(creds))
    assert r.status_code == 200
    assert wire.BATCH_STATUS_HEADER not in r.headers
    assert r.json()["status"] == "stored"
    # Two frames under the old content type are one malformed frame, as they always were.
    r = post(client, frame(creds, seq=1) + frame(creds, seq=2))
    assert r.status_code == 400


def test_the_agents_delivery_counters_reach_the_collectors_metrics(env):
    """Wire counters 24-27 (dead letters, spool write errors, requests) are exposed like the others."""
    from kernel_insight.collector import CollectorMetrics

    _client, store, creds, sink, _ = env
    metrics = CollectorMetrics(process=False)
    app = FastAPI()
    app.include_router(ingest_router(store, sink, metrics=metrics))
    C = wire.Counter
    counters = {C.SPOOL_BATCHES: 40, C.RING_DROPPED: 5, C.BATCHES_FAILED: 2, C.BATCHES_DEAD_LETTERED: 2,
                C.SPOOL_WRITE_ERRORS: 3, C.REQUESTS_SENT: 10, C.REQUESTS_FAILED: 1, C.BATCHES_RETRIED: 4}  # fmt: skip
    frames = [
        wire.encode_batch(
            random_records(np.random.default_rng(s), 3),
            agent_id=creds.agent_id,
            key_id=creds.key_id,
            key=creds.key,
            epoch=1,
            seq=s,
            counters={int(k): v + s for k, v in counters.items()},
        )
        for s in range(2)
    ]
    assert statuses(post_many(Client(app), frames)) == [200, 200]
    text = metrics.exposition()[0].decode()
    agent = creds.agent_id.hex()
    for name, value in [
        ("ki_agent_batches_dead_lettered_total", 3),
        ("ki_agent_spool_write_errors_total", 4),
        ("ki_agent_requests_sent_total", 11),
        ("ki_agent_requests_failed_total", 2),
        ("ki_agent_spool_batches", 41),
        ("ki_agent_ring_dropped_total", 6),
    ]:
        assert f'{name}{{agent="{agent}"}} {float(value)}' in text, name
