"""A JSON document of secret records in a file of mode 0600, shared by processes.

The agent key store and the API token store keep the same kind of file: writers
(``ki keys``, ``ki tokens``, the admin API) take an exclusive lock and replace the
file atomically; a running collector notices the change on its next lookup, so a
revocation takes effect within a second, without a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["RELOAD_CHECK_S", "PrivateJsonFile", "write_private"]

#: A reader looks at the file's inode, mtime and size at most this often.
RELOAD_CHECK_S = 0.5

K = TypeVar("K")


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte on, replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class PrivateJsonFile(Generic[K]):
    """``{"version": N, "<field>": [record, ...]}`` in a 0600 file, as records keyed by ``key``.

    Errors name the file and the problem (``what`` says which store it is) and never
    quote the content, which holds secrets.
    """

    def __init__(
        self,
        path: Path,
        *,
        what: str,
        field: str,
        version: int,
        key: Callable[[dict[str, Any]], K],
        error: type[Exception],
    ) -> None:
        self.path = Path(path)
        self._what, self._field, self._version, self._key, self._error = what, field, version, key, error
        self.records: dict[K, dict[str, Any]] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.reload()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reload(self) -> None:
        """Read the file again (an absent file is an empty store)."""
        stamp = self._file_stamp()
        if stamp is None:
            self.records, self._stamp = {}, None
            return
        mode = stat.S_IMODE(self.path.stat().st_mode)
        if mode & 0o077:
            raise self._error(
                f"{self._what} {self.path} is readable by others (mode {mode:04o}): chmod 600 it"
            )
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("version") != self._version:
                raise self._error(
                    f"{self._what} {self.path}: unsupported format version {doc.get('version')!r}"
                )
            records = {self._key(r): r for r in doc[self._field]}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._error(f"{self._what} {self.path} is corrupt ({type(exc).__name__})") from None
        self.records, self._stamp = records, stamp

    def current(self) -> dict[K, dict[str, Any]]:
        """The records, reloaded if the file changed since the last look (looked at every RELOAD_CHECK_S)."""
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            if self._file_stamp() != self._stamp:
                self.reload()
        return self.records

    @contextlib.contextmanager
    def editing(self, lock: threading.Lock) -> Iterator[dict[K, dict[str, Any]]]:
        """Lock the file against other writers (and ``lock`` against this process's threads),
        reload, let the caller edit the records in place, write them back atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with lock:
                self.reload()
                yield self.records
                doc = {"version": self._version, self._field: list(self.records.values())}
                write_private(self.path, json.dumps(doc, indent=1).encode())
                self._stamp = self._file_stamp()
        finally:
            os.close(fd)
