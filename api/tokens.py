"""Bearer tokens with scopes for the query and health API, kept in one JSON file of mode 0600.

The stores alone, without FastAPI (``ki tokens`` starts fast); the request check is api/auth.py.

Only a SHA-256 of each token's secret is stored, so the file leaks no usable
token; ``ki tokens create`` prints the token once. A running server notices
a revocation within a second without a restart (it re-reads the file when
its inode, mtime or size change).

Scopes: ``read`` (queries, snapshot, instances), ``ingest`` (remote_write: sending
samples, nothing else), ``ingest-admin`` (agent keys), ``admin`` (everything, the rule reload too).
Several collectors over one ClickHouse share tokens through :class:`ClickHouseTokenStore`.

    >>> import tempfile, pathlib
    >>> store = TokenStore(pathlib.Path(tempfile.mkdtemp()) / "tokens.json")
    >>> created = store.create("grafana", ["read"])
    >>> store.authenticate(created.token).scopes
    ('read',)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_insight.collector.private_json import PrivateJsonFile, SecretStore, VersionedJsonTable

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "DEFAULT_TOKEN_STORE",
    "ClickHouseTokenStore",
    "CreatedToken",
    "Scope",
    "TokenError",
    "TokenInfo",
    "TokenStore",
    "TokenStoreBase",
    "UnknownToken",
    "open_token_store",
]

#: Where ``ki tokens`` and the API look unless told otherwise (env KI_TOKEN_STORE overrides).
DEFAULT_TOKEN_STORE = Path("ki-data/tokens.json")
_FORMAT_VERSION = 1
_PREFIX = "ki_"


class Scope(StrEnum):
    READ = "read"
    INGEST = "ingest"
    INGEST_ADMIN = "ingest-admin"
    ADMIN = "admin"


class TokenError(Exception):
    """A token store problem (corrupt or world-readable file, bad scope)."""


class UnknownToken(TokenError):
    """No such token, or it was revoked."""


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What the store knows about a token; never the token itself."""

    id: str
    name: str
    scopes: tuple[str, ...]
    created: float
    revoked: bool = False

    def allows(self, scope: Scope | str) -> bool:
        return not self.revoked and (Scope.ADMIN.value in self.scopes or str(scope) in self.scopes)


@dataclass(frozen=True, slots=True)
class CreatedToken:
    """The token text (shown once) and its record."""

    token: str
    info: TokenInfo


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _parse_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    out = []
    for s in scopes:
        try:
            out.append(Scope(s).value)
        except ValueError:
            known = ", ".join(x.value for x in Scope)
            raise TokenError(f"unknown scope {s!r} (known: {known})") from None
    if not out:
        raise TokenError("a token needs at least one scope")
    return tuple(sorted(set(out)))


class TokenStoreBase(SecretStore[str]):
    """Tokens, whatever holds them: parsing, hashing and the revocation rule live here.

    The records and their back end (a file or a ClickHouse table) are ``SecretStore``'s.
    """

    @staticmethod
    def _info(t: dict[str, Any]) -> TokenInfo:
        return TokenInfo(t["id"], t["name"], tuple(t["scopes"]), float(t["created"]), bool(t.get("revoked")))

    def authenticate(self, token: str) -> TokenInfo:
        """The token's record, or UnknownToken (also for revoked or malformed tokens)."""
        return self.verify(token)[0]

    def verify(self, token: str) -> tuple[TokenInfo, object]:
        """:meth:`authenticate`, and the :meth:`stamp` of the records it was checked against."""
        if not token.startswith(_PREFIX) or "." not in token:
            raise UnknownToken("malformed token (expected ki_<id>.<secret>)")
        token_id, _, secret = token[len(_PREFIX) :].partition(".")
        with self._lock:
            records = self._current()
            record = records.get(token_id)
            if record is None:
                records = self._current(miss=True)  # created a moment ago elsewhere?
                record = records.get(token_id)
        if record is None or not hmac.compare_digest(record["hash"], _hash(secret)):
            raise UnknownToken("unknown token")
        if record.get("revoked"):
            raise UnknownToken(f"token {token_id} was revoked")
        return self._info(record), records

    def stamp(self) -> object:
        """The records in force now, re-read when due exactly as for a check: the same object
        until a token is created or revoked or the records are read again (each read, and each
        edit under the lock, makes a new one), so a verdict reached against it still holds."""
        with self._lock:
            return self._current()

    def list(self) -> list[TokenInfo]:
        with self._lock:
            return [self._info(t) for t in self._current().values()]

    def create(self, name: str, scopes: Iterable[str]) -> CreatedToken:
        """A new token with these scopes; the returned text is the only copy of its secret."""
        parsed = _parse_scopes(scopes)
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        record = {
            "id": token_id,
            "name": name,
            "scopes": list(parsed),
            "created": time.time(),
            "hash": _hash(secret),
        }
        with self._editing() as tokens:
            tokens[token_id] = record
        return CreatedToken(f"{_PREFIX}{token_id}.{secret}", self._info(record))

    def revoke(self, token_id: str) -> None:
        """Refuse the token from now on (running servers notice within their reload bound)."""
        if token_id.startswith(_PREFIX):
            token_id = token_id[len(_PREFIX) :].partition(".")[0]
        with self._editing() as tokens:
            if token_id not in tokens:
                raise UnknownToken(f"no token with id {token_id!r}")
            tokens[token_id]["revoked"] = True


class TokenStore(TokenStoreBase):
    """The API's tokens in a file. Writers lock the file and replace it atomically; readers reload on change."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(
            PrivateJsonFile(
                self.path,
                what="token store",
                field="tokens",
                version=_FORMAT_VERSION,
                key=lambda t: str(t["id"]),
                error=TokenError,
            )
        )


class ClickHouseTokenStore(TokenStoreBase):
    """Tokens in a ClickHouse table, for several collectors over one store (cluster mode).

    Same layout and rules as :class:`~kernel_insight.collector.keys.ClickHouseKeyStore`:
    one row per edit, newest version wins, every process re-reads the table at least every
    ``refresh_s`` (so a revocation is honoured everywhere within that bound) and at once
    when a token id is unknown. Only SHA-256 hashes of secrets are stored.
    """

    def __init__(self, store: Store, *, table: str = "api_tokens", refresh_s: float | None = None) -> None:
        self.store, self.table = store, table
        super().__init__(
            VersionedJsonTable(
                store,
                table,
                id_column="token_id",
                what="token table",
                comment="API bearer tokens (docs/api.md)",
                encode_id=str,
                decode_id=str,
                error=TokenError,
                refresh_s=refresh_s,
            )
        )


def open_token_store(target: str | Path | Store) -> TokenStoreBase:
    """The table store over a ``Store``, else the file store at a path (``ki tokens --store``).

    A ClickHouse URL as ``target`` is for callers that own the store's lifetime: open it
    with :func:`kernel_insight.collector.clickhouse.store.open_store` and pass the ``Store``.
    """
    if isinstance(target, str | Path):
        return TokenStore(Path(target))
    return ClickHouseTokenStore(target)
