"""Exactly once across a crash inside a group commit (collector/ingest_wal.py, docs/storage.md,
"Exactly once"): a group's write-ahead file is replayed with the group's own token at the next
start, so rows that had landed are not stored again by the agents' retries; a file that does
not read back whole is set aside, never replayed nor crashed on; a full disk is a 503."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from support.collector import start_collector, stop_collector
from support.wire_corpus import kernel_stream
from test_batcher import _counts, _rows

from kernel_insight.collector import wire
from kernel_insight.collector.batcher import Batcher
from kernel_insight.collector.clickhouse.ingest_groups import TEST_KILL_AFTER_TABLE_ENV
from kernel_insight.collector.clickhouse.store import EmbeddedStore, StorageError, StorageUnavailable
from kernel_insight.collector.ingest_wal import IngestWal
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.rows import SampleBuilder

SPANS_PER_BATCH = 200
KERNEL_NAMES = {(1, k): f"kernel_{k}" for k in range(1, 6)}


def _frame(creds, seq: int, now_ns: int) -> bytes:
    arr = kernel_stream(
        np.random.default_rng(seq * 1000 + creds.agent_id[0]), SPANS_PER_BATCH, now_ns + seq * 10**9
    )
    return wire.encode_batch(
        arr,
        agent_id=creds.agent_id,
        key_id=creds.key_id,
        key=creds.key,
        epoch=1,
        seq=seq,
        strings=KERNEL_NAMES,
        counters={int(wire.Counter.RING_DROPPED): 0},
    )


def _post(client: httpx.Client, url: str, frame: bytes) -> int | None:
    try:
        return client.post(
            url + wire.INGEST_PATH, content=frame, headers={"Content-Type": wire.CONTENT_TYPE}
        ).status_code
    except httpx.HTTPError:
        return None  # the collector died under the request: the agent retries it


def test_a_collector_killed_between_a_groups_tables_and_its_batches_rows_stores_every_batch_once(
    tmp_path, monkeypatch
):
    """The collector SIGKILLs itself (a test hook) right after a group's kernel_spans landed and
    before its batches rows; restarted, it replays the group, and every batch the agents resend
    (one by one: new groups, new tokens) is answered 409 or stored, never stored twice."""
    keys = KeyStore(tmp_path / "keys.json")
    agents = [keys.add_agent(f"host-{i}/gpu0") for i in range(4)]
    now_ns = time.time_ns() - 600 * 10**9
    frames: list[bytes] = []
    monkeypatch.setenv(TEST_KILL_AFTER_TABLE_ENV, "kernel_spans")
    proc, url = start_collector(tmp_path)
    monkeypatch.delenv(TEST_KILL_AFTER_TABLE_ENV)
    try:
        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(len(agents)) as pool:
            deadline = time.monotonic() + 120
            seq = 0
            # Rounds of one batch per agent at once: a group of two or more is written (and killed) soon.
            while proc.poll() is None and time.monotonic() < deadline:
                round_frames = [_frame(a, seq, now_ns) for a in agents]
                frames += round_frames
                list(pool.map(lambda f: _post(client, url, f), round_frames))
                seq += 1
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, (tmp_path / "collector.err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    wal_dir = tmp_path / "data" / "ingest-wal"
    left = list(wal_dir.glob("*.wal"))
    assert len(left) == 1  # the group the kill cut short
    assert IngestWal.read(left[0]).token.startswith("group:")

    proc, url = start_collector(tmp_path)
    try:
        assert list(wal_dir.glob("*.wal")) == []  # replayed before ingest was served
        assert "replayed group" in (tmp_path / "collector.err").read_text()
        with httpx.Client(timeout=60) as client:
            # The agents resend in order, each batch alone (a group of one, under its own id).
            codes = [_post(client, url, f) for f in frames]
        assert set(codes) <= {200, 409}, codes
        assert codes.count(409) >= 2  # the replayed group's batches at least
    finally:
        stop_collector(proc)
    with EmbeddedStore(tmp_path / "data", cache_bytes=0) as store:
        got = {
            "spans": store.row_count("kernel_spans"),
            "batches": store.row_count("batches"),
            "ids": store.distinct_count("batches", "batch_id"),
        }
    assert got == {"spans": SPANS_PER_BATCH * len(frames), "batches": len(frames), "ids": len(frames)}


def test_a_group_cut_short_is_replayed_once_at_open_and_its_retries_are_duplicates(tmp_path):
    """In process: a group's file written, one table landed, the process gone (the store closed
    without its batches rows); the next open stores the rest and the batch ids."""
    wal_dir = tmp_path / "wal"
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
        group = [_rows(store, 1), _rows(store, 2)]
        path = store.log_group(group, "group:cut", set())
        assert path is not None
        assert path.exists()
        # The group's samples landed (as insert_prepared writes them: both batches' chunks, its token).
        landed = pa.concat_tables([g.tables["samples"] for g in group])
        store.insert_table("samples", landed, dedup_token="group:cut:samples")
        store.insert_table("samples", group[1].tables["samples"], dedup_token="other")  # not the group's
        assert _counts(store) == {"s": 15, "k": 0, "b": 0}
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
        assert not path.exists()
        # The landed samples were dropped by their token, the spans and the batch ids stored.
        assert _counts(store) == {"s": 15, "k": 10, "b": 2}
        batcher = Batcher(store, max_delay_s=0.01)
        batcher.start()
        answers = [batcher.submit(_rows(store, i)).answer() for i in (1, 2)]  # the agents' retries
        assert [a.result(timeout=30) for a in answers] == [False, False]
        batcher.shutdown()
        assert batcher.stats.duplicates == 2
        assert _counts(store) == {"s": 15, "k": 10, "b": 2}


def test_a_written_group_leaves_no_file_and_remote_write_writes_none(tmp_path):
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=tmp_path / "wal") as store:
        wal = store.ingest_wal
        assert wal is not None
        batcher = Batcher(store, max_delay_s=0.05)
        batcher.start()
        tickets = [batcher.submit(_rows(store, i)) for i in range(3)]
        assert [t.answer().result(timeout=30) for t in tickets] == [True] * 3
        assert wal.files_written >= 1
        assert wal.bytes_written > 0
        assert batcher.stats.wal_files == wal.files_written  # /metrics' ki_collector_batcher_wal_*
        assert batcher.stats.wal_bytes == wal.bytes_written
        assert batcher.stats.wal_cpu_seconds > 0
        written = wal.files_written
        b = SampleBuilder()
        b.add({"__name__": "rw"}, 1_700_000_000_000, 1.0)
        rw = store.prepare("rw:1", samples=b.build(), record=False)
        assert batcher.submit(rw, eager=True).answer().result(timeout=30) is True
        batcher.shutdown()
        assert wal.files_written == written  # no batches row, nothing to deduplicate: no file
        assert list((tmp_path / "wal").iterdir()) == []


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "not_ours"])
def test_a_damaged_file_is_set_aside_loudly_and_the_store_opens(tmp_path, caplog, damage):
    wal_dir = tmp_path / "wal"
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
        path = store.log_group([_rows(store, 1), _rows(store, 2)], "group:bad", set())
    assert path is not None
    data = path.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data = data[:100] + bytes([data[100] ^ 0x40]) + data[101:]
    elif damage == "empty":
        data = b""
    else:
        data = b"PK\x03\x04 something else entirely"
    path.write_bytes(data)
    with caplog.at_level(logging.ERROR, "kernel_insight.collector.ingest_wal"):
        for _ in range(2):  # and again: never a crash loop, the file is not read twice
            with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
                assert _counts(store) == {"s": 0, "k": 0, "b": 0}
    assert not path.exists()
    assert path.with_suffix(".bad").read_bytes() == data
    assert sum("set aside" in r.getMessage() for r in caplog.records) == 1


def test_a_group_whose_batches_are_stored_is_dropped_and_one_stored_in_part_set_aside(tmp_path, caplog):
    wal_dir = tmp_path / "wal"
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
        finished = store.log_group([_rows(store, 1), _rows(store, 2)], "group:done", set())
        store.insert_prepared([_rows(store, 1), _rows(store, 2)], "group:done")
        crossed = store.log_group([_rows(store, 3), _rows(store, 4)], "group:crossed", set())
        store.insert_prepared([_rows(store, 3)], "agent:3")  # batch 3 stored by another group
    assert finished is not None
    assert crossed is not None
    with (
        caplog.at_level(logging.ERROR, "kernel_insight.collector.ingest_wal"),
        EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store,
    ):
        assert _counts(store) == {"s": 15, "k": 15, "b": 3}
    assert not finished.exists()
    assert not finished.with_suffix(".bad").exists()
    assert crossed.with_suffix(".bad").exists()
    assert "1 of its 2 batches are stored already" in caplog.text


@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> object:
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode:
        pytest.skip(
            f"needs a small tmpfs for a full disk and cannot mount one: {done.stderr.decode().strip()}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_is_a_503_with_nothing_written_and_the_group_goes_in_once_space_is_back(tmp_path):
    with _small_disk(tmp_path / "small", "256k") as small:
        wal_dir = small / "wal"
        with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=wal_dir) as store:
            ballast = small / "ballast"
            with ballast.open("wb") as f, contextlib.suppress(OSError):
                f.write(b"\0" * (1 << 20))  # as much as fits
            batcher = Batcher(store, max_delay_s=0.01, retry_min_s=0.2, retry_max_s=0.2)
            batcher.start()
            first = batcher.submit(_rows(store, 1)).answer()
            with pytest.raises(StorageUnavailable, match="write-ahead"):
                first.result(timeout=30)
            assert _counts(store) == {"s": 0, "k": 0, "b": 0}  # nothing inserted before the file
            assert [p.name for p in wal_dir.iterdir()] == []  # no half-written file left
            ballast.unlink()
            queued = batcher.pending("agent:1")
            assert queued is not None
            assert queued.answer().result(timeout=30) is True
            batcher.shutdown()
            assert _counts(store) == {"s": 5, "k": 5, "b": 1}
            assert os.listdir(wal_dir) == []


def test_a_write_ahead_directory_that_cannot_be_made_stops_the_start_naming_the_flag(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--port", "0", "--store", str(tmp_path / "data"),
         "--ingest-wal", "/proc/ki-ingest-wal"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "/proc/ki-ingest-wal" in done.stderr
    assert "--ingest-wal DIR" in done.stderr


def test_a_split_group_logs_its_parts_and_leaves_no_file(tmp_path, monkeypatch):
    """One batch refused by the engine: the group's parts are written one by one, each with a
    file of its own written before the group's is removed; when all is done no file is left."""
    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=tmp_path / "wal") as store:
        real = store._insert

        def refusing(name, data, token):  # the engine refusing batch 1's samples (and so the group's)
            if name == "samples" and (token.startswith("group:") or token.startswith("agent:1:")):
                raise StorageError("refused")
            return real(name, data, token)

        monkeypatch.setattr(store, "_insert", refusing)
        batcher = Batcher(store, max_delay_s=10)
        tickets = [batcher.submit(_rows(store, i)) for i in range(3)]
        batcher.shutdown()  # never started: shutdown writes what is queued
        assert [t.outcome is True for t in tickets] == [True, False, True]
        assert batcher.stats.wal_files == 4  # the group's, then one per part
        assert _counts(store) == {"s": 10, "k": 10, "b": 2}
    assert list((tmp_path / "wal").iterdir()) == []
