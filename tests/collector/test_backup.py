"""``ki backup`` of a running collector's embedded store while remote_write keeps writing, and
``ki restore`` into an empty data directory: every sample acknowledged before the backup began
is restored, nothing the original lacks, and the keys and tokens come back as they were."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest
from support.collector import running_collector

from kernel_insight.collector.backup import (
    KEYS_FILE,
    MANIFEST,
    TOKENS_FILE,
    BackupError,
    read_manifest,
    restore,
)
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.kql.storage import Matcher

BODY_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
T0 = 1_800_000_000_000  # ms: samples at T0 + i s, the writer's i-th request


def _ki(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _samples(store: EmbeddedStore) -> set[tuple[int, float]]:
    series = store.storage().select([Matcher("job", "=", "backup")], T0, T0 + 10**9)
    return {(int(t), float(v)) for s in series for t, v in zip(s.timestamps, s.values, strict=True)}


class _Writer(threading.Thread):
    """remote_write one sample per request (``n`` at ``T0 + n`` s) until stopped; ``acked``: the
    sample numbers answered 204, with when."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.stop = threading.Event()
        self.acked: list[tuple[int, float]] = []

    def run(self) -> None:
        headers = {**BODY_HEADERS, "Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self.stop.is_set():
                body = encode_write_request(
                    [({"__name__": "bk", "job": "backup"}, [(T0 + n * 1000, float(n))])]
                )
                if client.post("/api/v1/write", content=body, headers=headers).status_code == 204:
                    self.acked.append((n, time.monotonic()))
                n += 1
                time.sleep(0.02)


def test_a_backup_taken_while_writes_go_on_restores_every_acknowledged_sample_keys_and_tokens(tmp_path):
    dest, restored = tmp_path / "backup", tmp_path / "restored"
    with running_collector(tmp_path) as c:
        admin = tmp_path / "admin.token"
        admin.write_text(c.admin_token)
        writer = _Writer(c.url, c.ingest_token)
        writer.start()
        try:
            deadline = time.monotonic() + 60
            while len(writer.acked) < 50:
                assert time.monotonic() < deadline, "remote_write did not get going"
                time.sleep(0.05)
            began = time.monotonic()
            done = _ki("backup", str(dest), "--collector", c.url, "--token-file", str(admin))
            assert done.returncode == 0, done.stderr
            assert "tables" in done.stdout
            ended = time.monotonic()
            while not any(t > ended for _, t in writer.acked):  # writes went on after the backup
                time.sleep(0.05)
        finally:
            writer.stop.set()
            writer.join(30)
        denied = httpx.get(
            c.url + "/api/v1/admin/backup", headers={"Authorization": f"Bearer {c.read_token}"}
        )
        assert denied.status_code == 403
    before = {(T0 + n * 1000, float(n)) for n, t in writer.acked if t < began}
    manifest = read_manifest(dest)
    assert {t.name for t in manifest.tables} >= {"samples", "series"}
    assert sorted(manifest.files) == [KEYS_FILE, TOKENS_FILE]
    assert (dest / KEYS_FILE).stat().st_mode & 0o077 == 0
    assert not list((tmp_path / "data" / "shadow").glob("ki-backup-*"))  # the frozen links are gone

    keys, tokens = tmp_path / "restored-keys.json", tmp_path / "restored-tokens.json"
    done = _ki("restore", str(dest), "--store", str(restored), "--keys", str(keys), "--tokens", str(tokens))
    assert done.returncode == 0, done.stderr
    assert keys.read_bytes() == (tmp_path / "keys.json").read_bytes()
    assert tokens.read_bytes() == (tmp_path / "tokens.json").read_bytes()

    back = EmbeddedStore(restored)
    try:
        got = _samples(back)
        rows = {
            t.name: int(back.query(f"SELECT count() AS n FROM ki.{t.name}").column("n")[0].as_py())
            for t in manifest.tables
        }
    finally:
        back.close()
    original = EmbeddedStore(tmp_path / "data")
    try:
        kept = _samples(original)
    finally:
        original.close()
    assert before <= got, f"{len(before - got)} samples acknowledged before the backup are missing"
    assert got <= kept  # nothing the original lacks
    assert len(kept) > len(got)  # writes after the backup are not in it
    assert rows == {t.name: t.rows for t in manifest.tables}


def test_restore_refuses_a_data_directory_in_use_and_backup_a_destination_with_files(tmp_path):
    EmbeddedStore(tmp_path / "data").close()  # a store with tables and no rows backs up too
    (tmp_path / "keys.json").write_text("{}")
    done = _ki(
        "backup",
        str(tmp_path / "b"),
        "--store",
        str(tmp_path / "data"),
        "--keys",
        str(tmp_path / "keys.json"),
        "--tokens",
        str(tmp_path / "none.json"),
    )
    assert done.returncode == 0, done.stderr
    assert read_manifest(tmp_path / "b").files == [KEYS_FILE]
    again = _ki("backup", str(tmp_path / "b"), "--store", str(tmp_path / "data"))
    assert again.returncode == 1
    assert "not an empty directory" in again.stderr
    with pytest.raises(BackupError, match="not an empty directory"):
        restore(tmp_path / "b", tmp_path / "data")
    (tmp_path / "b" / MANIFEST).unlink()
    with pytest.raises(BackupError, match="not a finished backup"):
        restore(tmp_path / "b", tmp_path / "fresh")


def test_a_manifest_naming_a_path_outside_the_backup_is_refused(tmp_path):
    (tmp_path / MANIFEST).write_text(
        '{"format": 1, "database": "ki", "created": 0, "version": "x", "files": [],'
        ' "tables": [{"name": "samples", "create": "CREATE TABLE ki.samples (a UInt8) ENGINE = MergeTree ORDER BY a",'
        ' "parts": {"../../etc": 1}}]}'
    )
    with pytest.raises(BackupError, match="not a plain file name"):
        restore(tmp_path, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_a_group_cut_by_the_freeze_is_restored_whole_once(tmp_path, monkeypatch):
    """A group of agent batches whose samples had landed and whose spans and batch ids had not
    when the tables froze: the backup keeps what the group had left to write, the restored
    store replays it at open (spans and batch ids stored, the samples not again), and the
    agents' retries against the restored store are duplicates. Without the kept group the
    restore held the samples alone, and the retries stored them a second time."""
    from test_batcher import _counts, _rows

    from kernel_insight.collector.backup import WAL_DIR, frozen, write_backup
    from kernel_insight.collector.batcher import Batcher
    from kernel_insight.collector.clickhouse.store import StorageUnavailable

    with EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=tmp_path / "wal") as store:
        group, done = [_rows(store, 1), _rows(store, 2)], set()
        path = store.log_group(group, "group:cut", done)
        assert path is not None
        write = store._write

        def cut(name, data, token):  # the store goes away after the samples landed
            if name == "kernel_spans":
                raise StorageUnavailable("the disk went away")
            write(name, data, token)

        monkeypatch.setattr(store, "_write", cut)
        with pytest.raises(StorageUnavailable):
            store.insert_prepared(group, "group:cut", done)
        monkeypatch.setattr(store, "_write", write)
        assert {"series", "samples"} <= done
        assert "kernel_spans" not in done
        assert _counts(store) == {"s": 10, "k": 0, "b": 0}
        with frozen(store) as snap:
            manifest = write_backup(snap, tmp_path / "backup")
        assert path.exists()  # the live group's own file is untouched
    assert len(manifest.ingest_wal) == 1
    assert read_manifest(tmp_path / "backup").ingest_wal == manifest.ingest_wal
    restore(tmp_path / "backup", tmp_path / "restored")
    assert (tmp_path / "restored" / WAL_DIR / manifest.ingest_wal[0]).exists()
    with EmbeddedStore(tmp_path / "restored", cache_bytes=0) as back:
        assert _counts(back) == {"s": 10, "k": 0, "b": 0}  # the frozen tables alone
    with EmbeddedStore(
        tmp_path / "restored", cache_bytes=0, ingest_wal=tmp_path / "restored" / WAL_DIR
    ) as back:  # as ki collector opens it
        assert _counts(back) == {"s": 10, "k": 10, "b": 2}
        assert not list((tmp_path / "restored" / WAL_DIR).iterdir())
        batcher = Batcher(back, max_delay_s=0.01)
        batcher.start()
        answers = [batcher.submit(_rows(back, i)).answer() for i in (1, 2)]  # the agents' retries
        assert [a.result(timeout=30) for a in answers] == [False, False]
        batcher.shutdown()
        assert _counts(back) == {"s": 10, "k": 10, "b": 2}


def test_a_backup_without_groups_in_flight_keeps_no_write_ahead_file_and_old_backups_restore(tmp_path):
    from kernel_insight.collector.backup import frozen, write_backup

    with (
        EmbeddedStore(tmp_path / "d", cache_bytes=0, ingest_wal=tmp_path / "wal") as store,
        frozen(store) as snap,
    ):
        manifest = write_backup(snap, tmp_path / "backup")
    assert manifest.ingest_wal == []
    text = (tmp_path / "backup" / MANIFEST).read_text().replace('"format": 2', '"format": 1')
    (tmp_path / "backup" / MANIFEST).write_text(text)  # as the previous version wrote it
    assert restore(tmp_path / "backup", tmp_path / "restored").format == 1
    (tmp_path / "backup" / MANIFEST).write_text(text.replace('"format": 1', '"format": 3'))
    with pytest.raises(BackupError, match="made by another version"):
        read_manifest(tmp_path / "backup")
