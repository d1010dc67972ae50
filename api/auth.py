"""The bearer-token check of the query and health API: scopes, the ``Authorization`` header, FastAPI's
dependency. The tokens and their stores are api/tokens.py (re-exported here)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kernel_insight.api.errors import ApiError
from kernel_insight.api.tokens import (
    DEFAULT_TOKEN_STORE,
    ClickHouseTokenStore,
    CreatedToken,
    Scope,
    TokenError,
    TokenInfo,
    TokenStore,
    TokenStoreBase,
    UnknownToken,
    open_token_store,
)

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


_bearer = HTTPBearer(auto_error=False, description="A token from `ki tokens create --scope read`.")
#: Declares the bearer scheme in the OpenAPI schema; the check itself reads the header.
_BEARER = Depends(_bearer)


class CheckMemo:
    """The last ``Authorization`` value that passed :meth:`Authenticator.check` on one connection,
    and what it passed against; a new one per connection, dropped with it.

    A connection (Grafana's, the SDK's) sends the same header on every request: its verdict
    holds while the token records are the same (``TokenStoreBase.stamp``), so the SHA-256 of the
    secret and the token's parsing (a noticeable share of a small query: `make bench-kql`) are done
    once, not per request. A
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
