"""Bearer tokens with scopes for the query and health API, kept in one JSON file of mode 0600.

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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kernel_insight.api.errors import ApiError
from kernel_insight.collector.private_json import PrivateJsonFile, SecretStore, VersionedJsonTable
from kernel_insight.collector.store import Store

__all__ = [
    "DEFAULT_TOKEN_STORE",
    "Authenticator",
    "CheckMemo",
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
    with :func:`kernel_insight.collector.store.open_store` and pass the ``Store``.
    """
    if isinstance(target, Store):
        return ClickHouseTokenStore(target)
    return TokenStore(Path(target))


_bearer = HTTPBearer(auto_error=False, description="A token from `ki tokens create --scope read`.")
#: Declares the bearer scheme in the OpenAPI schema; the check itself reads the header.
_BEARER = Depends(_bearer)


class CheckMemo:
    """The last ``Authorization`` value that passed :meth:`Authenticator.check` on one connection,
    and what it passed against; a new one per connection, dropped with it.

    A connection (Grafana's, the SDK's) sends the same header on every request: its verdict
    holds while the token records are the same (``TokenStoreBase.stamp``), so the SHA-256 of the
    secret and the token's parsing (~7 us of a 0.2 ms query) are done once, not per request. A
    revocation re-reads the records (the file is looked at every second, as for a full check)
    and so ends the memo's verdict within the same second.
    """

    __slots__ = ("authorization", "info", "scope", "stamp")

    def __init__(self) -> None:
        self.authorization = b""  # the raw header value that passed
        self.scope: Scope | None = None
        self.stamp: object = None
        self.info: TokenInfo | None = None


class Authenticator:
    """Turns ``Authorization: Bearer`` into a :class:`TokenInfo`, or a 401/403 with a message.

    ``local_dev=True`` lets every request through: only for a server bound to 127.0.0.1
    (the caller checks the bind address; :func:`kernel_insight.api.app.serve` does).
    """

    def __init__(self, tokens: TokenStoreBase | None, *, local_dev: bool = False) -> None:
        if tokens is None and not local_dev:
            raise ValueError("an Authenticator needs a TokenStore unless it runs in local development mode")
        self.tokens = tokens
        self.local_dev = local_dev

    def check(
        self, authorization: str | None, scope: Scope, memo: CheckMemo | None = None
    ) -> TokenInfo | None:
        """The token's record when ``authorization`` carries one allowed ``scope``; else ApiError.

        ``memo``: the connection's :class:`CheckMemo`, consulted first and set after a pass.
        """
        if self.local_dev:
            return None
        assert self.tokens is not None
        challenge = {"WWW-Authenticate": 'Bearer realm="kernel-insight"'}
        if not authorization:
            raise ApiError(
                401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)", challenge
            )
        raw = b"" if memo is None else authorization.encode("latin-1")
        try:
            if (
                memo is not None
                and memo.scope is scope
                and hmac.compare_digest(raw, memo.authorization)
                and self.tokens.stamp() is memo.stamp
            ):
                return memo.info
            kind, _, token = authorization.partition(" ")
            if kind.lower() != "bearer" or not token.strip():
                raise ApiError(
                    401, "unauthorized", "the Authorization header must be 'Bearer <token>'", challenge
                )
            info, stamp = self.tokens.verify(token.strip())
        except UnknownToken as exc:
            raise ApiError(401, "unauthorized", str(exc), challenge) from None
        except TokenError as exc:  # the server's own file is broken: not the client's fault, but no 500
            raise ApiError(503, "unavailable", f"token store unreadable: {exc}") from None
        if not info.allows(scope):
            raise ApiError(403, "forbidden", f"token {info.id} lacks the {scope.value!r} scope")
        if memo is not None:
            memo.authorization, memo.scope, memo.stamp, memo.info = raw, scope, stamp, info
        return info

    def require(self, scope: Scope) -> Callable[..., Awaitable[TokenInfo | None]]:
        """A FastAPI dependency that admits requests carrying ``scope`` (or ``admin``)."""

        async def dependency(
            request: Request, credentials: HTTPAuthorizationCredentials | None = _BEARER
        ) -> TokenInfo | None:
            return self.check(request.headers.get("authorization"), scope)

        return dependency
