"""What the SDK raises. Catch :class:`KernelInsightError` for everything, or one branch::

KernelInsightError
├── TransportError            the server could not be reached (after the retries)
├── SnapshotUnavailable       no snapshot, or the last one is older than ``max_stale``
├── NoEligibleInstance        select_instance found no healthy instance with the room asked for
└── ApiError                  the server answered with an error (status, error_type, message)
    ├── BadRequestError       4xx other than those below (bad_data: fix the query or parameters)
    ├── AuthenticationError   401: missing, unknown or revoked token
    ├── PermissionDeniedError 403: the token lacks the scope
    ├── NotFoundError         404
    └── ServerError           5xx that persisted through the retries
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "AuthenticationError",
    "BadRequestError",
    "KernelInsightError",
    "NoEligibleInstance",
    "NotFoundError",
    "PermissionDeniedError",
    "ServerError",
    "SnapshotUnavailable",
    "TransportError",
]


class KernelInsightError(Exception):
    """Base of everything the SDK raises."""


class TransportError(KernelInsightError):
    """No answer from the server (connection refused, DNS, timeout); ``__cause__`` is httpx's error."""


class SnapshotUnavailable(KernelInsightError):
    """No health snapshot fresh enough to route by: the server has been unreachable too long."""


class NoEligibleInstance(KernelInsightError):
    """No instance is healthy, serves the model, has the free memory asked for and is not excluded."""


class ApiError(KernelInsightError):
    """The server's error answer: HTTP ``status``, Prometheus-style ``error_type`` and ``message``."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"{status} {error_type}: {message}")
        self.status = status
        self.error_type = error_type
        self.message = message


class BadRequestError(ApiError):
    """The request was wrong (400 ``bad_data``, 422 ``execution``, ...): retrying will not help."""


class AuthenticationError(ApiError):
    """401: the token is missing, unknown or revoked."""


class PermissionDeniedError(ApiError):
    """403: the token lacks the scope the endpoint needs."""


class NotFoundError(ApiError):
    """404: no such resource (e.g. an unknown instance id)."""


class ServerError(ApiError):
    """5xx that persisted through every retry."""


def error_for(status: int, error_type: str, message: str) -> ApiError:
    """The exception class that fits an HTTP status."""
    cls: type[ApiError]
    if status == 401:
        cls = AuthenticationError
    elif status == 403:
        cls = PermissionDeniedError
    elif status == 404:
        cls = NotFoundError
    elif status >= 500:
        cls = ServerError
    else:
        cls = BadRequestError
    return cls(status, error_type, message)
