"""One error shape for every API answer: Prometheus' ``{"status": "error", "errorType", "error"}``.

Prometheus clients parse this shape on the query API; the health and instance
endpoints use it too so an SDK needs one decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["API_PATH_PREFIXES", "ApiError", "error_body", "error_response", "install_error_handlers"]


def error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"status": "error", "errorType": error_type, "error": message}


def error_response(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(error_type, message), status_code=status, headers=headers)


class ApiError(HTTPException):
    """An answer the client must act on; ``detail`` is the message.

    Without :func:`install_error_handlers` FastAPI still renders it, as ``{"detail": message}``.
    """

    def __init__(
        self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.error_type = error_type
        self.message = message


#: Paths whose malformed parameters get a 400 ``bad_data`` in the one shape (other routers keep FastAPI's 422).
API_PATH_PREFIXES = ("/v1/health/", "/v1/instances", "/v1/topology", "/v1/timeline/", "/api/v1/")


def _describe(errors: Sequence[Any]) -> str:
    parts = []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("query", "path", "body")]
        parts.append(f'invalid parameter "{".".join(loc)}": {e.get("msg", "invalid")}')
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Render :class:`ApiError`, and malformed parameters of this package's paths, in the one error shape."""

    async def _handle(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status_code, exc.error_type, exc.message, dict(exc.headers or {}))

    async def _validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if request.url.path.startswith(API_PATH_PREFIXES):
            return error_response(400, "bad_data", _describe(exc.errors()))
        return await request_validation_exception_handler(request, exc)

    async def _routing(request: Request, exc: Exception) -> Response:
        """The answers the router makes itself (no such path: 404, a method the path does not
        take: 405) in the one shape; a route's own HTTPException (ingest's) keeps its detail."""
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code in _ROUTING_ERRORS and exc.detail == HTTPStatus(exc.status_code).phrase:
            message = f"{request.method} {request.url.path}: {exc.detail.lower()} (the API: docs/api.md)"
            return error_response(
                exc.status_code, _ROUTING_ERRORS[exc.status_code], message, dict(exc.headers or {})
            )
        return await http_exception_handler(request, exc)

    app.add_exception_handler(ApiError, _handle)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _routing)


#: The router's own refusals and their ``errorType``.
_ROUTING_ERRORS = {404: "not_found", 405: "method_not_allowed"}
