"""Group commit (collector/batcher.py): many batches, one insert per table, each answered once durable."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from kernel_insight.collector.batcher import Batcher
from kernel_insight.collector.clickhouse.store import EmbeddedStore, StorageError, StorageUnavailable
from kernel_insight.collector.rows import SampleBuilder, SpanBatch

NOW_MS = int(time.time() * 1000)


def _rows(store, i: int, n: int = 5):
    b = SampleBuilder()
    for k in range(n):
        b.add({"__name__": "m", "batch": str(i)}, NOW_MS + k, float(k))
    start = np.array([NOW_MS * 1_000_000 + i * 1000 + k for k in range(n)], np.int64)
    spans = SpanBatch(
        ["h"] * n,
        np.zeros(n, np.uint16),
        np.zeros(n, np.uint64),
        ["k"] * n,
        start,
        start + 10,
        np.full(n, i, np.uint64),
        np.zeros(n, np.uint32),
    )
    return store.prepare(f"agent:{i}", agent_id="h", samples=b.build(), spans=spans)


def _counts(store) -> dict[str, int]:
    return {
        "s": store.row_count("samples"),
        "k": store.row_count("kernel_spans"),
        "b": store.row_count("batches"),
    }


@pytest.fixture
def store(tmp_path):
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as s:
        yield s


def test_concurrent_batches_share_inserts_and_each_is_answered_stored(store):
    batcher = Batcher(store, max_delay_s=0.2)
    batcher.start()
    results: list[bool] = []
    go = threading.Barrier(20)

    def one(i: int) -> None:
        rows = _rows(store, i)
        go.wait()
        results.append(batcher.submit(rows).answer().result(timeout=30))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.shutdown()
    assert results == [True] * 20
    assert _counts(store) == {"s": 100, "k": 100, "b": 20}
    assert batcher.stats.flushed_batches == 20
    assert batcher.stats.flushes <= 5  # not one insert round per batch
    assert batcher.stats.queue_batches == 0
    assert batcher.stats.queue_rows == 0
    assert sum(batcher.stats.flush_rows_counts) == batcher.stats.flushes


def test_a_batch_stored_before_is_answered_false_and_not_written_again(store):
    assert store.insert_batch("agent:1", samples=SampleBuilder().build()) is True
    batcher = Batcher(store, max_delay_s=0.05)
    batcher.start()
    assert batcher.submit(_rows(store, 1)).answer().result(timeout=30) is False
    assert batcher.submit(_rows(store, 2)).answer().result(timeout=30) is True
    batcher.shutdown()
    assert _counts(store) == {"s": 5, "k": 5, "b": 2}
    assert batcher.stats.duplicates == 1


def test_a_refused_batch_fails_alone_and_leaves_nothing_behind(store):
    """The engine refusing one batch's rows: the group is written batch by batch, the refused
    one is answered with the error, and none of its rows are stored (issue 13, item 3)."""
    batcher = Batcher(store, max_delay_s=10)
    good = [_rows(store, i) for i in (0, 1, 3, 4)]
    bad = _rows(store, 2)
    # A column the samples table does not have: the engine refuses the insert.
    bad.tables["samples"] = bad.tables["samples"].append_column("bogus", pa.array([1] * 5, pa.int64()))
    tickets = [batcher.submit(r) for r in (good[0], good[1], bad, good[2], good[3])]
    batcher.shutdown()  # never started: shutdown writes what is queued
    assert [t.outcome for t in tickets[:2] + tickets[3:]] == [True] * 4
    with pytest.raises(StorageError):
        tickets[2].answer().result(timeout=1)
    assert _counts(store) == {"s": 20, "k": 20, "b": 4}
    assert store.query("SELECT count() AS n FROM ki.kernel_spans WHERE correlation = 2").to_pylist() == [
        {"n": 0}
    ]
    assert batcher.stats.refused_batches == 1
    assert batcher.stats.partial_batches == 0


def test_an_unavailable_store_is_retried_with_the_same_tokens(store, monkeypatch):
    """Spans fail after samples landed: requests are answered 503 at once, the group is retried
    where it stopped, and the agent's retry of the same batch attaches to the queued one."""
    real = store._insert
    failures = {"left": 1}

    def flaky(name, data, token):
        if name == "kernel_spans" and failures["left"]:
            failures["left"] -= 1
            raise StorageUnavailable("disk busy")
        return real(name, data, token)

    monkeypatch.setattr(store, "_insert", flaky)
    batcher = Batcher(store, max_delay_s=0.01, retry_min_s=0.3, retry_max_s=0.3)
    batcher.start()
    first = batcher.submit(_rows(store, 7)).answer()
    with pytest.raises(StorageUnavailable):
        first.result(timeout=30)
    queued = batcher.pending("agent:7")
    assert queued is not None  # still queued, not dropped
    assert queued.answer().result(timeout=30) is True  # the retry's answer
    batcher.shutdown()
    assert _counts(store) == {"s": 5, "k": 5, "b": 1}
    assert batcher.stats.retries >= 1


def test_shutdown_writes_what_is_queued_at_once_and_is_safe_twice(store):
    batcher = Batcher(store, max_delay_s=30)
    batcher.start()
    tickets = [batcher.submit(_rows(store, i)) for i in range(3)]
    started = time.monotonic()
    batcher.shutdown()
    assert time.monotonic() - started < 10  # did not wait out max_delay_s
    assert [t.outcome for t in tickets] == [True, True, True]
    batcher.shutdown()
    with pytest.raises(StorageUnavailable):
        batcher.submit(_rows(store, 9))
    Batcher(store).shutdown()  # never started, nothing queued
    assert _counts(store)["b"] == 3


def test_the_queue_is_bounded(store):
    batcher = Batcher(store, max_delay_s=30, max_rows=10, max_queue_rows=20)
    batcher.submit(_rows(store, 0))  # 10 rows each (5 samples + 5 spans)
    batcher.submit(_rows(store, 1))
    with pytest.raises(StorageUnavailable):
        batcher.submit(_rows(store, 2))
    assert batcher.stats.queue_full == 1
    batcher.shutdown()
    assert _counts(store)["b"] == 2


def test_a_group_mixes_batches_of_one_instance_and_of_several(store):
    """One instance per batch is sent dictionary-encoded; a batch with several is not: one insert takes both."""
    n = 5
    start = np.array([NOW_MS * 1_000_000 + 900_000 + k for k in range(n)], np.int64)
    spans = SpanBatch(
        ["h", "g", "h", "g", "h"],
        np.zeros(n, np.uint16),
        np.zeros(n, np.uint64),
        ["k"] * n,
        start,
        start + 10,
        np.full(n, 5, np.uint64),
        np.zeros(n, np.uint32),
    )
    mixed = store.prepare("agent:5", agent_id="h", spans=spans)
    batcher = Batcher(store)
    tickets = [batcher.submit(_rows(store, 4)), batcher.submit(mixed)]
    batcher.shutdown()
    assert [t.outcome for t in tickets] == [True, True]
    got = store.query(
        "SELECT instance, count() AS n FROM ki.kernel_spans GROUP BY instance ORDER BY instance"
    )
    assert got.to_pylist() == [{"instance": "g", "n": 2}, {"instance": "h", "n": 8}]


def _flushed_once(store, batcher: Batcher) -> None:
    """One batch written and answered: the next group is then due only max_delay_s later."""
    assert batcher.submit(_rows(store, 100)).answer().result(timeout=30) is True


def test_eager_senders_gone_quiet_are_written_before_the_delay(store):
    """remote_write senders wait for their answers: once eager_rows of theirs wait and no more come, write."""
    batcher = Batcher(store, max_delay_s=60, eager_rows=20, quiet_s=0.05)
    batcher.start()
    _flushed_once(store, batcher)
    prepared = [_rows(store, i) for i in range(3)]  # 10 rows each: 30 >= eager_rows
    started = time.monotonic()
    tickets = [batcher.submit(p, eager=True) for p in prepared]
    assert [t.answer().result(timeout=30) for t in tickets] == [True, True, True]
    assert time.monotonic() - started < 30  # not max_delay_s
    assert batcher.stats.early_flushes == 1
    assert batcher.stats.flushes == 2  # the three went together
    batcher.shutdown()
    assert _counts(store) == {"s": 20, "k": 20, "b": 4}


def test_too_few_eager_rows_or_plain_batches_wait_for_the_delay(store):
    batcher = Batcher(store, max_delay_s=60, eager_rows=25, quiet_s=0.01)
    batcher.start()
    _flushed_once(store, batcher)
    eager = batcher.submit(_rows(store, 1), eager=True)  # 10 rows < eager_rows
    plain = [batcher.submit(_rows(store, i)) for i in (2, 3, 4)]  # not eager: they do not count
    for ticket in (eager, *plain):
        with pytest.raises(TimeoutError):
            ticket.answer().result(timeout=0.3)
    assert batcher.stats.early_flushes == 0
    batcher.shutdown()
    assert [t.outcome for t in (eager, *plain)] == [True] * 4


def _rw(store, i: int):
    """A remote_write request's rows (no batch id to record, as the app prepares them)."""
    b = SampleBuilder()
    b.add({"__name__": "rw", "req": str(i)}, NOW_MS, 1.0)
    return store.prepare(f"rw:{i}", samples=b.build(), record=False)


def _senders_known(store, batcher: Batcher, senders: list[str]) -> None:
    """Start ``batcher`` with each sender's first request queued, written together: it now knows them."""
    tickets = [batcher.submit(_rw(store, 1000 + i), eager=True, sender=s) for i, s in enumerate(senders)]
    batcher.start()
    assert [t.answer().result(timeout=30) for t in tickets] == [True] * len(senders)


def test_a_group_of_tracked_senders_waits_until_every_sender_waits(store):
    """A fleet's remote_write spread over its interval: each connection's request waits for the
    others' (not a short fixed window), and the group goes once every connection has sent."""
    batcher = Batcher(store, max_delay_s=0.01, eager_max_delay_s=120, sender_idle_s=120)
    _senders_known(store, batcher, ["a", "b", "c"])
    flushes = batcher.stats.flushes
    early = batcher.stats.early_flushes
    first = [batcher.submit(_rw(store, i), eager=True, sender=s) for i, s in enumerate("ab")]
    for ticket in first:  # c has not sent: a and b wait far past max_delay_s
        with pytest.raises(TimeoutError):
            ticket.answer().result(timeout=0.5)
    last = batcher.submit(_rw(store, 2), eager=True, sender="c")
    assert [t.answer().result(timeout=30) for t in (*first, last)] == [True] * 3
    assert batcher.stats.flushes == flushes + 1  # the three in one insert
    assert batcher.stats.early_flushes == early + 1
    assert batcher.stats.eager_senders == 3
    batcher.shutdown()


def test_a_sender_gone_idle_is_not_waited_for(store):
    batcher = Batcher(store, max_delay_s=0.01, eager_max_delay_s=120, sender_idle_s=0.5)
    _senders_known(store, batcher, ["a", "b", "c"])
    tickets = [batcher.submit(_rw(store, i), eager=True, sender=s) for i, s in enumerate("ab")]
    # c stays away: forgotten sender_idle_s after its last request, then a and b go (not 120 s).
    assert [t.answer().result(timeout=60) for t in tickets] == [True, True]
    batcher.shutdown()


def test_tracked_senders_wait_at_most_the_eager_delay(store):
    batcher = Batcher(store, max_delay_s=0.01, eager_max_delay_s=0.5, sender_idle_s=120)
    _senders_known(store, batcher, ["a", "b", "c"])
    started = time.monotonic()
    tickets = [batcher.submit(_rw(store, i), eager=True, sender=s) for i, s in enumerate("ab")]
    assert [t.answer().result(timeout=60) for t in tickets] == [True, True]
    assert time.monotonic() - started < 60  # not sender_idle_s
    batcher.shutdown()


def test_an_agent_batch_beside_tracked_senders_keeps_its_delay(store):
    """Agent batches keep max_delay_s however long the remote_write senders' groups may wait."""
    batcher = Batcher(store, max_delay_s=0.2, eager_max_delay_s=120, sender_idle_s=120)
    _senders_known(store, batcher, ["a", "b"])
    waiting = batcher.submit(_rw(store, 1), eager=True, sender="a")
    agent = batcher.submit(_rows(store, 7))
    assert agent.answer().result(timeout=60) is True
    assert waiting.answer().result(timeout=60) is True  # it went with the agent's group
    batcher.shutdown()


def test_unrecorded_batches_skip_the_batches_table(store, monkeypatch):
    """remote_write's fresh ids (record=False): no batches_seen query and no batches rows; agents' still get both."""
    asked: list[list[str]] = []
    seen = store.batches_seen
    monkeypatch.setattr(store, "batches_seen", lambda ids: asked.append(list(ids)) or seen(ids))
    b = SampleBuilder()
    b.add({"__name__": "rw", "k": "1"}, NOW_MS, 1.0)
    unrecorded = [store.prepare(f"rw:{i}", samples=b.build(), record=False) for i in range(3)]
    batcher = Batcher(store)
    tickets = [batcher.submit(p, eager=True) for p in unrecorded]
    batcher.shutdown()
    assert [t.outcome for t in tickets] == [True] * 3
    assert asked == []
    assert _counts(store) == {"s": 3, "k": 0, "b": 0}
    batcher = Batcher(store)
    tickets = [
        batcher.submit(store.prepare("rw:9", samples=b.build(), record=False)),
        batcher.submit(_rows(store, 7)),
    ]
    batcher.shutdown()
    assert [t.outcome for t in tickets] == [True, True]
    assert asked == [["agent:7"]]
    assert _counts(store) == {"s": 9, "k": 5, "b": 1}
