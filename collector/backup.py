"""Backups of the embedded store: every table's parts frozen at one moment (``ALTER TABLE ...
FREEZE``: hard links, no copy), with the agent key store and the token store, and restores of
such a backup into an empty data directory by attaching the parts (docs/backup.md).

A group of agent batches being written when the tables freeze has landed in some tables and not
in others; the backup keeps what it has left to write as a write-ahead file
(``ingest-wal/<file>``, collector/ingest_wal.py) that the restored store replays at its first
open, so each batch of the group is whole there, once.

A backup is a directory: ``manifest.json`` (tables, their ``CREATE`` statements, parts and
rows), ``tables/<table>/<part>/...``, the key and token files as they were, and
``ingest-wal/*.wal`` for the groups cut by the freeze. ``ki collector``
serves one as a tar stream (``GET /api/v1/admin/backup``, scope ``admin``) that ``ki backup``
unpacks; with no collector running ``ki backup --store DIR`` reads the directory itself.

Example::

    with frozen(store, {"keys.json": keys_path}) as snap:
        write_backup(snap, Path("/backups/2026-12-07"))
    restore(Path("/backups/2026-12-07"), Path("/var/lib/ki/data"))
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernel_insight.collector.clickhouse.freeze import (
    create_statement_prefix,
    freeze_table,
    mergetree_tables,
    part_rows,
    restore_attach_part,
    restore_count,
    restore_create_database,
    restore_data_path,
)
from kernel_insight.collector.defaults import EMBEDDED_INGEST_WAL

__all__ = [
    "BACKUP_FORMAT",
    "KEYS_FILE",
    "MANIFEST",
    "TOKENS_FILE",
    "BackupError",
    "Manifest",
    "Snapshot",
    "TableBackup",
    "frozen",
    "read_manifest",
    "restore",
    "tar_chunks",
    "write_backup",
]

#: The layout version of a backup directory. 2 added ``ingest-wal/``: a version that reads
#: only 1 refuses it rather than restore without the groups the freeze cut.
BACKUP_FORMAT = 2
#: The layout versions ``restore`` reads.
READABLE_FORMATS = (1, 2)
#: Where a backup keeps the groups the freeze cut, and where ``restore`` puts them by default.
WAL_DIR = EMBEDDED_INGEST_WAL
#: The file that says what a backup holds.
MANIFEST = "manifest.json"
#: The agent key store's and the token store's names in a backup.
KEYS_FILE, TOKENS_FILE = "keys.json", "tokens.json"
#: Freeze names this module gives (``shadow/<name>`` in the data directory), so stale ones can go.
_FREEZE_PREFIX = "ki_backup_"  # a plain name: the engine escapes others in its path
#: Bytes read from a file at a time when streaming a backup.
_CHUNK = 1 << 20
#: Names a backup's files may have (a table, a part, a file of a part): nothing that climbs out.
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


class BackupError(Exception):
    """A backup that cannot be made or restored: the message says why."""


@dataclass(frozen=True, slots=True)
class TableBackup:
    """One table of a backup: how to create it, and its parts with their rows."""

    name: str
    create: str
    parts: dict[str, int]  # part name -> rows

    @property
    def rows(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a backup holds (``manifest.json``)."""

    database: str
    tables: list[TableBackup]
    files: list[str] = field(default_factory=list)  # key and token files beside the tables
    ingest_wal: list[str] = field(default_factory=list)  # files under ingest-wal/: groups cut by the freeze
    created: float = 0.0
    version: str = ""
    format: int = BACKUP_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Manifest:
        raw = json.loads(text)
        if raw.get("format") not in READABLE_FORMATS:
            raise BackupError(
                f"backup format {raw.get('format')!r} is not one of {READABLE_FORMATS}: made by another version"
            )
        tables = [
            TableBackup(t["name"], t["create"], {str(k): int(v) for k, v in t["parts"].items()})
            for t in raw["tables"]
        ]
        files = [str(f) for f in raw.get("files", [])]
        wal = [str(f) for f in raw.get("ingest_wal", [])]
        names = [str(raw["database"]), *(t.name for t in tables), *(p for t in tables for p in t.parts)]
        for name in [*names, *files, *wal]:
            if not _SAFE.match(name) or name in (".", ".."):
                raise BackupError(f"backup manifest names {name!r}: not a plain file name")
        for t in tables:  # statements that create the table named (the engine runs one statement a query)
            if not t.create.startswith(create_statement_prefix(raw["database"], t.name)):
                raise BackupError(f"backup manifest: the statement for table {t.name} does not create it")
        return Manifest(
            raw["database"],
            tables,
            files,
            wal,
            float(raw["created"]),
            str(raw["version"]),
            int(raw["format"]),
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A frozen store: the manifest, and for each file of the backup where it lies now."""

    manifest: Manifest
    files: dict[str, Path]  # path inside the backup -> path on disk

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kernel-insight")
    except Exception:  # not installed as a distribution (a source tree)
        return "unknown"


@contextlib.contextmanager
def frozen(store: Any, extra: Mapping[str, Path] | None = None) -> Iterator[Snapshot]:
    """Freeze every table of ``store`` (an ``EmbeddedStore``) at one moment, with writes held
    between inserts; yields the :class:`Snapshot`; the frozen links are removed on exit.

    ``extra``: files stored beside the tables under the given names (the key and token stores),
    read once the tables are frozen (each is replaced whole when it changes, never edited).
    The groups of agent batches the freeze cut are kept as what each has left to write
    (``Store.ingest_groups_in_flight``), read while writes are held.
    """
    shadow = Path(store.path) / "shadow"
    for stale in shadow.glob(_FREEZE_PREFIX + "*"):  # a backup cut off before it cleaned up
        shutil.rmtree(stale, ignore_errors=True)
    name = f"{_FREEZE_PREFIX}{uuid.uuid4().hex}"
    rows = mergetree_tables(store)
    tables: list[TableBackup] = []
    files: dict[str, Path] = {}
    counts: dict[str, dict[str, int]] = {}
    wal_names: list[str] = []
    try:
        with store.writes_held():
            if store.ingest_wal is not None:
                from kernel_insight.collector.ingest_wal import IngestWal  # pyarrow: not for ki's help

                cut = IngestWal(shadow / name / WAL_DIR)
                for group in store.ingest_groups_in_flight():
                    path = cut.write(group.token, group.tables)
                    files[f"{WAL_DIR}/{path.name}"] = path
                    wal_names.append(path.name)
            for row in rows:
                table = str(row["name"])
                freeze_table(store, table, name)
                # Each part's rows, now: a part merged away stays listed for old_parts_lifetime only.
                counts[table] = part_rows(store, table)
        for row in rows:
            table = str(row["name"])
            where = shadow / name / Path(row["paths"][0]).relative_to(Path(store.path).resolve())
            parts = sorted(d.name for d in where.iterdir() if d.is_dir()) if where.is_dir() else []
            missing = [part for part in parts if part not in counts[table]]
            if missing:
                raise BackupError(f"table {table}: frozen parts {missing[:3]} are unknown to the engine")
            tables.append(TableBackup(table, str(row["q"]), {part: counts[table][part] for part in parts}))
            for part in parts:
                for f in sorted((where / part).rglob("*")):
                    if f.is_file():
                        files[f"tables/{table}/{part}/{f.relative_to(where / part).as_posix()}"] = f
        extras = dict(extra or {})
        for arcname, path in extras.items():
            if path.exists():
                files[arcname] = path
        manifest = Manifest(
            store.database,
            tables,
            sorted(k for k, v in extras.items() if v.exists()),
            sorted(wal_names),
            time.time(),
            _version(),
        )
        yield Snapshot(manifest, files)
    finally:
        shutil.rmtree(shadow / name, ignore_errors=True)


def write_backup(snap: Snapshot, dest: Path) -> Manifest:
    """Copy ``snap`` into ``dest`` (created; must be empty); the manifest is written last."""
    _empty_dir(dest, "backup destination")
    for arcname, path in snap.files.items():
        target = dest / arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        if arcname in snap.manifest.files:
            target.chmod(0o600)  # keys and tokens: the owner's only
    _write_private(dest / MANIFEST, snap.manifest.to_json())
    return snap.manifest


def tar_chunks(snap: Snapshot) -> Iterator[bytes]:
    """``snap`` as an uncompressed tar stream (manifest last), a file read ``_CHUNK`` at a time."""
    for arcname, path in snap.files.items():
        size = path.stat().st_size
        yield _tar_head(arcname, size, 0o600 if arcname in snap.manifest.files else 0o644)
        sent = 0
        with path.open("rb") as f:
            while sent < size and (chunk := f.read(min(_CHUNK, size - sent))):
                sent += len(chunk)
                yield chunk
        if sent != size:  # parts never change once written: a short read is a broken store
            raise BackupError(f"{path} changed size while it was read ({sent} of {size} bytes)")
        yield _tar_pad(size)
    body = snap.manifest.to_json().encode()
    yield _tar_head(MANIFEST, len(body), 0o600) + body + _tar_pad(len(body))
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def _tar_head(name: str, size: int, mode: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(time.time())
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _tar_pad(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def read_manifest(src: Path) -> Manifest:
    try:
        return Manifest.from_json((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{src} holds no {MANIFEST}: not a finished backup") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise BackupError(f"{src / MANIFEST} is not a backup manifest: {exc}") from exc


def restore(
    src: Path,
    data_dir: Path,
    *,
    files_to: Mapping[str, Path] | None = None,
    ingest_wal: Path | None = None,
) -> Manifest:
    """Restore the backup at ``src`` into ``data_dir`` (created; must be empty): the tables are
    created as they were and their parts attached, then each table's rows are counted against
    the manifest. ``files_to`` says where each of the backup's files (keys, tokens) goes; those
    not named are left in the backup. The groups the backup's freeze cut go to ``ingest_wal``
    (default ``ingest-wal`` in ``data_dir``, where ``ki collector`` looks), which must hold no
    file: the collector's first start replays them. The store opens as usual afterwards
    (missing tables and columns of a newer version are added then)."""
    from chdb import session as chdb_session

    manifest = read_manifest(src)
    for target in (files_to or {}).values():
        if target.exists():
            raise BackupError(f"{target} exists: restore writes keys and tokens only where there are none")
    wal_to = ingest_wal if ingest_wal is not None else data_dir / WAL_DIR
    if manifest.ingest_wal and wal_to.is_dir() and any(wal_to.iterdir()):
        raise BackupError(
            f"{wal_to} holds files: restore writes the groups the backup cut only into an empty one"
        )
    _empty_dir(data_dir, "data directory")
    data_dir.chmod(0o700)
    session_cls: Any = chdb_session.Session  # chDB ships no types
    session = session_cls(str(data_dir))
    try:
        restore_create_database(session, manifest.database)
        for t in manifest.tables:
            session.query(t.create)
            detached = Path(restore_data_path(session, manifest.database, t.name)) / "detached"
            for part in t.parts:
                shutil.copytree(src / "tables" / t.name / part, detached / part)
                restore_attach_part(session, manifest.database, t.name, part)
            got = restore_count(session, manifest.database, t.name)
            if got != t.rows:
                raise BackupError(f"table {t.name}: {got} rows restored, the backup holds {t.rows}")
    finally:
        session.close()
    for name, target in (files_to or {}).items():
        if name in manifest.files:
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_private(target, (src / name).read_text())
    if manifest.ingest_wal:
        wal_to.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in manifest.ingest_wal:
            shutil.copyfile(src / WAL_DIR / name, wal_to / name)
    return manifest


def _empty_dir(path: Path, what: str) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"the {what} {path} is not an empty directory")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
