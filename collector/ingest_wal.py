"""Write-ahead files of ingest groups: a group of agent batches is stored exactly once across a crash.

The batcher writes a group with one insert per table under the dedup token ``<token>:<table>``
and the group's ``batches`` rows last (collector/batcher.py). A collector killed between the
first data insert and the ``batches`` rows left tables that had landed; the agents' retries
would form a new group with a new token and store those rows a second time. So before the first
insert of a group that holds recorded batches, the group (its token and the Arrow table of every
table still to write, ``batches`` last) is written here, fsync'd, and removed once the ``batches``
rows landed. A store opened over a directory with files left replays each one with its own token
before ingest is served (``Store.replay_ingest_wal``): the engine drops the tables that had landed
and stores the rest, and the agents' retries then find their batch ids stored (docs/storage.md,
"Exactly once").

One file per group, ``<dir>/<hash of token>.wal``, written as ``.tmp`` and renamed::

    b"KIWAL1\\n"
    [u32 length][utf-8 token]
    per table: [u32 length][utf-8 name][u64 length][an Arrow IPC stream of the table]
    [u32 crc32 of everything above] b"KIWEND\\n"

A file that does not read back whole (truncated, a flipped bit) is refused, never guessed at:
it is renamed ``*.bad`` and logged (``IngestWal.set_aside``) and the store opens without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["IngestWal", "WalCorrupt", "WalGroup"]

log = logging.getLogger("kernel_insight.collector.ingest_wal")

_MAGIC = b"KIWAL1\n"
_END = b"KIWEND\n"
_SUFFIX = ".wal"


class WalCorrupt(ValueError):
    """A write-ahead file that does not read back whole."""


@dataclass
class WalGroup:
    """One group read back: its token and its tables in write order (``batches`` last)."""

    path: Path
    token: str
    tables: dict[str, pa.Table]


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


class IngestWal:
    """The write-ahead files of one collector, in a directory of its own (created, mode 0700)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        #: Files written and bytes in them since this object was made (for benchmarks and tests).
        self.files_written = 0
        self.bytes_written = 0

    def path_of(self, token: str) -> Path:
        return self.dir / (hashlib.blake2b(token.encode(), digest_size=16).hexdigest() + _SUFFIX)

    def write(self, token: str, tables: dict[str, pa.Table]) -> Path:
        """Write one group durably (fsync of the file and the directory) and return its path.

        Raises OSError (a full disk, a read-only directory) with nothing left behind."""
        path = self.path_of(token)
        tmp = path.with_suffix(".tmp")
        name = token.encode()
        crc = 0
        size = 0
        try:
            with open(tmp, "wb") as f:

                def put(data: bytes | pa.Buffer) -> None:
                    nonlocal crc, size
                    f.write(data)
                    crc = zlib.crc32(data, crc)
                    size += len(data)

                put(_MAGIC)
                put(struct.pack("<I", len(name)) + name)
                for table_name, table in tables.items():
                    body = _ipc(table)
                    tn = table_name.encode()
                    put(struct.pack("<I", len(tn)) + tn + struct.pack("<Q", body.size))
                    put(body)
                f.write(struct.pack("<I", crc) + _END)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._sync_dir()
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files_written += 1
        self.bytes_written += size + 4 + len(_END)
        return path

    def remove(self, path: Path) -> None:
        """Forget a group whose ``batches`` rows landed. A file that cannot be removed is only
        logged: replaying it later finds every batch stored and removes it then."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.error(
                "ingest WAL: cannot remove %s (it is replayed and dropped at the next start): %s", path, exc
            )

    def pending(self) -> list[Path]:
        """The files left by an earlier process, oldest first (stale ``.tmp`` files are removed:
        a group whose file was not complete had written nothing)."""
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        return sorted(self.dir.glob("*" + _SUFFIX), key=lambda p: (p.stat().st_mtime_ns, p.name))

    @staticmethod
    def read(path: Path) -> WalGroup:
        """Read one file back whole, or raise WalCorrupt saying what is wrong with it."""
        data = path.read_bytes()
        if not data.startswith(_MAGIC) or not data.endswith(_END) or len(data) < len(_MAGIC) + 8 + len(_END):
            raise WalCorrupt(f"{path}: not a whole ingest WAL file (truncated or not one)")
        body_end = len(data) - len(_END) - 4
        (crc,) = struct.unpack_from("<I", data, body_end)
        if zlib.crc32(memoryview(data)[:body_end]) != crc:
            raise WalCorrupt(f"{path}: checksum mismatch")
        try:
            pos = len(_MAGIC)
            (n,) = struct.unpack_from("<I", data, pos)
            token = data[pos + 4 : pos + 4 + n].decode()
            pos += 4 + n
            tables: dict[str, pa.Table] = {}
            buf = pa.py_buffer(data)
            while pos < body_end:
                (n,) = struct.unpack_from("<I", data, pos)
                name = data[pos + 4 : pos + 4 + n].decode()
                pos += 4 + n
                (size,) = struct.unpack_from("<Q", data, pos)
                pos += 8
                if pos + size > body_end:
                    raise WalCorrupt(f"{path}: table {name!r} runs past the end")
                tables[name] = pa.ipc.open_stream(buf.slice(pos, size)).read_all()
                pos += size
        except (struct.error, UnicodeDecodeError, pa.ArrowException) as exc:
            raise WalCorrupt(f"{path}: {type(exc).__name__}: {exc}") from exc
        if not token:
            raise WalCorrupt(f"{path}: no token")
        return WalGroup(path, token, tables)

    def set_aside(self, path: Path, reason: str) -> Path:
        """Rename a file that cannot be replayed to ``*.bad`` (kept for a person to look at, never
        read again) and log why."""
        bad = path.with_suffix(".bad")
        os.replace(path, bad)
        self._sync_dir()
        log.error("ingest WAL: %s set aside as %s, not replayed: %s", path.name, bad, reason)
        return bad

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
