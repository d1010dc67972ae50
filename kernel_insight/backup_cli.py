"""``ki backup`` and ``ki restore``: the embedded store with its keys and tokens (docs/backup.md)."""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from kernel_insight.collector.backup import (
    KEYS_FILE,
    MANIFEST,
    TOKENS_FILE,
    BackupError,
    Manifest,
    frozen,
    read_manifest,
    restore,
    write_backup,
)

__all__ = ["add_commands"]


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "backup",
        help="copy the embedded store, agent keys and tokens to a new directory, consistently, while the collector runs",
    )
    b.add_argument("dest", metavar="DEST", help="directory to create (must not exist or be empty)")
    b.add_argument(
        "--collector",
        metavar="URL",
        help="a running collector (e.g. http://127.0.0.1:8470): it freezes its store and streams the backup",
    )
    b.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding a bearer token with the admin scope for --collector (default: $KI_TOKEN)",
    )
    b.add_argument(
        "--store",
        metavar="DIR",
        help="the data directory, with no collector running (default ./ki-data, as ki collector)",
    )
    b.add_argument(
        "--keys", metavar="FILE", help="with --store: the agent key store (default ki-data/keys.json)"
    )
    b.add_argument(
        "--tokens", metavar="FILE", help="with --store: the token store (default ki-data/tokens.json)"
    )
    b.set_defaults(handler=_backup)
    r = sub.add_parser("restore", help="restore a backup made by ki backup into an empty data directory")
    r.add_argument("src", metavar="SRC", help="a directory written by ki backup")
    r.add_argument(
        "--store", metavar="DIR", required=True, help="the data directory to create (must be empty)"
    )
    r.add_argument("--keys", metavar="FILE", help="where the agent key store goes (must not exist)")
    r.add_argument("--tokens", metavar="FILE", help="where the token store goes (must not exist)")
    r.add_argument(
        "--ingest-wal",
        metavar="DIR",
        help="where the groups of agent batches the backup cut go, replayed by the collector's first start "
        "(default: ingest-wal in --store, as ki collector; give the collector's --ingest-wal if it has one)",
    )
    r.set_defaults(handler=_restore)


def _say(what: str, where: Path, m: Manifest, took_s: float) -> None:
    rows = sum(t.rows for t in m.tables)
    size = sum(f.stat().st_size for f in where.rglob("*") if f.is_file())
    extra = f", {', '.join(m.files)}" if m.files else ""
    if m.ingest_wal:
        extra += f", {len(m.ingest_wal)} group(s) of agent batches cut by the freeze (replayed at the collector's start)"
    print(
        f"ki {what}: {len(m.tables)} tables, {rows:,} rows{extra}; {size / 1e6:,.1f} MB in {where}; {took_s:.1f} s"
    )


def _backup(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    start = time.monotonic()
    try:
        if args.collector:
            if args.store or args.keys or args.tokens:
                raise BackupError(
                    "--collector backs up what that collector serves: --store, --keys, --tokens are for when none runs"
                )
            manifest = _from_collector(args.collector, _admin_token(args), dest)
        else:
            from kernel_insight.api.cli import token_store_path
            from kernel_insight.collector.clickhouse.store import EmbeddedStore, StorageError
            from kernel_insight.collector.defaults import EMBEDDED_INGEST_WAL
            from kernel_insight.collector.keys import DEFAULT_STORE as DEFAULT_KEYS

            files = {KEYS_FILE: Path(args.keys or DEFAULT_KEYS), TOKENS_FILE: token_store_path(args.tokens)}
            data = Path(args.store or "./ki-data")
            # Groups a stopped collector left in its write-ahead files are stored first, as its
            # next start would store them: the backup then holds them whole.
            wal = data / EMBEDDED_INGEST_WAL
            try:
                store = EmbeddedStore(data, cache_bytes=0, ingest_wal=wal if wal.is_dir() else None)
            except StorageError as exc:
                raise BackupError(f"{exc} (a running collector backs up with --collector URL)") from exc
            try:
                with frozen(store, files) as snap:
                    manifest = write_backup(snap, dest)
            finally:
                store.close()
    except (BackupError, OSError) as exc:
        print(f"ki backup: {exc}", file=sys.stderr)
        return 1
    _say("backup", dest, manifest, time.monotonic() - start)
    return 0


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip() or None
        except OSError as exc:
            raise BackupError(f"cannot read the token file {args.token_file}: {exc.strerror}") from None
    return os.environ.get("KI_TOKEN", "").strip() or None


class _Body:
    """The response body as a file object for ``tarfile``'s stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._it = chunks
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _from_collector(url: str, token: str | None, dest: Path) -> Manifest:
    import httpx

    from kernel_insight.api.backup import BACKUP_PATH

    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"the backup destination {dest} is not an empty directory")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with (
        httpx.Client(timeout=httpx.Timeout(60, read=600)) as client,
        client.stream("GET", url.rstrip("/") + BACKUP_PATH, headers=headers) as r,
    ):
        if r.status_code != 200:
            r.read()
            raise BackupError(f"the collector answered {r.status_code}: {r.text[:300]}")
        with tarfile.open(fileobj=_Body(r.iter_bytes(1 << 20)), mode="r|") as tar:  # type: ignore[call-overload]
            tar.extractall(dest, filter="data")
    for name in (MANIFEST, KEYS_FILE, TOKENS_FILE):
        if (dest / name).exists():
            (dest / name).chmod(0o600)
    return read_manifest(dest)


def _restore(args: argparse.Namespace) -> int:
    start = time.monotonic()
    files = {KEYS_FILE: args.keys, TOKENS_FILE: args.tokens}
    try:
        manifest = restore(
            Path(args.src),
            Path(args.store),
            files_to={k: Path(v) for k, v in files.items() if v},
            ingest_wal=Path(args.ingest_wal) if args.ingest_wal else None,
        )
    except (BackupError, OSError) as exc:
        print(f"ki restore: {exc}", file=sys.stderr)
        return 1
    _say("restore", Path(args.store), manifest, time.monotonic() - start)
    left = [name for name in manifest.files if not files.get(name)]
    if left:
        print(f"ki restore: {', '.join(left)} left in {args.src} (give --keys/--tokens to put them in place)")
    return 0
