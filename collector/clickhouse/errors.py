"""The store's exceptions: the engine's and its transport's errors as kql's storage errors.

::

    kql.StorageError        the engine refused a statement or its values: permanent (HTTP 4xx on
     |                      writes, the batch is set aside; 500 on reads)
     +-- StorageUnavailable the store cannot serve now: ``retryable``, retry later (HTTP 503)

``StorageError`` is kql's (kernel_insight.kql.errors): one hierarchy and one ``retryable`` for
reads and writes. Only ClickHouse's own errors and its transport's are turned into them; any
other exception (a bug here) passes through unchanged, so it is never mistaken for a store that
is merely away.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from kernel_insight.kql.errors import StorageError

__all__ = ["StorageUnavailable", "engine_errors"]

#: ClickHouse error codes that mean "try again later", not "your statement is wrong".
_RETRYABLE_CODES = frozenset(
    {3, 74, 75, 159, 164, 202, 209, 210, 236, 241, 242, 243, 252, 279, 319, 394, 425, 999, 1000}
)
_CODE_RE = re.compile(r"Code:\s*(\d+)")


class StorageUnavailable(StorageError):
    """The store cannot serve now (closed, unreachable, out of memory or disk, overloaded): retryable."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message, retry_after_s=retry_after_s)

    @property
    def retry_after_s(self) -> int:
        """Seconds to wait before retrying (``Retry-After``)."""
        return self._retry_after_s if self._retry_after_s is not None else 5


#: clickhouse-connect's errors that say the statement or its data is wrong, not the connection.
_CLIENT_PERMANENT = frozenset({"DataError", "ProgrammingError", "NotSupportedError", "IntegrityError"})


def _is_transport(exc: BaseException) -> bool:
    """A failure to reach the engine: sockets, TLS, HTTP (urllib3) or clickhouse-connect itself."""
    if isinstance(exc, OSError):
        return True
    return any(k.__module__.split(".")[0] in {"clickhouse_connect", "urllib3"} for k in type(exc).__mro__)


def _classify(exc: BaseException, what: str) -> StorageError | None:
    """The storage error ``exc`` stands for, or ``None`` when it is not the engine's nor the transport's.

    An engine error carries ``Code: N``: retryable codes (memory, timeouts, too many parts,
    network) give ``StorageUnavailable``, the rest a permanent ``StorageError``. Without a code,
    only a transport failure means the store is unreachable; anything else is a bug of ours.
    """
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    m = _CODE_RE.search(message)
    if m is not None:
        if int(m.group(1)) in _RETRYABLE_CODES:
            return StorageUnavailable(f"{what}: {message[:500]}")
        return StorageError(f"{what}: {message[:500]}")
    if not _is_transport(exc):
        return None
    if type(exc).__name__ in _CLIENT_PERMANENT:
        return StorageError(f"{what}: {message[:500]}")
    return StorageUnavailable(f"{what}: {message[:500]}")


@contextlib.contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Turn the engine's and the transport's exceptions into storage errors; others pass unchanged."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        error = _classify(exc, what)
        if error is None:
            raise
        raise error from exc
