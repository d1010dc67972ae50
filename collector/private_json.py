"""Secret records (agent keys, API tokens) as JSON documents: in a 0600 file, or in a ClickHouse table.

The agent key store and the API token store are both a ``SecretStore`` over one of these two
record holders; they add only their rules (keys: rotation, retirement, revocation; tokens:
hashing, scopes). In a
file, writers (``ki keys``, ``ki tokens``, the admin API) take an exclusive lock and
replace the file atomically; a running collector notices the change on its next
lookup. In a table (several collectors over one ClickHouse), one row per edit, the
newest version wins, and every process re-reads the table within a bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kernel_insight.collector.clickhouse.sql import is_store_url, qualified
from kernel_insight.collector.clickhouse.versioned import latest_docs, versioned_table_ddl
from kernel_insight.kql.errors import StorageError

if TYPE_CHECKING:
    # Only the ClickHouse-table stores need the store (numpy, pyarrow, chDB): imported when one
    # is opened, so that ``ki keys list`` and ``ki tokens list`` on a file start fast.
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "CLUSTER_REFRESH_S",
    "MISS_REFRESH_S",
    "RELOAD_CHECK_S",
    "PrivateJsonFile",
    "SecretStore",
    "VersionedJsonTable",
    "next_version",
    "opened_secret_store",
    "private_file_problem",
    "read_secret_file",
    "write_private",
]

#: A reader looks at the file's inode, mtime and size at most this often.
RELOAD_CHECK_S = 0.5
#: Longest a collector over a ClickHouse table store serves from its cached copy: the revocation bound.
CLUSTER_REFRESH_S = 1.0
#: Soonest a lookup of an unknown id re-reads the table (floods of unknown ids cost one read per this).
MISS_REFRESH_S = 0.2

K = TypeVar("K")


def private_file_problem(path: Path, what: str) -> str | None:
    """Why ``path`` may not hold a secret (not a plain file, or readable by group or others:
    the docs ask for mode 0600), or None when it may. Raises OSError when it cannot be seen."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):  # a directory's mode would read as "readable by others"
        return f"{what} {path} is not a file"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return f"{what} {path} is readable by others (mode {mode:04o}): chmod 600 it"
    return None


def read_secret_file(path: Path, what: str = "the token file") -> str:
    """The stripped text of a file holding a secret (a token given as ``--token-file``), refused
    as an OSError naming the reason when it is not private or cannot be read."""
    try:
        problem = private_file_problem(path, what)
        if problem is None:
            return path.read_text().strip()
    except OSError as exc:
        raise OSError(f"cannot read {what} {path}: {exc.strerror}") from None
    raise OSError(problem)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte on, replacing it atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new directory: ours alone
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
        problem = private_file_problem(self.path, self._what)
        if problem is not None:
            raise self._error(problem)
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise self._error(f"{self._what} {self.path} cannot be read: {exc.strerror}") from None
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or not isinstance(doc.get(self._field), list):
                # Another kind of JSON file (a token store given as a key store, or the reverse)
                # read as "corrupt (KeyError)", which sent users looking for damage.
                raise self._error(
                    f"{self._what} {self.path} is not a {self._what}: expected a JSON object "
                    f'{{"version": {self._version}, "{self._field}": [...]}}'
                )
            if doc.get("version") != self._version:
                raise self._error(
                    f"{self._what} {self.path}: unsupported format version {doc.get('version')!r}"
                )
            records = {self._key(r): r for r in doc[self._field]}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self._error(f"{self._what} {self.path} is corrupt ({type(exc).__name__})") from None
        self.records, self._stamp = records, stamp

    @property
    def label(self) -> str:
        """Where the records are, for a repr (never their content)."""
        return repr(str(self.path))

    def current(self, *, miss: bool = False) -> dict[K, dict[str, Any]]:
        """The records, reloaded if the file changed since the last look (looked at every RELOAD_CHECK_S;
        ``miss`` changes nothing: a file is looked at often enough)."""
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
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def next_version(previous: int) -> int:
    """A row version above ``previous`` and, clocks agreeing, above any other writer's earlier one."""
    return max(time.time_ns(), previous + 1)


class VersionedJsonTable(Generic[K]):
    """Records as a ClickHouse table (``<id>``, ``version``, ``doc``), for several collectors.

    The newest version of a record wins (``argMax``; ReplacingMergeTree folds old rows away).
    :meth:`current` re-reads the table at least every ``refresh_s``, and at once (at most
    every :data:`MISS_REFRESH_S`) when the caller missed an id, so a record made through one
    collector is usable through another at once and a revocation is honoured everywhere
    within ``refresh_s``. Records reach the engine only as Arrow data, never inside SQL
    text, so no engine error can quote a secret. Concurrent edits of one record through two
    processes: the later write wins.
    """

    def __init__(
        self,
        store: Store,
        table: str,
        *,
        id_column: str,
        what: str,
        comment: str,
        encode_id: Callable[[K], str],
        decode_id: Callable[[str], K],
        error: type[Exception],
        refresh_s: float | None = None,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", table):
            raise ValueError(f"invalid table name {table!r}")
        self.store, self.table, self._id = store, table, id_column
        self._what, self._encode, self._decode, self._error = what, encode_id, decode_id, error
        self.refresh_s = CLUSTER_REFRESH_S if refresh_s is None else refresh_s
        self.records: dict[K, dict[str, Any]] = {}
        self._versions: dict[K, int] = {}
        self._loaded = -float("inf")
        try:
            store.command(versioned_table_ddl(store, table, id_column, comment))
        except StorageError as exc:
            raise error(f"cannot create the {what} {store.database}.{table}: {exc}") from None

    def reload(self) -> None:
        try:
            rows = latest_docs(self.store, self.table, self._id)
        except StorageError as exc:
            raise self._error(
                f"{self._what} {qualified(self.store.database, self.table)} unreadable: {exc}"
            ) from None
        try:
            records = {self._decode(r[self._id]): json.loads(r["doc"]) for r in rows}
        except (ValueError, TypeError) as exc:
            raise self._error(f"{self._what} holds a corrupt record ({type(exc).__name__})") from None
        self.records = records
        self._versions = {self._decode(r[self._id]): int(r["v"]) for r in rows}
        self._loaded = time.monotonic()

    @property
    def label(self) -> str:
        """Where the records are, for a repr (never their content)."""
        return f"{self.store.database}.{self.table}"

    def current(self, *, miss: bool = False) -> dict[K, dict[str, Any]]:
        """The records, re-read when ``refresh_s`` has passed (``miss``: after MISS_REFRESH_S)."""
        age = time.monotonic() - self._loaded
        if age >= self.refresh_s or (miss and age >= MISS_REFRESH_S):
            self.reload()
        return self.records

    @contextlib.contextmanager
    def editing(self, lock: threading.Lock) -> Iterator[dict[K, dict[str, Any]]]:
        """Reload, let the caller edit the records in place, then write one new row per changed record."""
        with lock:
            self.reload()
            before = {i: json.dumps(r, sort_keys=True) for i, r in self.records.items()}
            yield self.records
            changed = [
                (i, doc)
                for i, r in self.records.items()
                if before.get(i) != (doc := json.dumps(r, sort_keys=True))
            ]
            if not changed:
                return
            import pyarrow as pa  # type: ignore[import-untyped]

            versions = [next_version(self._versions.get(i, 0)) for i, _ in changed]
            data = pa.table(
                {
                    self._id: pa.array([self._encode(i) for i, _ in changed], pa.string()),
                    "version": pa.array(versions, pa.uint64()),
                    "doc": pa.array([d for _, d in changed], pa.string()),
                }
            )
            try:
                self.store.insert_table(self.table, data)
            except StorageError as exc:
                self._loaded = -float("inf")  # what we hold in memory was never written
                raise self._error(f"{self._what} {self.table}: write failed: {exc}") from None
            self._versions.update((i, v) for (i, _), v in zip(changed, versions, strict=True))


class SecretStore(Generic[K]):
    """Records holding secrets, by id, in a private JSON file or a versioned ClickHouse table.

    The one base of the agent key store (``collector/keys.py``) and the API token store
    (``api/auth.py``): it holds the records and the lock every read and edit takes; the
    subclasses hold the rules. ``repr`` names where the records are, never their content.
    """

    def __init__(self, records: PrivateJsonFile[K] | VersionedJsonTable[K]) -> None:
        self._lock = threading.Lock()
        self._records = records

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._records.label})"

    @property
    def refresh_s(self) -> float | None:
        """The longest a change made elsewhere goes unseen (table stores; None for a file, seen at once)."""
        return self._records.refresh_s if isinstance(self._records, VersionedJsonTable) else None

    def _current(self, *, miss: bool = False) -> dict[K, dict[str, Any]]:
        """The records, refreshed when due (``miss``: a lookup found nothing; refresh sooner). Lock held."""
        return self._records.current(miss=miss)

    def _editing(self) -> contextlib.AbstractContextManager[dict[K, dict[str, Any]]]:
        """A fresh copy of the records to change in place; written back when the block ends."""
        return self._records.editing(self._lock)


S = TypeVar("S", bound=SecretStore[Any])


@contextlib.contextmanager
def opened_secret_store(
    target: str,
    in_file: Callable[[Path], S],
    in_table: Callable[[Store], S],
    error: type[Exception],
    *,
    existing: str | None = None,
) -> Iterator[S]:
    """The file store at a path, or the table store of a ClickHouse URL (closed again afterwards).

    What ``ki keys --store`` and ``ki tokens --store`` open; a store that cannot be opened is
    ``error`` with the reason. ``existing`` (what the store is, e.g. ``key store``): the file must
    be there already. A file store reads an absent file as an empty store, which is right for the
    collector and for commands that add to it, but a command that only reads or edits what is
    there would otherwise take a mistyped path for an empty store and say nothing.
    """
    if not is_store_url(target):
        path = Path(target)
        if existing is not None and not path.exists():
            raise error(f"{existing} {path} does not exist")
        yield in_file(path)
        return
    from kernel_insight.collector.clickhouse.store import open_store

    try:
        store = open_store(target)
    except (StorageError, ValueError) as exc:
        raise error(f"cannot open the store: {exc}") from None
    try:
        yield in_table(store)
    finally:
        store.close()
