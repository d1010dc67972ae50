"""One error shape for every API answer: Prometheus' ``{"status": "error", "errorType", "error"}``.

Prometheus clients parse this shape on the query API; the health and instance
endpoints use it too so an SDK needs one decoder.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

__all__ = ["ApiError", "error_body", "error_response", "install_error_handlers"]


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


def install_error_handlers(app: FastAPI) -> None:
    """Render :class:`ApiError` in the one error shape (only ApiError: other routers keep theirs)."""

    async def _handle(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status_code, exc.error_type, exc.message, dict(exc.headers or {}))

    app.add_exception_handler(ApiError, _handle)
